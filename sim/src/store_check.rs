//! The checks made each time the store may have changed: every block's owner, deletes that
//! must have failed (conditioned on a write made since they were sent), and what an
//! operator's command took from a node (`--force`: its pods excused, its hand-outs until its
//! next sync; release-node: judged as docs/cluster-mode.md says, see docs/simulation.md's rule 8).

use ipnet::IpNet;
use tokio::time::Instant;

use crate::world::{Forced, World, RESTORE};

impl World {
    /// Checks the store after it may have changed.
    pub fn store_check(
        &mut self,
        by: &str,
        command: Option<usize>,
        sent: Option<Instant>,
    ) -> Result<(), String> {
        let v = self.shared.version();
        if v == self.seen.version {
            return Ok(());
        }
        self.seen.version = v;
        self.track_holders();
        self.stale_writes(by, sent)?;
        let after = self.shared.blocks();
        let op = command
            .and_then(|c| self.operator.commands.get(&c))
            .cloned();
        let forced = op.as_ref().is_some_and(|o| o.forced) || self.resets.doubtful_writer;
        let overlaps = self.opts.store == crate::StoreKind::Kube;
        // The nodes the operator's command (under way, or ended: a request of it may arrive
        // late) took a block from.
        let from: std::collections::BTreeSet<String> = match &op {
            None => Default::default(),
            Some(_) => self
                .seen
                .blocks
                .iter()
                .filter(|(b, o, _)| !after.iter().any(|(a, ao, _)| a == b && ao == o))
                .map(|(_, o, _)| o.clone())
                .collect(),
        };
        for node in &from {
            match &op {
                Some(o) if o.forced => self.forced_gave_back(node),
                Some(o) if o.release_of.as_ref() == Some(node) || o.departed => {
                    let taken: Vec<IpNet> = self
                        .seen
                        .blocks
                        .iter()
                        .filter(|(b, o, _)| o == node && !after.iter().any(|(a, _, _)| a == b))
                        .map(|(b, _, _)| *b)
                        .collect();
                    self.release_gave_back(node, sent, &taken)?
                }
                _ => {}
            }
        }
        if !self.checker.kept.is_empty() {
            let pins = self.shared.pins();
            self.checker
                .kept_blocks_gone(&self.seen.blocks, &after, by, &pins);
        }
        let r = self.checker.store_changed(
            &self.seen.blocks,
            &after,
            by,
            |_| forced,
            overlaps,
            self.resets.doubtful_writer,
        );
        self.owned_again(&after);
        self.seen.blocks = after;
        self.snapshot();
        r
    }

    /// A block deleted by a request sent (at `sent`) before the block was last written: the
    /// delete was conditioned on what its sender read, which that write changed, so it must
    /// have failed (a give-back, late or not, never applies to a block settled since).
    fn stale_writes(&mut self, by: &str, sent: Option<Instant>) -> Result<(), String> {
        let now = Instant::now();
        let revs = self.shared.block_revisions();
        // Sent before etcd was restored from an older backup: its conditions name revisions the
        // restored etcd may give again to other writes (without --bump-revision): the
        // restore's doing.
        let before_restore = |t: Instant| {
            self.resets
                .restored_at
                .is_some_and(|r| t.saturating_duration_since(self.started).as_millis() as u64 <= r)
        };
        if let Some(sent) = sent.filter(|t| !before_restore(*t)) {
            for (net, (_, at)) in &self.seen.written {
                if !revs.contains_key(net) && *at > sent {
                    return Err(format!(
                        "block {net} deleted by a request of {by} sent at {} ms, though the block was written after that, at {} ms: a give-back on what its sender read applied after a write changed it",
                        self.ms_of(sent),
                        self.ms_of(*at)
                    ));
                }
            }
        }
        // A restore from a backup is no write: what it brings back was written before.
        let when = match sent.is_none() && by == RESTORE {
            true => self.started,
            false => now,
        };
        let written = std::mem::take(&mut self.seen.written);
        self.seen.written = revs
            .into_iter()
            .map(|(net, rev)| match written.get(&net) {
                Some((r, at)) if *r == rev => (net, (rev, *at)),
                _ => (net, (rev, when)),
            })
            .collect();
        Ok(())
    }

    /// `release-node --force` gave a block of `node` back: its pods are the operator's doing,
    /// and so is what its daemons hand out from it until their next sync.
    fn forced_gave_back(&mut self, node: &str) {
        for i in 0..self.slots.len() {
            if self.slots[i].name != node || self.slots[i].gone {
                continue;
            }
            self.checker
                .excuse_slot(i, "release-node --force on a live node");
            self.serves_until_synced(i);
        }
    }

    /// Slot `i`'s daemon, if it runs, may serve the blocks an operator's command just took
    /// from it until a sync started from now on has been taken in.
    fn serves_until_synced(&mut self, i: usize) {
        if let (Some(d), Some(c)) = (&self.slots[i].daemon, self.pool_sync_counts(i)) {
            let daemon = d.id;
            self.forced.push(Forced {
                slot: i,
                daemon,
                until: Some(c.map(|c| c + 2)),
            });
        }
    }

    /// A release of `node` without `--force` gave a block of it back: where no store could
    /// tell the node from a gone one, its pods are the operator's doing; elsewhere, a bug.
    /// On etcd the give-back is judged when it applies (it is conditioned on the node's name
    /// being absent then); on the Kubernetes API when it was sent (`sent`), while release-node
    /// held the node's Lease: a delete cannot be conditioned on another object, and a node
    /// that takes its name again settles every block before it serves one, so a late delete
    /// either fails or takes a block the node has not served since.
    fn release_gave_back(
        &mut self,
        node: &str,
        sent: Option<Instant>,
        taken: &[IpNet],
    ) -> Result<(), String> {
        let now = self.ms();
        let sent_ms = sent
            .filter(|_| self.opts.store == crate::StoreKind::Kube)
            .map(|t| t.saturating_duration_since(self.started).as_millis() as u64);
        for i in 0..self.slots.len() {
            let s = &self.slots[i];
            if s.name != node || s.gone {
                continue;
            }
            let when_sent = sent_ms.and_then(|t| self.release_excuse(i, t).map(|why| (t, why)));
            match (self.release_excuse(i, now), when_sent) {
                (Some(why), _) => {
                    if !s.excused_release {
                        self.note(format!("{why}: slot {i}'s pods excused"));
                    }
                    self.slots[i].excused_release = true;
                    self.checker.excuse_slot(i, why);
                    // A daemon that runs serves the block until its next sync, as after --force.
                    self.serves_until_synced(i);
                }
                // Sent while release-node held the Lease, applied after the node took its name
                // again: its pods of before are the operator's doing; the block it has not
                // served since (it settles every block first, and a settle makes the delete
                // fail), and serves nothing of now (the snapshots check that).
                (None, Some((t, why))) => {
                    // It took its name again and took in a sync of the block's family since:
                    // that sync settled the block (or found it gone), so the delete could not
                    // have applied after it.
                    let synced = taken.iter().find(|b| {
                        // The sync of the block's own pool (each pool's source syncs on its own).
                        let f = self.sync_index(b.network());
                        match (self.slots[i].took_name, self.pool_sync_counts(i)) {
                            (Some(then), Some(now)) => now[f] > then[f],
                            _ => false,
                        }
                    });
                    if let Some(b) = synced {
                        return Err(format!(
                            "release-node's delete, sent at {t} ms while {node} was away, took {b} after {node} took its name again and synced (a sync settles every block then)"
                        ));
                    }
                    let served = self.checker.pods.iter().find(|(_, p)| {
                        p.slot == i
                            && p.at > t
                            && p.ips.iter().any(|ip| taken.iter().any(|b| b.contains(ip)))
                    });
                    if let Some((c, p)) = served {
                        return Err(format!(
                            "release-node's delete, sent at {t} ms while {node} was away, took a block from which {node} gave {c} {:?} after it took its name again",
                            p.ips
                        ));
                    }
                    self.note(format!(
                        "a release-node delete sent at {t} ms, while {node} was away, applied after it took its name again: its pods of before excused"
                    ));
                    self.checker.excuse_slot_before(i, t, why);
                }
                (None, None) => {
                    return Err(format!(
                        "release-node without --force gave back a block of {node}, whose daemon (slot {i}) {}",
                        match s.daemon {
                            Some(_) => "runs and renews its name",
                            None => "was down for less than its fence",
                        }
                    ))
                }
            }
        }
        Ok(())
    }
}
