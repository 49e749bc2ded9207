//! Leads in etcd ([`LeadStore`]): the key `leaders/<role>` under the prefix, holding the
//! leader's name, on a lease of the lead's TTL. Taken only while absent (one transaction), so
//! one daemon holds it at a time; kept by the lease's keep-alive and a read that the key is
//! still on that lease; gone within the TTL of its leader stopping or losing etcd.

use super::request::{self, cmp, op};
use super::EtcdStore;
use crate::cluster::datastore::LeadStore;
use crate::cluster::vocab::ClusterError;

impl EtcdStore {
    fn lead_key(&self, role: &str) -> String {
        self.key(&format!("leaders/{role}"))
    }

    fn lead_held(&self, role: &str) -> Option<i64> {
        self.leads.lock().expect("leads lock").get(role).copied()
    }

    fn set_lead(&self, role: &str, lease: Option<i64>) {
        let mut leads = self.leads.lock().expect("leads lock");
        match lease {
            Some(l) => leads.insert(role.to_string(), l),
            None => leads.remove(role),
        };
    }
}

#[async_trait::async_trait]
impl LeadStore for EtcdStore {
    async fn lead(&self, role: &str, me: &str, ttl_secs: u64) -> Result<bool, ClusterError> {
        let key = self.lead_key(role);
        if let Some(lease) = self.lead_held(role) {
            let kept = self.client().lease_keep_alive(lease).await?.ttl > 0;
            let read = self.client().range(request::get(key.clone())).await?;
            if kept && read.kvs.first().is_some_and(|kv| kv.lease == lease) {
                return Ok(true);
            }
            // Lapsed (the lease expired while this process could not reach etcd) or replaced.
            self.set_lead(role, None);
            let _ = self.client().lease_revoke(lease).await;
            tracing::info!(role, "lost the lead");
        }
        let read = self.client().range(request::get(key.clone())).await?;
        if !read.kvs.is_empty() {
            return Ok(false);
        }
        let ttl = i64::try_from(ttl_secs.max(1)).unwrap_or(i64::MAX);
        let lease = self.client().lease_grant(ttl).await?.id;
        let txn = request::txn(
            [cmp::version(key.clone(), cmp::Equal, 0)],
            [op::put(key, me.as_bytes().to_vec(), lease)],
            [],
        );
        if self.client().txn(txn).await?.succeeded {
            self.set_lead(role, Some(lease));
            return Ok(true);
        }
        let _ = self.client().lease_revoke(lease).await;
        Ok(false)
    }

    async fn leader(&self, role: &str) -> Result<Option<String>, ClusterError> {
        let read = self
            .client()
            .range(request::get(self.lead_key(role)))
            .await?;
        Ok(read
            .kvs
            .first()
            .map(|kv| String::from_utf8_lossy(&kv.value).into_owned()))
    }
}
