//! Cluster pools and their blocks in etcd. Keys, under a prefix (default `/ipool/v1`):
//!
//! - `<prefix>/pools/<name>`: a pool ([`PoolSpec`](super::ippool::PoolSpec), JSON);
//! - `<prefix>/blocks/<pool>/<block>`: a block's owner ([`Owner`](super::vocab::Owner), JSON), the block written
//!   as Calico does, `10.0.0.0-26`;
//! - `<prefix>/nodes/<node>/blocks/<pool>/<block>`: the node's index of its blocks, written and
//!   deleted with them; `<prefix>/nodes/<node>/indexed`: its index is complete;
//! - `<prefix>/nodes/<node>/alive`, `.../seen`: the daemons' heartbeats ([`nodes`]);
//! - `<prefix>/pins/<pool>/<block>/<address>` and `<prefix>/pin-owners/<owner>`: fixed
//!   addresses and their owners' index (`pins`).
//!
//! Every decision is one etcd transaction: a claim is "create the block's key if it is absent
//! and the pool is still as this node read it" (the loser learns the winner), a give-back is
//! "delete it if it is still the one this node created" (by its create revision), deleting a
//! pool is "delete it if no block key exists under it". Two nodes never own one block, a claim
//! never follows a pool spec that changed since it was read, and a pool with owned blocks is
//! never deleted, however the calls interleave. A malformed key under the prefix is reported
//! and counts as occupied; it does not fail the listing it is in.
//!
//! The store implements [`Datastore`]: `pools` its pools ([`PoolStore`](super::datastore::PoolStore)),
//! `blocks` its blocks ([`BlockStore`](super::datastore::BlockStore)), `nodes` its node names
//! ([`NameStore`](super::datastore::NameStore)); `client` is etcd's API over tonic, `request`
//! builds its requests.
//!
//! # Layout
//! - `blocks`: blocks in etcd;
//! - [`client`]: etcd's v3 API over tonic;
//! - `leader`: who leads a role (the release of departed nodes), a key on a lease;
//! - [`nodes`]: nodes in etcd;
//! - `numbers`: numbers for this process's writes, rising with each;
//! - `pin_marks`: how long a pin's owner has been gone, measured by etcd;
//! - `pins`: pins in etcd ([`crate::cluster::pin`]);
//! - `pools`: pools in etcd;
//! - [`request`]: requests to etcd, built;
//! - `watch`: [`EtcdStore`]'s watches;
//! - `witness`: a node's witness in etcd of its last write (a reset seen whatever the revision says).

use std::sync::Arc;
use std::time::Duration;

use ipnet::IpNet;

use super::datastore::{Datastore, StoreHandle};
use super::vocab::ClusterError;
use client::EtcdClient;

/// Default key prefix.
pub use crate::config::cluster::DEFAULT_PREFIX;
/// TLS towards etcd: the CA that signed its server certificate (ipool's image has no system
/// roots), and this node's client identity when etcd asks for one.
#[derive(Clone, Debug)]
pub struct Tls(client::TlsFiles);

impl Tls {
    /// Reads the PEM files; each error names the file.
    pub fn read(
        ca: Option<&std::path::Path>,
        cert_key: Option<(&std::path::Path, &std::path::Path)>,
    ) -> Result<Tls, TlsUnreadable> {
        let read = |what: &'static str, p: &std::path::Path| {
            std::fs::read(p).map_err(|source| TlsUnreadable {
                what,
                path: p.to_path_buf(),
                source,
            })
        };
        Ok(Tls(client::TlsFiles {
            ca: ca.map(|p| read("the etcd CA", p)).transpose()?,
            identity: cert_key
                .map(|(c, k)| {
                    Ok::<_, TlsUnreadable>((
                        read("the etcd client certificate", c)?,
                        read("the etcd client key", k)?,
                    ))
                })
                .transpose()?,
        }))
    }
}

/// A TLS file that could not be read: which, where, and why.
#[derive(Debug, thiserror::Error)]
#[error("reading {what} {}: {source}", path.display())]
pub struct TlsUnreadable {
    pub what: &'static str,
    pub path: std::path::PathBuf,
    #[source]
    pub source: std::io::Error,
}

/// The pools and blocks in one etcd.
#[derive(Clone)]
pub struct EtcdStore {
    client: EtcdClient,
    prefix: String,
    /// The leads this process holds: role -> the etcd lease its key is on (`etcd::leader`).
    leads: Arc<std::sync::Mutex<std::collections::HashMap<String, i64>>>,
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

impl EtcdStore {
    /// A store on the etcd at `endpoints` ("http://127.0.0.1:2379", or https with `tls`);
    /// each call is bounded by `timeout`. The connection is made by the first call, and
    /// checked here with a read.
    pub async fn connect(
        endpoints: &[String],
        prefix: &str,
        timeout: Duration,
        tls: Option<&Tls>,
    ) -> Result<EtcdStore, ClusterError> {
        EtcdStore::connect_limited(endpoints, prefix, timeout, tls, None).await
    }

    /// [`EtcdStore::connect`], every request through `limiter`.
    pub async fn connect_limited(
        endpoints: &[String],
        prefix: &str,
        timeout: Duration,
        tls: Option<&Tls>,
        limiter: Option<Arc<super::limiter::Limiter>>,
    ) -> Result<EtcdStore, ClusterError> {
        let client = EtcdClient::new(endpoints, tls.map(|t| &t.0), timeout, limiter)?;
        EtcdStore::with_client(client, prefix).await
    }

    /// A store over `client` (its transport, deadline and limiter its own), its keys under
    /// `prefix`; checked with a read.
    pub async fn with_client(client: EtcdClient, prefix: &str) -> Result<EtcdStore, ClusterError> {
        let store = EtcdStore {
            client,
            prefix: prefix.trim_end_matches('/').to_string(),
            leads: Arc::default(),
        };
        store
            .client
            .range(request::get(store.pools_prefix()))
            .await?;
        Ok(store)
    }

    /// The etcd client underneath (for what the store does not do itself).
    pub fn client(&self) -> &EtcdClient {
        &self.client
    }

    pub(super) fn pools_prefix(&self) -> String {
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

impl Datastore for EtcdStore {
    fn urgent(&self) -> StoreHandle {
        Arc::new(EtcdStore {
            client: self.client.urgent(),
            prefix: self.prefix.clone(),
            leads: self.leads.clone(),
        })
    }

    /// etcd's writes name no writer: the same store.
    fn releasing(&self) -> StoreHandle {
        Arc::new(EtcdStore {
            client: self.client.clone(),
            prefix: self.prefix.clone(),
            leads: self.leads.clone(),
        })
    }

    /// How many times this store's etcd was found reset (see [`EtcdClient::resets`]).
    fn resets(&self) -> (u64, Option<String>) {
        self.client.resets()
    }
}

mod blocks;
pub use blocks::block_as_judged;
pub mod client;
mod leader;
pub mod nodes;
mod numbers;
mod pin_marks;
mod pins;
mod pools;
pub mod request;
mod watch;
mod witness;

#[cfg(test)]
mod tests;
