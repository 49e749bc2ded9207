//! The store-load rows' table and JSON (see `load`).

use std::fmt::Write as _;

use serde_json::{json, Value};

use super::load::{LoadReport, LoadRow};
use super::report::verdict;
use crate::stats::Summary;

/// The targets, per node per minute at steady state.
const WRITES_GOAL: f64 = 6.0;
const LISTS_GOAL: f64 = 1.0;
/// A block taken by another node, noticed by its old owner within this (ms).
const NOTICED_GOAL_MS: f64 = 1000.0;
/// The cluster the figures are scaled to.
const NODES: f64 = 5000.0;

impl LoadRow {
    fn label(&self) -> String {
        format!(
            "{}, {}, {}",
            self.store,
            if self.dual { "dual-stack" } else { "IPv4" },
            match (self.churn, self.pins) {
                (true, true) => "10 moves of a fixed-address pod a minute (one subnet)",
                (true, false) => "10 ADD/DEL a minute",
                (false, _) => "idle",
            }
        )
    }

    /// Lists and watches made (a watch counts once): the apiserver's; etcd's counters do not
    /// tell a key's read from a prefix's.
    fn lists(&self) -> Option<f64> {
        match self.store {
            "etcd" => None,
            _ => Some(self.per_node_minute(self.used.reads + self.used.watches)),
        }
    }
}

impl LoadReport {
    pub fn markdown(&self, o: &mut String) {
        let Some(first) = self.rows.first() else {
            return;
        };
        let _ = writeln!(
            o,
            "\nWhat nodes at steady state cost their store, counted at the store: the \
             fake apiserver's requests and bytes sent (`ipool_testkit::fake_api`, real HTTP), a \
             real etcd's own counters (`/metrics`). {} real ipoold per row, each with a pod, \
             `heartbeat_ttl_secs` {} (a renewal every {} s; 30 by default), `resync_secs` at its \
             default (10 min), over {:.0} s; per node per minute. On etcd a renewal is two lease keep-alives (not writes: the leader \
             renews them), and the node's name is read back only when its watch says it changed \
             or the watch was made again; reads there are key reads or lists (etcd's counters do \
             not tell them apart). 5 000 nodes: the apiserver's (etcd's) \
             requests and writes a second.\n",
            first.nodes,
            self.heartbeat_ttl,
            self.heartbeat_ttl / 3,
            first.window.as_secs_f64()
        );
        let _ = writeln!(
            o,
            "| store, stack, pods | requests | writes | renewals | reads (lists) | GETs | watches made | bytes | 5 000 nodes: requests/s, writes/s | writes <= {WRITES_GOAL:.0}, lists <= {LISTS_GOAL:.0} |"
        );
        let _ = writeln!(o, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|");
        for r in &self.rows {
            let u = &r.used;
            let pm = |c: u64| r.per_node_minute(c);
            let lists_ok = r.lists().is_none_or(|l| l <= LISTS_GOAL);
            let _ = writeln!(
                o,
                "| {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.2} | {:.0} | {:.0}, {:.0} | {} |",
                r.label(),
                pm(u.requests),
                pm(u.writes),
                pm(u.renewals),
                pm(u.reads),
                pm(u.gets),
                pm(u.watches),
                pm(u.bytes),
                pm(u.requests) * NODES / 60.0,
                pm(u.writes) * NODES / 60.0,
                match r.pins {
                    // A move writes the pin twice by design (let go, taken over): not the
                    // steady state the goals are for.
                    true => "- (a pin's writes per move)",
                    false => verdict(pm(u.writes) <= WRITES_GOAL && lists_ok),
                }
            );
        }
        let _ = writeln!(
            o,
            "\nA block of a node's made another node's in one write: how soon the node says it \
             hands out nothing more from it (its store's watch; `resync_secs` at its default).\n"
        );
        let _ = writeln!(
            o,
            "| store | runs | p50 | p99 | < {NOTICED_GOAL_MS:.0} ms |"
        );
        let _ = writeln!(o, "|---|---:|---:|---:|---|");
        for n in &self.noticed {
            let s = Summary::of(&n.samples);
            let _ = writeln!(
                o,
                "| {} | {} | {:.1} ms | {:.1} ms | {} |",
                n.store,
                s.n,
                s.p50,
                s.p99,
                verdict(s.p99 < NOTICED_GOAL_MS)
            );
        }
    }

    pub fn json(&self) -> Value {
        json!({
            "steady_state": self.rows.iter().map(|r| {
                let pm = |c: u64| r.per_node_minute(c);
                json!({
                    "store": r.store,
                    "dual_stack": r.dual,
                    "add_del_per_minute": if r.churn { 10 } else { 0 },
                    "fixed_address_pods_moved": r.pins,
                    "nodes": r.nodes,
                    "window_s": r.window.as_secs_f64(),
                    "per_node_per_minute": {
                        "requests": pm(r.used.requests),
                        "writes": pm(r.used.writes),
                        "renewals": pm(r.used.renewals),
                        "reads": pm(r.used.reads),
                        "gets": pm(r.used.gets),
                        "watches": pm(r.used.watches),
                        "bytes": pm(r.used.bytes),
                    },
                    "nodes_5000_per_s": {
                        "requests": pm(r.used.requests) * NODES / 60.0,
                        "writes": pm(r.used.writes) * NODES / 60.0,
                    },
                })
            }).collect::<Vec<_>>(),
            "block_taken_noticed": self.noticed.iter().map(|n| json!({
                "store": n.store,
                "latency": Summary::of(&n.samples).json(),
            })).collect::<Vec<_>>(),
        })
    }
}
