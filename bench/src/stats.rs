//! Percentiles of a set of latency samples (nearest rank on the sorted samples).

use std::time::Duration;

/// p50/p90/p99 and friends of a set of samples, in milliseconds.
#[derive(Clone, Copy, Debug, Default)]
pub struct Summary {
    pub n: usize,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub mean: f64,
    pub max: f64,
}

impl Summary {
    pub fn of(samples: &[Duration]) -> Summary {
        let mut ms: Vec<f64> = samples.iter().map(|d| d.as_secs_f64() * 1e3).collect();
        ms.sort_by(f64::total_cmp);
        if ms.is_empty() {
            return Summary::default();
        }
        Summary {
            n: ms.len(),
            p50: percentile(&ms, 50.0),
            p90: percentile(&ms, 90.0),
            p99: percentile(&ms, 99.0),
            mean: ms.iter().sum::<f64>() / ms.len() as f64,
            max: ms[ms.len() - 1],
        }
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "n": self.n,
            "p50_ms": self.p50,
            "p90_ms": self.p90,
            "p99_ms": self.p99,
            "mean_ms": self.mean,
            "max_ms": self.max,
        })
    }
}

/// The nearest-rank percentile `p` (0-100] of `sorted`, which must be sorted and non-empty.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    let rank = (p / 100.0 * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Samples as whole microseconds, for the JSON file.
pub fn micros(samples: &[Duration]) -> Vec<u64> {
    samples
        .iter()
        .map(|d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
        .collect()
}
