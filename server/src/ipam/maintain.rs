//! The background loop: ends reservations whose TTL passed, keeps each pool's idle set within
//! [min_idle, max_idle] through the source's token bucket, and (when configured) reclaims
//! attachments whose network namespace is gone. Woken after every change, and by a ticker.

use std::time::Duration;

use tokio::task::JoinHandle;

use super::{Ipam, LeakSuspects};
use crate::store::Change;

/// How often the loop runs when nothing wakes it.
const TICK: Duration = Duration::from_secs(1);

impl Ipam {
    /// One pass over every pool. Returns how many addresses were fetched and given back
    /// (after ending the reservations whose TTL passed).
    pub fn maintain(&self) -> Result<(usize, usize), crate::error::Error> {
        let mut guard = self.lock();
        let now = self.now();
        self.expire_reservations(&mut guard, now)?;
        let mut changes = Vec::new();
        let (mut fetched, mut returned) = (Vec::new(), Vec::new());
        for (name, net) in guard.networks.iter_mut() {
            for (set, p) in net.pools.iter_mut().enumerate() {
                let work = p.pool.maintenance(now, p.factory.free() == 0);
                let cursor_before = p.factory.cursor();
                for _ in 0..work.fetch {
                    if p.bucket.try_take(now).is_err() {
                        p.bucket_waits += 1;
                        break;
                    }
                    p.source_calls += 1;
                    let Some(ip) = p.factory.allocate() else {
                        p.source_errors += 1;
                        break;
                    };
                    if p.pool.receive(ip, 0).is_err() {
                        p.factory.release(ip);
                        break;
                    }
                    fetched.push((name.clone(), set, ip));
                    changes.push(Change::PutIdle {
                        network: name.clone(),
                        ip,
                        released_at: 0,
                    });
                }
                if p.factory.cursor() != cursor_before {
                    changes.push(Change::PutCursor {
                        network: name.clone(),
                        set,
                        cursor: p.factory.cursor(),
                    });
                }
                for ip in work.give_back {
                    if let Some(at) = p.pool.idle_since(ip) {
                        p.pool.give_back(ip);
                        p.factory.release(ip);
                        returned.push((name.clone(), set, ip, at));
                        changes.push(Change::DeleteIdle {
                            network: name.clone(),
                            ip,
                        });
                    }
                }
            }
        }
        if changes.is_empty() {
            return Ok((0, 0));
        }
        if let Err(e) = self.shared.store.apply(&changes) {
            // Undo in memory what could not be made durable.
            for (name, set, ip) in &fetched {
                if let Some(net) = guard.networks.get_mut(name) {
                    net.pools[*set].pool.give_back(*ip);
                    net.pools[*set].factory.release(*ip);
                }
            }
            for (name, set, ip, at) in &returned {
                if let Some(net) = guard.networks.get_mut(name) {
                    let p = &mut net.pools[*set];
                    if p.factory.occupy(*ip).is_ok() {
                        let _ = p.pool.receive(*ip, *at);
                    }
                }
            }
            return Err(e.into());
        }
        Ok((fetched.len(), returned.len()))
    }
}

/// Runs [`Ipam::maintain`] (and, every `[leak_check] interval_secs` unless 0, [`Ipam::leak_check`])
/// until the handle is aborted (the server aborts it on shutdown).
pub fn spawn_maintenance(ipam: Ipam) -> JoinHandle<()> {
    let leak_check = ipam.shared.leak_check;
    tokio::spawn(async move {
        let mut suspects = LeakSuspects::default();
        let mut next_leak_check = tokio::time::Instant::now();
        loop {
            match ipam.maintain() {
                Ok((0, 0)) => {}
                Ok((fetched, returned)) => {
                    tracing::debug!(fetched, returned, "pools topped up / trimmed")
                }
                Err(e) => tracing::warn!(error = %e, "pool maintenance failed"),
            }
            if !leak_check.is_zero() && tokio::time::Instant::now() >= next_leak_check {
                next_leak_check = tokio::time::Instant::now() + leak_check;
                if let Err(e) = ipam.leak_check(&mut suspects, leak_check).await {
                    tracing::warn!(error = %e, "leak check failed");
                }
            }
            // What the pass wrote becomes durable in the background (nobody waits for it).
            if let Err(e) = ipam.flush().await {
                tracing::warn!(error = %e, "flushing maintenance changes failed");
            }
            tokio::select! {
                _ = ipam.shared.changed.notified() => {}
                _ = tokio::time::sleep(TICK) => {}
            }
        }
    })
}
