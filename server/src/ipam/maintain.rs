//! The background loop: keeps each pool's idle set within [min_idle, max_idle], through the
//! source's token bucket. Woken after every change, and by a ticker.

use std::time::Duration;

use tokio::task::JoinHandle;

use super::Ipam;
use crate::store::Change;

/// How often the loop runs when nothing wakes it.
const TICK: Duration = Duration::from_secs(1);

impl Ipam {
    /// One pass over every pool. Returns how many addresses were fetched and given back.
    pub fn maintain(&self) -> Result<(usize, usize), crate::error::Error> {
        let mut guard = self.lock();
        let now = self.now();
        let mut changes = Vec::new();
        let (mut fetched, mut returned) = (Vec::new(), Vec::new());
        for (name, net) in guard.networks.iter_mut() {
            for (set, p) in net.pools.iter_mut().enumerate() {
                let work = p.pool.maintenance(now, p.factory.free() == 0);
                let cursor_before = p.factory.cursor();
                for _ in 0..work.fetch {
                    if p.bucket.try_take(now).is_err() {
                        break;
                    }
                    let Some(ip) = p.factory.allocate() else {
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

/// Runs [`Ipam::maintain`] until the handle is aborted (the server aborts it on shutdown).
pub fn spawn_maintenance(ipam: Ipam) -> JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            match ipam.maintain() {
                Ok((0, 0)) => {}
                Ok((fetched, returned)) => {
                    tracing::debug!(fetched, returned, "pools topped up / trimmed")
                }
                Err(e) => tracing::warn!(error = %e, "pool maintenance failed"),
            }
            tokio::select! {
                _ = ipam.shared.changed.notified() => {}
                _ = tokio::time::sleep(TICK) => {}
            }
        }
    })
}
