//! The background loop: ends reservations whose TTL passed, drops retiring range sets that hold
//! nothing any more, starts the claims sources want (ahead of need), keeps each pool's idle set
//! within [min_idle, max_idle] through the source's token bucket (and without the idle
//! addresses its source withholds now: a block another node owns), (when configured) reclaims
//! attachments whose network namespace is gone, and records the clock's high-water mark.
//! After a store failure it reopens the store instead, until that succeeds. Woken after every
//! change, and by a ticker.

use std::net::IpAddr;
use std::time::Duration;

use tokio::task::JoinHandle;

use super::{Ipam, LeakSuspects};
use crate::pool::Since;
use crate::source::Next;
use crate::store::Change;

/// How often the loop runs when nothing wakes it.
const TICK: Duration = Duration::from_secs(1);
/// How often the clock's anchor is stored (the high-water mark a start after a reboot keeps
/// engine time above).
const CLOCK_EVERY: Duration = Duration::from_secs(60);
/// The first wait before reopening a failed store, and the longest (it doubles in between).
const REOPEN_FIRST: Duration = Duration::from_secs(1);
const REOPEN_MAX: Duration = Duration::from_secs(30);

/// What one pool's maintenance does: fetch from the source into idle, give idle back.
struct Work {
    network: String,
    set: usize,
    set_id: String,
    fetch: Vec<IpAddr>,
    /// The blocks `fetch` is the first use of.
    blocks: Vec<Change>,
    give_back: Vec<IpAddr>,
}

impl Ipam {
    /// One pass over every pool, durable when it returns. Returns how many addresses were
    /// fetched and given back (after ending the reservations whose TTL passed).
    pub async fn maintain(&self) -> Result<(usize, usize), crate::error::Error> {
        let counts = self.maintain_pass()?;
        self.flush().await?;
        Ok(counts)
    }

    fn maintain_pass(&self) -> Result<(usize, usize), crate::error::Error> {
        let mut guard = self.lock();
        let st = &mut *guard;
        self.serving(st)?;
        let now = self.now();
        self.expire_reservations(st, now)?;
        self.drop_retired(st)?;
        let mut work = Vec::new();
        let mut claims = Vec::new();
        // Blocks the sources took over (written as held) or gave back (struck from the store).
        let mut forgotten = Vec::new();
        for (name, net) in st.networks.iter_mut() {
            for (set, p) in net.pools.iter_mut().enumerate() {
                let (recorded, forgot) = p
                    .source
                    .blocks_mut()
                    .map(|b| (b.record(), b.forget()))
                    .unwrap_or_default();
                let recorded = recorded.into_iter().map(|b| (b, true));
                let forgot = forgot.into_iter().map(|b| (b, false));
                forgotten.extend(
                    recorded
                        .chain(forgot)
                        .map(|(block, held)| Change::PutBlock {
                            network: name.clone(),
                            set: p.id.clone(),
                            block: block.to_string(),
                            held,
                        }),
                );
                // Idle addresses where the source hands nothing out any more (a block another
                // node owns now, say) leave the pool.
                let withheld: Vec<IpAddr> =
                    match p.source.blocks().is_some_and(|b| b.may_withhold())
                        && !crate::bugs::on(crate::bugs::Bug::LostIdleServed)
                    {
                        true => p
                            .pool
                            .idle_addresses()
                            .map(|(ip, _)| ip)
                            .filter(|ip| p.source.blocks().and_then(|b| b.withheld(*ip)).is_some())
                            .collect(),
                        false => Vec::new(),
                    };
                if p.retiring {
                    if !withheld.is_empty() {
                        work.push(Work {
                            network: name.clone(),
                            set,
                            set_id: p.id.clone(),
                            fetch: Vec::new(),
                            blocks: Vec::new(),
                            give_back: withheld,
                        });
                    }
                    continue;
                }
                if let Some(claim) = p.source.blocks_mut().and_then(|b| b.start_claim()) {
                    claims.push(super::Claiming {
                        network: name.clone(),
                        set: p.id.clone(),
                        claim,
                    });
                }
                let ready = matches!(p.source.next(), Next::Ready(_));
                let m = p.pool.maintenance(now, !ready);
                let mut allowed = 0;
                while allowed < m.fetch && p.bucket.try_take(now).is_ok() {
                    allowed += 1;
                }
                if allowed < m.fetch {
                    p.bucket_waits += 1;
                }
                let fetch = p.source.peek_next_n(allowed);
                p.source_calls += fetch.len() as u64;
                if fetch.len() < allowed {
                    p.source_errors += 1;
                }
                let mut give_back = m.give_back;
                give_back.retain(|ip| !withheld.contains(ip));
                give_back.extend(withheld);
                if !fetch.is_empty() || !give_back.is_empty() {
                    let mut blocks = Vec::new();
                    for ip in &fetch {
                        p.block_change(name, *ip, &mut blocks);
                    }
                    work.push(Work {
                        network: name.clone(),
                        set,
                        set_id: p.id.clone(),
                        fetch,
                        blocks,
                        give_back,
                    });
                }
            }
        }
        self.run_claims(claims);
        if work.is_empty() && forgotten.is_empty() {
            return Ok((0, 0));
        }
        let mut changes = forgotten;
        for w in &work {
            changes.extend(w.blocks.iter().cloned());
            for ip in &w.fetch {
                changes.push(Change::PutIdle {
                    network: w.network.clone(),
                    ip: *ip,
                    released_at: Since::Never.to_stored(),
                });
            }
            if let Some(last) = w.fetch.last() {
                changes.push(Change::PutCursor {
                    network: w.network.clone(),
                    set: w.set_id.clone(),
                    cursor: Some(*last),
                });
            }
            for ip in &w.give_back {
                changes.push(Change::DeleteIdle {
                    network: w.network.clone(),
                    ip: *ip,
                });
            }
        }
        let counts = work.iter().fold((0, 0), |(f, g), w| {
            (f + w.fetch.len(), g + w.give_back.len())
        });
        self.commit(st, &changes, |st| {
            for w in &work {
                let p = st
                    .pool(&w.network, w.set)
                    .ok_or_else(|| format!("network {:?} is gone", w.network))?;
                for ip in &w.fetch {
                    p.source.take_next(*ip).map_err(|e| e.to_string())?;
                    p.pool.admit(*ip, Since::Never).map_err(|e| e.to_string())?;
                }
                for ip in &w.give_back {
                    if p.pool.evict(*ip) {
                        p.source.vacate(*ip);
                    }
                }
            }
            Ok(())
        })?;
        Ok(counts)
    }

    /// Stores where the engine clock stands (see [`crate::clock`]).
    fn record_clock(&self) -> Result<(), crate::error::Error> {
        let Some(anchor) = self.shared.clock.anchor(self.shared.boot_id.as_deref()) else {
            return Ok(());
        };
        let mut st = self.lock();
        self.commit(&mut st, &[Change::PutClock(anchor)], |_| Ok(()))
            .map(|_| ())
    }
}

/// Runs [`Ipam::maintain`] (and, every `[leak_check] interval_secs` unless 0, [`Ipam::leak_check`])
/// until the handle is aborted (the server aborts it on shutdown). While the store has failed,
/// it reopens the store instead ([`Ipam::recover_store`]), waiting longer after each failure.
pub fn spawn_maintenance(ipam: Ipam) -> JoinHandle<()> {
    let leak_check = ipam.shared.leak_check;
    tokio::spawn(async move {
        let mut suspects = LeakSuspects::default();
        let mut next_leak_check = tokio::time::Instant::now();
        let mut next_clock = tokio::time::Instant::now() + CLOCK_EVERY;
        let mut reopen_wait = REOPEN_FIRST;
        loop {
            if ipam.store_failure().is_some() {
                tokio::time::sleep(reopen_wait).await;
                match ipam.recover_store().await {
                    Ok(()) => reopen_wait = REOPEN_FIRST,
                    Err(e) => {
                        tracing::warn!(error = %e, retry_in_s = (reopen_wait * 2).min(REOPEN_MAX).as_secs(), "the store cannot be reopened yet");
                        reopen_wait = (reopen_wait * 2).min(REOPEN_MAX);
                    }
                }
                continue;
            }
            match ipam.maintain().await {
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
            if tokio::time::Instant::now() >= next_clock {
                next_clock = tokio::time::Instant::now() + CLOCK_EVERY;
                if let Err(e) = ipam.record_clock() {
                    tracing::warn!(error = %e, "storing the clock's anchor failed");
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
