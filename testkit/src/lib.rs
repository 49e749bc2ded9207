//! What ipool's tests and its simulation run against, kept in one place so that both hold the
//! same rules.
//!
//! # Layout
//! - [`apiserver`]: the Kubernetes apiserver's objects in memory, read and written as a real
//!   apiserver does (resourceVersions, 409s, preconditions, label selectors, pages, the
//!   times it stamps in `managedFields`); the tests serve it over HTTP
//!   (`server/tests/common/fake_api.rs`), the simulation in process (`ipool-sim`).

pub mod apiserver;
