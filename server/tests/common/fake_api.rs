//! The fake apiserver the tests run against: `ipool_testkit::fake_api` (shared with
//! `ipool-bench`).
pub use ipool_testkit::fake_api::*;

/// Pod db/`name` (uid `uid`, and `meta`'s fields in its metadata) bound to `node`, put on
/// `api`; its CNI_ARGS.
#[allow(dead_code)]
pub fn put_pod(
    api: &FakeApi,
    node: &str,
    name: &str,
    uid: &str,
    meta: serde_json::Value,
) -> String {
    let mut m = serde_json::json!({"namespace": "db", "name": name, "uid": uid});
    for (k, v) in meta.as_object().into_iter().flatten() {
        m[k] = v.clone();
    }
    api.put(
        "pods",
        serde_json::json!({"metadata": m, "spec": {"nodeName": node, "containers": [{"name": "c", "image": "x"}]}}),
    );
    format!("K8S_POD_NAMESPACE=db;K8S_POD_NAME={name};K8S_POD_UID={uid}")
}
