use ipool_server::cluster::etcd::request::{cmp, op, txn};

use super::*;

fn claim() -> pb::TxnRequest {
    txn(
        [
            cmp::version("/ipool/v1/blocks/p/10.0.0.0-28", cmp::Equal, 0),
            cmp::mod_revision("/ipool/v1/pools/p", cmp::Equal, 7),
            cmp::with_prefix(cmp::version("/ipool/v1/pins/p/set-aside/", cmp::Equal, 0)),
            cmp::mod_revision("/ipool/v1/witness/n1", cmp::Greater, 3),
        ],
        [
            op::put("/ipool/v1/blocks/p/10.0.0.0-28", "n1", 0),
            op::put("/ipool/v1/nodes/n1/blocks/p/10.0.0.0-28", "x", 0),
            op::put("/ipool/v1/witness/n1", "w", 0),
        ],
        [op::get("/ipool/v1/blocks/p/10.0.0.0-28")],
    )
}

#[test]
fn each_comparison_of_a_write_is_named_by_what_it_guards() {
    assert_eq!(
        etcd_names(&claim()),
        [
            "put blocks+put index if blocks version =",
            "put blocks+put index if pools mod =",
            "put blocks+put index if set-aside* version =",
            "any write if witness mod >",
        ]
    );
    // A read sent as a transaction is no conditioned write.
    let read = txn(
        [cmp::mod_revision("/ipool/v1/witness/n1", cmp::Greater, 3)],
        [op::get("/ipool/v1/blocks/p/")],
        [],
    );
    assert!(etcd_names(&read).is_empty());
}

#[test]
fn the_dropped_condition_alone_is_taken_out_of_a_transaction() {
    let mut c = Conditions {
        dropped: Some("put blocks+put index if pools mod =".into()),
        ..Default::default()
    };
    let mut t = claim();
    c.apply_txn(&mut t);
    assert_eq!(t.compare.len(), 3);
    assert!(!etcd_names(&t).contains(&"put blocks+put index if pools mod =".to_string()));
    assert_eq!(c.dropped_in, 1);
    assert_eq!(
        c.met.len(),
        4,
        "what was met is recorded, the dropped one too"
    );
}

#[test]
fn on_the_apiserver_an_update_is_made_on_the_version_stored_and_a_delete_loses_its_precondition() {
    let path = "/apis/ipool.io/v1/ipblocks/b1";
    let put = |rv: &str| {
        bytes::Bytes::from(
            serde_json::json!({"metadata": {"name": "b1", "resourceVersion": rv}}).to_string(),
        )
    };
    let mut c = Conditions {
        dropped: Some("PUT ipblocks resourceVersion".into()),
        ..Default::default()
    };
    let mut body = put("5");
    c.apply_api("PUT", path, &mut body, |p| {
        (p == path).then(|| "9".to_string())
    });
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["metadata"]["resourceVersion"], "9");

    let mut c = Conditions {
        dropped: Some("DELETE leases uid".into()),
        ..Default::default()
    };
    let mut body = bytes::Bytes::from(
        serde_json::json!({"preconditions": {"uid": "u", "resourceVersion": "4"}}).to_string(),
    );
    c.apply_api(
        "DELETE",
        "/apis/coordination.k8s.io/v1/namespaces/ipool/leases/n1",
        &mut body,
        |_| None,
    );
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert!(v["preconditions"]["uid"].is_null());
    assert_eq!(v["preconditions"]["resourceVersion"], "4");
    assert!(c.met.contains("DELETE leases resourceVersion"));
    // Another condition is left as written.
    let mut other = put("5");
    c.apply_api("PUT", path, &mut other, |_| Some("9".into()));
    let v: Value = serde_json::from_slice(&other).unwrap();
    assert_eq!(v["metadata"]["resourceVersion"], "5");
}
