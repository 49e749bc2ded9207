use ipool_server::cluster::etcd::request::{cmp, op, txn};

use super::*;

fn wire(t: pb::TxnRequest) -> Call {
    Call::Txn(t)
}

/// An apiserver request: (method, path, body).
fn api(method: &str, path: &str, body: serde_json::Value) -> (String, String, Vec<u8>) {
    (method.into(), path.into(), body.to_string().into_bytes())
}

fn conditioned_on(c: &Call) -> Keys {
    match c {
        Call::Txn(t) => txn_conditioned_on(t),
        _ => Keys::default(),
    }
}

fn written_by(c: &Call) -> Keys {
    call_writes(c)
}

fn api_on(r: &(String, String, Vec<u8>)) -> Keys {
    api_conditioned_on(&r.0, &r.1, &r.2)
}

fn api_written(r: &(String, String, Vec<u8>)) -> Keys {
    api_writes(&r.0, &r.1, &r.2)
}

#[test]
fn a_claim_is_conditioned_on_its_block_and_pool_and_a_pool_change_is_a_rival() {
    let claim = wire(txn(
        [
            cmp::version("/ipool/v1/blocks/p/a", cmp::Equal, 0),
            cmp::mod_revision("/ipool/v1/pools/p", cmp::Equal, 7),
            cmp::with_prefix(cmp::version("/ipool/v1/pins/p/set-aside/", cmp::Equal, 0)),
            cmp::mod_revision("/ipool/v1/witness/n1", cmp::Greater, 3),
        ],
        [
            op::put("/ipool/v1/blocks/p/a", "n1", 0),
            op::put("/ipool/v1/witness/n1", "w", 0),
        ],
        [],
    ));
    let on = conditioned_on(&claim);
    assert_eq!(on.0.len(), 3, "the witness aside");
    let pool_change = wire(txn([], [op::put("/ipool/v1/pools/p", "spec", 0)], []));
    assert!(on.meets(&written_by(&pool_change)));
    let pinned = wire(txn(
        [],
        [op::put("/ipool/v1/pins/p/set-aside/10.0.0.9", "x", 0)],
        [],
    ));
    assert!(
        on.meets(&written_by(&pinned)),
        "a key under a compared prefix"
    );
    let other = wire(txn([], [op::put("/ipool/v1/blocks/p/b", "n2", 0)], []));
    assert!(!on.meets(&written_by(&other)));
    // Another node's write of its witness is no rival.
    let witness = wire(txn([], [op::put("/ipool/v1/witness/n1", "w", 0)], []));
    assert!(!on.meets(&written_by(&witness)));
    // A read sent as a transaction is no conditioned write.
    let read = wire(txn(
        [cmp::mod_revision("/ipool/v1/witness/n1", cmp::Greater, 3)],
        [op::get("/ipool/v1/blocks/p/")],
        [],
    ));
    assert!(conditioned_on(&read).is_empty());
}

#[test]
fn a_range_deleted_meets_a_key_compared_inside_it() {
    let on = conditioned_on(&wire(txn(
        [cmp::mod_revision("/ipool/v1/nodes/n1/alive", cmp::Equal, 4)],
        [op::delete("/ipool/v1/blocks/p/a")],
        [],
    )));
    let range = Call::DeleteRange(pb::DeleteRangeRequest {
        key: b"/ipool/v1/nodes/n1/".to_vec(),
        range_end: b"/ipool/v1/nodes/n10".to_vec(),
        ..Default::default()
    });
    assert!(on.meets(&written_by(&range)));
}

#[test]
fn on_the_apiserver_an_update_is_conditioned_on_its_object_and_a_create_of_it_is_a_rival() {
    let path = "/apis/coordination.k8s.io/v1/namespaces/ipool/leases/n1";
    let update = api(
        "PUT",
        path,
        serde_json::json!({"metadata": {"name": "n1", "resourceVersion": "4"}}),
    );
    let on = api_on(&update);
    assert_eq!(on.0, vec![(path.as_bytes().to_vec(), Vec::new())]);
    let create = api(
        "POST",
        "/apis/coordination.k8s.io/v1/namespaces/ipool/leases",
        serde_json::json!({"metadata": {"name": "n1"}}),
    );
    assert!(on.meets(&api_written(&create)));
    let delete = api("DELETE", path, serde_json::json!({}));
    assert!(on.meets(&api_written(&delete)));
    // A create is no conditioned write of its own (its condition is the store's, not the
    // caller's), and a read writes nothing.
    assert!(api_on(&create).is_empty());
    assert!(api_written(&api("GET", path, serde_json::json!({}))).is_empty());
}
