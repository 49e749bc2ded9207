//! release-node's writes on the Kubernetes API: the node's Lease held while its blocks go back
//! and its holds on pins end (see [`KubeStore::release`]).

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{DeleteParams, Preconditions};

use super::{annotation, duration_secs, holder, written_at, FENCE, RELEASER, RENEW};
use crate::bugs::{self, Bug};
use crate::cluster::datastore::{BlockStore, Freed, PinStore, Release};
use crate::cluster::kube::{api_code, KubeStore, FIELD_MANAGER};
use crate::cluster::pin::{holds_of, keeps_block, Pin, PinRead};
use crate::cluster::vocab::{Alive, Block, ClusterError};

impl KubeStore {
    /// Gives back the plan's blocks and ends the node's holds on pins. Unless forced, its
    /// Lease is held by [`RELEASER`] meanwhile (taken only if it still is as
    /// [`Self::node_state`] left it: not renewed since), so that a daemon that comes back
    /// waits, then finds no block and no hold; then deleted, or, while the node keeps blocks
    /// (a pin was made in them), released (no holder): a later release measures its absence
    /// from the daemon's last write, as before.
    ///
    /// The plan read the pins before this process saw the daemon past its fence: the daemon,
    /// cut off but within its fence, may have made a pin in one of its blocks since. A delete
    /// on the apiserver cannot be conditioned on there being none (on etcd the give-back is),
    /// so once the Lease is held here (the daemon past its fence, by this process's clock) the
    /// pins are read again: a block pinned since stays, and the holds taken since end too.
    pub(super) async fn release(
        &self,
        node: &str,
        plan: &Release<'_>,
    ) -> Result<Freed, ClusterError> {
        let (blocks, force) = (plan.blocks, plan.force);
        let name = Self::lease_name(node);
        self.token().await;
        let mut lease = self.leases.get_opt(&name).await?;
        let watch = !bugs::on(Bug::ReleaseByServerClocks);
        if let (Some(l), false, true) = (&lease, force, watch) {
            // The apiserver's clock said how long; its replicas' clocks may disagree. That the
            // daemon is past its fence is seen here, by this process's own clock: the Lease
            // left unchanged for its fence, a renewal's interval and a second.
            let wait = annotation(l, FENCE) + annotation(l, RENEW).max(1) + 1;
            tracing::info!(node, lease = %name, wait_secs = wait, "watching the node's Lease for a renewal before giving its blocks back");
            tokio::time::sleep(std::time::Duration::from_secs(wait)).await;
            self.token().await;
            let again = self.leases.get_opt(&name).await?;
            let rv =
                |l: &Option<Lease>| l.as_ref().and_then(|l| l.metadata.resource_version.clone());
            if rv(&again) != rv(&lease) {
                return Err(ClusterError::Refused(format!(
                    "node {node:?} is alive or came back: its Lease changed within {wait} s"
                )));
            }
            lease = again;
        }
        let held = match (&lease, force) {
            // The bug, put back: the blocks given back with nothing held.
            (Some(_), false) if bugs::on(Bug::ReleaseUnconditioned) => None,
            (Some(l), false) => {
                // Still as node_state measured it: unrenewed for longer than its duration
                // when ipoolctl last wrote it (by the apiserver's clock).
                let lapsed = written_at(l, &self.field_manager)
                    .zip(written_at(l, FIELD_MANAGER))
                    .is_some_and(|(checked, renewed)| checked - renewed > duration_secs(l));
                if holder(l).as_deref().is_some_and(|h| h != RELEASER) && !lapsed {
                    return Err(ClusterError::Refused(format!(
                        "node {node:?} is alive or came back: its Lease was renewed within its duration of the last check"
                    )));
                }
                let me = Alive {
                    instance: RELEASER.into(),
                    ..Alive::default()
                };
                let ttl = u64::try_from(duration_secs(l).max(1)).unwrap_or(1);
                let taken = self.held_by(Some(l), &name, &me, ttl, 0);
                self.token().await;
                match self.leases.replace(&name, &self.post(), &taken).await {
                    Ok(t) => Some(t),
                    Err(e) if api_code(&e) == Some(409) => {
                        return Err(ClusterError::Refused(format!(
                            "node {node:?} came back: its Lease changed while its blocks were about to be given back"
                        )))
                    }
                    Err(e) => return Err(e.into()),
                }
            }
            // No Lease here (never made, deleted, or in another namespace): nothing proves
            // the node is away.
            (None, false) if bugs::on(Bug::NoLeaseIsAbsence) => None,
            (None, false) => {
                return Err(ClusterError::Refused(format!(
                    "node {node:?}: {}; its blocks stay (--force gives them back anyway)",
                    self.no_lease(&name)
                )))
            }
            (_, true) => None,
        };
        // Read again once the daemon is past its fence: what it pinned before is all it
        // pinned.
        let again = match held.is_some() && !bugs::on(Bug::PinsReadBeforeFence) {
            true => Some(self.pins(None).await?),
            false => None,
        };
        let (blocks, holds): (Vec<Block>, Vec<(PinRead, Pin)>) = match &again {
            Some(pins) => (
                blocks
                    .iter()
                    .filter(|b| !keeps_block(pins, b))
                    .cloned()
                    .collect(),
                holds_of(pins, node),
            ),
            None => (blocks.to_vec(), plan.holds.to_vec()),
        };
        let keeps_blocks = plan.keeps_blocks || blocks.len() < plan.blocks.len();
        if keeps_blocks && !plan.keeps_blocks {
            tracing::warn!(node, kept = plan.blocks.len() - blocks.len(), "a block of the node was pinned after the release read the pins: it stays, with the node's Lease");
        }
        let mut freed = Freed::default();
        for b in &blocks {
            if self.give_back(b).await? {
                freed.blocks.push(b.clone());
            }
        }
        // While the Lease is held here: a daemon back meanwhile has waited.
        for (read, pin) in &holds {
            if self.write_pin(read, pin).await?.is_some() {
                freed.unheld.push(pin.clone());
            }
        }
        let Some(t) = held else {
            return Ok(freed);
        };
        self.token().await;
        let keeps = (keeps_blocks || freed.unheld.len() < holds.len())
            && !bugs::on(Bug::ReleasedLeaseDeleted);
        let done = match keeps {
            true => {
                let mut released = t.clone();
                if let Some(s) = released.spec.as_mut() {
                    s.holder_identity = None;
                }
                self.leases
                    .replace(&name, &self.post(), &released)
                    .await
                    .map(|_| ())
            }
            false => {
                let params = DeleteParams {
                    preconditions: Some(Preconditions {
                        uid: t.metadata.uid.clone(),
                        resource_version: t.metadata.resource_version.clone(),
                    }),
                    ..DeleteParams::default()
                };
                self.leases.delete(&name, &params).await.map(|_| ())
            }
        };
        match done {
            Ok(()) => Ok(freed),
            Err(e) if matches!(api_code(&e), Some(404 | 409)) => Ok(freed),
            Err(e) => Err(e.into()),
        }
    }
}
