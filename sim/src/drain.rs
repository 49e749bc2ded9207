//! What finished between two steps taken in: ADDs (each checked against the pods that hold
//! its addresses and the store as the engine saw it), DELs, and the operator's commands.

use std::net::IpAddr;

use ipool_server::cluster::pin::PinOwner;

use crate::commands::OpDone;
use crate::daemon::Done;
use crate::kubelet::Adding;
use crate::world::World;

impl World {
    /// Whether `ip` is one no node hands out whatever the interleaving, by the daemons' config:
    /// as one subnet, its gateways, excluded addresses, and each pool CIDR's network and IPv4
    /// broadcast addresses (of the pools as first made; a CIDR added later has no gateway).
    fn never_handed_out(&self, ip: IpAddr) -> bool {
        if !self.setting.subnet {
            return false;
        }
        let nets = |v: &[&str]| -> Vec<ipnet::IpNet> {
            v.iter()
                .map(|x| {
                    x.parse().unwrap_or_else(|_| {
                        ipnet::IpNet::from(x.parse::<IpAddr>().expect("an address"))
                    })
                })
                .collect()
        };
        let cidrs = [
            self.opts.pool(self.opts.block_v4()).cidrs,
            self.opts.second_pool().cidrs,
        ]
        .concat();
        nets(&crate::SUBNET_GATEWAYS).iter().any(|g| g.addr() == ip)
            || nets(&crate::SUBNET_EXCLUDE).iter().any(|x| x.contains(&ip))
            || cidrs
                .iter()
                .any(|c| c.network() == ip || (ip.is_ipv4() && c.broadcast() == ip))
    }

    /// Takes in the ADDs, DELs and operator commands that finished.
    pub fn drain(&mut self) -> Result<(), String> {
        let done: Vec<Done> = std::mem::take(&mut *self.done.lock().expect("done"));
        for d in done {
            match d {
                Done::Added {
                    daemon,
                    container,
                    result,
                    at,
                    decided,
                    reserved,
                } => {
                    let Some(Adding {
                        slot,
                        syncs,
                        owner,
                        instance,
                    }) = self.kubelet.adding.remove(&container)
                    else {
                        continue;
                    };
                    let alive = self.slots[slot]
                        .daemon
                        .as_ref()
                        .is_some_and(|d| d.id == daemon);
                    match (result, alive) {
                        (Ok(ips), true) => {
                            self.kubelet.adds_ok += 1;
                            let node = self.slots[slot].name.clone();
                            if let Some(ip) = reserved.first() {
                                return Err(format!(
                                    "{ip} handed out to {container} on {node}, though reserved in the pool as the node read it before the ADD and after"
                                ));
                            }
                            self.note(format!("ADD {container} on {node}: {ips:?}"));
                            if let Some(ip) = ips.iter().find(|ip| self.never_handed_out(**ip)) {
                                return Err(format!(
                                    "{ip} handed out to {container} on {node}, though the network's gateway, excluded, or its subnet's network or broadcast address"
                                ));
                            }
                            let chosen = owner
                                .as_ref()
                                .and_then(|o| crate::owners::chosen(o, self.opts.set_aside));
                            if let Some(ip) = ips.iter().find(|ip| {
                                self.opts.set_aside
                                    && crate::owners::set_aside(**ip)
                                    && chosen != Some(**ip)
                            }) {
                                return Err(format!(
                                    "{ip}, which the pool sets aside, handed out to {container} on {node}, whose pod did not choose it"
                                ));
                            }
                            if let Some(want) = chosen.filter(|c| !ips.contains(c)) {
                                return Err(format!(
                                    "ADD {container} on {node} answered with {ips:?}, though its pod chose {want}"
                                ));
                            }
                            let set_aside = self.opts.set_aside;
                            let at = at.duration_since(self.started).as_millis() as u64;
                            let excuses: Vec<Option<String>> = ips
                                .iter()
                                .map(|ip| self.handout_excuse(slot, *ip, syncs, decided))
                                .collect();
                            let excuse = |ip: IpAddr| {
                                ips.iter()
                                    .position(|x| *x == ip)
                                    .and_then(|k| excuses[k].clone())
                            };
                            let named = self.name_excuse(slot, decided)?;
                            self.served_blocks(slot, &ips, decided, &excuses)?;
                            let blocks = self.snapshot_at(decided).blocks.clone();
                            let hosted = self.fixed_served(
                                &container,
                                &node,
                                owner.as_ref(),
                                &ips,
                                &excuses,
                            )?;
                            let past = self.force_deleted_past_fence(owner.as_ref(), &ips);
                            if !past.is_empty() {
                                self.note(format!(
                                    "excused: {past:?}, force-deleted on a node past its fence, whose owner's next pod {container} takes the fixed address over"
                                ));
                            }
                            self.checker.excuse_pods(
                                &past,
                                "force-deleted while its sandbox ran, on a node past its fence: its owner's next pod took its fixed address over (Kubernetes' force deletion is the operator's word that it no longer runs; docs/cluster-mode.md)",
                            );
                            self.checker.added(
                                slot,
                                &node,
                                &container,
                                ips.clone(),
                                at,
                                &blocks,
                                excuse,
                                named,
                                owner.map(|o| (o.to_string(), instance)),
                                &hosted,
                                set_aside,
                            )?;
                        }
                        (Err(e), _) => {
                            if e.contains("internal") {
                                // The engine caught itself about to do harm: still a bug.
                                let detail = self.slots[slot].daemon.as_ref().map(|d| d.detail());
                                return Err(format!(
                                    "ADD {container} on {} failed with an internal error: {e} (its blocks: {detail:?})",
                                    self.slots[slot].name
                                ));
                            }
                            self.note(format!("ADD {container} failed: {e}"));
                            self.kubelet.refused.push((container.clone(), e));
                            self.kubelet.owed.insert(container, slot);
                        }
                        (Ok(_), false) => {
                            self.kubelet.owed.insert(container, slot);
                        }
                    }
                }
                Done::Deleted {
                    daemon,
                    container,
                    ok,
                } => {
                    self.kubelet.dels.remove(&container);
                    if !ok {
                        if let Some(slot) = self.slot_of_daemon(daemon) {
                            self.kubelet.owed.insert(container, slot);
                        }
                    }
                }
            }
        }
        self.operator.told.settle(&self.net.commands_writing());
        let ops: Vec<OpDone> = std::mem::take(&mut *self.operator.done.lock().expect("ops"));
        for o in ops {
            match o.second {
                true => self.operator.second = false,
                false => {
                    if self.operator.running.as_ref().is_some_and(|o| o.forced) {
                        self.force_ends();
                    }
                    self.operator.running = None;
                }
            }
            self.operator.told.end(o.seq, &o.what, &o.result);
            self.note(format!("operator: {} -> {:?}", o.what, o.result));
            // Nodes a look of the departed could not judge (no Node name recorded): it says
            // release-node releases them.
            if let (Ok(said), false) = (&o.result, o.second) {
                self.operator.unknown_nodes = said
                    .split("; ")
                    .filter_map(|s| s.split_once(": unknown ("))
                    .map(|(n, _)| n.to_string())
                    .collect();
            }
        }
        if !self.operator.told.is_empty() {
            self.operator
                .told
                .check(crate::POOL, &self.shared.pools())?;
        }
        Ok(())
    }

    /// The addresses of the ADD of `container` on `node` that the store's pins keep for its
    /// owner, with that pod among their holders: one at least, for a pod with a fixed address
    /// (the first family's; one pin per owner), unless the operator's doing excuses the
    /// hand-out (`excuses`, one per address: `release-node --force` of the node, which ends
    /// its holds, ran meanwhile).
    fn fixed_served(
        &self,
        container: &str,
        node: &str,
        owner: Option<&PinOwner>,
        ips: &[IpAddr],
        excuses: &[Option<String>],
    ) -> Result<Vec<IpAddr>, String> {
        let Some(owner) = owner else {
            return Ok(Vec::new());
        };
        let pins = self.shared.pins();
        let uid = format!("uid-{container}");
        let held = crate::owners::pinned_for(&pins, owner, node, &uid, ips);
        if held.is_empty() && excuses.iter().all(Option::is_none) {
            return Err(format!(
                "ADD {container} on {node} of {owner}'s pod answered with {ips:?}, though no pin in the store keeps one of them for it there: {pins:?}"
            ));
        }
        Ok(held)
    }

    /// The pods of `owner` holding one of `ips` that were force-deleted from the apiserver
    /// while their sandboxes run (`crate::pod_gc`), on a node whose name no daemon has renewed
    /// for longer than its fence: a pod of the owner may take their pinned address over (its
    /// node judged gone), as for a StatefulSet's pod or a VM's instance made again.
    fn force_deleted_past_fence(&self, owner: Option<&PinOwner>, ips: &[IpAddr]) -> Vec<String> {
        let Some(owner) = owner.map(|o| o.to_string()) else {
            return Vec::new();
        };
        let now = self.ms();
        let renewed = |node: &str| {
            self.slots
                .iter()
                .filter(|s| s.name == node)
                .flat_map(|s| s.renewals.iter().copied())
                .max()
                .unwrap_or(0)
        };
        self.checker
            .pods
            .iter()
            .filter(|(c, p)| {
                self.pod_gc.force_deleted.contains(*c)
                    && p.owner.as_deref() == Some(owner.as_str())
                    && p.ips.iter().any(|ip| ips.contains(ip))
                    && now.saturating_sub(renewed(&p.node)) > crate::FENCE_MS
            })
            .map(|(c, _)| c.clone())
            .collect()
    }

    /// The slot whose running daemon is incarnation `daemon`.
    fn slot_of_daemon(&self, daemon: u64) -> Option<usize> {
        self.slots
            .iter()
            .position(|s| s.daemon.as_ref().is_some_and(|d| d.id == daemon))
    }
}
