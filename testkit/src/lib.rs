//! What ipool's tests, its simulation and its benchmark run against, kept in one place so that
//! all hold the same rules.
//!
//! # Layout
//! - [`apiserver`]: the Kubernetes apiserver's objects in memory, read and written as a real
//!   apiserver does (resourceVersions, 409s, preconditions, label selectors, pages, watches'
//!   events, the times it stamps in `managedFields`); the simulation serves it in process
//!   (`ipool-sim`);
//! - [`fake_api`]: the same over real HTTP on loopback, with the failures a real apiserver
//!   has, for the tests (`server/tests/common`) and `ipool-bench`'s store-load rows;
//! - [`access`]: who may do what (RBAC), and [`admission`]: the ValidatingAdmissionPolicies,
//!   both read from deploy/'s manifests ([`manifest`]) and enforced by the fake apiserver for
//!   callers with a token; [`caller`]: who asks and what for, as both judge it;
//! - [`events`]: the apiserver's rules for Events, and JSON merge patch;
//! - [`meta_rules`]: its rules for names, label values and label selectors, shared by both;
//! - [`answer`]: an apiserver's answer and its `Status` of a failure;
//! - [`load`]: what clients cost a store, counted at the store (the fake apiserver's
//!   requests, a real etcd's own counters).

pub mod access;
pub mod admission;
pub mod answer;
pub mod apiserver;
pub mod caller;
pub mod events;
pub mod fake_api;
pub mod load;
pub mod manifest;
pub mod meta_rules;
