//! The cluster's vocabulary, shared by cluster mode, both stores and `ipoolctl cluster`: blocks
//! and which write of them was read, pools and their phases, what a listing, a claim and a
//! settle found, node names held by heartbeats, and the errors. Neither store owns it.

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use super::etcd::client::EtcdError;
use super::ippool::{InvalidPool, PoolSpec};

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
/// after it was sent (a settle, [`BlockStore::settle`](super::datastore::BlockStore::settle)) makes it fail wherever it is: a
/// give-back whose answer never came may still be applied later (etcd received it, or will),
/// and a read cannot tell; only a write that it must come after can.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeyRevision {
    pub create: i64,
    pub modified: i64,
    /// Which write it was, where the store keeps a mark unique to each (etcd: the node's index
    /// entry holds the id of the claim or settle that wrote the block): a give-back compares it
    /// too, since revisions alone are not unique once etcd was restored from a backup (its
    /// revision goes back, and a later write of the key can land on a revision an older one
    /// had). None: not known (the Kubernetes API; an index entry written before the mark).
    pub write: Option<u64>,
}

/// What a settle found ([`BlockStore::settle`](super::datastore::BlockStore::settle)).
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

/// A store's failure (etcd's or the Kubernetes API's), or a refusal.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// etcd's (`datastore = "etcd"`).
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
    /// What the store holds cannot be read: its kind, where (an etcd key, an object's name),
    /// and why.
    #[error("the store holds a malformed {what} at {key}: {why}")]
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

/// A pool refused is a request the store refuses.
impl From<InvalidPool> for ClusterError {
    fn from(e: InvalidPool) -> ClusterError {
        ClusterError::Refused(e.0)
    }
}

impl ClusterError {
    /// The store cannot be used: it did not answer, or it refuses this client (credentials,
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

/// Blocks as listed: those with an owner, and keys that name none.
/// A lookup of what lives beside the store (a Node, a pin's owner, a VM's migration, on the
/// Kubernetes API) that could not be answered: why. Whoever asked leaves things as they are and
/// asks again later.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct LookupFailed(pub String);

/// The apiserver's error, in words.
impl From<String> for LookupFailed {
    fn from(why: String) -> LookupFailed {
        LookupFailed(why)
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Listing {
    pub blocks: Vec<Block>,
    pub malformed: Vec<MalformedKey>,
}

impl Listing {
    /// Why CIDR `cidr` of pool `pool` may not leave it: a block listed in it (or a key that
    /// names a block there but no owner). None: nothing stands in it.
    pub fn owned_in(&self, pool: &str, cidr: &IpNet) -> Option<String> {
        let inside = |b: &IpNet| cidr.contains(b) || b.contains(cidr);
        if let Some(b) = self.blocks.iter().find(|b| inside(&b.block)) {
            return Some(format!(
                "pool {pool:?}: block {} of CIDR {cidr} is owned by node {:?} (its pods' addresses are in it; once they are gone the node gives it back, or release a departed node: ipoolctl cluster release-node)",
                b.block, b.owner.node
            ));
        }
        self.malformed
            .iter()
            .find(|m| m.block.as_ref().is_some_and(inside))
            .map(|m| format!("pool {pool:?}: {m} stands in CIDR {cidr} (fix or delete it)"))
    }
}

/// Every pool, the keys under `pools/` that hold none, and the revision of the listing.
pub struct Pools {
    pub pools: Vec<Pool>,
    pub malformed: Vec<MalformedKey>,
    pub revision: i64,
}

/// What a daemon writes in its node's `alive` key.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Alive {
    /// The daemon's instance: its state dir's id.
    pub instance: String,
    /// When the key was written (Unix ms, the daemon's clock: for people, not for decisions).
    pub at_ms: u64,
    /// The daemon stops handing out addresses this long after its last renewal.
    pub fence_secs: u64,
    /// The name of the node's Node object, where the daemon knows it (`--node-name`, from the
    /// downward API): whether the node is gone is whether that Node is. Recorded with the
    /// node's name in the store, as long as its absence is measured (etcd: its `seen` key;
    /// the apiserver: its Lease).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub k8s_node: Option<String>,
}

/// What a daemon writes in its node's `seen` key (an older ipoold wrote `at_ms` alone, on no
/// lease).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Seen {
    #[serde(default)]
    pub instance: String,
    #[serde(default)]
    pub fence_secs: u64,
    /// Seconds between renewals: the absence etcd measures can be this much too long.
    #[serde(default)]
    pub renew_secs: u64,
    pub at_ms: u64,
    /// [`Alive::k8s_node`], kept with the node's absence.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub k8s_node: Option<String>,
}

/// What a start of the heartbeat found.
pub enum Acquired {
    /// This daemon holds the node's name.
    Held(Heartbeat),
    /// Another daemon (instance) holds it; its lease's TTL left, in seconds.
    Taken { instance: String, ttl_left: i64 },
}

/// The leases of a held heartbeat, and the `alive` key they keep.
#[derive(Clone, Debug)]
pub struct Heartbeat {
    /// etcd: the `alive` key; the Kubernetes API: the Lease's name.
    pub alive_key: String,
    /// The daemon instance that holds it.
    pub instance: String,
    pub alive_lease: i64,
    pub seen_lease: i64,
}

/// What the store says about a node.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeState {
    /// Its daemon's `alive` key, if it holds one.
    pub alive: Option<Alive>,
    /// What its last `seen` key says, and how long etcd says it has been away (seconds); None:
    /// no `seen` key (away longer than [`SEEN_TTL_SECS`](super::etcd::nodes::SEEN_TTL_SECS), released, or never seen).
    pub seen: Option<(Seen, i64)>,
    pub blocks: Listing,
    /// Why the store cannot tell whether the node is away (no Lease where one was looked
    /// for: that proves nothing); None when `alive` and `seen` say it.
    pub unproven: Option<String>,
    /// The write of the node's record that `seen` was read from (opaque: etcd's `seen` key's
    /// mod revision, the Lease's resourceVersion): a release's last writes are conditioned on
    /// it, so that a daemon back meanwhile keeps its record.
    pub judged: Option<String>,
    /// Its Node's name, as its daemon recorded it ([`Alive::k8s_node`]); None: not recorded.
    pub k8s_node: Option<String>,
    /// The holds of pins its daemon confirmed at its last renewal ([`Holder::key`]: its pod of
    /// that uid had that address there, and the pin was known there as landed), where the
    /// store keeps them (the Kubernetes API: an annotation of its Lease). Another node takes
    /// over only a confirmed hold of a node gone: a pin whose creation landed late, after its
    /// ADD had failed and the node had handed the address to another pod unaware of it, is
    /// confirmed by nobody. None: the store needs none (etcd: a creation sent before its
    /// daemon's last landed write cannot land, see `etcd::witness`).
    ///
    /// [`Holder::key`]: crate::cluster::pin::Holder::key
    pub confirms: Option<Vec<String>>,
    /// How long the process that read it has seen the node's record unchanged, by its own
    /// monotonic clock (the Kubernetes API: the Lease's resourceVersion, as client-go's leader
    /// election judges a lease); None: not measured. A takeover of the node's holds takes no
    /// absence longer: a step of the store's clock forward makes every stamp before it look
    /// old, a live node's too, until its next renewal.
    pub watched_secs: Option<i64>,
}

/// A node's name as a listing of every node's shows it (`ipoolctl cluster nodes`): for
/// people, never for a decision (release-node judges one node with [`NodeState`]).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct NodeSeen {
    pub node: String,
    /// The daemon holding its name (its instance), if one does.
    pub alive: Option<String>,
    /// Seconds since its daemon was last heard, where the store can say (etcd: its `seen`
    /// lease; the apiserver: its Lease's last renewal as the apiserver stamped it, against
    /// this machine's clock).
    pub away_secs: Option<i64>,
    pub fence_secs: u64,
    /// Addresses in use on it as its daemon last reported them, and when (Unix ms, the
    /// daemon's clock).
    pub in_use: Option<InUse>,
    /// Its Node's name, as its daemon recorded it ([`Alive::k8s_node`]); None: not recorded.
    pub k8s_node: Option<String>,
}

/// What a daemon reports of its node's addresses in use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct InUse {
    #[serde(rename = "inUse")]
    pub in_use: u64,
    #[serde(rename = "atMs")]
    pub at_ms: u64,
}

/// Wall time in Unix milliseconds (0 before the epoch): the machine's, or the one this thread
/// was given ([`set_wall_clock`]). Cluster mode writes it for people (claim times, heartbeat
/// times) and never decides by it.
pub fn now_ms() -> u64 {
    WALL.with(|w| match &*w.borrow() {
        Some(clock) => clock(),
        None => std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0),
    })
}

/// A wall clock of its own.
pub type WallClock = Box<dyn Fn() -> u64>;

thread_local! {
    static WALL: std::cell::RefCell<Option<WallClock>> = const { std::cell::RefCell::new(None) };
}

/// Gives this thread a wall clock of its own (the simulation's, which can jump); None: the
/// machine's again.
pub fn set_wall_clock(clock: Option<WallClock>) {
    WALL.with(|w| *w.borrow_mut() = clock);
}
