//! Each run's mix of steps ([`Swarm`]): which kinds of step it allows and how often, how
//! often a delivery meets a fault, and the settings and set-up its first picks choose (swarm
//! testing, as Groce et al. found: what remains meets more often).

use crate::choice::Choices;

/// What a step can be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A request delivered (`faults` of 100 with a fault).
    Deliver,
    /// Time moving on by milliseconds.
    Tick,
    /// By tens or hundreds of milliseconds.
    Wait,
    Add,
    Del,
    /// By seconds: past the daemons' deadlines (500 ms).
    Pause,
    /// By many seconds: past the fence.
    Leap,
    Kill,
    Wipe,
    Cut,
    Release,
    Pool,
    Twin,
    Clock,
    Restore,
    /// One watch hears what changed since it last heard.
    Hear,
    /// A watch cut, or the history compacted.
    WatchFault,
    /// A VM's live migration: a second launcher pod on another node (runs with pins).
    Migrate,
    /// The release of departed nodes, by the daemon that leads it (runs with departures).
    Departed,
    /// A pin's owner goes (its pods deleted) or comes back (runs with pins and departures).
    Owner,
    /// A turn of a daemon's pin keeper (runs with pins and departures).
    Keeper,
    /// A node's label changed, or the pool's nodeSelector set (runs with labels).
    Labels,
    /// A node's Node object deleted while its machine runs, or made again under its name
    /// (the CronJob's runs).
    NodeObject,
    /// The pods' part: a check of a daemon's pod GC, a sandbox gone without a DEL, a pod
    /// force-deleted while its sandbox runs (`crate::pod_gc`).
    PodGc,
}

/// Each kind of step with its weight out of 1000 in a run that allows everything: deliveries
/// 69 %, time moving on 13 % (mostly milliseconds), ADD 10 %, DEL 5 %, and the rarer faults
/// each a few in a thousand: time for the nodes to get somewhere between them.
const WEIGHTS: [(Kind, u32); 15] = [
    (Kind::Deliver, 690),
    (Kind::Tick, 90),
    (Kind::Wait, 30),
    (Kind::Add, 100),
    (Kind::Del, 50),
    (Kind::Pause, 10),
    (Kind::Leap, 4),
    (Kind::Kill, 6),
    (Kind::Wipe, 2),
    (Kind::Cut, 4),
    (Kind::Release, 3),
    (Kind::Pool, 3),
    (Kind::Twin, 2),
    (Kind::Clock, 2),
    (Kind::Restore, 2),
];

/// What a run may do: each run leaves some kinds of fault out and makes others four times as
/// common (swarm testing, as Groce et al. found: what remains meets more often), and sets how
/// often a delivery meets a fault. Half the runs allow everything as it is.
#[derive(Clone, Debug)]
pub struct Swarm {
    /// Of 100 deliveries, how many meet a fault (failed, lost, dropped, held).
    pub faults: u32,
    /// Each kind of step, its weight.
    pub weights: Vec<(Kind, u32)>,
    /// The daemons' `resync_secs` (a longer one leaves a block taken from a node serving
    /// longer, until its sync).
    pub resync_secs: u64,
    /// The daemons' `claim_ahead` (a higher one claims more often).
    pub claim_ahead: u64,
    /// A third of the writes of the operator's commands held on their way once (ipoolctl run
    /// from far away, over a slow link): what they write arrives after they gave up.
    pub slow_operator: bool,
    /// The daemons watch the store (`[cluster] watch`), and the steps include the watches'.
    pub watch: bool,
    /// The operator's pool commands include the changes of a running pool (a CIDR added or
    /// removed, the pool disabled and enabled).
    pub pool_changes: bool,
    /// The network takes its addresses from two pools (`cluster_pools = ["p", "q"]`): the
    /// second once the first is full.
    pub two_pools: bool,
    /// The network is addressed as one subnet (`addressing = "subnet"`, with a gateway and
    /// excluded addresses): blocks' first and last addresses are handed out too.
    pub subnet: bool,
    /// A node's daemon starts now and then with its network renamed in the config (and
    /// back): the network it held addresses on is one the config no longer names.
    pub renames: bool,
    /// In a run addressed as one subnet: a third of the ADDs are of pods with fixed
    /// addresses (`crate::fixed`), and VMs migrate.
    pub pins: bool,
    /// In a run with pins: the pool sets [`crate::SET_ASIDE`] aside, and the StatefulSet's
    /// first ordinals choose their addresses there (`ipool.io/ips-by-ordinal`).
    pub set_aside: bool,
    /// Departed nodes are released by the daemon that leads it, and nodes are wiped more
    /// often; a node gone when the run winds down stays gone (it departed for good).
    pub departures: bool,
    /// Conditioned writes are now and then parked until a rival's write touches what they
    /// are conditioned on (`crate::rivals`): races made, not waited for.
    pub races: bool,
}

impl Swarm {
    /// Everything, faults at 6 of 100 deliveries.
    pub fn all() -> Swarm {
        Swarm {
            faults: 6,
            weights: WEIGHTS.to_vec(),
            resync_secs: 2,
            claim_ahead: 2,
            slow_operator: false,
            watch: false,
            pool_changes: false,
            two_pools: false,
            subnet: false,
            renames: false,
            pins: false,
            set_aside: false,
            departures: false,
            races: false,
        }
    }

    /// The run's, from its first picks.
    pub fn pick(c: &mut Choices) -> Swarm {
        if c.pick(2) == 0 {
            return Swarm::all();
        }
        let faults = [6, 0, 2, 15][c.pick(4) as usize];
        let mut weights: Vec<(Kind, u32)> = WEIGHTS
            .iter()
            .map(|(k, w)| match k {
                Kind::Deliver | Kind::Tick | Kind::Wait | Kind::Add | Kind::Del => (*k, *w),
                // Left out, as it is, or four times as common.
                _ => (*k, w * [1, 0, 4][c.pick(3) as usize]),
            })
            .collect();
        let (resync_secs, claim_ahead, slow_operator) = (
            [2, 6][c.pick(2) as usize],
            [2, 8][c.pick(2) as usize],
            c.pick(3) == 2,
        );
        // Picked last, in the setup's room to spare: a run kept before watches were simulated
        // replays its zeros there (no watch), and as it was.
        let watch = c.pick(2) == 1;
        if watch {
            // News mostly soon after a change, at times many steps late.
            weights.push((Kind::Hear, 150));
            weights.push((Kind::WatchFault, 10 * [1, 0, 4][c.pick(3) as usize]));
        }
        // Last again, after the watches' picks: a run kept before replays zeros (no changes).
        let pool_changes = c.pick(2) == 1;
        // Last again: a run kept before replays zeros (one pool).
        let two_pools = c.pick(2) == 1;
        // Last again: a run kept before replays zeros (addressing by block).
        // The subnet's pick, its second bit the renames', its third the pins', its fourth the
        // addresses set aside (the setup's 20 picks are all taken when the daemons watch): a
        // run kept before replays 0 to 7 there (none set aside), 0 to 3 (no pins), or 0 or 1
        // (no renames either).
        // Its fifth bit the departures': a run kept before replays 0 to 15 there (none).
        // Its sixth the races' (`crate::rivals`): a run kept before replays 0 to 31 (none), and
        // a seed draws the same five bits as before.
        let bits = c.pick(64);
        let subnet = bits & 1 == 1;
        let renames = bits >> 1 & 1 == 1;
        let pins = subnet && bits >> 2 & 1 == 1;
        let set_aside = pins && bits >> 3 & 1 == 1;
        // The daemon that leads it releases departed nodes now and then (`[cluster]
        // release_departed_after_secs`), and nodes are wiped four times as often.
        // With pins too (the fifth bit: every run with pins kept before replays without):
        // owners going and coming back, and the pin keepers' turns.
        let departures = bits >> 4 & 1 == 1;
        let races = bits >> 5 & 1 == 1;
        if pins {
            weights.push((Kind::Migrate, 20));
        }
        if pins && departures {
            weights.push((Kind::Owner, 4));
            weights.push((Kind::Keeper, 10));
        }
        if departures {
            weights.push((Kind::Departed, 4));
            for (k, w) in weights.iter_mut() {
                if *k == Kind::Wipe {
                    *w = (*w).max(2) * 4;
                }
            }
        }
        Swarm {
            faults,
            weights,
            resync_secs,
            claim_ahead,
            slow_operator,
            watch,
            pool_changes,
            two_pools,
            subnet,
            renames,
            pins,
            set_aside,
            departures,
            races,
        }
    }

    /// A run about restores that lose the pins of pods that moved (`Options::moved_restores`):
    /// pins, races (so restores are made on purpose) and a subnet (pins need one), few faults
    /// of the network, and none of the faults that would excuse the moved pod or restart its
    /// block's node before its next listing (kills, wipes, cuts, leaps, clock steps, twins,
    /// releases, pool changes): restores and migrations ten times as common.
    pub(crate) fn focus_on_restores(&mut self) {
        self.subnet = true;
        self.pins = true;
        self.races = true;
        self.faults = self.faults.min(2);
        for (k, w) in self.weights.iter_mut() {
            match k {
                Kind::Kill
                | Kind::Wipe
                | Kind::Cut
                | Kind::Leap
                | Kind::Clock
                | Kind::Twin
                | Kind::Release
                | Kind::Pool
                | Kind::Departed => *w = 0,
                Kind::Restore | Kind::Migrate => *w = (*w).max(2) * 10,
                _ => {}
            }
        }
        if !self.weights.iter().any(|(k, _)| *k == Kind::Migrate) {
            self.weights.push((Kind::Migrate, 200));
        }
    }

    /// The kind of step `pick` (within [`Swarm::total`]) names.
    pub(crate) fn kind(&self, mut pick: u32, rivals: bool) -> Kind {
        for (k, w) in self.weights_now(rivals) {
            if pick < w {
                return k;
            }
            pick -= w;
        }
        Kind::Tick
    }

    pub(crate) fn total(&self, rivals: bool) -> u32 {
        self.weights_now(rivals).map(|(_, w)| w).sum()
    }

    /// The weights, with the steps that make rivals' writes ten times as common while a write
    /// is parked for one (`rivals`).
    fn weights_now(&self, rivals: bool) -> impl Iterator<Item = (Kind, u32)> + '_ {
        self.weights.iter().map(move |(k, w)| match (rivals, k) {
            (false, _) | (true, Kind::Deliver | Kind::Tick | Kind::Wait | Kind::Del) => (*k, *w),
            (true, Kind::Add) => (*k, w * 2),
            (true, _) => (*k, w * 10),
        })
    }
}
