//! Cluster mode's etcd layer against a real etcd: pools, block claims (one winner, however
//! many race), give-backs conditioned on ownership, and a pool that cannot be deleted while a
//! block of it is owned.

use crate::common;

use std::time::Duration;

use crate::common::etcd::Etcd;
use ipnet::IpNet;
use ipool_server::cluster::claim::{self, ClaimOutcome, Views};
use ipool_server::cluster::datastore::{BlockStore, PoolStore};
use ipool_server::cluster::etcd::{EtcdStore, DEFAULT_PREFIX};
use ipool_server::cluster::ippool::PoolSpec;
use ipool_server::cluster::vocab::Claimed;

fn net(s: &str) -> IpNet {
    s.parse().unwrap()
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

async fn store(e: &Etcd) -> EtcdStore {
    EtcdStore::connect(
        std::slice::from_ref(&e.client_url),
        DEFAULT_PREFIX,
        Duration::from_secs(5),
        None,
    )
    .await
    .expect("connect")
}

/// Claims `block` of `pool` for `node`, conditioned on the pool as read now.
async fn claim(s: &EtcdStore, pool: &str, block: &IpNet, node: &str) -> Claimed {
    let revision = s.get_pool(pool).await.unwrap().map_or(0, |p| p.revision);
    s.claim(pool, revision, block, node).await.unwrap()
}

thread_local! {
    /// The nodes' kept views of the pools (each test runs on a thread of its own).
    static VIEWS: Views = Views::default();
}

/// The next block of `p` for `node` (one family), conditioned on the pool as read now, from
/// the node's kept view.
async fn claim_next(s: &EtcdStore, p: &PoolSpec, v4: bool, node: &str) -> ClaimOutcome {
    let revision = s
        .get_pool(&p.name)
        .await
        .unwrap()
        .expect("the pool")
        .revision;
    let views = VIEWS.with(|v| v.clone());
    claim::claim_next(s, &views, p, revision, v4, node)
        .await
        .unwrap()
}

fn pool(name: &str, cidrs: &[&str], exclude: &[&str]) -> PoolSpec {
    PoolSpec {
        name: name.into(),
        cidrs: cidrs.iter().map(|c| net(c)).collect(),
        block_v4: 26,
        block_v6: 122,
        exclude: exclude.iter().map(|c| net(c)).collect(),
        ..PoolSpec::default()
    }
}

#[test]
#[ignore = "needs etcd-server (apt-get install etcd-server); CI runs it with --include-ignored"]
fn pools_are_created_listed_and_deleted_only_when_no_block_is_owned() {
    let e = Etcd::start();
    rt().block_on(async {
        let s = store(&e).await;
        s.create_pool(&pool("a", &["10.8.0.0/16"], &[]))
            .await
            .unwrap();
        let dup = s.create_pool(&pool("a", &["10.9.0.0/16"], &[])).await;
        assert!(dup.unwrap_err().to_string().contains("exists already"));
        let overlap = s.create_pool(&pool("b", &["10.8.128.0/17"], &[])).await;
        let msg = overlap.unwrap_err().to_string();
        assert!(msg.contains("overlaps") && msg.contains("\"a\""), "{msg}");
        s.create_pool(&pool("v6", &["fd00:8::/112"], &[]))
            .await
            .unwrap();
        let names: Vec<String> = s
            .pools()
            .await
            .unwrap()
            .pools
            .into_iter()
            .map(|p| p.spec.name)
            .collect();
        assert_eq!(names, ["a", "v6"]);

        let b = match claim(&s, "a", &net("10.8.0.0/26"), "n1").await {
            Claimed::Won(b) => b,
            other => panic!("{other:?}"),
        };
        let refused = s.delete_pool("a").await.unwrap_err().to_string();
        assert!(refused.contains("1 owned block"), "{refused}");
        assert!(s.give_back(&b).await.unwrap());
        assert!(!s.give_back(&b).await.unwrap(), "given back once");
        s.delete_pool("a").await.unwrap();
        assert!(s
            .delete_pool("a")
            .await
            .unwrap_err()
            .to_string()
            .contains("no pool"));
        // A claim in a deleted pool is refused.
        assert_eq!(
            claim(&s, "a", &net("10.8.0.64/26"), "n1").await,
            Claimed::NoPool
        );
    });
}

/// Several endpoints: a dead one is passed over within the call, and when the member in use
/// stops, calls fail only until the next member serves (the two left elect a leader if the
/// stopped one led); writes made through one member are read through another.
#[test]
#[ignore = "needs etcd-server (apt-get install etcd-server); CI runs it with --include-ignored"]
fn a_store_on_several_endpoints_fails_over_to_a_member_that_answers() {
    let mut members = Etcd::start_cluster(3);
    let dead = format!("http://127.0.0.1:{}", common::free_port());
    let mut urls = vec![dead];
    urls.extend(members.iter().map(|m| m.client_url.clone()));
    rt().block_on(async {
        let s = EtcdStore::connect(&urls, DEFAULT_PREFIX, Duration::from_secs(2), None)
            .await
            .expect("connect past a dead endpoint");
        s.create_pool(&pool("f", &["10.50.0.0/16"], &[]))
            .await
            .unwrap();
        let revision = s.get_pool("f").await.unwrap().unwrap().revision;
        // The client uses the first member that answered: stop it.
        members[0].stop();
        let mut failed = Vec::new();
        let mut won = 0;
        let started = std::time::Instant::now();
        for i in 0..=255u8 {
            match s
                .claim("f", revision, &net(&format!("10.50.{i}.0/26")), "n1")
                .await
            {
                Ok(Claimed::Won(_)) => won += 1,
                Ok(other) => panic!("{other:?}"),
                Err(e) => {
                    assert!(e.is_unreachable(), "{e}");
                    assert_eq!(won, 0, "a call failed after one had succeeded: {e}");
                    failed.push(e.to_string());
                }
            }
            if won == 5 {
                break;
            }
        }
        assert_eq!(won, 5, "{failed:?}");
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "{:?} to fail over: {failed:?}",
            started.elapsed()
        );
        // What was written is there, read through a member the first client did not use.
        let other = EtcdStore::connect(
            std::slice::from_ref(&members[2].client_url),
            DEFAULT_PREFIX,
            Duration::from_secs(2),
            None,
        )
        .await
        .unwrap();
        let listed = other.list_blocks(Some("f"), Some("n1")).await.unwrap();
        assert!(listed.blocks.len() >= won, "{listed:?}");
    });
}

/// Pools created at the same instant with overlapping CIDRs: exactly one is created.
#[test]
#[ignore = "needs etcd-server (apt-get install etcd-server); CI runs it with --include-ignored"]
fn overlapping_pools_created_together_are_refused_but_one() {
    let e = Etcd::start();
    rt().block_on(async {
        let mut tasks = Vec::new();
        for i in 0..8 {
            let s = store(&e).await;
            tasks.push(tokio::spawn(async move {
                let p = pool(&format!("p{i}"), &[&format!("10.40.{i}.0/24")], &[]);
                let wide = pool(&format!("wide{i}"), &["10.40.0.0/16"], &[]);
                let (a, b) = tokio::join!(s.create_pool(&p), s.create_pool(&wide));
                (a.is_ok(), b.is_ok())
            }));
        }
        let mut created = 0;
        for t in tasks {
            let (a, b) = t.await.unwrap();
            created += a as usize + b as usize;
        }
        let s = store(&e).await;
        let pools = s.pools().await.unwrap().pools;
        assert_eq!(created, pools.len());
        for (i, a) in pools.iter().enumerate() {
            for b in &pools[i + 1..] {
                for x in &a.spec.cidrs {
                    assert!(
                        !b.spec.cidrs.iter().any(|y| x.contains(y) || y.contains(x)),
                        "pools {} and {} overlap: {pools:?}",
                        a.spec.name,
                        b.spec.name
                    );
                }
            }
        }
    });
}

#[test]
#[ignore = "needs etcd-server (apt-get install etcd-server); CI runs it with --include-ignored"]
fn racing_claimers_never_share_a_block() {
    let e = Etcd::start();
    rt().block_on(async {
        let s = store(&e).await;
        // 16 blocks, one excluded: 15 to win among 20 nodes.
        let p = pool("race", &["10.10.0.0/22"], &["10.10.3.192/26"]);
        s.create_pool(&p).await.unwrap();
        let mut tasks = Vec::new();
        for i in 0..20 {
            let (s, p) = (s.clone(), p.clone());
            tasks.push(tokio::spawn(async move {
                let revision = s.get_pool(&p.name).await?.expect("the pool").revision;
                claim::claim_next(
                    &s,
                    &Views::default(),
                    &p,
                    revision,
                    true,
                    &format!("node-{i}"),
                )
                .await
                .map(|o| o.block)
            }));
        }
        let mut won = Vec::new();
        let mut empty = 0;
        for t in tasks {
            match t.await.unwrap().unwrap() {
                Some(b) => won.push(b.block),
                None => empty += 1,
            }
        }
        assert_eq!(won.len(), 15, "{won:?}");
        assert_eq!(empty, 5);
        let mut unique = won.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), 15, "a block won twice: {won:?}");
        assert!(!won.contains(&net("10.10.3.192/26")), "the excluded block");
        let listed = s.list_blocks(Some("race"), None).await.unwrap();
        assert_eq!(listed.blocks.len(), 15);
        let n3 = s.list_blocks(None, Some("node-3")).await.unwrap();
        assert!(n3.blocks.len() <= 1);
    });
}

/// A node claims from the view of the pool it listed before: one transaction per claim, and
/// each block another node won since costs a lost candidate (etcd decides: never a second
/// owner). After four losses in a row, or when the view has no free block left, it lists
/// again: a block given back since is found before the pool is called full.
#[test]
#[ignore = "needs etcd-server (apt-get install etcd-server); CI runs it with --include-ignored"]
fn a_kept_view_costs_lost_candidates_and_is_listed_again() {
    let e = Etcd::start();
    rt().block_on(async {
        let (a, b) = (store(&e).await, store(&e).await);
        let p = pool("view", &["10.14.0.0/22"], &[]); // 16 blocks
        a.create_pool(&p).await.unwrap();
        let claim_a = || claim_next(&a, &p, true, "node-a");
        let first = claim_a().await.block.unwrap().block;
        // node-a's next candidates, in its order.
        let mut set = p.carve().unwrap().remove(0);
        set.occupy(first);
        let order: Vec<IpNet> = set.free_in_order("node-a").collect();
        let mut b_won = Vec::new();
        for blk in &order[..2] {
            match claim(&b, "view", blk, "node-b").await {
                Claimed::Won(won) => b_won.push(won),
                other => panic!("{other:?}"),
            }
        }
        let out = claim_a().await;
        assert_eq!(out.lost, 2, "node-a claimed from its kept view: {out:?}");
        assert_eq!(out.block.unwrap().block, order[2]);
        for blk in &order[3..8] {
            assert!(matches!(
                claim(&b, "view", blk, "node-b").await,
                Claimed::Won(_)
            ));
        }
        let out = claim_a().await;
        assert_eq!(out.lost, 4, "four losses, then a listing: {out:?}");
        assert_eq!(out.block.unwrap().block, order[8]);
        for _ in 0..4 {
            assert_eq!(claim_a().await.lost, 0);
        }
        // 7 blocks node-a's, 7 node-b's; node-b takes the other 2, then gives one back.
        while claim_next(&b, &p, true, "node-b").await.block.is_some() {}
        assert!(b.give_back(&b_won[0]).await.unwrap());
        let out = claim_a().await;
        assert_eq!(out.lost, 2, "{out:?}");
        assert_eq!(out.block.unwrap().block, order[0], "found on a new listing");
        let full = claim_a().await;
        assert_eq!(full.block, None);
        assert_eq!(
            (full.blocks, full.owned_here, full.owned_elsewhere),
            (16, 8, 8),
            "{full:?}"
        );
        let mut listed: Vec<IpNet> = a
            .list_blocks(Some("view"), None)
            .await
            .unwrap()
            .blocks
            .into_iter()
            .map(|b| b.block)
            .collect();
        listed.sort();
        listed.dedup();
        assert_eq!(listed.len(), 16);
    });
}

#[test]
#[ignore = "needs etcd-server (apt-get install etcd-server); CI runs it with --include-ignored"]
fn a_give_back_is_refused_once_the_block_changed_hands() {
    let e = Etcd::start();
    rt().block_on(async {
        let s = store(&e).await;
        s.create_pool(&pool("p", &["10.11.0.0/24"], &[]))
            .await
            .unwrap();
        let Claimed::Won(old) = claim(&s, "p", &net("10.11.0.0/26"), "n1").await else {
            panic!()
        };
        // Released by an operator and claimed by another node since.
        assert!(s.give_back(&old).await.unwrap());
        let Claimed::Won(_) = claim(&s, "p", &net("10.11.0.0/26"), "n2").await else {
            panic!()
        };
        assert!(!s.give_back(&old).await.unwrap(), "n1's stale give-back");
        let owners: Vec<String> = s
            .list_blocks(Some("p"), None)
            .await
            .unwrap()
            .blocks
            .into_iter()
            .map(|b| b.owner.node)
            .collect();
        assert_eq!(owners, ["n2"]);
        match claim(&s, "p", &net("10.11.0.0/26"), "n3").await {
            Claimed::Lost(o) => assert_eq!(o, "n2"),
            other => panic!("{other:?}"),
        }
    });
}

/// `ipoolctl cluster` against the same etcd: pools, blocks as JSON, refusals and exit codes.
#[test]
#[ignore = "needs etcd-server (apt-get install etcd-server); CI runs it with --include-ignored"]
fn ipoolctl_cluster_manages_pools_and_lists_blocks() {
    let e = Etcd::start();
    let ctl = |args: &[&str]| {
        std::process::Command::new(common::ipoolctl_bin())
            .arg("cluster")
            .args(["--etcd-endpoints", &e.client_url])
            .args(args)
            .output()
            .expect("ipoolctl")
    };
    let main = [
        "pool",
        "create",
        "main",
        "--cidr",
        "10.12.0.0/16",
        "--cidr",
        "fd00:12::/112",
        "--exclude",
        "10.12.0.0/24",
    ];
    let created = ctl(&main);
    assert!(created.status.success(), "{created:?}");
    let bad = ctl(&["pool", "create", "x", "--cidr", "10.13.0.0/33"]);
    assert_eq!(bad.status.code(), Some(64), "{bad:?}");
    assert!(String::from_utf8_lossy(&bad.stderr).contains("\"10.13.0.0/33\" is not a CIDR"));
    let dup = ctl(&["pool", "create", "other", "--cidr", "10.12.5.0/24"]);
    assert_eq!(dup.status.code(), Some(1), "{dup:?}");
    // The same pool again: refused, unless --exists-ok (a Job run twice); another spec under
    // the name is refused even then, naming both.
    let again = ctl(&main);
    assert_eq!(again.status.code(), Some(1), "{again:?}");
    let again = ctl(&[&main[..], &["--exists-ok"]].concat());
    assert!(again.status.success(), "{again:?}");
    assert!(String::from_utf8_lossy(&again.stdout).contains("pool main exists, as asked"));
    let other = ctl(&[
        "pool",
        "create",
        "main",
        "--cidr",
        "10.12.0.0/16",
        "--exists-ok",
    ]);
    assert_eq!(other.status.code(), Some(1), "{other:?}");
    assert!(
        String::from_utf8_lossy(&other.stderr).contains("exists with another spec"),
        "{other:?}"
    );
    // `ipoolctl cluster pool list | head -0`: the reader gone, ipoolctl ends quietly.
    let (reader, writer) = std::io::pipe().expect("pipe");
    drop(reader);
    let piped = std::process::Command::new(common::ipoolctl_bin())
        .args(["cluster", "--etcd-endpoints", &e.client_url, "pool", "list"])
        .stdout(writer)
        .output()
        .expect("ipoolctl");
    assert_eq!(piped.status.code(), Some(0), "{piped:?}");
    assert!(piped.stderr.is_empty(), "{piped:?}");
    let pools: serde_json::Value =
        serde_json::from_slice(&ctl(&["-o", "json", "pool", "list"]).stdout).unwrap();
    assert_eq!(pools[0]["name"], "main");
    // etcd as the daemon's config names it (the pool-creating Job of deploy/cluster/ does
    // this): the same answer; a config without [cluster], or with a wrong prefix, is not.
    let dir = tempfile::tempdir().unwrap();
    let with_config = |toml: &str| {
        let path = dir.path().join("ipoold.toml");
        std::fs::write(&path, toml).unwrap();
        std::process::Command::new(common::ipoolctl_bin())
            .args(["-o", "json", "cluster", "--config"])
            .arg(&path)
            .args(["pool", "list"])
            .output()
            .expect("ipoolctl")
    };
    let o = with_config(&format!(
        "[cluster]\netcd_endpoints = [\"{}\"]\n",
        e.client_url
    ));
    assert!(o.status.success(), "{o:?}");
    let listed: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(listed, pools);
    let o = with_config(&format!(
        "[cluster]\netcd_endpoints = [\"{}\"]\nprefix = \"/elsewhere\"\n",
        e.client_url
    ));
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&o.stdout).unwrap(),
        serde_json::json!([])
    );
    let o = with_config("[[network]]\nname = \"n\"\nranges = [[{ subnet = \"10.1.0.0/24\" }]]\n");
    assert_eq!(o.status.code(), Some(64), "{o:?}");
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("no [cluster] table"),
        "{o:?}"
    );
    assert_eq!(pools[0]["blockSize"], 26);
    assert_eq!(pools[0]["exclude"][0], "10.12.0.0/24");

    rt().block_on(async {
        let s = store(&e).await;
        let p = s.get_pool("main").await.unwrap().unwrap().spec;
        let b = claim_next(&s, &p, true, "node-a").await.block.unwrap();
        assert!(
            !net("10.12.0.0/24").contains(&b.block),
            "{} is excluded",
            b.block
        );
        claim_next(&s, &p, false, "node-b").await.block.unwrap();
    });
    let blocks: serde_json::Value =
        serde_json::from_slice(&ctl(&["-o", "json", "blocks", "--node", "node-a"]).stdout).unwrap();
    let list = blocks.as_array().unwrap();
    assert_eq!(list.len(), 1, "{blocks}");
    assert_eq!(
        (list[0]["pool"].as_str(), list[0]["node"].as_str()),
        (Some("main"), Some("node-a"))
    );
    assert!(list[0]["block"].as_str().unwrap().ends_with("/26"));
    let all = String::from_utf8_lossy(&ctl(&["blocks"]).stdout).into_owned();
    assert!(all.contains("node-b") && all.contains("/122"), "{all}");

    let refused = ctl(&["pool", "delete", "main"]);
    assert_eq!(refused.status.code(), Some(1), "{refused:?}");
    assert!(String::from_utf8_lossy(&refused.stderr).contains("2 owned block"));
    assert_eq!(ctl(&["pool", "delete", "nope"]).status.code(), Some(3));
    let down = std::process::Command::new(common::ipoolctl_bin())
        .args([
            "cluster",
            "--etcd-endpoints",
            "http://127.0.0.1:1",
            "--store-timeout",
            "1",
        ])
        .args(["pool", "list"])
        .output()
        .unwrap();
    assert_eq!(down.status.code(), Some(2), "{down:?}");
}
