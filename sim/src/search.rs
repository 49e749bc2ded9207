//! Runs by the many: a seed says everything about a run (its store, whether its pool is
//! dual-stack, every pick), so a failure is its seed, replayed exactly; [`search`] runs seeds
//! one after another within a budget; [`shrink`] cuts a failing run's picks down to the fewest
//! that still fail; [`exhaustive`] walks every schedule of the smallest cluster to a depth.

use std::time::{Duration, Instant};

use crate::choice::{next_prefix, Choices};
use crate::{run, Bug, Options, Outcome, StoreKind};

/// A run's set-up from its seed: the store (even seeds etcd, odd ones the Kubernetes API), a
/// dual-stack pool every other pair of seeds.
pub fn options(seed: u64, steps: u64, bugs: &[Bug]) -> Options {
    let store = match seed % 2 {
        0 => StoreKind::Etcd,
        _ => StoreKind::Kube,
    };
    let mut o = Options::new(seed, store);
    o.steps = steps;
    o.dual_stack = (seed / 2) % 2 == 1;
    o.bugs = bugs.to_vec();
    o
}

/// The run of `seed`.
pub fn run_seed(seed: u64, steps: u64, bugs: &[Bug], trace: bool) -> (Options, Outcome) {
    let mut o = options(seed, steps, bugs);
    o.trace = trace;
    let out = run(&o, Choices::seeded(seed));
    (o, out)
}

/// How far a search goes: whichever ends first.
#[derive(Clone, Copy, Debug)]
pub struct Budget {
    pub time: Duration,
    /// Steps over all runs.
    pub steps: u64,
}

/// What a search did.
#[derive(Debug, Default)]
pub struct Report {
    pub runs: u64,
    pub steps: u64,
    pub requests: u64,
    pub adds: u64,
    pub elapsed: Duration,
    /// The first failing run: its seed and outcome.
    pub failure: Option<(u64, Outcome)>,
}

/// Runs seeds `first`, `first + 1`, ... (`steps` steps each, `bugs` put back) until one fails
/// or the budget is spent.
pub fn search(first: u64, steps: u64, bugs: &[Bug], budget: Budget) -> Report {
    let t = Instant::now();
    let mut r = Report::default();
    let mut seed = first;
    while t.elapsed() < budget.time && r.steps < budget.steps {
        let (_, out) = run_seed(seed, steps, bugs, false);
        r.runs += 1;
        r.steps += out.steps;
        r.requests += out.requests;
        r.adds += out.adds;
        if out.failure.is_some() {
            r.failure = Some((seed, out));
            break;
        }
        seed += 1;
    }
    r.elapsed = t.elapsed();
    r
}

/// The fewest picks of `picks` that still make a run of `opts` fail, within `runs` runs.
pub fn shrink(opts: &Options, picks: Vec<u32>, runs: usize) -> Vec<u32> {
    crate::choice::shrink(
        picks,
        |p| run(opts, Choices::replay(p.to_vec())).failure.is_some(),
        runs,
    )
}

/// What the exhaustive walk did.
#[derive(Debug, Default)]
pub struct Walk {
    /// Schedules run (each from the start).
    pub schedules: u64,
    /// Every schedule of the first `depth` picks was run.
    pub complete: bool,
    pub depth: usize,
    pub elapsed: Duration,
    /// The first failing schedule's picks and outcome.
    pub failure: Option<(Vec<u32>, Outcome)>,
}

/// Every schedule of the smallest cluster (two nodes, a pool of two blocks, the small set of
/// actions: see `Options::exhaustive`) whose first `depth` picks differ, each run from the start
/// (as shuttle's depth-first scheduler and stateless model checkers do), with the checker after
/// every step; stops at a failure or when `time` is spent.
pub fn exhaustive(store: StoreKind, depth: usize, bugs: &[Bug], time: Duration) -> Walk {
    let t = Instant::now();
    let mut w = Walk {
        depth,
        ..Walk::default()
    };
    let mut o = Options::exhaustive(store, depth as u64);
    o.bugs = bugs.to_vec();
    let mut prefix = Vec::new();
    while t.elapsed() < time {
        let out = run(&o, Choices::depth_first(prefix.clone()));
        w.schedules += 1;
        if out.failure.is_some() {
            w.failure = Some((prefix, out));
            break;
        }
        let log: Vec<(u32, u32)> = out
            .picks
            .iter()
            .copied()
            .zip(out.options.iter().copied())
            .collect();
        match next_prefix(&log, depth) {
            Some(p) => prefix = p,
            None => {
                w.complete = true;
                break;
            }
        }
    }
    w.elapsed = t.elapsed();
    w
}
