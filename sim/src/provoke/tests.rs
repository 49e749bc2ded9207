use super::*;

fn keys(ks: &[&str]) -> Keys {
    Keys(
        ks.iter()
            .map(|k| (k.as_bytes().to_vec(), Vec::new()))
            .collect(),
    )
}

fn block(s: &str) -> IpNet {
    s.parse().expect("a CIDR")
}

#[test]
fn an_etcd_claims_keys_name_its_pool_and_block() {
    let on = keys(&["/ipool/v1/blocks/p/10.70.0.16-28", "/ipool/v1/pools/p"]);
    assert_eq!(
        targets(&on),
        vec![Target::Block("10.70.0.16-28".into()), Target::Pool]
    );
}

#[test]
fn a_nodes_keys_name_it_and_its_index_entries_their_blocks() {
    let on = keys(&[
        "/ipool/v1/nodes/n1/alive",
        "/ipool/v1/nodes/n1/seen",
        "/ipool/v1/nodes/n2/blocks/p/10.70.0.32-28",
        "/ipool/v1/nodes/n3/blocks/p/",
    ]);
    assert_eq!(
        targets(&on),
        vec![
            Target::Node("n1".into()),
            Target::Block("10.70.0.32-28".into()),
            Target::Node("n3".into()),
        ]
    );
}

#[test]
fn pins_and_their_marks_are_a_pins_rival() {
    for k in [
        "/ipool/v1/pins/p/10.70.0.0-28/10.70.0.5",
        "/ipool/v1/pins/p/set-aside/10.70.0.3",
        "/ipool/v1/pin-owners/statefulset/default/web/0",
        "/ipool/v1/pins-gone/p/10.70.0.5",
        "/apis/ipool.io/v1alpha1/ippins/p-10-70-0-5",
    ] {
        assert_eq!(targets(&keys(&[k])), vec![Target::Pin(k.into())], "{k}");
    }
}

#[test]
fn the_apiservers_objects_name_a_pool_a_block_and_a_nodes_lease() {
    let on = keys(&[
        "/apis/ipool.io/v1alpha1/ippools/p",
        "/apis/ipool.io/v1alpha1/ipblocks/10-70-0-16-28",
        "/apis/coordination.k8s.io/v1/namespaces/ipool-system/leases/ipool-n2",
    ]);
    assert_eq!(
        targets(&on),
        vec![
            Target::Pool,
            Target::Block("10-70-0-16-28".into()),
            Target::Node("n2".into()),
        ]
    );
}

#[test]
fn keys_of_nothing_a_rival_writes_name_nothing() {
    let on = keys(&[
        "/ipool/v1/witness/n1",
        "/ipool/v1/leaders/release-departed",
        "/apis/coordination.k8s.io/v1/namespaces/ipool-system/leases/ipool.release-departed",
        "/elsewhere/thing",
    ]);
    assert_eq!(targets(&on), Vec::new());
}

#[test]
fn a_block_is_found_by_its_key_part_or_its_object_name() {
    let blocks = [
        block("10.70.0.0/28"),
        block("10.70.0.16/28"),
        block("fd00::/124"),
    ];
    assert_eq!(
        block_named("10.70.0.16-28", &blocks),
        Some(block("10.70.0.16/28"))
    );
    assert_eq!(
        block_named("10-70-0-16-28", &blocks),
        Some(block("10.70.0.16/28"))
    );
    assert_eq!(
        block_named("fd00-0-0-0-0-0-0-0-124", &blocks),
        Some(block("fd00::/124"))
    );
    assert_eq!(block_named("10-70-0-32-28", &blocks), None);
}
