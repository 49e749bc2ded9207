//! A simulated daemon's loops on the Kubernetes side, each a turn a step starts: its pin
//! keeper (`k8s::pin_keeper`) and its pod GC (`k8s::gc`), ipoold's own code, with their
//! memories lost with the daemon as ipoold's are.

use std::sync::Arc;
use std::time::Duration;

use ipool_server::k8s::gc::{check, PodLookup, Sandboxes};

use super::Daemon;

impl Daemon {
    /// A turn of its pin keeper, as ipoold's runs every 30 s (`k8s::pin_keeper`): a hold no
    /// attachment here uses, seen so for its grace, let go; an unheld pin of its blocks whose
    /// owner `owners` says is gone, seen so for `pin_ttl_secs`, ended.
    pub(crate) fn keep_pins(&mut self, owners: crate::owners::GoneOwners) {
        let Some(holds) = self.holds.clone() else {
            return;
        };
        let (ipam, keeper) = (self.ipam.clone(), self.keeper.clone());
        self.calls.push(tokio::spawn(async move {
            use ipool_server::k8s::pin_keeper;
            let mut k = keeper.lock().await;
            let Keeper { unused, gone_since } = &mut *k;
            let ttl = Duration::from_secs(holds.node().settings().pin_ttl_secs);
            pin_keeper::let_go_unused(&ipam, &holds, unused).await;
            pin_keeper::end_misheld(&ipam, &holds).await;
            pin_keeper::end_gone_owners(&ipam, &holds, &owners, ttl, gone_since).await;
        }));
        self.calls.retain(|c| !c.is_finished());
    }

    /// Its pin keeper is in a turn now.
    pub fn keeper_busy(&self) -> bool {
        self.keeper.try_lock().is_err()
    }

    /// Its pin keeper has work under way: a turn, or a hold seen unused waiting out its
    /// grace (its let-go is a write to come).
    pub fn keeper_waiting(&self) -> bool {
        self.keeper.try_lock().map_or(true, |k| k.unused.waiting())
    }

    /// A check of its pod GC, as ipoold's runs every few seconds (`k8s::gc::check`, its own
    /// code): an attachment whose pod `pods` shows gone, seen so for the grace, confirmed by a
    /// live GET and not kept by `runtime` (a ready sandbox, or no answer), released.
    pub(crate) fn collect(&mut self, pods: Arc<dyn PodLookup>, runtime: Arc<dyn Sandboxes>) {
        // ipoold's GC checks one at a time: a check is not queued behind another.
        if self.collector.try_lock().is_err() {
            return;
        }
        let (ipam, collector) = (self.ipam.clone(), self.collector.clone());
        self.calls.push(tokio::spawn(async move {
            let mut suspects = collector.lock().await;
            check(&ipam, pods.as_ref(), Some(runtime.as_ref()), &mut suspects).await;
        }));
        self.calls.retain(|c| !c.is_finished());
    }
}

/// A pin keeper's memory.
#[derive(Default)]
pub(super) struct Keeper {
    unused: ipool_server::k8s::pin_keeper::Unused,
    gone_since: ipool_server::k8s::pin_keeper::GoneSince,
}
