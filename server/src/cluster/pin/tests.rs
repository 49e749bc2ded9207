use super::*;

fn holder(node: &str, uid: &str) -> Holder {
    Holder {
        node: node.into(),
        pod: format!("ns/{uid}"),
        uid: uid.into(),
        since_ms: 1,
        instance: Some("vmi-1".into()),
    }
}

fn pin(owner: PinOwner, holders: Vec<Holder>) -> Pin {
    Pin {
        pool: "p".into(),
        address: "10.0.0.5".parse().unwrap(),
        owner,
        block: "10.0.0.0/26".parse().unwrap(),
        block_id: 7,
        set_aside: false,
        holders,
    }
}

fn sts(ordinal: u32) -> PinOwner {
    PinOwner::StatefulSet {
        namespace: "ns".into(),
        name: "web".into(),
        ordinal,
    }
}

fn vm() -> PinOwner {
    PinOwner::VirtualMachine {
        namespace: "ns".into(),
        name: "vm1".into(),
    }
}

#[test]
fn a_statefulset_pods_owner_is_its_ordinal() {
    let of = |pod| PinOwner::of_statefulset_pod("ns", "web", pod);
    assert_eq!(of("web-0"), Some(sts(0)));
    assert_eq!(of("web-12"), Some(sts(12)));
    for not in [
        "web", "web-", "web-a", "web-01", "webx-1", "other-1", "web--1",
    ] {
        assert_eq!(of(not), None, "{not}");
    }
    // A StatefulSet whose name ends in a number: only the last part is the ordinal.
    assert_eq!(
        PinOwner::of_statefulset_pod("ns", "db-2", "db-2-3"),
        Some(PinOwner::StatefulSet {
            namespace: "ns".into(),
            name: "db-2".into(),
            ordinal: 3
        })
    );
}

#[test]
fn owners_round_trip_through_their_keys_and_bad_keys_are_named() {
    for o in [sts(3), vm()] {
        assert_eq!(PinOwner::parse(&o.to_string()).unwrap(), o);
        let json = serde_json::to_string(&o).unwrap();
        assert_eq!(serde_json::from_str::<PinOwner>(&json).unwrap(), o);
    }
    assert_eq!(sts(3).to_string(), "StatefulSet/ns/web/3");
    assert_eq!(vm().to_string(), "VirtualMachine/ns/vm1");
    for bad in [
        "",
        "StatefulSet/ns/web",
        "StatefulSet/ns/web/x",
        "StatefulSet//web/1",
        "VirtualMachine/ns",
        "VirtualMachine/ns/vm/1",
        "Deployment/ns/d",
    ] {
        let e = PinOwner::parse(bad).unwrap_err();
        assert!(e.to_string().contains(&format!("{bad:?}")), "{e}");
    }
}

#[test]
fn a_pin_is_taken_only_when_free_and_a_vm_may_have_two_holders() {
    // Free: anyone takes it.
    assert_eq!(
        verdict(&pin(sts(0), vec![]), "n2", "u2", None),
        Verdict::Free
    );
    // Its own holder, again.
    assert_eq!(
        verdict(&pin(sts(0), vec![holder("n1", "u1")]), "n1", "u1", None),
        Verdict::Held
    );
    // A StatefulSet's: another pod, here or elsewhere, waits.
    for (node, uid) in [("n2", "u2"), ("n1", "u2")] {
        assert_eq!(
            verdict(&pin(sts(0), vec![holder("n1", "u1")]), node, uid, None),
            Verdict::HeldBy(vec![holder("n1", "u1")])
        );
    }
    // A VM's second launcher pod on another node, of the same instance: a migration (if
    // KubeVirt shows one).
    let vmi = Some("vmi-1");
    assert_eq!(
        verdict(&pin(vm(), vec![holder("n1", "u1")]), "n2", "u2", vmi),
        Verdict::Migration
    );
    // ... but not on the same node, nor a third.
    assert!(matches!(
        verdict(&pin(vm(), vec![holder("n1", "u1")]), "n1", "u2", vmi),
        Verdict::HeldBy(_)
    ));
    let two = pin(vm(), vec![holder("n1", "u1"), holder("n2", "u2")]);
    assert_eq!(verdict(&two, "n2", "u2", vmi), Verdict::Held);
    assert!(matches!(verdict(&two, "n3", "u3", vmi), Verdict::HeldBy(h) if h.len() == 2));
    assert_eq!(two.holders_shown(), "n1 (ns/u1), n2 (ns/u2)");
    assert_eq!(pin(vm(), vec![]).holders_shown(), "nobody");
}

/// A VM's instance made again under its name (a force-deleted launcher on a cut-off node,
/// remediation) is another instance: its launcher waits for the old holder's DEL or fence, as
/// a StatefulSet's pod does (it shared the address at once); so does one
/// whose instance is not known.
#[test]
fn a_vm_instance_made_again_does_not_share_its_pin() {
    let held = pin(vm(), vec![holder("n1", "u1")]);
    for other in [Some("vmi-2"), None] {
        assert_eq!(
            verdict(&held, "n2", "u2", other),
            Verdict::HeldBy(vec![holder("n1", "u1")]),
            "{other:?}"
        );
    }
    let mut unknown = holder("n1", "u1");
    unknown.instance = None;
    assert!(matches!(
        verdict(&pin(vm(), vec![unknown]), "n2", "u2", Some("vmi-1")),
        Verdict::HeldBy(_)
    ));
}

#[test]
fn a_pin_counts_only_in_the_block_it_was_made_in() {
    let p = pin(sts(0), vec![]);
    let rev = |create| KeyRevision {
        create,
        modified: 9,
        write: None,
    };
    assert!(p.made_in(&"10.0.0.0/26".parse().unwrap(), &rev(7)));
    assert!(!p.made_in(&"10.0.0.0/26".parse().unwrap(), &rev(8)));
    assert!(!p.made_in(&"10.0.0.64/26".parse().unwrap(), &rev(7)));
}

#[test]
fn pins_are_json_with_the_crds_field_names() {
    let p = pin(vm(), vec![holder("n1", "u1")]);
    let v = serde_json::to_value(&p).unwrap();
    assert_eq!(v["blockId"], 7);
    assert_eq!(v["owner"], "VirtualMachine/ns/vm1");
    assert_eq!(v["holders"][0]["sinceMs"], 1);
    // Written only when set (pins written before it read as they were).
    assert!(v.get("setAside").is_none(), "{v}");
    assert_eq!(serde_json::from_value::<Pin>(v).unwrap(), p);
    let aside = Pin {
        set_aside: true,
        ..p.clone()
    };
    let v = serde_json::to_value(&aside).unwrap();
    assert_eq!(v["setAside"], true);
    assert_eq!(serde_json::from_value::<Pin>(v).unwrap(), aside);
    // Never a block's: it lies in none.
    let r = crate::cluster::vocab::KeyRevision {
        create: 7,
        modified: 7,
        write: None,
    };
    assert!(p.made_in(&p.block, &r) && !aside.made_in(&p.block, &r));
    assert!(p.check_change(&aside).is_err());
}

#[test]
fn address_names_are_valid_object_names() {
    assert_eq!(address_name(&"10.1.2.3".parse().unwrap()), "10-1-2-3");
    assert_eq!(
        address_name(&"fd00::5".parse().unwrap()),
        "fd00-0-0-0-0-0-0-5"
    );
}

/// A node that does not hold its name (never registered: the store did not answer its
/// heartbeat) writes no hold: nothing would ever show it away (no record of it, no Node name),
/// so neither the release of departed nodes nor release-node could end the hold, and the pin's
/// owner, once gone, would keep its address for good (found by the simulation's rule L3, seed
/// 2 458 of a search: a pin of an address set aside, made by a node whose heartbeat had not
/// been answered, then wiped).
#[tokio::test]
async fn a_node_that_does_not_hold_its_name_writes_no_hold() {
    let settings: crate::config::ClusterSettings =
        toml::from_str("etcd_endpoints = [\"http://127.0.0.1:1\"]\n").expect("settings");
    let node = crate::cluster::node::ClusterNode::new(
        settings,
        "n1".into(),
        "inst-1".into(),
        std::sync::Arc::default(),
    )
    .expect("node");
    let holds = crate::cluster::pin::hold::Holds::new(node.clone());
    let site = crate::cluster::pin::hold::PinSite {
        pool: "p".into(),
        address: "10.0.0.122".parse().expect("address"),
        block: "10.0.0.120/29".parse().expect("CIDR"),
        block_id: 2,
        set_aside: true,
    };
    let pod = crate::cluster::pin::hold::Pod {
        name: "sim/db-1",
        uid: "uid-1",
        instance: None,
        migration: None,
    };
    let e = holds
        .pin(&sts(1), &site, &pod)
        .await
        .expect_err("not serving");
    assert!(e.to_string().contains("node name \"n1\""), "{e}");
    assert!(node.pins_held_here().is_empty(), "no hold known as written");
}
