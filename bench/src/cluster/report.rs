//! Cluster mode's tables and JSON.

use std::fmt::Write as _;

use serde_json::{json, Value};

use super::{ClaimRun, Cluster, ClusterReport};
use crate::stats::{micros, Summary};

/// The targets on a 2-core machine.
const ADD_RATIO_GOAL: f64 = 1.1;
const CLAIM_P50_GOAL_MS: f64 = 5.0;
const CLAIMS_PER_S_GOAL: f64 = 1000.0;
const FIRST_BLOCKS_GOAL_S: f64 = 10.0;
const JOIN_GOAL_S: f64 = 1.0;
const RESYNC_GOAL_MS: f64 = 50.0;
const CTL_NODE_GOAL_S: f64 = 1.0;
const RESYNC_BYTES_GOAL: f64 = 2048.0;

pub(super) fn verdict(ok: bool) -> &'static str {
    match ok {
        true => "met",
        false => "**missed**",
    }
}

impl Cluster {
    pub fn markdown(&self, o: &mut String) {
        let r = match self {
            Cluster::Skipped(why) => {
                let _ = writeln!(o, "\n## Cluster mode\n\nSkipped: {why}.");
                return;
            }
            Cluster::Ran(r) => r,
        };
        r.markdown(o);
    }

    pub fn json(&self) -> Value {
        match self {
            Cluster::Skipped(why) => json!({ "skipped": why }),
            Cluster::Ran(r) => r.json(),
        }
    }
}

impl ClusterReport {
    fn markdown(&self, o: &mut String) {
        let _ = writeln!(
            o,
            "\n## Cluster mode ({}, one member, data in the temp dir)\n\n\
             ADD and DEL through the plugin: a network on a cluster pool (by block, and one \
             addressed as one subnet with a gateway and excluded addresses) and a local network \
             of the same ipoold, interleaved (ms). Blocks are claimed in the background; the daemon \
             owned {} block(s) of /26 at the end.\n",
            self.etcd, self.add.blocks
        );
        let _ = writeln!(
            o,
            "| op | cluster p50 | cluster p99 | local p50 | local p99 | cluster/local p50 | goal (<= {ADD_RATIO_GOAL:.1}) |"
        );
        let _ = writeln!(o, "|---|---:|---:|---:|---:|---:|---|");
        let a = &self.add;
        for (op, c, l) in [
            ("ADD", &a.cluster_add, &a.local_add),
            ("DEL", &a.cluster_del, &a.local_del),
            ("ADD, one subnet", &a.subnet_add, &a.local_add),
            ("DEL, one subnet", &a.subnet_del, &a.local_del),
        ] {
            let (c, l) = (Summary::of(c), Summary::of(l));
            let ratio = c.p50 / l.p50.max(f64::MIN_POSITIVE);
            let goal = match op {
                "ADD" | "ADD, one subnet" => verdict(ratio <= ADD_RATIO_GOAL),
                _ => "-",
            };
            let _ = writeln!(
                o,
                "| {op} | {:.2} | {:.2} | {:.2} | {:.2} | {ratio:.2} | {goal} |",
                c.p50, c.p99, l.p50, l.p99
            );
        }

        let _ = writeln!(
            o,
            "\nBlock claims by simulated nodes, each with its own etcd connection, running the \
             daemon's claim code (`claim::claim_next`: one create-if-absent transaction \
             per candidate of the node's view of the pool, in the node's order; the view is \
             listed when missing, a minute old, after four losses in a row, or before the pool \
             is called full). Every run ends \
             with a check of etcd's listing against the claims won: each block won once, listed \
             as its winner's, none overlapping.\n"
        );
        let _ = writeln!(o, "| measurement | value | target |\n|---|---:|---|");
        let s = &self.sequential;
        let sum = Summary::of(&s.latencies);
        let _ = writeln!(
            o,
            "| claim latency, one node, {} claims back to back: p50 | {:.2} ms | < {CLAIM_P50_GOAL_MS} ms: {} |",
            s.claims,
            sum.p50,
            verdict(sum.p50 < CLAIM_P50_GOAL_MS)
        );
        let _ = writeln!(o, "| claim latency: p99 | {:.2} ms | - |", sum.p99);
        for r in &self.rates {
            let sum = Summary::of(&r.latencies);
            let target = match r.claimers {
                100 => format!(
                    ">= {CLAIMS_PER_S_GOAL:.0}/s: {}",
                    verdict(r.rate() >= CLAIMS_PER_S_GOAL)
                ),
                _ => "-".into(),
            };
            let _ = writeln!(
                o,
                "| claims/s, {} claimer(s) ({} claims in {:.1} s; claim p50 {:.2} ms, p99 {:.2} ms; {} conflicts) | {:.0} | {target} |",
                r.claimers,
                r.claims,
                r.elapsed.as_secs_f64(),
                sum.p50,
                sum.p99,
                r.lost,
                r.rate()
            );
        }
        let f = &self.first;
        let sum = Summary::of(&f.latencies);
        let _ = writeln!(
            o,
            "| {} nodes starting together, each claiming its first block: time to the last block (etcd clients made before the start: {:.1} s; claim p50 {:.1} ms, p99 {:.1} ms) | {:.2} s | < {FIRST_BLOCKS_GOAL_S} s: {} |",
            f.claimers,
            f.setup.as_secs_f64(),
            sum.p50,
            sum.p99,
            f.elapsed.as_secs_f64(),
            verdict(f.elapsed.as_secs_f64() < FIRST_BLOCKS_GOAL_S)
        );
        let _ = writeln!(
            o,
            "| ... conflicts (a candidate another node won first) | {} | - |",
            f.lost
        );
        let checked: usize = self.sequential.verified
            + self.rates.iter().map(|r| r.verified).sum::<usize>()
            + f.verified;
        let _ = writeln!(
            o,
            "| blocks with two owners, over all the runs ({checked} blocks checked) | 0 | 0 |"
        );
        self.scale_markdown(o);
        self.load.markdown(o);
    }

    fn scale_markdown(&self, o: &mut String) {
        let x = &self.scale;
        let nodes = x.scale.owned / super::scale::PER_NODE;
        let _ = writeln!(
            o,
            "\n### At scale: {} blocks of {} owned by {nodes} other nodes ({} each), written in {:.1} s\n",
            x.scale.owned,
            x.pool,
            super::scale::PER_NODE,
            x.fill.as_secs_f64()
        );
        let _ = writeln!(o, "| measurement | value | target |\n|---|---:|---|");
        let _ = writeln!(
            o,
            "| a joining node: ipoold started -> its first ADD answered (its index made, the pool's view read in pages, a block claimed) | {:.2} s | < {JOIN_GOAL_S} s: {} |",
            x.join_first_add.as_secs_f64(),
            verdict(x.join_first_add.as_secs_f64() < JOIN_GOAL_S)
        );
        let sum = Summary::of(&x.resync);
        let _ = writeln!(
            o,
            "| a node's resync ({} blocks: its index, checked), p50 / p99 | {:.2} / {:.2} ms | < {RESYNC_GOAL_MS} ms: {} |",
            super::scale::PER_NODE,
            sum.p50,
            sum.p99,
            verdict(sum.p99 < RESYNC_GOAL_MS)
        );
        let _ = writeln!(
            o,
            "| ... etcd requests and bytes read per resync | {:.1} requests, {:.0} B | < {RESYNC_BYTES_GOAL:.0} B: {} |",
            x.resync_requests,
            x.resync_bytes,
            verdict(x.resync_bytes < RESYNC_BYTES_GOAL)
        );
        let _ = writeln!(
            o,
            "| before the index, a sync was a listing of the whole pool: its time, requests and bytes (then one reply, past gRPC's 4 MiB past ~35 000 blocks) | {:.0} ms, {} requests, {:.1} MiB | - |",
            x.full_listing.as_secs_f64() * 1e3,
            x.full_listing_requests,
            x.full_listing_bytes as f64 / 1048576.0
        );
        let _ = writeln!(
            o,
            "| `ipoolctl cluster blocks --node` | {:.2} s | < {CTL_NODE_GOAL_S} s: {} |",
            x.ctl_node.as_secs_f64(),
            verdict(x.ctl_node.as_secs_f64() < CTL_NODE_GOAL_S)
        );
        let per = x.many_bytes as f64 / x.scale.resyncing.max(1) as f64;
        let _ = writeln!(
            o,
            "| {} nodes resyncing once (64 connections): all done | {:.2} s | - |",
            x.scale.resyncing,
            x.many.as_secs_f64()
        );
        let _ = writeln!(
            o,
            "| ... etcd requests, bytes read (total; per node) | {}, {:.1} MiB; {:.1}, {per:.0} B | < {RESYNC_BYTES_GOAL:.0} B per node: {} |",
            x.many_requests,
            x.many_bytes as f64 / 1048576.0,
            x.many_requests as f64 / x.scale.resyncing.max(1) as f64,
            verdict(per < RESYNC_BYTES_GOAL)
        );
        let f = &x.fill90;
        let sum = Summary::of(&f.latencies);
        let _ = writeln!(
            o,
            "| claims/s, {} claimers at 90 % fill until the pool is full ({} claims in {:.2} s; claim p50 {:.2} ms, p99 {:.2} ms; {} conflicts; {} blocks checked) | {:.0} | - |",
            f.claimers,
            f.claims,
            f.elapsed.as_secs_f64(),
            sum.p50,
            sum.p99,
            f.lost,
            f.verified,
            f.rate()
        );
    }

    fn json(&self) -> Value {
        let run = |r: &ClaimRun| {
            json!({
                "claimers": r.claimers,
                "claims": r.claims,
                "conflicts": r.lost,
                "elapsed_s": r.elapsed.as_secs_f64(),
                "claims_per_s": r.rate(),
                "latency": Summary::of(&r.latencies).json(),
                "verified_blocks": r.verified,
            })
        };
        let a = &self.add;
        json!({
            "etcd": self.etcd,
            "add": {
                "cluster": Summary::of(&a.cluster_add).json(),
                "local": Summary::of(&a.local_add).json(),
                "cluster_us": micros(&a.cluster_add),
                "local_us": micros(&a.local_add),
                "blocks_owned": a.blocks,
            },
            "del": {
                "cluster": Summary::of(&a.cluster_del).json(),
                "local": Summary::of(&a.local_del).json(),
            },
            "subnet": {
                "add": Summary::of(&a.subnet_add).json(),
                "del": Summary::of(&a.subnet_del).json(),
            },
            "store_load": self.load.json(),
            "sequential_claims": run(&self.sequential),
            "concurrent_claims": self.rates.iter().map(run).collect::<Vec<_>>(),
            "scale": {
                "owned_blocks": self.scale.scale.owned,
                "pool": self.scale.pool,
                "fill_s": self.scale.fill.as_secs_f64(),
                "join_first_add_s": self.scale.join_first_add.as_secs_f64(),
                "resync": Summary::of(&self.scale.resync).json(),
                "resync_requests": self.scale.resync_requests,
                "resync_bytes": self.scale.resync_bytes,
                "full_listing_ms": self.scale.full_listing.as_secs_f64() * 1e3,
                "full_listing_requests": self.scale.full_listing_requests,
                "full_listing_bytes": self.scale.full_listing_bytes,
                "ctl_blocks_node_s": self.scale.ctl_node.as_secs_f64(),
                "resyncing_nodes": self.scale.scale.resyncing,
                "resync_all_s": self.scale.many.as_secs_f64(),
                "resync_all_requests": self.scale.many_requests,
                "resync_all_bytes": self.scale.many_bytes,
                "fill90": run(&self.scale.fill90),
            },
            "first_blocks": {
                "nodes": self.first.claimers,
                "connect_s": self.first.setup.as_secs_f64(),
                "elapsed_s": self.first.elapsed.as_secs_f64(),
                "conflicts": self.first.lost,
                "latency": Summary::of(&self.first.latencies).json(),
                "verified_blocks": self.first.verified,
            },
        })
    }
}
