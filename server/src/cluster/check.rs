//! A cluster-wide check (`ipoolctl cluster check`): what the store holds (pools, blocks,
//! nodes' names, pins) set against what the apiserver says (Nodes, pods' `status.podIPs`), and
//! every inconsistency found, each with what to do. Reads only; the reads are the caller's
//! (this is the judgement, over what was read, so that a test can hand it any state).

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use super::pin::PinRead;
use super::vocab::{Block, Listing, NodeSeen, Pools};

/// A running pod's addresses, as the apiserver reports them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodIps {
    /// `namespace/name`.
    pub pod: String,
    pub node: String,
    pub ips: Vec<IpAddr>,
    /// The VM whose launcher it is (its label `vm.kubevirt.io/name`, with its namespace):
    /// two launchers of one VM share its address during a live migration.
    pub vm: Option<String>,
}

/// What the apiserver says, where it was asked.
#[derive(Clone, Debug, Default)]
pub struct Apiserver {
    pub nodes: BTreeSet<String>,
    pub pods: Vec<PodIps>,
}

/// What the store holds.
pub struct Stored<'a> {
    pub pools: &'a Pools,
    pub blocks: &'a Listing,
    pub nodes: &'a [NodeSeen],
    pub pins: &'a [PinRead],
}

/// The kinds of finding; `release-node --from-check` acts on [`Kind::NodeGone`] and
/// [`Kind::NodeAway`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    /// Blocks owned by a node the apiserver has no Node for.
    NodeGone,
    /// The same, every one of them kept by a pin made in it (a release frees none of them:
    /// they go back once the pins end).
    NodeGonePinned,
    /// A node owning blocks whose daemon has been away past its fence.
    NodeAway,
    /// A pod's address in a block another node owns.
    PodInAnotherNodesBlock,
    /// A pod's address inside a pool but in no block (and not pinned for it).
    PodInNoBlock,
    /// One address reported by two pods.
    AddressOnTwoPods,
    /// A block whose pool is gone, or that lies outside its pool's CIDRs or block size.
    BlockOutsidePool,
    /// An entry of the store that names no owner, or an object that cannot be read.
    Malformed,
}

/// One inconsistency, and what to do about it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Finding {
    pub kind: Kind,
    /// The node it concerns, if one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// Blocks, addresses, pods or keys it concerns.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub subjects: Vec<String>,
    /// What was found.
    pub what: String,
    /// What to do.
    pub fix: String,
}

/// A check's report: what `-o json` prints and `release-node --from-check` reads.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Report {
    pub findings: Vec<Finding>,
    /// Whether the apiserver was asked (Nodes and pods checked).
    pub apiserver: bool,
    pub pools: usize,
    pub blocks: usize,
    pub nodes: usize,
    pub pods: usize,
}

/// Every finding over what was read (`api`: None when the apiserver was not asked).
pub fn check(s: &Stored, api: Option<&Apiserver>) -> Report {
    let mut findings = Vec::new();
    let by_node = owners(&s.blocks.blocks);
    let seen: BTreeMap<&str, &NodeSeen> = s.nodes.iter().map(|n| (n.node.as_str(), n)).collect();
    for (node, blocks) in &by_node {
        let subjects: Vec<String> = blocks.iter().map(|b| b.block.to_string()).collect();
        // Its Node's name as its daemon recorded it (the names may differ), else its own.
        let k8s = seen
            .get(node)
            .and_then(|n| n.k8s_node.as_deref())
            .unwrap_or(node);
        if api.is_some_and(|a| !a.nodes.contains(k8s)) {
            let named = match k8s == *node {
                true => "of that name".to_string(),
                false => format!("{k8s:?}, as its daemon recorded it"),
            };
            let pins: Vec<&PinRead> = s
                .pins
                .iter()
                .filter(|p| {
                    blocks
                        .iter()
                        .any(|b| b.pool == p.pin.pool && p.pin.made_in(&b.block, &b.revision))
                })
                .collect();
            let all_pinned = blocks.iter().all(|b| {
                pins.iter()
                    .any(|p| b.pool == p.pin.pool && p.pin.made_in(&b.block, &b.revision))
            });
            if all_pinned {
                let held: Vec<String> = pins
                    .iter()
                    .map(|p| {
                        format!(
                            "{} for {} (held by {})",
                            p.pin.address,
                            p.pin.owner,
                            p.pin.holders_shown()
                        )
                    })
                    .collect();
                findings.push(Finding {
                    kind: Kind::NodeGonePinned,
                    node: Some(node.to_string()),
                    subjects: subjects.clone(),
                    what: format!("node {node:?} owns {} block(s) and the apiserver has no Node {named}; every one of them is kept by a pin made in it: {}", blocks.len(), held.join(", ")),
                    fix: "nothing to release now: each goes back once its pins end (the release of departed nodes ends a pin nobody holds once its owner has been gone pin_ttl_secs; ipoolctl cluster unpin ADDRESS ends one now, once no pod uses it)".into(),
                });
                continue;
            }
            findings.push(Finding {
                kind: Kind::NodeGone,
                node: Some(node.to_string()),
                subjects: subjects.clone(),
                what: format!("node {node:?} owns {} block(s) but the apiserver has no Node {named}", blocks.len()),
                fix: format!("if the machine is gone for good: ipoolctl cluster release-node {node} (or release-node --from-check with this report); if it is to come back, nothing: its daemon keeps its blocks"),
            });
            continue;
        }
        let away = seen.get(node).and_then(|n| match (&n.alive, n.away_secs) {
            (None, Some(a)) if a > n.fence_secs as i64 => Some(format!("{a} s")),
            (None, None) => Some("longer than the store keeps a heartbeat, or never".into()),
            _ => None,
        });
        let away =
            away.or_else(|| (!seen.contains_key(node)).then(|| "no heartbeat at all".into()));
        if let Some(how_long) = away {
            findings.push(Finding {
                kind: Kind::NodeAway,
                node: Some(node.to_string()),
                subjects,
                what: format!("node {node:?} owns {} block(s) and its daemon has been away {how_long}, past its fence: its pods' addresses stay held", blocks.len()),
                fix: format!("start ipoold on {node}; if the node is gone: drain it, delete its Node, then ipoolctl cluster release-node {node}"),
            });
        }
    }
    findings.extend(outside_pools(s));
    if let Some(api) = api {
        findings.extend(pods(s, api));
    }
    for m in s.pools.malformed.iter().chain(&s.blocks.malformed) {
        findings.push(Finding {
            kind: Kind::Malformed,
            node: None,
            subjects: vec![m.key.clone()],
            what: format!("{m}: it counts as occupied, and no node serves from it"),
            fix: "read it (etcdctl get, or kubectl get -o yaml); if nothing uses it, delete it by hand".into(),
        });
    }
    findings.sort_by(|a, b| (a.kind, &a.node, &a.subjects).cmp(&(b.kind, &b.node, &b.subjects)));
    Report {
        findings,
        apiserver: api.is_some(),
        pools: s.pools.pools.len(),
        blocks: s.blocks.blocks.len(),
        nodes: by_node.len(),
        pods: api.map_or(0, |a| a.pods.len()),
    }
}

fn owners(blocks: &[Block]) -> BTreeMap<&str, Vec<&Block>> {
    let mut m: BTreeMap<&str, Vec<&Block>> = BTreeMap::new();
    for b in blocks {
        m.entry(b.owner.node.as_str()).or_default().push(b);
    }
    m
}

fn outside_pools(s: &Stored) -> Vec<Finding> {
    let mut found = Vec::new();
    for b in &s.blocks.blocks {
        let pool = s.pools.pools.iter().find(|p| p.spec.name == b.pool);
        let why = match pool {
            None => Some(format!("its pool {:?} does not exist", b.pool)),
            Some(p) => {
                let within = p.spec.cidrs.iter().find(|c| c.contains(&b.block));
                match within {
                    None => Some(format!("it lies in none of pool {:?}'s CIDRs", b.pool)),
                    Some(c) if p.spec.block_for(c) != b.block.prefix_len() => Some(format!(
                        "pool {:?} carves {c} into /{} blocks, not /{}",
                        b.pool,
                        p.spec.block_for(c),
                        b.block.prefix_len()
                    )),
                    Some(_) => None,
                }
            }
        };
        if let Some(why) = why {
            found.push(Finding {
                kind: Kind::BlockOutsidePool,
                node: Some(b.owner.node.clone()),
                subjects: vec![b.block.to_string()],
                what: format!("block {} of node {:?}: {why}", b.block, b.owner.node),
                fix: format!("no node claims there; once nothing on {} holds an address of it, ipoolctl cluster release-node {} --force, or delete the entry by hand", b.owner.node, b.owner.node),
            });
        }
    }
    found
}

/// Pods' addresses against the blocks and the pins, and against each other.
fn pods(s: &Stored, api: &Apiserver) -> Vec<Finding> {
    let mut found = Vec::new();
    let pooled: Vec<IpNet> = s
        .pools
        .pools
        .iter()
        .flat_map(|p| p.spec.cidrs.clone())
        .collect();
    let mut holders: BTreeMap<IpAddr, Vec<&PodIps>> = BTreeMap::new();
    for pod in &api.pods {
        for ip in &pod.ips {
            holders.entry(*ip).or_default().push(pod);
            if !pooled.iter().any(|c| c.contains(ip)) {
                continue;
            }
            // A pinned address is served by the nodes that hold its pin, wherever it lies.
            let pinned = s
                .pins
                .iter()
                .any(|p| p.pin.address == *ip && p.pin.holders.iter().any(|h| h.node == pod.node));
            if pinned {
                continue;
            }
            match s.blocks.blocks.iter().find(|b| b.block.contains(ip)) {
                Some(b) if b.owner.node == pod.node => {}
                Some(b) => found.push(Finding {
                    kind: Kind::PodInAnotherNodesBlock,
                    node: Some(pod.node.clone()),
                    subjects: vec![ip.to_string(), pod.pod.clone(), b.block.to_string()],
                    what: format!("pod {} on node {:?} has {ip}, in block {} that node {:?} owns: that node may hand it out again", pod.pod, pod.node, b.block, b.owner.node),
                    fix: format!("delete the pod (its controller makes it anew with an address of its node's), or reserve {ip} (ipoolctl cluster reserve {} {ip}) until it is gone", b.pool),
                }),
                None => found.push(Finding {
                    kind: Kind::PodInNoBlock,
                    node: Some(pod.node.clone()),
                    subjects: vec![ip.to_string(), pod.pod.clone()],
                    what: format!("pod {} on node {:?} has {ip}, in a pool but in no block: the next node to claim its block may hand it out again", pod.pod, pod.node),
                    fix: format!("delete the pod, or reserve {ip} (ipoolctl cluster reserve POOL {ip}) until it is gone"),
                }),
            }
        }
    }
    for (ip, pods) in holders {
        let vms: BTreeSet<Option<&String>> = pods.iter().map(|p| p.vm.as_ref()).collect();
        // Two launchers of one VM: its live migration.
        let migration = vms.len() == 1 && vms.iter().all(Option::is_some);
        if pods.len() > 1 && !migration {
            let names: Vec<String> = pods
                .iter()
                .map(|p| format!("{} ({})", p.pod, p.node))
                .collect();
            found.push(Finding {
                kind: Kind::AddressOnTwoPods,
                node: None,
                subjects: std::iter::once(ip.to_string()).chain(pods.iter().map(|p| p.pod.clone())).collect(),
                what: format!("{ip} is reported by {} pods: {}", pods.len(), names.join(", ")),
                fix: "delete all but one of them (their traffic is mixed now); then run the check again".into(),
            });
        }
    }
    found
}

#[cfg(test)]
mod tests;
