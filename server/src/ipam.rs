//! The engine: networks, attachments, and the ADD/DEL/CHECK operations.
//!
//! Every change follows one path ([`Ipam::commit`]): under the state lock, work out what
//! changes (the pools are asked, nothing is taken), hand the changes to the store as one
//! atomic change set, and only once the store has taken it make the same changes in memory;
//! then, outside the lock, wait until the store has made it durable, and only then reply.
//! A store that refuses a change set leaves memory as it was. A store that fails to make one
//! durable has failed: the engine serves no change until the store is reopened and its state
//! rebuilt from what is durable ([`Ipam::recover_store`]).
//!
//! # Layout
//! - [`state`] — the state behind the lock, networks, and the commit path
//! - [`range_set`] — one range set's pool, source and bucket: picking an address, taking it
//! - [`ranges`] — a network's ranges changing at runtime; claims of sources that get their
//!   addresses asynchronously
//! - [`add`] — ADD
//! - [`declare`] — the network a CNI config declares, and those it takes the place of
//! - `diverged` — memory and the store disagree (a change not followed, a record not placed)
//! - [`release`] — DEL, CNI GC, and releasing attachments for every other reason
//! - [`status`] — CNI CHECK and STATUS, pool numbers
//! - [`sticky`] — reservations for pods that went away
//! - [`ops`] — what operators see and steer
//! - [`events`] — the stream of allocation events
//! - [`leak`] — attachments whose network namespace is gone
//! - [`maintain`] — the background loop
//! - [`recover`] — start-up, and rebuilding after a store failure
//! - [`attachments`] — the live attachments, kept compact
//! - `declare_pool` — a network a CNI config declares with `ipam.clusterPool`
//! - `fixed` — what the layer above asks of the engine for pods with a fixed address
//! - `pick` — which addresses an ADD gets, decided without taking anything
//! - `pods` — the engine's side of Kubernetes: attachments for the pod GC to judge, released
//!   once their pod is gone
//! - `reconcile` — the network definitions a start runs with
//! - `suspects` — released only when seen without what keeps it at two checks (Calico's rule)

use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::{watch, Notify};

use crate::clock::Clock;
use crate::config::{DaemonConfig, IpamSection};
use crate::error::Error;
use crate::metrics::Metrics;
use crate::model::{Millis, RouteSpec, Tuning};
use crate::store::{AttachmentKey, Committer, Pod};

mod add;
mod attachments;
mod declare;
mod declare_pool;
mod diverged;
mod events;
mod fixed;
mod leak;
mod maintain;
mod ops;
mod pick;
mod pods;
mod range_set;
mod ranges;
mod reconcile;
mod recover;
mod release;
mod state;
mod status;
mod sticky;
mod suspects;

pub use declare_pool::PoolNetwork;
pub use events::{Event, EventKind};
pub use fixed::{FixedHeld, FixedSite};
pub use leak::{netns_gone, LeakSuspects};
pub use maintain::spawn_maintenance;
pub use ops::{Filter, ALL_NETWORKS};
pub use pods::{LivePod, PodAttachment, Quarantine};
pub use ranges::RangesChanged;
pub use recover::Setup;
pub use release::{ReleaseBy, Released};
pub use status::PoolStatus;
pub use suspects::Suspects;

use state::State;

/// Cheap-to-clone handle on the engine.
#[derive(Clone)]
pub struct Ipam {
    shared: Arc<Shared>,
}

struct Shared {
    state: Mutex<State>,
    store: Committer,
    clock: Arc<dyn Clock>,
    /// The daemon's config: tuning for networks declared by a CNI `ipam` section, and what a
    /// rebuild after a store failure reconciles with.
    config: DaemonConfig,
    boot_id: Option<String>,
    /// Wakes the background loop after a change (and after a store failure).
    changed: Notify,
    /// Wakes the ADDs waiting for addresses on their way: a claim landed, ranges arrived.
    landed: Notify,
    /// Bumped whenever a network's ranges change at runtime, or a source comes to know which
    /// addresses it holds (see `Ipam::ranges_version`); sent to `ranges_changes` too.
    ranges_version: std::sync::atomic::AtomicU64,
    ranges_changes: watch::Sender<u64>,
    /// Time between leak checks; zero: none.
    leak_check: Duration,
    /// Allocation events, for `Watch`.
    events: tokio::sync::broadcast::Sender<Event>,
    /// What health reports.
    health: watch::Sender<Health>,
    metrics: Arc<Metrics>,
    /// Makes each range set's source.
    sources: crate::source::Sources,
    /// Says whether ADDs may be served yet, given the ranges version (Kubernetes: the live
    /// pods' addresses quarantined against the ranges now); asked where the addresses are
    /// chosen.
    add_gate: std::sync::RwLock<Option<AddGate>>,
    /// What keeps the node's runtime from using ipool, by topic ("conflist"): for status.
    host_problems: Mutex<std::collections::BTreeMap<String, String>>,
    /// Bumped when a CNI config declares a network of a cluster pool (`ipam.clusterPool`):
    /// cluster mode follows its pool ([`Ipam::pool_networks`]).
    pool_networks: watch::Sender<u64>,
}

/// Why no ADD may be served yet, given [`Ipam::ranges_version`]; None when they may.
pub type AddGate = Arc<dyn Fn(u64) -> Option<String> + Send + Sync>;

/// What the daemon's health depends on.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Health {
    /// Every network is drained by an operator.
    pub all_drained: bool,
    /// The store failed: no change is served until it is reopened.
    pub store_failure: Option<String>,
    /// Another daemon holds this node's name (cluster mode): nothing is handed out.
    pub name_taken: Option<String>,
}

impl Health {
    /// SERVING: ADDs can be served.
    pub fn serving(&self) -> bool {
        !self.all_drained && self.store_failure.is_none() && self.name_taken.is_none()
    }
}

/// An address as a reply reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lease {
    pub ip: IpAddr,
    pub prefix_len: u8,
    pub gateway: Option<IpAddr>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AddReply {
    pub leases: Vec<Lease>,
    pub routes: Vec<RouteSpec>,
}

#[derive(Clone, Debug)]
pub struct AddRequest {
    pub key: AttachmentKey,
    pub pod: Pod,
    pub netns: String,
    /// The CNI `ipam` section, if the request carried one.
    pub ipam: Option<IpamSection>,
    /// Static addresses asked for: at most one per range set; sets without one get a
    /// dynamic address (as host-local does).
    pub requested: Vec<IpAddr>,
    /// The pod as the apiserver describes it (Kubernetes only): recorded with the attachment.
    pub k8s: Option<crate::model::PodMeta>,
    /// The cluster pools the pod chose (its annotation, or its namespace's); None: the
    /// network's.
    pub pools: Option<crate::model::PoolChoice>,
    /// The requested addresses are fixed for the pod: the layer above holds them for it alone
    /// (a cluster pin this node holds, see `cluster::pin`), and the sources serve them to it
    /// though they keep them from everyone else, outside their blocks too.
    pub fixed: bool,
}

/// A result that may have to wait for the source.
enum Step<T> {
    Done(T),
    /// The source's bucket is empty: try again after this many ms.
    Wait(Millis),
    /// Addresses are on their way (the network's ranges are not known yet, a source is
    /// claiming a block): try again when something lands.
    Pending(Pending),
}

/// What a pending ADD waits for.
struct Pending {
    /// For the error if the wait runs out.
    why: String,
    /// Claims to run outside the lock (see [`crate::source`]).
    claims: Vec<Claiming>,
}

impl Pending {
    fn new(why: String) -> Self {
        Pending {
            why,
            claims: Vec::new(),
        }
    }
}

/// A claim started for range set `set` (its id) of `network`.
struct Claiming {
    network: String,
    set: String,
    claim: crate::source::Claim,
}

/// Checks an attachment key's names by the CNI spec's rules.
pub fn validate_key(key: &AttachmentKey) -> Result<(), Error> {
    key.validate().map_err(|e| Error::InvalidRequest(e.0))
}

/// Checks a network name by the CNI spec's rules.
fn validate_network(name: &str) -> Result<(), Error> {
    ipool_proto::names::check_name("network name", name).map_err(Error::InvalidRequest)
}

// === impl Ipam ===

impl Ipam {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave a half-applied store write (the store
        // is atomic); the pools may be off, so recovering the guard is the lesser evil
        // compared with refusing every later request.
        self.shared.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Engine time (what attachments' creation times are in).
    pub fn now(&self) -> Millis {
        self.shared.clock.now_ms()
    }

    pub fn metrics(&self) -> &Metrics {
        &self.shared.metrics
    }

    /// A number that changes whenever a network's ranges change at runtime, or a source comes
    /// to know which addresses it holds (a cluster pool's first sync): what was checked against
    /// the ranges (the live pods' addresses) is checked again.
    pub fn ranges_version(&self) -> u64 {
        self.shared
            .ranges_version
            .load(std::sync::atomic::Ordering::SeqCst)
    }

    /// [`Ipam::ranges_version`], as it changes.
    pub fn watch_ranges(&self) -> watch::Receiver<u64> {
        self.shared.ranges_changes.subscribe()
    }

    /// The ranges changed (before they serve: whoever checks against them sees it).
    fn ranges_moved(&self) {
        let v = self
            .shared
            .ranges_version
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.shared.ranges_changes.send_replace(v + 1);
    }

    /// Sets what ADDs (and STATUS) wait for before addresses are chosen: asked under the
    /// engine's lock with the ranges version of that moment, so that an ADD is never served
    /// from ranges the gate has not passed. [`Ipam::gate_opened`] wakes the ADDs that wait.
    pub fn set_add_gate(&self, gate: AddGate) {
        *self.shared.add_gate.write().expect("gate lock") = Some(gate);
    }

    /// Something the sources wait for changed (their node took its name, say): the background
    /// loop makes a pass now rather than at its next tick, and waiting ADDs try again.
    pub fn nudge(&self) {
        self.shared.changed.notify_one();
        self.shared.landed.notify_waiters();
    }

    /// Says that `topic` ("conflist") keeps the node's runtime from using ipool (why), or no
    /// longer does (None): status shows it.
    pub fn set_host_problem(&self, topic: &str, why: Option<String>) {
        let mut p = self.shared.host_problems.lock().expect("problems lock");
        match why {
            Some(w) => p.insert(topic.to_string(), w),
            None => p.remove(topic),
        };
    }

    /// What keeps the node's runtime from using ipool (see [`Ipam::set_host_problem`]).
    pub fn host_problems(&self) -> Vec<String> {
        let p = self.shared.host_problems.lock().expect("problems lock");
        p.iter().map(|(t, w)| format!("{t}: {w}")).collect()
    }

    /// The gate may have opened: waiting ADDs try again.
    pub fn gate_opened(&self) {
        self.shared.landed.notify_waiters();
    }

    /// Whether ADDs pass a gate ([`Ipam::set_add_gate`]: with `[kubernetes]`).
    fn has_add_gate(&self) -> bool {
        self.shared.add_gate.read().expect("gate lock").is_some()
    }

    /// Why ADDs may not be served yet, if they may not.
    fn gate_closed(&self) -> Option<String> {
        let gate = self.shared.add_gate.read().expect("gate lock");
        gate.as_ref().and_then(|g| g(self.ranges_version()))
    }

    /// The metrics, shared.
    pub fn metrics_handle(&self) -> Arc<Metrics> {
        self.shared.metrics.clone()
    }

    /// The store's group-commit counters.
    pub fn commit_stats(&self) -> crate::store::CommitStats {
        self.shared.store.stats()
    }

    /// Tuning for networks that CNI configs declare.
    pub fn defaults(&self) -> &Tuning {
        &self.shared.config.defaults
    }

    /// What health reports, and its changes.
    pub fn health(&self) -> watch::Receiver<Health> {
        self.shared.health.subscribe()
    }

    /// Says that another daemon holds this node's name (cluster mode), or no longer does:
    /// health is NOT_SERVING meanwhile.
    pub fn set_name_taken(&self, why: Option<String>) {
        self.shared.health.send_if_modified(|h| {
            let changed = h.name_taken != why;
            h.name_taken = why;
            changed
        });
    }
}

fn join(ips: &[IpAddr]) -> String {
    let v: Vec<String> = ips.iter().map(|i| i.to_string()).collect();
    v.join(", ")
}

#[cfg(test)]
mod tests;
