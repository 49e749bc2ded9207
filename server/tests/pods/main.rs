//! The node's pods as the source of truth (`[kubernetes]`), against the fake apiserver and
//! the container runtime, one module per area.
//!
//! # Layout
//! - [`cri`]: the container runtime asked before an address goes;
//! - [`pods`]: pods read from the apiserver: owners, stickiness, Events;
//! - [`pods_truth`]: no live pod's address released.

#[path = "../common/mod.rs"]
mod common;

mod cri;
mod pods;
mod pods_truth;
