//! Kubernetes: the client, the pods on this node (a watch cache that gives each ADD its pod's
//! metadata), the pod GC, and the quarantine of live pods' addresses the store does not hold.
//! Nothing below the engine knows of it: these drive [`crate::ipam::Ipam`] through its API.
//!
//! # Layout
//! - [`annotation`]: an annotation that cannot be read;
//! - `client`: the Kubernetes client;
//! - [`cri`]: the node's container runtime, asked over its CRI socket (`[kubernetes] cri_socket`);
//! - [`events`]: why an ADD was refused, on the pod;
//! - [`fixed`]: fixed addresses (`ipool.io/fixed`): a pod's owner and what it may keep;
//! - [`gc`]: the pod GC (Calico's rules, Terway's re-check);
//! - [`meta`]: what an ADD takes from its pod;
//! - [`nodes`]: the cluster's Nodes and pins' owners as cluster mode's release of departed nodes
//!   asks them;
//! - [`pin_keeper`]: the pins of this node, kept (see [`crate::cluster::pin`]);
//! - [`pods`]: the pods on this node;
//! - [`selection`]: which cluster pools a pod's ADD may use, most specific first.

pub mod annotation;
mod client;
pub mod cri;
pub mod events;
pub mod fixed;
pub mod gc;
pub mod meta;
pub mod nodes;
pub mod pin_keeper;
pub mod pods;
pub mod selection;

pub use client::{client, kubectl_client, watch_config};
pub use pods::Pods;
