//! # ipool-server
//!
//! The per-node IPAM daemon `ipoold` and the operators' CLI `ipoolctl`.
//!
//! ## Layout
//! Lower layers first; each imports only from the ones above it (docs/architecture.md).
//! - [`range`]: address math: host-local-compatible ranges and the free set of a range set.
//! - [`model`]: the shared types: network definitions and tuning, attachment and reservation
//!   records, time.
//! - [`clock`]: engine time (wall time at start, then the monotonic clock) and a manual clock
//!   for tests.
//! - [`pool`]: the object pool of one range set (idle, in use, reserved, capacity tokens,
//!   cooldown, min/max idle) and the token bucket. Pure: no I/O, time passed in.
//! - [`source`]: where a pool's addresses come from (`local`: ranges), behind a trait.
//! - [`store`]: durable state (a write-ahead log and sled), behind a trait with an in-memory
//!   twin for tests.
//! - [`metrics`]: the counters and histograms the engine is handed.
//! - [`error`]: the engine's error, and its gRPC status mapping.
//! - [`config`]: the daemon's TOML and the CNI `ipam` section parser.
//! - [`ipam`]: the engine: networks, attachments, ADD/DEL/CHECK, recovery at start,
//!   the background loop. Drives pool, source and store.
//! - [`service`]: the tonic services (`Cni`, `Ops`).
//! - [`cluster`]: cluster mode: pools carved into blocks, claimed by nodes through etcd.
//! - [`k8s`]: the Kubernetes client (in-cluster or a kubeconfig).
//! - [`node_ranges`]: a network's ranges from the node (its Node's podCIDRs, flannel's
//!   subnet file), fed to the engine as they change.
//! - [`exporter`]: the Prometheus `/metrics` endpoint.
//! - [`server`]: the Unix socket and `run(listener, ipam, shutdown)`.
//! - [`tcp_guard`]: the TCP Ops listener's cap on connections and its idle timeout.
//! - [`install`]: the plugin and the conflist written on the host, atomically.
//! - [`logbuf`]: log lines that wait for the runtime's thread to go idle.
#![forbid(unsafe_code)]

pub mod bugs;
pub mod clock;
pub mod cluster;
pub mod config;
pub mod error;
pub mod exporter;
pub mod install;
pub mod ipam;
pub mod k8s;
pub mod logbuf;
pub mod metrics;
pub mod model;
pub mod node_ranges;
pub mod pool;
pub mod range;
pub mod selector;
pub mod server;
pub mod service;
pub mod source;
pub mod store;
pub mod tcp_guard;
