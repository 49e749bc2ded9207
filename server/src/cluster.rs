//! Cluster mode: nodes claim address blocks from pools kept in a shared store, etcd or the
//! Kubernetes API.
//!
//! # Layout
//! - [`ippool`]: an IPPool's spec and the changes an operator makes to it; [`cidrset`]: its
//!   CIDRs carved into blocks (nodeipam's cidrset);
//! - [`claim`]: a node's next block of a pool, found and claimed through either store;
//! - [`vocab`]: the vocabulary (blocks, revisions, pools, listings, claims, errors, node
//!   names), shared by everything below and owned by neither store;
//! - [`datastore`]: what cluster mode asks of the store that holds pools, blocks, pins and node
//!   names (the `Datastore` trait: `PoolStore`, `BlockStore`, `NameStore`, ...), and
//!   [`connect`]: the store a config names, made;
//! - [`etcd`]: that store in etcd (`EtcdStore`), each decision one transaction;
//! - [`kube`]: the same on the Kubernetes API (`KubeStore`: custom resources, a Lease per node);
//! - [`limiter`]: the node's budget of store requests, shared by both stores;
//! - [`heard`]: what the store's watches told this node, kept for those who act on it;
//! - [`pin`]: fixed addresses (pins) kept for StatefulSet pods and VMs across nodes;
//! - [`release`]: release-node's judgement of a node's absence, over either store;
//! - [`departed`]: that release done by itself, by the daemon that leads it, for nodes whose
//!   Node is gone;
//! - [`check`]: `ipoolctl cluster check`'s audit of the store;
//! - [`node`]: this node, as `config::cluster` (the `[cluster]` table) says: its store
//!   connection, token bucket, store up or down, heartbeat;
//! - [`source`]: `ClusterSource`, a range set's addresses from the blocks this node owns, and
//!   [`work`]: the store calls it hands the engine to run (sync, claim, claim back, give back).
//!
//! `ipoolctl cluster` drives the pools and blocks; `node_ranges::cluster` gives a network the
//! pool's CIDRs as its ranges.

/// `d` give or take a fifth, at random: nodes that started together (or saw the store come
/// back together) do not call it in the same second. Drawn from this thread's generator (see
/// [`seed_jitter`]).
pub fn jitter(d: std::time::Duration) -> std::time::Duration {
    let z = JITTER.with(|state| {
        let s = state.get().unwrap_or_else(|| {
            // Seeded once per thread from the clock: daemons started together still differ.
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|t| t.as_nanos() as u64)
                .unwrap_or(1)
        });
        let next = s.wrapping_add(0x9e37_79b9_7f4a_7c15);
        state.set(Some(next));
        let mut z = next;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    });
    // A factor within [0.8, 1.2).
    let f = 0.8 + (z >> 11) as f64 / (1u64 << 53) as f64 * 0.4;
    d.mul_f64(f)
}

thread_local! {
    /// The jitter's generator state (splitmix64); None: not seeded yet.
    static JITTER: std::cell::Cell<Option<u64>> = const { std::cell::Cell::new(None) };
}

/// Seeds this thread's jitter: from then on its draws follow from `seed` alone (a
/// deterministic run on one thread, as the simulation's).
pub fn seed_jitter(seed: u64) {
    JITTER.with(|s| s.set(Some(seed)));
}

pub mod check;
pub mod cidrset;
pub mod claim;
pub mod connect;
pub mod datastore;
pub mod departed;
pub mod etcd;
pub mod heard;
pub mod ippool;
pub mod kube;
pub mod limiter;
pub mod node;
pub mod pin;
pub mod release;
pub mod source;
pub mod vocab;
pub mod work;
