//! Cluster mode at the edges of what a node knows, with the real daemons and plugin on either
//! store (the fake apiserver always; a real etcd where installed): a block forced away while
//! the node's claims wait on a full pool, a pool whose deletion is under way or failed, an idle
//! dual-stack node's writes, a clean stop giving the node's name up.

use crate::common;

use std::net::IpAddr;
use std::time::{Duration, Instant};

use crate::common::backend::Backend;
use crate::common::*;

fn addr(r: &Run) -> IpAddr {
    r.addresses()[0].split('/').next().unwrap().parse().unwrap()
}

/// A node whose pool is full keeps trying to claim (its claims wait 10 s after each "full");
/// a block forced away from it meanwhile stops serving at its next sync (resync_secs 1), not
/// when the claims' wait ends. Without the watch (which would have n1 claim the block back at
/// once, before n2 could: cluster_watch has what the watch does): the syncs are the subject.
fn forced_away_while_the_pool_is_full(store: Backend) {
    // One /26 block to claim (61 addresses): the other is excluded.
    store.create_pool(&[
        "p",
        "--cidr",
        "10.52.0.0/25",
        "--block-size",
        "26",
        "--exclude",
        "10.52.0.64/26",
    ]);
    let tuning = "heartbeat_ttl_secs = 6\nresync_secs = 1\nwatch = false\nclaim_ahead = 100\n";
    let mut n1 =
        Daemon::prepare_with_config(&store.daemon_config("n1", "p", tuning, &store.addr()));
    n1.spawn();
    let conf1 = n1.conf("1.0.0", "pods", "");
    for k in 0..3 {
        add_within(20, "n1's ADDs", &format!("a{k}"), &conf1);
    }
    // Its claim ahead finds the pool full, again and again: the release comes right after one
    // of those, so that its claims wait (8 to 12 s) while the block is taken.
    let full = |d: &Daemon| {
        d.log()
            .lines()
            .filter(|l| l.contains("a claim failed") && l.contains("has no free IPv4 block"))
            .count()
    };
    let seen = full(&n1);
    eventually(20, "n1 finding the pool full again", || {
        match full(&n1) > seen {
            true => Ok(()),
            false => Err(seen),
        }
    });
    let o = store.ctl(&["release-node", "n1", "--force"]);
    assert!(o.status.success(), "release-node: {}", stderr(&o));
    let mut n2 =
        Daemon::prepare_with_config(&store.daemon_config("n2", "p", tuning, &store.addr()));
    n2.spawn();
    let first = add_within(20, "n2's first ADD", "b0", &n2.conf("1.0.0", "pods", ""));
    let taken = Instant::now();
    assert!(store.owners().values().all(|o| o == "n2"));
    // n1 hands out nothing more from the block once its next sync found it gone.
    let mut last_ok = None;
    let mut k = 0;
    while taken.elapsed() < Duration::from_secs(6) {
        k += 1;
        let r = cni("ADD", &format!("late{k}"), &conf1);
        if r.ok {
            assert_ne!(addr(&r), addr(&first), "n2's address handed out on n1");
            last_ok = Some(taken.elapsed());
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(
        last_ok.is_none_or(|t| t < Duration::from_millis(2500)),
        "n1 handed out from a block n2 owns {last_ok:?} after n2 took it (resync_secs 1)"
    );
}

#[test]
fn a_block_forced_away_while_the_pool_is_full_stops_serving_at_the_next_sync_on_the_kubernetes_api()
{
    forced_away_while_the_pool_is_full(Backend::kube());
}

#[test]
#[ignore = "needs etcd-server (apt-get install etcd-server); CI runs it with --include-ignored"]
fn a_block_forced_away_while_the_pool_is_full_stops_serving_at_the_next_sync_on_etcd() {
    forced_away_while_the_pool_is_full(Backend::etcd());
}

/// An idle dual-stack node writes no block at its resyncs: each family's sync settles only
/// its own family's blocks (each family settled the other's every time, and moved
/// the revision the other held).
fn idle_dual_stack_writes_nothing(store: Backend) {
    store.create_pool(&[
        "p",
        "--cidr",
        "10.53.0.0/24",
        "--cidr",
        "fd00:53::/112",
        "--block-size",
        "28",
    ]);
    let tuning = "heartbeat_ttl_secs = 6\nresync_secs = 1\nclaim_ahead = 1\n";
    let mut d = Daemon::prepare_with_config(&store.daemon_config("n1", "p", tuning, &store.addr()));
    d.spawn();
    let conf = d.conf("1.0.0", "pods", "");
    let r = add_within(20, "a dual-stack ADD", "c0", &conf);
    assert_eq!(r.addresses().len(), 2, "{r:?}");
    // The epoch's first syncs settle every block once; then the node is idle.
    std::thread::sleep(Duration::from_secs(3));
    let before = store.block_writes();
    std::thread::sleep(Duration::from_secs(5));
    let written = store.block_writes() - before;
    assert_eq!(
        written, 0,
        "an idle dual-stack node wrote {written} times in 5 s of 1 s resyncs"
    );
    // And it still serves both families.
    assert_eq!(
        add_within(10, "another ADD", "c1", &conf).addresses().len(),
        2
    );
}

#[test]
fn an_idle_dual_stack_node_writes_no_block_at_its_resyncs_on_the_kubernetes_api() {
    idle_dual_stack_writes_nothing(Backend::kube());
}

#[test]
#[ignore = "needs etcd-server (apt-get install etcd-server); CI runs it with --include-ignored"]
fn an_idle_dual_stack_node_writes_no_block_at_its_resyncs_on_etcd() {
    idle_dual_stack_writes_nothing(Backend::etcd());
}

/// The block `a` is in, as the store lists it.
fn blocks_of(store: &Backend, a: &IpAddr) -> ipnet::IpNet {
    *store
        .owners()
        .keys()
        .find(|b| b.contains(a))
        .unwrap_or_else(|| panic!("{a} is in no block"))
}

/// The fake apiserver of a Kubernetes backend.
fn api(store: &Backend) -> &common::fake_api::FakeApi {
    match store {
        Backend::Kube { api, .. } => api,
        Backend::Etcd(_) => panic!("not the Kubernetes API"),
    }
}

/// What `pool list -o json` says of pool `name` (None: not listed).
fn listed_pool(store: &Backend, name: &str) -> Option<serde_json::Value> {
    let o = store.ctl(&["-o", "json", "pool", "list"]);
    assert!(o.status.success(), "pool list: {}", stderr(&o));
    json(&o)
        .as_array()
        .expect("a list")
        .iter()
        .find(|p| p["name"] == name)
        .cloned()
}

/// A pool whose deletion is under way (marked Deleting, its blocks being listed) is in doubt:
/// a node that settles its block meanwhile (here: the first sync after a restart) neither
/// serves it nor gives it back, so the deletion finds the block and is refused, and the block
/// serves again once the pool is Ready (the node gave its block back, with three
/// pods' addresses in it, and the pool was deleted under them).
#[test]
fn a_node_settling_its_block_while_its_pool_is_being_deleted_keeps_it() {
    let store = Backend::kube();
    store.create_pool(&["p", "--cidr", "10.56.0.0/24", "--block-size", "28"]);
    let tuning = "heartbeat_ttl_secs = 6\nresync_secs = 1\nclaim_ahead = 1\n";
    let mut n1 =
        Daemon::prepare_with_config(&store.daemon_config("n1", "p", tuning, &store.addr()));
    n1.spawn();
    let conf = n1.conf("1.0.0", "pods", "");
    let held: Vec<IpAddr> = (0..3)
        .map(|k| addr(&add_within(20, "n1's ADDs", &format!("a{k}"), &conf)))
        .collect();
    let blocks = store.owners();
    assert_eq!(blocks.len(), 1);
    // The deletion marks the pool Deleting, then waits on its listing of the pool's blocks.
    let listing = api(&store).hold("ipblocks?&labelSelector=ipool.io%2Fpool%3Dp&limit");
    let deletion = std::thread::scope(|s| {
        // (Its calls may take 30 s: the held one does not time out.)
        let deleting = s.spawn(|| store.ctl_within(30, &["pool", "delete", "p"]));
        listing.caught_within(10);
        // Meanwhile n1 restarts: its first sync settles its block and reads the pool.
        n1.kill9();
        n1.spawn();
        // Its syncs (resync_secs 1) have settled the block by now.
        std::thread::sleep(Duration::from_secs(3));
        assert_eq!(store.owners(), blocks, "n1 gave its block back");
        n1.wait_log(&["in doubt", "being deleted"]);
        let o = n1.ctl(&["-o", "json", "status"]);
        assert!(
            String::from_utf8_lossy(&o.stdout).contains("DOUBT"),
            "{}",
            String::from_utf8_lossy(&o.stdout)
        );
        listing.release();
        deleting.join().expect("ipoolctl")
    });
    assert_eq!(code(&deletion), 1, "refused: {}", stderr(&deletion));
    assert!(
        stderr(&deletion).contains("owned block"),
        "{}",
        stderr(&deletion)
    );
    assert_eq!(
        listed_pool(&store, "p").map(|p| p["phase"].clone()),
        Some(serde_json::json!("Ready"))
    );
    // Its block is still n1's (a node whose only block is in doubt may claim another once
    // the pool is Ready again: a CI run under load met that).
    let now = store.owners();
    assert!(
        blocks.iter().all(|(b, n)| now.get(b) == Some(n)),
        "{now:?} lacks {blocks:?}"
    );
    // n1's next sync confirms its block again; a node started now gets none of its pods'
    // addresses.
    eventually(10, "n1's block confirmed again", || {
        let o = n1.ctl(&["-o", "json", "status"]);
        let text = String::from_utf8_lossy(&o.stdout).into_owned();
        match text.contains("DOUBT") {
            false => Ok(()),
            true => Err(text),
        }
    });
    let r = add_within(20, "n1's ADD once the pool is Ready", "a3", &conf);
    assert_eq!(
        store.owners().get(&blocks_of(&store, &addr(&r))),
        Some(&"n1".to_string())
    );
    let mut n2 =
        Daemon::prepare_with_config(&store.daemon_config("n2", "p", tuning, &store.addr()));
    n2.spawn();
    let conf2 = n2.conf("1.0.0", "pods", "");
    for k in 0..15 {
        let r = add_within(20, "n2's ADDs", &format!("b{k}"), &conf2);
        assert!(!held.contains(&addr(&r)), "{} is n1's pod's", addr(&r));
    }
}

/// A deletion that cannot list the pool's blocks leaves the pool as it was: Ready, claimed
/// from (it stayed Deleting, and no node could claim from it).
#[test]
fn a_pool_deletion_that_cannot_list_the_blocks_leaves_the_pool_ready() {
    let store = Backend::kube();
    store.create_pool(&["p", "--cidr", "10.57.0.0/24", "--block-size", "28"]);
    let listing = "ipblocks?&labelSelector=ipool.io%2Fpool%3Dp&limit";
    // An error status; then no answer at all, past ipoolctl's deadline (2 s).
    let mut unanswered = None;
    for round in 0..2 {
        match round {
            0 => api(&store).fail_matching(listing, 500),
            _ => unanswered = Some(api(&store).hold(listing)),
        }
        let o = store.ctl(&["pool", "delete", "p"]);
        assert_eq!(code(&o), 2, "round {round}: {}", stderr(&o));
        assert!(stderr(&o).contains("Ready again"), "{}", stderr(&o));
        assert_eq!(
            listed_pool(&store, "p").map(|p| p["phase"].clone()),
            Some(serde_json::json!("Ready")),
            "round {round}"
        );
    }
    unanswered.expect("held").release();
    let tuning = "heartbeat_ttl_secs = 6\nresync_secs = 1\nclaim_ahead = 1\n";
    let mut n1 =
        Daemon::prepare_with_config(&store.daemon_config("n1", "p", tuning, &store.addr()));
    n1.spawn();
    add_within(
        20,
        "an ADD from the pool",
        "c0",
        &n1.conf("1.0.0", "pods", ""),
    );
    // With nothing failing, a deletion of a pool with a block is refused, and of an empty one
    // done.
    let o = store.ctl(&["pool", "delete", "p"]);
    assert_eq!(code(&o), 1, "{}", stderr(&o));
    drop(n1);
    let o = store.ctl(&["release-node", "n1", "--force"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = store.ctl(&["pool", "delete", "p"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(listed_pool(&store, "p"), None);
}

/// A clean stop (SIGTERM) gives the node's name up: release-node sees the node away from then
/// on (not alive for a heartbeat TTL), and a replacement daemon with a new state dir serves at
/// once instead of waiting the TTL out.
fn a_clean_stop_gives_the_name_up(store: Backend) {
    store.create_pool(&["p", "--cidr", "10.58.0.0/24", "--block-size", "28"]);
    // A TTL far longer than the test waits.
    let tuning = "heartbeat_ttl_secs = 60\nresync_secs = 1\nclaim_ahead = 1\n";
    let config = store.daemon_config("n1", "p", tuning, &store.addr());
    let mut first = Daemon::prepare_with_config(&config);
    first.spawn();
    add_within(
        20,
        "the first daemon's ADD",
        "a0",
        &first.conf("1.0.0", "pods", ""),
    );
    assert!(first.terminate().success(), "{}", first.log());
    first.wait_log(&["gave up its node name"]);
    let o = store.ctl(&["release-node", "n1"]);
    assert_eq!(code(&o), 1, "{}", stderr(&o));
    assert!(!stderr(&o).contains("is alive"), "{}", stderr(&o));
    // Another daemon (another state dir: another instance) under the same name.
    let mut second = Daemon::prepare_with_config(&config);
    second.spawn();
    let started = Instant::now();
    add_within(
        10,
        "the replacement's ADD",
        "b0",
        &second.conf("1.0.0", "pods", ""),
    );
    assert!(started.elapsed() < Duration::from_secs(10));
}

#[test]
fn a_clean_stop_gives_the_node_name_up_on_the_kubernetes_api() {
    a_clean_stop_gives_the_name_up(Backend::kube());
}

#[test]
#[ignore = "needs etcd-server (apt-get install etcd-server); CI runs it with --include-ignored"]
fn a_clean_stop_gives_the_node_name_up_on_etcd() {
    a_clean_stop_gives_the_name_up(Backend::etcd());
}

/// A node's first claim reaches the store late, after its pool was deleted and made again
/// with bigger blocks (/27 instead of /28). On the Kubernetes API the late create lands: the
/// /28 must be given back, not kept under the node's /27 for good (it was
/// settled at every sync, and dropped from the node's books each time without a give-back).
#[test]
fn a_late_claim_of_the_old_block_size_is_given_back_on_the_kubernetes_api() {
    let store = Backend::kube();
    old_size_pool(&store);
    // The node's first claim (ahead of need, at start) is held past its deadline.
    let held = api(&store).hold("POST /apis/ipool.io/v1/ipblocks");
    let tuning = "heartbeat_ttl_secs = 6\nresync_secs = 1\nclaim_ahead = 1\n";
    let mut n1 =
        Daemon::prepare_with_config(&store.daemon_config("n1", "p", tuning, &store.addr()));
    n1.spawn();
    held.caught_within(20);
    made_again_with_27s(&store);
    // Past the daemon's deadline (store_timeout_ms 500) it gave the claim up, and claims the
    // /27 of the pool made anew; the /28 lands after.
    eventually(20, "the /27 claimed", || {
        let owners = store.owners();
        match owners.contains_key(&"10.58.0.0/27".parse().unwrap()) {
            true => Ok(()),
            false => Err(owners),
        }
    });
    held.release();
    eventually(20, "the late /28 landed", || {
        let owners = store.owners();
        match owners.contains_key(&"10.58.0.0/28".parse().unwrap()) {
            true => Ok(()),
            false => Err(owners),
        }
    });
    only_the_27_in_the_end(&store, &n1);
}

/// On etcd a claim is conditioned on the pool as read: the same late claim, sent by the test
/// as the daemon built it, cannot land.
#[test]
#[ignore = "needs etcd-server (apt-get install etcd-server); CI runs it with --include-ignored"]
fn a_late_claim_of_the_old_block_size_never_lands_on_etcd() {
    use ipool_server::cluster::datastore::{BlockStore, PoolStore};
    use ipool_server::cluster::vocab::Claimed;
    let store = Backend::etcd();
    old_size_pool(&store);
    let url = format!("http://{}", store.addr());
    let old = common::etcd::with_store(&url, |s| async move {
        s.get_pool("p")
            .await
            .expect("read")
            .expect("pool p")
            .revision
    });
    made_again_with_27s(&store);
    let tuning = "heartbeat_ttl_secs = 6\nresync_secs = 1\nclaim_ahead = 1\n";
    let n1 = Daemon::prepare_with_config(&store.daemon_config("n1", "p", tuning, &store.addr()));
    let mut n1 = n1;
    n1.spawn();
    add_within(
        20,
        "an ADD from the pool made anew",
        "c0",
        &n1.conf("1.1.0", "pods", ""),
    );
    let late = common::etcd::with_store(&url, |s| async move {
        let b: ipnet::IpNet = "10.58.0.0/28".parse().unwrap();
        s.claim("p", old, &b, "n1").await.expect("etcd answers")
    });
    assert!(matches!(late, Claimed::PoolChanged), "{late:?}");
    only_the_27_in_the_end(&store, &n1);
}

/// Pool p with one block to claim, 10.58.0.0/28 (the rest of its /26 set aside).
fn old_size_pool(store: &Backend) {
    store.create_pool(&[
        "p",
        "--cidr",
        "10.58.0.0/26",
        "--block-size",
        "28",
        "--exclude",
        "10.58.0.16/28",
        "--exclude",
        "10.58.0.32/27",
    ]);
}

/// Pool p deleted (it owns no block yet) and made again with blocks of /27.
fn made_again_with_27s(store: &Backend) {
    let o = store.ctl(&["pool", "delete", "p"]);
    assert!(o.status.success(), "{}", stderr(&o));
    // One block to claim again: 10.58.0.0/27, over the old one.
    store.create_pool(&[
        "p",
        "--cidr",
        "10.58.0.0/26",
        "--block-size",
        "27",
        "--exclude",
        "10.58.0.32/27",
    ]);
}

/// In the end n1 owns the /27 alone, its blocks are no longer written, and it hands out no
/// address twice.
fn only_the_27_in_the_end(store: &Backend, n1: &Daemon) {
    let conf = n1.conf("1.1.0", "pods", "");
    let kept = addr(&add_within(
        30,
        "an ADD from the pool made anew",
        "c1",
        &conf,
    ));
    eventually(20, "the old-size block given back", || {
        let owners = store.owners();
        let blocks: Vec<String> = owners.keys().map(|b| b.to_string()).collect();
        match blocks == ["10.58.0.0/27"] {
            true => Ok(()),
            false => Err((owners, n1.log())),
        }
    });
    // (On etcd the count is its revision: the node's report of its addresses in use after
    // the ADD moves it once more.)
    std::thread::sleep(Duration::from_secs(2));
    let before = store.block_writes();
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(
        store.block_writes(),
        before,
        "blocks still written:\n{}",
        n1.log()
    );
    for k in 2..8 {
        let r = add_within(20, "ADDs after", &format!("c{k}"), &conf);
        assert_ne!(addr(&r), kept, "handed out twice");
    }
}
