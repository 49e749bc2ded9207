//! How long a pin's owner has been gone, measured by etcd: `pins-gone/<pool>/<address>` holds
//! the pin's mod revision when its owner was first found gone, on a lease of its own whose
//! granted TTL minus what is left of it is the time since (no wall clock is compared). A pin
//! written since (a holder took it) starts the count again; a deletion of the pin drops the
//! mark with it.

use super::nodes::SEEN_TTL_SECS;
use super::pins::revision_of;
use super::request::{self, op};
use super::EtcdStore;
use crate::cluster::pin::{Pin, PinRead};
use crate::cluster::vocab::ClusterError;

impl EtcdStore {
    /// The key of the mark of `pin`'s owner gone.
    pub(super) fn owner_gone_key(&self, pin: &Pin) -> String {
        self.key(&format!("pins-gone/{}/{}", pin.pool, pin.address))
    }

    /// Marks `read`'s owner gone as from now, unless it is marked so since the pin was last
    /// written; the seconds since it was marked (0: marked now).
    pub(super) async fn mark_gone(&self, read: &PinRead) -> Result<i64, ClusterError> {
        let key = self.owner_gone_key(&read.pin);
        let version = revision_of(read)?;
        let r = self.client().range(request::get(key.clone())).await?;
        let mut stale = None;
        if let Some(kv) = r.kvs.first().filter(|kv| kv.lease != 0) {
            if kv.value == version.to_string().as_bytes() {
                let ttl = self.client().lease_time_to_live(kv.lease).await?;
                if ttl.ttl > 0 {
                    return Ok(ttl.granted_ttl - ttl.ttl);
                }
            }
            stale = Some(kv.lease);
        }
        let lease = self.client().lease_grant(SEEN_TTL_SECS).await?.id;
        let txn = request::txn(
            self.as_read(read)?,
            [op::put(key, version.to_string(), lease)],
            [],
        );
        // Not written: the pin changed since it was read (looked at again next time).
        let written = self.client().txn(txn).await?.succeeded;
        let unused = match written {
            true => stale,
            false => Some(lease),
        };
        if let Some(l) = unused {
            let _ = self.client().lease_revoke(l).await;
        }
        Ok(0)
    }

    /// Drops the mark of `read`'s owner gone, if there is one: read first, so that a look
    /// that finds the owner there, as every look does while it is, writes nothing.
    pub(super) async fn unmark_gone(&self, read: &PinRead) -> Result<(), ClusterError> {
        let key = self.owner_gone_key(&read.pin);
        let marked = self.client().range(request::get(key.clone())).await?;
        if marked.kvs.is_empty() {
            return Ok(());
        }
        self.client().delete_range(request::delete(key)).await?;
        Ok(())
    }
}
