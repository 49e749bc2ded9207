//! Cluster pools and their blocks in etcd. Keys, under a prefix (default `/ipool/v1`):
//!
//! - `<prefix>/pools/<name>`: a pool ([`PoolSpec`], JSON);
//! - `<prefix>/blocks/<pool>/<block>`: a block's owner ([`Owner`], JSON), the block written
//!   as Calico does, `10.0.0.0-26`.
//!
//! Every decision is one etcd transaction: a claim is "create the block's key if it is absent
//! and the pool still exists" (the loser learns the winner), a give-back is "delete it if it is
//! still the one this node created" (by its create revision), deleting a pool is "delete it if
//! no block key exists under it". Two nodes never own one block, and a pool with owned blocks
//! is never deleted, however the calls interleave.

use std::time::Duration;

use ipnet::IpNet;

use client::{EtcdClient, EtcdError};
use request::{cmp, op};
use serde::{Deserialize, Serialize};

pub use super::pool::PoolSpec;

/// Default key prefix.
pub use crate::config::cluster::DEFAULT_PREFIX;
/// Default block sizes, as Calico's.
pub const DEFAULT_BLOCK_V4: u8 = 26;
pub const DEFAULT_BLOCK_V6: u8 = 122;
/// Listings a pool creation checks before it gives up on pools that keep changing.
const CREATE_ATTEMPTS: usize = 5;

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
    /// The etcd revision that created the key: a give-back is conditioned on it.
    pub create_revision: i64,
}

/// What a claim got.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Claimed {
    Won(Block),
    /// Another node has it.
    Lost(Owner),
    /// The pool was deleted.
    NoPool,
}

/// An etcd failure, or a refusal.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error("etcd: {0}")]
    Etcd(#[from] EtcdError),
    #[error("{0}")]
    Refused(String),
    #[error("etcd holds a malformed {what} at {key}: {why}")]
    Malformed {
        what: &'static str,
        key: String,
        why: String,
    },
}

impl ClusterError {
    /// etcd cannot be used: it did not answer, or it refuses this client (credentials,
    /// permissions), as opposed to answering a request no.
    pub fn is_unreachable(&self) -> bool {
        match self {
            ClusterError::Etcd(e) => e.is_unreachable(),
            ClusterError::Refused(_) | ClusterError::Malformed { .. } => false,
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
    views: claim::Views,
}

/// `10.0.0.0/26` as a key part: `10.0.0.0-26`.
pub fn block_key_part(block: &IpNet) -> String {
    format!("{}-{}", block.network(), block.prefix_len())
}

fn parse_block_part(s: &str) -> Option<IpNet> {
    let (addr, len) = s.rsplit_once('-')?;
    IpNet::new(addr.parse().ok()?, len.parse().ok()?).ok()
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
        let client = EtcdClient::new(endpoints, tls.map(|t| &t.0), timeout)?;
        let store = ClusterStore {
            client,
            prefix: prefix.trim_end_matches('/').to_string(),
            views: claim::Views::default(),
        };
        store
            .client
            .range(request::get(store.pools_prefix()))
            .await?;
        Ok(store)
    }

    pub(super) fn client(&self) -> &EtcdClient {
        &self.client
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

    /// Creates `spec`; refused when a pool of that name exists or its CIDRs overlap another
    /// pool's. The overlap check holds however creations interleave: the creation is
    /// conditioned on no pool having been written since the listing it checked.
    pub async fn create_pool(&self, spec: &PoolSpec) -> Result<(), ClusterError> {
        spec.validate().map_err(ClusterError::Refused)?;
        let key = self.pool_key(&spec.name);
        let value = serde_json::to_vec(spec).expect("a pool serializes");
        for _ in 0..CREATE_ATTEMPTS {
            let (pools, revision) = self.list_pools_at().await?;
            for other in pools {
                for a in &spec.cidrs {
                    if let Some(b) = other.cidrs.iter().find(|b| a.contains(*b) || b.contains(a)) {
                        return Err(ClusterError::Refused(format!(
                            "pool {:?}: CIDR {a} overlaps {b} of pool {:?}",
                            spec.name, other.name
                        )));
                    }
                }
            }
            let txn = request::txn(
                [
                    cmp::version(key.clone(), cmp::Equal, 0),
                    cmp::with_prefix(cmp::mod_revision(
                        self.pools_prefix(),
                        cmp::Less,
                        revision + 1,
                    )),
                ],
                [op::put(key.clone(), value.clone(), 0)],
                [op::get(key.clone())],
            );
            let r = self.client.txn(txn).await?;
            if r.succeeded {
                return Ok(());
            }
            let exists = request::txn_reads(&r).next().is_some();
            if exists {
                return Err(ClusterError::Refused(format!(
                    "pool {:?} exists already",
                    spec.name
                )));
            }
            // Another pool was written since the listing: check again.
        }
        Err(ClusterError::Refused(format!(
            "pool {:?}: other pools kept changing during {CREATE_ATTEMPTS} attempts; try again",
            spec.name
        )))
    }

    fn pools_prefix(&self) -> String {
        format!("{}/pools/", self.prefix)
    }

    /// Every pool, and the revision of the listing.
    async fn list_pools_at(&self) -> Result<(Vec<PoolSpec>, i64), ClusterError> {
        let r = self
            .client
            .range(request::get_prefix(self.pools_prefix()))
            .await?;
        let revision = r.header.map(|h| h.revision).unwrap_or_default();
        let pools = r
            .kvs
            .iter()
            .map(|kv| {
                serde_json::from_slice(&kv.value).map_err(|e| ClusterError::Malformed {
                    what: "pool",
                    key: String::from_utf8_lossy(&kv.key).into_owned(),
                    why: e.to_string(),
                })
            })
            .collect::<Result<_, _>>()?;
        Ok((pools, revision))
    }

    /// Every pool, by name.
    pub async fn list_pools(&self) -> Result<Vec<PoolSpec>, ClusterError> {
        Ok(self.list_pools_at().await?.0)
    }

    pub async fn get_pool(&self, name: &str) -> Result<Option<PoolSpec>, ClusterError> {
        Ok(self
            .list_pools()
            .await?
            .into_iter()
            .find(|p| p.name == name))
    }

    /// Deletes pool `name`; refused while any of its blocks is owned.
    pub async fn delete_pool(&self, name: &str) -> Result<(), ClusterError> {
        let key = self.pool_key(name);
        let blocks = self.blocks_prefix(name);
        let txn = request::txn(
            [
                cmp::version(key.clone(), cmp::Greater, 0),
                cmp::with_prefix(cmp::version(blocks, cmp::Equal, 0)),
            ],
            [op::delete(key)],
            [],
        );
        let r = self.client.txn(txn).await?;
        if r.succeeded {
            return Ok(());
        }
        if self.get_pool(name).await?.is_none() {
            return Err(ClusterError::Refused(format!("no pool {name:?}")));
        }
        let owned = self.list_blocks(Some(name), None).await?;
        Err(ClusterError::Refused(format!(
            "pool {name:?} still has {} owned block(s) (release them first: ipoolctl cluster release-node)",
            owned.len()
        )))
    }

    /// Owned blocks, of one pool and/or one node.
    pub async fn list_blocks(
        &self,
        pool: Option<&str>,
        node: Option<&str>,
    ) -> Result<Vec<Block>, ClusterError> {
        let prefix = match pool {
            Some(p) => self.blocks_prefix(p),
            None => format!("{}/blocks/", self.prefix),
        };
        let r = self.client.range(request::get_prefix(prefix)).await?;
        let root = format!("{}/blocks/", self.prefix);
        let mut out = Vec::new();
        for item in &r.kvs {
            let key = String::from_utf8_lossy(&item.key).into_owned();
            let malformed = |why: String| ClusterError::Malformed {
                what: "block",
                key: key.clone(),
                why,
            };
            let rest = key.strip_prefix(&root).unwrap_or(&key);
            let (pool_name, part) = rest
                .split_once('/')
                .ok_or_else(|| malformed("no pool in the key".into()))?;
            let block =
                parse_block_part(part).ok_or_else(|| malformed("no block in the key".into()))?;
            let owner: Owner =
                serde_json::from_slice(&item.value).map_err(|e| malformed(e.to_string()))?;
            if node.is_some_and(|n| n != owner.node) {
                continue;
            }
            out.push(Block {
                pool: pool_name.to_string(),
                block,
                owner,
                create_revision: item.create_revision,
            });
        }
        Ok(out)
    }

    /// Claims `block` of `pool` for `node`: one transaction, won only when no one owns it and
    /// the pool still exists.
    pub async fn claim(
        &self,
        pool: &str,
        block: &IpNet,
        node: &str,
    ) -> Result<Claimed, ClusterError> {
        let key = self.block_key(pool, block);
        let owner = Owner {
            node: node.to_string(),
            claimed_at_ms: now_ms(),
        };
        let value = serde_json::to_vec(&owner).expect("an owner serializes");
        let txn = request::txn(
            [
                cmp::version(key.clone(), cmp::Equal, 0),
                cmp::version(self.pool_key(pool), cmp::Greater, 0),
            ],
            [op::put(key.clone(), value, 0)],
            [op::get(key.clone())],
        );
        let r = self.client.txn(txn).await?;
        if r.succeeded {
            let revision = r.header.map(|h| h.revision).unwrap_or_default();
            return Ok(Claimed::Won(Block {
                pool: pool.to_string(),
                block: *block,
                owner,
                create_revision: revision,
            }));
        }
        let held = request::txn_reads(&r).next().map(|kv| kv.value.clone());
        match held {
            Some(v) => {
                serde_json::from_slice(&v)
                    .map(Claimed::Lost)
                    .map_err(|e| ClusterError::Malformed {
                        what: "block",
                        key,
                        why: e.to_string(),
                    })
            }
            None => Ok(Claimed::NoPool),
        }
    }

    /// Gives `b` back, only if it is still the key its owner created. False: it was not.
    pub async fn give_back(&self, b: &Block) -> Result<bool, ClusterError> {
        let key = self.block_key(&b.pool, &b.block);
        let txn = request::txn(
            [cmp::create_revision(
                key.clone(),
                cmp::Equal,
                b.create_revision,
            )],
            [op::delete(key)],
            [],
        );
        Ok(self.client.txn(txn).await?.succeeded)
    }
}

pub use claim::ClaimOutcome;

mod claim;
pub mod client;
pub mod request;

#[cfg(test)]
mod tests;
