//! CNI GC (release what the runtime no longer knows) and CNI STATUS (can an ADD be served).

use std::collections::HashSet;
use std::net::IpAddr;

use super::{Ipam, State};
use crate::config::NetworkDef;
use crate::error::Error;
use crate::store::{AttachmentKey, Change};

impl Ipam {
    /// Releases every attachment of `network` whose (container ID, ifname) is not in `valid`.
    /// Returns what was released. Each release is logged with its reason.
    pub async fn gc(
        &self,
        network: &str,
        valid: &HashSet<(String, String)>,
    ) -> Result<Vec<(AttachmentKey, Vec<IpAddr>)>, Error> {
        crate::ipam::validate_name("network name", network).map_err(Error::InvalidRequest)?;
        let released = {
            let mut guard = self.lock();
            let st = &mut *guard;
            let stale: Vec<AttachmentKey> = st
                .attachments
                .keys()
                .filter(|k| {
                    k.network == network
                        && !valid.contains(&(k.container_id.clone(), k.ifname.clone()))
                })
                .cloned()
                .collect();
            if stale.is_empty() {
                return Ok(Vec::new());
            }
            self.release_all(st, &stale)?
        };
        self.flush().await?;
        for (key, ips) in &released {
            let ips: Vec<String> = ips.iter().map(|i| i.to_string()).collect();
            tracing::info!(op = "GC", network = %key.network, container = %key.container_id, ifname = %key.ifname, address = %ips.join(","), reason = "not in the runtime's cni.dev/valid-attachments", "released");
        }
        self.shared.changed.notify_one();
        Ok(released)
    }

    /// Releases `keys` (in use -> idle, cooling from now) in one store transaction; on a store
    /// error nothing changes. Shared by DEL and GC.
    pub(super) fn release_all(
        &self,
        st: &mut State,
        keys: &[AttachmentKey],
    ) -> Result<Vec<(AttachmentKey, Vec<IpAddr>)>, Error> {
        let now = self.now();
        let mut changes = Vec::new();
        let mut done: Vec<(AttachmentKey, usize, IpAddr)> = Vec::new();
        let mut out = Vec::new();
        for key in keys {
            let Some(record) = st.attachments.get(key) else {
                continue;
            };
            changes.push(Change::DeleteAttachment(key.clone()));
            if let Some(net) = st.networks.get_mut(&key.network) {
                for ip in &record.addresses {
                    if let Some(set) = net.set_of(*ip) {
                        if net.pools[set].pool.release(*ip, now).is_some() {
                            done.push((key.clone(), set, *ip));
                            changes.push(Change::PutIdle {
                                network: key.network.clone(),
                                ip: *ip,
                                released_at: now,
                            });
                        }
                    }
                }
            }
            out.push((key.clone(), record.addresses.clone()));
        }
        if let Err(e) = self.shared.store.apply(&changes) {
            for (key, set, ip) in done {
                if let Some(net) = st.networks.get_mut(&key.network) {
                    // Back into use by the same owner, as before the release.
                    let _ = net.pools[set].pool.take(ip, key);
                }
            }
            return Err(e.into());
        }
        for (key, _) in &out {
            st.attachments.remove(key);
        }
        Ok(out)
    }

    /// Ok when an ADD on `network` could be served now; else the reason.
    /// `declared` is the network a CNI config would declare if the daemon does not know it.
    pub fn status(&self, network: &str, declared: Option<&NetworkDef>) -> Result<(), String> {
        let st = self.lock();
        let now = self.now();
        let Some(net) = st.networks.get(network) else {
            return match declared {
                Some(_) => Ok(()),
                None => Err(format!(
                    "network {network:?} is unknown to ipoold and the config declares no ranges"
                )),
            };
        };
        if let Some(d) = declared {
            if !net.def.same_addresses(d) && st.attachments.keys().any(|k| k.network == network) {
                return Err(format!(
                    "network {network:?} is defined with ranges {}, the config asks for {}",
                    net.def.describe_ranges(),
                    d.describe_ranges()
                ));
            }
        }
        for p in &net.pools {
            let dry = p.factory.free() == 0;
            if let Err(e) = p.pool.plan(now, dry) {
                return Err(format!(
                    "pool {network:?} IPv{} ({}) cannot serve an ADD: {e}",
                    p.family.as_str(),
                    p.factory.describe()
                ));
            }
        }
        Ok(())
    }
}
