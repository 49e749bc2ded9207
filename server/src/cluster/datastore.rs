//! The seam between cluster mode and the store that holds its pools, its blocks' owners and its
//! nodes' names: everything [`ClusterNode`](super::node::ClusterNode), the sources' work and
//! `ipoolctl cluster` ask of it, as [`Datastore`]: its pools ([`PoolStore`]), its blocks
//! ([`BlockStore`]) and its nodes' names ([`NameStore`]). Two stores implement each part, in
//! the file that owns it: etcd ([`EtcdStore`](super::etcd::EtcdStore): `etcd::pools`, `etcd::blocks`, `etcd::nodes`)
//! and the Kubernetes API ([`KubeStore`](super::kube::KubeStore): `kube::pools`,
//! `kube::blocks`, `kube::lease`); [`connect`](super::connect) makes the one `[cluster]`
//! names. A node's claims (`claim::claim_next`) run on either through [`BlockStore`].
//!
//! What a store must guarantee, whatever the interleaving (the rules of
//! docs/cluster-mode.md): a claim wins only a block no one owns, and only while the pool is as it was read;
//! a give-back deletes only the write of the block it names (created and last written at its
//! [`KeyRevision`](super::vocab::KeyRevision)), and a settle makes every give-back sent before it fail; a pool is deleted
//! only while no block of it is owned; a node's name is held by one daemon at a time, on a
//! lease that lapses when the daemon stops renewing it; how long a node has been away is
//! measured by the store, not by anyone's wall clock.

use std::sync::Arc;

use ipnet::IpNet;

use super::ippool::{NotSetAside, PoolChange, PoolSpec};
use super::pin::{Pin, PinCreated, PinOwner, PinRead};
use super::vocab::{
    Acquired, Alive, Block, Claimed, ClusterError, Heartbeat, Listing, NodeSeen, NodeState, Pool,
    Pools, Settled,
};

/// A store shared by the calls of one node (or of one `ipoolctl` run).
pub type StoreHandle = Arc<dyn Datastore>;

/// A store of pools, blocks and node names: what cluster mode runs on.
pub trait Datastore:
    PoolStore + BlockStore + NameStore + WatchStore + PinStore + LeadStore
{
    /// The same store, whose requests never wait for its rate limit (the heartbeat's).
    fn urgent(&self) -> StoreHandle;
    /// The same store, whose writes are release-node's, not a daemon's: on the Kubernetes
    /// API, a field manager of its own, so that the write that measures a node's absence is
    /// not taken for the node's daemon's own (a daemon releasing a departed node).
    fn releasing(&self) -> StoreHandle;
    /// How many times the store was found reset (restored from an older backup, made anew),
    /// and why the last time.
    fn resets(&self) -> (u64, Option<String>);
}

/// A store's pools.
#[async_trait::async_trait]
pub trait PoolStore: Send + Sync {
    /// Creates a pool; refused when one of that name exists or its CIDRs overlap another's.
    async fn create_pool(&self, spec: &PoolSpec) -> Result<(), ClusterError>;
    /// Every pool, with its phase.
    async fn pools(&self) -> Result<Pools, ClusterError>;
    /// A pool, with the revision a claim from it is conditioned on, and its phase.
    async fn get_pool(&self, name: &str) -> Result<Option<Pool>, ClusterError>;
    /// Deletes a pool; refused while a block of it is owned (and then as it was).
    async fn delete_pool(&self, name: &str) -> Result<(), ClusterError>;
    /// Changes a pool while it runs; the pool as it is now. A CIDR added is checked for
    /// overlap as a creation is; one removed is refused while a block of it is owned. Whatever
    /// the interleaving, no claim decided on the pool as it was read before lands outside its
    /// CIDRs as they are after (a claim is conditioned on the pool as read).
    async fn change_pool(&self, name: &str, change: &PoolChange) -> Result<PoolSpec, ClusterError>;
}

/// A store's blocks and their owners.
#[async_trait::async_trait]
pub trait BlockStore: Send + Sync {
    /// Owned blocks, of one pool and/or one node.
    async fn list_blocks(
        &self,
        pool: Option<&str>,
        node: Option<&str>,
    ) -> Result<Listing, ClusterError>;
    /// `node`'s blocks (of `pool`, or of every pool) for routine work: a resync that trusts
    /// what the node holds (what it does not trust it settles, conditioned on what it listed),
    /// and the check for blocks of pools no network uses. Where the store has a cache of its
    /// own, read from there (the Kubernetes API: its watch cache, `resourceVersion=0`, which
    /// reads nothing from etcd and, before Kubernetes 1.31, does not scan every IPBlock in it);
    /// it may lag by a moment, which the watches that come from the same cache make up for.
    /// Default: [`BlockStore::list_blocks`] (etcd: the node's index, read in full).
    async fn list_own_blocks(
        &self,
        pool: Option<&str>,
        node: &str,
    ) -> Result<Listing, ClusterError> {
        self.list_blocks(pool, Some(node)).await
    }
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
}

/// A store's node names: the heartbeats that hold them, and release-node.
#[async_trait::async_trait]
pub trait NameStore: Send + Sync {
    /// Takes `node`'s name for the daemon `me` names, unless another daemon holds it.
    async fn start_heartbeat(
        &self,
        node: &str,
        me: &Alive,
        ttl_secs: u64,
        renew_secs: u64,
    ) -> Result<Acquired, ClusterError>;
    /// Renews a held name; an error once it is no longer held. `check`: also read back that
    /// the name is still this daemon's (where a renewal alone would not notice: etcd, whose
    /// lease keep-alive succeeds though the `alive` key was replaced or deleted).
    async fn renew_heartbeat(&self, beat: &Heartbeat, check: bool) -> Result<(), ClusterError>;
    /// Gives a held name up at once (a clean stop).
    async fn stop_heartbeat(&self, beat: &Heartbeat) -> Result<(), ClusterError>;
    /// What the store says of a node: its daemon, how long it has been away, its blocks.
    async fn node_state(&self, node: &str) -> Result<NodeState, ClusterError>;
    /// What the store says of `node` as the daemon of node `me` may ask it, writing nothing
    /// of `node`'s: its daemon, and how long it has been away, never measured longer than it
    /// has been (its blocks are not listed). For a takeover of `node`'s pins. Default:
    /// [`NameStore::node_state`] (etcd's is all reads).
    async fn node_away(&self, node: &str, _me: &str) -> Result<NodeState, ClusterError> {
        self.node_state(node).await
    }
    /// Says which holds of pins `beat`'s daemon confirms now ([`NodeState::confirms`]), for
    /// its next renewal to carry (the apiserver: an annotation of its Lease, no request of its
    /// own). Default (etcd): nothing is kept; there a creation sent before the daemon's last
    /// landed write cannot land.
    async fn confirm_holds(
        &self,
        _beat: &Heartbeat,
        _holds: Vec<String>,
    ) -> Result<(), ClusterError> {
        Ok(())
    }
    /// Says how many addresses `beat`'s node has in use now, for `ipoolctl cluster nodes`
    /// (etcd: a key on the heartbeat's `seen` lease; the apiserver: an annotation its next
    /// renewal writes, no request of its own).
    async fn report_in_use(
        &self,
        node: &str,
        beat: &Heartbeat,
        in_use: u64,
    ) -> Result<(), ClusterError>;
    /// Every node name the store keeps a heartbeat of, each as last heard (reads only).
    async fn nodes_seen(&self) -> Result<Vec<NodeSeen>, ClusterError>;
    /// Every block of `node`.
    async fn blocks_of_node(&self, node: &str) -> Result<Listing, ClusterError>;
    /// Carries out `plan`, the release of `node` (see [`Release`]): unless forced, every
    /// write is conditioned on the node still being away (its name not held, its record as
    /// judged), so that a daemon back meanwhile keeps its blocks, its holds and its record.
    /// Stops with [`ClusterError::Refused`] when it came back.
    async fn release_node(&self, node: &str, plan: &Release<'_>) -> Result<Freed, ClusterError>;
}

/// What a release of a node that is gone writes ([`NameStore::release_node`]).
pub struct Release<'a> {
    /// The node as the release judged it (its record's write: [`NodeState::judged`]).
    pub state: &'a NodeState,
    /// Its blocks to give back.
    pub blocks: &'a [Block],
    /// The pins it holds, each as read and as it is to be written: without its holds.
    pub holds: &'a [(PinRead, Pin)],
    /// Given back whatever the store says of the node (`--force`).
    pub force: bool,
    /// The node keeps blocks (a pin was made in them): its record stays, so that a later
    /// release still measures how long it has been away.
    pub keeps_blocks: bool,
}

impl<'a> Release<'a> {
    /// The release of `blocks` alone, judged on `state` (no hold to end; the node's record
    /// dropped after).
    pub fn of_blocks(state: &'a NodeState, blocks: &'a [Block], force: bool) -> Release<'a> {
        Release {
            state,
            blocks,
            holds: &[],
            force,
            keeps_blocks: false,
        }
    }
}

/// What a release freed.
#[derive(Clone, Debug, Default)]
pub struct Freed {
    /// The blocks given back.
    pub blocks: Vec<Block>,
    /// The pins whose holds of the node ended, as written.
    pub unheld: Vec<Pin>,
}

/// Leads of the cluster's chores that one daemon at a time does (the release of departed
/// nodes): a lease a daemon takes, renews and loses as a node's name is held. A lead saves
/// work, it decides nothing: what the leader writes is conditioned as anyone's would be.
#[async_trait::async_trait]
pub trait LeadStore: Send + Sync {
    /// Takes or keeps the lead of `role` for `me` (a node's name) for `ttl_secs` from now;
    /// true while `me` leads. Taken when no one holds it, or when its holder let it lapse
    /// (etcd: its lease expired; the apiserver: its Lease unchanged, as this process saw it,
    /// for its duration). A call by the leader renews it; by another, one read when it is held.
    async fn lead(&self, role: &str, me: &str, ttl_secs: u64) -> Result<bool, ClusterError>;
    /// Who leads `role`, as the store says now (none: no one, or a lapsed lead).
    async fn leader(&self, role: &str) -> Result<Option<String>, ClusterError>;
}

/// A store's pins: fixed addresses kept for their owners ([`super::pin`]). One pin per
/// address and, where the store can say so in one write (etcd), one per owner; on the
/// Kubernetes API a creator that finds another pin of its owner withdraws its own.
#[async_trait::async_trait]
pub trait PinStore: Send + Sync {
    /// Every pin, or those of one pool.
    async fn pins(&self, pool: Option<&str>) -> Result<Vec<PinRead>, ClusterError>;
    /// The pin of `owner`, if it has one.
    async fn pin_of(&self, owner: &PinOwner) -> Result<Option<PinRead>, ClusterError>;
    /// Every pin of `owner`: on the Kubernetes API it may have two for a while (creators that
    /// raced, one not yet withdrawn; a creation that landed late, void), in the order
    /// [`PinStore::pin_of`] picks them.
    async fn pins_of(&self, owner: &PinOwner) -> Result<Vec<PinRead>, ClusterError> {
        Ok(self.pin_of(owner).await?.into_iter().collect())
    }
    /// The pin stored where `pin` is (its address; on etcd, in its pool and block), whoever's
    /// it is now: a pin judged by itself is read again so, not through its owner (on the
    /// Kubernetes API an owner may have a second pin, a creation that landed late).
    async fn pin_at(&self, pin: &Pin) -> Result<Option<PinRead>, ClusterError>;
    /// Creates `pin` unless its address or its owner is pinned already; where the store can
    /// condition it on its block (etcd), only while the block is the one `pin.block_id`
    /// names.
    async fn create_pin(&self, pin: &Pin) -> Result<PinCreated, ClusterError>;
    /// Writes `pin` (its holders) over the write `read` names; None: the pin changed or went
    /// since.
    async fn write_pin(&self, read: &PinRead, pin: &Pin) -> Result<Option<PinRead>, ClusterError>;
    /// Deletes the pin as read; false: it changed or went since.
    async fn delete_pin(&self, read: &PinRead) -> Result<bool, ClusterError>;
    /// Notes that the owner of `read`, a pin nobody holds, is gone: how long (seconds, by the
    /// store's clock) since a look first noted it so, the pin unwritten since (0: noted now);
    /// and the pin as it stands after (what a deletion is conditioned on).
    async fn owner_gone_for(&self, read: &PinRead) -> Result<(i64, PinRead), ClusterError>;
    /// The owner of `read` is back, or the pin held: the note that it was gone goes.
    async fn owner_back(&self, read: &PinRead) -> Result<(), ClusterError>;
    /// Whether `pin`'s block stands as the pin was made in (the pin counts only then); for an
    /// address set aside, whether its pool, as made then, still sets it aside.
    async fn pin_block_stands(&self, pin: &Pin) -> Result<bool, ClusterError>;
    /// Where a pin of `ip`, an address pool `pool` sets aside, is made: the excluded range
    /// holding it and the pool's identity (etcd: its key's create revision; the apiserver: a
    /// hash of its uid). Err inside: why it is not one (no such pool, not set aside).
    async fn set_aside_site(
        &self,
        pool: &str,
        ip: std::net::IpAddr,
    ) -> Result<Result<(IpNet, i64), NotSetAside>, ClusterError>;
    /// Whether a pin of an address set aside could be made now as `pin` is (its pool as made
    /// then, setting it aside, and not being deleted nor losing the CIDR that holds it): a
    /// pin is served only so (on the Kubernetes API a create's check may have gone unanswered;
    /// a deletion or a removal that lists pins after it refuses then).
    async fn set_aside_pinnable(&self, pin: &Pin) -> Result<bool, ClusterError> {
        self.pin_block_stands(pin).await
    }
}

/// A change a watch of a node's blocks and of the pools reports ([`WatchStore::watch`]). A
/// hint that makes the node look again at once, never a verdict: what the node serves is still
/// decided by its syncs and their conditioned writes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Watched {
    /// Block `block` of pool `pool`, listed as the node's, is no longer (given back, released,
    /// deleted, or labelled with another node).
    BlockGone { pool: String, block: IpNet },
    /// Pool `name` was written (its phase, its spec) or deleted.
    Pool(String),
    /// The watch (re)started from a fresh listing (first, or after its history was compacted
    /// away): anything may have changed meanwhile.
    Restarted,
    /// The node's name key was written or deleted (etcd): whose it is now is read at once.
    Name,
    /// The watch of the node's name key is on (true: every change of it from now on will be
    /// heard) or broken (false). While it is on, a renewal need not read the key back.
    NameWatch(bool),
}

/// Watches: a node hears of its blocks and of the pools as they change, instead of listing
/// them every minute.
#[async_trait::async_trait]
pub trait WatchStore: Send + Sync {
    /// Watches `node`'s blocks and every pool, each change reported to `seen`, resumed where
    /// it left off after a break (and [`Watched::Restarted`] when it could not be). Returns
    /// only when it cannot go on (the caller starts it again after a wait).
    async fn watch(
        &self,
        node: &str,
        seen: &(dyn Fn(Watched) + Send + Sync),
    ) -> Result<(), ClusterError>;
}
