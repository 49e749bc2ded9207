//! Runs by the many: a seed says everything about a run (its store, whether its pool is
//! dual-stack, every pick), so a failure is its seed, replayed exactly; [`search`] runs seeds
//! one after another within a budget; [`shrink`] cuts a failing run's picks down to the fewest
//! that still fail; [`exhaustive`] walks every schedule of the smallest cluster to a depth.

use std::time::{Duration, Instant};

use crate::choice::{next_prefix, Choices};
use crate::{run, Bug, Options, Outcome, StoreKind};

/// A run's set-up from its seed: the store (even seeds etcd, odd ones the Kubernetes API), a
/// dual-stack pool every other pair of seeds, and a crowded cluster in one group of four seeds
/// in sixteen (28 to 31, 92 to 95, ...: none of the kept runs' seeds): five to eight nodes,
/// by the group, over a pool of fewer blocks than nodes ([`Options::crowded`]); in another
/// (40 to 43, 104 to 107, ...: none of the kept runs' seeds either) the release of departed
/// nodes is the CronJob's ([`Options::cronjob`]), and in half of those (40 to 43, 168 to 171,
/// ...) nodes are labelled and the pool gets a nodeSelector ([`Options::labels`]); in six
/// groups the swarm may make races on purpose ([`Options::races`]); in half of three of those
/// the pod GC checks and pods end without a DEL ([`Options::pod_gc`]), and in half of those
/// VMs' instances are made again under their names ([`Options::remade_vmis`]); in the first
/// quarter of group 15 on etcd (no pod GC there, no kept run before) the runs are about
/// restores that lose a moved pod's pin ([`Options::moved_restores`]).
pub fn options(seed: u64, steps: u64, bugs: &[Bug]) -> Options {
    let store = match seed % 2 {
        0 => StoreKind::Etcd,
        _ => StoreKind::Kube,
    };
    let mut o = Options::new(seed, store);
    o.steps = steps;
    o.dual_stack = (seed / 2) % 2 == 1;
    if (seed / 4) % 16 == 7 {
        o.crowded = true;
        o.nodes = 5 + (seed / 64 % 4) as usize;
    }
    o.cronjob = (seed / 4) % 16 == 10;
    o.labels = o.cronjob && (seed / 64).is_multiple_of(2);
    // The pod GC and the runtime's part in half of groups 6, 7 and 15 (those of the kept
    // runs replay as they were kept: none is of these halves).
    o.pod_gc = matches!((seed / 4) % 16, 6 | 7 | 15) && matches!((seed / 64) % 4, 1 | 2);
    // VM instances made again in half of those (the kept run with the pod GC, seed 856, is
    // not of this half).
    o.remade_vmis = o.pod_gc && (seed / 256).is_multiple_of(2);
    // Races made on purpose where the swarm picks them (a quarter of these groups' runs):
    // groups 3, 4, 6, 7 (crowded), 10 (the CronJob's) and 15, in which no hunt of `cargo
    // test` finds its closed path, so the hunts' seeds run as they did before races were made.
    o.races = matches!((seed / 4) % 16, 3 | 4 | 6 | 7 | 10 | 15);
    // Rivals provoked, not waited for, in those groups but 3 and 10, whose kept runs with
    // races replay as they were kept.
    o.provoke = matches!((seed / 4) % 16, 4 | 6 | 7 | 15);
    // Restores that lose a moved pod's pin, on etcd, in the first quarter of group 15 (no
    // pod GC there, and no kept run).
    o.moved_restores =
        store == StoreKind::Etcd && (seed / 4) % 16 == 15 && (seed / 64).is_multiple_of(4);
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
    search_where(first, steps, bugs, budget, |_| true)
}

/// [`search`] over the seeds whose set-up `wanted` says (the others passed over).
pub fn search_where(
    first: u64,
    steps: u64,
    bugs: &[Bug],
    budget: Budget,
    wanted: impl Fn(&Options) -> bool,
) -> Report {
    let t = Instant::now();
    let mut r = Report::default();
    let mut seed = first;
    while t.elapsed() < budget.time && r.steps < budget.steps {
        if !wanted(&options(seed, steps, bugs)) {
            seed += 1;
            continue;
        }
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
    crate::choice::shrink_steps(
        picks,
        crate::choice::SETUP,
        crate::choice::STEP,
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

/// A search's numbers in a line.
pub fn summary(r: &Report) -> String {
    let mins = r.elapsed.as_secs_f64().max(1e-9) / 60.0;
    format!(
        "{} runs, {} steps, {} simulated store requests ({:.0} a minute), {} ADDs acknowledged, in {:.1} s{}",
        r.runs,
        r.steps,
        r.requests,
        r.requests as f64 / mins,
        r.adds,
        r.elapsed.as_secs_f64(),
        match &r.failure {
            None => ": no failure".to_string(),
            Some((seed, out)) => format!(
                ": seed {seed} FAILED at step {}: {}",
                out.failure.as_ref().map_or(0, |f| f.step),
                out.failure.as_ref().map_or("", |f| f.what.as_str())
            ),
        }
    )
}

/// A failing seed explained: how to replay it, its picks shrunk (within `runs` runs), and the
/// end of the shrunk run's trace.
pub fn explain(seed: u64, steps: u64, bugs: &[Bug], runs: usize) -> String {
    let (o, out) = run_seed(seed, steps, bugs, false);
    let mut s = String::new();
    let Some(f) = &out.failure else {
        return format!("seed {seed} does not fail when run again: the simulation is not deterministic (a bug of its own)\n");
    };
    s.push_str(&format!(
        "seed {seed} ({:?}, dual-stack {}) fails at step {}: {}\nreplay it: IPOOL_SIM_SEED={seed} cargo test -p ipool-sim --test simulation -- --nocapture\n   or: cargo run --release -p ipool-sim -- replay {seed}\n",
        o.store, o.dual_stack, f.step, f.what
    ));
    let small = shrink(&o, out.picks.clone(), runs);
    let mut traced = o.clone();
    traced.trace = true;
    let again = run(&traced, Choices::replay(small.clone()));
    s.push_str(&format!(
        "shrunk from {} picks to {} ({} steps): {:?}\n",
        out.picks.len(),
        small.len(),
        again.steps,
        again.failure.as_ref().map(|f| &f.what)
    ));
    for l in again
        .trace
        .iter()
        .skip(again.trace.len().saturating_sub(80))
    {
        s.push_str(l);
        s.push('\n');
    }
    s
}

/// What hunting a closed path came to.
#[derive(Debug)]
pub struct Hunt {
    pub bug: Bug,
    /// The seed that found it, the step it failed at, and the run's picks.
    pub found: Option<(u64, u64, Vec<u32>)>,
    /// Steps run over all seeds until then.
    pub steps: u64,
    pub elapsed: Duration,
}

/// Puts `bug` back and searches from seed 0 (`steps` a run) until a run fails, within
/// `max_steps` steps in all.
pub fn hunt(bug: Bug, steps: u64, max_steps: u64) -> Hunt {
    let r = search(
        0,
        steps,
        &[bug],
        Budget {
            time: Duration::from_secs(3600),
            steps: max_steps,
        },
    );
    Hunt {
        bug,
        found: r.failure.map(|(seed, out)| {
            let step = out.failure.as_ref().map_or(0, |f| f.step);
            (seed, step, out.picks)
        }),
        steps: r.steps,
        elapsed: r.elapsed,
    }
}

/// A failing run kept as a regression trace: its seed (its set-up) and its shrunk picks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Kept {
    pub seed: u64,
    pub picks: Vec<u32>,
}

impl Kept {
    /// `seed N` and `picks ...`, a run of zeros written `0*count`.
    pub fn to_text(&self) -> String {
        let mut words = Vec::new();
        let mut i = 0;
        while i < self.picks.len() {
            let zeros = self.picks[i..].iter().take_while(|p| **p == 0).count();
            match zeros {
                0 => {
                    words.push(self.picks[i].to_string());
                    i += 1;
                }
                1 => {
                    words.push("0".into());
                    i += 1;
                }
                n => {
                    words.push(format!("0*{n}"));
                    i += n;
                }
            }
        }
        format!("seed {}\npicks {}\n", self.seed, words.join(" "))
    }

    pub fn parse(text: &str) -> Result<Kept, String> {
        let mut seed = None;
        let mut picks = None;
        for line in text.lines() {
            match line.split_once(' ') {
                Some(("seed", v)) => {
                    seed = Some(v.trim().parse().map_err(|_| format!("seed {v:?}"))?)
                }
                Some(("picks", v)) => {
                    let mut out = Vec::new();
                    for w in v.split_whitespace() {
                        match w.split_once('*') {
                            Some(("0", n)) => {
                                let n: usize = n.parse().map_err(|_| format!("zeros {w:?}"))?;
                                out.extend(std::iter::repeat_n(0, n));
                            }
                            _ => out.push(w.parse().map_err(|_| format!("pick {w:?}"))?),
                        }
                    }
                    picks = Some(out);
                }
                _ if line.trim().is_empty() => {}
                _ => return Err(format!("a line of neither seed nor picks: {line:?}")),
            }
        }
        Ok(Kept {
            seed: seed.ok_or("no seed line")?,
            picks: picks.ok_or("no picks line")?,
        })
    }
}
