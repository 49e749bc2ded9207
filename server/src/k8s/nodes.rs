//! The cluster's Nodes and pins' owners as cluster mode's release of departed nodes asks them
//! ([`Directory`]): the Nodes' names from one list of their metadata (served from the
//! apiserver's cache: `resourceVersion=0`), a read of one Node that decides whether it is
//! gone (a 404; a Node that is merely NotReady is there), and whether a pin's owner is gone
//! (as the pin keeper asks it).

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams};

use crate::cluster::departed::Directory;
use crate::cluster::pin::PinOwner;
use crate::cluster::vocab::LookupFailed;

/// The Nodes of the cluster `client` reaches.
pub struct Nodes {
    api: Api<Node>,
    client: kube::Client,
}

impl Nodes {
    pub fn new(client: kube::Client) -> Nodes {
        Nodes {
            api: Api::all(client.clone()),
            client,
        }
    }
}

#[async_trait::async_trait]
impl Directory for Nodes {
    async fn names(&self) -> Result<BTreeSet<String>, LookupFailed> {
        let listed = self
            .api
            .list_metadata(&ListParams::default().match_any())
            .await
            .map_err(|e| e.to_string())?;
        Ok(listed
            .items
            .into_iter()
            .filter_map(|n| n.metadata.name)
            .collect())
    }

    async fn exists(&self, name: &str) -> Result<bool, LookupFailed> {
        match self.api.get_opt(name).await {
            Ok(n) => Ok(n.is_some()),
            Err(e) => Err(LookupFailed(e.to_string())),
        }
    }

    async fn owner_gone(&self, owner: &PinOwner) -> Result<Option<String>, LookupFailed> {
        super::pin_keeper::owner_gone(&self.client, owner).await
    }
}

/// Every pod bound to a node, not finished and not on the host's network, with its
/// `status.podIPs` (listed in pages of 500): what `ipoolctl cluster check` sets against the
/// blocks.
pub async fn pod_ips(
    client: kube::Client,
) -> Result<Vec<crate::cluster::check::PodIps>, kube::Error> {
    use k8s_openapi::api::core::v1::Pod;
    let api: Api<Pod> = Api::all(client);
    let mut found = Vec::new();
    let mut token: Option<String> = None;
    loop {
        let mut lp = ListParams::default().limit(500);
        if let Some(t) = &token {
            lp = lp.continue_token(t);
        }
        let page = api.list(&lp).await?;
        for p in &page.items {
            let Some(node) = p.spec.as_ref().and_then(|s| s.node_name.clone()) else {
                continue;
            };
            let ips = super::meta::pod_ips(p);
            if ips.is_empty() {
                continue;
            }
            let ns = p.metadata.namespace.clone().unwrap_or_default();
            let vm = p
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get("vm.kubevirt.io/name"))
                .map(|vm| format!("{ns}/{vm}"));
            found.push(crate::cluster::check::PodIps {
                pod: format!("{ns}/{}", p.metadata.name.clone().unwrap_or_default()),
                node,
                ips,
                vm,
            });
        }
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(t) => token = Some(t),
            None => return Ok(found),
        }
    }
}
