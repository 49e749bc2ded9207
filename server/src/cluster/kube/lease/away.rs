//! How long a node has been away, as another node's daemon may measure it (a takeover of the
//! node's pins): with reads only (the admission policy keeps each daemon to its own Lease, and
//! `node_state`'s measurement is a write). The apiserver's clock comes from the reader's own
//! Lease: the time of its own last renewal, as the apiserver stamped it, is at most now; the
//! other node's away is measured up to then. How long this process has seen that node's
//! Lease unchanged, by its own monotonic clock, is said beside (`NodeState::watched_secs`): a
//! takeover takes no absence longer (a step of the apiserver's clock forward makes a live
//! node look away until its next renewal).

use super::{
    alive_of, annotation, duration_secs, holder, node_name, written_at, FENCE, HOLDS, IN_USE, RENEW,
};
use crate::cluster::kube::{KubeStore, FIELD_MANAGER};
use crate::cluster::vocab::{ClusterError, Listing, NodeSeen, NodeState, Seen};

impl KubeStore {
    pub(super) async fn away_by_reads(
        &self,
        node: &str,
        me: &str,
    ) -> Result<NodeState, ClusterError> {
        let name = Self::lease_name(node);
        self.token().await;
        let Some(theirs) = self.leases.get_opt(&name).await? else {
            return Ok(NodeState {
                unproven: Some(self.no_lease(&name)),
                ..NodeState::default()
            });
        };
        self.token().await;
        let mine = self.leases.get_opt(&Self::lease_name(me)).await?;
        let now = mine.as_ref().and_then(|l| written_at(l, FIELD_MANAGER));
        let (Some(then), Some(now)) = (written_at(&theirs, FIELD_MANAGER), now) else {
            return Ok(NodeState {
                unproven: Some(format!(
                    "Lease {name}, or this node's own, carries no time of a daemon's write (metadata.managedFields): how long node {node:?} has been away cannot be measured"
                )),
                ..NodeState::default()
            });
        };
        let away = (now - then).max(0);
        let lapsed = away > duration_secs(&theirs);
        Ok(NodeState {
            alive: (holder(&theirs).is_some() && !lapsed).then(|| alive_of(&theirs)),
            seen: Some((
                Seen {
                    instance: holder(&theirs).unwrap_or_default(),
                    fence_secs: annotation(&theirs, FENCE),
                    renew_secs: annotation(&theirs, RENEW),
                    at_ms: u64::try_from(then).unwrap_or(0) * 1000,
                    k8s_node: node_name(&theirs),
                },
                away,
            )),
            blocks: Listing::default(),
            unproven: None,
            judged: theirs.metadata.resource_version.clone(),
            k8s_node: node_name(&theirs),
            // None said (a daemon of an older version, or one that confirmed nothing yet):
            // none confirmed.
            watched_secs: Some(self.unchanged_secs(&name, &theirs)),
            confirms: Some(
                theirs
                    .metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(HOLDS))
                    .and_then(|v| serde_json::from_str(v).ok())
                    .unwrap_or_default(),
            ),
        })
    }

    /// Every node's Lease (`ipool-<node>`, listed once), as last renewed: how long ago by the
    /// time the apiserver stamped on its daemon's last write, against the later of this
    /// machine's clock and the apiserver's as the newest stamp in the list shows it (see
    /// [`apiserver_now`]).
    pub(super) async fn leases_seen(&self) -> Result<Vec<NodeSeen>, ClusterError> {
        self.token().await;
        let listed = self.leases.list(&kube::api::ListParams::default()).await?;
        let now = match crate::bugs::on(crate::bugs::Bug::DepartedByLocalClock) {
            true => (crate::cluster::vocab::now_ms() / 1000) as i64,
            // Never behind the apiserver's clock as its stamps show it (a leader whose clock
            // is behind would see no Lease lapse); this machine's when it is ahead (the
            // newest stamp lags by up to a renewal).
            false => {
                apiserver_now(&listed.items).max((crate::cluster::vocab::now_ms() / 1000) as i64)
            }
        };
        Ok(listed
            .items
            .iter()
            .filter_map(|l| {
                let node = l.metadata.name.as_deref()?.strip_prefix("ipool-")?;
                let away = written_at(l, FIELD_MANAGER).map(|t| (now - t).max(0));
                let lapsed = away.is_none_or(|a| a > duration_secs(l));
                Some(NodeSeen {
                    node: node.to_string(),
                    alive: holder(l).filter(|_| !lapsed),
                    away_secs: away.filter(|_| lapsed || holder(l).is_none()),
                    fence_secs: annotation(l, FENCE),
                    in_use: l
                        .metadata
                        .annotations
                        .as_ref()
                        .and_then(|a| a.get(IN_USE))
                        .and_then(|v| serde_json::from_str(v).ok()),
                    k8s_node: node_name(l),
                })
            })
            .collect())
    }
}

/// The apiserver's clock as the Leases `listed` show it: the newest time it stamped on any
/// write of them, Unix seconds (at most now; the leader's own renewal, seconds ago, is among
/// them). Never this machine's clock: a leader whose clock is behind the apiserver's would see
/// no Lease lapse, and release no departed node at all. None listed: this machine's clock.
pub(super) fn apiserver_now(listed: &[k8s_openapi::api::coordination::v1::Lease]) -> i64 {
    listed
        .iter()
        .flat_map(|l| l.metadata.managed_fields.iter().flatten())
        .filter_map(|m| m.time.as_ref().map(|t| t.0.as_second()))
        .max()
        .unwrap_or_else(|| (crate::cluster::vocab::now_ms() / 1000) as i64)
}

#[cfg(test)]
mod tests;
