//! The `/metrics` endpoint: the engine's [`Metrics`](crate::metrics::Metrics) and, read from the
//! pools at each scrape, the pool numbers (see [`crate::metrics`] for the names).

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::Full;
use hyper::body::Bytes;
use hyper::{Request, Response, StatusCode};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;

use crate::ipam::Ipam;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PoolLabels {
    network: String,
    family: String,
}

/// Reads the pools at each scrape.
struct PoolCollector(Ipam);

impl std::fmt::Debug for PoolCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PoolCollector")
    }
}

impl Collector for PoolCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        // One series per network and family: a network's range sets of one family (two ranges
        // sets, or a retiring one beside the current one) add up.
        let mut pools: Vec<(PoolLabels, Vec<crate::ipam::PoolStatus>)> = Vec::new();
        for p in self.0.pool_status(None) {
            let l = PoolLabels {
                network: p.network.clone(),
                family: format!("ipv{}", p.family.as_str()),
            };
            match pools.iter_mut().find(|(k, _)| *k == l) {
                Some((_, v)) => v.push(p),
                None => pools.push((l, vec![p])),
            }
        }
        type Get = fn(&crate::ipam::PoolStatus) -> i64;
        let gauges: [(&str, &str, Get); 7] = [
            ("ipool_pool_in_use", "Addresses held by attachments.", |p| {
                p.in_use as i64
            }),
            (
                "ipool_pool_idle",
                "Idle addresses, cooling ones included.",
                |p| p.idle as i64,
            ),
            (
                "ipool_pool_cooling",
                "Idle addresses still inside their cooldown.",
                |p| p.cooling as i64,
            ),
            (
                "ipool_pool_reserved",
                "Addresses kept for pods that are away.",
                |p| p.reserved as i64,
            ),
            (
                "ipool_pool_capacity",
                "Most addresses the pool may hold.",
                |p| p.capacity as i64,
            ),
            (
                "ipool_pool_free_in_source",
                "Addresses the source could still hand out.",
                |p| i64::try_from(p.free_in_source).unwrap_or(i64::MAX),
            ),
            (
                "ipool_pool_drained",
                "1 while the network takes no new ADDs.",
                |p| i64::from(p.drained),
            ),
        ];
        for (name, help, get) in gauges {
            let mut m =
                enc.encode_descriptor(name, help, None, ConstGauge::new(0i64).metric_type())?;
            for (l, sets) in &pools {
                let v = match name {
                    "ipool_pool_drained" => sets.iter().map(get).max().unwrap_or(0),
                    _ => sets.iter().map(get).fold(0i64, i64::saturating_add),
                };
                ConstGauge::new(v).encode(m.encode_family(l)?)?;
            }
        }
        // Only where the source cannot grow: a cluster network's pool claims another block
        // when it runs low (its pool's exhaustion is ipool_cluster_claims_total{result="exhausted"}).
        let mut m = enc.encode_descriptor(
            "ipool_pool_available",
            "Addresses a new ADD could still get (idle ones, and the source's within the capacity); not for cluster networks, whose pools grow by claiming blocks.",
            None,
            ConstGauge::new(0i64).metric_type(),
        )?;
        for (l, sets) in &pools {
            let fixed: Vec<_> = sets.iter().filter(|p| !p.grows && !p.retiring).collect();
            if !fixed.is_empty() {
                let v = fixed.iter().map(|p| p.available()).sum::<u128>();
                ConstGauge::new(i64::try_from(v).unwrap_or(i64::MAX))
                    .encode(m.encode_family(l)?)?;
            }
        }
        type Count = fn(&crate::ipam::PoolStatus) -> u64;
        let counters: [(&str, &str, Count); 3] = [
            (
                "ipool_source_calls",
                "Addresses asked of the source.",
                |p| p.source_calls,
            ),
            (
                "ipool_source_errors",
                "Times the source had nothing to give.",
                |p| p.source_errors,
            ),
            (
                "ipool_source_bucket_waits",
                "Times the source's token bucket was empty.",
                |p| p.bucket_waits,
            ),
        ];
        for (name, help, get) in counters {
            let mut m =
                enc.encode_descriptor(name, help, None, ConstCounter::new(0u64).metric_type())?;
            for (l, sets) in &pools {
                let v = sets.iter().map(get).fold(0u64, u64::saturating_add);
                ConstCounter::new(v).encode(m.encode_family(l)?)?;
            }
        }
        let stats = self.0.commit_stats();
        let m = enc.encode_descriptor(
            "ipool_store_commits",
            "Writes made durable by the group commit.",
            None,
            ConstCounter::new(0u64).metric_type(),
        )?;
        ConstCounter::new(stats.durable).encode(m)?;
        let failed = self.0.health().borrow().store_failure.is_some();
        let m = enc.encode_descriptor(
            "ipool_store_failed",
            "1 while the store has failed and no change is served (it is reopened in the background).",
            None,
            ConstGauge::new(0i64).metric_type(),
        )?;
        ConstGauge::new(i64::from(failed)).encode(m)?;
        let m = enc.encode_descriptor(
            "ipool_host_problems",
            "Problems that keep the node's runtime from using ipool (the conflist not written); ipoolctl status names them.",
            None,
            ConstGauge::new(0i64).metric_type(),
        )?;
        ConstGauge::new(self.0.host_problems().len() as i64).encode(m)?;
        Ok(())
    }
}

/// The registry behind `/metrics` (the apiserver's with `kubernetes`, etcd's and the blocks'
/// with `cluster`).
pub fn registry(ipam: &Ipam, kubernetes: bool, cluster: bool) -> Registry {
    let m = ipam.metrics();
    let mut r = Registry::default();
    r.register(
        "ipool_requests",
        "CNI calls by operation and outcome.",
        m.requests.clone(),
    );
    r.register(
        "ipool_add_duration_seconds",
        "Time ipoold takes to serve an ADD (durable).",
        m.add_seconds.clone(),
    );
    r.register(
        "ipool_store_flush_duration_seconds",
        "Group-commit flushes: sled flush plus fdatasync.",
        m.flush_seconds.clone(),
    );
    r.register(
        "ipool_host_local_allocations",
        "host-local's allocations met when a network was first served: imported (its attachment now), unreported (taken over for no pod: none reported its address), stale (from before the node's last boot), refused (see the log).",
        m.host_local.clone(),
    );
    if kubernetes {
        r.register(
            "ipool_apiserver_reachable",
            "1 while the Kubernetes apiserver answers.",
            m.apiserver_reachable.clone(),
        );
        r.register(
            "ipool_pod_gc",
            "What the pod GC did: released (pod gone), unquarantined, quarantined.",
            m.pod_gc.clone(),
        );
        r.register(
            "ipool_pod_events",
            "Refused ADDs recorded as Events on their pods, by reason and write: created (a new Event), patched (its series), aggregated (counted, nothing written), dropped, failed.",
            m.pod_events.clone(),
        );
    }
    if cluster {
        let c = &m.cluster;
        r.register(
            "ipool_cluster_store_up",
            "1 while the last call to the cluster store (etcd, or the apiserver) succeeded.",
            c.store_up.clone(),
        );
        r.register(
            "ipool_cluster_etcd_up",
            "Deprecated: ipool_cluster_store_up, under its old name.",
            c.store_up.clone(),
        );
        r.register(
            "ipool_cluster_blocks",
            "This node's blocks by pool, family and state: confirmed (hands out), unconfirmed (not yet synced), reclaiming, returning, unsettled (a give-back etcd did not answer), lost (another node owns it).",
            c.blocks.clone(),
        );
        r.register(
            "ipool_cluster_claims",
            "Block claims by pool and result: won, exhausted (no free block), pool_changed (read again), error.",
            c.claims.clone(),
        );
        r.register(
            "ipool_cluster_claim_conflicts",
            "Blocks found owned by another node, by kind: candidate (a free block another node won first; harmless), ownership (a block this node held).",
            c.conflicts.clone(),
        );
        r.register(
            "ipool_cluster_node_name_taken",
            "1 while another ipoold holds this node's name in etcd (this one hands out nothing).",
            c.node_name_taken.clone(),
        );
        r.register(
            "ipool_cluster_fenced",
            "1 while this node could not renew its heartbeat within fence_secs (no new addresses).",
            c.fenced.clone(),
        );
        r.register(
            "ipool_cluster_malformed_keys",
            "Keys under ipool's etcd prefix that name no owner (counted as occupied).",
            c.malformed_keys.clone(),
        );
        r.register(
            "ipool_cluster_store_resets",
            "Times the cluster store was found restored from an older backup or made anew.",
            c.store_resets.clone(),
        );
        r.register(
            "ipool_cluster_etcd_resets",
            "Deprecated: ipool_cluster_store_resets, under its old name.",
            c.store_resets.clone(),
        );
        r.register(
            "ipool_cluster_pool_disabled",
            "1 while a cluster pool, as this node last read it, is disabled (ipoolctl cluster pool disable): nothing new is handed out from it.",
            c.pool_disabled.clone(),
        );
        r.register(
            "ipool_cluster_pool_reservations",
            "A cluster pool's reservations (ipoolctl cluster reserve), as this node last read it.",
            c.pool_reservations.clone(),
        );
        r.register(
            "ipool_cluster_pool_capacity_blocks",
            "The blocks a cluster pool's CIDRs hold, by family (its excluded ranges and CIDRs on their way in or out left out), as this node last read the pool: with ipool_cluster_blocks summed over the nodes, how full the pool is.",
            c.pool_capacity_blocks.clone(),
        );
        r.register(
            "ipool_cluster_pool_node_selected",
            "1 while this node's labels match a cluster pool's nodeSelector (or it has none), as the node last read the pool: 0, it claims nothing from the pool and gives its empty blocks back.",
            c.pool_node_selected.clone(),
        );
        r.register(
            "ipool_cluster_pins_known",
            "Pins of a cluster pool this node knows (fixed addresses: kept from everyone but their owner's pod).",
            c.pins_known.clone(),
        );
        r.register(
            "ipool_cluster_pins_held",
            "Pins of a cluster pool this node holds (its pods' fixed addresses).",
            c.pins_held.clone(),
        );
        r.register(
            "ipool_cluster_pin_adds",
            "ADDs of pods with a fixed address, by result: created (the pin made), held (this node held it), moved (taken from nobody), migration (a VM's second holder), taken_over (from a node judged gone), refused (held elsewhere: error 11).",
            c.pin_adds.clone(),
        );
        r.register(
            "ipool_cluster_nodes_released",
            "Releases of departed nodes by this daemon that gave blocks back or ended holds ([cluster] release_departed_after_secs: Node gone from the apiserver, name away past the fence and that long; a release that frees nothing is not counted).",
            c.nodes_released.clone(),
        );
        r.register(
            "ipool_cluster_departed_pins_ended",
            "Pins nobody held in departed nodes' blocks that this daemon ended, their owner gone for [cluster] pin_ttl_secs (the blocks then go back).",
            c.pins_ended.clone(),
        );
        r.register(
            "ipool_cluster_departed_leader",
            "1 while this daemon leads the release of departed nodes (one daemon of the cluster at a time).",
            c.departed_leader.clone(),
        );
        r.register(
            "ipool_cluster_block_give_backs",
            "Empty blocks given back after their hold-down.",
            c.give_backs.clone(),
        );
        r.register(
            "ipool_cluster_syncs",
            "Listings of this node's blocks taken in, by pool and family (a count that stalls while the store answers: blocks changed in the store go unseen).",
            c.syncs.clone(),
        );
        r.register(
            "ipool_cluster_store_call_duration_seconds",
            "Calls to the cluster store (etcd, or the apiserver) by operation.",
            c.store_seconds.clone(),
        );
        r.register(
            "ipool_cluster_etcd_call_duration_seconds",
            "Deprecated: ipool_cluster_store_call_duration_seconds, under its old name.",
            c.store_seconds.clone(),
        );
    }
    r.register_collector(Box::new(PoolCollector(ipam.clone())));
    r
}

/// Serves `/metrics` over HTTP/1 until `shutdown` completes.
pub async fn serve_metrics(
    listener: TcpListener,
    registry: Arc<Registry>,
    shutdown: impl Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    loop {
        let (stream, _) = tokio::select! {
            _ = &mut shutdown => return,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(error = %e, "metrics listener accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let registry = registry.clone();
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                let registry = registry.clone();
                async move { Ok::<_, Infallible>(answer(&req, &registry)) }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(stream), svc);
            if let Err(e) = tokio::time::timeout(Duration::from_secs(30), conn).await {
                tracing::debug!(error = %e, "metrics connection timed out");
            }
        });
    }
}

fn answer<B>(req: &Request<B>, registry: &Registry) -> Response<Full<Bytes>> {
    let reply = |code: StatusCode, ctype: &'static str, body: String| {
        let mut r = Response::new(Full::new(Bytes::from(body)));
        *r.status_mut() = code;
        r.headers_mut().insert(
            hyper::header::CONTENT_TYPE,
            hyper::header::HeaderValue::from_static(ctype),
        );
        r
    };
    match req.uri().path() {
        "/metrics" => {
            let mut body = String::new();
            match prometheus_client::encoding::text::encode(&mut body, registry) {
                Ok(()) => reply(
                    StatusCode::OK,
                    "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    body,
                ),
                Err(e) => reply(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "text/plain",
                    format!("encoding metrics failed: {e}\n"),
                ),
            }
        }
        _ => reply(
            StatusCode::NOT_FOUND,
            "text/plain",
            "ipoold serves Prometheus metrics at /metrics\n".into(),
        ),
    }
}

#[cfg(test)]
mod tests;
