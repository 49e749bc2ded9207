//! What the driver can do at a step, each chosen by the run's picks (0: the plainest, deliver
//! the oldest request), among what the run's [`Swarm`] allows. The network: a request
//! delivered, failed, applied with its answer lost, dropped, or held on the way and delivered
//! after its caller gave up; time moving on, by a millisecond or by seconds (past every
//! deadline). The nodes ([`crate::nodes`]): ADD and DEL of pods, daemons killed and restarted
//! with their state dir kept, or wiped (the node and its pods gone), connections cut and
//! healed, a second daemon under a node's name. The operator ([`crate::operator`]):
//! release-node, pools, the wall clock, etcd's backups.

use std::time::Duration;

use ipool_proto::etcd::etcdserverpb::{compare::TargetUnion, request_op::Request};
use ipool_server::cluster::etcd::client::Call;
use tokio::time::Instant;

use crate::choice::Choices;
use crate::nodes::{
    add, cut_or_heal, cut_or_heal_one, del_oldest, del_some, kill_or_restart, running, twin, wipe,
};
use crate::operator::{backup_or_restore, jump_clock, pool_op, release, release_one};
use crate::store::Fate;
use crate::world::World;
use crate::StoreKind;

/// What a run may do: each run leaves some kinds of fault out (swarm testing, as Groce et al.
/// found: what remains happens often enough to meet), and sets how often a delivery meets a
/// fault. Half the runs allow everything.
#[derive(Clone, Debug)]
pub struct Swarm {
    /// Of 100 deliveries, how many meet a fault (failed, lost, dropped, held).
    pub faults: u32,
    /// Time moving by seconds at once (every deadline passes).
    pub leaps: bool,
    pub kills: bool,
    pub wipes: bool,
    pub cuts: bool,
    pub releases: bool,
    pub pools: bool,
    pub twins: bool,
    pub clocks: bool,
    pub restores: bool,
}

impl Swarm {
    /// Everything, faults at 6 of 100 deliveries.
    pub fn all() -> Swarm {
        Swarm {
            faults: 6,
            leaps: true,
            kills: true,
            wipes: true,
            cuts: true,
            releases: true,
            pools: true,
            twins: true,
            clocks: true,
            restores: true,
        }
    }

    /// The run's, from its first picks.
    pub fn pick(c: &mut Choices) -> Swarm {
        if c.pick(2) == 0 {
            return Swarm::all();
        }
        // Each kind left in two times out of three.
        let mut on = || c.pick(3) != 1;
        let (leaps, kills, wipes, cuts, releases) = (on(), on(), on(), on(), on());
        let (pools, twins, clocks, restores) = (on(), on(), on(), on());
        Swarm {
            faults: [6, 0, 2, 15][c.pick(4) as usize],
            leaps,
            kills,
            wipes,
            cuts,
            releases,
            pools,
            twins,
            clocks,
            restores,
        }
    }
}

/// One step's action; how long time moves after it. Out of 1000 picks: deliveries 69 %
/// (`faults` of 100 of them with a fault), time moving on 13 % (mostly milliseconds; seconds
/// rarely, past the daemons' deadlines of 500 ms), ADD 10 %, DEL 5 %, and the rarer faults
/// each a few in a thousand: time for the nodes to get somewhere between them.
pub(crate) fn act(w: &mut World) -> Result<Duration, String> {
    let tick = Duration::from_millis(1);
    let ms = |w: &mut World, lo: u64, hi: u64| {
        Duration::from_millis(lo + u64::from(w.choices.pick((hi - lo) as u32)))
    };
    let pending = w.net.len();
    let sw = w.swarm.clone();
    match w.choices.pick(1000) {
        0..=689 => {
            if pending == 0 {
                return Ok(ms(w, 1, 20));
            }
            // Mostly the oldest first; any of them at times (requests overtake each other).
            let i = match w.choices.chance(1, 4) {
                true => w.choices.pick(pending as u32) as usize,
                false => 0,
            };
            if sw.faults == 0 || w.choices.pick(100) >= sw.faults {
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
        690..=779 => Ok(ms(w, 1, 20)),
        780..=809 => Ok(ms(w, 20, 300)),
        810..=819 if sw.leaps => Ok(ms(w, 300, 3000)),
        820..=823 if sw.leaps => Ok(ms(w, 3000, 15000)),
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
        974..=979 if sw.kills => {
            kill_or_restart(w)?;
            Ok(tick)
        }
        980..=981 if sw.wipes => {
            wipe(w)?;
            Ok(tick)
        }
        982..=985 if sw.cuts => {
            cut_or_heal(w);
            Ok(tick)
        }
        986..=988 if sw.releases => {
            release(w);
            Ok(tick)
        }
        989..=991 if sw.pools => {
            pool_op(w);
            Ok(tick)
        }
        992..=993 if sw.twins => {
            twin(w)?;
            Ok(tick)
        }
        994..=995 if sw.clocks => {
            jump_clock(w);
            Ok(tick)
        }
        996..=997 if sw.restores && w.opts.store == StoreKind::Etcd => {
            backup_or_restore(w)?;
            Ok(tick)
        }
        _ => Ok(tick),
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
        if added && w.adding.is_empty() && w.net.is_empty() {
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

/// The end of a run: every fault healed, every request delivered, every daemon running, every
/// DEL owed made; then each daemon must hold exactly its live pods.
pub(crate) async fn wind_down(w: &mut World) -> Result<(), String> {
    w.note("winding down: faults healed".into());
    w.net.release_all();
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
