//! Cluster mode on the Kubernetes API (`datastore = "kubernetes"`), against the fake apiserver
//! over real HTTP: the store's rules one by one (claims, give-backs, settles, pools, Leases,
//! release-node), then real ipoold daemons handing out addresses through the real plugin.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::time::Duration;

use crate::common::fake_api::FakeApi;
use crate::common::*;
use ipnet::IpNet;
use ipool_server::cluster::claim::{claim_next, Views};
use ipool_server::cluster::datastore::{BlockStore, NameStore, PinStore, PoolStore, Release};
use ipool_server::cluster::ippool::PoolSpec;
use ipool_server::cluster::kube::KubeStore;
use ipool_server::cluster::vocab::{Acquired, Alive};
use ipool_server::cluster::vocab::{Block, Claimed, ClusterError, PoolPhase, Settled};

fn pool(name: &str, cidrs: &[&str]) -> PoolSpec {
    PoolSpec {
        name: name.into(),
        cidrs: cidrs.iter().map(|c| c.parse().unwrap()).collect(),
        block_v4: 26,
        block_v6: 122,
        exclude: vec![],
        ..PoolSpec::default()
    }
}

/// A pin in block `b` of its first address but one, held by node "n".
fn held_pin(b: &ipool_server::cluster::vocab::Block) -> ipool_server::cluster::pin::Pin {
    use ipool_server::cluster::pin::{Holder, Pin, PinOwner};
    Pin {
        pool: b.pool.clone(),
        address: b.block.hosts().nth(1).expect("an address"),
        owner: PinOwner::StatefulSet {
            namespace: "db".into(),
            name: "web".into(),
            ordinal: 0,
        },
        block: b.block,
        block_id: b.revision.create,
        set_aside: false,
        holders: vec![Holder {
            node: "n".into(),
            pod: "db/web-0".into(),
            uid: "u1".into(),
            since_ms: 1,
            instance: None,
        }],
    }
}

fn net(s: &str) -> IpNet {
    s.parse().unwrap()
}

/// Runs `f` with a store on `api` whose writes are made by `manager`.
fn with_kube<T, F: std::future::Future<Output = T>>(
    api: &FakeApi,
    manager: &str,
    f: impl FnOnce(KubeStore) -> F,
) -> T {
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = api.kubeconfig(dir.path());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let client = ipool_server::k8s::client(Some(&kubeconfig), Duration::from_secs(5))
            .await
            .expect("client");
        let s = KubeStore::connect(client, "ipool-system", None, manager)
            .await
            .expect("connect");
        f(s).await
    })
}

#[test]
fn without_the_crds_the_store_says_which_to_apply() {
    let api = FakeApi::start();
    api.set_crds(false);
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = api.kubeconfig(dir.path());
    let rt = tokio::runtime::Runtime::new().unwrap();
    let e = rt.block_on(async {
        let client = ipool_server::k8s::client(Some(&kubeconfig), Duration::from_secs(5))
            .await
            .unwrap();
        KubeStore::connect(client, "ipool-system", None, "ipoold")
            .await
            .err()
            .expect("refused")
    });
    assert!(e.to_string().contains("deploy/crds"), "{e}");
}

#[test]
fn a_block_has_one_owner_and_a_late_give_back_finds_it_settled() {
    let api = FakeApi::start();
    with_kube(&api, "ipoold", |s| async move {
        s.create_pool(&pool("p", &["10.0.0.0/24"])).await.unwrap();
        let rev = s.get_pool("p").await.unwrap().expect("ready").revision;
        let b = net("10.0.0.64/26");
        let won = match s.claim("p", rev, &b, "node-a").await.unwrap() {
            Claimed::Won(b) => b,
            other => panic!("{other:?}"),
        };
        assert_eq!(
            s.claim("p", rev, &b, "node-b").await.unwrap(),
            Claimed::Lost("node-a".into())
        );
        // Claimed again by its owner: its own, written anew.
        let mine = match s.claim("p", rev, &b, "node-a").await.unwrap() {
            Claimed::Mine(m) => m,
            other => panic!("{other:?}"),
        };
        assert_ne!(mine.revision, won.revision);
        // A give-back of the write first listed (sent before the settle, arriving after) fails.
        assert!(!s.give_back(&won).await.unwrap());
        let Settled::Mine(settled) = s.settle(&mine).await.unwrap() else {
            panic!("settled")
        };
        assert!(!s.give_back(&mine).await.unwrap(), "settled since");
        let current = ipool_server::cluster::vocab::Block {
            revision: settled,
            ..mine
        };
        assert!(s.give_back(&current).await.unwrap());
        assert!(s
            .list_blocks(Some("p"), None)
            .await
            .unwrap()
            .blocks
            .is_empty());
    });
}

#[test]
fn concurrent_claims_of_three_nodes_never_share_a_block() {
    let api = FakeApi::start();
    let blocks = with_kube(&api, "ipoold", |s| async move {
        s.create_pool(&pool("p", &["10.1.0.0/22"])).await.unwrap();
        let ipool_server::cluster::vocab::Pool {
            spec,
            revision: rev,
            ..
        } = s.get_pool("p").await.unwrap().unwrap();
        let mut tasks = Vec::new();
        for n in ["node-a", "node-b", "node-c"] {
            let (s, spec) = (s.clone(), spec.clone());
            tasks.push(tokio::spawn(async move {
                let mut got = Vec::new();
                let views = Views::default();
                while let Some(b) = claim_next(&s, &views, &spec, rev, true, n)
                    .await
                    .unwrap()
                    .block
                {
                    got.push((b.block, n));
                }
                got
            }));
        }
        let mut all = Vec::new();
        for t in tasks {
            all.extend(t.await.unwrap());
        }
        all
    });
    let distinct: BTreeSet<IpNet> = blocks.iter().map(|(b, _)| *b).collect();
    assert_eq!(
        distinct.len(),
        blocks.len(),
        "a block won twice: {blocks:?}"
    );
    assert_eq!(blocks.len(), 16, "every /26 of the /22 claimed once");
    assert_eq!(api.objects("ipblocks").len(), 16);
    // Each labelled with its node: a node's listing is its own.
    for o in api.objects("ipblocks") {
        assert_eq!(o["metadata"]["labels"]["ipool.io/node"], o["spec"]["node"]);
    }
}

#[test]
fn pools_overlap_nothing_and_go_only_when_no_block_is_left() {
    let api = FakeApi::start();
    with_kube(&api, "ipoolctl", |s| async move {
        s.create_pool(&pool("p", &["10.2.0.0/24"])).await.unwrap();
        let e = s
            .create_pool(&pool("q", &["10.2.0.128/25"]))
            .await
            .unwrap_err();
        assert!(e.to_string().contains("overlaps"), "{e}");
        assert!(s.get_pool("q").await.unwrap().is_none(), "withdrawn");
        let e = s
            .create_pool(&pool("p", &["10.9.0.0/24"]))
            .await
            .unwrap_err();
        assert!(e.to_string().contains("exists"), "{e}");

        let rev = s.get_pool("p").await.unwrap().unwrap().revision;
        let Claimed::Won(b) = s.claim("p", rev, &net("10.2.0.0/26"), "n").await.unwrap() else {
            panic!("won")
        };
        let e = s.delete_pool("p").await.unwrap_err();
        assert!(matches!(e, ClusterError::Refused(_)), "{e}");
        // Refused, and Ready again: claims go on.
        let again = s
            .get_pool("p")
            .await
            .unwrap()
            .expect("ready again")
            .revision;
        assert_eq!(again, rev);
        assert!(s.give_back(&b).await.unwrap());
        s.delete_pool("p").await.unwrap();
        assert!(s.get_pool("p").await.unwrap().is_none());

        // A claim conditioned on the pool as it was, once it is made anew, is given back.
        s.create_pool(&pool("p", &["10.2.0.0/24"])).await.unwrap();
        assert_eq!(
            s.claim("p", rev, &net("10.2.0.0/26"), "n").await.unwrap(),
            Claimed::PoolChanged
        );
        s.delete_pool("p").await.unwrap();
        assert_eq!(
            s.claim("p", rev, &net("10.2.0.0/26"), "n").await.unwrap(),
            Claimed::NoPool
        );
        assert!(s.list_blocks(None, None).await.unwrap().blocks.is_empty());
    });
}

/// A claim that reads the pool Deleting after its create gives the new block back (it holds
/// nothing) and says so: the pool is in doubt, nothing is claimed from it.
#[test]
fn a_pool_being_deleted_gives_back_what_is_claimed_from_it() {
    let api = FakeApi::start();
    let fake = &api;
    with_kube(&api, "ipoolctl", |s| async move {
        s.create_pool(&pool("p", &["10.3.0.0/24"])).await.unwrap();
        let rev = s.get_pool("p").await.unwrap().unwrap().revision;
        // The deletion has marked it and is listing its blocks: a claim now reads Deleting.
        let mut obj = fake.get("ippools", "", "p").unwrap();
        obj["status"]["phase"] = "Deleting".into();
        fake.put_custom("ippools", obj);
        assert_eq!(
            s.claim("p", rev, &net("10.3.0.0/26"), "n").await.unwrap(),
            Claimed::PoolDeleting
        );
        assert!(fake.objects("ipblocks").is_empty());
    });
}

fn alive(instance: &str) -> Alive {
    Alive {
        instance: instance.into(),
        at_ms: 0,
        fence_secs: 5,
        ..Alive::default()
    }
}

#[test]
fn a_node_name_is_held_by_one_daemon_and_taken_over_only_after_its_lease_lapses() {
    let api = FakeApi::start();
    with_kube(&api, "ipoold", |s| async move {
        let Acquired::Held(a) = s.start_heartbeat("n1", &alive("A"), 2, 1).await.unwrap() else {
            panic!("held")
        };
        // Another instance waits, however often it asks, while A renews.
        for _ in 0..4 {
            match s.start_heartbeat("n1", &alive("B"), 2, 1).await.unwrap() {
                Acquired::Taken { instance, .. } => assert_eq!(instance, "A"),
                Acquired::Held(_) => panic!("taken from a live holder"),
            }
            s.renew_heartbeat(&a, true).await.unwrap();
            tokio::time::sleep(Duration::from_millis(700)).await;
        }
        // A restart of A (the same instance) takes it back at once.
        let Acquired::Held(a) = s.start_heartbeat("n1", &alive("A"), 2, 1).await.unwrap() else {
            panic!("A again")
        };
        // A stops renewing: B takes it once it stayed unchanged for its duration (2 s).
        let t = std::time::Instant::now();
        let b = loop {
            match s.start_heartbeat("n1", &alive("B"), 2, 1).await.unwrap() {
                Acquired::Held(b) => break b,
                Acquired::Taken { .. } => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        };
        assert!(t.elapsed() >= Duration::from_secs(2), "{:?}", t.elapsed());
        assert!(
            s.renew_heartbeat(&a, true).await.is_err(),
            "A no longer holds it"
        );
        s.renew_heartbeat(&b, true).await.unwrap();
        // A clean stop releases it: the next daemon takes it at once.
        s.stop_heartbeat(&b).await.unwrap();
        assert!(matches!(
            s.start_heartbeat("n1", &alive("C"), 2, 1).await.unwrap(),
            Acquired::Held(_)
        ));
    });
    let lease = api.get("leases", "ipool-system", "ipool-n1").unwrap();
    assert_eq!(lease["spec"]["holderIdentity"], "C");
    assert_eq!(lease["spec"]["leaseTransitions"], 3);
}

/// A held Lease is renewed on the resourceVersion of its last write, without a read (as the
/// kubelet renews its node Lease): one written by someone else meanwhile is read once and
/// renewed; one another daemon holds, or one deleted, fails the renewal.
#[test]
fn a_held_lease_is_renewed_without_reading_it() {
    let api = FakeApi::start();
    let fake = &api;
    with_kube(&api, "ipoold", |s| async move {
        let Acquired::Held(a) = s.start_heartbeat("n1", &alive("A"), 10, 1).await.unwrap() else {
            panic!("held")
        };
        let reads = || {
            fake.requests()
                .iter()
                .filter(|r| r.starts_with("GET ") && r.contains("/leases/ipool-n1"))
                .count()
        };
        let before = reads();
        for _ in 0..5 {
            s.renew_heartbeat(&a, true).await.unwrap();
        }
        assert_eq!(reads(), before, "renewals read nothing");
        let lease = || fake.get("leases", "ipool-system", "ipool-n1").unwrap();
        // Written by someone else (release-node's check): read once, then renewed on its own
        // write again.
        let mut l = lease();
        l["metadata"]["annotations"]["ipool.io/absence-checked-by"] = "ipoolctl".into();
        fake.put_custom("leases", l);
        s.renew_heartbeat(&a, true).await.unwrap();
        s.renew_heartbeat(&a, true).await.unwrap();
        assert_eq!(reads(), before + 1);
        assert_eq!(lease()["spec"]["holderIdentity"], "A");
        // Another holder now: the renewal fails, and so does every one after it.
        let mut l = lease();
        l["spec"]["holderIdentity"] = "B".into();
        fake.put_custom("leases", l);
        assert!(s.renew_heartbeat(&a, true).await.is_err());
        assert!(s.renew_heartbeat(&a, true).await.is_err());
        assert_eq!(lease()["spec"]["holderIdentity"], "B");
        // Held again, then deleted: the renewal says it is gone.
        let Acquired::Held(a) = s.start_heartbeat("n2", &alive("A"), 10, 1).await.unwrap() else {
            panic!("held")
        };
        assert!(fake.delete("leases", "ipool-system", "ipool-n2"));
        let e = s.renew_heartbeat(&a, true).await.unwrap_err();
        assert!(e.to_string().contains("gone"), "{e}");
    });
}

#[test]
fn release_node_waits_for_the_apiservers_clock_and_fences_a_returning_daemon() {
    let api = FakeApi::start();
    let (blocks, beat) = with_kube(&api, "ipoold", |s| async move {
        s.create_pool(&pool("p", &["10.4.0.0/24"])).await.unwrap();
        let ipool_server::cluster::vocab::Pool {
            spec,
            revision: rev,
            ..
        } = s.get_pool("p").await.unwrap().unwrap();
        let me = Alive {
            fence_secs: 1,
            ..alive("A")
        };
        let Acquired::Held(beat) = s.start_heartbeat("n1", &me, 10, 1).await.unwrap() else {
            panic!("held")
        };
        let b = claim_next(&s, &Views::default(), &spec, rev, true, "n1")
            .await
            .unwrap();
        let b = b.block.expect("a block");
        // A pod of n1's holds a pin made in n2's block (one made in n1's own would keep it).
        let other = claim_next(&s, &Views::default(), &spec, rev, true, "n2")
            .await
            .unwrap()
            .block
            .expect("n2's block");
        let mut pin = held_pin(&other);
        pin.holders[0].node = "n1".into();
        assert!(matches!(
            s.create_pin(&pin).await.unwrap(),
            ipool_server::cluster::pin::PinCreated::Created(_)
        ));
        (b, beat)
    });
    let (state, _) = with_kube(&api, "ipoolctl", |s| async move {
        let state = s.node_state("n1").await.unwrap();
        assert!(state.alive.is_some(), "just renewed: alive");
        let e = s
            .release_node(
                "n1",
                &Release::of_blocks(&state, &state.blocks.blocks, false),
            )
            .await
            .unwrap_err();
        (state, e)
    });
    assert_eq!(state.blocks.blocks.len(), 1);
    assert_eq!(blocks.block, state.blocks.blocks[0].block);
    assert_eq!(api.objects("ipblocks").len(), 2, "kept while alive");

    // 100 s later by the apiserver's clock, with no renewal: away 100 s, gone.
    api.advance_clock(100);
    let renewing = beat.clone();
    with_kube(&api, "ipoolctl", |s| async move {
        let state = s.node_state("n1").await.unwrap();
        assert!(state.alive.is_none(), "{state:?}");
        let (seen, away) = state.seen.clone().expect("measured");
        assert!((100..110).contains(&away), "away {away}");
        assert_eq!((seen.instance.as_str(), seen.fence_secs), ("A", 1));
        // But it renews (an apiserver replica's clock was off): seen by ipoolctl's own clock
        // while it watches the Lease for its fence and a renewal (3 s), and refused.
        let daemon = s.clone();
        let renewals = tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(700)).await;
                daemon.renew_heartbeat(&renewing, true).await.unwrap();
            }
        });
        // Its hold on the pin ends only with its blocks.
        let read = s.pins(None).await.unwrap().remove(0);
        let unheld = ipool_server::cluster::pin::Pin {
            holders: Vec::new(),
            ..read.pin.clone()
        };
        let holds = [(read.clone(), unheld)];
        let plan = Release {
            holds: &holds,
            ..Release::of_blocks(&state, &state.blocks.blocks, false)
        };
        let e = s.release_node("n1", &plan).await.unwrap_err();
        assert!(e.to_string().contains("changed within 3 s"), "{e}");
        renewals.abort();
        assert_eq!(s.pins(None).await.unwrap()[0].pin.holders, read.pin.holders);
        let released = s.release_node("n1", &plan).await.unwrap();
        assert_eq!((released.blocks.len(), released.unheld.len()), (1, 1));
        assert!(s.pins(None).await.unwrap()[0].pin.holders.is_empty());
    });
    assert_eq!(
        api.objects("ipblocks").len(),
        1,
        "n2's, which the pin was made in"
    );
    // The Lease is gone with the blocks: the daemon, back, renews nothing it had.
    assert!(api.get("leases", "ipool-system", "ipool-n1").is_none());
    with_kube(&api, "ipoold", |s| async move {
        assert!(s.renew_heartbeat(&beat, true).await.is_err());
    });
}

fn addr(cidr: &str) -> IpAddr {
    cidr.split('/').next().unwrap().parse().unwrap()
}

/// ipoold as node `node` on cluster pool `pool`, its store the fake apiserver.
fn kube_daemon(kubeconfig: &std::path::Path, node: &str, pool: &str) -> Daemon {
    let config = format!(
        r#"
[cni]
add_wait_ms = 5000
[cluster]
datastore = "kubernetes"
kubeconfig = "{}"
node_name = "{node}"
store_timeout_ms = 1000
heartbeat_ttl_secs = 6
claim_ahead = 8
[[network]]
name = "pods"
ranges_from = "cluster"
cluster_pool = "{pool}"
routes = [{{ dst = "0.0.0.0/0" }}]
"#,
        kubeconfig.display()
    );
    let mut d = Daemon::prepare_with_config(&config);
    d.spawn();
    d
}

#[test]
fn three_daemons_on_the_kubernetes_api_never_hand_out_one_address_twice() {
    let api = FakeApi::start();
    with_kube(&api, "ipoolctl", |s| async move {
        s.create_pool(&pool("p", &["10.30.0.0/23", "fd00:30::/116"]))
            .await
            .unwrap();
    });
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = api.kubeconfig(dir.path());
    let nodes = ["node-a", "node-b", "node-c"];
    let daemons: Vec<Daemon> = nodes
        .iter()
        .map(|n| kube_daemon(&kubeconfig, n, "p"))
        .collect();
    let confs: Vec<String> = daemons
        .iter()
        .map(|d| d.conf("1.0.0", "pods", ""))
        .collect();
    let results: Vec<(usize, String, Run)> = std::thread::scope(|s| {
        let mut handles = Vec::new();
        for (i, conf) in confs.iter().enumerate() {
            for t in 0..3 {
                handles.push(s.spawn(move || {
                    (0..8)
                        .map(|k| {
                            let c = format!("n{i}-t{t}-c{k}");
                            (i, c.clone(), cni("ADD", &c, conf))
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
    let owners: Vec<(IpNet, String)> = api
        .objects("ipblocks")
        .iter()
        .map(|o| {
            (
                o["spec"]["cidr"].as_str().unwrap().parse().unwrap(),
                o["spec"]["node"].as_str().unwrap().to_string(),
            )
        })
        .collect();
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
            let a = addr(ip["address"].as_str().unwrap());
            assert!(seen.insert(a), "{a} handed out twice");
            let owner = owners
                .iter()
                .find(|(b, _)| b.contains(&a))
                .unwrap_or_else(|| panic!("{a} is in no block: {owners:?}"));
            assert_eq!(owner.1, nodes[*i], "{a} from a block of {}", owner.1);
        }
    }
    for n in nodes {
        let lease = api.get("leases", "ipool-system", &format!("ipool-{n}"));
        assert!(lease.is_some(), "{n} holds its Lease");
    }
}

/// A node with no Lease where release-node looks (never made, deleted, or another
/// namespace): its absence is not proven, and nothing is given back without --force (issue
/// 36, 4); the refusal names the namespace looked in.
#[test]
fn release_node_of_a_node_with_no_lease_is_refused_without_force() {
    let api = FakeApi::start();
    with_kube(&api, "ipoolctl", |s| async move {
        s.create_pool(&pool("p", &["10.5.0.0/24"])).await.unwrap();
        let ipool_server::cluster::vocab::Pool {
            spec,
            revision: rev,
            ..
        } = s.get_pool("p").await.unwrap().unwrap();
        claim_next(&s, &Views::default(), &spec, rev, true, "n2")
            .await
            .unwrap();
        let state = s.node_state("n2").await.unwrap();
        assert!(state.alive.is_none() && state.seen.is_none());
        let why = state.unproven.clone().expect("absence not proven");
        assert!(why.contains("ipool-system"), "{why}");
        let e = s
            .release_node(
                "n2",
                &Release::of_blocks(&state, &state.blocks.blocks, false),
            )
            .await
            .unwrap_err();
        assert!(e.to_string().contains("namespace ipool-system"), "{e}");
        assert_eq!(s.blocks_of_node("n2").await.unwrap().blocks.len(), 1);
        // --force gives them back.
        let released = s
            .release_node(
                "n2",
                &Release::of_blocks(&state, &state.blocks.blocks, true),
            )
            .await
            .unwrap();
        assert_eq!(released.blocks.len(), 1);
        assert!(s.blocks_of_node("n2").await.unwrap().blocks.is_empty());
    });
}

#[test]
fn a_block_left_behind_by_a_deleted_pool_is_given_back_at_its_sync_and_blocks_a_new_pool() {
    let api = FakeApi::start();
    let fake = &api;
    with_kube(&api, "ipoold", |s| async move {
        s.create_pool(&pool("p", &["10.6.0.0/24"])).await.unwrap();
        let rev = s.get_pool("p").await.unwrap().unwrap().revision;
        let Claimed::Won(b) = s.claim("p", rev, &net("10.6.0.0/26"), "n1").await.unwrap() else {
            panic!("won")
        };
        // The pool goes while the block stands: the deletion listed no block, then the claim's
        // create arrived (late), and its give-back never came.
        assert!(fake.delete("ippools", "", "p"));
        // A new pool over it, other block sizes: refused while the block stands.
        let mut q = pool("q", &["10.6.0.0/25"]);
        q.block_v4 = 27;
        let e = s.create_pool(&q).await.unwrap_err();
        assert!(e.to_string().contains("still stands"), "{e}");
        // The node's sync lists it, in doubt: settling finds its pool gone (never served);
        // the node gives it back, as it holds nothing.
        let listed = s.list_blocks(None, Some("n1")).await.unwrap().blocks;
        assert_eq!(listed, vec![b.clone()]);
        let Settled::PoolGone(now) = s.settle(&b).await.unwrap() else {
            panic!("not served")
        };
        assert!(s.give_back(&Block { revision: now, ..b }).await.unwrap());
        assert!(fake.objects("ipblocks").is_empty());
        s.create_pool(&q).await.unwrap();
    });
}

#[test]
fn a_pool_left_pending_by_a_creation_that_stopped_is_finished_by_the_next_one() {
    let api = FakeApi::start();
    let fake = &api;
    with_kube(&api, "ipoolctl", |s| async move {
        // What a `pool create` killed between its create and its check leaves.
        fake.put_custom(
            "ippools",
            serde_json::json!({"apiVersion": "ipool.io/v1", "kind": "IPPool",
                "metadata": {"name": "p", "uid": "uid-p"},
                "spec": {"cidrs": ["10.7.0.0/24"], "blockSizeV4": 26, "blockSizeV6": 122,
                         "exclude": []},
                "status": {"phase": "Pending"}}),
        );
        assert_eq!(
            s.get_pool("p").await.unwrap().map(|p| p.phase),
            Some(PoolPhase::Pending),
            "not claimed from"
        );
        let e = s
            .create_pool(&pool("p", &["10.8.0.0/24"]))
            .await
            .unwrap_err();
        assert!(e.to_string().contains("exists"), "another spec: {e}");
        s.create_pool(&pool("p", &["10.7.0.0/24"])).await.unwrap();
        assert_eq!(
            s.get_pool("p").await.unwrap().map(|p| p.phase),
            Some(PoolPhase::Ready)
        );
    });
}
