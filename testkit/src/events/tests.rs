use super::*;
use serde_json::json;

fn event() -> Value {
    json!({"metadata": {"name": "web-0.1", "namespace": "db"},
           "eventTime": "2026-11-28T10:00:00.000000Z",
           "reportingController": "ipool.io/ipoold", "reportingInstance": "ipoold-n1",
           "action": "AllocateAddress", "reason": "PoolExhausted", "type": "Warning",
           "note": "full", "regarding": {"kind": "Pod", "namespace": "db", "name": "web-0"}})
}

#[test]
fn events_follow_the_apiservers_rules() {
    assert_eq!(invalid(&event(), "db"), None);
    assert!(invalid(&event(), "other")
        .unwrap()
        .contains("regarding.namespace"));
    for (k, v) in [
        ("action", json!("")),
        ("type", json!("Bad")),
        ("reportingController", json!("ipool.io/")),
        ("note", json!("x".repeat(1025))),
        (
            "series",
            json!({"count": 1, "lastObservedTime": "2026-11-28T10:00:00.000000Z"}),
        ),
        ("series", json!({"count": 2})),
        ("deprecatedCount", json!(3)),
    ] {
        let mut e = event();
        e[k] = v;
        assert!(invalid(&e, "db").is_some(), "{k}: {}", e[k]);
    }
    let mut patched = event();
    merge_patch(
        &mut patched,
        &json!({"series": {"count": 2, "lastObservedTime": "2026-11-28T10:01:00.000000Z"}}),
    );
    assert_eq!(invalid_update(&patched, &event()), None);
    let mut counted = patched.clone();
    merge_patch(&mut counted, &json!({"deprecatedCount": 3}));
    assert!(invalid_update(&counted, &event())
        .unwrap()
        .contains("deprecatedCount"));
    let mut about_a_node = event();
    about_a_node["regarding"] = json!({"kind": "Node", "name": "n1"});
    assert!(invalid(&about_a_node, "db").is_some());
    assert_eq!(invalid(&about_a_node, "default"), None);
    merge_patch(&mut patched, &json!({"note": "changed", "series": null}));
    assert!(patched["series"].is_null());
    assert!(invalid_update(&patched, &event()).unwrap().contains("note"));
}
