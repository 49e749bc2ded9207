use super::*;
use crate::cluster::pin::PinOwner;

fn holder(uid: &str, since_ms: u64) -> Holder {
    Holder {
        node: "n1".into(),
        pod: format!("ns/{uid}"),
        uid: uid.into(),
        since_ms,
        instance: None,
    }
}

fn pin(holders: Vec<Holder>) -> Pin {
    Pin {
        pool: "p".into(),
        address: "10.0.0.5".parse().unwrap(),
        owner: PinOwner::StatefulSet {
            namespace: "ns".into(),
            name: "web".into(),
            ordinal: 0,
        },
        block: "10.0.0.0/26".parse().unwrap(),
        block_id: 7,
        set_aside: false,
        holders,
    }
}

#[test]
fn only_a_hold_its_node_confirmed_is_taken_over() {
    let h = holder("uid-1", 1_000);
    let p = pin(vec![h.clone()]);
    // etcd keeps no confirmations: its late creations cannot land.
    assert_eq!(unconfirmed_by(&p, &h, None), None);
    // Confirmed: this very hold (address, pod, when taken).
    let said = vec!["10.0.0.5 uid-1 1000".to_string()];
    assert_eq!(h.key(p.address), said[0]);
    assert_eq!(unconfirmed_by(&p, &h, Some(&said)), None);
    // Not confirmed: nothing said, the same pod's other hold (a creation sent by an ADD
    // that gave up, landing late), another address.
    for said in [
        vec![],
        vec!["10.0.0.5 uid-1 999".to_string()],
        vec!["10.0.0.6 uid-1 1000".to_string()],
    ] {
        let why = unconfirmed_by(&p, &h, Some(&said)).expect("not confirmed");
        assert!(why.contains("\"n1\"") && why.contains("10.0.0.5"), "{why}");
    }
    // An address set aside needs no word.
    let mut aside = p.clone();
    aside.set_aside = true;
    assert_eq!(unconfirmed_by(&aside, &h, Some(&[])), None);
}
