//! What a randomized fault test saw, and the checker over it (as Jepsen checks a history):
//!
//! - every acknowledged ADD holds its address from its acknowledgement until the first DEL of
//!   its container was called, or until its node was wiped (its pods gone with it), or to the
//!   end. No two holds of one address overlap, on one node or across nodes: a hold's interval
//!   is the shortest the pod surely had the address, so an overlap is a real duplicate;
//! - at the end, every hold still open is listed by its node's daemon with its address, and no
//!   daemon lists an attachment that no open hold explains (a leak), nor an address another
//!   daemon lists;
//! - a pod with a fixed address (`ipool.io/fixed`) names its owner: two holds of one address
//!   may overlap only when both are launcher pods of one VM (a live migration).
#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::time::Instant;

/// One attachment as the history knows it.
#[derive(Clone, Debug)]
pub struct Hold {
    pub node: String,
    pub container: String,
    pub ip: IpAddr,
    /// When the ADD's answer came (seconds since the test started).
    pub from: f64,
    /// When the first DEL was called, or the node wiped; None: held at the end.
    pub until: Option<f64>,
    pub how_ended: &'static str,
    /// The owner of the pod's fixed address (`VirtualMachine/ns/vm`, ...), if it has one.
    pub owner: Option<String>,
}

impl Hold {
    /// Whether `self` and `other` may hold one address at once: two launchers of one VM.
    pub fn may_share(&self, other: &Hold) -> bool {
        match (&self.owner, &other.owner) {
            (Some(a), Some(b)) => a == b && a.starts_with("VirtualMachine/"),
            _ => false,
        }
    }
}

#[derive(Default)]
pub struct History {
    started: Option<Instant>,
    pub holds: Vec<Hold>,
    /// Faults made, for the report: what, and when.
    pub faults: Vec<(f64, String)>,
    /// Nodes wiped, and when.
    wipes: Vec<(String, f64)>,
    pub adds_ok: usize,
    pub adds_failed: usize,
    /// Why ADDs failed: the CNI code and the start of the message, counted.
    pub failures: BTreeMap<String, usize>,
    pub dels: usize,
}

impl History {
    pub fn new() -> History {
        History {
            started: Some(Instant::now()),
            ..History::default()
        }
    }

    pub fn now(&self) -> f64 {
        self.started.map_or(0.0, |t| t.elapsed().as_secs_f64())
    }

    /// An ADD on `node` acknowledged with `ip` at `at`.
    pub fn acked(&mut self, node: &str, container: &str, ip: IpAddr, at: f64) {
        self.acked_all(node, container, &[ip], at);
    }

    /// An ADD on `node` acknowledged with `ips` (one per family) at `at`.
    pub fn acked_all(&mut self, node: &str, container: &str, ips: &[IpAddr], at: f64) {
        self.acked_owned(node, container, ips, at, None);
    }

    /// The same, of a pod whose address is fixed for `owner`.
    pub fn acked_owned(
        &mut self,
        node: &str,
        container: &str,
        ips: &[IpAddr],
        at: f64,
        owner: Option<&str>,
    ) {
        self.adds_ok += 1;
        for ip in ips {
            self.hold(node, container, *ip, at, owner);
        }
    }

    fn hold(&mut self, node: &str, container: &str, ip: IpAddr, at: f64, owner: Option<&str>) {
        // Answered before a wipe that was recorded first: it ended with the node.
        let wiped = self
            .wipes
            .iter()
            .filter(|(n, w)| n == node && *w >= at)
            .map(|(_, w)| *w)
            .reduce(f64::min);
        self.holds.push(Hold {
            node: node.into(),
            container: container.into(),
            ip,
            from: at,
            until: wiped,
            how_ended: if wiped.is_some() { "node wiped" } else { "" },
            owner: owner.map(str::to_string),
        });
    }

    /// The first DEL of `container` on `node` was called at `at`.
    pub fn deleting(&mut self, node: &str, container: &str, at: f64) {
        self.dels += 1;
        for h in self.holds.iter_mut() {
            if h.until.is_none() && h.node == node && h.container == container {
                h.until = Some(at);
                h.how_ended = "DEL";
            }
        }
    }

    /// `node`'s store was wiped at `at`: its pods are gone with it.
    pub fn wiped(&mut self, node: &str, at: f64) {
        self.wipes.push((node.to_string(), at));
        for h in self.holds.iter_mut() {
            if h.until.is_none() && h.node == node {
                h.until = Some(at);
                h.how_ended = "node wiped";
            }
        }
        self.fault(at, format!("{node}: store wiped"));
    }

    pub fn fault(&mut self, at: f64, what: String) {
        self.faults.push((at, what));
    }

    /// Holds of one address that overlap in time: each a duplicate.
    pub fn overlaps(&self) -> Vec<(Hold, Hold)> {
        let mut by_ip: BTreeMap<IpAddr, Vec<&Hold>> = BTreeMap::new();
        for h in &self.holds {
            by_ip.entry(h.ip).or_default().push(h);
        }
        let mut out = Vec::new();
        for holds in by_ip.values() {
            for (i, a) in holds.iter().enumerate() {
                for b in &holds[i + 1..] {
                    let a_end = a.until.unwrap_or(f64::INFINITY);
                    let b_end = b.until.unwrap_or(f64::INFINITY);
                    if a.from < b_end && b.from < a_end && !a.may_share(b) {
                        out.push(((*a).clone(), (*b).clone()));
                    }
                }
            }
        }
        out
    }

    /// The holds still open: what the daemons must list at the end.
    pub fn open(&self) -> Vec<&Hold> {
        self.holds.iter().filter(|h| h.until.is_none()).collect()
    }

    /// Compares the end with what each node's daemon lists (node -> (container, address)):
    /// every problem, in words.
    pub fn check_end(&self, listed: &BTreeMap<String, BTreeSet<(String, IpAddr)>>) -> Vec<String> {
        let mut problems = Vec::new();
        for h in self.open() {
            let there = listed
                .get(&h.node)
                .is_some_and(|l| l.contains(&(h.container.clone(), h.ip)));
            if !there {
                problems.push(format!(
                    "acknowledged {} {} on {} (at {:.2} s) is no longer held, and no DEL released it",
                    h.container, h.ip, h.node, h.from
                ));
            }
        }
        let open = self.open();
        let mut seen: BTreeMap<IpAddr, (&str, Option<&Hold>)> = BTreeMap::new();
        for (node, l) in listed {
            for (container, ip) in l {
                let hold = open
                    .iter()
                    .find(|h| &h.node == node && &h.container == container && h.ip == *ip)
                    .copied();
                if hold.is_none() {
                    problems.push(format!(
                        "{node} holds {container} {ip}, which no acknowledged ADD without a DEL explains (a leak)"
                    ));
                }
                if let Some((other, other_hold)) = seen.insert(*ip, (node, hold)) {
                    let shared = matches!((hold, other_hold), (Some(a), Some(b)) if a.may_share(b));
                    if !shared {
                        problems.push(format!("{ip} is held on {other} and on {node}"));
                    }
                }
            }
        }
        problems
    }

    /// An ADD failed with CNI error `code`, saying `why`.
    pub fn add_failed(&mut self, code: u64, why: &str) {
        self.adds_failed += 1;
        // The reason without the parts that change from one call to the next.
        let gist: String = why
            .split("/tmp/")
            .next()
            .unwrap_or_default()
            .chars()
            .map(|c| if c.is_ascii_digit() { '#' } else { c })
            .take(150)
            .collect();
        *self.failures.entry(format!("{code} {gist}")).or_default() += 1;
    }

    /// A few lines on what happened.
    pub fn summary(&self) -> String {
        let mut why: Vec<(&String, &usize)> = self.failures.iter().collect();
        why.sort_by(|a, b| b.1.cmp(a.1));
        let why: Vec<String> = why
            .iter()
            .take(4)
            .map(|(w, n)| format!("{n}x {w}"))
            .collect();
        format!(
            "{} ADDs acknowledged, {} failed ({}), {} DELs, {} faults, {} addresses held at the end",
            self.adds_ok,
            self.adds_failed,
            why.join("; "),
            self.dels,
            self.faults.len(),
            self.open().len()
        )
    }
}

/// A small seeded generator (splitmix64): the fault schedule follows from the seed.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `0..n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64 <= p
    }
}
