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

use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

// Frame types and flags (RFC 9113 section 6).
const DATA: u8 = 0x0;
const HEADERS: u8 = 0x1;
const RST_STREAM: u8 = 0x3;
const SETTINGS: u8 = 0x4;
const PUSH_PROMISE: u8 = 0x5;
const PING: u8 = 0x6;
const GOAWAY: u8 = 0x7;
const WINDOW_UPDATE: u8 = 0x8;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const ACK: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;

// SETTINGS parameters.
const SETTINGS_ENABLE_PUSH: u16 = 0x2;
const SETTINGS_INITIAL_WINDOW_SIZE: u16 = 0x4;

/// The one stream this client opens.
const STREAM: u32 = 1;
/// Every window's size before SETTINGS or WINDOW_UPDATE change it.
const DEFAULT_WINDOW: i64 = 65_535;
/// The largest frame either side may send without SETTINGS_MAX_FRAME_SIZE (which this client
/// neither sends nor needs to raise).
const MAX_FRAME: usize = 16_384;
/// What the daemon may send on the stream and the connection: our SETTINGS raise the stream's
/// window to this and a WINDOW_UPDATE raises the connection's. A bigger reply is an error (the
/// plugin's replies are a few hundred bytes).
const RECV_LIMIT: u32 = 16 << 20;
/// The most header-block bytes accepted for one block.
const MAX_HEADER_BLOCK: usize = 64 << 10;

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

/// Connects without blocking past `deadline`: a daemon that is alive but not accepting leaves
/// a full listen backlog, where a blocking connect would wait for as long as it takes.
fn connect(path: &Path, deadline: Instant) -> Result<UnixStream, CallError> {
    use socket2::{Domain, SockAddr, Socket, Type};
    let addr = SockAddr::unix(path).map_err(CallError::Connect)?;
    // Non-blocking from the start (SOCK_NONBLOCK), blocking again with one ioctl once
    // connected: no fcntl pairs on the path every pod takes.
    let sock =
        Socket::new(Domain::UNIX, Type::STREAM.nonblocking(), None).map_err(CallError::Connect)?;
    loop {
        match sock.connect(&addr) {
            Ok(()) => break,
            // A Unix socket whose backlog is full says "try again"; there is nothing to poll.
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    return Err(CallError::Deadline);
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(CallError::Connect(e)),
        }
    }
    let stream = UnixStream::from(sock);
    stream.set_nonblocking(false).map_err(CallError::Connect)?;
    Ok(stream)
}

fn frame(out: &mut Vec<u8>, kind: u8, flags: u8, stream: u32, payload: &[u8]) {
    let len = u32::try_from(payload.len())
        .ok()
        .filter(|l| *l < 1 << 24)
        .expect("frames are built below 16 MiB");
    out.extend_from_slice(&len.to_be_bytes()[1..]);
    out.push(kind);
    out.push(flags);
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
}

/// An HPACK string literal, not Huffman-coded (RFC 7541 section 5.2).
fn hpack_string(out: &mut Vec<u8>, s: &str) {
    hpack_int(out, 0x00, 7, s.len());
    out.extend_from_slice(s.as_bytes());
}

/// An HPACK integer with an `n`-bit prefix; `first` carries the bits above the prefix.
fn hpack_int(out: &mut Vec<u8>, first: u8, n: u8, mut v: usize) {
    let max = (1usize << n) - 1;
    if v < max {
        out.push(first | v as u8);
        return;
    }
    out.push(first | max as u8);
    v -= max;
    while v >= 128 {
        out.push((v % 128) as u8 | 0x80);
        v /= 128;
    }
    out.push(v as u8);
}

/// The request's header block: literals without indexing (no encoder state to keep), names
/// from the static table where it has them.
fn request_headers(method: &str) -> Vec<u8> {
    let mut h = Vec::with_capacity(96);
    h.push(0x83); // :method: POST (static 3)
    h.push(0x86); // :scheme: http (static 6)
    hpack_int(&mut h, 0x00, 4, 4); // :path (static 4)
    hpack_string(&mut h, method);
    hpack_int(&mut h, 0x00, 4, 1); // :authority (static 1)
    hpack_string(&mut h, "localhost");
    hpack_int(&mut h, 0x00, 4, 31); // content-type (static 31)
    hpack_string(&mut h, "application/grpc");
    h.push(0x00); // te: a new name
    hpack_string(&mut h, "te");
    hpack_string(&mut h, "trailers");
    h
}

struct Call {
    stream: UnixStream,
    deadline: Instant,
    /// Bytes read and not parsed yet.
    input: Vec<u8>,
    /// Frames to send.
    output: Vec<u8>,
    /// How much DATA the daemon lets us send on the connection and on the stream.
    conn_window: i64,
    stream_window: i64,
    /// The daemon's SETTINGS_INITIAL_WINDOW_SIZE (stream windows follow its changes).
    peer_initial_window: i64,
    hpack: hpack::Decoder,
    /// When the socket's read and write timeouts were last set to the time left (see `arm`).
    read_armed: Option<Instant>,
    write_armed: Option<Instant>,
}

/// How long a socket timeout set to the time left is trusted before it is set again: a
/// blocking read or write may end up to this much after the deadline. Sooner than this, the
/// call makes one setsockopt per direction instead of one per read and write.
const REARM: Duration = Duration::from_millis(1);

/// What has arrived for the stream so far.
#[derive(Default)]
struct Response {
    /// Decoded header fields of every block (response headers, then trailers).
    fields: Vec<(String, String)>,
    /// DATA payload.
    body: Vec<u8>,
    /// A header block in progress (HEADERS without END_HEADERS, then CONTINUATIONs), and
    /// whether its HEADERS frame ended the stream.
    block: Option<(Vec<u8>, bool)>,
    ended: bool,
}

impl Response {
    fn field(&self, name: &str) -> Option<&str> {
        // The trailers come last and win over a header of the same name.
        self.fields
            .iter()
            .rev()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

fn broken(what: impl Into<String>) -> CallError {
    CallError::Broken(what.into())
}

impl Call {
    fn new(stream: UnixStream, deadline: Instant) -> Call {
        Call {
            stream,
            deadline,
            input: Vec::with_capacity(4096),
            output: Vec::with_capacity(1024),
            conn_window: DEFAULT_WINDOW,
            stream_window: DEFAULT_WINDOW,
            peer_initial_window: DEFAULT_WINDOW,
            hpack: hpack::Decoder::default(),
            read_armed: None,
            write_armed: None,
        }
    }

    /// Sets the read (or write) timeout to the time left, unless that was done less than
    /// [`REARM`] ago; fails with `Deadline` once the deadline has passed.
    fn arm(&mut self, read: bool) -> Result<(), CallError> {
        let left = self.remaining()?;
        let now = Instant::now();
        let armed = if read {
            &mut self.read_armed
        } else {
            &mut self.write_armed
        };
        if armed.is_some_and(|at| now.duration_since(at) < REARM) {
            return Ok(());
        }
        let set = if read {
            self.stream.set_read_timeout(Some(left))
        } else {
            self.stream.set_write_timeout(Some(left))
        };
        set.map_err(Call::io_error)?;
        *armed = Some(now);
        Ok(())
    }

    fn run(mut self, method: &str, message: &[u8]) -> Result<Reply, CallError> {
        let len = u32::try_from(message.len())
            .map_err(|_| broken("the request is over 4 GiB"))?
            .to_be_bytes();
        // The gRPC message: uncompressed flag, length, protobuf.
        let mut data = Vec::with_capacity(5 + message.len());
        data.push(0);
        data.extend_from_slice(&len);
        data.extend_from_slice(message);

        self.output.extend_from_slice(PREFACE);
        let mut settings = Vec::with_capacity(12);
        for (id, value) in [
            (SETTINGS_ENABLE_PUSH, 0u32),
            (SETTINGS_INITIAL_WINDOW_SIZE, RECV_LIMIT),
        ] {
            settings.extend_from_slice(&id.to_be_bytes());
            settings.extend_from_slice(&value.to_be_bytes());
        }
        frame(&mut self.output, SETTINGS, 0, 0, &settings);
        let raise = RECV_LIMIT - DEFAULT_WINDOW as u32;
        frame(&mut self.output, WINDOW_UPDATE, 0, 0, &raise.to_be_bytes());
        frame(
            &mut self.output,
            HEADERS,
            END_HEADERS,
            STREAM,
            &request_headers(method),
        );
        let mut sent = 0;
        self.queue_data(&data, &mut sent);
        self.send()?;

        let mut resp = Response::default();
        while !resp.ended {
            let (kind, flags, stream, payload) = self.read_frame()?;
            self.handle(kind, flags, stream, &payload, &mut resp)?;
            if sent < data.len() {
                self.queue_data(&data, &mut sent);
            }
            // What was queued (acks, window updates, more DATA) goes out before the next
            // blocking read, in `read_frame`. Once the reply is complete nothing more is
            // owed: the daemon's SETTINGS usually arrive with the reply, and the connection
            // closes without acknowledging them (a write, and a wake-up of the daemon, less).
        }
        reply(&resp)
    }

    /// Queues as much of `data` after `sent` as the windows allow, in frames of at most
    /// MAX_FRAME bytes; the last one ends the stream.
    fn queue_data(&mut self, data: &[u8], sent: &mut usize) {
        while *sent < data.len() {
            let window = self.conn_window.min(self.stream_window).max(0) as usize;
            let n = (data.len() - *sent).min(MAX_FRAME).min(window);
            if n == 0 {
                return;
            }
            let flags = if *sent + n == data.len() {
                END_STREAM
            } else {
                0
            };
            frame(
                &mut self.output,
                DATA,
                flags,
                STREAM,
                &data[*sent..*sent + n],
            );
            *sent += n;
            self.conn_window -= n as i64;
            self.stream_window -= n as i64;
        }
    }

    fn remaining(&self) -> Result<Duration, CallError> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(CallError::Deadline);
        }
        Ok(left)
    }

    fn io_error(e: io::Error) -> CallError {
        match e.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => CallError::Deadline,
            _ => broken(e.to_string()),
        }
    }

    fn send(&mut self) -> Result<(), CallError> {
        if self.output.is_empty() {
            return Ok(());
        }
        self.arm(false)?;
        self.stream
            .write_all(&self.output)
            .map_err(Call::io_error)?;
        self.output.clear();
        Ok(())
    }

    /// Reads the next frame: (type, flags, stream, payload).
    fn read_frame(&mut self) -> Result<(u8, u8, u32, Vec<u8>), CallError> {
        loop {
            if self.input.len() >= 9 {
                let h = &self.input[..9];
                let len = usize::from(h[0]) << 16 | usize::from(h[1]) << 8 | usize::from(h[2]);
                if len > MAX_FRAME {
                    return Err(broken(format!(
                        "ipoold sent a {len}-byte frame, over the 16384 allowed"
                    )));
                }
                if self.input.len() >= 9 + len {
                    let (kind, flags) = (h[3], h[4]);
                    let stream = u32::from_be_bytes([h[5], h[6], h[7], h[8]]) & 0x7fff_ffff;
                    let payload = self.input[9..9 + len].to_vec();
                    self.input.drain(..9 + len);
                    return Ok((kind, flags, stream, payload));
                }
            }
            self.send()?;
            self.arm(true)?;
            let mut buf = [0u8; 8192];
            let n = match self.stream.read(&mut buf) {
                Ok(0) => return Err(broken("ipoold closed the connection before it replied")),
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(Call::io_error(e)),
            };
            self.input.extend_from_slice(&buf[..n]);
        }
    }

    fn handle(
        &mut self,
        kind: u8,
        flags: u8,
        stream: u32,
        payload: &[u8],
        resp: &mut Response,
    ) -> Result<(), CallError> {
        if resp.block.is_some() && kind != CONTINUATION {
            return Err(broken("a header block was interrupted by another frame"));
        }
        match kind {
            DATA if stream == STREAM => {
                let data = unpad(flags, payload)?;
                if resp.body.len() + data.len() > RECV_LIMIT as usize {
                    return Err(broken("the reply is larger than 16 MiB"));
                }
                resp.body.extend_from_slice(data);
                resp.ended = flags & END_STREAM != 0;
            }
            HEADERS if stream == STREAM => {
                let mut fragment = unpad(flags, payload)?;
                if flags & PRIORITY != 0 {
                    fragment = fragment
                        .get(5..)
                        .ok_or_else(|| broken("a HEADERS frame too short for its priority"))?;
                }
                resp.block = Some((fragment.to_vec(), flags & END_STREAM != 0));
                if flags & END_HEADERS != 0 {
                    self.finish_block(resp)?;
                }
            }
            CONTINUATION => {
                let Some((block, _)) = resp.block.as_mut() else {
                    return Err(broken("a CONTINUATION frame without a header block"));
                };
                if stream != STREAM {
                    return Err(broken("a CONTINUATION frame on another stream"));
                }
                block.extend_from_slice(payload);
                if block.len() > MAX_HEADER_BLOCK {
                    return Err(broken("a header block over 64 KiB"));
                }
                if flags & END_HEADERS != 0 {
                    self.finish_block(resp)?;
                }
            }
            RST_STREAM if stream == STREAM => {
                let code = be32(payload).unwrap_or(0);
                return Err(broken(format!(
                    "ipoold reset the call (HTTP/2 error code {code})"
                )));
            }
            SETTINGS if flags & ACK == 0 => {
                if stream != 0 || !payload.len().is_multiple_of(6) {
                    return Err(broken("a malformed SETTINGS frame"));
                }
                for p in payload.chunks_exact(6) {
                    let id = u16::from_be_bytes([p[0], p[1]]);
                    let value = i64::from(u32::from_be_bytes([p[2], p[3], p[4], p[5]]));
                    if id == SETTINGS_INITIAL_WINDOW_SIZE {
                        self.stream_window += value - self.peer_initial_window;
                        self.peer_initial_window = value;
                    }
                }
                frame(&mut self.output, SETTINGS, ACK, 0, &[]);
            }
            PING if flags & ACK == 0 => {
                frame(&mut self.output, PING, ACK, 0, payload);
            }
            GOAWAY => {
                let last = be32(payload).unwrap_or(0) & 0x7fff_ffff;
                if last < STREAM {
                    return Err(broken(
                        "ipoold refused the call (GOAWAY before it started; shutting down?)",
                    ));
                }
                // The call was taken: its reply may still come.
            }
            WINDOW_UPDATE => {
                let inc = i64::from(be32(payload).unwrap_or(0) & 0x7fff_ffff);
                match stream {
                    0 => self.conn_window += inc,
                    STREAM => self.stream_window += inc,
                    _ => {}
                }
            }
            PUSH_PROMISE => return Err(broken("a PUSH_PROMISE, though push is disabled")),
            // PRIORITY, SETTINGS and PING acknowledgements, frames of other streams, and
            // unknown types carry nothing for this call.
            _ => {}
        }
        Ok(())
    }

    fn finish_block(&mut self, resp: &mut Response) -> Result<(), CallError> {
        let (block, ends) = resp.block.take().expect("a block in progress");
        let mut fields = Vec::new();
        self.hpack
            .decode(&block, &mut fields)
            .map_err(|e| broken(format!("cannot decode the reply's headers: {e}")))?;
        resp.fields.extend(fields.into_iter().map(|(n, v)| {
            (
                String::from_utf8_lossy(&n).into_owned(),
                String::from_utf8_lossy(&v).into_owned(),
            )
        }));
        resp.ended |= ends;
        Ok(())
    }
}

fn be32(p: &[u8]) -> Option<u32> {
    Some(u32::from_be_bytes(p.get(..4)?.try_into().ok()?))
}

/// The payload of a DATA or HEADERS frame without its padding.
fn unpad(flags: u8, payload: &[u8]) -> Result<&[u8], CallError> {
    if flags & PADDED == 0 {
        return Ok(payload);
    }
    let (&pad, rest) = payload
        .split_first()
        .ok_or_else(|| broken("a padded frame without its pad length"))?;
    rest.len()
        .checked_sub(usize::from(pad))
        .map(|end| &rest[..end])
        .ok_or_else(|| broken("a frame's padding is longer than the frame"))
}

/// The gRPC outcome of a finished stream.
fn reply(resp: &Response) -> Result<Reply, CallError> {
    let status = resp.field(":status").unwrap_or("");
    if status != "200" {
        // The gRPC over HTTP/2 mapping of HTTP statuses.
        let code = match status {
            "400" => 13,
            "401" => 16,
            "403" => 7,
            "404" => 12,
            "429" | "502" | "503" | "504" => 14,
            _ => 2,
        };
        return Ok(Reply {
            code,
            message: format!("HTTP status {status:?} from ipoold"),
            body: Vec::new(),
        });
    }
    let Some(code) = resp.field("grpc-status") else {
        return Err(broken("the reply ended without a grpc-status"));
    };
    let code = code
        .parse::<i32>()
        .map_err(|_| broken(format!("grpc-status {code:?} is not a number")))?;
    let message = percent_decode(resp.field("grpc-message").unwrap_or(""));
    if code != 0 {
        return Ok(Reply {
            code,
            message,
            body: Vec::new(),
        });
    }
    let b = &resp.body;
    match b.first() {
        Some(0) => {}
        Some(_) => {
            return Err(broken(
                "ipoold sent a compressed reply, which was not asked for",
            ))
        }
        None => return Err(broken("the reply has status OK but no message")),
    }
    let len = b.get(1..5).and_then(be32).map(|l| l as usize);
    if len != Some(b.len().saturating_sub(5)) {
        return Err(broken(format!(
            "the reply is not one gRPC message ({} bytes, length prefix {len:?})",
            b.len()
        )));
    }
    Ok(Reply {
        code,
        message,
        body: b[5..].to_vec(),
    })
}

/// `grpc-message` is percent-encoded UTF-8; a `%` not followed by two hex digits stays as is.
fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        if b[i] == b'%' && i + 2 < b.len() {
            if let (Some(h), Some(l)) = (hex(b[i + 1]), hex(b[i + 2])) {
                out.push((h * 16 + l) as u8);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

mod hpack;

#[cfg(test)]
mod tests;
