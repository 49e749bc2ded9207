//! Cluster mode's integration tests: real daemons, the real plugin and ipoolctl on either
//! store (a real etcd, or the fake apiserver of `ipool-testkit` over real HTTP), one module per
//! area. The tests that need etcd are ignored without it; CI runs them with `--include-ignored`.
//!
//! # Layout
//! - [`cluster`]: the etcd layer against a real etcd: pools, claims, give-backs, release-node;
//! - [`cluster_check`]: `ipoolctl cluster check` and `release-node --from-check`;
//! - [`cluster_choice`]: pods and nodes choosing among a network's cluster pools;
//! - [`cluster_departed`]: departed nodes released by the daemon that leads;
//! - [`cluster_doubt`]: the edges of what a node knows (claims in doubt, fences, resets);
//! - [`cluster_fencing`]: never an address another node may hold: each way found, closed;
//! - [`cluster_fixed`]: fixed addresses that follow their pod from node to node;
//! - [`cluster_kube`]: cluster mode on the Kubernetes API;
//! - [`cluster_kube_ctl`]: `ipoolctl cluster --datastore kubernetes`;
//! - [`cluster_kube_faults`]: the Kubernetes API under faults;
//! - [`cluster_late`]: writes that reach etcd late;
//! - [`cluster_load`]: what nodes at steady state cost their store;
//! - [`cluster_mode`]: cluster mode end to end on etcd;
//! - [`cluster_pins`]: pins on either store;
//! - [`cluster_pools`]: pools an operator changes while they run;
//! - [`cluster_ptp`]: Debian's `ptp` execs `ipool` for pods in namespaces;
//! - [`cluster_scale`]: a node's cost follows its own blocks, not the pool's size;
//! - [`cluster_stale`]: a cluster pool's network the config no longer names;
//! - [`cluster_subnet`]: a network addressed as one subnet;
//! - [`cluster_tls`]: an etcd that serves https and asks for client certificates;
//! - [`cluster_truth`]: what may have changed under a daemon (restores, wipes);
//! - [`cluster_watch`]: blocks heard of, not polled.

#[path = "../common/mod.rs"]
mod common;

mod cluster;
mod cluster_check;
mod cluster_choice;
mod cluster_departed;
mod cluster_doubt;
mod cluster_fencing;
mod cluster_fixed;
mod cluster_kube;
mod cluster_kube_ctl;
mod cluster_kube_faults;
mod cluster_late;
mod cluster_load;
mod cluster_mode;
mod cluster_pins;
mod cluster_pools;
mod cluster_ptp;
mod cluster_scale;
mod cluster_stale;
mod cluster_subnet;
mod cluster_tls;
mod cluster_truth;
mod cluster_watch;
