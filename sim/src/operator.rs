//! What the operator does, through the store as `ipoolctl cluster` runs it: release-node
//! (with and without `--force`, with `--absent-for` or not, looking where the daemons keep no
//! names); the pool deleted (refused while a block of it is owned, and then as it was), made
//! anew with another block size once it is gone, moved to another block size at once (every
//! node's blocks forced away first), and spare pools made and deleted; the wall clock (and the
//! apiserver's) jumping; etcd backed up, and restored from its backup.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use ipool_server::cluster::datastore::StoreHandle;
use ipool_server::cluster::ippool::PoolChange;
use ipool_server::cluster::limiter::Limiter;
use ipool_server::cluster::vocab::ClusterError;

use tokio::time::Instant;

use crate::commands::OpDone;
use crate::etcd::Restore;
use crate::nodes::node_slot;
use crate::store::{HalfDone, Shared};
use crate::told::{Change, Field};
use crate::world::World;
use crate::{StoreKind, POOL};

impl World {
    /// A store connection of the operator's own, looking for the nodes' names where the
    /// daemons keep them or (`elsewhere`) where they do not (another Lease namespace, another
    /// etcd prefix: an operator's slip).
    /// A store connection as the daemon that leads the release of departed nodes makes one:
    /// ipoold's field manager on the Kubernetes API (its reads of its own Lease measure the
    /// others' absence; its release writes as its own manager, `releasing`).
    pub(crate) fn leader_store(
        &self,
    ) -> futures::future::BoxFuture<'static, Result<StoreHandle, String>> {
        self.store_as(false, ipool_server::cluster::kube::FIELD_MANAGER)
    }

    pub(crate) fn operator_store_elsewhere(
        &self,
        elsewhere: bool,
    ) -> futures::future::BoxFuture<'static, Result<StoreHandle, String>> {
        self.store_as(elsewhere, "ipoolctl")
    }

    fn store_as(
        &self,
        elsewhere: bool,
        manager: &'static str,
    ) -> futures::future::BoxFuture<'static, Result<StoreHandle, String>> {
        let conn = crate::daemon::connector(
            self.opts.store,
            self.net.clone(),
            crate::net::operator(self.operator.seq),
            Arc::new(AtomicBool::new(true)),
            manager,
        );
        let mut settings = self
            .setting
            .config("operator", false)
            .cluster
            .expect("[cluster]");
        if elsewhere {
            match self.opts.store {
                StoreKind::Etcd => settings.prefix = "/elsewhere".into(),
                StoreKind::Kube => settings.lease_namespace = "elsewhere".into(),
            }
        }
        let limiter = Arc::new(Limiter::new(1000.0, 1000));
        Box::pin(async move {
            conn(&settings, None, &limiter)
                .await
                .map_err(|e| e.to_string())
        })
    }
}

/// A pool command (one operator command at a time): the pool deleted; made again if it is
/// gone; a spare pool made and deleted; or the pool moved to another block size at once, every
/// node's blocks forced away first (`release-node --force` on live nodes: the operator's doing).
pub(crate) fn pool_op(w: &mut World) {
    if w.operator.running.is_some() {
        return;
    }
    let kind = w.choices.pick(match w.swarm.pool_changes {
        true => 8,
        false => 4,
    });
    run_pool_op(w, kind, false);
}

/// A second operator's pool command, run beside the one under way (`crate::provoke`: a rival
/// of a pool write parked on its way): the pool deleted, made again if gone, a spare pool, or
/// (in runs whose pools change) grown, shrunk, disabled and enabled, an address reserved. Not
/// the move, whose `--force` is the first operator's alone.
pub(crate) fn pool_op_beside(w: &mut World) {
    if w.operator.second {
        return;
    }
    let kinds: &[u32] = match w.swarm.pool_changes {
        true => &[0, 1, 2, 4, 5, 6, 7],
        false => &[0, 1, 2],
    };
    let kind = kinds[w.choices.pick(kinds.len() as u32) as usize];
    run_pool_op(w, kind, true);
}

fn run_pool_op(w: &mut World, kind: u32, second: bool) {
    // What kind 7 reserves, or unreserves when it is reserved.
    let reserve = RESERVE[match kind {
        7 => w.choices.pick(4) as usize,
        _ => 0,
    }];
    // At once (nodes that did not sync yet claim from the new pool while they still serve the
    // old blocks), or after a pause of up to 4 s (nodes claim again and race the deletion).
    let pause = match w.choices.pick(2) {
        0 => std::time::Duration::ZERO,
        _ => std::time::Duration::from_millis(u64::from(w.choices.pick(4000))),
    };
    let size = [28, 27, 26][w.choices.pick(3) as usize];
    let names: Vec<String> = (0..w.opts.nodes).map(|i| w.slots[i].name.clone()).collect();
    let pins = known_pins(w);
    let (what, spec) = match kind {
        0 => (format!("pool delete {POOL}"), None),
        1 => (
            format!("pool create {POOL} (block size /{size}, if it is gone)"),
            Some(w.opts.pool(size)),
        ),
        4 => (format!("pool add-cidr {POOL} {GROWTH}"), None),
        5 => (format!("pool remove-cidr {POOL} {GROWTH}"), None),
        6 => (format!("pool disable {POOL}, then enable it"), None),
        7 => (format!("reserve {reserve} in {POOL}, or unreserve it"), None),
        2 => {
            let mut spare = w.opts.pool(27);
            spare.name = "spare".into();
            spare.cidrs = vec!["10.81.0.0/24".parse().expect("a CIDR")];
            ("pool create spare, then delete it".to_string(), Some(spare))
        }
        _ => (
            format!("pool {POOL} moved to blocks of /{size}: release-node --force on every node, pool delete, pool create"),
            Some(w.opts.pool(size)),
        ),
    };
    w.note(format!(
        "{}: {what}",
        match second {
            true => "a second operator",
            false => "operator",
        }
    ));
    let forced = kind == 3;
    if forced {
        for n in &names {
            w.checker
                .excuse(n, "release-node --force on a live node (the pool moved)");
            w.force_starts(n);
        }
    }
    let seq = match second {
        true => w.second_command(),
        false => w.command(crate::commands::Op {
            forced,
            release_of: None,
            departed: false,
        }),
    };
    w.operator.told.start(seq, changes(kind, reserve));
    let place = match w.opts.store {
        StoreKind::Etcd => "etcd",
        StoreKind::Kube => "the Kubernetes API",
    };
    let (store, ops) = (w.operator_store_elsewhere(false), w.operator.done.clone());
    tokio::spawn(async move {
        let result = match store.await {
            Err(e) => Err(e),
            Ok(s) => {
                let growth = GROWTH.parse().expect("a CIDR");
                let r = match (kind, spec) {
                    (0, _) => s.delete_pool(POOL).await.map(|()| "deleted".to_string()),
                    (4, _) => s
                        .change_pool(POOL, &PoolChange::AddCidr(growth))
                        .await
                        .map(|_| "grown".to_string()),
                    (5, _) => s
                        .change_pool(POOL, &PoolChange::RemoveCidr(growth))
                        .await
                        .map(|_| "shrunk".to_string()),
                    (7, _) => {
                        let cidr: ipnet::IpNet = reserve.parse().expect("a CIDR");
                        match s.get_pool(POOL).await {
                            Ok(Some(p)) if p.spec.reserved.iter().any(|r| r.cidr == cidr) => s
                                .change_pool(POOL, &PoolChange::Unreserve(cidr))
                                .await
                                .map(|_| "unreserved".to_string()),
                            Ok(_) => s
                                .change_pool(
                                    POOL,
                                    &PoolChange::Reserve(ipool_server::cluster::ippool::Reserved {
                                        cidr,
                                        reason: "the simulation".into(),
                                    }),
                                )
                                .await
                                .map(|_| "reserved".to_string()),
                            Err(e) => Err(e),
                        }
                    }
                    (6, _) => match s.change_pool(POOL, &PoolChange::Disable).await {
                        Ok(_) => {
                            tokio::time::sleep(pause).await;
                            s.change_pool(POOL, &PoolChange::Enable)
                                .await
                                .map(|_| "disabled, then enabled".to_string())
                        }
                        Err(e) => Err(e),
                    },
                    (1, Some(spec)) => match s.get_pool(POOL).await {
                        Ok(Some(_)) => Ok("it stands: nothing done".to_string()),
                        Ok(None) => s.create_pool(&spec).await.map(|()| "created".into()),
                        Err(e) => Err(e),
                    },
                    (2, Some(spec)) => match s.create_pool(&spec).await {
                        Ok(()) => s
                            .delete_pool(&spec.name)
                            .await
                            .map(|()| "created and deleted".to_string()),
                        Err(e) => Err(e),
                    },
                    (_, Some(spec)) => move_pool(&*s, place, &names, &spec, pause, pins).await,
                    _ => Ok(String::new()),
                };
                r.map_err(|e| e.to_string())
            }
        };
        ops.lock().expect("ops").push(OpDone {
            what,
            result,
            seq,
            second,
        });
    });
}

/// What pool command `kind` (of [`pool_op`]) may change of the pool, and leaves as it says
/// (`crate::told`); `reserve`, what kind 7 reserves or unreserves.
fn changes(kind: u32, reserve: &'static str) -> Change {
    let growth: ipnet::IpNet = GROWTH.parse().expect("a CIDR");
    let reserved: ipnet::IpNet = reserve.parse().expect("a CIDR");
    match kind {
        // A spare pool, made and deleted: not this one.
        2 => Change::none(),
        0 => Change::whole(|said| match said {
            "deleted" => vec![(Field::Exists, "no".into())],
            _ => Vec::new(),
        }),
        // Made if gone (or found standing), or moved: there.
        1 | 3 => Change::whole(|_| vec![(Field::Exists, "yes".into())]),
        4 => Change::of(vec![Field::Cidr(growth)], move |_| {
            vec![(Field::Cidr(growth), "yes".into())]
        }),
        // Its reservations in the CIDR go along.
        5 => {
            let inside = reserve_in(growth);
            let mut fields = vec![Field::Cidr(growth)];
            fields.extend(inside.iter().map(|r| Field::Reserved(*r)));
            Change::of(fields, move |_| {
                let mut after = vec![(Field::Cidr(growth), "no".to_string())];
                after.extend(
                    inside
                        .iter()
                        .map(|r| (Field::Reserved(*r), "no".to_string())),
                );
                after
            })
        }
        6 => Change::of(vec![Field::Disabled], |_| {
            vec![(Field::Disabled, "no".into())]
        }),
        7 => Change::of(vec![Field::Reserved(reserved)], move |said| {
            let now = match said {
                "reserved" => "yes",
                _ => "no",
            };
            vec![(Field::Reserved(reserved), now.into())]
        }),
        _ => Change::all(),
    }
}

/// What kind 7 may reserve: an address, a few, a block's worth, or one in the CIDR the pool
/// grows by.
const RESERVE: [&str; 4] = [
    "10.70.0.3/32",
    "10.70.0.8/29",
    "10.70.0.16/28",
    "10.70.4.5/32",
];

/// The ranges kind 7 may reserve inside `cidr`.
fn reserve_in(cidr: ipnet::IpNet) -> Vec<ipnet::IpNet> {
    RESERVE
        .iter()
        .map(|r| r.parse::<ipnet::IpNet>().expect("a CIDR"))
        .filter(|r| cidr.contains(r))
        .collect()
}

/// A pool command run again on a pool it left half done, as its error told the operator to:
/// `pool delete` again on one still marked Deleting (it finishes the deletion, or makes the
/// pool Ready again), `pool create` again with its spec on one still Pending (made Ready),
/// `pool add-cidr` or `remove-cidr` again on one whose CIDR is still marked on its way in or
/// out (it finishes the change, or takes the mark off).
pub(crate) fn finish_pool(w: &mut World, name: String, how: HalfDone) {
    let what = match how {
        HalfDone::Delete => format!("pool delete {name} again (it is still marked Deleting)"),
        HalfDone::Create => format!("pool create {name} again (it is still Pending)"),
        HalfDone::AddCidr(c) => {
            format!("pool add-cidr {name} {c} again (it is still marked on its way in)")
        }
        HalfDone::RemoveCidr(c) => {
            format!("pool remove-cidr {name} {c} again (it is still marked on its way out)")
        }
    };
    let change = match name == POOL {
        true => Change::all(),
        false => Change::none(),
    };
    command(w, what, change, move |s| async move {
        match how {
            HalfDone::Delete => s.delete_pool(&name).await.map(|()| "deleted".to_string()),
            HalfDone::Create => match s.get_pool(&name).await {
                Ok(Some(p)) => s.create_pool(&p.spec).await.map(|()| "created".into()),
                Ok(None) => Ok("gone meanwhile".into()),
                Err(e) => Err(e),
            },
            HalfDone::AddCidr(c) => s
                .change_pool(&name, &PoolChange::AddCidr(c))
                .await
                .map(|_| "grown".to_string()),
            HalfDone::RemoveCidr(c) => s
                .change_pool(&name, &PoolChange::RemoveCidr(c))
                .await
                .map(|_| "shrunk".to_string()),
        }
    });
}

/// An operator's command `what` (no release, nothing forced): noted, run through the
/// operator's own store connection by `run`, and its outcome taken in when it ends.
/// What it may change of the pool is `change` (`crate::told`).
pub(crate) fn command<F, Fut>(w: &mut World, what: String, change: Change, run: F)
where
    F: FnOnce(StoreHandle) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = Result<String, ClusterError>> + Send + 'static,
{
    w.note(format!("operator: {what}"));
    let seq = w.command(crate::commands::Op {
        forced: false,
        release_of: None,
        departed: false,
    });
    w.operator.told.start(seq, change);
    let (store, ops) = (w.operator_store_elsewhere(false), w.operator.done.clone());
    tokio::spawn(async move {
        let result = match store.await {
            Err(e) => Err(e),
            Ok(s) => run(s).await.map_err(|e| e.to_string()),
        };
        ops.lock().expect("ops").push(OpDone {
            what,
            result,
            seq,
            second: false,
        });
    });
}

/// The CIDR the pool grows by, and is shrunk by again (`Swarm::pool_changes`).
const GROWTH: &str = "10.70.4.0/27";

/// Every node's blocks forced away, the pool deleted and made again as `spec` says.
async fn move_pool(
    s: &dyn ipool_server::cluster::datastore::Datastore,
    place: &str,
    names: &[String],
    spec: &ipool_server::cluster::ippool::PoolSpec,
    pause: std::time::Duration,
    pins: Option<Vec<ipool_server::cluster::pin::PinRead>>,
) -> Result<String, ipool_server::cluster::vocab::ClusterError> {
    for n in names {
        let release = ipool_server::cluster::release::release_node_pinned;
        match release(s, place, n, 0, true, pins.clone()).await {
            Ok(_) | Err(ipool_server::cluster::vocab::ClusterError::NotFound(_)) => {}
            Err(e) => return Err(e),
        }
    }
    // The operator's pause between the commands: the nodes, finding their blocks gone, claim
    // again meanwhile, and race the deletion (refused if one of them won a block first).
    tokio::time::sleep(pause).await;
    s.delete_pool(POOL).await?;
    s.create_pool(spec).await?;
    Ok("moved".into())
}

/// release-node by the operator (one command at a time): on a node that is gone, as meant;
/// on a live one without `--force`, which must give nothing back unless the node was cut off
/// past its fence; with `--force` on a live one (the operator's error: excused); or looking
/// where the daemons keep no names.
pub(crate) fn release(w: &mut World) {
    if w.operator.running.is_some() {
        return;
    }
    let i = node_slot(w);
    let gone = w.slots[i].gone && w.slots[i].daemon.is_none();
    let force = !gone && w.choices.chance(1, 3);
    let elsewhere = !gone && !force && w.choices.chance(1, 2);
    // Gone: at once; else as the operator judges (an hour, or no more than the fence).
    let absent_for = match gone || w.choices.chance(1, 2) {
        true => 0,
        false => 3600,
    };
    release_as(w, i, force, elsewhere, absent_for);
}

/// release-node on slot `i`'s node, forced or not (`--absent-for 0`): the exhaustive walk's.
pub(crate) fn release_one(w: &mut World, i: usize, force: bool) {
    if w.operator.running.is_none() {
        release_as(w, i, force, false, 0);
    }
}

/// `release-node` of slot `i`'s node as an operator runs it once told to: without `--force`,
/// `--absent-for` a minute.
pub(crate) fn release_absent(w: &mut World, i: usize) {
    release_as(w, i, false, false, 60);
}

fn release_as(w: &mut World, i: usize, force: bool, elsewhere: bool, absent_for: u64) {
    let name = w.slots[i].name.clone();
    if force {
        w.checker
            .excuse(&name, "release-node --force on a live node");
        w.force_starts(&name);
    }
    let what = format!(
        "release-node {name}{}{}{}",
        if force { " --force" } else { "" },
        if absent_for == 0 {
            " --absent-for 0"
        } else {
            ""
        },
        if elsewhere {
            " (where the daemons keep no names)"
        } else {
            ""
        }
    );
    w.note(format!("operator: {what}"));
    let seq = w.command(crate::commands::Op {
        forced: force,
        release_of: Some(name.clone()),
        departed: false,
    });
    let (store, ops, kind, pins) = (
        w.operator_store_elsewhere(elsewhere),
        w.operator.done.clone(),
        w.opts.store,
        known_pins(w),
    );
    tokio::spawn(async move {
        let place = match kind {
            StoreKind::Etcd => "etcd",
            StoreKind::Kube => "the Kubernetes API",
        };
        let result = match store.await {
            Err(e) => Err(e),
            Ok(s) => ipool_server::cluster::release::release_node_pinned(
                &*s, place, &name, absent_for, force, pins,
            )
            .await
            .map(|r| format!("{} block(s) given back", r.blocks.len()))
            .map_err(|e| e.to_string()),
        };
        ops.lock().expect("ops").push(OpDone {
            what,
            result,
            seq,
            second: false,
        });
    });
}

impl World {
    /// Why a release of slot `i`'s node without `--force` giving a block back now is the
    /// operator's doing (docs/cluster-mode.md: release-node is for nodes that are gone): the store has not
    /// heard the node (a renewal of its name) for longer than its fence, so that no store could
    /// tell it from a node that is gone.
    pub(crate) fn release_excuse(&self, i: usize, at: u64) -> Option<&'static str> {
        // The last renewal heard by `at`.
        let renewed = self.slots[i]
            .renewals
            .iter()
            .filter(|t| **t <= at)
            .max()
            .copied()
            .unwrap_or(0);
        if self.resets.restored_at.is_some_and(|r| r >= renewed) {
            return Some("release-node after etcd was restored from an older backup that lacks the node's renewals");
        }
        (at.saturating_sub(renewed) > crate::FENCE_MS)
            .then_some("release-node on a node the store had not heard for longer than its fence")
    }
}

pub(crate) fn jump_clock(w: &mut World) {
    let secs = [-3600i64, -30, 30, 600, 3600][w.choices.pick(5) as usize];
    w.wall.step(secs * 1000);
    if let Shared::Api { skew_secs, .. } = &mut w.shared {
        // The apiserver's replicas' clocks too (what stamps managedFields).
        *skew_secs += secs / 2;
        if secs < 0 {
            w.resets.apiserver_stepped_back = true;
        }
    }
    w.note(format!("the wall clock jumps {secs} s"));
}

pub(crate) fn backup_or_restore(w: &mut World) -> Result<(), String> {
    let mut restore = w.choices.chance(1, 2);
    // Made on purpose in a run with races and pins: a restore that loses a pin whose pod
    // moved from its block's node since the backup (issue 53, item 4), a backup else.
    if w.swarm.races && w.swarm.pins {
        restore = crate::fixed::moved_since_backup(w);
    }
    let how = match restore {
        false => None,
        // A new cluster (etcdutl snapshot restore), with an id of its own; the data directory
        // copied back; the revision bumped past every one seen, as Kubernetes advises.
        true => Some(match w.choices.pick(3) {
            0 => Restore::NewCluster(0xbac0_0000_0000 | w.step),
            1 => Restore::DataCopied,
            _ => Restore::Bumped(1_000_000),
        }),
    };
    let before = w.shared.blocks();
    let backed_up_at = match &w.shared {
        Shared::Etcd(e) => e.backup_revision().unwrap_or_default() as u64,
        Shared::Api { .. } => 0,
    };
    if let Shared::Etcd(e) = &mut w.shared {
        match how {
            None => {
                e.back_up();
                w.note("etcd backed up".into());
            }
            Some(how) => {
                if e.restore(how, Instant::now()) {
                    w.note(format!(
                        "etcd restored from its backup (an operator's error): {how:?}"
                    ));
                    // Its members restart: every watch breaks.
                    w.net.watches(|ws| ws.cut_from(None));
                    crate::fixed::restored(w, &before);
                    w.operator.told.forget();
                    for s in w.slots.iter_mut().filter(|s| s.daemon.is_some()) {
                        s.unaware = true;
                    }
                    for s in w.slots.iter_mut() {
                        let written = std::mem::take(&mut s.written);
                        s.lost_writes = written
                            .into_iter()
                            .filter(|(rev, _)| *rev > backed_up_at)
                            .collect();
                    }
                    w.resets.restored_at = Some(w.ms());
                    w.resets.shows_id = matches!(how, Restore::NewCluster(_));
                    return w.store_check(crate::world::RESTORE, None, None);
                }
            }
        }
    }
    Ok(())
}

/// The store's pins as release-node would read them: none in a run without pins (the read
/// skipped, so that runs kept before pins replay as they were), read in a run with them.
fn known_pins(w: &World) -> Option<Vec<ipool_server::cluster::pin::PinRead>> {
    (!w.swarm.pins).then(Vec::new)
}
