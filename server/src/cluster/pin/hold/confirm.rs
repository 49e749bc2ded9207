//! Whose holds another node may drop or share: a takeover drops the hold of a node that is
//! gone (as `release-node` would judge it, `--absent-for 0`), and a VM's migration target
//! shares the hold of its source; on the Kubernetes API, only a hold that node confirmed
//! ([`NodeState::confirms`]).
//!
//! On the Kubernetes API a pin's creation is a create, conditioned on nothing but the name: one
//! sent by an ADD that gave up (its daemon killed, say) can land seconds later, after the node
//! started again and handed the address to another pod, knowing nothing of the pin. Its hold is
//! the node's, for a pod that never ran with the address, and the node confirms only holds its
//! engine has (`ClusterNode::holds_to_confirm`), so nobody takes such a pin over or shares it.
//! On etcd a creation sent before the daemon's last landed write cannot land (`etcd::witness`),
//! and the store keeps no confirmations.

use super::{Holder, Holds, Pin};
use crate::cluster::release::not_gone;
use crate::cluster::vocab::{ClusterError, NodeState};

impl Holds {
    /// What the store says of `node` now, for a takeover of its holds.
    async fn away(&self, node: &str) -> Result<NodeState, ClusterError> {
        let (n, me) = (node.to_string(), self.node.name().to_string());
        self.node
            .call("node_away", |s| async move { s.node_away(&n, &me).await })
            .await
    }

    /// Why hold `h` of `pin`, another node's, is kept (None: its node is gone, and it
    /// confirmed the hold: dropped by a takeover).
    pub(super) async fn kept_hold(
        &self,
        pin: &Pin,
        h: &Holder,
    ) -> Result<Option<String>, ClusterError> {
        let state = watched(self.away(&h.node).await?);
        if let Some(why) = not_gone(&state, self.node.store_name(), &h.node, 0) {
            return Ok(Some(why));
        }
        Ok(unconfirmed_by(pin, h, state.confirms.as_deref()))
    }

    /// Why hold `h` of `pin`, another node's, is not one its node confirms, if it is not
    /// (asked only of a store that keeps confirmations: the Kubernetes API).
    pub(super) async fn unconfirmed(
        &self,
        pin: &Pin,
        h: &Holder,
    ) -> Result<Option<String>, ClusterError> {
        if self.node.settings().datastore != crate::config::cluster::DatastoreKind::Kubernetes {
            return Ok(None);
        }
        let state = self.away(&h.node).await?;
        Ok(unconfirmed_by(pin, h, state.confirms.as_deref()))
    }
}

/// `state`, its absence never longer than the reader has seen the node's record unchanged
/// ([`NodeState::watched_secs`]).
fn watched(mut state: NodeState) -> NodeState {
    if crate::bugs::on(crate::bugs::Bug::AwayByStampsOnly) {
        return state;
    }
    if let (Some(w), Some((_, away))) = (state.watched_secs, state.seen.as_mut()) {
        *away = (*away).min(w);
    }
    state
}

/// Why hold `h` of `pin` is not confirmed by its node, as `confirms` (its node's word, where
/// the store keeps it) says. A pin of an address set aside needs no word: no block's node
/// hands such an address out, so a creation that landed late takes it from nobody.
fn unconfirmed_by(pin: &Pin, h: &Holder, confirms: Option<&[String]>) -> Option<String> {
    let confirms = confirms?;
    if pin.set_aside
        || confirms.contains(&h.key(pin.address))
        || crate::bugs::on(crate::bugs::Bug::LatePinTakenOver)
    {
        return None;
    }
    Some(format!(
        "node {:?} has not confirmed its hold of {} for pod {} (a pin whose creation landed after its ADD had failed, whose address that node may have handed to another pod): it moves once that node is released",
        h.node, pin.address, h.pod
    ))
}

#[cfg(test)]
mod tests;
