//! The simulation's row of docs/performance.md (`ipool-sim bench`): how fast it runs cluster
//! mode's real code on one core (simulated store requests a minute; the goal is at least
//! 1 000 000), and how far its exhaustive walk of the smallest cluster gets. `ipool-bench`
//! runs it as a program of its own, so that the binaries it measures are built without the
//! simulation's switches.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::search::{self, Budget};
use crate::StoreKind;

/// Searches seeds for `secs` seconds on this thread, then walks the smallest cluster to
/// `depth` on both stores (each walk at most `secs` seconds, at least 10). An error: the
/// simulation found an address on two pods (its explanation).
pub fn run(secs: u64, depth: usize, progress: impl Fn(&str)) -> Result<Value, String> {
    progress(&format!("the simulation: {secs} s of seeds on one core"));
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
        return Err(format!(
            "the simulation failed: {}",
            search::explain(*seed, 5000, &[], 100)
        ));
    }
    let mut walks = Vec::new();
    for store in [StoreKind::Etcd, StoreKind::Kube] {
        progress(&format!(
            "the simulation: every schedule of the smallest cluster to depth {depth} ({store:?})"
        ));
        let t = Instant::now();
        let w = search::exhaustive(store, depth, &[], Duration::from_secs(secs.max(10)));
        if let Some((picks, out)) = w.failure {
            return Err(format!(
                "the exhaustive walk failed at {picks:?}: {:?}",
                out.failure
            ));
        }
        walks.push(json!({
            "store": format!("{store:?}"), "depth": depth, "schedules": w.schedules,
            "seconds": t.elapsed().as_secs_f64(), "complete": w.complete,
        }));
    }
    let seconds = r.elapsed.as_secs_f64();
    Ok(json!({
        "runs": r.runs,
        "steps": r.steps,
        "requests": r.requests,
        "adds": r.adds,
        "seconds": seconds,
        "requests_per_minute": r.requests as f64 / seconds.max(1e-9) * 60.0,
        "walks": walks,
    }))
}
