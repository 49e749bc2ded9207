//! Numbers for this process's writes, rising with each: the wall clock in nanoseconds when the
//! process took its first, then one more for each. A daemon started again starts past every
//! number it took before (its clock having moved on), so a number names one write of one
//! daemon, and of two writes of one process the later has the larger. Block writes and the
//! witness each draw from their own sequence.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

/// One sequence of write numbers.
pub(super) struct Numbers(OnceLock<AtomicU64>);

impl Numbers {
    pub(super) const fn new() -> Numbers {
        Numbers(OnceLock::new())
    }

    /// The next number (never 0).
    pub(super) fn next(&self) -> u64 {
        self.0
            .get_or_init(|| {
                let ns = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_nanos() as u64)
                    .unwrap_or(1);
                AtomicU64::new(ns.max(1))
            })
            .fetch_add(1, Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests;
