//! The pods as the apiserver has them beyond what the kubelet asked (`crate::pod_gc`): the
//! names of fixed addresses' pods, the pods force-deleted or left Failed, and each daemon's
//! watch cache.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;

/// What the world holds of the pods beyond what the kubelet asked: the apiserver's side.
#[derive(Default)]
pub(crate) struct PodGc {
    /// The pod name of each container of a pod with a fixed address (its controller's name
    /// for it); any other pod is named as its container.
    pub names: BTreeMap<String, String>,
    /// Pods force-deleted from the apiserver whose sandboxes still run.
    pub force_deleted: BTreeSet<String>,
    /// Pods whose sandbox is gone without a DEL, left in the apiserver as Failed: container
    /// -> (pod name, node).
    pub failed: BTreeMap<String, (String, String)>,
    /// Each daemon's watch cache of its node's pods (by the daemon's id: a daemon started
    /// again lists them afresh), as it last caught up.
    pub caches: BTreeMap<u64, BTreeMap<String, Arc<Pod>>>,
    /// How many times KubeVirt made each VM's instance again under its name (by the VM's
    /// owner key; none: its first).
    pub vmis: BTreeMap<String, u32>,
}

impl PodGc {
    /// Records the pod name of `container`, a pod of a fixed address's owner.
    pub(crate) fn name(&mut self, container: &str, name: &str) {
        self.names.insert(container.to_string(), name.to_string());
    }

    /// The instance (VMI uid) of `owner`'s pods made now, if it is a VM.
    pub(crate) fn instance(&self, owner: &ipool_server::cluster::pin::PinOwner) -> Option<String> {
        let again = self.vmis.get(&owner.to_string()).copied().unwrap_or(0);
        crate::owners::instance(owner, again)
    }

    /// `container`'s pod was force-deleted: it runs as far as the checker knows, but its
    /// controller may make another in its place.
    pub(crate) fn replaced(&self, container: &str) -> bool {
        self.force_deleted.contains(container)
    }
}
