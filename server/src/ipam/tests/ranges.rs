//! A network's ranges changing at runtime: new ranges serve at once, old
//! ones retire while attachments hold them, and all of it survives a restart.

use super::*;
use crate::model::Origin;
use crate::range::RangeSpec;

fn sets(subnets: &[&str]) -> Vec<Vec<RangeSpec>> {
    subnets
        .iter()
        .map(|s| {
            vec![RangeSpec {
                subnet: s.to_string(),
                range_start: None,
                range_end: None,
                gateway: None,
            }]
        })
        .collect()
}

fn stored_def(rig: &Rig, name: &str) -> crate::model::NetworkDef {
    let snap = rig.store.load().expect("load");
    snap.networks
        .into_iter()
        .find(|d| d.name == name)
        .expect("stored network")
}

#[tokio::test]
async fn new_ranges_serve_at_once_and_old_ones_retire_until_released() {
    let rig = Rig::new("");
    for c in ["a", "b", "c"] {
        rig.ipam.add(req("n", c, V4)).await.expect("add");
    }
    rig.ipam.del(&key("n", "c")).await.expect("del"); // 10.1.0.4 idle, cooling
    let changed = rig
        .ipam
        .set_ranges("n", sets(&["10.2.0.0/24"]))
        .await
        .expect("set ranges")
        .expect("changed");
    assert_eq!(changed.ranges, "[10.2.0.0/24]");
    assert_eq!(changed.retiring, "[10.1.0.0/24]");
    assert_eq!(changed.idle_dropped, 1);
    let same = rig.ipam.set_ranges("n", sets(&["10.2.0.0/24"])).await;
    assert!(
        matches!(same, Ok(None)),
        "the same ranges again change nothing: {same:?}"
    );

    // New addresses come from the new ranges only.
    let d = rig.ipam.add(req("n", "d", "")).await.expect("add");
    assert_eq!(ips(&d), vec![ip("10.2.0.2")]);
    let e = rig
        .ipam
        .add(with_ips(req("n", "e", ""), &["10.1.0.9"]))
        .await
        .expect_err("a retiring range hands nothing out");
    assert!(e.to_string().contains("outside every range"), "{e}");
    // The old attachments still answer CHECK, with their old interface.
    rig.ipam
        .check(&key("n", "a"), &[ip("10.1.0.2")])
        .expect("check");
    let again = rig
        .ipam
        .add(req("n", "a", ""))
        .await
        .expect("idempotent ADD");
    assert_eq!(again.leases[0].prefix_len, 24);
    assert_eq!(again.leases[0].gateway, Some(ip("10.1.0.1")));
    let pools = rig.ipam.pool_status(Some("n"));
    assert_eq!(pools.len(), 2);
    assert!(!pools[0].retiring && pools[0].in_use == 1);
    assert!(pools[1].retiring && pools[1].in_use == 2 && pools[1].idle == 0);
    assert_eq!(stored_def(&rig, "n").retiring, sets(&["10.1.0.0/24"]));

    // A restart keeps the retiring set; DEL works there.
    let ipam = rig.reopen().expect("reopen");
    let pools = ipam.pool_status(Some("n"));
    assert!(pools[1].retiring && pools[1].in_use == 2, "{pools:?}");
    assert_eq!(
        ipam.del(&key("n", "a")).await.expect("del"),
        vec![ip("10.1.0.2")]
    );
    ipam.maintain().await.expect("maintain");
    assert_eq!(ipam.pool_status(Some("n")).len(), 2, "b still holds one");
    ipam.del(&key("n", "b")).await.expect("del");
    ipam.maintain().await.expect("maintain");
    // Nothing holds the old set: it is gone, from memory and from the store.
    let pools = ipam.pool_status(Some("n"));
    assert_eq!(pools.len(), 1, "{pools:?}");
    assert!(!pools[0].retiring);
    let snap = rig.store.load().expect("load");
    assert!(stored_def(&rig, "n").retiring.is_empty());
    assert!(
        snap.idle
            .iter()
            .all(|(_, ip, _)| !ip.to_string().starts_with("10.1.")),
        "{:?}",
        snap.idle
    );
    assert!(
        snap.cursors
            .iter()
            .all(|(_, set, _)| !set.starts_with("10.1.")),
        "{:?}",
        snap.cursors
    );
    let ipam = rig.reopen().expect("reopen");
    assert_eq!(ipam.pool_status(Some("n")).len(), 1);
}

/// Ranges that narrow: what the new set covers moves into it, the rest retires.
#[tokio::test]
async fn narrowed_ranges_keep_what_they_cover_in_use() {
    let rig = Rig::new("");
    let a = rig.ipam.add(req("n", "a", V4)).await.expect("add");
    assert_eq!(ips(&a), vec![ip("10.1.0.2")]);
    let far = rig
        .ipam
        .add(with_ips(req("n", "far", V4), &["10.1.0.200"]))
        .await
        .expect("add");
    assert_eq!(ips(&far), vec![ip("10.1.0.200")]);
    let changed = rig
        .ipam
        .set_ranges("n", sets(&["10.1.0.0/25"]))
        .await
        .expect("set")
        .expect("changed");
    assert_eq!(changed.retiring, "[10.1.0.0/24]");
    let pools = rig.ipam.pool_status(Some("n"));
    assert_eq!((pools[0].in_use, pools[1].in_use), (1, 1), "{pools:?}");
    assert_eq!(pools[0].capacity, 125, "capacity follows the new ranges");
    let b = rig.ipam.add(req("n", "b", "")).await.expect("add");
    assert_ne!(ips(&b), vec![ip("10.1.0.2")], "still held by a");
    rig.ipam.del(&key("n", "far")).await.expect("del");
    rig.ipam.maintain().await.expect("maintain");
    assert_eq!(rig.ipam.pool_status(Some("n")).len(), 1);
    let ipam = rig.reopen().expect("reopen");
    assert_eq!(ipam.pool_status(Some("n"))[0].in_use, 2);
}

/// No ranges (the source withdrew them, or has none yet): ADDs wait for ranges, and are served
/// as soon as they arrive, without a restart.
#[tokio::test]
async fn adds_wait_for_ranges_that_arrive_later() {
    let rig = Rig::new("[cni]\nadd_wait_ms = 60000");
    rig.ipam.add(req("n", "a", V4)).await.expect("add");
    let none = rig
        .ipam
        .set_ranges("n", Vec::new())
        .await
        .expect("set")
        .expect("changed");
    assert_eq!(none.retiring, "[10.1.0.0/24]");
    let why = rig.ipam.status("n", None).expect_err("no ranges");
    assert!(why.0.contains("no ranges yet"), "{why}");

    let ipam = rig.ipam.clone();
    let waiting = tokio::spawn(async move { ipam.add(req("n", "b", "")).await });
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    assert!(!waiting.is_finished(), "an ADD without ranges waits");
    rig.ipam
        .set_ranges("n", sets(&["10.3.0.0/24"]))
        .await
        .expect("set")
        .expect("changed");
    // Woken when the ranges land, long before its wait would run out.
    let b = tokio::time::timeout(std::time::Duration::from_secs(5), waiting)
        .await
        .expect("woken when the ranges came")
        .expect("join")
        .expect("served once ranges came");
    assert_eq!(ips(&b), vec![ip("10.3.0.2")]);
    assert_eq!(rig.ipam.status("n", None), Ok(()));

    // Without a wait, the ADD fails at once, retryably, saying why.
    let rig = Rig::new("[cni]\nadd_wait_ms = 0");
    rig.ipam.add(req("n", "a", V4)).await.expect("add");
    rig.ipam.set_ranges("n", Vec::new()).await.expect("set");
    let e = rig
        .ipam
        .add(req("n", "b", ""))
        .await
        .expect_err("no ranges");
    assert!(matches!(e, Error::Busy(_)), "{e}");
    assert!(e.to_string().contains("no ranges yet"), "{e}");
}

/// Addresses of a retiring set are handed out to nobody, a sticky pod included; reservations
/// outside the new ranges end with the change.
#[tokio::test]
async fn sticky_pods_keep_nothing_of_a_retiring_set() {
    let toml = "[defaults]\nsticky = \"statefulset\"\n[cni]\ngc_grace_secs = 0";
    let rig = Rig::new(toml);
    let pod = |name: &str| Pod {
        namespace: "ns".into(),
        name: name.into(),
        uid: format!("uid-{name}"),
    };
    let mut r0 = req("n", "c0", V4);
    r0.pod = pod("web-0");
    let mut r1 = req("n", "c1", V4);
    r1.pod = pod("web-1");
    rig.ipam.add(r0).await.expect("add");
    rig.ipam.add(r1).await.expect("add");
    rig.ipam.del(&key("n", "c1")).await.expect("del"); // web-1's address: a reservation
    assert_eq!(rig.ipam.reservations(None).len(), 1);
    let changed = rig
        .ipam
        .set_ranges("n", sets(&["10.2.0.0/24"]))
        .await
        .expect("set")
        .expect("changed");
    assert_eq!(changed.reservations_ended, 1);
    assert!(rig.ipam.reservations(None).is_empty());
    assert!(rig.store.load().expect("load").reservations.is_empty());
    // web-0 goes: its address is in the retiring set, so no reservation keeps it.
    let released = rig.ipam.del(&key("n", "c0")).await.expect("del");
    assert_eq!(released, vec![ip("10.1.0.2")]);
    assert!(rig.ipam.reservations(None).is_empty());
    rig.ipam.maintain().await.expect("maintain");
    assert_eq!(rig.ipam.pool_status(Some("n")).len(), 1);
    let mut back = req("n", "c2", "");
    back.pod = pod("web-0");
    let b = rig.ipam.add(back).await.expect("add");
    assert_eq!(ips(&b), vec![ip("10.2.0.2")]);
}

#[tokio::test]
async fn bad_ranges_and_unknown_networks_are_refused() {
    let rig = Rig::new("");
    let e = rig
        .ipam
        .set_ranges("nope", sets(&["10.2.0.0/24"]))
        .await
        .expect_err("unknown");
    assert!(matches!(e, Error::NotFound(_)), "{e}");
    rig.ipam.add(req("n", "a", V4)).await.expect("add");
    for (bad, needle) in [
        (sets(&["10.2.0.0/33"]), "10.2.0.0/33"),
        (sets(&["10.2.0.0/24", "10.2.0.128/25"]), "overlap"),
    ] {
        let e = rig.ipam.set_ranges("n", bad).await.expect_err("bad");
        assert!(matches!(e, Error::InvalidConfig(_)), "{e}");
        assert!(e.to_string().contains(needle), "{e}");
    }
    // Nothing changed.
    assert_eq!(rig.ipam.pool_status(Some("n")).len(), 1);
    assert!(stored_def(&rig, "n").retiring.is_empty());
}

/// A network of ipoold's config file takes its ranges from there; a network given ranges at
/// runtime refuses a CNI config that names others, and keeps its ranges across a restart.
#[tokio::test]
async fn runtime_ranges_are_the_networks_own() {
    let rig = Rig::new("[[network]]\nname = \"pods\"\nranges = [[{ subnet = \"10.50.0.0/24\" }]]");
    let e = rig
        .ipam
        .set_ranges("pods", sets(&["10.51.0.0/24"]))
        .await
        .expect_err("config network");
    assert!(e.to_string().contains("config file"), "{e}");

    rig.ipam.add(req("n", "a", V4)).await.expect("add");
    rig.ipam
        .set_ranges("n", sets(&["10.2.0.0/24"]))
        .await
        .expect("set");
    rig.ipam.del(&key("n", "a")).await.expect("del");
    // Even with nothing attached, the CNI config's old ranges do not take the network back.
    let e = rig
        .ipam
        .add(req("n", "b", V4))
        .await
        .expect_err("other ranges");
    assert!(matches!(e, Error::InvalidConfig(_)), "{e}");
    assert!(
        e.to_string().contains("10.1.0.0/24") && e.to_string().contains("10.2.0.0/24"),
        "{e}"
    );
    let declared = IpamSection::parse(V4)
        .expect("json")
        .expect("section")
        .network_def("n", rig.ipam.defaults())
        .expect("def");
    let why = rig
        .ipam
        .status("n", declared.as_ref())
        .expect_err("status names the conflict");
    assert!(why.0.contains("10.2.0.0/24"), "{why}");
    let ipam = rig.reopen().expect("reopen");
    let b = ipam.add(req("n", "b", "")).await.expect("add");
    assert_eq!(ips(&b), vec![ip("10.2.0.2")]);
}

/// An address released from a retiring set goes back at once: it is not idle there, in memory
/// or in the store.
#[tokio::test]
async fn a_retiring_set_keeps_no_idle_address() {
    let rig = Rig::new("");
    rig.ipam.add(req("n", "a", V4)).await.expect("add");
    rig.ipam.add(req("n", "b", V4)).await.expect("add");
    rig.ipam
        .set_ranges("n", sets(&["10.2.0.0/24"]))
        .await
        .expect("set");
    rig.ipam.del(&key("n", "a")).await.expect("del");
    let pools = rig.ipam.pool_status(Some("n"));
    assert_eq!((pools[1].in_use, pools[1].idle), (1, 0), "{pools:?}");
    let snap = rig.store.load().expect("load");
    assert!(snap.idle.is_empty(), "{:?}", snap.idle);
}

/// A network of the config file with `ranges_from`: no ranges until its source
/// gives some (ADD and STATUS say why), its tuning stays the config's, a CNI config naming
/// other ranges is refused naming both, and a restart keeps the node's ranges: also when the
/// config switched a network from fixed ranges to `ranges_from`.
#[tokio::test]
async fn a_config_network_with_ranges_from_the_node() {
    let from_node = "[cni]\nadd_wait_ms = 0\n[[network]]\nname = \"pods\"\nranges_from = \"node\"\nmax_idle = 3\n";
    let mut rig = Rig::new(
        "[[network]]\nname = \"pods\"\nranges = [[{ subnet = \"10.60.0.0/24\" }]]\nmax_idle = 3\n",
    );
    rig.ipam.add(req("pods", "a", "")).await.expect("add");
    rig.config = DaemonConfig::parse(from_node).expect("config");
    let ipam = rig.reopen().expect("reopen with ranges_from");
    let def = ipam.lock().networks["pods"].def.clone();
    assert_eq!(def.origin, Origin::Node);
    assert_eq!(
        def.range_sets,
        sets(&["10.60.0.0/24"]),
        "the stored ranges stand"
    );
    let b = ipam.add(req("pods", "b", "")).await.expect("add");
    assert_eq!(ips(&b), vec![ip("10.60.0.3")]);
    ipam.set_ranges("pods", sets(&["10.61.0.0/24"]))
        .await
        .expect("set")
        .expect("changed");
    let def = ipam.lock().networks["pods"].def.clone();
    assert_eq!((def.origin, def.tuning.max_idle), (Origin::Node, 3));
    let e = ipam
        .add(req("pods", "c", V4))
        .await
        .expect_err("a CNI config with other ranges");
    assert!(
        e.to_string().contains("10.1.0.0/24") && e.to_string().contains("10.61.0.0/24"),
        "{e}"
    );

    // A new node: nothing stored, nothing until the source speaks.
    let rig = Rig::new(from_node);
    rig.ipam
        .await_ranges("pods", "node n1 has no podCIDRs yet")
        .expect("await");
    let e = rig
        .ipam
        .add(req("pods", "a", ""))
        .await
        .expect_err("no ranges yet");
    assert!(matches!(e, Error::Busy(_)), "{e}");
    assert!(e.to_string().contains("node n1 has no podCIDRs yet"), "{e}");
    let why = rig.ipam.status("pods", None).expect_err("status");
    assert!(why.0.contains("node n1 has no podCIDRs yet"), "{why}");
    assert_eq!(
        rig.ipam.awaiting("pods").as_deref(),
        Some("network \"pods\" has no ranges yet: node n1 has no podCIDRs yet")
    );
    rig.ipam
        .set_ranges("pods", sets(&["10.62.0.0/24"]))
        .await
        .expect("set");
    assert_eq!(rig.ipam.awaiting("pods"), None);
    let ipam = rig.reopen().expect("reopen");
    let a = ipam.add(req("pods", "a", "")).await.expect("add");
    assert_eq!(ips(&a), vec![ip("10.62.0.2")]);
}
