//! Cluster mode end to end: real ipoold daemons (own state dirs and node names) claiming blocks
//! of pools in a real etcd, ADDs through the real plugin.

use ipool_server::cluster::datastore::{BlockStore, PoolStore};

use std::collections::BTreeSet;
use std::net::IpAddr;

use crate::common::etcd::Etcd;
use crate::common::*;
use ipnet::IpNet;

fn addr(cidr: &str) -> IpAddr {
    cidr.split('/').next().unwrap().parse().unwrap()
}

#[test]
#[ignore = "needs etcd-server (apt-get install etcd-server); CI runs it with --include-ignored"]
fn three_daemons_share_a_pool_and_never_hand_out_one_address_twice() {
    let etcd = Etcd::start();
    // 16 IPv4 blocks of /26, the first excluded; IPv6 blocks of /122.
    etcd.create_pool(&[
        "p",
        "--cidr",
        "10.20.0.0/22",
        "--cidr",
        "fd00:20::/112",
        "--exclude",
        "10.20.0.0/26",
    ]);
    let nodes = ["node-a", "node-b", "node-c"];
    let daemons: Vec<Daemon> = nodes
        .iter()
        .map(|n| etcd.daemon(n, "p", "claim_ahead = 8"))
        .collect();
    let confs: Vec<String> = daemons
        .iter()
        .map(|d| d.conf("1.0.0", "pods", ""))
        .collect();

    // 30 ADDs on each daemon, 3 threads per daemon, all at once.
    let results: Vec<(usize, String, Run)> = std::thread::scope(|s| {
        let mut handles = Vec::new();
        for (i, conf) in confs.iter().enumerate() {
            for t in 0..3 {
                handles.push(s.spawn(move || {
                    (0..10)
                        .map(|k| {
                            let c = format!("n{i}-t{t}-c{k}");
                            let r = cni("ADD", &c, conf);
                            (i, c, r)
                        })
                        .collect::<Vec<_>>()
                }));
            }
        }
        handles
            .into_iter()
            .flat_map(|h| h.join().expect("thread"))
            .collect()
    });
    let owned = etcd.owners();
    let excluded: IpNet = "10.20.0.0/26".parse().unwrap();
    let mut seen = BTreeSet::new();
    for (i, c, r) in &results {
        assert!(
            r.ok,
            "ADD {c} on {}: {r:?}\n{}",
            nodes[*i],
            daemons[*i].log()
        );
        let ips = r.json["ips"].as_array().expect("ips");
        assert_eq!(ips.len(), 2, "one address per family: {r:?}");
        for ip in ips {
            let cidr = ip["address"].as_str().unwrap();
            let a = addr(cidr);
            assert!(seen.insert(a), "{a} handed out twice");
            assert!(!excluded.contains(&a), "{a} is in the excluded range");
            let block = owned
                .iter()
                .find(|(b, _)| b.contains(&a))
                .unwrap_or_else(|| panic!("{a} is in no owned block: {owned:?}"));
            assert_eq!(
                block.1, nodes[*i],
                "{a} of {} is in {}'s block",
                nodes[*i], block.1
            );
            // The block is the interface's subnet, its first address the gateway.
            let prefix: u8 = cidr.split('/').nth(1).unwrap().parse().unwrap();
            assert_eq!(prefix, block.0.prefix_len(), "{cidr}");
            let gw: IpAddr = ip["gateway"].as_str().expect("gateway").parse().unwrap();
            assert!(block.0.contains(&gw) && gw != a, "{cidr} via {gw}");
        }
    }
    assert_eq!(seen.len(), 3 * 30 * 2);
    for (i, n) in nodes.iter().enumerate() {
        assert!(owned.values().any(|o| o == n), "{n} owns no block");
        let status = pool_status(&daemons[i]);
        let detail = status[0]["sourceDetail"].as_str().unwrap_or_default();
        assert!(detail.contains("cluster pool \"p\""), "{status:?}");
        assert_eq!(status[0]["degraded"], "", "{status:?}");
    }
    // DEL frees them on their own node.
    for (i, c, _) in &results {
        let r = cni("DEL", c, &confs[*i]);
        assert!(r.ok, "DEL {c}: {r:?}");
    }
}

#[test]
#[ignore = "needs etcd-server (apt-get install etcd-server); CI runs it with --include-ignored"]
fn with_etcd_down_owned_blocks_keep_serving_and_claims_resume_when_it_is_back() {
    let mut etcd = Etcd::start();
    // /28 blocks: 13 addresses each.
    etcd.create_pool(&["q", "--cidr", "10.21.0.0/24", "--block-size", "28"]);
    let d = etcd.daemon("node-q", "q", "claim_ahead = 4");
    let conf = d.conf("1.0.0", "pods", "");
    let first = add_within(10, "the first ADD", "q0", &conf);
    assert!(ip_of(&first).starts_with("10.21.0."), "{first:?}");
    // Claimed ahead: two blocks once fewer than 4 addresses are free.
    let mut n = 1;
    while etcd.owners().len() < 2 {
        let r = cni("ADD", &format!("q{n}"), &conf);
        assert!(r.ok, "{r:?}");
        n += 1;
        assert!(n < 26, "no second block claimed ahead:\n{}", d.log());
    }
    let owned_before = etcd.owners();
    etcd.stop();

    // Served from the owned blocks while etcd is down.
    let free = 2 * 13 - n;
    for k in 0..free {
        let r = cni("ADD", &format!("down{k}"), &conf);
        assert!(r.ok, "ADD {k} of {free} with etcd down: {r:?}\n{}", d.log());
    }
    // Nothing left and no claim possible: a retryable error that says why.
    let r = cni("ADD", "none-left", &conf);
    assert_eq!(r.code(), 11, "{r:?}");
    let status = eventually(10, "status saying degraded", || {
        let s = pool_status(&d);
        match s[0]["degraded"]
            .as_str()
            .unwrap_or_default()
            .contains("etcd unreachable")
        {
            true => Ok(s),
            false => Err(s),
        }
    });
    assert!(!status.is_empty());
    // DEL needs no etcd either.
    assert!(cni("DEL", "down0", &conf).ok);
    assert!(cni("ADD", "down0-again", &conf).ok);

    etcd.spawn();
    let more = add_within(
        60,
        "an ADD served from a block claimed after etcd came back",
        "after",
        &conf,
    );
    let owned_after = etcd.owners();
    assert!(owned_after.len() > owned_before.len(), "{owned_after:?}");
    assert!(owned_after.values().all(|n| n == "node-q"));
    let a = addr(&more.addresses()[0]);
    assert!(
        owned_after
            .keys()
            .any(|b| b.contains(&a) && !owned_before.contains_key(b)),
        "{a} is not from the new block: {owned_after:?}"
    );
    eventually(10, "degraded cleared", || {
        let s = pool_status(&d);
        match s[0]["degraded"] == "" {
            true => Ok(()),
            false => Err(s),
        }
    });
}

#[test]
#[ignore = "needs etcd-server (apt-get install etcd-server); CI runs it with --include-ignored"]
fn two_daemons_race_for_the_last_block_and_the_loser_names_the_pool() {
    let etcd = Etcd::start();
    // Four /28 blocks, one excluded: three to claim.
    etcd.create_pool(&[
        "last",
        "--cidr",
        "10.23.0.0/26",
        "--block-size",
        "28",
        "--exclude",
        "10.23.0.48/28",
    ]);
    let a = etcd.daemon("node-a", "last", "claim_ahead = 1");
    let b = etcd.daemon("node-b", "last", "claim_ahead = 1");
    let (ca, cb) = (a.conf("1.0.0", "pods", ""), b.conf("1.0.0", "pods", ""));
    // Each fills its first block (13 addresses) and then one more: they race for the third.
    let outcome: Vec<Vec<Run>> = std::thread::scope(|s| {
        let ha = s.spawn(|| (0..14).map(|k| cni("ADD", &format!("a{k}"), &ca)).collect());
        let hb = s.spawn(|| (0..14).map(|k| cni("ADD", &format!("b{k}"), &cb)).collect());
        vec![ha.join().unwrap(), hb.join().unwrap()]
    });
    let failed: Vec<&Run> = outcome.iter().flatten().filter(|r| !r.ok).collect();
    assert_eq!(
        failed.len(),
        1,
        "exactly one ADD finds no block: {failed:?}"
    );
    let msg = failed[0].json["details"].as_str().unwrap_or_default();
    assert!(
        msg.contains("cluster pool \"last\" has no free IPv4 block")
            && msg.contains("4 block(s) of /28")
            && msg.contains("1 touched by excluded ranges"),
        "{msg}"
    );
    let owned = etcd.owners();
    assert_eq!(owned.len(), 3, "{owned:?}");
    let mut all = BTreeSet::new();
    for r in outcome.iter().flatten().filter(|r| r.ok) {
        let ip = addr(&r.addresses()[0]);
        assert!(all.insert(ip), "{ip} twice");
        assert!(!"10.23.0.48/28".parse::<IpNet>().unwrap().contains(&ip));
    }
    assert_eq!(all.len(), 27);
}

#[test]
#[ignore = "needs etcd-server (apt-get install etcd-server); CI runs it with --include-ignored"]
fn a_daemon_killed_during_claims_owns_exactly_what_etcd_says_after_its_restart() {
    let etcd = Etcd::start();
    etcd.create_pool(&["k", "--cidr", "10.24.0.0/20"]);
    // min_idle 400: it claims /26 blocks one after another (seven of them).
    let mut d = Daemon::prepare_with_config(&etcd.daemon_config(
        "node-k",
        "k",
        "[defaults]\nmin_idle = 400\nmax_idle = 500\n",
    ));
    d.spawn();
    d.wait_log(&["claimed block"]);
    d.kill9();
    let at_kill = etcd.owners();
    d.spawn();
    // After the sync, the daemon holds exactly the blocks etcd lists as its own.
    let conf = d.conf("1.0.0", "pods", "");
    let r = add_within(30, "an ADD after the restart", "after-kill", &conf);
    let owned = etcd.owners();
    for b in at_kill.keys() {
        assert!(
            owned.contains_key(b),
            "{b} was node-k's at the kill and is gone"
        );
    }
    let detail = eventually(30, "status listing every owned block", || {
        let s = pool_status(&d);
        let detail = s[0]["sourceDetail"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let owned = etcd.owners();
        match owned.keys().all(|b| detail.contains(&b.to_string())) {
            true => Ok(detail),
            false => Err((detail, owned)),
        }
    });
    let a = addr(&r.addresses()[0]);
    assert!(
        etcd.owners().keys().any(|b| b.contains(&a)),
        "{a}: {detail}"
    );
}

#[test]
#[ignore = "needs etcd-server (apt-get install etcd-server); CI runs it with --include-ignored"]
fn an_empty_block_is_given_back_after_its_hold_down_and_the_last_one_is_kept() {
    let etcd = Etcd::start();
    etcd.create_pool(&["g", "--cidr", "10.25.0.0/24", "--block-size", "28"]);
    // Released addresses go straight back to the blocks (no cooldown, no idle set).
    let extra =
        "claim_ahead = 0\nblock_hold_down_secs = 1\n[defaults]\nmax_idle = 0\ncooldown_secs = 0\n";
    let mut d = Daemon::prepare_with_config(&etcd.daemon_config("node-g", "g", extra));
    let metrics = format!("127.0.0.1:{}", free_port());
    d.add_args(&["--metrics-listen", &metrics]);
    d.spawn();
    let conf = d.conf("1.0.0", "pods", "");
    for k in 0..14 {
        let r = cni("ADD", &format!("g{k}"), &conf);
        assert!(r.ok, "ADD {k}: {r:?}");
    }
    eventually(10, "two blocks owned", || match etcd.owners().len() {
        2 => Ok(()),
        n => Err(n),
    });
    for k in 0..14 {
        assert!(cni("DEL", &format!("g{k}"), &conf).ok);
    }
    let kept = eventually(20, "one block given back", || {
        let o = etcd.owners();
        match o.len() {
            1 => Ok(o),
            _ => Err(o),
        }
    });
    std::thread::sleep(std::time::Duration::from_secs(3));
    assert_eq!(etcd.owners(), kept, "the last block stays");
    let log = d.log();
    assert_eq!(
        log.matches("gave back empty block").count(),
        1,
        "one block given back, the last one kept:\n{log}"
    );
    let (_, body) = http_get(&metrics, "/metrics");
    let m = samples(&body);
    for (sample, want) in [
        ("ipool_cluster_store_up", 1.0),
        (
            r#"ipool_cluster_blocks{pool="g",family="4",state="confirmed"}"#,
            1.0,
        ),
        (
            r#"ipool_cluster_blocks{pool="g",family="4",state="returning"}"#,
            0.0,
        ),
        (r#"ipool_cluster_claims_total{pool="g",result="won"}"#, 2.0),
        (r#"ipool_cluster_block_give_backs_total{pool="g"}"#, 1.0),
    ] {
        assert_eq!(m.get(sample), Some(&want), "{sample}:\n{body}");
    }
    // A cluster network's pool grows by claiming: no 'available' count to alert on.
    assert!(
        !body.contains(r#"ipool_pool_available{network="pods""#),
        "{body}"
    );
    assert!(
        body.contains(r#"ipool_pool_in_use{network="pods""#),
        "{body}"
    );
    let calls = m
        .get(r#"ipool_cluster_store_call_duration_seconds_count{op="claim"}"#)
        .copied();
    assert!(calls >= Some(2.0), "claim calls timed:\n{body}");
    // The store no longer holds the block given back: nothing to drop at the next start.
    d.terminate();
    d.spawn();
    let r = add_within(10, "an ADD after the restart", "again", &conf);
    let a = addr(&r.addresses()[0]);
    assert!(kept.keys().any(|b| b.contains(&a)), "{a} not in {kept:?}");
    assert!(
        !d.log().contains("no longer this node's"),
        "the store still held the given-back block:\n{}",
        d.log()
    );
}

#[test]
#[ignore = "needs etcd-server (apt-get install etcd-server); CI runs it with --include-ignored"]
fn release_node_waits_for_the_node_to_be_gone_unless_forced() {
    let etcd = Etcd::start();
    etcd.create_pool(&["r", "--cidr", "10.26.0.0/24"]);
    let extra = "heartbeat_ttl_secs = 5";
    let mut gone = etcd.daemon("node-gone", "r", extra);
    let alive = etcd.daemon("node-alive", "r", extra);
    for d in [&gone, &alive] {
        assert!(cni("ADD", "c", &d.conf("1.0.0", "pods", "")).ok);
    }
    let blocks_of = |node: &str| etcd.owners().values().filter(|n| *n == node).count();
    assert_eq!(blocks_of("node-gone"), 1);

    // Its daemon runs: refused.
    let o = etcd.ctl(&["release-node", "node-gone", "--absent-for", "0"]);
    assert_eq!(code(&o), 1, "{}", stderr(&o));
    assert!(stderr(&o).contains("is alive"), "{}", stderr(&o));

    gone.kill9();
    // The lease lapses within its TTL; etcd saw the node moments ago: still refused.
    let o = eventually(20, "refused for being seen lately", || {
        let o = etcd.ctl(&["release-node", "node-gone"]);
        match stderr(&o).contains("was last seen") {
            true => Ok(o),
            false => Err(stderr(&o)),
        }
    });
    assert_eq!(code(&o), 1);
    assert!(stderr(&o).contains("by etcd's clock"), "{}", stderr(&o));
    assert_eq!(blocks_of("node-gone"), 1);
    // --absent-for 0 still waits out the node's fence (5 s, its heartbeat TTL) and a renewal.
    let o = etcd.ctl(&["release-node", "node-gone", "--absent-for", "0"]);
    assert!(
        stderr(&o).contains("its fence of 5 s") || o.status.success(),
        "{}",
        stderr(&o)
    );
    let o = eventually(20, "released past the fence", || {
        let o = etcd.ctl(&["release-node", "node-gone", "--absent-for", "0"]);
        match o.status.success() {
            true => Ok(o),
            false => Err(stderr(&o)),
        }
    });
    assert!(String::from_utf8_lossy(&o.stdout).contains("1 block(s) given back"));
    assert_eq!(blocks_of("node-gone"), 0);
    assert_eq!(blocks_of("node-alive"), 1);

    // --force takes even a live node's blocks, and says so.
    let o = etcd.ctl(&["release-node", "node-alive", "--force"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("--force: node \"node-alive\" is alive"),
        "{}",
        stderr(&o)
    );
    assert!(String::from_utf8_lossy(&o.stdout).contains("1 block(s) given back"));
    // The node, alive, hears of it at once and claims back its block, which holds its pod's
    // address (no other node had taken it).
    alive.wait_log(&["no longer its own"]);
    eventually(10, "node-alive's block claimed back", || {
        match blocks_of("node-alive") {
            1 => Ok(()),
            n => Err(n),
        }
    });
    drop(alive);
}

#[test]
#[ignore = "needs etcd-server (apt-get install etcd-server); CI runs it with --include-ignored"]
fn a_daemon_started_while_etcd_is_down_serves_once_it_has_listed_its_blocks() {
    let mut etcd = Etcd::start();
    etcd.create_pool(&["s", "--cidr", "10.27.0.0/24"]);
    // Idle addresses kept ready: even those wait for the sync.
    let mut d = etcd.daemon("node-s", "s", "[defaults]\nmin_idle = 2\n");
    let conf = d.conf("1.0.0", "pods", "");
    assert!(cni("ADD", "s0", &conf).ok);
    eventually(10, "two idle addresses", || {
        let s = pool_status(&d);
        match s[0]["idle"] == 2 {
            true => Ok(()),
            false => Err(s),
        }
    });
    d.terminate();
    etcd.stop();
    d.spawn();
    // The store holds a block, but until this daemon holds its node's name in etcd and etcd
    // confirms the block is still this node's (a release-node may have given it to another)
    // nothing is handed out.
    let r = cni("ADD", "s1", &conf);
    assert_eq!(r.code(), 11, "{r:?}");
    let why = r.json["details"].as_str().unwrap_or_default();
    assert!(
        why.contains("cannot register node name \"node-s\" in etcd"),
        "{why}"
    );
    let status = plugin(&[("CNI_COMMAND", "STATUS")], &d.conf("1.1.0", "pods", ""));
    assert_eq!(status.code(), 50, "{status:?}");
    // The attachment made before is there all along; DEL works.
    assert!(cni("DEL", "s0", &conf).ok);
    etcd.spawn();
    let r = add_within(60, "an ADD once etcd is back", "s1", &conf);
    assert!(ip_of(&r).starts_with("10.27.0."), "{r:?}");
}

#[test]
#[ignore = "needs etcd-server (apt-get install etcd-server); CI runs it with --include-ignored"]
fn a_block_taken_by_another_node_is_found_at_the_next_sync_and_no_longer_handed_out() {
    let etcd = Etcd::start();
    etcd.create_pool(&["t", "--cidr", "10.28.0.0/24", "--block-size", "28"]);
    // Found by a sync: the watch, which would have the node claim its block back before
    // node-z could, is off (cluster_watch has what it does).
    let d = etcd.daemon(
        "node-t",
        "t",
        "resync_secs = 1\nwatch = false\nclaim_ahead = 1",
    );
    let conf = d.conf("1.0.0", "pods", "");
    let first = cni("ADD", "t0", &conf);
    assert!(first.ok, "{first:?}");
    let (block, _) = etcd.owners().into_iter().next().expect("a block");
    // An operator forces the node's blocks away while it runs, and another node wins the
    // block.
    let o = etcd.ctl(&["release-node", "node-t", "--force"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let s = ipool_server::cluster::etcd::EtcdStore::connect(
            std::slice::from_ref(&etcd.client_url),
            ipool_server::cluster::etcd::DEFAULT_PREFIX,
            std::time::Duration::from_secs(5),
            None,
        )
        .await
        .unwrap();
        let revision = s.get_pool("t").await.unwrap().unwrap().revision;
        let won = s.claim("t", revision, &block, "node-z").await.unwrap();
        assert!(matches!(won, ipool_server::cluster::vocab::Claimed::Won(_)));
    });
    let detail = eventually(20, "the conflict in status", || {
        let s = pool_status(&d);
        let detail = s[0]["sourceDetail"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        match detail.contains(&format!("{block} (CONFLICT")) {
            true => Ok(detail),
            false => Err(detail),
        }
    });
    // New ADDs come from another block, never from the one node-z owns.
    for k in 1..20 {
        let r = cni("ADD", &format!("t{k}"), &conf);
        assert!(r.ok, "{r:?}\n{detail}");
        let a = addr(&r.addresses()[0]);
        assert!(
            !block.contains(&a),
            "{a} handed out from {block}, now node-z's"
        );
    }
    d.wait_log(&["block conflict"]);
}
