//! Cluster mode (issue 19): nodes claim address blocks from pools shared through etcd.
//!
//! - [`pool`]: a pool's spec; [`cidrset`]: its CIDRs carved into blocks (nodeipam's cidrset);
//! - [`claim`]: a node's next block of a pool, found and claimed through either store;
//! - [`model`]: the vocabulary (blocks, revisions, pools, listings, claims, errors, node
//!   names), shared by everything below and owned by neither store;
//! - [`datastore`]: what cluster mode asks of the store that holds pools, blocks and node
//!   names (`Datastore`: `PoolStore`, `BlockStore`, `NameStore`);
//! - [`etcd`]: that store in etcd, each decision one transaction (`etcd::nodes`: the daemons'
//!   heartbeats and release-node);
//! - [`kube`]: the same on the Kubernetes API (custom resources, a Lease per node);
//! - [`release`]: release-node's judgement of a node's absence, over either store;
//! - [`departed`]: that release done by itself, by the daemon that leads it, for nodes whose
//!   Node is gone;
//! - [`node`]: this node, as `config::cluster` (the `[cluster]` table) says: its etcd
//!   connection, token bucket, etcd up or down, heartbeat;
//! - [`source`]: `ClusterSource`, a range set's addresses from the blocks this node owns, and
//!   [`work`]: the etcd calls it hands the engine to run (sync, claim, claim back, give back).
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
pub mod kube;
pub mod model;
pub mod node;
pub mod pin;
pub mod pool;
pub mod release;
pub mod source;
pub mod work;
