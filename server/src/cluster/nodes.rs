//! Nodes in etcd: the heartbeat a running daemon keeps, and giving back the blocks of a node
//! that is gone (`ipoolctl cluster release-node`). Keys, under the prefix:
//!
//! - `nodes/<node>/alive`: on a lease the daemon keeps alive (gone within the lease's TTL
//!   of the daemon stopping or losing etcd);
//! - `nodes/<node>/seen`: when the daemon last said it ran (Unix ms), rewritten every minute;
//!   kept when the daemon goes, so that release-node knows how long it has been away.

use serde::{Deserialize, Serialize};

use super::etcd::request;
use super::etcd::{now_ms, Block, ClusterError, ClusterStore};

/// What a daemon writes in its `alive` and `seen` keys.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Seen {
    pub at_ms: u64,
}

/// A running heartbeat.
pub struct Heartbeat {
    store: ClusterStore,
    seen_key: String,
    lease: i64,
}

/// What etcd says about a node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeState {
    /// Its daemon's lease is alive.
    pub alive: bool,
    /// When its daemon last said it ran (Unix ms).
    pub seen_ms: Option<u64>,
    pub blocks: Vec<Block>,
}

fn seen_value() -> Vec<u8> {
    serde_json::to_vec(&Seen { at_ms: now_ms() }).expect("serializes")
}

impl ClusterStore {
    fn node_key(&self, node: &str, what: &str) -> String {
        self.key(&format!("nodes/{node}/{what}"))
    }

    /// Grants a lease of `ttl_secs`, puts `alive` on it and `seen`.
    pub async fn start_heartbeat(
        &self,
        node: &str,
        ttl_secs: u64,
    ) -> Result<Heartbeat, ClusterError> {
        let granted = self.client().lease_grant(ttl_secs as i64).await?;
        let alive = self.node_key(node, "alive");
        self.client()
            .put(request::put(alive, seen_value(), granted.id))
            .await?;
        let seen_key = self.node_key(node, "seen");
        self.client()
            .put(request::put(seen_key.clone(), seen_value(), 0))
            .await?;
        Ok(Heartbeat {
            store: self.clone(),
            seen_key,
            lease: granted.id,
        })
    }

    /// The node's lease, last `seen`, and blocks.
    pub async fn node_state(&self, node: &str) -> Result<NodeState, ClusterError> {
        let alive = self
            .client()
            .range(request::get(self.node_key(node, "alive")))
            .await?;
        let seen = self
            .client()
            .range(request::get(self.node_key(node, "seen")))
            .await?;
        let seen_ms = seen
            .kvs
            .first()
            .and_then(|kv| serde_json::from_slice::<Seen>(&kv.value).ok())
            .map(|s| s.at_ms);
        Ok(NodeState {
            alive: !alive.kvs.is_empty(),
            seen_ms,
            blocks: self.list_blocks(None, Some(node)).await?,
        })
    }

    /// Gives back every block in `blocks` (each conditioned on its create revision) and drops
    /// the node's `seen` key. Returns the blocks given back (one another node re-created
    /// meanwhile is left alone).
    pub async fn release_node(
        &self,
        node: &str,
        blocks: &[Block],
    ) -> Result<Vec<Block>, ClusterError> {
        let mut released = Vec::new();
        for b in blocks {
            if self.give_back(b).await? {
                released.push(b.clone());
            }
        }
        self.client()
            .delete_range(request::delete(self.node_key(node, "seen")))
            .await?;
        Ok(released)
    }
}

impl Heartbeat {
    /// Renews the lease (and rewrites `seen` when `seen`); an error once the lease is gone.
    pub async fn renew(&mut self, seen: bool) -> Result<(), ClusterError> {
        let answer = self.store.client().lease_keep_alive(self.lease).await?;
        if answer.ttl <= 0 {
            return Err(ClusterError::Refused(
                "the heartbeat's lease expired".into(),
            ));
        }
        if seen {
            self.store
                .client()
                .put(request::put(self.seen_key.clone(), seen_value(), 0))
                .await?;
        }
        Ok(())
    }
}
