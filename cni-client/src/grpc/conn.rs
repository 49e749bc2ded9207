//! The call: connecting to the socket without blocking past the deadline, then one write and
//! a loop of reads and frames (SETTINGS, PING, flow control, header blocks) until the stream
//! ends.

use std::io::{self, Read};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use super::frames::*;
use super::hpack;
use super::reply::{reply, Response};
use super::{broken, CallError, Reply};

/// The one stream this client opens.
pub(super) const STREAM: u32 = 1;
/// Every window's size before SETTINGS or WINDOW_UPDATE change it.
const DEFAULT_WINDOW: i64 = 65_535;
/// The largest frame either side may send without SETTINGS_MAX_FRAME_SIZE (which this client
/// neither sends nor needs to raise).
pub(super) const MAX_FRAME: usize = 16_384;
/// What the daemon may send on the stream and the connection: our SETTINGS raise the stream's
/// window to this and a WINDOW_UPDATE raises the connection's. A bigger reply is an error (the
/// plugin's replies are a few hundred bytes).
const RECV_LIMIT: u32 = 16 << 20;
/// The most header-block bytes accepted for one block (it decodes to at most
/// `hpack::MAX_LIST_SIZE`, announced in our SETTINGS).
const MAX_HEADER_BLOCK: usize = 64 << 10;
/// The most header blocks accepted on the stream: a gRPC reply has headers and trailers (or
/// trailers only); HTTP allows informational (1xx) blocks before them.
const MAX_HEADER_BLOCKS: usize = 4;

/// Connects without blocking past `deadline`: a daemon that is alive but not accepting leaves
/// a full listen backlog, where a blocking connect would wait for as long as it takes.
pub(super) fn connect(path: &Path, deadline: Instant) -> Result<UnixStream, CallError> {
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

pub(super) struct Call {
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

impl Call {
    pub(super) fn new(stream: UnixStream, deadline: Instant) -> Call {
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

    pub(super) fn run(mut self, method: &str, message: &[u8]) -> Result<Reply, CallError> {
        let len = u32::try_from(message.len())
            .map_err(|_| broken("the request is over 4 GiB"))?
            .to_be_bytes();
        // The gRPC message: uncompressed flag, length, protobuf.
        let mut data = Vec::with_capacity(5 + message.len());
        data.push(0);
        data.extend_from_slice(&len);
        data.extend_from_slice(message);

        self.output.extend_from_slice(PREFACE);
        let mut settings = Vec::with_capacity(18);
        for (id, value) in [
            (SETTINGS_ENABLE_PUSH, 0u32),
            (SETTINGS_INITIAL_WINDOW_SIZE, RECV_LIMIT),
            (SETTINGS_MAX_HEADER_LIST_SIZE, hpack::MAX_LIST_SIZE as u32),
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

    /// Writes what is queued, with MSG_NOSIGNAL: a daemon that has closed the connection makes
    /// the write fail with EPIPE (a broken call, CNI error 11) instead of raising SIGPIPE,
    /// which would end the plugin without a CNI error (its C `main` leaves SIGPIPE at its
    /// default action, see main.rs). std's `UnixStream` writes pass the flag only since
    /// rust-lang/rust#140005 (2025); the workspace's rust-version is older, so it is passed
    /// here. Same syscall as `write_all`, one `sendto` per write.
    fn send(&mut self) -> Result<(), CallError> {
        let mut at = 0;
        while at < self.output.len() {
            self.arm(false)?;
            match socket2::SockRef::from(&self.stream)
                .send_with_flags(&self.output[at..], libc::MSG_NOSIGNAL)
            {
                Ok(0) => return Err(broken("ipoold stopped taking the request")),
                Ok(n) => at += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(Call::io_error(e)),
            }
        }
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
                resp.blocks += 1;
                if resp.blocks > MAX_HEADER_BLOCKS {
                    return Err(broken(format!(
                        "more than {MAX_HEADER_BLOCKS} header blocks in the reply"
                    )));
                }
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
