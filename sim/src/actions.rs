//! What the driver can do at a step, each chosen by the run's picks (0: the plainest, deliver
//! the oldest request). The network's faults: a request delivered, failed, applied with its
//! answer lost, dropped, delivered late (after its caller gave up: any old one), a node's
//! connection cut and healed. The nodes: ADD and DEL of pods, daemons killed and restarted
//! with their state dir kept, or wiped (the node and its pods gone), a second daemon started
//! under a node's name. The operator: release-node with and without `--force`, where the
//! daemons keep their names and where they do not; the pool deleted (refused or not) and made
//! anew with other block sizes; spare pools made and deleted. Clocks: the wall clock jumps
//! (the apiserver's too), monotonic time does not. etcd: backed up, and restored from that
//! backup.

use std::time::Duration;

use ipool_proto::etcd::etcdserverpb::{compare::TargetUnion, request_op::Request};
use ipool_server::cluster::etcd::client::Call;
use tokio::time::Instant;

use crate::store::{Fate, Shared};
use crate::world::{OpDone, World};
use crate::{Options, StoreKind, POOL};

/// Writes the pool into the store as the operator made it before the nodes started.
pub(crate) fn seed_pool(shared: &mut Shared, opts: &Options, block_v4: u8, wall_ms: u64) {
    let spec = opts.pool(block_v4);
    match shared {
        Shared::Etcd(e) => {
            let put = ipool_server::cluster::etcd::request::put(
                format!("/ipool/v1/pools/{POOL}"),
                serde_json::to_vec(&spec).expect("a pool"),
                0,
            );
            e.apply(&Call::Put(put), Instant::now()).expect("the pool");
        }
        Shared::Api { objects, .. } => {
            let body = serde_json::json!({
                "apiVersion": "ipool.io/v1", "kind": "IPPool",
                "metadata": {"name": POOL},
                "spec": {"cidrs": spec.cidrs, "blockSizeV4": spec.block_v4,
                         "blockSizeV6": spec.block_v6, "exclude": spec.exclude},
                "status": {"phase": "Ready"}});
            objects.respond(
                "POST",
                "/apis/ipool.io/v1/ippools",
                &Default::default(),
                body.to_string().as_bytes(),
                (wall_ms / 1000) as i64,
                true,
            );
        }
    }
}

/// An etcd call in a few words, for the trace.
pub(crate) fn describe_call(c: &Call) -> String {
    let key = |k: &[u8]| String::from_utf8_lossy(k).replace("/ipool/v1/", "");
    match c {
        Call::Range(r) => format!("range {}", key(&r.key)),
        Call::Put(p) => format!("put {}", key(&p.key)),
        Call::DeleteRange(d) => format!("delete {}", key(&d.key)),
        Call::Txn(t) => {
            let writes: Vec<String> = t
                .success
                .iter()
                .filter_map(|op| match &op.request {
                    Some(Request::RequestPut(p)) => Some(format!("put {}", key(&p.key))),
                    Some(Request::RequestDeleteRange(d)) => Some(format!("delete {}", key(&d.key))),
                    _ => None,
                })
                .collect();
            let on: Vec<String> = t
                .compare
                .iter()
                .map(|c| {
                    let v = match &c.target_union {
                        Some(TargetUnion::Version(v)) => format!("version {v}"),
                        Some(TargetUnion::CreateRevision(v)) => format!("create {v}"),
                        Some(TargetUnion::ModRevision(v)) => format!("mod {v}"),
                        _ => "?".into(),
                    };
                    format!("{} {v}", key(&c.key))
                })
                .collect();
            format!("txn [{}] if [{}]", writes.join(", "), on.join(", "))
        }
        Call::LeaseGrant(g) => format!("lease grant {} s", g.ttl),
        Call::LeaseRevoke(r) => format!("lease revoke {:x}", r.id),
        Call::LeaseKeepAlive(k) => format!("lease keep-alive {:x}", k.id),
        Call::LeaseTimeToLive(t) => format!("lease ttl {:x}", t.id),
    }
}

/// A random running daemon's slot.
fn running(w: &mut World) -> Option<usize> {
    let up: Vec<usize> = (0..w.slots.len())
        .filter(|i| w.slots[*i].daemon.is_some())
        .collect();
    match up.len() {
        0 => None,
        n => Some(up[w.choices.pick(n as u32) as usize]),
    }
}

/// A slot of the nodes proper (not a twin).
fn node_slot(w: &mut World) -> usize {
    w.choices.pick(w.opts.nodes as u32) as usize
}

/// One step's action; how long time moves after it. Out of 1000 picks: deliveries 69 %
/// (4 % of them with a fault), time moving on 13 % (mostly milliseconds; seconds rarely, past
/// the daemons' deadlines of 500 ms), ADD 10 %, DEL 5 %, and the rarer faults each a few in a
/// thousand: time for the nodes to get somewhere between them.
pub(crate) fn act(w: &mut World) -> Result<Duration, String> {
    let tick = Duration::from_millis(1);
    let ms = |w: &mut World, lo: u64, hi: u64| {
        Duration::from_millis(lo + u64::from(w.choices.pick((hi - lo) as u32)))
    };
    let pending = w.net.len();
    match w.choices.pick(1000) {
        0..=649 => {
            if pending == 0 {
                return Ok(ms(w, 1, 20));
            }
            // Mostly the oldest first; any of them at times (requests overtake each other).
            let i = match w.choices.chance(1, 4) {
                true => w.choices.pick(pending as u32) as usize,
                false => 0,
            };
            w.deliver(i, Fate::Answer)?;
            Ok(tick)
        }
        650..=689 if pending > 0 => {
            let i = w.choices.pick(pending as u32) as usize;
            let fate = [Fate::Fail, Fate::Lose, Fate::Drop][w.choices.pick(3) as usize];
            w.deliver(i, fate)?;
            Ok(tick)
        }
        690..=779 => Ok(ms(w, 1, 20)),
        780..=809 => Ok(ms(w, 20, 300)),
        810..=819 => Ok(ms(w, 300, 3000)),
        820..=823 => Ok(ms(w, 3000, 15000)),
        824..=923 => {
            if let Some(i) = running(w) {
                add(w, i);
            }
            Ok(tick)
        }
        924..=973 => {
            del_some(w);
            Ok(tick)
        }
        974..=979 => {
            kill_or_restart(w)?;
            Ok(tick)
        }
        980..=981 => {
            wipe(w)?;
            Ok(tick)
        }
        982..=985 => {
            cut_or_heal(w);
            Ok(tick)
        }
        986..=988 => {
            release(w);
            Ok(tick)
        }
        989..=990 => {
            crate::operator::pool_op(w);
            Ok(tick)
        }
        991..=992 => {
            twin(w)?;
            Ok(tick)
        }
        993..=994 => {
            jump_clock(w);
            Ok(tick)
        }
        995..=996 if w.opts.store == StoreKind::Etcd => {
            backup_or_restore(w);
            Ok(tick)
        }
        _ => Ok(tick),
    }
}

/// An ADD of a new pod on slot `i`.
pub(crate) fn add(w: &mut World, i: usize) {
    w.next_container += 1;
    let c = format!("c{}", w.next_container);
    let syncs = w.sync_counts(i).unwrap_or([0; 2]);
    w.adding
        .insert(c.clone(), crate::world::Adding { slot: i, syncs });
    let done = w.done.clone();
    if let Some(d) = w.slots[i].daemon.as_mut() {
        d.add(&c, &done);
    }
}

/// A DEL: one owed first (the kubelet retries them), else a random live pod's.
fn del_some(w: &mut World) {
    let owed: Vec<(String, usize)> = w
        .owed
        .iter()
        .filter(|(_, s)| w.slots[**s].daemon.is_some())
        .map(|(c, s)| (c.clone(), *s))
        .collect();
    let (c, slot) = match owed.len() {
        0 => {
            let live: Vec<(String, usize)> = w
                .checker
                .pods
                .iter()
                .filter(|(_, p)| w.slots[p.slot].daemon.is_some())
                .map(|(c, p)| (c.clone(), p.slot))
                .collect();
            if live.is_empty() {
                return;
            }
            live[w.choices.pick(live.len() as u32) as usize].clone()
        }
        n => owed[w.choices.pick(n as u32) as usize].clone(),
    };
    w.owed.remove(&c);
    w.checker.deleting(&c);
    w.note(format!("DEL {c} on {}", w.slots[slot].name));
    let done = w.done.clone();
    if let Some(d) = w.slots[slot].daemon.as_mut() {
        d.del(&c, &done);
    }
}

fn kill_or_restart(w: &mut World) -> Result<(), String> {
    let i = w.choices.pick(w.slots.len() as u32) as usize;
    if w.slots[i].twin_of.is_some() && w.slots[i].daemon.is_none() {
        return Ok(());
    }
    match w.slots[i].daemon.is_some() {
        true => {
            w.note(format!("{} killed (-9)", w.slots[i].name));
            w.kill(i);
            Ok(())
        }
        false => w.start(i),
    }
}

/// A node's daemon killed and its state dir wiped: the node and its pods are gone (until it
/// starts again, as a new instance).
fn wipe(w: &mut World) -> Result<(), String> {
    let i = node_slot(w);
    if w.slots[i].daemon.is_none() && w.slots[i].gone {
        return w.start(i);
    }
    w.note(format!(
        "{} killed and its state dir wiped: gone",
        w.slots[i].name
    ));
    w.kill(i);
    w.slots[i].disk = std::sync::Arc::new(ipool_server::store::MemStore::new());
    w.slots[i].instance += 1;
    w.slots[i].gone = true;
    w.checker.wiped(i);
    w.owed.retain(|_, s| *s != i);
    Ok(())
}

fn cut_or_heal(w: &mut World) {
    let i = w.choices.pick(w.slots.len() as u32) as usize;
    let cut = w.net.is_cut(i);
    w.net.set_cut(i, !cut);

    w.note(format!(
        "{}'s store connection {}",
        w.slots[i].name,
        if cut { "healed" } else { "cut" }
    ));
}

/// release-node by the operator (one command at a time): on a node that is gone, as meant;
/// on a live one without `--force`, which must give nothing back unless the node was cut off
/// past its fence; with `--force` on a live one (the operator's error: excused); or looking
/// where the daemons keep no names.
fn release(w: &mut World) {
    if w.op.is_some() {
        return;
    }
    let i = node_slot(w);
    let name = w.slots[i].name.clone();
    let gone = w.slots[i].gone && w.slots[i].daemon.is_none();
    let force = !gone && w.choices.chance(1, 3);
    let elsewhere = !gone && !force && w.choices.chance(1, 2);
    let absent_for = if gone { 0 } else { 3600 };
    if force {
        w.checker
            .excuse(&name, "release-node --force on a live node");
        w.force_starts(&name);
    }
    let what = format!(
        "release-node {name}{}{}",
        if force { " --force" } else { "" },
        if elsewhere {
            " (where the daemons keep no names)"
        } else {
            ""
        }
    );
    w.note(format!("operator: {what}"));
    w.op = Some(crate::world::Op {
        forced: force,
        release_of: Some(name.clone()),
    });
    let (store, ops, kind) = (
        w.operator_store_elsewhere(elsewhere),
        w.ops.clone(),
        w.opts.store,
    );
    tokio::spawn(async move {
        let place = match kind {
            StoreKind::Etcd => "etcd",
            StoreKind::Kube => "the Kubernetes API",
        };
        let result = match store.await {
            Err(e) => Err(e),
            Ok(s) => {
                ipool_server::cluster::release::release_node(&*s, place, &name, absent_for, force)
                    .await
                    .map(|r| format!("{} block(s) given back", r.blocks.len()))
                    .map_err(|e| e.to_string())
            }
        };
        ops.lock().expect("ops").push(OpDone { what, result });
    });
}

impl World {
    /// Why a release of slot `i`'s node without `--force` giving a block back now is the
    /// operator's doing (README: release-node is for nodes that are gone): the store has not
    /// heard the node (a renewal of its name) for longer than its fence, so that no store could
    /// tell it from a node that is gone.
    pub(crate) fn release_excuse(&self, i: usize) -> Option<&'static str> {
        let unheard = self.ms() - self.slots[i].renewed_at.unwrap_or(0);
        (unheard > crate::FENCE_MS)
            .then_some("release-node on a node the store had not heard for longer than its fence")
    }
}

/// A second daemon under a running node's name for a while (it must hold back), or stopped.
fn twin(w: &mut World) -> Result<(), String> {
    if let Some(t) = (0..w.slots.len()).find(|t| w.slots[*t].twin_of.is_some()) {
        if w.slots[t].daemon.is_some() {
            w.note(format!(
                "the second daemon under {}'s name stopped",
                w.slots[t].name
            ));
            w.kill(t);
            w.checker.wiped(t);
            w.owed.retain(|_, s| *s != t);
            return Ok(());
        }
        return Ok(());
    }
    let i = node_slot(w);
    if w.slots[i].daemon.is_none() {
        return Ok(());
    }
    let name = w.slots[i].name.clone();
    let instance = 1000 + w.slots.len() as u64;
    w.slots.push(crate::world::Slot::new(
        name.clone(),
        std::sync::Arc::new(ipool_server::store::MemStore::new()),
        instance,
        Some(i),
    ));
    let t = w.slots.len() - 1;
    w.note(format!(
        "a second daemon started under {name}'s name (slot {t})"
    ));
    w.start(t)
}

fn jump_clock(w: &mut World) {
    let secs = [-3600i64, -30, 30, 600, 3600][w.choices.pick(5) as usize];
    w.wall.step(secs * 1000);
    if let Shared::Api { skew_secs, .. } = &mut w.shared {
        // The apiserver's replicas' clocks too (what stamps managedFields).
        *skew_secs += secs / 2;
    }
    w.note(format!("the wall clock jumps {secs} s"));
}

fn backup_or_restore(w: &mut World) {
    let restore = w.choices.chance(1, 2);
    // Each restore makes a new cluster (etcdutl snapshot restore), with an id of its own.
    let id = 0xbac0_0000 | (w.opts.seed & 0xffff) << 8 | (w.step & 0xff);
    if let Shared::Etcd(e) = &mut w.shared {
        match restore {
            false => {
                e.back_up();
                w.note("etcd backed up".into());
            }
            true => {
                if e.restore(id, Instant::now()) {
                    w.note("etcd restored from its backup (an operator's error)".into());
                    w.checker.excuse_all("etcd restored from an older backup");
                    for s in w.slots.iter_mut().filter(|s| s.daemon.is_some()) {
                        s.unaware = true;
                    }
                    w.restored_at = Some(w.ms());
                }
            }
        }
    }
}

/// The end of a run: every fault healed, every request delivered, every daemon running, every
/// DEL owed made; then each daemon must hold exactly its live pods.
pub(crate) async fn wind_down(w: &mut World) -> Result<(), String> {
    w.note("winding down: faults healed".into());
    for i in 0..w.slots.len() {
        w.net.set_cut(i, false);

        if w.slots[i].daemon.is_none() && w.slots[i].twin_of.is_none() {
            w.start(i)?;
        }
    }
    for _ in 0..3000 {
        while !w.net.is_empty() {
            w.deliver(0, Fate::Answer)?;
            tokio::time::sleep(Duration::from_millis(1)).await;
            w.drain()?;
        }
        if let Some((c, s)) = w
            .owed
            .iter()
            .find(|(_, s)| w.slots[**s].daemon.is_some())
            .map(|(c, s)| (c.clone(), *s))
        {
            w.owed.remove(&c);
            let done = w.done.clone();
            if let Some(d) = w.slots[s].daemon.as_mut() {
                d.del(&c, &done);
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        w.drain()?;
        if w.net.is_empty() && w.owed.is_empty() && w.adding.is_empty() && w.op.is_none() {
            break;
        }
    }
    for i in 0..w.slots.len() {
        if let Some(d) = &w.slots[i].daemon {
            let held = d.held();
            w.checker.held_by(i, &held)?;
        }
    }
    Ok(())
}
