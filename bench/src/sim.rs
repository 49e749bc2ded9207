//! The deterministic simulation's row (ipool-sim, issue 37): how fast it runs cluster mode's
//! real code on one core (simulated store requests a minute; the goal is at least 1 000 000),
//! and how far its exhaustive walk of the smallest cluster gets.

use std::fmt::Write;
use std::time::{Duration, Instant};

use ipool_sim::search::{self, Budget};
use ipool_sim::StoreKind;
use serde_json::{json, Value};

pub struct Sim {
    pub runs: u64,
    pub steps: u64,
    pub requests: u64,
    pub adds: u64,
    pub elapsed: Duration,
    /// The exhaustive walk: store, depth, schedules, time, every one walked.
    pub walks: Vec<(StoreKind, usize, u64, Duration, bool)>,
}

impl Sim {
    fn per_minute(&self) -> f64 {
        self.requests as f64 / self.elapsed.as_secs_f64().max(1e-9) * 60.0
    }

    pub fn markdown(&self, o: &mut String) {
        let _ = writeln!(
            o,
            "\n## Deterministic simulation of cluster mode (ipool-sim, one core)\n"
        );
        let _ = writeln!(
            o,
            "| runs | steps | simulated store requests | ADDs acknowledged | time | store requests a minute |\n|---|---|---|---|---|---|"
        );
        let _ = writeln!(
            o,
            "| {} | {} | {} | {} | {:.1} s | {:.0} |",
            self.runs,
            self.steps,
            self.requests,
            self.adds,
            self.elapsed.as_secs_f64(),
            self.per_minute()
        );
        let _ = writeln!(
            o,
            "\n| exhaustive walk | depth | schedules | time | every one |\n|---|---|---|---|---|"
        );
        for (store, depth, n, t, all) in &self.walks {
            let _ = writeln!(
                o,
                "| {store:?} | {depth} | {n} | {:.1} s | {} |",
                t.as_secs_f64(),
                if *all { "yes" } else { "no (out of time)" }
            );
        }
    }

    pub fn json(&self) -> Value {
        json!({
            "runs": self.runs,
            "steps": self.steps,
            "requests": self.requests,
            "adds": self.adds,
            "seconds": self.elapsed.as_secs_f64(),
            "requests_per_minute": self.per_minute(),
            "walks": self.walks.iter().map(|(s, d, n, t, all)| json!({
                "store": format!("{s:?}"), "depth": d, "schedules": n,
                "seconds": t.as_secs_f64(), "complete": all,
            })).collect::<Vec<_>>(),
        })
    }
}

/// Searches seeds for `secs` seconds on this thread, then walks the smallest cluster to
/// `depth` on both stores (each walk at most `secs` seconds). A failure is an error: the
/// simulation found an address on two pods.
pub fn run(secs: u64, depth: usize) -> anyhow::Result<Sim> {
    progress!("the simulation: {secs} s of seeds on one core");
    let r = search::search(
        0,
        5000,
        &[],
        Budget {
            time: Duration::from_secs(secs),
            steps: u64::MAX,
        },
    );
    if let Some((seed, _)) = &r.failure {
        anyhow::bail!(
            "the simulation failed: {}",
            search::explain(*seed, 5000, &[], 100)
        );
    }
    let mut walks = Vec::new();
    for store in [StoreKind::Etcd, StoreKind::Kube] {
        progress!(
            "the simulation: every schedule of the smallest cluster to depth {depth} ({store:?})"
        );
        let t = Instant::now();
        let w = search::exhaustive(store, depth, &[], Duration::from_secs(secs.max(10)));
        if let Some((picks, out)) = w.failure {
            anyhow::bail!("the exhaustive walk failed at {picks:?}: {:?}", out.failure);
        }
        walks.push((store, depth, w.schedules, t.elapsed(), w.complete));
    }
    Ok(Sim {
        runs: r.runs,
        steps: r.steps,
        requests: r.requests,
        adds: r.adds,
        elapsed: r.elapsed,
        walks,
    })
}
