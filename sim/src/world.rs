//! A simulated cluster and its run: the store, the network, the nodes' daemons, the operator,
//! the checker; one thread, simulated time, every decision a pick of [`Choices`].
//!
//! Each step the driver takes one action (most often: deliver a request on its way), then lets
//! every task run until all wait (on the network, on a timer), moving simulated time by a
//! millisecond or by what the action said; then what finished is checked.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ipool_server::store::MemStore;
use tokio::time::Instant;

use crate::check::Checker;
use crate::choice::Choices;
use crate::commands::Op;
use crate::daemon::{Daemon, Done, Setting, Wall};
use crate::net::{Back, Net};
use crate::seen::Snapshot;
use crate::store::Shared;
use crate::{Failure, Options, Outcome};

/// A daemon's place: a node name and a state dir, its daemon running or not.
pub(crate) struct Slot {
    pub name: String,
    pub disk: Arc<MemStore>,
    /// Its instance (a new state dir is a new one).
    pub instance: u64,
    pub daemon: Option<Daemon>,
    /// Its daemon's config names the network [`crate::daemon::RENAMED`] (`Swarm::renames`).
    pub renamed: bool,
    /// The slot it doubles (a second daemon under that node's name), if it is a twin.
    pub twin_of: Option<usize>,
    /// Its node is gone (wiped, stopped): release-node may give its blocks back.
    pub gone: bool,
    /// When (ms) the store last applied a renewal (or a taking) of its node name by this
    /// slot's daemons.
    pub renewed_at: Option<u64>,
    /// Every renewal its daemons made that they heard of (simulated ms), oldest first.
    pub renewals: Vec<u64>,
    /// Its daemon holds its node name in the store (as last tracked), and the syncs it had
    /// taken in when it took the name (per pool and family, `World::pool_sync_counts`).
    pub holding: bool,
    pub took_name: Option<[u64; 4]>,
    /// Its blocks as the trace last showed them.
    pub blocks_seen: Option<String>,
    /// A release-node's excuse of its pods was noted (once).
    pub excused_release: bool,
    /// etcd was restored from a backup and this incarnation has not heard etcd since.
    pub unaware: bool,
    /// When (ms) it last heard etcd after not having heard it since a restore (or started).
    pub aware_at: Option<u64>,
    /// Its writes that landed on etcd, their answers heard: the revision each landed at, and
    /// when (ms) it was answered (since the last restore).
    pub written: Vec<(u64, u64)>,
    /// Those of them the last restore lost (landed after its backup).
    pub lost_writes: Vec<(u64, u64)>,
    /// Since when (ms) its daemon serves without a break, if it does.
    pub serving_since: Option<u64>,
    /// Per family (IPv4, IPv6): its syncs so far, and when (ms) the count last moved.
    pub syncs: [(u64, u64); 2],
    /// When (ms) one of its store requests last failed, was lost, dropped, refused, or
    /// answered after its caller gave up.
    pub trouble_at: u64,
    /// Per family: troubles since its last sync (each may have doubled a backoff).
    pub streak: [u32; 2],
}

impl Slot {
    pub fn new(name: String, disk: Arc<MemStore>, instance: u64, twin_of: Option<usize>) -> Slot {
        Slot {
            name,
            disk,
            instance,
            daemon: None,
            renamed: false,
            twin_of,
            gone: false,
            excused_release: false,
            blocks_seen: None,
            renewed_at: None,
            renewals: Vec::new(),
            holding: false,
            took_name: None,
            unaware: false,
            written: Vec::new(),
            lost_writes: Vec::new(),
            aware_at: None,
            serving_since: None,
            syncs: [(0, 0); 2],
            trouble_at: 0,
            streak: [0; 2],
        }
    }

    /// Trouble with the store at `at` (ms).
    pub fn trouble(&mut self, at: u64) {
        self.trouble_at = self.trouble_at.max(at);
        for s in self.streak.iter_mut() {
            *s += 1;
        }
    }

    /// Its daemon's instance id.
    pub fn instance_id(&self) -> String {
        format!("{}-i{}", self.name, self.instance)
    }
}

/// A window in which a node may still hand out from blocks `release-node --force` took from
/// it: until a sync started after the release has been taken in, for each family.
pub(crate) struct Forced {
    pub slot: usize,
    /// The incarnation it applies to (a restarted daemon syncs before it serves).
    pub daemon: u64,
    /// The sync counts (per pool and family, `World::pool_sync_counts`) that close it; None
    /// while the release runs.
    pub until: Option<[u64; 4]>,
}

/// Who changed the store when etcd was restored from a backup.
pub(crate) const RESTORE: &str = "etcd's restore";

pub(crate) struct World {
    pub opts: Options,
    pub choices: Choices,
    /// What this run may do.
    pub swarm: crate::swarm::Swarm,
    pub net: Net,
    pub shared: Shared,
    pub wall: Wall,
    pub setting: Setting,
    pub slots: Vec<Slot>,
    pub done: Arc<Mutex<Vec<Done>>>,
    /// The operators' commands: under way, done, and what they were told.
    pub operator: crate::commands::Operators,
    pub limbo: Vec<tokio::sync::oneshot::Sender<Back>>,
    pub checker: Checker,
    pub trace: Vec<String>,
    pub step: u64,
    pub started: Instant,
    pub next_daemon: u64,
    /// The kubelets' ADDs and DELs: on their way, owed, refused.
    pub kubelet: crate::kubelet::Kubelet,
    /// The store as the checker last saw it, and as it was before.
    pub seen: crate::seen::Seen,
    pub forced: Vec<Forced>,
    /// The stores gone back in time: etcd restored from a backup, the apiserver's clock.
    pub resets: crate::resets::Resets,
    /// Blocks a daemon's watch told it are no longer its node's (see `crate::hearing`).
    pub heard_gone: Vec<crate::watch::HeardGone>,
    /// Events the watches heard.
    pub heard: u64,
    /// Owners of fixed addresses that are gone (deleted, scaled down), and why.
    pub owners_gone: BTreeMap<String, String>,
    /// Each node's zone as the run changed it (`crate::labels`; the first zones otherwise).
    pub zones: BTreeMap<String, &'static str>,
    /// The nodes whose Node object is deleted while their machine runs (`crate::nodes`).
    pub nodes_deleted: std::collections::BTreeSet<String>,
    /// While the quiet period watches for them: the writes delivered, renewals aside.
    pub idle_writes: Option<Vec<String>>,
    /// The stores' conditions met, and the one dropped (`crate::conditions`).
    pub conditions: crate::conditions::Conditions,
    /// The pods as the apiserver and the runtimes have them (`crate::pod_gc`).
    pub pod_gc: crate::pod_gc::state::PodGc,
}

impl World {
    pub fn new(mut opts: Options, mut choices: Choices) -> World {
        let swarm = match opts.exhaustive {
            true => crate::swarm::Swarm::all(),
            false => {
                choices.frame();
                let mut sw = crate::swarm::Swarm::pick(&mut choices);
                choices.end_frame(crate::choice::SETUP);
                sw.races &= opts.races;
                if opts.moved_restores {
                    sw.focus_on_restores();
                }
                // With pins on etcd: restores made on purpose (`operator::backup_or_restore`),
                // five times as often.
                let on_purpose = sw.races && sw.pins && opts.store == crate::StoreKind::Etcd;
                sw.weights
                    .iter_mut()
                    .filter(|(k, _)| on_purpose && *k == crate::swarm::Kind::Restore)
                    .for_each(|(_, w)| *w *= 5);
                if opts.labels {
                    sw.weights.push((crate::swarm::Kind::Labels, 6));
                }
                if opts.cronjob {
                    sw.weights.push((crate::swarm::Kind::NodeObject, 3));
                }
                if opts.pod_gc {
                    sw.weights.push((crate::swarm::Kind::PodGc, 12));
                }
                sw
            }
        };
        opts.set_aside = swarm.set_aside && !opts.small;
        let wall = Wall::new(1_800_000_000_000);
        let w2 = wall.clone();
        ipool_server::cluster::vocab::set_wall_clock(Some(Box::new(move || w2.now_ms())));
        ipool_server::cluster::seed_jitter(opts.seed);
        let setting = Setting {
            store: opts.store,
            pool: crate::POOL.into(),
            second_pool: swarm.two_pools.then(|| crate::SECOND_POOL.to_string()),
            subnet: swarm.subnet,
            pins: swarm.pins,
            set_aside: opts.set_aside,
            node_prefix: match opts.cronjob {
                true => "k8s-",
                false => "",
            },
            tuning: opts.tuning(swarm.resync_secs, swarm.claim_ahead, swarm.watch),
            timeout: Duration::from_millis(500),
        };
        let id = 0xc1u64 << 32 | opts.seed & 0xffff_ffff;
        let mut shared = Shared::new(opts.store, id, swarm.watch);
        let dropped = opts.dropped.clone();
        shared.seed_pool(&opts.pool(opts.block_v4()), wall.now_ms());
        if swarm.two_pools {
            shared.seed_pool(&opts.second_pool(), wall.now_ms());
        }
        let slots = (0..opts.nodes)
            .map(|i| Slot::new(format!("n{i}"), Arc::new(MemStore::new()), 1, None))
            .collect();
        let mut w = World {
            opts,
            choices,
            swarm,
            net: Net::default(),
            shared,
            wall,
            setting,
            slots,
            done: Arc::default(),
            operator: crate::commands::Operators::default(),
            limbo: Vec::new(),
            checker: Checker::default(),
            trace: Vec::new(),
            step: 0,
            started: Instant::now(),
            kubelet: crate::kubelet::Kubelet::default(),
            next_daemon: 0,
            seen: Default::default(),
            forced: Vec::new(),
            resets: crate::resets::Resets::default(),
            heard_gone: Vec::new(),
            heard: 0,
            zones: BTreeMap::new(),
            nodes_deleted: Default::default(),
            owners_gone: BTreeMap::new(),
            idle_writes: None,
            conditions: crate::conditions::Conditions {
                dropped,
                ..Default::default()
            },
            pod_gc: Default::default(),
        };
        w.seen.blocks = w.shared.blocks();
        w.seen.version = w.shared.version();
        w.snapshot();
        w
    }

    /// Keeps the store as it is now.
    pub fn snapshot(&mut self) {
        let shared = &self.shared;
        self.seen.keep(Snapshot {
            at: Instant::now(),
            blocks: self.seen.blocks.clone(),
            holders: shared.holders(),
            pool_revisions: shared.pool_revisions(),
            pool_cidrs: shared.pool_cidrs(),
        });
    }

    /// The store as it was at `t` (the oldest kept, if `t` is older).
    pub fn snapshot_at(&self, t: Instant) -> &Snapshot {
        self.seen.at(t)
    }

    /// Simulated milliseconds since the start.
    pub fn ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    pub fn note(&mut self, what: String) {
        if self.opts.trace {
            let line = format!("{:>6} {:>8}ms {what}", self.step, self.ms());
            self.trace.push(line);
        }
    }

    /// With a trace: each daemon's blocks, as `ipoolctl status` shows them, when they change.
    pub(crate) fn trace_blocks(&mut self) {
        for i in 0..self.slots.len() {
            let Some(d) = &self.slots[i].daemon else {
                continue;
            };
            let now: Vec<String> = d
                .detail()
                .iter()
                .map(|l| l.split("; ").next().unwrap_or_default().to_string())
                .collect();
            let resets = d.node.metrics().cluster.store_resets.get();
            let line = format!(
                "{} (slot {i}): {}{}",
                self.slots[i].name,
                now.join(" | "),
                match resets {
                    0 => String::new(),
                    n => format!(" ({n} etcd reset(s) seen)"),
                }
            );
            if self.slots[i].blocks_seen.as_ref() != Some(&line) {
                self.slots[i].blocks_seen = Some(line.clone());
                self.note(line);
            }
        }
    }

    /// Starts an operator's command: its number.
    pub fn command(&mut self, op: Op) -> usize {
        self.operator.seq += 1;
        self.operator.commands.insert(self.operator.seq, op.clone());
        self.operator.running = Some(op);
        self.operator.seq
    }

    /// Starts a second operator's pool command beside the one under way: its number.
    pub fn second_command(&mut self) -> usize {
        self.operator.seq += 1;
        self.operator.commands.insert(
            self.operator.seq,
            Op {
                forced: false,
                release_of: None,
                departed: false,
            },
        );
        self.operator.second = true;
        self.operator.seq
    }

    /// An operator's command is under way (a second operator's too).
    pub fn operating(&self) -> bool {
        self.operator.running.is_some() || self.operator.second
    }

    pub fn failure(&self, what: String) -> Failure {
        Failure {
            step: self.step,
            at_ms: self.ms(),
            what,
        }
    }

    pub fn outcome(&self, failure: Option<Failure>) -> Outcome {
        Outcome {
            steps: self.step,
            requests: self.net.sent(),
            adds: self.kubelet.adds_ok,
            heard: self.heard,
            sim_ms: self.ms(),
            failure,
            trace: self.trace.clone(),
            picks: self.choices.picks(),
            options: self.choices.log.iter().map(|(_, n)| *n).collect(),
            conditions: self.conditions.met.clone(),
            dropped_in: self.conditions.dropped_in,
        }
    }
}
