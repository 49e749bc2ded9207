//! Leads on the apiserver ([`LeadStore`]): a Lease `ipool.<role>` in the Leases' namespace
//! (never a node's: those are `ipool-<node>`), as client-go's leader election keeps one. Its
//! holder renews it on its own last write; another takes it only once it is released or has
//! stayed unchanged, as this process saw it, for its whole duration; every write is on the
//! resourceVersion read, so two candidates never both win.

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;

use super::{duration_secs, holder};
use crate::cluster::datastore::LeadStore;
use crate::cluster::kube::{api_code, KubeStore};
use crate::cluster::vocab::{Alive, ClusterError};

/// The Lease of a lead: `ipool.` cannot begin a node's Lease (`ipool-<node>`).
pub fn lead_lease(role: &str) -> String {
    format!("ipool.{role}")
}

impl KubeStore {
    /// Renews the lead this process holds on its last write; false: it no longer holds it.
    async fn renew_lead(&self, name: &str) -> Result<bool, ClusterError> {
        let last = self.held.lock().expect("held lock").get(name).cloned();
        let Some(mut l) = last else {
            return Ok(false);
        };
        if let Some(s) = l.spec.as_mut() {
            s.renew_time = Some(MicroTime(Timestamp::now()));
        }
        self.token().await;
        let written = self.leases.replace(name, &self.post(), &l).await;
        let mut held = self.held.lock().expect("held lock");
        match written {
            Ok(l) => {
                held.insert(name.to_string(), l);
                Ok(true)
            }
            Err(e) if matches!(api_code(&e), Some(409 | 404)) => {
                held.remove(name);
                Ok(false)
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Whether `l`, held by another, has stayed unchanged for its duration as this process
    /// saw it (first seen so now: not yet).
    fn lapsed(&self, name: &str, l: &Lease) -> bool {
        self.unchanged_secs(name, l) >= duration_secs(l)
    }
}

#[async_trait::async_trait]
impl LeadStore for KubeStore {
    async fn lead(&self, role: &str, me: &str, ttl_secs: u64) -> Result<bool, ClusterError> {
        let name = lead_lease(role);
        if self.renew_lead(&name).await? {
            return Ok(true);
        }
        self.token().await;
        let now = self.leases.get_opt(&name).await?;
        if let Some(l) = &now {
            match holder(l) {
                Some(h) if h == me => {}
                Some(_) if !self.lapsed(&name, l) => return Ok(false),
                Some(h) => {
                    tracing::info!(role, holder = %h, lease = %name, "taking over a lead its holder left unchanged for its whole duration")
                }
                None => {}
            }
        }
        let me = Alive {
            instance: me.to_string(),
            ..Alive::default()
        };
        let lease = self.held_by(now.as_ref(), &name, &me, ttl_secs.max(1), 0);
        // False: another candidate wrote it first.
        self.take(&name, now.as_ref(), &lease).await
    }

    async fn leader(&self, role: &str) -> Result<Option<String>, ClusterError> {
        self.token().await;
        let l = self.leases.get_opt(&lead_lease(role)).await?;
        Ok(l.as_ref().and_then(holder))
    }
}
