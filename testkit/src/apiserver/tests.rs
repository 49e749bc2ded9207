use super::*;

fn pairs(q: &str) -> BTreeMap<String, String> {
    url_pairs(q)
}

#[test]
fn creates_conflict_updates_need_the_stored_version_and_deletes_their_preconditions() {
    let mut o = Objects::new(true);
    let path = "/apis/ipool.io/v1/ipblocks";
    let block = json!({"metadata": {"name": "10-0-0-0-26", "labels": {"ipool.io/node": "n1"}},
                       "spec": {"cidr": "10.0.0.0/26"}});
    let body = block.to_string();
    let made = o
        .respond("POST", path, &pairs(""), body.as_bytes(), 100, true)
        .unwrap();
    assert_eq!(made.status, 201);
    let again = o
        .respond("POST", path, &pairs(""), body.as_bytes(), 100, true)
        .unwrap();
    assert_eq!(again.status, 409);
    let item = format!("{path}/10-0-0-0-26");
    let mut stale = made.body.clone();
    stale["metadata"]["resourceVersion"] = json!("0");
    stale["spec"]["x"] = json!(1);
    let r = o
        .respond(
            "PUT",
            &item,
            &pairs(""),
            stale.to_string().as_bytes(),
            101,
            true,
        )
        .unwrap();
    assert_eq!(r.status, 409);
    // A write that changes nothing keeps the resourceVersion.
    let same = o
        .respond(
            "PUT",
            &item,
            &pairs(""),
            made.body.to_string().as_bytes(),
            102,
            true,
        )
        .unwrap();
    assert_eq!(
        same.body["metadata"]["resourceVersion"],
        made.body["metadata"]["resourceVersion"]
    );
    let pre = json!({"preconditions": {"uid": "uid-other"}}).to_string();
    let r = o
        .respond("DELETE", &item, &pairs(""), pre.as_bytes(), 103, true)
        .unwrap();
    assert_eq!(r.status, 409);
    let pre = json!({"preconditions": {"uid": made.body["metadata"]["uid"]}}).to_string();
    let r = o
        .respond("DELETE", &item, &pairs(""), pre.as_bytes(), 103, true)
        .unwrap();
    assert_eq!(r.status, 200);
    assert!(o.objects.is_empty());
    assert_eq!(o.events.len(), 2);
}

#[test]
fn names_and_label_values_follow_kubernetes_rules() {
    let mut o = Objects::new(false);
    let path = "/apis/ipool.io/v1/ippools";
    for bad in [
        json!({"metadata": {"name": "Pods"}}),
        json!({"metadata": {"name": "p", "labels": {"a": "-x"}}}),
        json!({"metadata": {"name": "p", "labels": {"a": "x".repeat(64)}}}),
    ] {
        let r = o
            .respond(
                "POST",
                path,
                &pairs(""),
                bad.to_string().as_bytes(),
                1,
                true,
            )
            .unwrap();
        assert_eq!(r.status, 422, "{bad}");
    }
    let q = pairs(&format!(
        "labelSelector=ipool.io%2Fpool%3D{}",
        "p".repeat(64)
    ));
    let r = o
        .respond("GET", "/apis/ipool.io/v1/ipblocks", &q, b"", 1, true)
        .unwrap();
    assert_eq!(r.status, 400);
}
