//! The store-load row of pods with fixed addresses: a network of one subnet
//! whose pods are a StatefulSet's, each moved to the next node at every churn tick (its DEL on
//! one node, its ADD on the next: the pin let go, then taken over). The daemons read the pods
//! from an apiserver of their own (`[kubernetes]`), so that the store's counts are the pins'
//! and the blocks' alone.

use std::path::Path;

use anyhow::{Context, Result};
use ipool_testkit::fake_api::FakeApi;
use serde_json::json;

use crate::plugin::{Net, Op};

/// The pods' namespace, as the plugin's CNI_ARGS name it.
const NAMESPACE: &str = "bench";

/// The pods' apiserver, with the nodes, the namespace and the StatefulSet `web` of `nodes`
/// replicas; and each node's first (plain) pod.
pub(super) fn pods_api(nodes: usize) -> FakeApi {
    let api = FakeApi::start();
    api.put("namespaces", json!({"metadata": {"name": NAMESPACE}}));
    api.put(
        "statefulsets",
        json!({"apiVersion": "apps/v1", "metadata": {"namespace": NAMESPACE, "name": "web", "uid": "s1"},
               "spec": {"replicas": nodes}}),
    );
    for i in 0..nodes {
        api.put("nodes", json!({"metadata": {"name": format!("n{i}")}}));
        pod(&api, &format!("first{i}"), &format!("first{i}"), i, false);
    }
    api
}

/// The daemon's config of a node with fixed-address pods: `config` (one network of cluster
/// pools) addressed as one subnet, pods read from the apiserver.
pub(super) fn config(config: String) -> String {
    format!("{config}addressing = \"subnet\"\n\n[kubernetes]\ngc_grace_secs = 86400\n")
}

/// ipoold's arguments for node `i`: the pods' apiserver, the node's name.
pub(super) fn args(api: &FakeApi, dir: &Path, i: usize) -> Result<Vec<String>> {
    let kubeconfig = api.kubeconfig(dir);
    Ok(vec![
        "--kubeconfig".into(),
        kubeconfig
            .to_str()
            .context("a kubeconfig path in UTF-8")?
            .to_string(),
        "--node-name".into(),
        format!("n{i}"),
    ])
}

/// Pod `name` (uid `uid`) bound to node `node`; `fixed`: a StatefulSet's, its address fixed.
fn pod(api: &FakeApi, name: &str, uid: &str, node: usize, fixed: bool) {
    let mut meta = json!({"namespace": NAMESPACE, "name": name, "uid": uid});
    if fixed {
        meta["annotations"] = json!({"ipool.io/fixed": "true"});
        meta["ownerReferences"] = json!([{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "web", "uid": "s1", "controller": true}]);
    }
    api.put(
        "pods",
        json!({"metadata": meta, "spec": {"nodeName": format!("n{node}"), "containers": [{"name": "c", "image": "x"}]}}),
    );
}

/// Churn tick `k`: each ordinal's pod (`web-<i>`) deleted on its node and added on the next
/// (on the first tick, added only).
pub(super) fn move_pods(api: &FakeApi, nets: &[Net], k: usize) -> Result<()> {
    let n = nets.len();
    for i in 0..n {
        let name = format!("web-{i}");
        if k > 0 {
            nets[(i + k - 1) % n].call(Op::Del, &name)?;
        }
        let to = (i + k) % n;
        pod(api, &name, &format!("u{i}-{k}"), to, true);
        nets[to]
            .call(Op::Add, &name)
            .with_context(|| format!("{name} moved to n{to}"))?;
    }
    Ok(())
}
