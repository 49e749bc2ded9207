//! # ipool-server
//!
//! The per-node IPAM daemon `ipoold` and the operators' CLI `ipoolctl`.
//!
//! ## Layout
//! - [`range`]: address math: host-local-compatible ranges and the free set of a range set.
//! - [`pool`]: the object pool of one network and family (idle, in use, capacity tokens,
//!   cooldown, min/max idle) and the token bucket. Pure: no I/O, clock injected.
//! - [`factory`]: where a pool's addresses come from (`local`: ranges), behind a trait.
//! - [`config`]: the daemon's TOML, network definitions, and the CNI `ipam` section parser.
//! - [`store`]: durable state (sled), behind a trait with an in-memory twin for tests.
//! - [`ipam`]: the engine: networks, attachments, ADD/DEL/CHECK, recovery at start,
//!   the background loop. Drives pool, factory and store.
//! - [`metrics`]: Prometheus metrics and the `/metrics` endpoint.
//! - [`service`]: the tonic services (`Cni`, `Ops`) and the error -> gRPC status mapping.
//! - [`server`]: the Unix socket and `run(listener, ipam, shutdown)`.
//! - [`cork`]: the Unix socket's connections, whose control frames wait for the reply.
//! - [`clock`]: wall clock and a manual clock for tests.
//! - [`logbuf`]: log lines that wait for the runtime's thread to go idle.
#![forbid(unsafe_code)]

pub mod clock;
pub mod config;
pub mod cork;
pub mod error;
pub mod factory;
pub mod ipam;
pub mod logbuf;
pub mod metrics;
pub mod pool;
pub mod range;
pub mod server;
pub mod service;
pub mod store;
