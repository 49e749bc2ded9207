//! Start-up: the pools are rebuilt from the store (and reconciled with the config) before the
//! daemon accepts a single call.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

use super::{Ipam, Network, Shared, State};
use crate::clock::Clock;
use crate::config::{DaemonConfig, NetworkDef, Origin};
use crate::error::Error;
use crate::store::{Change, Store};

impl Ipam {
    /// Loads the store, applies the config's network definitions, and rebuilds every pool.
    ///
    /// A config network whose ranges differ from the stored definition replaces it only when
    /// no attachment holds an address of it; otherwise start-up fails with a message saying so.
    pub fn open(
        store: Arc<dyn Store>,
        clock: Arc<dyn Clock>,
        config: &DaemonConfig,
    ) -> Result<Ipam, Error> {
        let snap = store.load()?;
        let now = clock.now_ms();
        let mut live: HashMap<&str, usize> = HashMap::new();
        for a in &snap.attachments {
            *live.entry(a.key.network.as_str()).or_default() += 1;
        }

        let mut defs: BTreeMap<String, NetworkDef> = snap
            .networks
            .iter()
            .map(|d| (d.name.clone(), d.clone()))
            .collect();
        let mut changes = Vec::new();
        let mut reset: Vec<String> = Vec::new();
        for def in config.network_defs()? {
            match defs.get(&def.name) {
                Some(old) if old.same_addresses(&def) => {
                    if old != &def {
                        changes.push(Change::PutNetwork(def.clone()));
                        defs.insert(def.name.clone(), def);
                    }
                }
                Some(old) => {
                    let n = live.get(def.name.as_str()).copied().unwrap_or(0);
                    if n > 0 {
                        return Err(Error::InvalidConfig(format!(
                            "network {:?}: the config now says ranges {}, but the store holds {n} attachment(s) in its ranges {} (restore the old ranges, or release those attachments first)",
                            def.name,
                            def.describe_ranges(),
                            old.describe_ranges()
                        )));
                    }
                    tracing::warn!(network = %def.name, old = %old.describe_ranges(), new = %def.describe_ranges(), "network ranges changed in the config; it had no attachments");
                    reset.push(def.name.clone());
                    changes.push(Change::PutNetwork(def.clone()));
                    defs.insert(def.name.clone(), def);
                }
                None => {
                    changes.push(Change::PutNetwork(def.clone()));
                    defs.insert(def.name.clone(), def);
                }
            }
        }

        let mut networks = BTreeMap::new();
        for (name, def) in defs {
            networks.insert(name, Network::new(def, now)?);
        }

        let mut state = State {
            networks,
            attachments: HashMap::new(),
        };
        for rec in snap.attachments {
            let Some(net) = state.networks.get_mut(&rec.key.network) else {
                return Err(Error::InvalidConfig(format!(
                    "the store holds attachment {} of network {:?}, which has no definition",
                    rec.key, rec.key.network
                )));
            };
            for ip in &rec.addresses {
                let set = net.set_of(*ip).ok_or_else(|| {
                    Error::InvalidConfig(format!(
                        "attachment {} holds {ip}, which is outside the ranges of network {:?} ({})",
                        rec.key,
                        rec.key.network,
                        net.def.describe_ranges()
                    ))
                })?;
                let p = &mut net.pools[set];
                p.factory.occupy(*ip).map_err(|e| {
                    Error::InvalidConfig(format!(
                        "attachment {}: {e} (held twice in the store)",
                        rec.key
                    ))
                })?;
                p.pool
                    .restore_in_use(*ip, rec.key.clone())
                    .map_err(|e| Error::InvalidConfig(format!("attachment {}: {e}", rec.key)))?;
            }
            state.attachments.insert(rec.key.clone(), rec);
        }
        for (network, ip, released_at) in snap.idle {
            let known = state.networks.get_mut(&network).and_then(|net| {
                let set = net.set_of(ip)?;
                Some(&mut net.pools[set])
            });
            let kept = match known {
                Some(p) if !reset.contains(&network) => match p.factory.occupy(ip) {
                    Ok(()) if p.pool.receive(ip, released_at).is_ok() => true,
                    Ok(()) => {
                        p.factory.release(ip);
                        false
                    }
                    Err(_) => false,
                },
                _ => false,
            };
            if !kept {
                tracing::warn!(network = %network, %ip, "dropping an idle address the pools cannot take back");
                changes.push(Change::DeleteIdle { network, ip });
            }
        }
        for (network, set, cursor) in snap.cursors {
            match state.networks.get_mut(&network) {
                Some(net) if set < net.pools.len() && !reset.contains(&network) => {
                    net.pools[set].factory.set_cursor(Some(cursor));
                }
                _ => changes.push(Change::PutCursor {
                    network,
                    set,
                    cursor: None,
                }),
            }
        }
        if !changes.is_empty() {
            store.apply(&changes)?;
            store.flush()?;
        }
        let (nets, atts) = (state.networks.len(), state.attachments.len());
        for n in state.networks.values() {
            let origin = match n.def.origin {
                Origin::Config => "config",
                Origin::Cni => "cni",
            };
            for p in &n.pools {
                tracing::info!(network = %n.def.name, origin, family = p.family.as_str(), ranges = %p.factory.describe(), in_use = p.pool.in_use(), idle = p.pool.idle(), "pool ready");
            }
        }
        tracing::info!(networks = nets, attachments = atts, "state recovered");
        Ok(Ipam {
            shared: Arc::new(Shared {
                state: Mutex::new(state),
                store,
                clock,
                defaults: config.defaults.clone(),
                changed: Notify::new(),
            }),
        })
    }
}
