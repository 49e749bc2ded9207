//! # ipool-cni
//!
//! The `ipool` CNI IPAM plugin: turns one CNI invocation (env + stdin JSON) into one gRPC call
//! to `ipoold` and prints the CNI result, or a CNI error JSON, on stdout.
//!
//! ## Layout
//! - [`error`]: the CNI error (one enum, an exhaustive `code()`) and the gRPC -> CNI mapping.
//! - [`input`]: stdin and the `resolvConf` file, read with a bound.
//! - [`invocation`]: env and stdin parsing and validation, into a [`invocation::Call`]. Pure.
//! - [`result`]: CNI result JSON in the requested version's format.
//! - [`client`]: the call to the daemon for each CNI verb, with a deadline, and the mapping of
//!   calls that got no gRPC status.
//! - [`grpc`]: one unary gRPC call over HTTP/2 on a Unix socket, blocking (no async runtime:
//!   the plugin makes one call and exits).
#![forbid(unsafe_code)]

pub mod client;
pub mod error;
pub mod grpc;
pub mod input;
pub mod invocation;
pub mod result;

/// CNI spec versions this plugin speaks, oldest first.
pub const SUPPORTED_VERSIONS: &[&str] = &["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"];

/// Socket of ipoold when the `ipam` section has no `socket` key.
pub const DEFAULT_SOCKET: &str = "/run/ipool/ipool.sock";

/// Milliseconds the plugin waits for ipoold when `ipam.timeoutMs` is not given.
pub const DEFAULT_TIMEOUT_MS: u64 = 10_000;

use std::collections::HashMap;

/// Runs one invocation: returns what to print on stdout and whether it succeeded.
pub fn run(env: &HashMap<String, String>, stdin: std::io::Result<Vec<u8>>) -> (String, bool) {
    let call = match invocation::parse(env, stdin) {
        Ok(c) => c,
        Err(e) => return (e.to_json(), false),
    };
    match client::execute(&call) {
        Ok(out) => (out, true),
        Err(e) => (e.with_version(&call.version).to_json(), false),
    }
}
