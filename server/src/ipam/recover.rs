//! Start-up, and rebuilding after a store failure: the state is rebuilt from the store (and
//! reconciled with the config) before the daemon accepts a single call. Attachments,
//! reservations, idle addresses with their cooldown deadlines and source cursors all come back;
//! capacity tokens follow from them. When the machine's boot ID differs from the stored one,
//! every attachment of the old boot is released (sticky pods' addresses become reservations):
//! their network namespaces died with the boot.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use tokio::sync::{watch, Notify};

use super::attachments::Attachments;
use super::range_set::RangeSetPool;
use super::ranges::carry_idle;
use super::reconcile::reconcile_defs;
use super::state::{Network, State};
use super::{Health, Ipam, ReleaseBy, Shared, ALL_NETWORKS};
use crate::clock::Clock;
use crate::config::DaemonConfig;
use crate::error::Error;
use crate::metrics::Metrics;
use crate::model::{Millis, Origin};
use crate::pool::Since;
use crate::source::{BlockRefused, Sources};
use crate::store::{Change, Committer, Snapshot, Store, StoreError};

/// What the engine needs besides its store.
pub struct Setup {
    pub config: DaemonConfig,
    pub clock: Arc<dyn Clock>,
    /// The machine's current boot ID (None: unknown, nothing is released at start).
    pub boot_id: Option<String>,
    /// Where the engine counts; the exporter serves it.
    pub metrics: Arc<Metrics>,
    /// Makes each range set's source (default: local ranges).
    pub sources: Sources,
}

/// Opens the store a loader thread reads through.
type Opener<'a> = Box<dyn FnOnce() -> Result<Arc<dyn Store>, StoreError> + Send + 'a>;

impl Ipam {
    /// Loads the store, applies the config's network definitions, and rebuilds every pool.
    ///
    /// A config network whose ranges differ from the stored definition replaces it only when
    /// no attachment holds an address of it; otherwise start-up fails with a message saying so.
    pub fn open(
        store: Arc<dyn Store>,
        clock: Arc<dyn Clock>,
        config: &DaemonConfig,
        boot_id: Option<&str>,
    ) -> Result<Ipam, Error> {
        let serve = store.clone();
        Self::open_with(
            move || Ok(store),
            move || Ok(serve),
            Setup {
                config: config.clone(),
                clock,
                boot_id: boot_id.map(str::to_string),
                metrics: Arc::default(),
                sources: Sources::default(),
            },
        )
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
        loader: impl FnOnce() -> Result<Arc<dyn Store>, StoreError> + Send,
        serve: impl FnOnce() -> Result<Arc<dyn Store>, StoreError>,
        setup: Setup,
    ) -> Result<Ipam, Error> {
        let mut attachments = Attachments::default();
        let snap = load_apart(Box::new(loader), &mut attachments)?;
        let store = serve()?;
        let boot_id = setup.boot_id.as_deref();
        let anchor = setup.clock.resume(
            snap.clock.as_ref(),
            newest_time(&snap, &attachments),
            boot_id,
        );
        let now = setup.clock.now_ms();
        let rebooted = rebooted(&snap, boot_id, !attachments.is_empty());
        let mut changes = Vec::new();
        if let Some(id) = boot_id.filter(|id| snap.boot_id.as_deref() != Some(*id)) {
            changes.push(Change::PutBootId(id.to_string()));
        }
        changes.extend(anchor.map(Change::PutClock));
        let all_drained = snap.drained.iter().any(|n| n == ALL_NETWORKS);
        let rebuilt = rebuild(snap, attachments, &setup.config, &setup.sources, now)?;
        changes.extend(rebuilt.changes);
        let committer = Committer::new(store, Some(setup.metrics.flush_seconds.clone()));
        let ipam = Ipam {
            shared: Arc::new(Shared {
                state: Mutex::new(rebuilt.state),
                store: committer,
                clock: setup.clock,
                leak_check: std::time::Duration::from_secs(setup.config.leak_check.interval_secs),
                config: setup.config,
                boot_id: setup.boot_id,
                changed: Notify::new(),
                events: tokio::sync::broadcast::Sender::new(super::events::EVENT_BUFFER),
                health: watch::Sender::new(Health {
                    all_drained,
                    store_failure: None,
                    name_taken: None,
                }),
                metrics: setup.metrics,
                sources: setup.sources,
                landed: Notify::new(),
                ranges_version: Default::default(),
                ranges_changes: watch::Sender::new(0),
                add_gate: Default::default(),
                host_problems: Default::default(),
                pool_networks: watch::Sender::new(0),
            }),
        };
        {
            let mut st = ipam.lock();
            ipam.commit(&mut st, &changes, |_| Ok(()))?;
            log_pools(&st);
        }
        if rebooted {
            ipam.release_old_boot()?;
        }
        ipam.shared.store.flush_now()?;
        let st = ipam.lock();
        tracing::info!(
            networks = st.networks.len(),
            attachments = st.attachments.len(),
            reservations = st.reservations.len(),
            "state recovered"
        );
        drop(st);
        Ok(ipam)
    }

    /// Every attachment of the old boot is released (module docs).
    fn release_old_boot(&self) -> Result<(), Error> {
        let released = {
            let mut guard = self.lock();
            let keys: Vec<_> = guard.attachments.iter().map(|a| a.key()).collect();
            self.release_attachments(&mut guard, &keys, ReleaseBy::Reboot)?
                .0
        };
        for r in &released {
            r.log(ReleaseBy::Reboot);
        }
        self.emit_released(&released, ReleaseBy::Reboot, ReleaseBy::Reboot.reason());
        tracing::warn!(
            released = released.len(),
            "attachments of the old boot released"
        );
        Ok(())
    }

    /// After a store failure: reopens the store (keeping what was durable, see
    /// [`Store::reopen`]) and rebuilds the state from it, dropping whatever memory held beyond
    /// it. Serving resumes when this succeeds.
    pub async fn recover_store(&self) -> Result<(), Error> {
        let store = self.shared.store.shared_store();
        let loaded = tokio::task::spawn_blocking(move || {
            store.reopen()?;
            let mut attachments = Attachments::default();
            let snap = store.load_with(&mut |a| attachments.insert(&a))?;
            Ok::<_, StoreError>((snap, attachments))
        })
        .await
        .map_err(|e| Error::Busy(format!("the thread that reopens the store failed: {e}")))?;
        let (snap, attachments) = loaded?;
        let all_drained = snap.drained.iter().any(|n| n == ALL_NETWORKS);
        let rebuilt = rebuild(
            snap,
            attachments,
            &self.shared.config,
            &self.shared.sources,
            self.now(),
        )?;
        let mut st = self.lock();
        let was = st.failed.take();
        *st = rebuilt.state;
        self.shared.health.send_modify(|h| {
            h.store_failure = None;
            h.all_drained = all_drained;
        });
        if !rebuilt.changes.is_empty() {
            self.commit(&mut st, &rebuilt.changes, |_| Ok(()))?;
        }
        tracing::warn!(
            failed_since_ms = was.map(|f| f.since),
            attachments = st.attachments.len(),
            "store reopened and state rebuilt from it; serving again"
        );
        drop(st);
        self.shared.changed.notify_one();
        Ok(())
    }
}

/// The newest time the store holds: engine time must not start below it.
fn newest_time(snap: &Snapshot, attachments: &Attachments) -> Millis {
    let idle = snap.idle.iter().map(|(_, _, at)| *at);
    let made = attachments.iter().map(|a| a.created_at_ms());
    let reserved = snap.reservations.iter().map(|r| r.created_at_ms);
    idle.chain(made).chain(reserved).max().unwrap_or(0)
}

fn rebooted(snap: &Snapshot, boot_id: Option<&str>, has_attachments: bool) -> bool {
    match (snap.boot_id.as_deref(), boot_id) {
        (Some(old), Some(new)) if old != new => {
            tracing::warn!(old_boot_id = old, boot_id = new, "the machine rebooted since the last start: releasing every attachment of the old boot");
            true
        }
        (None, Some(_)) if has_attachments => {
            tracing::info!(
                "no boot ID in the store (first start of this version): keeping the attachments"
            );
            false
        }
        _ => false,
    }
}

fn log_pools(st: &State) {
    for n in st.networks.values() {
        let origin = match n.def.origin {
            Origin::Config => "config",
            Origin::Cni => "cni",
            Origin::Runtime => "runtime",
            Origin::Node => "node",
        };
        for p in &n.pools {
            tracing::info!(network = %n.def.name, origin, family = p.family.as_str(), ranges = %p.source.describe(), in_use = p.pool.in_use(), idle = p.pool.idle(), "pool ready");
        }
    }
}

/// A state rebuilt from the store, and the changes that reconcile the store with it.
struct Rebuilt {
    state: State,
    changes: Vec<Change>,
}

/// Rebuilds the state from a snapshot (its attachments already read into `attachments`).
fn rebuild(
    snap: Snapshot,
    attachments: Attachments,
    config: &DaemonConfig,
    sources: &Sources,
    now: Millis,
) -> Result<Rebuilt, Error> {
    let mut changes = Vec::new();
    // The first open by an ipoold that takes host-local's allocations over (`*` not recorded):
    // every network the store knows was served by an older one, and what host-local left of
    // it is history. Once: a take-over stopped part-way later is gone on with, not marked.
    let mut taken_over: BTreeSet<String> = snap.taken_over.iter().cloned().collect();
    if !taken_over.contains(ALL_NETWORKS) {
        let known = snap
            .networks
            .iter()
            .map(|d| d.name.clone())
            .chain(attachments.iter().map(|a| a.network().to_string()))
            .chain([ALL_NETWORKS.to_string()])
            .collect::<BTreeSet<_>>();
        for network in known {
            if taken_over.insert(network.clone()) {
                changes.push(Change::PutTakenOver(network));
            }
        }
    }
    let (defs, reset) = reconcile_defs(&snap, &attachments, config, &mut changes)?;
    let mut networks = BTreeMap::new();
    for (name, def) in defs {
        networks.insert(name, Network::new(def, sources, now)?);
    }
    // Blocks first: the addresses below are in them.
    for (network, set, block) in snap.blocks {
        let restored = networks
            .get_mut(&network)
            .filter(|_| !reset.contains(&network))
            .and_then(|net| net.pool_by_id(&set))
            .map(|p| match (p.source.blocks_mut(), block.parse()) {
                (Some(b), Ok(net)) => b.restore_block(net),
                (Some(_), Err(_)) => Err(BlockRefused::Malformed(block.clone())),
                (None, _) => Err(BlockRefused::NotClaiming(block.clone())),
            });
        if let Some(Ok(())) = restored {
            continue;
        }
        let why = match restored {
            Some(Err(e)) => e.to_string(),
            _ => "no range set of that id".to_string(),
        };
        tracing::warn!(%network, %set, %block, %why, "dropping a claimed block the pools cannot take back");
        changes.push(Change::PutBlock {
            network,
            set,
            block,
            held: false,
        });
    }
    let mut state = State {
        networks,
        attachments,
        reservations: BTreeMap::new(),
        drained: snap.drained.iter().cloned().collect(),
        taken_over,
        failed: None,
    };
    restore_attachments(&mut state)?;
    for r in snap.reservations {
        restore_reserved(&mut state.networks, &r)?;
        state.reservations.insert(r.key.clone(), r);
    }
    for (network, ip, released_at) in snap.idle {
        let kept = !reset.contains(&network)
            && state
                .networks
                .get_mut(&network)
                .is_some_and(|net| carry_idle(net, ip, Since::from_stored(released_at)));
        if !kept {
            tracing::warn!(network = %network, %ip, "dropping an idle address the pools cannot take back");
            changes.push(Change::DeleteIdle { network, ip });
        }
    }
    for (network, set, cursor) in snap.cursors {
        let pool = state
            .networks
            .get_mut(&network)
            .filter(|_| !reset.contains(&network))
            .and_then(|net| cursor_owner(&mut net.pools, &set));
        match pool {
            Some(p) => {
                p.source.set_cursor(Some(cursor));
                if p.id != set {
                    // A position (before schema 5): the cursor moves to the set's id.
                    changes.push(Change::PutCursor {
                        network: network.clone(),
                        set: p.id.clone(),
                        cursor: Some(cursor),
                    });
                    changes.push(Change::PutCursor {
                        network,
                        set,
                        cursor: None,
                    });
                }
            }
            None => changes.push(Change::PutCursor {
                network,
                set,
                cursor: None,
            }),
        }
    }
    for net in state.networks.values_mut() {
        changes.extend(net.retired_changes());
        net.drop_retired();
    }
    Ok(Rebuilt { state, changes })
}

/// The range set a stored cursor belongs to: by its id, or, for a store before schema 5, by
/// its position (ids are ranges, never a bare number).
fn cursor_owner<'a>(pools: &'a mut [RangeSetPool], set: &str) -> Option<&'a mut RangeSetPool> {
    if let Some(i) = pools.iter().position(|p| p.id == set) {
        return pools.get_mut(i);
    }
    set.parse::<usize>().ok().and_then(|i| pools.get_mut(i))
}

/// Puts every attachment's addresses back into use in its network's pools.
fn restore_attachments(state: &mut State) -> Result<(), Error> {
    let State {
        networks,
        attachments,
        ..
    } = state;
    for rec in attachments.iter() {
        let Some(net) = networks.get_mut(rec.network()) else {
            return Err(Error::InvalidConfig(format!(
                "the store holds attachment {} of network {:?}, which has no definition",
                rec.key(),
                rec.network()
            )));
        };
        let fixed = rec.k8s().is_some_and(|m| m.fixed.is_some());
        for ip in rec.addresses() {
            net.restore_in_use(*ip, &rec.key(), fixed)
                .map_err(|e| Error::InvalidConfig(e.0))?;
        }
    }
    Ok(())
}

/// Puts a reservation's addresses back into reserved in its network's pools.
fn restore_reserved(
    networks: &mut BTreeMap<String, Network>,
    r: &crate::model::Reservation,
) -> Result<(), Error> {
    let Some(net) = networks.get_mut(&r.key.network) else {
        return Err(Error::InvalidConfig(format!(
            "the store holds a reservation for {} in network {:?}, which has no definition",
            r.key, r.key.network
        )));
    };
    for ip in &r.addresses {
        net.restore_reserved(*ip, &r.key)
            .map_err(|e| Error::InvalidConfig(e.0))?;
    }
    Ok(())
}

/// Attachment records per hand-over from the loader thread.
pub(super) const LOAD_BATCH: usize = 512;

/// Opens the store with `loader` on a thread of its own, reads it there and drops it there;
/// the attachments come over in batches and go into `attachments` on this thread.
fn load_apart(loader: Opener<'_>, attachments: &mut Attachments) -> Result<Snapshot, Error> {
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
                Ok::<_, StoreError>(snap)
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
