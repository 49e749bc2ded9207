//! The daemon's own counters and histograms (prometheus-client). The engine is handed a
//! [`Metrics`] and counts into it; [`crate::exporter`] serves them, with the pool numbers it
//! reads at each scrape, on `--metrics-listen ADDR` at `/metrics`:
//!
//! - per pool (labels `network`, `family`), read from the pools at each scrape:
//!   `ipool_pool_in_use`, `_idle`, `_cooling`, `_reserved`, `_capacity`, `_free_in_source`,
//!   `_drained`, and `ipool_pool_available` (what a new ADD could still get; not for cluster
//!   networks, whose pools grow); counters `ipool_source_calls_total`, `ipool_source_errors_total`,
//!   `ipool_source_bucket_waits_total`;
//! - `ipool_requests_total{op, result}`: CNI calls by outcome (`ok` or the gRPC code);
//! - `ipool_add_duration_seconds`: ADD latency in the daemon, histogram;
//! - `ipool_store_flush_duration_seconds`: group-commit flushes (flush + fdatasync), histogram;
//! - `ipool_store_commits_total`: writes made durable (several per flush under load);
//! - `ipool_store_failed` (1 while the store has failed: nothing changes until it is
//!   reopened) and `ipool_host_problems` (what keeps the runtime from using ipool: the
//!   conflist not written), read at each scrape;
//! - with Kubernetes: `ipool_apiserver_reachable` (1 or 0) and
//!   `ipool_pod_gc_total{action}`: what the pod GC did (`released`, `unquarantined`,
//!   `quarantined`).
//! - in cluster mode: `ipool_cluster_store_up` (1 or 0), `ipool_cluster_blocks{pool, family,
//!   state}` (this node's blocks by state: `confirmed`, `unconfirmed`, `reclaiming`,
//!   `returning`, `unsettled`, `lost`), `ipool_cluster_claims_total{pool, result}` (`won`,
//!   `exhausted`, `pool_changed`, `error`), `ipool_cluster_claim_conflicts_total{pool, kind}`
//!   (`candidate`: a free block another node won first, harmless; `ownership`: a block this
//!   node held that etcd says another owns), `ipool_cluster_block_give_backs_total{pool}`,
//!   `ipool_cluster_syncs_total{pool, family}` (listings of this node's blocks taken in),
//!   `ipool_cluster_store_call_duration_seconds{op}`, `ipool_cluster_node_name_taken` (1 while
//!   another daemon holds this node's name), `ipool_cluster_fenced` (1 while the heartbeat
//!   is not renewed within the fence), `ipool_cluster_malformed_keys` (keys under the prefix
//!   that name no owner), `ipool_cluster_store_resets_total` (the store found restored or made anew; the `ipool_cluster_etcd_*` names of these three are exported too, deprecated).

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub op: String,
    pub result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ActionLabels {
    pub action: String,
}

/// An Event on a pod: its reason, and what was written for it.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PodEventLabels {
    pub reason: String,
    pub write: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PoolLabels {
    pub pool: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PoolFamilyLabels {
    pub pool: String,
    pub family: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BlockStateLabels {
    pub pool: String,
    pub family: String,
    pub state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PoolKindLabels {
    pub pool: String,
    pub kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PoolResultLabels {
    pub pool: String,
    pub result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OpLabels {
    pub op: String,
}

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

/// Cluster mode's numbers (registered only with `[cluster]`).
#[derive(Debug)]
pub struct ClusterMetrics {
    pub store_up: Gauge,
    pub blocks: Family<BlockStateLabels, Gauge>,
    pub claims: Family<PoolResultLabels, Counter>,
    pub conflicts: Family<PoolKindLabels, Counter>,
    pub give_backs: Family<PoolLabels, Counter>,
    /// Listings of this node's blocks taken in, per pool and family: one that stalls while
    /// the store answers means blocks changed in the store are not seen (docs/cluster-mode.md: a sync is
    /// never delayed by a claim's backoff).
    pub syncs: Family<PoolFamilyLabels, Counter>,
    pub store_seconds: HistogramFamily<OpLabels>,
    pub node_name_taken: Gauge,
    pub fenced: Gauge,
    pub malformed_keys: Gauge,
    pub store_resets: Counter,
    /// 1 while a pool, as this node last read it, is disabled.
    pub pool_disabled: Family<PoolLabels, Gauge>,
    /// A pool's reservations, as this node last read it.
    pub pool_reservations: Family<PoolLabels, Gauge>,
    /// The blocks a pool's CIDRs hold per family (its excluded ranges and CIDRs on their way
    /// in or out left out), as this node last read it.
    pub pool_capacity_blocks: Family<PoolFamilyLabels, Gauge>,
    /// 1 while this node's labels match a pool's nodeSelector (or it has none), as last read.
    pub pool_node_selected: Family<PoolLabels, Gauge>,
    /// A pool's pins this node knows (kept from everyone but their owners), and those of them
    /// it holds.
    pub pins_known: Family<PoolLabels, Gauge>,
    pub pins_held: Family<PoolLabels, Gauge>,
    /// ADDs of pods with a fixed address, by pool and result (created, held, moved,
    /// migration, taken_over, refused).
    pub pin_adds: Family<PoolResultLabels, Counter>,
    /// Departed nodes whose blocks this daemon released (`[cluster]
    /// release_departed_after_secs`), and 1 while it leads that work.
    pub nodes_released: Counter,
    pub pins_ended: Counter,
    pub departed_leader: Gauge,
}

impl Default for ClusterMetrics {
    fn default() -> Self {
        ClusterMetrics {
            store_up: Gauge::default(),
            blocks: Family::default(),
            claims: Family::default(),
            conflicts: Family::default(),
            give_backs: Family::default(),
            syncs: Family::default(),
            // 100 us .. ~3.3 s
            store_seconds: Family::new_with_constructor(|| {
                Histogram::new(exponential_buckets(100e-6, 2.0, 16))
            }),
            node_name_taken: Gauge::default(),
            fenced: Gauge::default(),
            malformed_keys: Gauge::default(),
            store_resets: Counter::default(),
            pool_disabled: Family::default(),
            pool_reservations: Family::default(),
            pool_capacity_blocks: Family::default(),
            pool_node_selected: Family::default(),
            pins_known: Family::default(),
            pins_held: Family::default(),
            pin_adds: Family::default(),
            nodes_released: Counter::default(),
            pins_ended: Counter::default(),
            departed_leader: Gauge::default(),
        }
    }
}

impl ClusterMetrics {
    /// Pool `pool` as this node read it: disabled or not, and how many reservations.
    pub fn pool_read(
        &self,
        pool: &str,
        disabled: bool,
        reservations: usize,
        capacity: [(&str, u64); 2],
    ) {
        for (family, blocks) in capacity {
            self.pool_capacity_blocks
                .get_or_create(&PoolFamilyLabels {
                    pool: pool.into(),
                    family: family.into(),
                })
                .set(i64::try_from(blocks).unwrap_or(i64::MAX));
        }
        let labels = PoolLabels { pool: pool.into() };
        self.pool_disabled
            .get_or_create(&labels)
            .set(i64::from(disabled));
        self.pool_reservations
            .get_or_create(&labels)
            .set(reservations as i64);
    }

    /// The pins of `pool` this node knows, and how many of them it holds.
    pub fn pins(&self, pool: &str, known: usize, held: usize) {
        let labels = PoolLabels { pool: pool.into() };
        self.pins_known.get_or_create(&labels).set(known as i64);
        self.pins_held.get_or_create(&labels).set(held as i64);
    }

    /// An ADD of a pod with a fixed address in `pool`: how it went.
    pub fn pin_add(&self, pool: &str, result: &str) {
        self.pin_adds
            .get_or_create(&PoolResultLabels {
                pool: pool.into(),
                result: result.into(),
            })
            .inc();
    }

    /// Whether this node may claim from pool `pool` (its labels match the pool's
    /// nodeSelector, or it has none).
    pub fn pool_selected(&self, pool: &str, selected: bool) {
        self.pool_node_selected
            .get_or_create(&PoolLabels { pool: pool.into() })
            .set(i64::from(selected));
    }

    /// A listing of this node's blocks of `pool` (`family`) was taken in.
    pub fn synced(&self, pool: &str, family: &str) {
        self.syncs
            .get_or_create(&PoolFamilyLabels {
                pool: pool.into(),
                family: family.into(),
            })
            .inc();
    }

    /// Listings of this node's blocks of `pool` (`family`) taken in so far.
    pub fn syncs_of(&self, pool: &str, family: &str) -> u64 {
        self.syncs
            .get_or_create(&PoolFamilyLabels {
                pool: pool.into(),
                family: family.into(),
            })
            .get()
    }

    pub fn claim(&self, pool: &str, result: &str) {
        self.claims
            .get_or_create(&PoolResultLabels {
                pool: pool.into(),
                result: result.into(),
            })
            .inc();
    }

    pub fn pool_counter(family: &Family<PoolLabels, Counter>, pool: &str, n: u64) {
        family
            .get_or_create(&PoolLabels { pool: pool.into() })
            .inc_by(n);
    }

    pub fn conflict(family: &Family<PoolKindLabels, Counter>, pool: &str, kind: &str, n: u64) {
        family
            .get_or_create(&PoolKindLabels {
                pool: pool.into(),
                kind: kind.into(),
            })
            .inc_by(n);
    }

    pub fn store_call(&self, op: &str, took: Duration, ok: bool) {
        self.store_seconds
            .get_or_create(&OpLabels { op: op.into() })
            .observe(took.as_secs_f64());
        self.store_up.set(i64::from(ok));
    }
}

/// The daemon's own counters and histograms (pool numbers are read at scrape time).
#[derive(Debug)]
pub struct Metrics {
    pub requests: Family<RequestLabels, Counter>,
    pub add_seconds: Histogram,
    pub flush_seconds: Histogram,
    /// 1 while the apiserver answers (Kubernetes only).
    pub apiserver_reachable: Gauge,
    /// The pod GC's releases and quarantines, by action.
    pub pod_gc: Family<ActionLabels, Counter>,
    /// host-local's allocations met when a network was first served, by what became of them.
    pub host_local: Family<ActionLabels, Counter>,
    /// Refused ADDs recorded on their pods, by reason and write.
    pub pod_events: Family<PodEventLabels, Counter>,
    pub cluster: ClusterMetrics,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            requests: Family::default(),
            // 50 us .. ~0.8 s
            add_seconds: Histogram::new(exponential_buckets(50e-6, 2.0, 15)),
            // 10 us .. ~160 ms
            flush_seconds: Histogram::new(exponential_buckets(10e-6, 2.0, 15)),
            apiserver_reachable: Gauge::default(),
            pod_gc: Family::default(),
            host_local: Family::default(),
            pod_events: Family::default(),
            cluster: ClusterMetrics::default(),
        }
    }
}

impl Metrics {
    /// Counts `n` of the pod GC's `action`.
    pub fn pod_gc(&self, action: &str, n: usize) {
        self.pod_gc
            .get_or_create(&ActionLabels {
                action: action.into(),
            })
            .inc_by(n as u64);
    }

    /// Counts `n` of host-local's allocations: `imported`, `unreported` (taken over for no pod:
    /// none reports its address), `stale` (from before the node's last boot) or `refused`.
    pub fn host_local(&self, action: &str, n: usize) {
        self.host_local
            .get_or_create(&ActionLabels {
                action: action.into(),
            })
            .inc_by(n as u64);
    }

    /// Counts one refused ADD recorded on its pod (`reason`): `created` (a new Event),
    /// `patched` (its series), `aggregated` (counted, nothing written), `dropped` or `failed`.
    pub fn pod_event(&self, reason: &str, write: &str) {
        self.pod_events
            .get_or_create(&PodEventLabels {
                reason: reason.into(),
                write: write.into(),
            })
            .inc();
    }

    /// Counts one CNI call; ADD also goes into the latency histogram.
    pub fn observe(&self, op: &str, error: Option<&tonic::Status>, took: Duration) {
        let result = match error {
            None => "ok".to_string(),
            Some(s) => format!("{:?}", s.code()).to_lowercase(),
        };
        self.requests
            .get_or_create(&RequestLabels {
                op: op.into(),
                result,
            })
            .inc();
        if op == "ADD" && error.is_none() {
            self.add_seconds.observe(took.as_secs_f64());
        }
    }
}
