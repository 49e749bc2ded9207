//! Who sends each request on the Kubernetes API, as deploy/cluster-kubernetes makes them, and
//! the RBAC and admission policies they are held to (ipool-testkit's, read from that
//! manifest; issue 54, item 1): a daemon is ServiceAccount `ipool-system/ipool` with a token
//! bound to its pod on its node (the node's name in the user's extra, as the policies that keep
//! each ipoold to its own node's blocks, Lease and pins read it), the CronJob that releases
//! departed nodes is `ipool-system/ipool-operator`, and the operator's own ipoolctl a cluster
//! admin. A request the apiserver refuses by them fails the run: the product asked for what
//! deploy/ does not let it do.

use std::sync::{Arc, OnceLock};

use ipool_testkit::access::{Access, UserInfo};

use crate::net::command_of;
use crate::world::World;

/// The namespace deploy/ runs ipool in.
const NAMESPACE: &str = "ipool-system";

/// deploy/cluster-kubernetes's access rules, read once per process.
pub(crate) fn deployed() -> Arc<Access> {
    static ACCESS: OnceLock<Arc<Access>> = OnceLock::new();
    ACCESS
        .get_or_init(|| Arc::new(Access::cluster_kubernetes()))
        .clone()
}

impl World {
    /// Who request sender `from` is.
    pub(crate) fn user_of(&self, from: usize) -> UserInfo {
        match command_of(from) {
            Some(op) if self.cronjob_ops.contains(&op) => {
                UserInfo::service_account(NAMESPACE, "ipool-operator")
            }
            Some(_) => UserInfo::admin(),
            None => {
                let node = self.slots.get(from).map_or("?", |s| s.name.as_str());
                UserInfo::pod_on_node(NAMESPACE, "ipool", &format!("ipool-{node}"), node)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use ipool_testkit::access::Attributes;

    use super::*;

    #[test]
    fn a_daemon_may_not_delete_another_nodes_block_and_the_cronjob_may() {
        let access = deployed();
        let q = Default::default();
        let a = Attributes::of("DELETE", "/apis/ipool.io/v1/ipblocks/10-70-0-0-28", &q)
            .expect("a resource");
        let block = serde_json::json!({
            "apiVersion": "ipool.io/v1", "kind": "IPBlock",
            "metadata": {"name": "10-70-0-0-28", "labels": {"ipool.io/node": "n1"}},
            "spec": {"node": "n1", "pool": "p", "cidr": "10.70.0.0/28"},
        });
        let n0 = UserInfo::pod_on_node(NAMESPACE, "ipool", "ipool-n0", "n0");
        access
            .authorize(&n0, &a)
            .expect("RBAC lets ipoold delete blocks");
        let e = access.admit(&n0, &a, None, Some(&block)).unwrap_err();
        assert_eq!(e.status, 422, "{:?}", e.body);
        let n1 = UserInfo::pod_on_node(NAMESPACE, "ipool", "ipool-n1", "n1");
        access.admit(&n1, &a, None, Some(&block)).expect("its own");
        let cron = UserInfo::service_account(NAMESPACE, "ipool-operator");
        access.authorize(&cron, &a).expect("the CronJob releases");
        access
            .admit(&cron, &a, None, Some(&block))
            .expect("any node's");
    }
}
