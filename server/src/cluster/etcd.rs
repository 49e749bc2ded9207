//! Cluster pools and their blocks in etcd. Keys, under a prefix (default `/ipool/v1`):
//!
//! - `<prefix>/pools/<name>`: a pool ([`PoolSpec`], JSON);
//! - `<prefix>/blocks/<pool>/<block>`: a block's owner ([`Owner`], JSON), the block written
//!   as Calico does, `10.0.0.0-26`;
//! - `<prefix>/nodes/<node>/blocks/<pool>/<block>`: the node's index of its blocks, written and
//!   deleted with them; `<prefix>/nodes/<node>/indexed`: its index is complete;
//! - `<prefix>/nodes/<node>/alive`, `.../seen`: the daemons' heartbeats ([`super::nodes`]).
//!
//! Every decision is one etcd transaction: a claim is "create the block's key if it is absent
//! and the pool is still as this node read it" (the loser learns the winner), a give-back is
//! "delete it if it is still the one this node created" (by its create revision), deleting a
//! pool is "delete it if no block key exists under it". Two nodes never own one block, a claim
//! never follows a pool spec that changed since it was read, and a pool with owned blocks is
//! never deleted, however the calls interleave. A malformed key under the prefix is reported
//! and counts as occupied; it does not fail the listing it is in.
//!
//! `pools` reads and writes pools, `blocks` lists, claims and gives back blocks, `claim` finds
//! a node's next block, `client` is etcd's API over tonic, `request` builds its requests.

use std::time::Duration;

use ipnet::IpNet;

use client::{EtcdClient, EtcdError};
use serde::{Deserialize, Serialize};

pub use super::pool::PoolSpec;
pub use blocks::Listing;
pub use pools::Pools;

/// Default key prefix.
pub use crate::config::cluster::DEFAULT_PREFIX;
/// Default block sizes, as Calico's.
pub const DEFAULT_BLOCK_V4: u8 = 26;
pub const DEFAULT_BLOCK_V6: u8 = 122;

/// Who owns a block.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Owner {
    pub node: String,
    /// Unix milliseconds.
    pub claimed_at_ms: u64,
}

/// An owned block, as listed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Block {
    pub pool: String,
    pub block: IpNet,
    pub owner: Owner,
    /// Which write of its key was read: a give-back is conditioned on it.
    pub revision: KeyRevision,
}

/// Which write of a block's key was read: the etcd revision that created the key and the one
/// that last wrote it. A give-back is conditioned on both, so that a write of the key made
/// after it was sent (a settle, [`ClusterStore::settle`]) makes it fail wherever it is: a
/// give-back whose answer never came may still be applied later (etcd received it, or will),
/// and a read cannot tell; only a write that it must come after can.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeyRevision {
    pub create: i64,
    pub modified: i64,
}

/// What a settle found ([`Datastore::settle`](super::datastore::Datastore::settle)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Settled {
    /// The owner's, written again at this revision: no give-back sent before can apply.
    Mine(KeyRevision),
    /// It changed since it was listed (a give-back applied, or it was claimed anew): not the
    /// owner's to use.
    Changed,
    /// Written again at this revision, but its pool is being deleted: in doubt until the pool
    /// is gone or Ready again (the deletion is refused if it saw the block). Neither served
    /// nor given back meanwhile.
    PoolDeleting(KeyRevision),
    /// Written again at this revision, but its pool is gone (or made anew) since the block
    /// was claimed: never served again; given back once nothing in it is in use.
    PoolGone(KeyRevision),
}

/// Where a pool is in its life. Only a Ready pool is claimed from. (etcd's pools are always
/// Ready: their creation and deletion are one transaction each.)
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PoolPhase {
    /// Created, its overlaps being checked.
    Pending,
    Ready,
    /// Its blocks being checked before it is deleted: in doubt.
    Deleting,
}

impl PoolPhase {
    pub fn as_str(self) -> &'static str {
        match self {
            PoolPhase::Pending => "Pending",
            PoolPhase::Ready => "Ready",
            PoolPhase::Deleting => "Deleting",
        }
    }
}

/// A pool as read: its spec, the revision a claim from it is conditioned on, its phase.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pool {
    pub spec: PoolSpec,
    pub revision: i64,
    pub phase: PoolPhase,
}

/// A key under the prefix that does not say what it should.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MalformedKey {
    pub key: String,
    pub why: String,
    /// The block its key names, when it names one: that block counts as occupied.
    pub block: Option<IpNet>,
}

impl std::fmt::Display for MalformedKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.key, self.why)
    }
}

/// What a claim got.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Claimed {
    Won(Block),
    /// Someone has it: the node, or what stands in the key when it names none.
    Lost(String),
    /// This node has it already (claimed before its index existed): the block, its index
    /// entry written now.
    Mine(Block),
    /// The pool was deleted.
    NoPool,
    /// The pool is being deleted: nothing was claimed (a block just created is given back; a
    /// block this node had already is left as it is).
    PoolDeleting,
    /// The pool is not as it was read (deleted and created again, maybe with other block
    /// sizes): read it again before claiming.
    PoolChanged,
}

/// An etcd failure, or a refusal.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error("etcd: {0}")]
    Etcd(#[from] EtcdError),
    /// The Kubernetes API's (`datastore = "kubernetes"`).
    #[error("the Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// What was asked for does not exist (a pool, a node).
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Refused(String),
    #[error("etcd holds a malformed {what} at {key}: {why}")]
    Malformed {
        what: &'static str,
        key: String,
        why: String,
    },
    /// A call that stopped (`error`), and what became of what it had started (`note`: put
    /// back as it was, or how to finish).
    #[error("{error}; {note}")]
    Undone {
        error: Box<ClusterError>,
        note: String,
    },
}

impl ClusterError {
    /// etcd cannot be used: it did not answer, or it refuses this client (credentials,
    /// permissions), as opposed to answering a request no.
    pub fn is_unreachable(&self) -> bool {
        match self {
            ClusterError::Etcd(e) => e.is_unreachable(),
            // No answer, or one that says the apiserver cannot serve this client now
            // (credentials, permissions, overload, its own etcd).
            ClusterError::Kube(kube::Error::Api(s)) => {
                matches!(s.code, 401 | 403 | 429 | 500..=599)
            }
            ClusterError::Kube(kube::Error::SerdeError(_)) => false,
            ClusterError::Kube(_) => true,
            ClusterError::NotFound(_)
            | ClusterError::Refused(_)
            | ClusterError::Malformed { .. } => false,
            ClusterError::Undone { error, .. } => error.is_unreachable(),
        }
    }
}

/// TLS towards etcd: the CA that signed its server certificate (ipool's image has no system
/// roots), and this node's client identity when etcd asks for one.
#[derive(Clone, Debug)]
pub struct Tls(client::TlsFiles);

impl Tls {
    /// Reads the PEM files; each error names the file.
    pub fn read(
        ca: Option<&std::path::Path>,
        cert_key: Option<(&std::path::Path, &std::path::Path)>,
    ) -> Result<Tls, String> {
        let read = |what: &str, p: &std::path::Path| {
            std::fs::read(p).map_err(|e| format!("reading {what} {}: {e}", p.display()))
        };
        Ok(Tls(client::TlsFiles {
            ca: ca.map(|p| read("the etcd CA", p)).transpose()?,
            identity: cert_key
                .map(|(c, k)| {
                    Ok::<_, String>((
                        read("the etcd client certificate", c)?,
                        read("the etcd client key", k)?,
                    ))
                })
                .transpose()?,
        }))
    }
}

/// The pools and blocks in one etcd.
#[derive(Clone)]
pub struct ClusterStore {
    client: EtcdClient,
    prefix: String,
    /// Each claiming node's view of each pool's blocks, kept between claims.
    views: super::claim::Views,
}

/// `10.0.0.0/26` as a key part: `10.0.0.0-26`.
pub fn block_key_part(block: &IpNet) -> String {
    format!("{}-{}", block.network(), block.prefix_len())
}

/// The block a key part names: `10.0.0.0-26`, its address the block's first.
fn parse_block_part(s: &str) -> Option<IpNet> {
    let (addr, len) = s.rsplit_once('-')?;
    let net = IpNet::new(addr.parse().ok()?, len.parse().ok()?).ok()?;
    (net.trunc() == net).then_some(net)
}

/// Wall time in Unix milliseconds (0 before the epoch).
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

impl ClusterStore {
    /// A store on the etcd at `endpoints` ("http://127.0.0.1:2379", or https with `tls`);
    /// each call is bounded by `timeout`. The connection is made by the first call, and
    /// checked here with a read.
    pub async fn connect(
        endpoints: &[String],
        prefix: &str,
        timeout: Duration,
        tls: Option<&Tls>,
    ) -> Result<ClusterStore, ClusterError> {
        ClusterStore::connect_limited(endpoints, prefix, timeout, tls, None).await
    }

    /// [`ClusterStore::connect`], every request through `limiter`.
    pub async fn connect_limited(
        endpoints: &[String],
        prefix: &str,
        timeout: Duration,
        tls: Option<&Tls>,
        limiter: Option<std::sync::Arc<client::Limiter>>,
    ) -> Result<ClusterStore, ClusterError> {
        let client = EtcdClient::new(endpoints, tls.map(|t| &t.0), timeout, limiter)?;
        let store = ClusterStore {
            client,
            prefix: prefix.trim_end_matches('/').to_string(),
            views: super::claim::Views::default(),
        };
        store
            .client
            .range(request::get(store.pools_prefix()))
            .await?;
        Ok(store)
    }

    /// The same store whose requests never wait for the etcd rate limit (the heartbeat's).
    pub fn urgent(&self) -> ClusterStore {
        ClusterStore {
            client: self.client.urgent(),
            prefix: self.prefix.clone(),
            views: self.views.clone(),
        }
    }

    /// Each claiming node's view of each pool's blocks.
    pub fn views(&self) -> &super::claim::Views {
        &self.views
    }

    /// The etcd client underneath (for what the store does not do itself).
    pub fn client(&self) -> &EtcdClient {
        &self.client
    }

    /// How many times this store's etcd was found reset (see [`EtcdClient::resets`]).
    pub fn resets(&self) -> (u64, Option<String>) {
        self.client.resets()
    }

    fn pools_prefix(&self) -> String {
        format!("{}/pools/", self.prefix)
    }

    pub(super) fn key(&self, rest: &str) -> String {
        format!("{}/{rest}", self.prefix)
    }

    fn pool_key(&self, name: &str) -> String {
        format!("{}{name}", self.pools_prefix())
    }

    fn blocks_prefix(&self, pool: &str) -> String {
        format!("{}/blocks/{pool}/", self.prefix)
    }

    fn block_key(&self, pool: &str, block: &IpNet) -> String {
        format!("{}{}", self.blocks_prefix(pool), block_key_part(block))
    }
}

mod blocks;
pub mod client;
mod pools;
pub mod request;

pub use super::claim::ClaimOutcome;

#[cfg(test)]
mod tests;
