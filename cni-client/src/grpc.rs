//! One unary gRPC call over HTTP/2 (cleartext, prior knowledge) on a Unix socket: blocking,
//! one thread, bounded by a deadline.
//!
//! The plugin is exec'd for every pod and makes exactly one call, so what a general client
//! spends setting itself up is most of what the call costs. With tonic, the call added about
//! 250 us of CPU and 360 us of wall time to a process whose exec costs 570 us (an async runtime,
//! a channel with its buffer task, hyper's connection task, three writes for one request, and
//! the code of all of it paged in). This does what the call needs and no more: connect, one
//! write (preface, SETTINGS, a connection WINDOW_UPDATE, HEADERS and as much DATA as the
//! window allows), then read frames until the stream ends. The daemon is a normal tonic
//! server, and the protocol is normal HTTP/2: SETTINGS and PINGs are acknowledged, flow
//! control is kept both ways (a GC request can exceed the initial 64 KiB window), and the
//! reply's headers are decoded with a full HPACK decoder ([`hpack`]: h2 servers use Huffman
//! codes and the dynamic table). docs/performance.md has the numbers.
//!
//! Layout: `frames` (the wire format: frame types, building frames and the request headers),
//! `conn` (connecting, and the call's loop of frames), `reply` (the gRPC outcome of the
//! stream), [`hpack`] (the reply's header blocks).
//!
//! # Layout
//! - `conn`: the connection and the one call made on it;
//! - `frames`: the HTTP/2 wire format this client needs;
//! - `hpack`: an HPACK decoder (RFC 7541) for the reply's header blocks;
//! - `reply`: what has arrived for the stream (`Response`), and the gRPC outcome made of it.

use std::io;
use std::path::Path;
use std::time::Instant;

mod conn;
mod frames;
mod hpack;
mod reply;

#[cfg(test)]
mod tests;

use conn::{connect, Call};

/// A reply: a gRPC status and, when it is OK, the message.
#[derive(Debug, PartialEq, Eq)]
pub struct Reply {
    /// The gRPC status code (0 = OK).
    pub code: i32,
    /// `grpc-message`, percent-decoded.
    pub message: String,
    /// The reply message (protobuf), when `code` is 0.
    pub body: Vec<u8>,
}

#[derive(Debug)]
pub enum CallError {
    /// The socket could not be connected: nothing was sent.
    Connect(io::Error),
    /// The deadline passed (connecting, sending or waiting for the reply).
    Deadline,
    /// The connection broke, or the peer broke the protocol, after the request may have been
    /// sent: its outcome is unknown.
    Broken(String),
}

/// Calls `method` (`/package.Service/Method`) with `message` (an encoded protobuf) on the
/// server at `socket`.
pub fn unary(
    socket: &Path,
    method: &str,
    message: &[u8],
    deadline: Instant,
) -> Result<Reply, CallError> {
    let stream = connect(socket, deadline)?;
    Call::new(stream, deadline).run(method, message)
}

fn broken(what: impl Into<String>) -> CallError {
    CallError::Broken(what.into())
}
