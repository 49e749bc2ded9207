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
/// In runs with pins and departures: longer than a keeper's grace for an unused hold
/// (`k8s::pin_keeper::HOLD_GRACE`, 120 s) and the pins' time to live after it (30 s), each
/// measured from a keeper's turn (every 10 s), with room.
pub(crate) const QUIET_PINS_MS: u64 = 260_000;
/// Then how long it is watched for writes (each daemon syncs a few times meanwhile).
pub(crate) const IDLE_MS: u64 = 15_000;
/// At most this many more windows of quiet while writes go on.
const SETTLING_ROUNDS: usize = 4;
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
        let (mut next_look, mut next_redo, mut next_gc) = (self.ms(), self.ms(), self.ms());
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
                .find_map(|p| Some((p.half_done()?, p.name)));
            if let Some((how, name)) = half_done {
                if !self.operating() && self.ms() >= next_redo {
                    next_redo = self.ms() + LOOK_EVERY_MS;
                    crate::operator::finish_pool(self, name, how);
                }
            }
            // A node the look could not judge: the operator runs release-node, as it says.
            let unknown = std::mem::take(&mut self.operator.unknown_nodes);
            if let Some(i) = (0..self.opts.nodes).find(|i| unknown.contains(&self.slots[*i].name)) {
                if !self.operating() {
                    crate::operator::release_absent(self, i);
                }
            }
            // Every running daemon's pod GC checks, whatever the operator does.
            if self.opts.pod_gc && self.ms() >= next_gc {
                next_gc = self.ms() + LOOK_EVERY_MS;
                crate::pod_gc::quiet_turn(self)?;
            }
            if self.ms() >= next_look && !self.operating() {
                next_look = self.ms() + LOOK_EVERY_MS;
                if self.swarm.departures {
                    let me = (0..self.slots.len()).find(|i| self.slots[*i].daemon.is_some());
                    match (self.opts.cronjob, me) {
                        (true, _) => crate::departed::look(self, None, DEPARTED_AFTER),
                        (false, Some(me)) => {
                            let who = crate::departed::cronjob_on_kube(self, me);
                            crate::departed::look(self, who, DEPARTED_AFTER)
                        }
                        (false, None) if self.opts.store == crate::StoreKind::Kube => {
                            crate::departed::look(self, None, DEPARTED_AFTER)
                        }
                        (false, None) => {}
                    }
                }
                // Every running daemon's keeper takes a turn.
                if self.swarm.pins {
                    for i in 0..self.slots.len() {
                        crate::fixed::keep_pins_on(self, i);
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(BEAT_MS)).await;
            self.drain()?;
            self.shared.expire(Instant::now());
            self.store_check("a lease's expiry", None, None)?;
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
        let stored = self.shared.pins();
        let mut void_known = Vec::new();
        let mut misheld = Vec::new();
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
            let void = |p: &ipool_server::cluster::pin::Pin| {
                !p.set_aside
                    && stored.contains(p)
                    && d.ipam
                        .block_holding(p.address)
                        .is_some_and(|b| b.net != p.block || b.created != p.block_id)
            };
            void_known.extend(
                d.node
                    .pins_unheld()
                    .into_iter()
                    .filter(void)
                    .map(|p| (s.name.clone(), p)),
            );
            // Held by this node alone, its address another owner's pod's here (a pod of the
            // pin's own owner keeps it rightly: the owner's pods are not refused for it).
            for p in &stored {
                if p.holders.is_empty() || p.holders.iter().any(|h| h.node != s.name) {
                    continue;
                }
                let owner = p.owner.to_string();
                let other = d.held_anywhere().into_iter().find(|(c, ips)| {
                    ips.contains(&p.address)
                        && !p.holders.iter().any(|h| h.uid == format!("uid-{c}"))
                        && self.checker.pods.get(c).and_then(|pod| pod.owner.as_ref())
                            != Some(&owner)
                });
                if let Some((c, _)) = other {
                    misheld.push((s.name.clone(), p.clone(), c));
                }
            }
        }
        Picture {
            void_known,
            misheld,
            blocks: self.shared.blocks(),
            serving,
            held,
            pods: self.checker.pods.keys().cloned().collect(),
            pins: self
                .shared
                .pins()
                .into_iter()
                .filter(|p| self.pin_counts(p))
                .map(|p| {
                    let gone = crate::fixed::owner_gone(self, &p.owner);
                    (p, gone)
                })
                .collect(),
            deleting: self
                .shared
                .pools()
                .into_iter()
                .filter(|p| p.half_done().is_some())
                .map(|p| p.name)
                .collect(),
        }
    }

    /// Whether `pin` still keeps its address: set aside, or made in a block that stands as
    /// made (one of a gone node's, which no daemon can say, counts; one of a live node's
    /// whose engine holds the address in a block claimed anew since does not: it pins
    /// nothing, and whether that node ends it is L3's void-pin rule).
    fn pin_counts(&self, pin: &ipool_server::cluster::pin::Pin) -> bool {
        if pin.set_aside {
            return true;
        }
        let owner = self
            .shared
            .blocks()
            .into_iter()
            .find(|(b, _, _)| *b == pin.block)
            .map(|(_, n, _)| n);
        let Some(owner) = owner else {
            return false;
        };
        let live: Vec<&crate::daemon::Daemon> = self
            .slots
            .iter()
            .filter(|s| s.name == owner)
            .filter_map(|s| s.daemon.as_ref())
            .collect();
        live.is_empty()
            || live.iter().any(|d| {
                d.ipam
                    .block_holding(pin.address)
                    .is_some_and(|b| b.net == pin.block && b.created == pin.block_id)
            })
    }

    /// The free blocks of the pools the network takes its addresses from that give blocks
    /// (Ready, enabled, their CIDRs not changing) to node `name` (their nodeSelector admits
    /// it).
    fn free_blocks(&self, name: &str) -> Vec<ipnet::IpNet> {
        let blocks = self.shared.blocks();
        let mut names = vec![crate::POOL.to_string()];
        names.extend(self.setting.second_pool.clone());
        self.shared
            .pools()
            .into_iter()
            .filter(|p| names.contains(&p.name) && p.gives_blocks())
            .filter(|p| crate::labels::admits(self, p, name))
            .flat_map(|p| {
                settled::free_blocks(&p.cidrs, (p.block_v4, p.block_v6), &blocks, &p.kept_out)
            })
            .collect()
    }

    /// A block free both `before` an ADD and after it was refused (another node's claim may
    /// have taken the one free before), of each family the network's ADDs ask for: one of
    /// them.
    fn room(&self, before: &[ipnet::IpNet], name: &str) -> Option<ipnet::IpNet> {
        let after = self.free_blocks(name);
        let free: Vec<&ipnet::IpNet> = before.iter().filter(|b| after.contains(b)).collect();
        let v4 = free.iter().find(|b| b.addr().is_ipv4()).map(|b| **b);
        let v6 = free.iter().any(|b| b.addr().is_ipv6());
        v4.filter(|_| v6 || !self.opts.dual_stack)
    }

    /// An ADD on every live node: refused only when its pools have no free block of a family
    /// it asks for (L4).
    async fn trial_adds(&mut self) -> Result<(), String> {
        for i in 0..self.slots.len() {
            // A daemon whose config renamed the network has no network of the ADD's name.
            let s = &self.slots[i];
            if s.daemon.is_none() || s.twin_of.is_some() || s.renamed {
                continue;
            }
            let name = self.slots[i].name.clone();
            let before = self.free_blocks(&name);
            self.kubelet.refused.clear();
            crate::nodes::add(self, i);
            let c = format!("c{}", self.kubelet.next_container);
            self.note(format!("quiet: a trial ADD {c} on {}", self.slots[i].name));
            for _ in 0..200 {
                if !self.kubelet.adding.contains_key(&c) {
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
            if let Some((_, why)) = self.kubelet.refused.iter().find(|(r, _)| *r == c) {
                let room = self.room(&before, &name);
                settled::add_refused(&name, why, room.as_ref())?;
            }
        }
        Ok(())
    }
}

/// The quiet period and the liveness rules judged after it.
pub(crate) async fn quiet(w: &mut World) -> Result<(), String> {
    let quiet = match w.swarm.pins && w.swarm.departures {
        true => QUIET_PINS_MS,
        false => QUIET_MS,
    };
    w.note(format!("quiet for {quiet} ms: no fault"));
    w.settle(quiet).await?;
    // Work still under way (a release that waited for its pins' time, say) ends first: more
    // quiet, a window at a time, until a window passes without a write, for at most a few
    // windows; what still writes then is no work that ends.
    // A window longer than every countdown that ends in a write (a pin's time to live and a
    // look; with pins, a keeper's grace for an unused hold).
    let window = match w.swarm.pins {
        true => 135_000,
        false => 40_000,
    };
    for _ in 0..SETTLING_ROUNDS {
        w.idle_writes = Some(Vec::new());
        w.settle(window).await?;
        // A keeper's hold waiting out its grace is work under way too (its let-go read a
        // pin changed since its book knew it, whose own hold then waits a grace of its own).
        let waiting = w
            .slots
            .iter()
            .filter_map(|s| s.daemon.as_ref())
            .any(|d| d.keeper_waiting());
        if w.idle_writes.take().is_some_and(|x| x.is_empty()) && !waiting {
            break;
        }
    }
    w.note(format!("quiet: watched for writes for {IDLE_MS} ms"));
    // The blocks of the nodes gone as the watch begins: their release may come within it.
    let gone_before = gone_nodes(&w.picture());
    let blocks_before = w.shared.blocks();
    w.idle_writes = Some(Vec::new());
    w.settle(IDLE_MS).await?;
    let mut writes = w.idle_writes.take().unwrap_or_default();
    let mut picture = w.picture();
    if w.resets.apiserver_stepped_back {
        // A departed node's Lease stamped before the apiserver's clock stepped back looks
        // renewed until the clock has caught up (as long as the step): its release waits that
        // long (docs/simulation.md, L2), longer than the quiet, or ends within the watch.
        let mut gone: Vec<String> = gone_nodes(&picture);
        // Its release's own writes within the watch (its blocks and its Lease deleted) are
        // that wait's end, not an idle cluster's work.
        writes.retain(|x| !release_of(x, &gone_before, &blocks_before));
        gone.extend(gone_before.iter().cloned());
        gone.sort();
        gone.dedup();
        w.note(format!(
            "quiet: the apiserver's clock stepped back: L2 and L3 not judged for {gone:?}"
        ));
        // Nor a pin held by a gone node or made in one of its blocks (its holds end with its
        // release, and pins nobody holds there are the release's look's to end).
        let theirs: Vec<ipnet::IpNet> = picture
            .blocks
            .iter()
            .filter(|(_, n, _)| gone.contains(n))
            .map(|(b, _, _)| *b)
            .collect();
        picture.blocks.retain(|(_, n, _)| !gone.contains(n));
        picture.pins.retain(|(p, _)| {
            p.holders.iter().all(|h| !gone.contains(&h.node)) && !theirs.contains(&p.block)
        });
    }
    settled::void_pins_kept(&picture)?;
    settled::second_pins(&picture)?;
    settled::misheld_pins(&picture)?;
    settled::pins_of_gone_owners(&picture).map_err(|e| {
        let books: Vec<String> = w
            .slots
            .iter()
            .filter_map(|s| {
                let d = s.daemon.as_ref()?;
                Some(format!(
                    "{} (keeper busy {}): holding {:?} held here {:?}, unheld {:?}",
                    s.name,
                    d.keeper_busy(),
                    w.shared
                        .pins()
                        .iter()
                        .map(|p| (p.block, p.block_id, d.ipam.block_holding(p.address)))
                        .collect::<Vec<_>>(),
                    d.node
                        .pins_held_here()
                        .iter()
                        .map(|p| (p.address, p.owner.to_string(), p.holders.len()))
                        .collect::<Vec<_>>(),
                    d.node
                        .pins_unheld()
                        .iter()
                        .map(|p| (p.address, p.owner.to_string()))
                        .collect::<Vec<_>>()
                ))
            })
            .collect();
        let store: Vec<String> = w
            .shared
            .pins()
            .iter()
            .map(|p| {
                format!(
                    "{} {} {:?}",
                    p.address,
                    p.owner,
                    p.holders
                        .iter()
                        .map(|h| (&h.node, &h.uid))
                        .collect::<Vec<_>>()
                )
            })
            .collect();
        format!(
            "{e} (the books: {}; the store's pins: {store:?})",
            books.join("; ")
        )
    })?;
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
    settled::stuck_deleting(&picture)?;
    // The marks that time a gone owner's pin are written at each look until the apiserver's
    // stamps show pin_ttl_secs passed: after its clock stepped back, for as long as the step.
    let writes: Vec<String> = match w.resets.apiserver_stepped_back {
        true => writes
            .into_iter()
            .filter(|x| !x.contains("/ippins/"))
            .collect(),
        false => writes,
    };
    settled::idle_writes(&writes, IDLE_MS)?;
    w.trial_adds().await
}

/// The nodes that hold blocks or pins in `picture` but serve nothing: gone.
fn gone_nodes(picture: &Picture) -> Vec<String> {
    picture
        .blocks
        .iter()
        .map(|(_, n, _)| n.clone())
        .chain(
            picture
                .pins
                .iter()
                .flat_map(|(p, _)| p.holders.iter().map(|h| h.node.clone())),
        )
        .filter(|n| !picture.serving.contains_key(n))
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect()
}

/// Whether `write` (as the quiet recorded it) is the release of one of the nodes `gone`: the
/// deletion of one of their blocks in `blocks` or of their Lease.
fn release_of(write: &str, gone: &[String], blocks: &[crate::check::StoreBlock]) -> bool {
    let Some(what) = write.strip_prefix("DELETE ") else {
        return false;
    };
    gone.iter().any(|n| {
        what.contains(&format!("/leases/ipool-{n} "))
            || blocks.iter().filter(|(_, o, _)| o == n).any(|(b, _, _)| {
                let name = ipool_server::cluster::kube::block_name(b);
                what.contains(&format!("/ipblocks/{name} "))
            })
    })
}
