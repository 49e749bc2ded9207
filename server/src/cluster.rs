//! Cluster mode (issue 19): nodes claim address blocks from pools shared through etcd.
//!
//! - [`pool`]: a pool's spec; [`cidrset`]: its CIDRs carved into blocks (nodeipam's cidrset);
//! - [`etcd`]: pools and block owners in etcd, each decision one transaction; [`nodes`]: the
//!   daemons' heartbeats and release-node;
//! - [`node`]: this node, as `config::cluster` (the `[cluster]` table) says: its etcd
//!   connection, token bucket, etcd up or down, heartbeat;
//! - [`source`]: `ClusterSource`, a range set's addresses from the blocks this node owns, and
//!   [`work`]: the etcd calls it hands the engine to run (sync, claim, claim back, give back).
//!
//! `ipoolctl cluster` drives the pools and blocks; `node_ranges::cluster` gives a network the
//! pool's CIDRs as its ranges.

pub mod cidrset;
pub mod etcd;
pub mod node;
pub mod nodes;
pub mod pool;
pub mod source;
pub mod work;
