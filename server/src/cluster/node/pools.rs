//! The pools as this node read them: kept while Ready for claims, and each pool's
//! reservations and whether it is disabled, changed only by a read (the sources ask them on
//! every hand-out, with no I/O). Reads are numbered as they are sent: what one finds is not
//! taken in once a read sent after it was (a slow read never undoes a newer one).

use std::sync::Arc;

use super::ClusterNode;
use crate::cluster::ippool::Reserved;
use crate::cluster::vocab::{ClusterError, Pool, PoolPhase};
use crate::error::Refusal;
use crate::selector::NodeSelector;

/// What a pool, as last read, says of handing out.
#[derive(Default)]
pub(super) struct Policy {
    /// Which read it came from (reads are numbered as they are sent: the answer of one sent
    /// before the last applied is not applied, so a slow read never undoes a newer one).
    read: u64,
    /// The read found the pool.
    known: bool,
    /// The read found no pool: deleted (or not made yet), not one on its way.
    gone: bool,
    disabled: bool,
    reserved: Arc<Vec<Reserved>>,
    /// The pool's nodeSelector, parsed, or why it cannot be (None: every node may use it).
    selector: Option<Result<NodeSelector, crate::selector::BadSelector>>,
    /// The pool as read, while it is Ready and not forgotten: what claims are conditioned on.
    ready: Option<Pool>,
}

impl ClusterNode {
    /// Pool `name` as last read when it was Ready (read now if not: a pool of another phase
    /// is read again at every use).
    pub async fn pool(&self, name: &str) -> Result<Option<Pool>, ClusterError> {
        let kept = self
            .policy
            .lock()
            .expect("policy lock")
            .get(name)
            .and_then(|p| p.ready.clone());
        match kept {
            Some(p) => Ok(Some(p)),
            None => self.read_pool(name).await,
        }
    }

    /// Pool `name`, read from the store now (and kept while Ready).
    pub async fn read_pool(&self, name: &str) -> Result<Option<Pool>, ClusterError> {
        let name_owned = name.to_string();
        let read = self
            .pool_reads
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let pool = self
            .call("get_pool", |s| async move { s.get_pool(&name_owned).await })
            .await?;
        self.took_in(name, read, pool.as_ref());
        Ok(pool)
    }

    /// What read number `read` of pool `name` found, for the sources: applied unless a read
    /// sent after it was applied first.
    pub(in crate::cluster) fn took_in(&self, name: &str, read: u64, pool: Option<&Pool>) {
        {
            let mut policy = self.policy.lock().expect("policy lock");
            let now = policy.entry(name.to_string()).or_default();
            if read >= now.read {
                now.read = read;
                now.known = pool.is_some();
                now.gone = pool.is_none();
                now.ready = pool.filter(|p| p.phase == PoolPhase::Ready).cloned();
                now.disabled = pool.is_some_and(|p| p.spec.disabled);
                // Parsed when it was read; one that does not parse (written by hand, or by a
                // later version) lets no node use the pool.
                now.selector = pool
                    .and_then(|p| p.spec.node_selector.as_deref())
                    .map(NodeSelector::parse);
                let reserved = pool.map(|p| &p.spec.reserved[..]).unwrap_or(&[]);
                // The same reservations keep their Arc (a source reports new ones).
                if *now.reserved != reserved {
                    now.reserved = Arc::new(reserved.to_vec());
                }
                let capacity = pool.map(|p| capacity(&p.spec)).unwrap_or_default();
                self.metrics.cluster.pool_read(
                    name,
                    now.disabled,
                    now.reserved.len(),
                    [("4", capacity[0]), ("6", capacity[1])],
                );
            }
        }
        self.count_selected();
    }

    /// `ipool_cluster_pool_node_selected` for every pool as read, with the labels now (a
    /// change is logged once).
    fn count_selected(&self) {
        let policy = self.policy.lock().expect("policy lock");
        let labels = self.labels.lock().expect("labels lock");
        for (name, p) in policy.iter().filter(|(_, p)| p.known) {
            let selected = match (&p.selector, labels.as_ref()) {
                (None, _) => true,
                (Some(Ok(s)), Some(l)) => s.matches(l),
                (Some(_), _) => false,
            };
            self.metrics.cluster.pool_selected(name, selected);
        }
    }

    /// Pool `name` as if read from the store now (for tests of the sources, whose node has no
    /// store), sent after every read before.
    #[cfg(test)]
    pub(crate) fn as_read(&self, name: &str, pool: Option<&Pool>) {
        let read = self
            .pool_reads
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.took_in(name, read, pool);
    }

    /// Pool `name`'s reservations, as last read (no I/O).
    pub fn pool_reserved(&self, name: &str) -> Arc<Vec<Reserved>> {
        self.policy
            .lock()
            .expect("policy lock")
            .get(name)
            .map(|p| p.reserved.clone())
            .unwrap_or_default()
    }

    /// Whether pool `name` was read (and found) since the daemon started: a source hands
    /// nothing out before, not knowing the pool's reservations nor whether it is disabled.
    pub fn pool_known(&self, name: &str) -> bool {
        self.policy
            .lock()
            .expect("policy lock")
            .get(name)
            .is_some_and(|p| p.known)
    }

    /// Whether pool `name` was read and found not there (no I/O).
    pub fn pool_gone(&self, name: &str) -> bool {
        self.policy
            .lock()
            .expect("policy lock")
            .get(name)
            .is_some_and(|p| p.gone)
    }

    /// Whether pool `name`, as last read, is disabled (no I/O).
    pub fn pool_disabled(&self, name: &str) -> bool {
        self.policy
            .lock()
            .expect("policy lock")
            .get(name)
            .is_some_and(|p| p.disabled)
    }

    /// Why this node may not take new addresses from pool `name`, as last read: its labels
    /// do not match the pool's nodeSelector (no I/O). None while the labels are not known
    /// (see [`ClusterNode::pool_awaits_labels`]).
    pub fn pool_refused(&self, name: &str) -> Option<String> {
        let policy = self.policy.lock().expect("policy lock");
        self.refused_by(name, policy.get(name)?)
    }

    /// Why nothing new is taken from pool `name` now, as last read: it is disabled, or this
    /// node may not use it ([`ClusterNode::pool_refused`]); in one look (no I/O).
    pub fn pool_stopped(&self, name: &str) -> Option<String> {
        self.pool_stopped_for(name).map(|(_, why)| why)
    }

    /// [`ClusterNode::pool_stopped`], with what an operator can act on in it (an ADD
    /// refused for it is recorded on the pod).
    pub fn pool_stopped_for(&self, name: &str) -> Option<(Refusal, String)> {
        let policy = self.policy.lock().expect("policy lock");
        let p = policy.get(name)?;
        match p.disabled {
            true => Some((Refusal::PoolDisabled, disabled_why(name))),
            false => self
                .refused_by(name, p)
                .map(|why| (Refusal::NoPoolForNode, why)),
        }
    }

    fn refused_by(&self, name: &str, p: &Policy) -> Option<String> {
        let selector = match p.selector.as_ref()? {
            Ok(s) => s,
            Err(e) => {
                return Some(format!(
                    "cluster pool {name:?}'s nodeSelector cannot be read ({e}): no node uses the pool until it is fixed (ipoolctl cluster pool set-node-selector)"
                ))
            }
        };
        let labels = self.labels.lock().expect("labels lock");
        let labels = labels.as_ref()?;
        (!selector.matches(labels)).then(|| {
            format!(
                "node {}'s labels do not match cluster pool {name:?}'s nodeSelector {:?}",
                self.name(),
                selector.to_string()
            )
        })
    }

    /// Why nothing is handed out from pool `name` yet: it has a nodeSelector and this node's
    /// labels are not known yet (no I/O).
    pub fn pool_awaits_labels(&self, name: &str) -> Option<String> {
        let policy = self.policy.lock().expect("policy lock");
        policy.get(name)?.selector.as_ref()?.as_ref().ok()?;
        match self.labels.lock().expect("labels lock").is_some() {
            true => None,
            false => Some(format!(
                "cluster pool {name:?} has a nodeSelector, and node {}'s labels are not known yet (they come from its Node object with [kubernetes], else from [cluster] node_labels)",
                self.name()
            )),
        }
    }

    /// This node's labels from now on (its Node's, or `[cluster] node_labels`): what the
    /// pools' nodeSelectors are matched against.
    pub fn set_labels(&self, labels: std::collections::BTreeMap<String, String>) {
        let mut now = self.labels.lock().expect("labels lock");
        if now.as_ref() != Some(&labels) {
            tracing::info!(labels = ?labels, "this node's labels, for the cluster pools' nodeSelectors");
            *now = Some(labels);
            drop(now);
            self.count_selected();
        }
    }

    /// Forgets pool `name` as read (it changed): the next use reads it again (what it said of
    /// reservations and being disabled stands until then).
    pub fn forget_pool(&self, name: &str) {
        if let Some(p) = self.policy.lock().expect("policy lock").get_mut(name) {
            p.ready = None;
        }
    }

    /// Forgets every pool as read (the store's watch started over, or the store was reset).
    pub(super) fn forget_pools(&self) {
        for p in self.policy.lock().expect("policy lock").values_mut() {
            p.ready = None;
        }
    }
}

/// The blocks pool `spec`'s CIDRs hold, IPv4 and IPv6: those a node may claim (its excluded
/// ranges and the CIDRs on their way in or out left out).
fn capacity(spec: &crate::cluster::ippool::PoolSpec) -> [u64; 2] {
    let mut blocks = [0u64; 2];
    for set in spec.carve().unwrap_or_default() {
        let family = usize::from(set.cidr().addr().is_ipv6());
        blocks[family] += (set.len() - set.used()) as u64;
    }
    blocks
}

/// What an ADD is told of pool `name`, disabled.
pub fn disabled_why(name: &str) -> String {
    format!(
        "cluster pool {name:?} is disabled: nothing new is handed out from it (ipoolctl cluster pool enable {name})"
    )
}
