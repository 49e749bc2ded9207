//! What the checker must know of the operator's documented errors and of time, kept by the
//! world as the run goes:
//!
//! - a node's hand-outs from blocks `release-node --force` took from it are the operator's
//!   doing until a sync of that family, started after the release, has been taken in (docs/cluster-mode.md:
//!   the node notices at its next sync), or until its watch told it (`crate::hearing`); so
//!   are a node's hand-outs after etcd was restored from an older backup, until the node has
//!   heard etcd since (every answer carries the store's cluster id and revision);
//! - a node name taken by a second daemon (one name on two nodes) leaves the pods of the
//!   daemon that held it before on addresses the new holder may hand out (docs/cluster-mode.md: what an
//!   operator must never do);
//! - and what is no one's excuse: a node that serves, whose store requests all go through,
//!   takes in a listing of its blocks of each family at least every `resync_secs` (jittered)
//!   plus the engine's tick and a request's round trip ([`SYNC_LATE_MS`]): nothing, no claim's
//!   backoff, no exhausted pool, delays a node's view of its own blocks (design.md, 20).

use std::net::IpAddr;

use tokio::time::Instant;

use crate::world::World;
use crate::POOL;

/// How long a serving node whose requests all go through may go without taking in a listing
/// of its blocks, beyond `resync_secs` with its jitter (a fifth): the engine's tick (1 s), and
/// two seconds for the sync's own requests and the work before it.
pub const SYNC_LATE_MS: u64 = 1_000 + 2_000;

fn family(ip: IpAddr) -> usize {
    match ip {
        IpAddr::V4(_) => 0,
        IpAddr::V6(_) => 1,
    }
}

impl World {
    /// Syncs taken in so far by slot `i`'s daemon, per family.
    pub(crate) fn sync_counts(&self, i: usize) -> Option<[u64; 2]> {
        let d = self.slots[i].daemon.as_ref()?;
        let c = &d.node.metrics().cluster;
        Some([c.syncs_of(POOL, "4"), c.syncs_of(POOL, "6")])
    }

    /// Syncs taken in so far by slot `i`'s daemon, per pool of the network and family: the
    /// first pool's (IPv4, IPv6), then the second's (each pool's source syncs on its own).
    pub(crate) fn pool_sync_counts(&self, i: usize) -> Option<[u64; 4]> {
        let d = self.slots[i].daemon.as_ref()?;
        let c = &d.node.metrics().cluster;
        Some([
            c.syncs_of(POOL, "4"),
            c.syncs_of(POOL, "6"),
            c.syncs_of(crate::SECOND_POOL, "4"),
            c.syncs_of(crate::SECOND_POOL, "6"),
        ])
    }

    /// Where `ip`'s source's count lies in [`World::pool_sync_counts`].
    pub(crate) fn sync_index(&self, ip: IpAddr) -> usize {
        let second = self.swarm.two_pools
            && self
                .opts
                .second_pool()
                .cidrs
                .iter()
                .any(|c| c.contains(&ip));
        2 * usize::from(second) + family(ip)
    }

    /// Why a hand-out of `ip` by slot `slot`, picked at `decided` (its daemon having taken in
    /// `counts` syncs when the ADD was sent, see [`World::pool_sync_counts`]), from a block the
    /// store did not show as its own is the operator's doing, if it is.
    pub(crate) fn handout_excuse(
        &self,
        slot: usize,
        ip: IpAddr,
        counts: [u64; 4],
        decided: Instant,
    ) -> Option<String> {
        let s = &self.slots[slot];
        if self.unaware_at(slot, decided) {
            return Some(
                "etcd restored from an older backup, not heard since by this daemon".into(),
            );
        }
        let id = s.daemon.as_ref()?.id;
        let f = self.sync_index(ip);
        // Until its next sync (of the source of `ip`'s pool), or until its watch told it (see
        // `crate::hearing`).
        let told = self.told_gone(slot, ip, decided);
        self.forced
            .iter()
            .filter(|w| w.slot == slot && w.daemon == id)
            .any(|w| w.until.is_none_or(|u| counts[f] < u[f]))
            .then_some(())
            .filter(|()| told.is_none())
            .map(|()| {
                "release-node --force took its blocks; its next sync has not been taken in".into()
            })
    }

    /// Slot `slot`'s daemon had not heard etcd at `t` since it was restored from a backup.
    fn unaware_at(&self, slot: usize, t: Instant) -> bool {
        let s = &self.slots[slot];
        let t = self.ms_of(t);
        self.resets
            .restored_at
            .is_some_and(|r| r <= t && (s.unaware || s.aware_at.is_none_or(|a| a > t)))
    }

    /// Simulated milliseconds at `t`.
    pub(crate) fn ms_of(&self, t: Instant) -> u64 {
        t.saturating_duration_since(self.started).as_millis() as u64
    }

    /// A hand-out by slot `slot`, picked at `decided`, is made while the store shows its node
    /// name held by its own daemon; where it is not, why that is the operator's doing (the
    /// pod is then excused), else the error: no daemon hands out under a name it does not
    /// hold.
    pub(crate) fn name_excuse(
        &self,
        slot: usize,
        decided: Instant,
    ) -> Result<Option<String>, String> {
        let s = &self.slots[slot];
        let ms = self.ms_of(decided);
        if self.resets.restored_at.is_some_and(|r| ms < r) {
            // Picked before etcd went back in time, answered after.
            return Ok(Some(
                "etcd restored from an older backup after this pick".into(),
            ));
        }
        let holder = self
            .snapshot_at(decided)
            .holders
            .iter()
            .find(|h| h.node == s.name && h.holds_at(decided))
            .map(|h| h.instance.clone());
        if holder.as_deref() == Some(s.instance_id().as_str()) {
            return Ok(None);
        }
        let since_restore = self
            .resets
            .restored_at
            .is_some_and(|r| s.renewed_at.is_none_or(|t| t < r));
        if self.unaware_at(slot, decided) || since_restore {
            return Ok(Some(
                "etcd restored from an older backup: the daemon's hold on its name not renewed since"
                    .into(),
            ));
        }
        let snap = self.snapshot_at(decided);
        let seen: Vec<String> = snap
            .holders
            .iter()
            .filter(|h| h.node == s.name)
            .map(|h| {
                format!(
                    "{} until {:?} ms",
                    h.instance,
                    h.until.map(|u| self.ms_of(u))
                )
            })
            .collect();
        Err(format!(
            "{} (slot {slot}, instance {}) handed out an address at {ms} ms while the store shows its name held by {} (the store as of {} ms: {seen:?})",
            s.name,
            s.instance_id(),
            holder.map_or("no one".to_string(), |h| format!("{h:?}")),
            self.ms_of(snap.at)
        ))
    }

    /// What slot `slot` handed out `ips` from, picked at `decided` (`excuses`: why each is the
    /// operator's doing, if it is): a block of the pool as it is (on the Kubernetes API, a
    /// block records its pool's uid: one of a pool deleted or made anew since is never served),
    /// and no two confirmed blocks of the node over one another (each its own allocator: one
    /// would hand out what the other holds).
    pub(crate) fn served_blocks(
        &self,
        slot: usize,
        ips: &[IpAddr],
        decided: Instant,
        excuses: &[Option<String>],
    ) -> Result<(), String> {
        let s = &self.slots[slot];
        let snap = self.snapshot_at(decided);
        // Each address in a block of the node's whose pool, as the store had it, holds the
        // block: a pool of the network (its name a pool of the config), its CIDRs as they were.
        for (ip, excuse) in ips.iter().zip(excuses) {
            let mine: Vec<_> = snap
                .blocks
                .iter()
                .filter(|(b, o, _)| b.contains(ip) && *o == s.name)
                .collect();
            if excuse.is_some() || mine.is_empty() {
                continue;
            }
            let inside = mine.iter().any(|(b, _, pool)| {
                [POOL, crate::SECOND_POOL].contains(&pool.as_str())
                    && snap
                        .pool_cidrs
                        .get(pool)
                        .is_some_and(|cidrs| cidrs.iter().any(|c| c.contains(b)))
            });
            if !inside {
                return Err(format!(
                    "{ip} handed out by {} (slot {slot}) from {:?}, outside its pool's CIDRs as the store has them ({:?})",
                    s.name, mine, snap.pool_cidrs
                ));
            }
        }
        if let Some((revisions, pools)) = &snap.pool_revisions {
            for (ip, excuse) in ips.iter().zip(excuses) {
                // The node's blocks over the address: one of the pool as it is now is enough
                // (a block of the pool as it was, left by a claim that arrived late, may stand
                // over it too: no other node owns a block of the pool now over the address).
                let revision_of = |b: &ipnet::IpNet| match revisions.get(b) {
                    Some((p, r)) => (p.as_str(), Some(*r)),
                    None => (crate::POOL, None),
                };
                let mine: Vec<&ipnet::IpNet> = snap
                    .blocks
                    .iter()
                    .filter(|(b, o, _)| b.contains(ip) && *o == s.name)
                    .map(|(b, _, _)| b)
                    .collect();
                let Some(b) = mine.first().filter(|_| excuse.is_none()) else {
                    continue;
                };
                let current = |b: &&ipnet::IpNet| {
                    let (pool, claimed) = revision_of(b);
                    claimed == pools.get(pool).copied()
                };
                if mine.iter().any(current) {
                    continue;
                }
                let (pool, claimed) = revision_of(b);
                let now = pools.get(pool).copied();
                if claimed != now {
                    return Err(format!(
                        "{ip} handed out by {} (slot {slot}) from block {b}, claimed from pool {pool} as it was (poolRevision {claimed:?}), not as it is now ({now:?})",
                        s.name,
                    ));
                }
            }
        }
        let Some(d) = &s.daemon else {
            return Ok(());
        };
        let confirmed: Vec<ipnet::IpNet> = d
            .detail()
            .iter()
            .filter_map(|l| {
                l.split("; ")
                    .next()?
                    .split_once(" here: ")
                    .map(|(_, b)| b.to_string())
            })
            .flat_map(|b| b.split(", ").map(str::to_string).collect::<Vec<_>>())
            .filter(|b| b.ends_with(" used)"))
            .filter_map(|b| b.split(' ').next()?.parse().ok())
            .collect();
        for (i, a) in confirmed.iter().enumerate() {
            for b in &confirmed[i + 1..] {
                if a.contains(&b.network()) || b.contains(&a.network()) {
                    return Err(format!(
                        "{} (slot {slot}) serves blocks {a} and {b}, one over the other: each hands out what the other holds",
                        s.name
                    ));
                }
            }
        }
        Ok(())
    }

    /// A `release-node --force` of `node` starts: windows for its daemons.
    pub(crate) fn force_starts(&mut self, node: &str) {
        for i in 0..self.slots.len() {
            if self.slots[i].name != node {
                continue;
            }
            if let Some(d) = &self.slots[i].daemon {
                let daemon = d.id;
                self.forced.push(crate::world::Forced {
                    slot: i,
                    daemon,
                    until: None,
                });
            }
        }
    }

    /// The forced release ended (done or not): each window closes once a sync started from
    /// now on was taken in (the one under way may have listed before the release).
    pub(crate) fn force_ends(&mut self) {
        for k in 0..self.forced.len() {
            if self.forced[k].until.is_some() {
                continue;
            }
            let counts = self.pool_sync_counts(self.forced[k].slot).unwrap_or([0; 4]);
            self.forced[k].until = Some(counts.map(|c| c + 2));
        }
        let slots = &self.slots;
        self.forced.retain(|w| {
            slots[w.slot]
                .daemon
                .as_ref()
                .is_some_and(|d| d.id == w.daemon)
        });
    }

    /// The store's holders of node names, after a change: a name taken by another daemon
    /// than the one that held it leaves that one's pods excused.
    pub(crate) fn track_holders(&mut self) {
        let now = Instant::now();
        let held: Vec<(String, String)> = self
            .shared
            .holders()
            .into_iter()
            .filter(|h| h.holds_at(now))
            .map(|h| (h.node, h.instance))
            .collect();
        if self.opts.trace {
            let names: Vec<String> = held.iter().map(|(n, h)| format!("{n}: {h}")).collect();
            let line = format!("names held: {}", names.join(", "));
            if self.seen.last_names.as_ref() != Some(&line) {
                self.note(line.clone());
                self.seen.last_names = Some(line);
            }
        }
        let holding: Vec<usize> = (0..self.slots.len())
            .filter(|i| {
                let s = &self.slots[*i];
                s.daemon.is_some()
                    && held
                        .iter()
                        .any(|(n, h)| *n == s.name && *h == s.instance_id())
            })
            .collect();
        for i in 0..self.slots.len() {
            let now = holding.contains(&i);
            if now && !self.slots[i].holding {
                self.slots[i].took_name = self.pool_sync_counts(i);
            }
            self.slots[i].holding = now;
        }
        for (name, holder) in held {
            let Some(slot) = self
                .slots
                .iter()
                .position(|s| s.name == name && s.instance_id() == holder)
            else {
                // Not a daemon's (release-node's own hold on the Kubernetes API).
                continue;
            };
            let before = self.seen.holders.insert(name.clone(), holder.clone());
            let Some(before) = before.filter(|b| *b != holder) else {
                continue;
            };
            let why = format!(
                "node name {name} taken over from {before} by {holder}: two daemons under one name"
            );
            for i in 0..self.slots.len() {
                if i != slot && self.slots[i].name == name && self.slots[i].instance_id() == before
                {
                    self.note(format!("{why}: slot {i}'s pods excused"));
                    self.checker.excuse_slot(i, &why);
                }
            }
        }
    }

    /// No serving node whose requests go through goes without a sync for long.
    pub(crate) fn liveness(&mut self) -> Result<(), String> {
        let now = self.ms();
        let timeout = self.setting.timeout.as_millis() as u64;
        let families = if self.opts.dual_stack { 2 } else { 1 };
        let pool_op = self.operator.second
            || self
                .operator
                .running
                .as_ref()
                .is_some_and(|o| o.release_of.is_none() && !o.departed);
        let resync = self.swarm.resync_secs * 1200;
        // While the pool is gone no node has a block of it to list (its source reads the
        // pool until it is made again): found at seed 5 212, a second operator's deletion.
        let pool_gone = !self.shared.has_pool(crate::POOL);
        for i in 0..self.slots.len() {
            let Some(d) = &self.slots[i].daemon else {
                continue;
            };
            let serving = d.node.serving().is_ok();
            let counts = self.sync_counts(i).unwrap_or([0; 2]);
            let (refused, oldest) = self.net.troubles(i);
            let at = |t: tokio::time::Instant| t.duration_since(self.started).as_millis() as u64;
            let s = &mut self.slots[i];
            if !serving {
                s.serving_since = None;
                continue;
            }
            let since = *s.serving_since.get_or_insert(now);
            if let Some(r) = refused.map(at).filter(|r| *r > s.trouble_at) {
                s.trouble(r);
            }
            if oldest.is_some_and(|t| now.saturating_sub(at(t)) > timeout / 2) {
                // Counted when it fails (it is answered late, or dropped).
                s.trouble_at = now;
            }
            // A pool being deleted or made: what the source does meanwhile is not claimed, and
            // waits as after a failure.
            if pool_op && now.saturating_sub(s.trouble_at) >= 1000 {
                s.trouble(now);
            }
            for (f, &count) in counts.iter().enumerate().take(families) {
                if count != s.syncs[f].0 || pool_gone {
                    s.syncs[f] = (count, now);
                    s.streak[f] = 0;
                }
                if count == 0 {
                    // No range set of the family yet (its pool not read): nothing to sync.
                    continue;
                }
                // After troubles, the source's backoff (doubling from a second, at most 30 s,
                // jittered) may hold the sync back.
                let backoff = match s.streak[f] {
                    0 => 0,
                    k => (1000u64 << (k - 1).min(5)).min(30_000) * 6 / 5,
                };
                let from = s.syncs[f].1.max(since).max(s.trouble_at);
                if now.saturating_sub(from) > resync + SYNC_LATE_MS + backoff {
                    return Err(format!(
                        "{} (slot {i}) serves and every store request of its went through for {} ms, but it took in no listing of its IPv{} blocks meanwhile (last at {} ms): a block taken from it would go on serving",
                        s.name,
                        now.saturating_sub(from),
                        if f == 0 { 4 } else { 6 },
                        s.syncs[f].1
                    ));
                }
            }
        }
        Ok(())
    }
}
