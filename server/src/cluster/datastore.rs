//! The seam between cluster mode and the store that holds its pools, its blocks' owners and its
//! nodes' names: everything [`ClusterNode`](super::node::ClusterNode), the sources' work and
//! `ipoolctl cluster` ask of it, as one trait, and the two stores that implement it: etcd
//! ([`ClusterStore`]) and the Kubernetes API ([`KubeStore`]).
//!
//! What a store must guarantee, whatever the interleaving (the rules of README "Cluster
//! mode"): a claim wins only a block no one owns, and only while the pool is as it was read;
//! a give-back deletes only the write of the block it names (created and last written at its
//! [`KeyRevision`]), and a settle makes every give-back sent before it fail; a pool is deleted
//! only while no block of it is owned; a node's name is held by one daemon at a time, on a
//! lease that lapses when the daemon stops renewing it; how long a node has been away is
//! measured by the store, not by anyone's wall clock.

use std::sync::Arc;
use std::time::Duration;

use ipnet::IpNet;

use super::claim::Views;
use super::etcd::client::Limiter;
use super::etcd::Tls;
use super::etcd::{
    Block, ClaimOutcome, Claimed, ClusterError, ClusterStore, Listing, Pool, PoolSpec, Pools,
    Settled,
};
use super::kube::KubeStore;
use super::nodes::{Acquired, Alive, Heartbeat, NodeState};
use crate::config::cluster::{ClusterSettings, DatastoreKind};

/// A store shared by the calls of one node (or of one `ipoolctl` run).
pub type Store = Arc<dyn Datastore>;

/// The store `settings` name, its requests through `limiter`; each bounded by
/// `etcd_timeout_ms`.
pub async fn connect(
    settings: &ClusterSettings,
    tls: Option<&Tls>,
    limiter: &Arc<Limiter>,
) -> Result<Store, ClusterError> {
    let timeout = Duration::from_millis(settings.etcd_timeout_ms);
    Ok(match settings.datastore {
        DatastoreKind::Etcd => Arc::new(
            ClusterStore::connect_limited(
                &settings.etcd_endpoints,
                &settings.prefix,
                timeout,
                tls,
                Some(limiter.clone()),
            )
            .await?,
        ),
        DatastoreKind::Kubernetes => {
            // No answer within the timeout fails the call, as etcd's.
            let client = crate::k8s::client(settings.kubeconfig.as_deref(), timeout)
                .await
                .map_err(|e| ClusterError::Refused(format!("{e:#}")))?;
            Arc::new(
                KubeStore::connect(
                    client,
                    &settings.lease_namespace,
                    Some(limiter.clone()),
                    super::kube::FIELD_MANAGER,
                )
                .await?,
            )
        }
    })
}

#[async_trait::async_trait]
pub trait Datastore: Send + Sync {
    /// The same store, whose requests never wait for its rate limit (the heartbeat's).
    fn urgent(&self) -> Store;
    /// How many times the store was found reset (restored from an older backup, made anew),
    /// and why the last time.
    fn resets(&self) -> (u64, Option<String>);

    /// Creates a pool; refused when one of that name exists or its CIDRs overlap another's.
    async fn create_pool(&self, spec: &PoolSpec) -> Result<(), ClusterError>;
    /// Every pool.
    async fn pools(&self) -> Result<Pools, ClusterError>;
    /// A pool, with the revision a claim from it is conditioned on, and its phase.
    async fn get_pool(&self, name: &str) -> Result<Option<Pool>, ClusterError>;
    /// Deletes a pool; refused while a block of it is owned.
    async fn delete_pool(&self, name: &str) -> Result<(), ClusterError>;

    /// Owned blocks, of one pool and/or one node.
    async fn list_blocks(
        &self,
        pool: Option<&str>,
        node: Option<&str>,
    ) -> Result<Listing, ClusterError>;
    /// Claims a free block of `pool` (of one family) for `node`, conditioned on the pool as
    /// read at `pool_revision`.
    async fn claim_next(
        &self,
        pool: &PoolSpec,
        pool_revision: i64,
        v4: bool,
        node: &str,
    ) -> Result<ClaimOutcome, ClusterError> {
        super::claim::claim_next(self, self.views(), pool, pool_revision, v4, node).await
    }
    /// Each claiming node's view of each pool's blocks, kept between claims.
    fn views(&self) -> &Views;
    /// Claims one block of `pool` for `node` (a claim-back), conditioned the same way.
    async fn claim(
        &self,
        pool: &str,
        pool_revision: i64,
        block: &IpNet,
        node: &str,
    ) -> Result<Claimed, ClusterError>;
    /// Gives `b` back, only if it is still the write `b.revision` names. False: it was not.
    async fn give_back(&self, b: &Block) -> Result<bool, ClusterError>;
    /// Writes `b` again, conditioned on the write listed, so that no give-back sent before can
    /// apply; and says whether its pool stands (see [`Settled`]).
    async fn settle(&self, b: &Block) -> Result<Settled, ClusterError>;
    /// Makes `node`'s listing of its own blocks complete (once, at start); how many blocks it
    /// had to find.
    async fn ensure_index(&self, node: &str) -> Result<usize, ClusterError>;

    /// Takes `node`'s name for the daemon `me` names, unless another daemon holds it.
    async fn start_heartbeat(
        &self,
        node: &str,
        me: &Alive,
        ttl_secs: u64,
        renew_secs: u64,
    ) -> Result<Acquired, ClusterError>;
    /// Renews a held name; an error once it is no longer held.
    async fn renew_heartbeat(&self, beat: &Heartbeat) -> Result<(), ClusterError>;
    /// Gives a held name up at once (a clean stop).
    async fn stop_heartbeat(&self, beat: &Heartbeat) -> Result<(), ClusterError>;
    /// What the store says of a node: its daemon, how long it has been away, its blocks.
    async fn node_state(&self, node: &str) -> Result<NodeState, ClusterError>;
    /// Every block of `node`.
    async fn blocks_of_node(&self, node: &str) -> Result<Listing, ClusterError>;
    /// Gives back `blocks` of a node that is gone (unless `force`: only while its name is not
    /// held); the blocks given back.
    async fn release_node(
        &self,
        node: &str,
        blocks: &[Block],
        force: bool,
    ) -> Result<Vec<Block>, ClusterError>;
}

#[async_trait::async_trait]
impl Datastore for ClusterStore {
    fn urgent(&self) -> Store {
        Arc::new(ClusterStore::urgent(self))
    }
    fn resets(&self) -> (u64, Option<String>) {
        ClusterStore::resets(self)
    }
    async fn create_pool(&self, spec: &PoolSpec) -> Result<(), ClusterError> {
        ClusterStore::create_pool(self, spec).await
    }
    async fn pools(&self) -> Result<Pools, ClusterError> {
        ClusterStore::pools(self).await
    }
    async fn get_pool(&self, name: &str) -> Result<Option<Pool>, ClusterError> {
        ClusterStore::get_pool(self, name).await
    }
    async fn delete_pool(&self, name: &str) -> Result<(), ClusterError> {
        ClusterStore::delete_pool(self, name).await
    }
    async fn list_blocks(
        &self,
        pool: Option<&str>,
        node: Option<&str>,
    ) -> Result<Listing, ClusterError> {
        ClusterStore::list_blocks(self, pool, node).await
    }
    fn views(&self) -> &Views {
        ClusterStore::views(self)
    }
    async fn claim(
        &self,
        pool: &str,
        pool_revision: i64,
        block: &IpNet,
        node: &str,
    ) -> Result<Claimed, ClusterError> {
        ClusterStore::claim(self, pool, pool_revision, block, node).await
    }
    async fn give_back(&self, b: &Block) -> Result<bool, ClusterError> {
        ClusterStore::give_back(self, b, None).await
    }
    async fn settle(&self, b: &Block) -> Result<Settled, ClusterError> {
        ClusterStore::settle(self, b).await
    }
    async fn ensure_index(&self, node: &str) -> Result<usize, ClusterError> {
        ClusterStore::ensure_index(self, node).await
    }
    async fn start_heartbeat(
        &self,
        node: &str,
        me: &Alive,
        ttl_secs: u64,
        renew_secs: u64,
    ) -> Result<Acquired, ClusterError> {
        ClusterStore::start_heartbeat(self, node, me, ttl_secs, renew_secs).await
    }
    async fn renew_heartbeat(&self, beat: &Heartbeat) -> Result<(), ClusterError> {
        ClusterStore::renew_heartbeat(self, beat).await
    }
    async fn stop_heartbeat(&self, beat: &Heartbeat) -> Result<(), ClusterError> {
        ClusterStore::stop_heartbeat(self, beat).await
    }
    async fn node_state(&self, node: &str) -> Result<NodeState, ClusterError> {
        ClusterStore::node_state(self, node).await
    }
    async fn blocks_of_node(&self, node: &str) -> Result<Listing, ClusterError> {
        ClusterStore::blocks_of_node(self, node).await
    }
    async fn release_node(
        &self,
        node: &str,
        blocks: &[Block],
        force: bool,
    ) -> Result<Vec<Block>, ClusterError> {
        ClusterStore::release_node(self, node, blocks, force).await
    }
}
