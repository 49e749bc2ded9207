//! What the driver can do at a step, each chosen by the run's picks (0: the plainest, deliver
//! the oldest request), among what the run's [`crate::swarm::Swarm`] allows. The network: a request
//! delivered, failed, applied with its answer lost, dropped, or held on the way and delivered
//! after its caller gave up; time moving on, by a millisecond or by seconds (past every
//! deadline). The nodes ([`crate::nodes`]): ADD and DEL of pods, daemons killed and restarted
//! with their state dir kept, or wiped (the node and its pods gone), connections cut and
//! healed, a second daemon under a node's name. The operator ([`crate::operator`]):
//! release-node, pools, the wall clock, etcd's backups. The store's watches, in a run whose
//! daemons watch ([`crate::hearing`]): one watch hears its news, one is cut, the history is
//! compacted.

use std::time::Duration;

use tokio::time::Instant;

use crate::nodes::{
    add, add_asking, cut_or_heal, cut_or_heal_one, del_oldest, del_some, kill_or_restart, running,
    twin, wipe,
};
use crate::operator::{backup_or_restore, jump_clock, pool_op, release, release_one};
use crate::store::Fate;
use crate::swarm::Kind;
use crate::world::World;
use crate::StoreKind;

/// One step's action, of a kind the run's swarm picks; how long time moves after it.
pub(crate) fn act(w: &mut World) -> Result<Duration, String> {
    let tick = Duration::from_millis(1);
    let ms = |w: &mut World, lo: u64, hi: u64| {
        Duration::from_millis(lo + u64::from(w.choices.pick((hi - lo) as u32)))
    };
    let pending = w.net.len();
    let faults = w.swarm.faults;
    // While a write is parked, the steps that make rivals' writes (the operator's commands,
    // faults, time for the nodes' timers, other nodes' ADDs) are ten times as common; where
    // the write provoked its rival (`crate::provoke`), time moves as in any run, so that the
    // rival's requests arrive before their deadlines.
    let rivals = w.swarm.races && w.net.parked() > 0 && !w.opts.provoke;
    let total = w.swarm.total(rivals);
    let kind = w.swarm.kind(w.choices.pick(total), rivals);
    match kind {
        Kind::Deliver => {
            if pending == 0 {
                return Ok(ms(w, 1, 20));
            }
            // Mostly the oldest first; any of them at times (requests overtake each other).
            let i = match w.choices.chance(1, 4) {
                true => w.choices.pick(pending as u32) as usize,
                false => 0,
            };
            if w.swarm.slow_operator && w.net.operators_unheld(i) && w.choices.pick(3) == 2 {
                // Now and then past a node's return: release-node's delete arriving after the
                // node took its name back and served again.
                let hold = match w.choices.pick(3) {
                    0 => ms(w, 20_000, 60_000),
                    _ => ms(w, 600, 20_000),
                };
                w.note(format!(
                    "the operator's request held on its way for {} ms",
                    hold.as_millis()
                ));
                w.net.hold(i, Instant::now() + hold);
                return Ok(tick);
            }
            if w.swarm.races && w.choices.pick(4) == 3 {
                if let Some(on) = park(w, i) {
                    if w.opts.provoke {
                        crate::provoke::rival(w, &on)?;
                    }
                    return Ok(tick);
                }
            }
            if faults == 0 || w.choices.pick(100) >= faults {
                w.deliver(i, Fate::Answer)?;
                return Ok(tick);
            }
            match w.choices.pick(5) {
                k @ 0..=2 => w.deliver(i, [Fate::Fail, Fate::Lose, Fate::Drop][k as usize])?,
                _ => {
                    // A write, where one is on its way: a late write is what can do harm.
                    let writes = w.net.writes();
                    let i = match writes.len() {
                        0 => i,
                        n => writes[w.choices.pick(n as u32) as usize],
                    };
                    let hold = ms(w, 600, 20_000);
                    w.note(format!(
                        "a request held on its way for {} ms",
                        hold.as_millis()
                    ));
                    w.net.hold(i, Instant::now() + hold);
                }
            }
            Ok(tick)
        }
        Kind::Tick => Ok(ms(w, 1, 20)),
        Kind::Wait => Ok(ms(w, 20, 300)),
        Kind::Pause => Ok(ms(w, 300, 3000)),
        Kind::Leap => Ok(ms(w, 3000, 15000)),
        Kind::Add => {
            if let Some(i) = running(w) {
                // A third of a run with pins: a pod with a fixed address.
                if w.swarm.pins && w.choices.pick(3) == 0 {
                    crate::fixed::add_fixed(w, i);
                    return Ok(tick);
                }
                // One in eight asks for an address by name (CNI args' IP=).
                let requested = match w.choices.pick(8) {
                    7 => vec![asked_for(w, i)],
                    _ => Vec::new(),
                };
                add_asking(w, i, requested);
            }
            Ok(tick)
        }
        Kind::Del => {
            del_some(w);
            Ok(tick)
        }
        Kind::Kill => kill_or_restart(w).map(|()| tick),
        Kind::Wipe => wipe(w).map(|()| tick),
        Kind::Cut => {
            cut_or_heal(w);
            Ok(tick)
        }
        Kind::Release => {
            release(w);
            Ok(tick)
        }
        Kind::Departed => {
            crate::departed::departed(w);
            Ok(tick)
        }
        Kind::Pool => {
            pool_op(w);
            Ok(tick)
        }
        Kind::Twin => twin(w).map(|()| tick),
        Kind::Clock => {
            jump_clock(w);
            Ok(tick)
        }
        Kind::Restore if w.opts.store == StoreKind::Etcd => backup_or_restore(w).map(|()| tick),
        Kind::Restore => Ok(tick),
        Kind::Hear => {
            crate::hearing::hear(w);
            Ok(tick)
        }
        Kind::WatchFault => {
            crate::hearing::watch_fault(w);
            Ok(tick)
        }
        Kind::Migrate => {
            crate::fixed::migrate(w);
            Ok(tick)
        }
        Kind::Owner => {
            crate::fixed::owner_goes_or_comes(w);
            Ok(tick)
        }
        Kind::Keeper => {
            crate::fixed::keep_pins(w);
            Ok(tick)
        }
        Kind::Labels => {
            crate::labels::step(w);
            Ok(tick)
        }
        Kind::PodGc => crate::pod_gc::step(w).map(|()| tick),
        Kind::NodeObject => {
            crate::nodes::delete_or_remake_node(w);
            Ok(tick)
        }
    }
}

/// The exhaustive walk's boot: every request delivered as it comes, until both nodes serve and
/// each holds a pod; no pick is made.
pub(crate) async fn boot(w: &mut World) -> Result<(), String> {
    let mut added = false;
    for _ in 0..2000 {
        w.net.release_held(Instant::now());
        let wait = match w.net.is_empty() {
            true => Duration::from_millis(20),
            false => {
                w.deliver(0, Fate::Answer)?;
                Duration::from_millis(1)
            }
        };
        tokio::time::sleep(wait).await;
        w.drain()?;
        let serving = (0..w.slots.len()).all(|i| w.sync_counts(i).is_some_and(|c| c[0] > 0));
        if serving && !added {
            for i in 0..w.slots.len() {
                add(w, i);
            }
            added = true;
        }
        if added && w.kubelet.adding.is_empty() && w.net.is_empty() {
            w.note("booted: both nodes serve, each with a pod".into());
            return Ok(());
        }
    }
    Err("the smallest cluster did not boot".into())
}

/// One step of the exhaustive walk: a pick among the small set of actions (0 the plainest):
/// the oldest request delivered, the newest delivered (an overtaking), the oldest failed,
/// answered into the void, or held for two seconds; time moving on past the deadlines or past
/// the fence; a pod added on either node or the oldest deleted; either node's daemon killed or
/// restarted; the second node's connection cut or healed; release-node on the second node,
/// forced, or not (`--absent-for 0`).
pub(crate) fn act_small(w: &mut World) -> Result<Duration, String> {
    let tick = Duration::from_millis(1);
    let pending = w.net.len();
    let newest = pending.saturating_sub(1);
    let pick = w.choices.pick(15);
    match pick {
        0..=3 if pending == 0 => return Ok(Duration::from_millis(20)),
        0 => w.deliver(0, Fate::Answer)?,
        1 => w.deliver(newest, Fate::Answer)?,
        2 => w.deliver(0, Fate::Fail)?,
        3 => w.deliver(0, Fate::Lose)?,
        4 if pending > 0 => w.net.hold(0, Instant::now() + Duration::from_secs(2)),
        4 => return Ok(tick),
        5 => return Ok(Duration::from_millis(600)),
        6 => return Ok(Duration::from_secs(7)),
        7 | 8 => {
            let i = (pick - 7) as usize;
            if w.slots[i].daemon.is_some() {
                add(w, i);
            }
        }
        9 => del_oldest(w),
        10 | 11 => {
            let i = (pick - 10) as usize;
            match w.slots[i].daemon.is_some() {
                true => {
                    w.note(format!("{} killed (-9)", w.slots[i].name));
                    w.kill(i);
                }
                false => w.start(i)?,
            }
        }
        12 => cut_or_heal_one(w, 1),
        13 => release_one(w, 1, true),
        _ => release_one(w, 1, false),
    }
    Ok(tick)
}

/// The end of a run: every fault healed, every request delivered, every daemon running (but
/// those of nodes gone in a run with departures: they departed for good), every DEL owed
/// made; then each daemon must hold exactly its live pods.
pub(crate) async fn wind_down(w: &mut World) -> Result<(), String> {
    w.note("winding down: faults healed".into());
    // The kubelet of a machine that runs registers its Node again.
    for name in std::mem::take(&mut w.nodes_deleted) {
        w.note(format!("the Node of {name} made again by its kubelet"));
    }
    doom_pods_of_gone_owners(w);
    crate::pod_gc::wind_down(w)?;
    // DELs never answered (their daemon killed meanwhile): the kubelet makes them again.
    for (c, s) in std::mem::take(&mut w.kubelet.dels) {
        w.kubelet.owed.entry(c).or_insert(s);
    }
    w.net.release_all();
    // A node gone in a run with departures departed for good; but one node stays (none left
    // has nobody to release the others).
    let nodes = w.opts.nodes;
    let all_gone = (0..nodes).all(|i| w.slots[i].gone && w.slots[i].daemon.is_none());
    for i in 0..w.slots.len() {
        w.net.set_cut(i, false);
        // The operator's error corrected: a second daemon under a node's name stopped.
        if w.slots[i].twin_of.is_some() && w.slots[i].daemon.is_some() {
            w.note(format!(
                "{} (slot {i}), a second daemon of its name, stopped",
                w.slots[i].name
            ));
            w.kill(i);
        }

        let departed = w.swarm.departures && w.slots[i].gone && !(all_gone && i == 0);
        if w.slots[i].daemon.is_none() && w.slots[i].twin_of.is_none() && !departed {
            w.start(i)?;
        }
    }
    for _ in 0..3000 {
        while !w.net.is_empty() {
            w.deliver(0, Fate::Answer)?;
            tokio::time::sleep(Duration::from_millis(1)).await;
            w.drain()?;
        }
        // An ADD answered during the wind-down, of an owner gone meanwhile: its pod too.
        doom_pods_of_gone_owners(w);
        if let Some((c, s)) = w
            .kubelet
            .owed
            .iter()
            .find(|(_, s)| w.slots[**s].daemon.is_some())
            .map(|(c, s)| (c.clone(), *s))
        {
            w.kubelet.owed.remove(&c);
            let done = w.done.clone();
            if let Some(d) = w.slots[s].daemon.as_mut() {
                d.del(&c, &done);
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        w.drain()?;
        if w.net.is_empty()
            && w.kubelet.owed.is_empty()
            && w.kubelet.adding.is_empty()
            && !w.operating()
        {
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

/// Pods of owners gone whose ADD was answered after the owner went: deleted, as the
/// StatefulSet's or the VM's controller deletes them, their DELs owed (made once their
/// daemon runs).
fn doom_pods_of_gone_owners(w: &mut World) {
    let doomed: Vec<(String, usize)> = w
        .checker
        .pods
        .iter()
        .filter(|(_, p)| {
            p.owner
                .as_ref()
                .is_some_and(|o| w.owners_gone.contains_key(o))
        })
        .map(|(c, p)| (c.clone(), p.slot))
        .collect();
    for (c, slot) in doomed {
        w.note(format!("{c}, a pod of an owner gone, deleted"));
        w.checker.deleting(&c);
        w.kubelet.owed.insert(c, slot);
    }
}

/// The address an ADD on slot `i` asks for by name: anywhere in the pool (in a block of its
/// node's, another node's, or none), in a block its node is giving back, or in one another
/// node owns, a third of the time each: where the paths are, not only where a pick lands.
fn asked_for(w: &mut World, i: usize) -> std::net::IpAddr {
    // In a run with races and pins, half the time a pinned address of this node's block
    // that a pod on another node holds, when there is one: the race with a pin lost.
    if w.swarm.races && w.swarm.pins && w.choices.chance(1, 2) {
        if let Some(ip) = crate::fixed::hosted_elsewhere(w, i) {
            return ip;
        }
    }
    let v4 = |n: &ipnet::IpNet| matches!(n, ipnet::IpNet::V4(_));
    // `ipoolctl status`'s line: "... here: 10.70.0.32/28 (RETURNING, 0 held here), ...".
    let returning: Vec<ipnet::IpNet> = w.slots[i]
        .daemon
        .as_ref()
        .map(|d| d.detail())
        .unwrap_or_default()
        .iter()
        .flat_map(|l| l.split(", ").map(str::to_string).collect::<Vec<_>>())
        .filter(|b| b.contains("(RETURNING"))
        .filter_map(|b| b.split(' ').find_map(|t| t.parse().ok()))
        .filter(v4)
        .collect();
    let me = w.slots[i].name.clone();
    let others: Vec<ipnet::IpNet> = w
        .shared
        .blocks()
        .into_iter()
        .filter(|(n, owner, _)| *owner != me && v4(n))
        .map(|(n, _, _)| n)
        .collect();
    let within = match w.choices.pick(3) {
        1 if !returning.is_empty() => {
            Some(returning[w.choices.pick(returning.len() as u32) as usize])
        }
        2 if !others.is_empty() => Some(others[w.choices.pick(others.len() as u32) as usize]),
        _ => None,
    };
    match within {
        Some(ipnet::IpNet::V4(n)) => {
            let hosts = 1u32 << (32 - u32::from(n.prefix_len()));
            let host = u32::from(n.network()) + w.choices.pick(hosts);
            std::net::IpAddr::V4(host.into())
        }
        _ => {
            let host = 1 + w.choices.pick(if w.opts.small { 30 } else { 126 });
            std::net::IpAddr::from([10, 70, 0, host as u8])
        }
    }
}

/// Parks the `i`th request on its way, if it is a conditioned write never held: until a
/// rival's write touches what it is conditioned on, or for a while (within its caller's
/// deadline, or past it); what it is parked on, if it was (`crate::rivals`).
fn park(w: &mut World, i: usize) -> Option<crate::rivals::Keys> {
    let on = w.net.conditioned(i)?;
    let ms = match w.choices.pick(3) {
        0 => 600 + u64::from(w.choices.pick(4400)),
        _ => 20 + u64::from(w.choices.pick(400)),
    };
    // Where rivals are provoked, one time in two until a second rival's write: the first may
    // only make way for the one that does harm (a block released, then claimed elsewhere).
    let rivals = match w.opts.provoke {
        true => 1 + w.choices.pick(2) as u8,
        false => 1,
    };
    let what = w.net.describe(i);
    w.note(format!(
        "{what} parked on its way until {} rival's write touches what it is conditioned on, or for {ms} ms",
        match rivals {
            1 => "a",
            _ => "a second",
        }
    ));
    w.net.park(
        i,
        on.clone(),
        Instant::now() + Duration::from_millis(ms),
        rivals,
    );
    Some(on)
}
