//! A deterministic simulation of ipool's cluster mode: the real cluster code (`ClusterNode`,
//! `ClusterSource` with its work, `claim_next`, the heartbeat and the fence, release-node, pool
//! creation and deletion, both stores' code, and the engine's ADD, DEL and background loop
//! where they meet a source) on one thread, in simulated time, over an in-memory etcd or
//! apiserver, with every interleaving and every fault decided by one list of picks: a seed, or
//! a list replayed, shrunk or walked depth-first.
//!
//! # Layout
//! - [`choice`]: where a run's decisions come from (seeded, replayed, depth-first), and
//!   shrinking;
//! - [`conditions`]: the conditions of the stores' writes, named, and one dropped on purpose;
//!   [`dropped`]: searches with one dropped; `rivals`: races made on purpose (a conditioned
//!   write parked until a rival's write touches what it is conditioned on); `provoke`: the
//!   rival started at once (the command or fault that writes the parked write's keys);
//! - [`etcd`]: etcd in memory (keys, revisions, transactions, leases on simulated time);
//! - [`store`]: the shared store (that etcd, or the apiserver's rules of `ipool-testkit`), what
//!   a delivered request does to it, its blocks for the checker;
//! - [`net`]: the network every store request waits in until the driver delivers, fails,
//!   loses or drops it; the real etcd client and kube client speak through it;
//! - [`watch`]: the store's watches, made through that network, each hearing its news only
//!   when the driver says (delayed, cut, replayed, compacted away); `hearing`: those steps,
//!   and what a node was told;
//! - [`daemon`]: a simulated node's daemon, wired as ipoold is, on a state dir that survives it;
//! - `world`: the run's state (`commands`: the operators' commands; `kubelet`: the ADDs and
//!   DELs on their way and owed; `resets`: the stores gone back in time; `told`: the pool as the operators were told it); `driver`: the run (steps,
//!   wind-down, quiet); `lifecycle`: a daemon started or killed; `describe`: an etcd call in
//!   words; `owners`: the owners of fixed addresses; `actions` and `operator`: what a step can
//!   do; `swarm`: each run's mix of steps; `departed`: the release of departed nodes (a
//!   leading daemon's, or the CronJob's); `labels`: node labels and the pool's nodeSelector;
//!   `identity`: who each request on the Kubernetes API is, held to deploy/'s RBAC and
//!   admission policies;
//! - [`check`]: the invariants, asked after every step (and what an etcd restore excuses:
//!   not the pinned addresses the nodes keep);
//! - `quiet`: the quiet period that ends each run, and [`settled`]: the liveness rules judged
//!   after it (nothing stranded, no block of a gone node, no stuck ADD or pool, no idle writes).

pub mod check;
pub mod choice;
pub mod conditions;
pub mod daemon;
pub mod etcd;
pub mod net;
pub mod row;
pub mod search;
pub mod store;
pub mod watch;

mod actions;
mod commands;
mod deliver;
mod departed;
mod describe;
mod drain;
mod driver;
pub mod dropped;
mod excuses;
mod fixed;
mod hearing;
mod identity;
mod kubelet;
mod labels;
mod lifecycle;
mod nodes;
mod operator;
mod owners;
mod pod_gc;
mod provoke;
mod quiet;
mod resets;
mod rivals;
mod seen;
pub mod settled;
mod store_check;
mod swarm;
mod told;
mod world;

pub use ipool_server::bugs::Bug;
use ipool_server::cluster::ippool::PoolSpec;

pub use choice::Choices;

/// Closed paths the search does not find within its budget yet (docs/simulation.md says
/// what each needs): the harness reports them instead of failing on them.
pub const NOT_YET: &[Bug] = &[
    Bug::OverlapBothServe,
    Bug::GiveBackOnRevisions,
    Bug::FirstSyncTrusts,
    Bug::ResetNameTrusted,
    Bug::HostedNotTakenOver,
    // Found by the hunt from seed 0, but after 4 750 000 and 5 680 000 steps: more than
    // `cargo test`'s share allows; their kept runs are replayed by every `cargo test`.
    Bug::DepartedByLocalClock,
    Bug::OrphanedResettled,
    // Not met by the hunt within 8 000 000 steps (seed 2 458 of a search; no kept run yet,
    // docs/simulation.md says why).
    Bug::HoldersNotDeparted,
    // Found by a search of seeds from 1 000 000 000 (1 000 002 562), not by the hunt from 0
    // within its budget; its kept run is replayed by every `cargo test`.
    Bug::PinAfterReleasePlan,
    // Found by the hunt from seed 0 after 2 005 000 steps (about 25 s of `cargo test`'s
    // share); its kept run is replayed by every `cargo test`.
    Bug::HoldByWallClock,
    // Found by L3 in the run shrunk from seed 2 458 of a search, not by the hunt from 0 within
    // 8 000 000 steps. No kept run since session 32: release-node ends the holds of a node the
    // store has no record of (`unrecorded-holder-unknown`), which ended this path's stranded
    // pin on etcd; a search of 900 s from seed 2 000 with the switch did not meet it.
    Bug::HoldBeforeName,
    // Found by a search of seeds from 1 000 002 563 (1 000 009 634), not by the hunt from 0
    // within its budget; its kept run is replayed by every `cargo test`.
    Bug::WitnessUnnumbered,
    // Found by L3 at seed 32 000 001 708 of a search (an etcd restored from a backup older than
    // the node), not by the hunt from 0 within its budget. No kept run: the node that made the
    // stranded pin again no longer makes again pins it neither hosts nor holds
    // (`others-pins-reasserted`); the seed fails with both switches on.
    Bug::UnrecordedHolderUnknown,
    // Found at seed 20 328 of a search of the CronJob's seeds (an etcd restored with
    // `--bump-revision`), not by the hunt from 0 within its budget; its kept run is replayed
    // by every `cargo test`.
    Bug::WitnessJudgedWhenSent,
    // Found at seed 81 707 of a search of the CronJob's seeds (the daemons held to deploy/'s
    // admission policies), not by the hunt from 0 within its budget; its kept run is replayed
    // by every `cargo test`.
    Bug::VoidPinDeletedUnderOthers,
    // Found by L1 at seed 260 328 of a search of the CronJob's seeds (etcd restored twice from
    // one backup, so that revisions repeat), not by the hunt from 0 within its budget. No kept
    // run: the removal is conditioned on the block as judged too (`index-dropped-under-its-
    // block`), which closes the same path; the seed fails with both switches on.
    Bug::IndexDroppedByRevision,
    // Found by L2 at seed 291 050 and by the checker at seed 34 000 006 924 of searches of
    // session 32's final code (etcd restored more than once), not by the hunt from 0 within
    // its budget; their kept runs are replayed by every `cargo test`.
    Bug::IndexDroppedUnderItsBlock,
    Bug::OthersPinsReasserted,
    // Found at seed 35 000 007 899 of session 32's last search (the apiserver's clock stepped
    // an hour ahead just after a renewal, the node cut off), not by the hunt from 0 within its
    // budget; its kept run is replayed by every `cargo test`.
    Bug::PinsReadBeforeFence,
    // Found at 1 652 s of session 33's 30-minute search (seed 36 000 011 368: etcd restored
    // four times, the last with `--bump-revision`), not by the hunt from 0 within its budget;
    // its kept run is replayed by every `cargo test`.
    Bug::WitnessUnreadAfterReset,
    // Found at seed 37 000 000 030 of session 33's 10-minute search (two claims sent together,
    // etcd restored between their landings from a backup taken just before the first, its data
    // copied), not by the hunt from 0 within its budget; its kept run is replayed by every
    // `cargo test`.
    Bug::WitnessJudgedPastOnly,
    // Found by a review (session 34) before it landed: the simulation's operator never sets a
    // family's block size (docs/simulation.md, Limits), so no run can meet it; guarded by
    // `cluster::ippool::tests::nothing_is_claimed_in_a_cidr_on_its_way_in_or_out`.
    Bug::ClaimOfAnySize,
    // Found by a review and a real etcd restored (issue 53, item 4). Searches of 1 420 s with
    // the switch did not meet it until session 43 made runs about it (`Options::
    // moved_restores`: restores that lose a moved pod's pin, few other faults); a search of
    // those met it at seed 121 000 015 420 in 11 s. Not by the hunt from 0 (those runs are one
    // seed in 128); its kept run is replayed by every `cargo test`. Guarded too by
    // `cluster::source::pinned_tests::pins_known_before_a_reset_stay_until_the_store_has_them_
    // with_this_nodes_holds` and `cluster_truth::pins_lost_by_a_restored_etcd_*`.
    Bug::PinsForgottenAtReset,
    // Found by the hunt from seed 0 at first (seeds 10 and 32), since session 31's changes
    // (the witness numbered, holds only under a held name, the wind-down deleting the pods of
    // gone owners) after 3 523 843 and 8 735 000 steps: more than `cargo test`'s share; their
    // kept runs are replayed by every `cargo test`.
    Bug::ResetUndetected,
    Bug::PinnedBlockGivenBack,
    // Found by a search of seeds from 60 000 000 000 (60 000 002 286), not by the hunt from 0
    // within 8 000 000 steps; its kept run is replayed by every `cargo test`.
    Bug::CrossedWritesUnseen,
    // Found by a search of seeds from 74 000 000 000 (74 000 007 208, a run of the race groups
    // with pins on etcd, whose restores are made on purpose), not by the hunt from 0, whose
    // seeds of those groups are few; its kept run is replayed by every `cargo test`.
    Bug::UnreadWriteBelow,
    // Found at 1 731 s of session 37's 30-minute search (seed 81 000 011 726, a run of the
    // race groups: a claim parked across a restore), not by the hunt from 0; its kept run is
    // replayed by every `cargo test`.
    Bug::OtherWriteAtLastRevision,
    // Found at seed 97 000 000 961 of session 39's first search (deploy/'s admission policy
    // refused the DELETE), not by the hunt from 0; its kept run is replayed by every `cargo
    // test`.
    Bug::VoidSetAsidePinDeletedUnderOthers,
    // Found by L4 at seed 100 176 of session 39's races (the first of a network's two pools
    // deleted by a second operator's late write), not by the hunt from 0; its kept run is
    // replayed by every `cargo test`.
    Bug::GonePoolAwaited,
    // Found by L3 at seed 102 000 018 835 of session 40's 30-minute search (a pin's creation,
    // given up on, landed 12 s late: its owner's second pin, void, sorting first), not by the
    // hunt from 0; its kept run is replayed by every `cargo test`.
    Bug::OwnersFirstPinOnly,
    // Found by the hunt from seed 0 at seed 983 after 4 920 000 steps (79 s: more than `cargo
    // test`'s share), by L3's void-pin rule of session 41; its kept run is replayed by every
    // `cargo test`.
    Bug::VoidPinsKept,
    // Found by the checker at seed 103 000 002 216 of session 41's search (etcd restored with
    // its data copied, a pool change given up on landing late), not by the hunt from 0; its
    // kept run is replayed by every `cargo test`.
    Bug::PoolChangeOnRevisionOnly,
    // Found by review after the last (session 41), shown by a test with a real etcd restored
    // (`cluster_late::a_pin_change_from_before_a_restore_*`); no run of the simulation has met
    // it yet: a late unpin across a restore that reuses its revision.
    Bug::PinChangeOnRevisionOnly,
    // Found by a review of finding 34 (session 41), judged by L3's second-pin rule since
    // session 42: the hunt from seed 0 finds it at seed 3 615 after 18 080 000 steps (330 s,
    // more than `cargo test`'s share); its kept run is replayed by every `cargo test`.
    Bug::SecondPinsKept,
    // Found at seed 106 000 006 223 of session 42's search (a pin's creation landing 8 s late,
    // after its daemon was killed and started again), not by the hunt from 0. Its kept run
    // failed by L3 for the owner's own pod, which that rule no longer counts (session 43's
    // finding 42), and 1 200 s of searches with the switch met it nowhere: no kept run now.
    // Guarded by `cluster::pin::hold::confirm::tests` and by `cluster_fixed::fixed_addresses_
    // follow_their_pods_on_the_kubernetes_api` (an unconfirmed hold is not taken over).
    Bug::LatePinTakenOver,
    // Found by reading finding 37 (session 42), judged by L3's misheld-pin rule: a search from
    // seed 109 000 000 000 with the switch met it at seed 109 000 001 451 (125 s; the hunt from
    // 0 was not measured for it); its kept run is replayed by every `cargo test`.
    Bug::MisheldPinsKept,
    // Found at seed 35 000 002 239 of session 42's search (VMs' instances made again, the
    // apiserver's clock stepped forward), not by the hunt from 0; its kept run is replayed by
    // every `cargo test`.
    Bug::AwayByStampsOnly,
    // Found by L3's second-pin rule at seed 36 000 001 237 of session 42's search, not by the
    // hunt from 0; its kept run is replayed by every `cargo test`.
    Bug::DepartedSecondPinsKept,
    // Found by L3's misheld-pin rule at seed 110 000 005 290 of session 42's last search, not
    // by the hunt from 0. That rule counted the owner's own pod then, which it no longer does
    // (session 43's finding 42); the kept run no longer fails, and searches with the switch
    // have not met it since: no kept run now.
    Bug::LandedHoldKeptWriting,
    // Found by the checker at seed 120 000 012 094 of session 43's first search of the runs
    // about restores (`Options::moved_restores`; an operator's forced release of a live node
    // and a takeover past a fence before it), not by the hunt from 0; its kept run is replayed
    // by every `cargo test`.
    Bug::MisheldOwnPodEnded,
    // Found by the checker at seed 123 000 322 364 of session 43's search of the runs about
    // restores (etcd restored twice, 400 ms apart), not by the hunt from 0; its kept run is
    // replayed by every `cargo test`.
    Bug::AssertedBeforeReset,
];

/// The simulation's pool.
pub const POOL: &str = "p";
/// The network's second pool, in the runs that have one (`Swarm::two_pools`).
pub const SECOND_POOL: &str = "q";

/// The network's gateways and excluded addresses in the runs addressed as one subnet
/// (`Swarm::subnet`): inside the first blocks of both pools, never handed out.
pub const SUBNET_GATEWAYS: [&str; 3] = ["10.70.0.1", "10.71.0.30", "fd00:70::1"];
pub const SUBNET_EXCLUDE: [&str; 3] = ["10.70.0.16/30", "10.71.0.5/32", "fd00:70::10/126"];

/// The range the pool sets aside in the runs whose swarm says so (`Swarm::set_aside`): the
/// StatefulSet's first [`CHOSEN`] ordinals choose their addresses there, in order from its
/// second address (`ipool.io/ips-by-ordinal`).
pub const SET_ASIDE: &str = "10.70.0.120/29";
pub const CHOSEN: u32 = 2;

/// The daemons' `pin_ttl_secs`, and the leader's: how long a pin's owner is gone before its
/// pin ends.
pub const PIN_TTL_SECS: u64 = 30;

/// The daemons' fence (their heartbeat TTL), in simulated milliseconds.
pub const FENCE_MS: u64 = 6_000;

/// Which store the cluster shares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StoreKind {
    Etcd,
    Kube,
}

/// How a run is set up.
#[derive(Clone, Debug)]
pub struct Options {
    /// What the daemons' jitter and ids follow from (the picks come from [`Choices`]).
    pub seed: u64,
    pub store: StoreKind,
    pub nodes: usize,
    /// The pool has IPv6 CIDRs too: each family's sources on their own.
    pub dual_stack: bool,
    /// Steps before the run winds down.
    pub steps: u64,
    /// Keeps a line per step for the report.
    pub trace: bool,
    /// The smallest cluster: a pool of two blocks.
    pub small: bool,
    /// The exhaustive walk's run: the cluster booted plainly (no picks), then `steps` steps
    /// of the small set of actions (see `actions::act_small`), every one a pick.
    pub exhaustive: bool,
    /// Closed paths to a duplicate put back for the run.
    pub bugs: Vec<Bug>,
    /// The pool sets [`SET_ASIDE`] aside (from the run's swarm, in a pool of more than two
    /// blocks).
    pub set_aside: bool,
    /// More nodes than the pool has blocks at first (its IPv4 blocks /27s: four), so that
    /// claims meet a dry pool, nodes wait for give-backs, and a block stranded shows as ADDs
    /// refused (issue 54, item 3).
    pub crowded: bool,
    /// The release of departed nodes is looked at as deploy/cluster-kubernetes's CronJob looks
    /// (`ipoolctl cluster release-departed`: no daemon of its own, `me = None`, the operator's
    /// identity), not by a leading daemon (issue 54, item 1).
    pub cronjob: bool,
    /// Nodes are labelled (a zone each), labels change, and the operator sets the pool's
    /// nodeSelector (`crate::labels`; issue 54, item 1).
    pub labels: bool,
    /// ipoold's pod GC checks now and then, pods' sandboxes end without a DEL, pods are
    /// force-deleted while their sandboxes run (`pod_gc`; issue 54, item 1).
    pub pod_gc: bool,
    /// In a run with the pod GC: a VM's launcher pod is force-deleted while its sandbox runs
    /// and KubeVirt makes the VM's instance again under its name (another uid), with a new
    /// launcher on a node it picks (`pod_gc::remake_vmi`; issue 54, item 1).
    pub remade_vmis: bool,
    /// The run's swarm may make races on purpose (`rivals`): in the seeds' groups of
    /// `search::options`, where no hunt of `cargo test` finds its path (the hunts' seeds run as
    /// they did).
    pub races: bool,
    /// In a run with races, a write parked for a rival provokes one at once (`provoke`), in
    /// the race groups of `search::options` that hold no kept run with races.
    pub provoke: bool,
    /// On etcd, with pins: the run is about restores from a backup that lacks the pin of a
    /// pod that moved since (`Swarm::focus_on_restores`; issue 53, item 4, issue 54, item 5),
    /// in a seeds' group of `search::options` that holds no kept run.
    pub moved_restores: bool,
    /// A condition of the stores' writes that the store ignores (`conditions`): what the
    /// simulation must find within its minute (issue 54, item 4).
    pub dropped: Option<String>,
}

impl Options {
    pub fn new(seed: u64, store: StoreKind) -> Options {
        Options {
            seed,
            store,
            nodes: 3,
            dual_stack: false,
            steps: 2000,
            trace: false,
            small: false,
            exhaustive: false,
            bugs: Vec::new(),
            set_aside: false,
            crowded: false,
            cronjob: false,
            labels: false,
            pod_gc: false,
            remade_vmis: false,
            races: false,
            provoke: false,
            moved_restores: false,
            dropped: None,
        }
    }

    /// The exhaustive walk's run on `store`: two nodes, a pool of two blocks, `depth` steps
    /// of the small set of actions.
    pub fn exhaustive(store: StoreKind, depth: u64) -> Options {
        let mut o = Options::new(0, store);
        o.nodes = 2;
        o.small = true;
        o.exhaustive = true;
        o.steps = depth;
        o
    }

    /// `[cluster]`'s numbers: short leases and resyncs, quick give-backs, so that blocks move
    /// (`resync_secs` and `claim_ahead` as the run's swarm says).
    /// The daemons watch the store when `watch` (half of the swarm's runs that choose).
    pub fn tuning(&self, resync_secs: u64, claim_ahead: u64, watch: bool) -> String {
        format!(
            "heartbeat_ttl_secs = 6\nresync_secs = {resync_secs}\nwatch = {watch}\nblock_hold_down_secs = 2\nclaim_ahead = {claim_ahead}\npin_ttl_secs = {PIN_TTL_SECS}\n"
        )
    }

    /// The IPv4 block size of the pool as first made: /28s (eight), /27s (four) in a crowded
    /// cluster.
    pub fn block_v4(&self) -> u8 {
        match self.crowded {
            true => 27,
            false => 28,
        }
    }

    /// The second pool (`Swarm::two_pools`): one small CIDR per family, blocks of /28.
    pub fn second_pool(&self) -> PoolSpec {
        let mut cidrs = vec!["10.71.0.0/27".parse().expect("a CIDR")];
        if self.dual_stack {
            cidrs.push("fd00:71::/123".parse().expect("a CIDR"));
        }
        PoolSpec {
            name: SECOND_POOL.into(),
            cidrs,
            block_v4: 28,
            block_v6: 124,
            ..PoolSpec::default()
        }
    }

    /// The pool, with IPv4 blocks of `block_v4`.
    pub fn pool(&self, block_v4: u8) -> PoolSpec {
        let mut cidrs = vec![if self.small {
            "10.70.0.0/27".parse().expect("a CIDR")
        } else {
            "10.70.0.0/25".parse().expect("a CIDR")
        }];
        if self.dual_stack {
            cidrs.push("fd00:70::/120".parse().expect("a CIDR"));
        }
        PoolSpec {
            name: POOL.into(),
            cidrs,
            block_v4,
            block_v6: 124,
            exclude: match self.set_aside {
                true => vec![SET_ASIDE.parse().expect("a CIDR")],
                false => Vec::new(),
            },
            ..PoolSpec::default()
        }
    }
}

/// What broke a run.
#[derive(Clone, Debug)]
pub struct Failure {
    pub step: u64,
    pub at_ms: u64,
    pub what: String,
}

/// What a run did.
#[derive(Clone, Debug)]
pub struct Outcome {
    pub steps: u64,
    /// Store requests the nodes and the operator sent.
    pub requests: u64,
    /// ADDs acknowledged.
    pub adds: u64,
    /// Events the store's watches sent to the nodes.
    pub heard: u64,
    /// Simulated milliseconds the run took.
    pub sim_ms: u64,
    pub failure: Option<Failure>,
    /// A line per step (with `trace`).
    pub trace: Vec<String>,
    /// The run's picks: `Choices::replay` of them runs it again.
    pub picks: Vec<u32>,
    /// How many options each pick had.
    pub options: Vec<u32>,
    /// The stores' conditions its writes met (`conditions`).
    pub conditions: std::collections::BTreeSet<String>,
    /// Writes whose condition [`Options::dropped`] was taken out.
    pub dropped_in: u64,
}

/// Runs one simulation with `choices`.
pub fn run(opts: &Options, choices: Choices) -> Outcome {
    driver::run(opts, choices)
}
