//! Searches with one condition of the stores' writes dropped (`crate::conditions`): which
//! conditions a search meets, and how soon a run fails when one of them is dropped (issue 54,
//! item 4: within `cargo test`'s minute, for every one).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::search::options;
use crate::{run, Choices, StoreKind};

/// The store a condition's name belongs to: etcd's name the transaction (`... if ...`).
pub fn store_of(condition: &str) -> StoreKind {
    match condition.contains(" if ") {
        true => StoreKind::Etcd,
        false => StoreKind::Kube,
    }
}

/// The conditions the runs of seeds `first`, `first + 1`, ... met within `time`: how many
/// runs met each. Also the seeds run.
pub fn met(first: u64, steps: u64, time: Duration) -> (BTreeMap<String, u64>, u64) {
    let t = Instant::now();
    let mut seen = BTreeMap::new();
    let mut seed = first;
    while t.elapsed() < time {
        let out = run(&options(seed, steps, &[]), Choices::seeded(seed));
        for c in out.conditions {
            *seen.entry(c).or_insert(0) += 1;
        }
        seed += 1;
    }
    (seen, seed - first)
}

/// A search with one condition dropped.
#[derive(Debug)]
pub struct Hunt {
    pub condition: String,
    /// The seed whose run failed, the step, and what failed.
    pub found: Option<(u64, u64, String)>,
    /// Runs made, and runs in which a write had the condition taken out.
    pub runs: u64,
    pub dropped_in: u64,
    pub elapsed: Duration,
}

/// Which seeds a hunt runs: all, or only those whose runs may provoke rivals
/// (`crate::provoke`) and whose setup exercises the condition (races on; pins on, for a pin's),
/// provoking them or (to measure what provoking adds) waiting for them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Seeds {
    All,
    Provoking,
    ProvokingWaited,
}

/// Whether seed `seed`'s run (races allowed by its options or not: `races`) can exercise
/// `condition`: its setup makes races, and, for a condition of pins, pins (and addresses set
/// aside, for theirs). Read from the setup's picks alone, so that a seed found replays as
/// any other (`ipool-sim replay SEED --condition ...`).
fn exercises(condition: &str, races: bool, seed: u64) -> bool {
    let mut c = Choices::seeded(seed);
    c.frame();
    let sw = crate::swarm::Swarm::pick(&mut c);
    let pins = condition.contains("pin") || condition.contains("set-aside");
    races && sw.races && (!pins || sw.pins) && (!condition.contains("set-aside") || sw.set_aside)
}

/// Runs the `seeds` from `first` of `condition`'s store with it dropped, until one fails or
/// `time` is spent.
pub fn hunt(condition: &str, first: u64, steps: u64, time: Duration, seeds: Seeds) -> Hunt {
    let t = Instant::now();
    let store = store_of(condition);
    let mut h = Hunt {
        condition: condition.to_string(),
        found: None,
        runs: 0,
        dropped_in: 0,
        elapsed: Duration::ZERO,
    };
    let mut seed = first;
    while t.elapsed() < time {
        let mut o = options(seed, steps, &[]);
        let skip = match seeds {
            Seeds::All => false,
            _ => !o.provoke || !exercises(condition, o.races, seed),
        };
        if o.store != store || skip {
            seed += 1;
            continue;
        }
        o.dropped = Some(condition.to_string());
        o.provoke &= seeds != Seeds::ProvokingWaited;
        let out = run(&o, Choices::seeded(seed));
        h.runs += 1;
        h.dropped_in += u64::from(out.dropped_in > 0);
        if let Some(f) = out.failure {
            h.found = Some((seed, f.step, f.what));
            break;
        }
        seed += 1;
    }
    h.elapsed = t.elapsed();
    h
}
