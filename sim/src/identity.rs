//! Who sends each request on the Kubernetes API, as deploy/cluster-kubernetes makes them, and
//! the RBAC and admission policies they are held to (ipool-testkit's, read from that
//! manifest): a daemon is ServiceAccount `ipool-system/ipool` with a token
//! bound to its pod on its node (the node's name in the user's extra, as the policies that keep
//! each ipoold to its own node's blocks, Lease and pins read it), the CronJob that releases
//! departed nodes is `ipool-system/ipool-operator`, and the operator's own ipoolctl a cluster
//! admin. A request the apiserver refuses by them fails the run: the product asked for what
//! deploy/ does not let it do.

use std::sync::{Arc, OnceLock};

use ipool_testkit::access::{Access, UserInfo};

use crate::net::command_of;

/// The namespace deploy/ runs ipool in.
const NAMESPACE: &str = "ipool-system";

/// deploy/cluster-kubernetes's access rules, read once per process.
pub(crate) fn deployed() -> Arc<Access> {
    static ACCESS: OnceLock<Arc<Access>> = OnceLock::new();
    ACCESS
        .get_or_init(|| Arc::new(Access::cluster_kubernetes()))
        .clone()
}

/// Who request sender `from` is: an operator's command (`cronjob`: the CronJob's), else
/// the daemon of `node`.
pub(crate) fn user_of(from: usize, cronjob: bool, node: &str) -> UserInfo {
    match command_of(from) {
        Some(_) if cronjob => UserInfo::service_account(NAMESPACE, "ipool-operator"),
        Some(_) => UserInfo::admin(),
        None => UserInfo::pod_on_node(NAMESPACE, "ipool", &format!("ipool-{node}"), node),
    }
}

#[cfg(test)]
mod tests;
