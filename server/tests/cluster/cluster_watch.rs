//! Cluster mode hears of its blocks instead of polling, on either store (the fake
//! apiserver always; a real etcd where installed), with the real daemon and plugin and
//! `resync_secs` at its default (ten minutes): a block of a node's taken by another node stops
//! serving on the old owner within a second; a watch broken while the change happened, and
//! resumed from a history compacted away (410 Gone; etcd's compacted revision), lists again
//! and misses nothing; on etcd, the node's name key deleted is noticed at once (the renewals
//! do not read it back while its watch is on).

use crate::common;

use std::net::IpAddr;
use std::time::{Duration, Instant};

use crate::common::backend::Backend;
use crate::common::proxy::{Mode, Proxy};
use crate::common::*;
use ipnet::IpNet;

fn addr(r: &Run) -> IpAddr {
    r.addresses()[0].split('/').next().unwrap().parse().unwrap()
}

/// Default resync (no `resync_secs`): only a watch can tell the node in time.
const TUNING: &str = "heartbeat_ttl_secs = 6\nclaim_ahead = 1\n";

/// n1's block, once it has handed out an address of it; n1's daemon and config.
fn serving(store: &Backend, via: &str) -> (Daemon, String, IpNet) {
    store.create_pool(&["p", "--cidr", "10.54.0.0/24", "--block-size", "26"]);
    let mut n1 = Daemon::prepare_with_config(&store.daemon_config("n1", "p", TUNING, via));
    n1.spawn();
    let conf = n1.conf("1.0.0", "pods", "");
    let first = addr(&add_within(20, "n1's first ADD", "a0", &conf));
    let block = store
        .owners()
        .into_iter()
        .find(|(b, _)| b.contains(&first))
        .map(|(b, node)| {
            assert_eq!(node, "n1");
            b
        })
        .expect("n1's block listed");
    (n1, conf, block)
}

/// After `since`, how late n1 still handed out an address of `block` (ADDs every 100 ms for
/// `secs`).
fn last_served_from(conf: &str, block: IpNet, since: Instant, secs: u64) -> Option<Duration> {
    let mut last = None;
    let mut k = 0;
    while since.elapsed() < Duration::from_secs(secs) {
        k += 1;
        let r = cni("ADD", &format!("late{k}"), conf);
        if r.ok && block.contains(&addr(&r)) {
            last = Some(since.elapsed());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    last
}

fn taken_by_another_node_stops_serving_within_a_second(store: Backend) {
    let (n1, conf, block) = serving(&store, &store.addr());
    // n1 follows its blocks by now (its first sync is done); the block is made n2's.
    std::thread::sleep(Duration::from_millis(500));
    store.reown("p", &block.to_string(), "n1", "n2");
    let taken = Instant::now();
    let last = last_served_from(&conf, block, taken, 4);
    assert!(
        last.is_none_or(|t| t < Duration::from_secs(1)),
        "n1 handed out an address of {block}, n2's, {last:?} after it was taken (resync_secs at its default: only the watch can tell n1)\n{}",
        n1.log()
    );
    assert!(
        n1.log().contains("no longer its own"),
        "n1 says why: {}",
        n1.log()
    );
}

#[test]
fn a_block_taken_by_another_node_stops_serving_within_a_second_on_the_kubernetes_api() {
    taken_by_another_node_stops_serving_within_a_second(Backend::kube());
}

#[test]
#[ignore = "needs etcd-server (apt-get install etcd-server); CI runs it with --include-ignored"]
fn a_block_taken_by_another_node_stops_serving_within_a_second_on_etcd() {
    taken_by_another_node_stops_serving_within_a_second(Backend::etcd());
}

/// The watch is cut while the block is taken, and the store's history compacted before it
/// comes back: resumed from where it was, it is told that is gone, lists again, and n1 finds
/// the block gone all the same.
fn resumed_after_compaction_misses_nothing(store: Backend) {
    let proxy = Proxy::start(&store.addr());
    let via = proxy.url.trim_start_matches("http://").to_string();
    let (n1, conf, block) = serving(&store, &via);
    std::thread::sleep(Duration::from_millis(500));
    proxy.set(Mode::Refuse);
    proxy.cut();
    std::thread::sleep(Duration::from_millis(300));
    store.reown("p", &block.to_string(), "n1", "n2");
    store.compact();
    std::thread::sleep(Duration::from_millis(300));
    proxy.set(Mode::Pass);
    let back = Instant::now();
    // Heard once the watch is made again: its retry waits at most 2 s (a fifth more with its
    // jitter) after the store came back, then a listing.
    let last = last_served_from(&conf, block, back, 6);
    assert!(
        last.is_none_or(|t| t < Duration::from_secs(4)),
        "n1 handed out an address of {block}, n2's, {last:?} after its watch could resume\n{}",
        n1.log()
    );
    assert!(
        store.owners().get(&block).is_some_and(|o| o == "n2"),
        "the block stays n2's"
    );
}

#[test]
fn a_watch_resumed_from_a_compacted_history_lists_again_on_the_kubernetes_api() {
    resumed_after_compaction_misses_nothing(Backend::kube());
}

#[test]
#[ignore = "needs etcd-server (apt-get install etcd-server); CI runs it with --include-ignored"]
fn a_watch_resumed_from_a_compacted_history_lists_again_on_etcd() {
    resumed_after_compaction_misses_nothing(Backend::etcd());
}

/// A node's routine resyncs read the apiserver's watch cache (`resourceVersion=0`: no etcd
/// read, and before Kubernetes 1.31 no scan of every IPBlock); the first sync of its epoch,
/// which trusts nothing, reads etcd through the apiserver.
#[test]
fn routine_resyncs_read_the_apiservers_watch_cache() {
    let store = Backend::kube();
    store.create_pool(&["p", "--cidr", "10.57.0.0/24", "--block-size", "26"]);
    let tuning = "heartbeat_ttl_secs = 6\nresync_secs = 1\nclaim_ahead = 1\n";
    let mut n1 =
        Daemon::prepare_with_config(&store.daemon_config("n1", "p", tuning, &store.addr()));
    n1.spawn();
    add_within(20, "n1's first ADD", "a0", &n1.conf("1.0.0", "pods", ""));
    let api = store.api().expect("the fake apiserver");
    let lists = || -> Vec<String> {
        api.requests()
            .into_iter()
            .filter(|r| {
                r.starts_with("GET /apis/ipool.io/v1/ipblocks?")
                    && r.contains("ipool.io%2Fnode%3Dn1")
                    && !r.contains("watch=true")
            })
            .collect()
    };
    let cached = eventually(10, "resyncs from the watch cache", || {
        let l = lists();
        let cached: Vec<&String> = l
            .iter()
            .filter(|r| r.contains("resourceVersion=0"))
            .collect();
        match cached.len() >= 2 {
            true => Ok(cached.len()),
            false => Err(l.clone()),
        }
    });
    let first = lists().into_iter().next().expect("a first sync");
    assert!(
        !first.contains("resourceVersion="),
        "the first sync reads etcd: {first}"
    );
    assert!(cached >= 2);
}

/// A pool marked for deletion (as `ipoolctl cluster pool delete` does first) is read again by
/// the node at once, not at its next resync (ten minutes by default): it claims nothing more
/// from it, and says why.
#[test]
fn a_pool_marked_for_deletion_is_read_again_at_once() {
    let store = Backend::kube();
    store.create_pool(&["p", "--cidr", "10.58.0.0/24", "--block-size", "26"]);
    let mut n1 =
        Daemon::prepare_with_config(&store.daemon_config("n1", "p", TUNING, &store.addr()));
    n1.spawn();
    add_within(20, "n1's first ADD", "a0", &n1.conf("1.0.0", "pods", ""));
    std::thread::sleep(Duration::from_millis(500));
    let api = store.api().expect("the fake apiserver");
    let reads = || {
        api.requests()
            .iter()
            .filter(|r| r.starts_with("GET /apis/ipool.io/v1/ippools/p"))
            .count()
    };
    let before = reads();
    let mut pool = api.get("ippools", "", "p").expect("the pool");
    pool["status"]["phase"] = serde_json::json!("Deleting");
    api.put_custom("ippools", pool);
    let marked = Instant::now();
    eventually(5, "n1 reading the pool again", || match reads() > before {
        true => Ok(()),
        false => Err(reads()),
    });
    assert!(
        marked.elapsed() < Duration::from_secs(1),
        "read {:?} after it was marked",
        marked.elapsed()
    );
}

/// The node's `alive` key deleted by hand (its lease still kept alive): the heartbeat's
/// renewals, which no longer read the key back while it is watched, hear of it at once and
/// take the name again, long before the next renewal (every 20 s here).
#[test]
#[ignore = "needs etcd-server (apt-get install etcd-server); CI runs it with --include-ignored"]
fn a_name_key_deleted_by_hand_is_noticed_at_once_on_etcd() {
    let store = Backend::etcd();
    store.create_pool(&["p", "--cidr", "10.55.0.0/24", "--block-size", "26"]);
    let config = store.daemon_config("n1", "p", "heartbeat_ttl_secs = 60\n", &store.addr());
    let mut n1 = Daemon::prepare_with_config(&config);
    n1.spawn();
    let conf = n1.conf("1.0.0", "pods", "");
    add_within(20, "n1's first ADD", "a0", &conf);
    let Backend::Etcd(e) = &store else {
        unreachable!()
    };
    let url = e.lock().unwrap().client_url.clone();
    let alive = format!(
        "{}/nodes/n1/alive",
        ipool_server::cluster::etcd::DEFAULT_PREFIX
    );
    let read = |url: &str, key: &str| -> Option<i64> {
        let key = key.to_string();
        common::etcd::with_store(url, |s| async move {
            let r = s
                .client()
                .range(ipool_server::cluster::etcd::request::get(key))
                .await
                .expect("read");
            r.kvs.first().map(|kv| kv.create_revision)
        })
    };
    // Its first renewals are done (the watch on by then).
    std::thread::sleep(Duration::from_secs(2));
    let before = read(&url, &alive).expect("n1's alive key");
    let key = alive.clone();
    common::etcd::with_store(&url, |s| async move {
        s.client()
            .delete_range(ipool_server::cluster::etcd::request::delete(key))
            .await
            .expect("delete");
    });
    let deleted = Instant::now();
    let mut again = None;
    while deleted.elapsed() < Duration::from_secs(10) && again.is_none() {
        std::thread::sleep(Duration::from_millis(100));
        again = read(&url, &alive).filter(|c| *c > before);
    }
    assert!(
        again.is_some() && deleted.elapsed() < Duration::from_secs(5),
        "n1 took its name again {:?} after its key was deleted (renewals every 20 s: only the watch can tell it)\n{}",
        deleted.elapsed(),
        n1.log()
    );
}
