//! Kubernetes: the client, the pods on this node (a watch cache that gives each ADD its pod's
//! metadata), the pod GC, and the quarantine of live pods' addresses the store does not hold.
//! Nothing below the engine knows of it: these drive [`crate::ipam::Ipam`] through its API.

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
