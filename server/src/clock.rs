//! Engine time: what cooldowns, reservation TTLs and timestamps are measured in.
//!
//! The wall clock can be stepped (NTP at boot, an operator, a VM resumed), and durations
//! measured on it break: a step forward of an hour ended a cooldown two seconds after the
//! release, a step of two years expired every reservation at once. So engine time is wall time
//! only once, when the daemon starts; from then on it advances with the machine's boot-time
//! clock (`CLOCK_BOOTTIME`: monotonic, and counting suspend), whatever the wall clock does.
//!
//! Deadlines survive restarts because the store keeps a [`ClockAnchor`]: where engine time
//! stood against the boot-time clock. A restart on the same boot continues exactly from it; a
//! restart after a reboot starts from the wall clock, but never below the anchor's engine time
//! or any time the store holds (a high-water mark: engine time never goes backwards).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::model::{ClockAnchor, Millis};

pub trait Clock: Send + Sync {
    /// Engine time now.
    fn now_ms(&self) -> Millis;
    /// Continues engine time from the store's `anchor` (start-up, before anything is served):
    /// never below `floor`, the newest time the store holds. Returns the anchor to store, if
    /// this clock keeps one.
    fn resume(
        &self,
        _anchor: Option<&ClockAnchor>,
        _floor: Millis,
        _boot_id: Option<&str>,
    ) -> Option<ClockAnchor> {
        None
    }
    /// Where engine time stands now, to store (a newer high-water mark).
    fn anchor(&self, _boot_id: Option<&str>) -> Option<ClockAnchor> {
        None
    }
}

fn wall_ms() -> Millis {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// Milliseconds since boot, suspend included.
fn boot_ms() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Boottime);
    u64::try_from(t.tv_sec).unwrap_or(0) * 1000 + u64::try_from(t.tv_nsec / 1_000_000).unwrap_or(0)
}

/// The daemon's clock (module docs).
#[derive(Debug)]
pub struct SystemClock {
    /// (engine time, boot time) at the base: engine time = base.0 + (boot time - base.1).
    base: Mutex<(Millis, u64)>,
}

impl Default for SystemClock {
    fn default() -> Self {
        SystemClock::new()
    }
}

impl SystemClock {
    /// Engine time starts at the wall clock (until [`Clock::resume`] continues a stored one).
    pub fn new() -> SystemClock {
        SystemClock {
            base: Mutex::new((wall_ms(), boot_ms())),
        }
    }

    fn base(&self) -> (Millis, u64) {
        *self.base.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Clock for SystemClock {
    fn now_ms(&self) -> Millis {
        let (engine, boot) = self.base();
        engine.saturating_add(boot_ms().saturating_sub(boot))
    }

    fn resume(
        &self,
        anchor: Option<&ClockAnchor>,
        floor: Millis,
        boot_id: Option<&str>,
    ) -> Option<ClockAnchor> {
        let boot_now = boot_ms();
        let engine_now = resumed_time(anchor, floor, boot_id, boot_now, wall_ms());
        *self.base.lock().unwrap_or_else(|p| p.into_inner()) = (engine_now, boot_now);
        boot_id.map(|id| ClockAnchor {
            boot_id: id.to_string(),
            boot_ms: boot_now,
            engine_ms: engine_now,
        })
    }

    fn anchor(&self, boot_id: Option<&str>) -> Option<ClockAnchor> {
        let (engine, boot) = self.base();
        let boot_now = boot_ms();
        boot_id.map(|id| ClockAnchor {
            boot_id: id.to_string(),
            boot_ms: boot_now,
            engine_ms: engine.saturating_add(boot_now.saturating_sub(boot)),
        })
    }
}

/// Engine time at a start (module docs): on the anchor's boot, the anchor continued by the
/// boot-time clock; else the wall clock; never below the anchor's engine time or `floor`.
pub fn resumed_time(
    anchor: Option<&ClockAnchor>,
    floor: Millis,
    boot_id: Option<&str>,
    boot_now: u64,
    wall_now: Millis,
) -> Millis {
    let high_water = anchor.map_or(0, |a| a.engine_ms).max(floor);
    match anchor {
        Some(a) if boot_id == Some(a.boot_id.as_str()) && a.boot_ms <= boot_now => a
            .engine_ms
            .saturating_add(boot_now - a.boot_ms)
            .max(high_water),
        _ => wall_now.max(high_water),
    }
}

/// A clock that moves only when told to.
#[derive(Debug, Default)]
pub struct ManualClock(AtomicU64);

impl ManualClock {
    pub fn new(start: Millis) -> ManualClock {
        ManualClock(AtomicU64::new(start))
    }
    pub fn advance(&self, ms: Millis) {
        self.0.fetch_add(ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> Millis {
        self.0.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests;
