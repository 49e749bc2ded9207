//! [`KubeStore`] as a [`Datastore`].

use std::sync::Arc;

use ipnet::IpNet;

use super::KubeStore;
use crate::cluster::claim::Views;
use crate::cluster::datastore::{Datastore, Store};
use crate::cluster::etcd::{Block, Claimed, ClusterError, Listing, Pool, PoolSpec, Pools, Settled};
use crate::cluster::nodes::{Acquired, Alive, Heartbeat, NodeState};

#[async_trait::async_trait]
impl Datastore for KubeStore {
    fn urgent(&self) -> Store {
        Arc::new(KubeStore::urgent(self))
    }
    /// A reset apiserver (etcd restored under it) is not detected: see README "Cluster mode".
    fn resets(&self) -> (u64, Option<String>) {
        (0, None)
    }
    fn views(&self) -> &Views {
        KubeStore::views(self)
    }
    async fn create_pool(&self, spec: &PoolSpec) -> Result<(), ClusterError> {
        KubeStore::create_pool(self, spec).await
    }
    async fn pools(&self) -> Result<Pools, ClusterError> {
        KubeStore::pools(self).await
    }
    async fn get_pool(&self, name: &str) -> Result<Option<Pool>, ClusterError> {
        KubeStore::get_pool(self, name).await
    }
    async fn delete_pool(&self, name: &str) -> Result<(), ClusterError> {
        KubeStore::delete_pool(self, name).await
    }
    async fn list_blocks(
        &self,
        pool: Option<&str>,
        node: Option<&str>,
    ) -> Result<Listing, ClusterError> {
        KubeStore::list_blocks(self, pool, node).await
    }
    async fn claim(
        &self,
        pool: &str,
        pool_revision: i64,
        block: &IpNet,
        node: &str,
    ) -> Result<Claimed, ClusterError> {
        KubeStore::claim(self, pool, pool_revision, block, node).await
    }
    async fn give_back(&self, b: &Block) -> Result<bool, ClusterError> {
        KubeStore::give_back(self, b).await
    }
    async fn settle(&self, b: &Block) -> Result<Settled, ClusterError> {
        KubeStore::settle(self, b).await
    }
    /// Blocks carry their node's label from their creation: nothing to index.
    async fn ensure_index(&self, _node: &str) -> Result<usize, ClusterError> {
        Ok(0)
    }
    async fn start_heartbeat(
        &self,
        node: &str,
        me: &Alive,
        ttl_secs: u64,
        renew_secs: u64,
    ) -> Result<Acquired, ClusterError> {
        KubeStore::start_heartbeat(self, node, me, ttl_secs, renew_secs).await
    }
    async fn renew_heartbeat(&self, beat: &Heartbeat) -> Result<(), ClusterError> {
        KubeStore::renew_heartbeat(self, beat).await
    }
    async fn stop_heartbeat(&self, beat: &Heartbeat) -> Result<(), ClusterError> {
        KubeStore::stop_heartbeat(self, beat).await
    }
    async fn node_state(&self, node: &str) -> Result<NodeState, ClusterError> {
        KubeStore::node_state(self, node).await
    }
    async fn blocks_of_node(&self, node: &str) -> Result<Listing, ClusterError> {
        KubeStore::blocks_of_node(self, node).await
    }
    async fn release_node(
        &self,
        node: &str,
        blocks: &[Block],
        force: bool,
    ) -> Result<Vec<Block>, ClusterError> {
        KubeStore::release_node(self, node, blocks, force).await
    }
}

#[cfg(test)]
mod tests {
    use crate::cluster::node::ClusterNode;
    use crate::config::ClusterSettings;

    /// Malformed objects reported by a listing clear when the next listing of the same kind
    /// no longer finds them, whatever the store calls its keys (issue 36, 7: on the
    /// Kubernetes API they never cleared).
    #[test]
    fn malformed_findings_clear_when_the_next_listing_no_longer_has_them() {
        use crate::cluster::etcd::MalformedKey;
        let settings: ClusterSettings =
            toml::from_str("datastore = \"kubernetes\"").expect("settings");
        let n =
            ClusterNode::new(settings, "n1".into(), "i".into(), Default::default()).expect("node");
        let bad = MalformedKey {
            key: "ipblocks/10-0-0-0-26".into(),
            why: "spec.pool or spec.node is missing".into(),
            block: Some("10.0.0.0/26".parse().unwrap()),
        };
        n.malformed_seen("p", true, std::slice::from_ref(&bad));
        n.malformed_seen("p", false, std::slice::from_ref(&bad));
        assert_eq!(n.malformed().len(), 1);
        n.malformed_seen("q", true, &[]);
        assert_eq!(
            n.malformed().len(),
            1,
            "another pool's listing says nothing of p's"
        );
        n.malformed_seen("p", false, &[]);
        assert_eq!(
            n.malformed().len(),
            1,
            "a sync's listing says nothing of the whole pool"
        );
        n.malformed_seen("p", true, &[]);
        assert_eq!(n.malformed(), Vec::<String>::new());
    }

    #[test]
    fn a_node_name_too_long_for_a_label_is_refused_at_start_naming_the_way_out() {
        let settings: ClusterSettings =
            toml::from_str("datastore = \"kubernetes\"").expect("settings");
        let long = format!("{}.compute.internal", "n".repeat(50));
        let e = ClusterNode::new(settings.clone(), long, "i".into(), Default::default())
            .err()
            .expect("refused");
        assert!(e.contains("at most 63") && e.contains("node_name"), "{e}");
        assert!(ClusterNode::new(settings, "n1".into(), "i".into(), Default::default()).is_ok());
    }
}
