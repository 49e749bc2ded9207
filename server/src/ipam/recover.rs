//! Start-up: the pools are rebuilt from the store (and reconciled with the config) before the
//! daemon accepts a single call. Attachments, reservations, idle addresses with their cooldown
//! deadlines and source cursors all come back; capacity tokens follow from them. When the
//! machine's boot ID differs from the stored one, every attachment of the old boot is released
//! (sticky pods' addresses become reservations): their network namespaces died with the boot.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

use super::{Attachments, Ipam, Network, ReleaseBy, Shared, State};
use crate::clock::Clock;
use crate::config::{DaemonConfig, NetworkDef, Origin};
use crate::error::Error;
use crate::store::{Change, Committer, Store};

impl Ipam {
    /// Loads the store, applies the config's network definitions, and rebuilds every pool.
    ///
    /// A config network whose ranges differ from the stored definition replaces it only when
    /// no attachment holds an address of it; otherwise start-up fails with a message saying so.
    ///
    /// `boot_id` is the machine's current boot ID (None: unknown, nothing is released).
    pub fn open(
        store: Arc<dyn Store>,
        clock: Arc<dyn Clock>,
        config: &DaemonConfig,
        boot_id: Option<&str>,
    ) -> Result<Ipam, Error> {
        let serve = store.clone();
        Self::open_with(move || Ok(store), move || Ok(serve), clock, config, boot_id)
    }

    /// [`Ipam::open`], reading the state through the store that `loader` opens and serving
    /// through the one that `serve` opens once the loader's is dropped. With two handles on the
    /// same database, whatever the loader cached while reading everything is gone before the
    /// daemon serves (sled keeps every page it read; at 65 536 attachments that is ~24 MiB).
    ///
    /// The loader opens and reads on a thread of its own, handing the attachment records over
    /// in batches; this thread keeps them in their compact form. glibc gives each thread its
    /// own arena, so sled's pages and the decoded records, all freed once the state is read,
    /// are not interleaved with the attachments that stay: freed whole, they go back to the
    /// OS at the next trim instead of staying resident as holes between live entries. At
    /// 65 536 attachments the daemon's RSS after a restart went from ~50 to ~33 MiB.
    pub fn open_with(
        loader: impl FnOnce() -> Result<Arc<dyn Store>, crate::store::StoreError> + Send,
        serve: impl FnOnce() -> Result<Arc<dyn Store>, crate::store::StoreError>,
        clock: Arc<dyn Clock>,
        config: &DaemonConfig,
        boot_id: Option<&str>,
    ) -> Result<Ipam, Error> {
        let mut attachments = Attachments::default();
        let snap = load_apart(loader, &mut attachments)?;
        let store = serve()?;
        let now = clock.now_ms();
        let mut live: HashMap<&str, usize> = HashMap::new();
        for a in attachments.iter() {
            *live.entry(a.network()).or_default() += 1;
        }
        for r in &snap.reservations {
            *live.entry(r.key.network.as_str()).or_default() += 1;
        }

        let mut defs: BTreeMap<String, NetworkDef> = snap
            .networks
            .iter()
            .map(|d| (d.name.clone(), d.clone()))
            .collect();
        let mut changes = Vec::new();
        let mut reset: Vec<String> = Vec::new();
        // Networks that CNI configs declared follow the daemon's current [defaults].
        for def in defs.values_mut() {
            if def.origin == Origin::Cni && def.tuning != config.defaults {
                def.tuning = config.defaults.clone();
                changes.push(Change::PutNetwork(def.clone()));
            }
        }
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
                            "network {:?}: the config now says ranges {}, but the store holds {n} attachment(s) or reservation(s) in its ranges {} (restore the old ranges, or release them first)",
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

        for rec in attachments.iter() {
            let Some(net) = networks.get_mut(rec.network()) else {
                return Err(Error::InvalidConfig(format!(
                    "the store holds attachment {} of network {:?}, which has no definition",
                    rec.key(),
                    rec.network()
                )));
            };
            for ip in rec.addresses() {
                let set = net.set_of(*ip).ok_or_else(|| {
                    Error::InvalidConfig(format!(
                        "attachment {} holds {ip}, which is outside the ranges of network {:?} ({})",
                        rec.key(),
                        rec.network(),
                        net.def.describe_ranges()
                    ))
                })?;
                let p = &mut net.pools[set];
                p.factory.occupy(*ip).map_err(|e| {
                    Error::InvalidConfig(format!(
                        "attachment {}: {e} (held twice in the store)",
                        rec.key()
                    ))
                })?;
                p.pool
                    .restore_in_use(*ip, ())
                    .map_err(|e| Error::InvalidConfig(format!("attachment {}: {e}", rec.key())))?;
            }
        }
        let mut state = State {
            networks,
            attachments,
            reservations: BTreeMap::new(),
            drained: snap.drained.iter().cloned().collect(),
        };
        for r in snap.reservations {
            let Some(net) = state.networks.get_mut(&r.key.network) else {
                return Err(Error::InvalidConfig(format!(
                    "the store holds a reservation for {} in network {:?}, which has no definition",
                    r.key, r.key.network
                )));
            };
            for ip in &r.addresses {
                let set = net.set_of(*ip).ok_or_else(|| {
                    Error::InvalidConfig(format!(
                        "reservation {} holds {ip}, outside the ranges of network {:?} ({})",
                        r.key,
                        r.key.network,
                        net.def.describe_ranges()
                    ))
                })?;
                let p = &mut net.pools[set];
                p.factory.occupy(*ip).map_err(|e| {
                    Error::InvalidConfig(format!(
                        "reservation {}: {e} (held twice in the store)",
                        r.key
                    ))
                })?;
                p.pool
                    .restore_reserved(*ip)
                    .map_err(|e| Error::InvalidConfig(format!("reservation {}: {e}", r.key)))?;
            }
            state.reservations.insert(r.key.clone(), r);
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
        let rebooted = match (snap.boot_id.as_deref(), boot_id) {
            (Some(old), Some(new)) if old != new => {
                tracing::warn!(old_boot_id = old, boot_id = new, "the machine rebooted since the last start: releasing every attachment of the old boot");
                true
            }
            (None, Some(_)) if !state.attachments.is_empty() => {
                tracing::info!("no boot ID in the store (first start of this version): keeping the attachments");
                false
            }
            _ => false,
        };
        if let Some(id) = boot_id.filter(|id| snap.boot_id.as_deref() != Some(*id)) {
            changes.push(Change::PutBootId(id.to_string()));
        }
        let metrics = Arc::new(crate::metrics::Metrics::default());
        let committer = Committer::new(store, Some(metrics.flush_seconds.clone()));
        if !changes.is_empty() {
            committer.apply(&changes)?;
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
        let reservations = state.reservations.len();
        let ipam = Ipam {
            shared: Arc::new(Shared {
                state: Mutex::new(state),
                store: committer,
                clock,
                defaults: config.defaults.clone(),
                changed: Notify::new(),
                leak_check: std::time::Duration::from_secs(config.leak_check.interval_secs),
                events: tokio::sync::broadcast::Sender::new(super::ops::EVENT_BUFFER),
                all_drained: tokio::sync::watch::Sender::new(
                    snap.drained.iter().any(|n| n == super::ALL_NETWORKS),
                ),
                metrics,
            }),
        };
        if rebooted {
            let released = {
                let mut guard = ipam.lock();
                let keys: Vec<_> = guard.attachments.iter().map(|a| a.key()).collect();
                ipam.release_all(&mut guard, &keys, ReleaseBy::Reboot)?
            };
            for r in &released {
                r.log(ReleaseBy::Reboot);
            }
            ipam.emit_released(&released, ReleaseBy::Reboot, ReleaseBy::Reboot.reason());
            tracing::warn!(
                released = released.len(),
                "attachments of the old boot released"
            );
        }
        ipam.shared.store.flush_now()?;
        tracing::info!(
            networks = nets,
            attachments = atts,
            reservations,
            "state recovered"
        );
        Ok(ipam)
    }
}

/// Attachment records per hand-over from the loader thread.
pub(super) const LOAD_BATCH: usize = 512;

/// Opens the store with `loader` on a thread of its own, reads it there and drops it there;
/// the attachments come over in batches and go into `attachments` on this thread.
fn load_apart(
    loader: impl FnOnce() -> Result<Arc<dyn Store>, crate::store::StoreError> + Send,
    attachments: &mut Attachments,
) -> Result<crate::store::Snapshot, Error> {
    use crate::store::AttachmentRecord;
    let (tx, rx) = std::sync::mpsc::sync_channel::<Vec<AttachmentRecord>>(4);
    std::thread::scope(|s| {
        let reader = std::thread::Builder::new()
            .name("ipool-load".into())
            .spawn_scoped(s, move || {
                let store = loader()?;
                let mut batch = Vec::with_capacity(LOAD_BATCH);
                let snap = store.load_with(&mut |a| {
                    batch.push(a);
                    if batch.len() == LOAD_BATCH {
                        // A send fails only when this side has gone, i.e. panicked.
                        let _ = tx.send(std::mem::replace(
                            &mut batch,
                            Vec::with_capacity(LOAD_BATCH),
                        ));
                    }
                })?;
                let _ = tx.send(batch);
                drop(store);
                Ok::<_, crate::store::StoreError>(snap)
            })
            .map_err(|e| {
                Error::Busy(format!("cannot start the thread that reads the store: {e}"))
            })?;
        for batch in rx {
            for a in &batch {
                attachments.insert(a);
            }
        }
        match reader.join() {
            Ok(r) => Ok(r?),
            Err(panic) => std::panic::resume_unwind(panic),
        }
    })
}
