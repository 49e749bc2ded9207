//! The pools as this node read them: kept while Ready for claims, and each pool's
//! reservations and whether it is disabled, changed only by a read (the sources ask them on
//! every hand-out, with no I/O).

use std::sync::Arc;

use super::ClusterNode;
use crate::cluster::model::{ClusterError, Pool, PoolPhase};
use crate::cluster::pool::Reserved;

/// What a pool, as last read, says of handing out: disabled, and its reservations.
pub(super) type Policy = (bool, Arc<Vec<Reserved>>);

impl ClusterNode {
    /// Pool `name` as last read when it was Ready (read now if not: a pool of another phase
    /// is read again at every use).
    pub async fn pool(&self, name: &str) -> Result<Option<Pool>, ClusterError> {
        if let Some(p) = self.pools.lock().expect("pools lock").get(name) {
            return Ok(Some(p.clone()));
        }
        self.read_pool(name).await
    }

    /// Pool `name`, read from the store now (and kept while Ready).
    pub async fn read_pool(&self, name: &str) -> Result<Option<Pool>, ClusterError> {
        let name_owned = name.to_string();
        let pool = self
            .call("get_pool", |s| async move { s.get_pool(&name_owned).await })
            .await?;
        if let Some(p) = &pool {
            self.metrics
                .cluster
                .pool_read(name, p.spec.disabled, p.spec.reserved.len());
        }
        {
            let mut policy = self.policy.lock().expect("policy lock");
            match &pool {
                Some(p) => {
                    let (disabled, reserved) = (p.spec.disabled, &p.spec.reserved);
                    match policy.get_mut(name) {
                        // The same reservations keep their Arc (a source reports new ones).
                        Some(had) if *had.1 == *reserved => had.0 = disabled,
                        _ => {
                            policy.insert(name.to_string(), (disabled, Arc::new(reserved.clone())));
                        }
                    }
                }
                None => {
                    policy.remove(name);
                }
            }
        }
        let mut pools = self.pools.lock().expect("pools lock");
        match &pool {
            Some(p) if p.phase == PoolPhase::Ready => pools.insert(name.to_string(), p.clone()),
            _ => pools.remove(name),
        };
        Ok(pool)
    }

    /// Pool `name`'s reservations, as last read (no I/O).
    pub fn pool_reserved(&self, name: &str) -> Arc<Vec<Reserved>> {
        self.policy
            .lock()
            .expect("policy lock")
            .get(name)
            .map(|p| p.1.clone())
            .unwrap_or_default()
    }

    /// Whether pool `name`, as last read, is disabled (no I/O).
    pub fn pool_disabled(&self, name: &str) -> bool {
        self.policy
            .lock()
            .expect("policy lock")
            .get(name)
            .is_some_and(|p| p.0)
    }

    /// Forgets pool `name` as read (it changed): the next use reads it again.
    pub fn forget_pool(&self, name: &str) {
        self.pools.lock().expect("pools lock").remove(name);
    }
}
