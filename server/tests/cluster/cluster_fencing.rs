//! Cluster mode never hands out an address another node may hold: each way found for two nodes
//! to hand out one address, with real daemons, the real plugin and a real etcd (a TCP proxy of
//! the tests' own in between where etcd must seem slow, silent or gone).

use std::net::IpAddr;
use std::time::Duration;

use crate::common::etcd::{with_store, Etcd};
use crate::common::proxy::{Mode, Proxy};
use crate::common::*;
use ipnet::IpNet;
use ipool_server::cluster::datastore::{BlockStore, NameStore, PoolStore};
use ipool_server::cluster::etcd::DEFAULT_PREFIX;

fn addr(cidr: &str) -> IpAddr {
    cidr.split('/').next().unwrap().parse().unwrap()
}

/// `block` of `pool` claimed for `node` straight in etcd (another node winning it).
fn claim_for(url: &str, pool: &str, block: IpNet, node: &str) {
    with_store(url, |s| async move {
        let revision = s.get_pool(pool).await.unwrap().unwrap().revision;
        let won = s.claim(pool, revision, &block, node).await.unwrap();
        assert!(
            matches!(won, ipool_server::cluster::vocab::Claimed::Won(_)),
            "{won:?}"
        );
    });
}

fn metric(addr: &str, sample: &str) -> Option<f64> {
    let (_, body) = http_get(addr, "/metrics");
    samples(&body).get(sample).copied()
}

/// A block given away by a forced release-node and won by another node: its old owner hands
/// out none of it any more, not even its cooled idle addresses, and they leave its pool. Found
/// by a sync (the watch, which would have the node claim it back before the other could, off).
#[test]
#[ignore = "needs etcd-server (apt-get install etcd-server); CI runs it with --include-ignored"]
fn a_block_given_to_another_node_hands_out_nothing_more_not_even_idle_addresses() {
    let etcd = Etcd::start();
    etcd.create_pool(&["f1", "--cidr", "10.60.0.0/24", "--block-size", "28"]);
    let extra = "resync_secs = 1\nwatch = false\nclaim_ahead = 1\n[defaults]\ncooldown_secs = 0\n";
    let d = etcd.daemon("node-a", "f1", extra);
    let conf = d.conf("1.0.0", "pods", "");
    for k in 0..6 {
        assert!(cni("ADD", &format!("a{k}"), &conf).ok);
    }
    for k in 0..6 {
        assert!(cni("DEL", &format!("a{k}"), &conf).ok);
    }
    assert_eq!(pool_status(&d)[0]["idle"], 6, "six idle, cooled addresses");
    let (block, _) = etcd.owners().into_iter().next().expect("a block");
    let o = etcd.ctl(&["release-node", "node-a", "--force"]);
    assert!(o.status.success(), "{}", stderr(&o));
    claim_for(&etcd.client_url, "f1", block, "node-z");
    // Found at the next sync (every second here); from then on nothing of it is handed out.
    d.wait_log(&["block conflict"]);
    for k in 0..10 {
        let r = add_within(10, "an ADD after the conflict", &format!("c{k}"), &conf);
        let a = addr(&r.addresses()[0]);
        assert!(
            !block.contains(&a),
            "{a} handed out from {block}, node-z's now"
        );
    }
    // Its idle addresses left the pool; the block, holding nothing here, is dropped.
    eventually(10, "no idle address of the lost block", || {
        let s = &pool_status(&d)[0];
        let detail = s["sourceDetail"].as_str().unwrap_or_default();
        match s["idle"] == 0 && !detail.contains(&format!("{block} (")) {
            true => Ok(()),
            false => Err(s.clone()),
        }
    });
}

/// Two daemons started with one node name: the second holds back (ADD 11 and STATUS 50 naming
/// the name and the other instance, health NOT_SERVING, a metric) until the first one's lease
/// is gone, and then serves.
#[test]
#[ignore = "needs etcd-server (apt-get install etcd-server); CI runs it with --include-ignored"]
fn two_daemons_with_one_node_name_never_both_hand_out() {
    let etcd = Etcd::start();
    etcd.create_pool(&["f2", "--cidr", "10.61.0.0/24", "--block-size", "28"]);
    let extra = "heartbeat_ttl_secs = 5";
    let mut first = etcd.daemon("node-same", "f2", extra);
    let conf1 = first.conf("1.0.0", "pods", "");
    assert!(add_within(10, "the first daemon serves", "one", &conf1).ok);
    let mut second = Daemon::prepare_with_config(&etcd.daemon_config("node-same", "f2", extra));
    let metrics = format!("127.0.0.1:{}", free_port());
    second.add_args(&["--metrics-listen", &metrics]);
    second.spawn();
    let conf2 = second.conf("1.0.0", "pods", "");
    let r = eventually(10, "the second daemon holds back", || {
        let r = cni("ADD", "two", &conf2);
        let why = r.json["details"].as_str().unwrap_or_default().to_string();
        match r.code() == 11 && why.contains("another ipoold") {
            true => Ok(why),
            false => Err(r),
        }
    });
    let instance = std::fs::read_to_string(first.state.join("cluster-instance")).unwrap();
    assert!(
        r.contains("\"node-same\"") && r.contains(instance.trim()),
        "{r}"
    );
    let status = plugin(
        &[("CNI_COMMAND", "STATUS")],
        &second.conf("1.1.0", "pods", ""),
    );
    assert_eq!(status.code(), 50, "{status:?}");
    let health = second.ctl(&["health"]);
    assert_eq!(code(&health), 1, "NOT_SERVING: {health:?}");
    assert_eq!(metric(&metrics, "ipool_cluster_node_name_taken"), Some(1.0));
    // The first one keeps serving, alone.
    for k in 0..5 {
        assert!(cni("ADD", &format!("one-{k}"), &conf1).ok);
        assert_eq!(cni("ADD", &format!("two-{k}"), &conf2).code(), 11);
    }
    // Gone: the second takes the name once the first one's lease is (within its 5 s TTL).
    first.kill9();
    let r = add_within(30, "the second daemon serves", "two", &conf2);
    assert!(r.ok, "{r:?}");
    assert_eq!(code(&second.ctl(&["health"])), 0);
    assert_eq!(metric(&metrics, "ipool_cluster_node_name_taken"), Some(0.0));
    second.wait_log(&["another ipoold holds this node name"]);
    second.wait_log(&["this daemon holds its node name"]);
}

/// A daemon cut off from etcd for longer than its fence hands out no new address (existing
/// ones keep working: DEL, CHECK), says why, and serves again once it has renewed and synced.
#[test]
#[ignore = "needs etcd-server (apt-get install etcd-server); CI runs it with --include-ignored"]
fn a_node_cut_off_from_etcd_stops_handing_out_after_its_fence() {
    let etcd = Etcd::start();
    etcd.create_pool(&["f3", "--cidr", "10.62.0.0/24"]);
    let proxy = Proxy::start(etcd.client_url.trim_start_matches("http://"));
    let toml = etcd
        .daemon_config("node-f", "f3", "heartbeat_ttl_secs = 5")
        .replace(&etcd.client_url, &proxy.url);
    let mut d = Daemon::prepare_with_config(&toml);
    let metrics = format!("127.0.0.1:{}", free_port());
    d.add_args(&["--metrics-listen", &metrics]);
    d.spawn();
    let conf = d.conf("1.1.0", "pods", "");
    let kept = add_within(10, "an ADD", "kept", &conf);
    assert!(cni("ADD", "gone", &conf).ok);
    proxy.set(Mode::Blackhole);
    // Within the fence, the owned block still serves.
    assert!(cni("ADD", "within", &conf).ok, "within the fence");
    let mut n = 0;
    let why = eventually(15, "fenced", || {
        n += 1;
        let r = cni("ADD", &format!("try-{n}"), &conf);
        let why = r.json["details"].as_str().unwrap_or_default().to_string();
        match r.code() == 11 && why.contains("fenced") {
            true => Ok(why),
            false => Err(r),
        }
    });
    assert!(why.contains("\"node-f\""), "{why}");
    // The gauge follows within a retry of the heartbeat (about a second).
    eventually(5, "the fenced gauge", || {
        match metric(&metrics, "ipool_cluster_fenced") {
            Some(1.0) => Ok(()),
            other => Err(other),
        }
    });
    let status = plugin(&[("CNI_COMMAND", "STATUS")], &conf);
    assert_eq!(status.code(), 50, "{status:?}");
    // What is held keeps working.
    let check = cni_with_prev("CHECK", "kept", &conf, &kept.json);
    assert!(check.ok, "{check:?}");
    assert!(cni("DEL", "gone", &conf).ok);
    proxy.set(Mode::Pass);
    proxy.cut();
    let r = add_within(
        30,
        "an ADD once the heartbeat is renewed and the blocks synced",
        "late",
        &conf,
    );
    assert!(r.ok);
    d.wait_log(&["heartbeat renewed"]);
}

/// CHECK of `container` with the result of its ADD as prevResult.
fn cni_with_prev(cmd: &str, container: &str, conf: &str, prev: &serde_json::Value) -> Run {
    cni(cmd, container, &with_prev(conf, prev))
}

/// A give-back etcd applied but whose answer was lost: the block serves nothing until a read of
/// etcd says whose it is, so another node winning it meanwhile gets it alone.
#[test]
#[ignore = "needs etcd-server (apt-get install etcd-server); CI runs it with --include-ignored"]
fn an_unanswered_give_back_is_settled_by_a_read_before_the_block_serves_again() {
    let etcd = Etcd::start();
    etcd.create_pool(&["f4", "--cidr", "10.63.0.0/24", "--block-size", "28"]);
    let proxy = Proxy::start(etcd.client_url.trim_start_matches("http://"));
    // No resync before the one an unanswered give-back asks for.
    let extra = "claim_ahead = 1\nblock_hold_down_secs = 1\nresync_secs = 3600\nheartbeat_ttl_secs = 30\n[defaults]\nmax_idle = 0\ncooldown_secs = 0\n";
    let toml = etcd
        .daemon_config("node-g", "f4", extra)
        .replace(&etcd.client_url, &proxy.url);
    let d = Daemon::with_config(&toml);
    let conf = d.conf("1.0.0", "pods", "");
    // Two blocks of 13 addresses: the second one holds one pod. That pod goes, and one of the
    // first block: the empty second block is given back (a free address stays), its answer
    // lost.
    let mut placed = Vec::new();
    for k in 0..14 {
        let r = add_within(10, "ADD", &format!("g{k}"), &conf);
        placed.push((format!("g{k}"), addr(&r.addresses()[0])));
    }
    let blocks: Vec<IpNet> = etcd.owners().into_keys().collect();
    assert_eq!(blocks.len(), 2, "{blocks:?}");
    let (lone, lone_ip) = placed.last().cloned().unwrap();
    let second = *blocks.iter().find(|b| b.contains(&lone_ip)).unwrap();
    assert!(cni("DEL", &placed[0].0, &conf).ok);
    proxy.set(Mode::DropReplies);
    assert!(cni("DEL", &lone, &conf).ok);
    eventually(20, "the give-back applied in etcd", || {
        match etcd.owners().contains_key(&second) {
            false => Ok(()),
            true => Err(()),
        }
    });
    // Another node wins the block etcd now says is free, before the first hears back.
    claim_for(&etcd.client_url, "f4", second, "node-z");
    std::thread::sleep(Duration::from_secs(1));
    proxy.set(Mode::Pass);
    proxy.cut();
    d.wait_log(&["a claim failed"]);
    for k in 0..12 {
        let r = add_within(20, "ADD", &format!("h{k}"), &conf);
        let a = addr(&r.addresses()[0]);
        assert!(
            !second.contains(&a),
            "{a} handed out from {second}, node-z's now"
        );
    }
}

/// A pool deleted and created again with other block sizes while a daemon still holds its
/// spec: the daemon's next claim is refused by etcd (conditioned on the pool as read) and made
/// again from the new spec: no block of the old size overlaps the new ones.
#[test]
#[ignore = "needs etcd-server (apt-get install etcd-server); CI runs it with --include-ignored"]
fn a_claim_never_follows_a_pool_spec_that_changed_since_it_was_read() {
    let etcd = Etcd::start();
    // Two /26 blocks, node-z's: the daemon reads the pool and finds no free block.
    etcd.create_pool(&["f5", "--cidr", "10.64.0.0/25"]);
    for b in ["10.64.0.0/26", "10.64.0.64/26"] {
        claim_for(&etcd.client_url, "f5", b.parse().unwrap(), "node-z");
    }
    let d = etcd.daemon("node-h", "f5", "");
    let conf = d.conf("1.0.0", "pods", "");
    let r = eventually(20, "the pool full", || {
        let r = cni("ADD", "h0", &conf);
        match r.json["details"]
            .as_str()
            .unwrap_or_default()
            .contains("no free IPv4 block")
        {
            true => Ok(r),
            false => Err(r),
        }
    });
    assert!(!r.ok);
    // The operator frees the pool and makes it again with /28 blocks; the daemon still holds
    // the /26 spec it read.
    let o = etcd.ctl(&["release-node", "node-z", "--force"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = etcd.ctl(&["pool", "delete", "f5"]);
    assert!(o.status.success(), "{}", stderr(&o));
    etcd.create_pool(&["f5", "--cidr", "10.64.0.0/25", "--block-size", "28"]);
    let r = add_within(30, "an ADD from a block of the new spec", "h1", &conf);
    assert!(r.addresses()[0].ends_with("/28"), "{r:?}");
    let owned: Vec<IpNet> = etcd.owners().into_keys().collect();
    assert!(
        !owned.is_empty() && owned.iter().all(|b| b.prefix_len() == 28),
        "{owned:?}"
    );
}

/// A key under the prefix that names no owner is reported (log, metric, status) and counted
/// as occupied; it does not fail the listings it is in.
#[test]
#[ignore = "needs etcd-server (apt-get install etcd-server); CI runs it with --include-ignored"]
fn a_malformed_block_key_is_reported_and_counted_as_occupied() {
    let etcd = Etcd::start();
    etcd.create_pool(&["f6", "--cidr", "10.65.0.0/26", "--block-size", "28"]);
    let bad: IpNet = "10.65.0.16/28".parse().unwrap();
    with_store(&etcd.client_url, |s| async move {
        use ipool_server::cluster::etcd::request;
        let key = format!("{DEFAULT_PREFIX}/blocks/f6/10.65.0.16-28");
        s.client()
            .put(request::put(key, "not json", 0))
            .await
            .unwrap();
    });
    let mut d =
        Daemon::prepare_with_config(&etcd.daemon_config("node-m", "f6", "claim_ahead = 30"));
    let metrics = format!("127.0.0.1:{}", free_port());
    d.add_args(&["--metrics-listen", &metrics]);
    d.spawn();
    let conf = d.conf("1.0.0", "pods", "");
    // Three free blocks of four: 39 addresses, none in the malformed one.
    for k in 0..39 {
        let r = add_within(10, "ADD", &format!("m{k}"), &conf);
        let a = addr(&r.addresses()[0]);
        assert!(
            !bad.contains(&a),
            "{a} handed out of a block with a malformed key"
        );
    }
    let full = cni("ADD", "m-full", &conf);
    assert!(!full.ok, "{full:?}");
    let detail = pool_status(&d)[0]["sourceDetail"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(
        detail.contains("malformed") && detail.contains("10.65.0.16-28"),
        "{detail}"
    );
    assert_eq!(metric(&metrics, "ipool_cluster_malformed_keys"), Some(1.0));
    d.wait_log(&[
        "a malformed entry in ipool's part of the store",
        "10.65.0.16-28",
    ]);
    let o = etcd.ctl(&["blocks"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("malformed"), "{}", stderr(&o));
}

/// A network that stops using a pool (another `cluster_pool`) gives that pool's blocks back
/// once nothing here holds an address of them.
#[test]
#[ignore = "needs etcd-server (apt-get install etcd-server); CI runs it with --include-ignored"]
fn a_network_that_stops_using_a_pool_gives_its_blocks_back() {
    let etcd = Etcd::start();
    etcd.create_pool(&["old", "--cidr", "10.66.0.0/24"]);
    etcd.create_pool(&["new", "--cidr", "10.67.0.0/24"]);
    let mut d = etcd.daemon("node-p", "old", "resync_secs = 1");
    let conf = d.conf("1.0.0", "pods", "");
    assert!(cni("ADD", "p0", &conf).ok);
    assert!(cni("DEL", "p0", &conf).ok);
    assert_eq!(etcd.owners().len(), 1);
    d.terminate();
    let toml = etcd.daemon_config("node-p", "new", "resync_secs = 1");
    std::fs::write(d.dir.path().join("ipoold.toml"), toml).unwrap();
    d.spawn();
    let r = add_within(20, "an ADD from the new pool", "p1", &conf);
    assert!(r.addresses()[0].starts_with("10.67."), "{r:?}");
    let owners = eventually(20, "the old pool's block given back", || {
        let o = etcd.owners();
        match o.keys().all(|b| b.to_string().starts_with("10.67.")) {
            true => Ok(o),
            false => Err(o),
        }
    });
    assert_eq!(owners.len(), 1, "{owners:?}");
    d.wait_log(&["gave back a block of a pool no network here uses any more"]);
}

/// release-node conditions each give-back on the node staying away: a daemon that holds its
/// heartbeat keeps its blocks, even when the release was decided before it came back.
#[test]
#[ignore = "needs etcd-server (apt-get install etcd-server); CI runs it with --include-ignored"]
fn release_node_gives_back_nothing_of_a_node_that_came_back() {
    let etcd = Etcd::start();
    etcd.create_pool(&["f7", "--cidr", "10.68.0.0/24"]);
    claim_for(
        &etcd.client_url,
        "f7",
        "10.68.0.0/26".parse().unwrap(),
        "node-back",
    );
    with_store(&etcd.client_url, |s| async move {
        let blocks = s.list_blocks(None, Some("node-back")).await.unwrap().blocks;
        assert_eq!(blocks.len(), 1);
        // The operator decided on what it read; the node's daemon starts meanwhile.
        let me = ipool_server::cluster::vocab::Alive {
            instance: "back".into(),
            at_ms: 0,
            fence_secs: 30,
            ..Default::default()
        };
        let held = s.start_heartbeat("node-back", &me, 30, 10).await.unwrap();
        assert!(matches!(
            held,
            ipool_server::cluster::vocab::Acquired::Held(_)
        ));
        let judged = ipool_server::cluster::vocab::NodeState::default();
        let plan = ipool_server::cluster::datastore::Release::of_blocks(&judged, &blocks, false);
        let refused = s
            .release_node("node-back", &plan)
            .await
            .expect_err("the node came back");
        assert!(refused.to_string().contains("came back"), "{refused}");
        assert_eq!(
            s.list_blocks(None, Some("node-back")).await.unwrap().blocks,
            blocks
        );
    });
}

/// A release decided while a node was away ends the node's holds on pins, and drops its
/// `seen` key, only while the node stays away as judged (both writes were
/// unconditioned): a daemon back meanwhile keeps its running pod's hold, and one that came and
/// went keeps the record of its last absence (else it could later be judged gone at once).
#[test]
#[ignore = "needs etcd-server (apt-get install etcd-server); CI runs it with --include-ignored"]
fn the_last_writes_of_a_release_hold_only_while_the_node_stays_away() {
    use ipool_server::cluster::datastore::{PinStore, Release};
    use ipool_server::cluster::pin::{Holder, Pin, PinCreated, PinOwner};
    use ipool_server::cluster::vocab::{Acquired, Alive};
    let etcd = Etcd::start();
    etcd.create_pool(&["f8", "--cidr", "10.69.0.0/24"]);
    claim_for(
        &etcd.client_url,
        "f8",
        "10.69.0.0/26".parse().unwrap(),
        "node-b",
    );
    with_store(&etcd.client_url, |s| async move {
        let me = Alive {
            instance: "b".into(),
            fence_secs: 1,
            ..Alive::default()
        };
        let held = |a| match a {
            Acquired::Held(beat) => beat,
            Acquired::Taken { .. } => panic!("the name is taken"),
        };
        let beat = held(s.start_heartbeat("node-b", &me, 30, 10).await.unwrap());
        let block = s.list_blocks(None, Some("node-b")).await.unwrap().blocks[0].clone();
        let owner = PinOwner::StatefulSet {
            namespace: "db".into(),
            name: "web".into(),
            ordinal: 0,
        };
        let pin = Pin {
            pool: "f8".into(),
            address: "10.69.0.5".parse().unwrap(),
            owner: owner.clone(),
            block: block.block,
            block_id: block.revision.create,
            set_aside: false,
            holders: vec![Holder {
                node: "node-b".into(),
                pod: "db/web-0".into(),
                uid: "u1".into(),
                since_ms: 1,
                instance: None,
            }],
        };
        let PinCreated::Created(read) = s.create_pin(&pin).await.unwrap() else {
            panic!("pinned")
        };
        s.stop_heartbeat(&beat).await.unwrap();
        // Judged away; the daemon comes back before the release writes.
        let state = s.node_state("node-b").await.unwrap();
        assert!(state.alive.is_none() && state.seen.is_some(), "{state:?}");
        let beat = held(s.start_heartbeat("node-b", &me, 30, 10).await.unwrap());
        let unheld = Pin {
            holders: Vec::new(),
            ..pin.clone()
        };
        let holds = [(read, unheld)];
        let plan = Release {
            state: &state,
            blocks: &[],
            holds: &holds,
            force: false,
            keeps_blocks: false,
        };
        let e = s.release_node("node-b", &plan).await.unwrap_err();
        assert!(e.to_string().contains("came back"), "{e}");
        let now = s.pin_of(&owner).await.unwrap().expect("the pin");
        assert_eq!(now.pin.holders, pin.holders, "the running pod's hold stays");
        // It stops again (cleanly: its alive key gone at once): a new absence, recorded anew.
        // The release, judged on the old one, gives back none of its blocks and drops nothing
        // of its record.
        s.stop_heartbeat(&beat).await.unwrap();
        let blocks = [block.clone()];
        let plan = Release {
            blocks: &blocks,
            ..plan
        };
        let e = s.release_node("node-b", &plan).await.unwrap_err();
        assert!(e.to_string().contains("came back"), "{e}");
        assert_eq!(
            s.list_blocks(None, Some("node-b")).await.unwrap().blocks,
            vec![block.clone()]
        );
        let plan = Release {
            blocks: &[],
            holds: &[],
            ..plan
        };
        s.release_node("node-b", &plan).await.unwrap();
        let after = s.node_state("node-b").await.unwrap();
        assert!(after.seen.is_some(), "its record of its last absence stays");
    });
}

/// A forced release's give-back lands only on a block with no pin (found by the
/// simulation: a forced release, its give-back late, took a block in which the node, still
/// running, had made a pin after the release read the pins; a pod on another node used its
/// address).
#[test]
#[ignore = "needs etcd-server (apt-get install etcd-server); CI runs it with --include-ignored"]
fn a_forced_release_keeps_a_block_pinned_after_its_plan() {
    use ipool_server::cluster::datastore::{PinStore, Release};
    use ipool_server::cluster::pin::{Holder, Pin, PinCreated, PinOwner};
    let etcd = Etcd::start();
    etcd.create_pool(&["f9", "--cidr", "10.68.0.0/24"]);
    claim_for(
        &etcd.client_url,
        "f9",
        "10.68.0.0/26".parse().unwrap(),
        "node-c",
    );
    with_store(&etcd.client_url, |s| async move {
        let block = s.list_blocks(None, Some("node-c")).await.unwrap().blocks[0].clone();
        // The plan: read while the block had no pin.
        let state = s.node_state("node-c").await.unwrap();
        let blocks = [block.clone()];
        let plan = Release {
            state: &state,
            blocks: &blocks,
            holds: &[],
            force: true,
            keeps_blocks: false,
        };
        // Then the node, still running, pins an address of it for a pod that moves on.
        let pin = Pin {
            pool: "f9".into(),
            address: "10.68.0.5".parse().unwrap(),
            owner: PinOwner::StatefulSet {
                namespace: "db".into(),
                name: "web".into(),
                ordinal: 0,
            },
            block: block.block,
            block_id: block.revision.create,
            set_aside: false,
            holders: vec![Holder {
                node: "node-d".into(),
                pod: "db/web-0".into(),
                uid: "u1".into(),
                since_ms: 1,
                instance: None,
            }],
        };
        let PinCreated::Created(_) = s.create_pin(&pin).await.unwrap() else {
            panic!("pinned")
        };
        let freed = s.release_node("node-c", &plan).await.unwrap();
        assert!(freed.blocks.is_empty(), "{:?}", freed.blocks);
        assert_eq!(
            s.list_blocks(None, Some("node-c")).await.unwrap().blocks,
            vec![block]
        );
    });
}
