//! The cluster's Nodes as cluster mode's release of departed nodes asks them
//! ([`NodeDirectory`]): their names from one list of their metadata (served from the
//! apiserver's cache: `resourceVersion=0`), and a read of one Node that decides whether it is
//! gone (a 404; a Node that is merely NotReady is there).

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams};

use crate::cluster::departed::NodeDirectory;

/// The Nodes of the cluster `client` reaches.
pub struct Nodes {
    api: Api<Node>,
}

impl Nodes {
    pub fn new(client: kube::Client) -> Nodes {
        Nodes {
            api: Api::all(client),
        }
    }
}

#[async_trait::async_trait]
impl NodeDirectory for Nodes {
    async fn names(&self) -> Result<BTreeSet<String>, String> {
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

    async fn exists(&self, name: &str) -> Result<bool, String> {
        match self.api.get_opt(name).await {
            Ok(n) => Ok(n.is_some()),
            Err(e) => Err(e.to_string()),
        }
    }
}
