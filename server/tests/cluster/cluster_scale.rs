//! Cluster mode's cost follows a node's own blocks, not the pool's size: a node's blocks are
//! its index, every listing that grows with a pool is paged (a pool past gRPC's 4 MiB reply
//! serves and lists), blocks claimed before the index are found after an upgrade, and every
//! etcd request goes through `store_rate`. A real etcd, real daemons.

use std::time::Duration;

use crate::common::etcd::Etcd;
use crate::common::*;
use ipool_server::cluster::etcd::{block_key_part, request, EtcdStore, DEFAULT_PREFIX};

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

async fn store(url: &str) -> EtcdStore {
    EtcdStore::connect(
        &[url.to_string()],
        DEFAULT_PREFIX,
        Duration::from_secs(20),
        None,
    )
    .await
    .expect("connect")
}

/// Writes `count` blocks of /26 from `first` (a pool's CIDR start) straight into etcd, 8 per
/// node `n0`, `n1`..., as claims write them: the block's owner and, with `index`, the node's
/// index entry. Quicker than claiming them one by one.
async fn write_blocks(s: &EtcdStore, pool: &str, first: u32, count: u32, index: bool) {
    let mut ops = Vec::new();
    for i in 0..count {
        let net: ipnet::IpNet = format!("{}/26", std::net::Ipv4Addr::from(first + i * 64))
            .parse()
            .unwrap();
        let node = format!("n{}", i / 8);
        let part = block_key_part(&net);
        let owner = format!("{{\"node\":\"{node}\",\"claimed_at_ms\":1}}");
        ops.push(request::op::put(
            format!("{DEFAULT_PREFIX}/blocks/{pool}/{part}"),
            owner,
            0,
        ));
        if index {
            ops.push(request::op::put(
                format!("{DEFAULT_PREFIX}/nodes/{node}/blocks/{pool}/{part}"),
                "",
                0,
            ));
        }
        if ops.len() >= 120 || i + 1 == count {
            let txn = request::txn([], std::mem::take(&mut ops), []);
            assert!(s.client().txn(txn).await.unwrap().succeeded);
        }
    }
}

/// A node's sync is two requests and a few hundred bytes per block, however big the pool.
#[test]
#[ignore = "needs etcd-server (apt-get install etcd-server); CI runs it with --include-ignored"]
fn a_nodes_sync_reads_its_own_blocks_whatever_the_pools_size() {
    let etcd = Etcd::start();
    etcd.create_pool(&["big", "--cidr", "10.0.0.0/10"]);
    rt().block_on(async {
        let s = store(&etcd.client_url).await;
        let first = u32::from(std::net::Ipv4Addr::new(10, 0, 0, 0));
        let mut costs = Vec::new();
        for total in [64u32, 8000] {
            write_blocks(&s, "big", first, total, true).await;
            let before = s.client().stats();
            let mine = s.node_blocks("n3", Some("big")).await.unwrap();
            let after = s.client().stats();
            assert_eq!(mine.blocks.len(), 8);
            assert!(mine.blocks.iter().all(|b| b.owner.node == "n3"));
            costs.push((after.requests - before.requests, after.bytes - before.bytes));
        }
        // The same cost with 64 blocks in the pool as with 8 000 (but for the revisions' digits).
        assert_eq!(costs[0].0, costs[1].0, "{costs:?}");
        assert!(costs[1].1 <= costs[0].1 + 64, "{costs:?}");
        assert!(costs[1].0 <= 2 && costs[1].1 < 2048, "{costs:?}");
    });
}

/// A pool whose listing is past gRPC's 4 MiB: a node joining it serves, and `ipoolctl cluster
/// blocks` (with and without --node) lists it, in pages.
#[test]
#[ignore = "needs etcd-server (apt-get install etcd-server); CI runs it with --include-ignored"]
fn a_pool_past_a_grpc_reply_serves_and_lists() {
    let etcd = Etcd::start();
    etcd.create_pool(&["huge", "--cidr", "100.64.0.0/10"]);
    let count = 50_000;
    rt().block_on(async {
        let s = store(&etcd.client_url).await;
        let first = u32::from(std::net::Ipv4Addr::new(100, 64, 0, 0));
        write_blocks(&s, "huge", first, count, true).await;
    });
    let d = etcd.daemon("joiner", "huge", "");
    let conf = d.conf("1.0.0", "pods", "");
    let r = add_within(30, "an ADD on the joining node", "j0", &conf);
    assert!(r.ok);
    let o = etcd.ctl(&["-o", "json", "blocks", "--node", "n7"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(json(&o).as_array().map(Vec::len), Some(8));
    let o = etcd.ctl(&["-o", "json", "blocks", "--pool", "huge"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(
        json(&o).as_array().map(Vec::len),
        Some(count as usize + 1),
        "every block, the joiner's too"
    );
}

/// Blocks claimed by an ipoold from before the index (no entry of theirs) are found when the
/// node's new ipoold starts, and release-node finds them too.
#[test]
#[ignore = "needs etcd-server (apt-get install etcd-server); CI runs it with --include-ignored"]
fn blocks_claimed_before_the_index_are_found_after_an_upgrade() {
    let etcd = Etcd::start();
    etcd.create_pool(&["up", "--cidr", "10.90.0.0/16"]);
    rt().block_on(async {
        let s = store(&etcd.client_url).await;
        let first = u32::from(std::net::Ipv4Addr::new(10, 90, 0, 0));
        // n0 and n1, 8 blocks each, no index; both ran an older ipoold (a `seen` key).
        write_blocks(&s, "up", first, 16, false).await;
        for n in ["n0", "n1"] {
            s.client()
                .put(request::put(
                    format!("{DEFAULT_PREFIX}/nodes/{n}/seen"),
                    "{\"at_ms\":1}",
                    0,
                ))
                .await
                .unwrap();
        }
        assert!(s.node_blocks("n0", None).await.unwrap().blocks.is_empty());
    });
    // n0's new daemon: its blocks are its own again.
    let d = etcd.daemon("n0", "up", "");
    let conf = d.conf("1.0.0", "pods", "");
    assert!(add_within(20, "ADD", "u0", &conf).ok);
    eventually(10, "the 8 old blocks in status", || {
        let s = pool_status(&d);
        let detail = s[0]["sourceDetail"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        match detail.contains("8 block(s) here") {
            true => Ok(()),
            false => Err(detail),
        }
    });
    d.wait_log(&["indexed this node's blocks", "blocks=8"]);
    // n1 never runs again: release-node finds its blocks in the pool.
    let o = etcd.ctl(&["release-node", "n1", "--force"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("8 block(s) given back"),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );
}

/// `store_rate` counts etcd requests, every one of them; status says when it made a claim wait.
#[test]
#[ignore = "needs etcd-server (apt-get install etcd-server); CI runs it with --include-ignored"]
fn the_etcd_rate_limit_counts_every_request_and_status_says_when_it_waits() {
    let etcd = Etcd::start();
    etcd.create_pool(&["rl", "--cidr", "10.91.0.0/24", "--block-size", "28"]);
    let d = etcd.daemon(
        "n-rate",
        "rl",
        "store_rate = 2.0\netcd_burst = 1\nclaim_ahead = 1",
    );
    let conf = d.conf("1.0.0", "pods", "");
    let started = std::time::Instant::now();
    for k in 0..40 {
        assert!(add_within(30, "ADD", &format!("r{k}"), &conf).ok);
    }
    // Four blocks of 13 were claimed (each a listing and a transaction, besides the syncs and
    // the heartbeat): at 2 requests/s that takes seconds.
    assert!(
        started.elapsed() >= Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    let detail = eventually(10, "the rate note in status", || {
        let s = pool_status(&d);
        let detail = s[0]["sourceDetail"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        match detail.contains("store_rate: a request waited") {
            true => Ok(detail),
            false => Err(detail),
        }
    });
    assert!(detail.contains("store_rate 2/s"), "{detail}");
    // The heartbeat never waits: the node was never fenced.
    assert!(!d.log().contains("fenced"), "{}", d.log());
}
