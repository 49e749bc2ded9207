//! One node's daemon through its real binaries: the plugin, ipoolctl, the Ops API, the host's
//! files and the environment's faults, one module per area. Tests that need root, Debian's CNI
//! plugins, faketime or Prometheus are ignored without them; CI runs them.
//!
//! # Layout
//! - [`bridge`]: Debian's `bridge` plugin execs `ipool` in network namespaces;
//! - [`cni`]: the plugin against a real daemon: every version and verb;
//! - [`crash`]: crash safety under load (`kill -9`);
//! - [`docs`]: the README's worked example, run as written;
//! - [`e2e`]: end to end, the plugin against a daemon;
//! - [`faults`]: faults of the environment: a full tmpfs, a clock step;
//! - [`hostile`]: hostile callers and careless operators;
//! - [`install`]: `ipoold install-cni` and the CNI config on the host;
//! - [`monitoring`]: deploy/monitoring with promtool;
//! - [`node_ranges`]: a network's ranges from the node (podCIDRs, flannel);
//! - [`ops_ctl`]: every Ops call through ipoolctl on the Unix socket;
//! - [`ops_serve`]: health, reflection and metrics;
//! - [`ops_tcp`]: the Ops service over TCP.

#[path = "../common/mod.rs"]
mod common;

mod bridge;
mod cni;
mod crash;
mod docs;
mod e2e;
mod faults;
mod hostile;
mod install;
mod monitoring;
mod node_ranges;
mod ops_ctl;
mod ops_serve;
mod ops_tcp;
