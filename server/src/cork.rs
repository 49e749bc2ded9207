//! The Unix socket's connections: control frames the server writes on their own wait for the
//! reply, so a plugin call gets one write instead of three.
//!
//! A plugin call is one connection, one request, one reply. Left alone, hyper's HTTP/2 server
//! writes three times on it: its SETTINGS when the connection is accepted, the acknowledgement
//! of the plugin's SETTINGS with a WINDOW_UPDATE once the request has been read, then the
//! reply. Each write wakes the plugin, which finds no reply and sleeps again; on the machine
//! the benchmark ran on, the plugin woke on the daemon's own core and preempted it twice per
//! call. [`Corked`] keeps frames that carry no stream's data (SETTINGS, PING, WINDOW_UPDATE)
//! back until a frame of a stream (HEADERS, DATA, RST_STREAM, GOAWAY, ...) is written, and then
//! sends everything in one `writev`; a held frame waits at most [`HOLD`], so a client that waits
//! for the server's SETTINGS before it sends (grpc-go does) waits that long once, and flow
//! control is never stuck.
//!
//! hyper asks for a flush after every batch of frames; while frames are held, a flush reports
//! success at once (the frames are the writer's to send) and arms the deadline, whose timer
//! wakes the connection's task: its next flush sends them.

use std::future::Future;
use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::UnixStream;
use tokio::time::Sleep;
use tonic::transport::server::{Connected, UdsConnectInfo};

/// The longest a control frame waits for a stream's frame to go out with.
pub const HOLD: Duration = Duration::from_millis(1);

/// More held bytes than this are sent without waiting (a peer flooding PINGs, say).
const HOLD_MAX: usize = 4096;

/// HTTP/2 frame types that belong to no stream's exchange of data.
const SETTINGS: u8 = 0x4;
const PING: u8 = 0x6;
const WINDOW_UPDATE: u8 = 0x8;
/// Where a frame header holds the frame's type.
const TYPE_AT: usize = 3;

/// A connection accepted on the Unix socket.
pub struct Corked {
    io: UnixStream,
    /// Control frames written and not sent yet.
    held: Vec<u8>,
    scan: FrameScan,
    /// When the held frames go out even without a stream's frame.
    deadline: Option<Pin<Box<Sleep>>>,
}

impl Corked {
    pub fn new(io: UnixStream) -> Corked {
        Corked {
            io,
            held: Vec::new(),
            scan: FrameScan::default(),
            deadline: None,
        }
    }

    /// Sends the held frames.
    fn poll_push(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while !self.held.is_empty() {
            let n = std::task::ready!(Pin::new(&mut self.io).poll_write(cx, &self.held))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.held.drain(..n);
        }
        self.deadline = None;
        Poll::Ready(Ok(()))
    }
}

impl Connected for Corked {
    type ConnectInfo = UdsConnectInfo;

    /// The peer's credentials (the CNI service checks its uid); not its address, which for a
    /// client is unnamed and would cost a `getpeername` per connection.
    fn connect_info(&self) -> UdsConnectInfo {
        UdsConnectInfo {
            peer_addr: None,
            peer_cred: self.io.peer_cred().ok(),
        }
    }
}

impl AsyncRead for Corked {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for Corked {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.poll_write_vectored(cx, &[IoSlice::new(buf)])
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        let mut ahead = this.scan;
        let stream_frame = bufs.iter().any(|b| ahead.feed(b));
        if !stream_frame && this.held.len() + total <= HOLD_MAX {
            for b in bufs {
                this.held.extend_from_slice(b);
            }
            this.scan = ahead;
            if this.deadline.is_none() && !this.held.is_empty() {
                this.deadline = Some(Box::pin(tokio::time::sleep(HOLD)));
            }
            return Poll::Ready(Ok(total));
        }
        loop {
            if this.held.is_empty() {
                let n = std::task::ready!(Pin::new(&mut this.io).poll_write_vectored(cx, bufs))?;
                this.scan.advance(bufs, n);
                return Poll::Ready(Ok(n));
            }
            // The held bytes and the first few of `bufs` (h2 passes one or two), with no
            // allocation; a write of fewer buffers than offered is a partial write.
            let mut slices = [IoSlice::new(&[]); 8];
            let take = bufs.len().min(slices.len() - 1);
            slices[0] = IoSlice::new(&this.held);
            slices[1..=take].copy_from_slice(&bufs[..take]);
            let n = std::task::ready!(
                Pin::new(&mut this.io).poll_write_vectored(cx, &slices[..=take])
            )?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            let from_held = n.min(this.held.len());
            this.held.drain(..from_held);
            if this.held.is_empty() {
                this.deadline = None;
                if n > from_held {
                    this.scan.advance(bufs, n - from_held);
                    return Poll::Ready(Ok(n - from_held));
                }
            }
        }
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if let Some(deadline) = &mut this.deadline {
            if deadline.as_mut().poll(cx).is_pending() {
                return Poll::Ready(Ok(()));
            }
        }
        std::task::ready!(this.poll_push(cx))?;
        Pin::new(&mut this.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        std::task::ready!(self.poll_push(cx))?;
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// Where the frames begin in the bytes the server writes.
#[derive(Clone, Copy, Debug, Default)]
struct FrameScan {
    header: [u8; 9],
    /// Bytes of the next frame's header seen so far.
    have: usize,
    /// Bytes of the current frame's payload still to come.
    payload: usize,
    /// The current frame, once its type is known, is a stream's.
    stream: bool,
}

impl FrameScan {
    /// Moves over `bytes`; true if some of them belong to a frame that is not a control frame
    /// (from its type byte on).
    fn feed(&mut self, mut bytes: &[u8]) -> bool {
        let mut stream_frame = false;
        while !bytes.is_empty() {
            if self.payload > 0 {
                let k = self.payload.min(bytes.len());
                self.payload -= k;
                bytes = &bytes[k..];
                stream_frame |= self.stream;
                continue;
            }
            let k = (self.header.len() - self.have).min(bytes.len());
            self.header[self.have..self.have + k].copy_from_slice(&bytes[..k]);
            // The type is the header's fourth byte: known as soon as that byte is.
            if self.have + k > TYPE_AT {
                self.stream = !matches!(self.header[TYPE_AT], SETTINGS | PING | WINDOW_UPDATE);
                stream_frame |= self.stream;
            }
            self.have += k;
            bytes = &bytes[k..];
            if self.have == self.header.len() {
                self.have = 0;
                let [a, b, c, ..] = self.header;
                self.payload = usize::from(a) << 16 | usize::from(b) << 8 | usize::from(c);
            }
        }
        stream_frame
    }

    /// Moves over the first `n` bytes of `bufs`.
    fn advance(&mut self, bufs: &[IoSlice<'_>], mut n: usize) {
        for b in bufs {
            let k = n.min(b.len());
            self.feed(&b[..k]);
            n -= k;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::poll_fn;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let len = u32::try_from(payload.len()).expect("short");
        let mut f = len.to_be_bytes()[1..].to_vec();
        f.push(kind);
        f.push(flags);
        f.extend_from_slice(&stream.to_be_bytes());
        f.extend_from_slice(payload);
        f
    }

    /// A corked connection and its peer, which [`readable_now`] reads without waiting.
    fn pair() -> (Corked, std::os::unix::net::UnixStream) {
        let (a, peer) = std::os::unix::net::UnixStream::pair().expect("pair");
        a.set_nonblocking(true).expect("nonblocking");
        peer.set_nonblocking(true).expect("nonblocking");
        (
            Corked::new(UnixStream::from_std(a).expect("register")),
            peer,
        )
    }

    /// What the peer can read right now.
    fn readable_now(mut peer: &std::os::unix::net::UnixStream) -> Vec<u8> {
        let mut buf = vec![0u8; 64 << 10];
        match std::io::Read::read(&mut peer, &mut buf) {
            Ok(n) => buf[..n].to_vec(),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Vec::new(),
            Err(e) => panic!("reading the peer: {e}"),
        }
    }

    #[tokio::test]
    async fn control_frames_wait_for_the_reply_and_go_out_with_it_in_one_write() {
        let (mut c, peer) = pair();
        let settings = frame(SETTINGS, 0, 0, &[0, 3, 0, 0, 0, 100]);
        let ack_and_window = [
            frame(SETTINGS, 1, 0, &[]),
            frame(WINDOW_UPDATE, 0, 0, &[0, 1, 0, 0]),
        ]
        .concat();
        c.write_all(&settings).await.expect("write");
        c.flush().await.expect("flush");
        c.write_all(&ack_and_window).await.expect("write");
        c.flush().await.expect("flush");
        assert!(
            readable_now(&peer).is_empty(),
            "control frames went out alone"
        );

        let reply = [frame(0x1, 0x4, 1, b"headers"), frame(0x0, 0x1, 1, b"data")].concat();
        c.write_all(&reply).await.expect("write");
        c.flush().await.expect("flush");
        let got = readable_now(&peer);
        assert_eq!(
            got,
            [settings, ack_and_window, reply].concat(),
            "one read, in order"
        );
    }

    #[tokio::test]
    async fn held_frames_go_out_after_the_hold_without_a_reply() {
        let (a, mut peer) = UnixStream::pair().expect("pair");
        let mut c = Corked::new(a);
        let settings = frame(SETTINGS, 0, 0, &[0, 4, 0, 1, 0, 0]);
        c.write_all(&settings).await.expect("write");
        // The connection's task: flushes whenever it is woken, as hyper does, until the frames
        // are out.
        let flusher = tokio::spawn(async move {
            poll_fn(|cx| {
                let _ = Pin::new(&mut c).poll_flush(cx);
                if c.held.is_empty() {
                    Poll::Ready(())
                } else {
                    Poll::Pending
                }
            })
            .await;
            c
        });
        let mut got = vec![0u8; settings.len()];
        tokio::time::timeout(HOLD * 100, peer.read_exact(&mut got))
            .await
            .expect("the held SETTINGS arrived after the hold")
            .expect("read");
        assert_eq!(got, settings);
        flusher.await.expect("flusher");
    }

    #[tokio::test]
    async fn a_frame_header_split_across_writes_is_still_recognised() {
        let (mut c, peer) = pair();
        let bytes = [
            frame(PING, 0, 0, &[7; 8]),
            frame(0x3, 0, 5, &[0, 0, 0, 8]), // RST_STREAM
        ]
        .concat();
        // One byte per write: the RST_STREAM's type byte is the 21st.
        for (i, b) in bytes.iter().enumerate() {
            c.write_all(std::slice::from_ref(b)).await.expect("write");
            c.flush().await.expect("flush");
            let got = readable_now(&peer);
            if i < 17 + 3 {
                assert!(
                    got.is_empty(),
                    "sent at byte {i}, before the RST_STREAM's type"
                );
            } else if i == 17 + 3 {
                assert_eq!(
                    got,
                    bytes[..=i],
                    "the held bytes and the type byte, together"
                );
            } else {
                assert_eq!(
                    got,
                    [bytes[i]],
                    "once a stream frame has begun, bytes pass through"
                );
            }
        }
    }

    #[tokio::test]
    async fn shutdown_sends_what_is_held() {
        let (a, mut peer) = UnixStream::pair().expect("pair");
        let mut c = Corked::new(a);
        let ping_ack = frame(PING, 1, 0, &[1; 8]);
        c.write_all(&ping_ack).await.expect("write");
        c.shutdown().await.expect("shutdown");
        let mut got = Vec::new();
        peer.read_to_end(&mut got).await.expect("read");
        assert_eq!(got, ping_ack);
    }

    #[test]
    fn the_scan_follows_payload_lengths() {
        let mut s = FrameScan::default();
        // A SETTINGS frame whose payload happens to contain bytes that look like a HEADERS
        // frame's header: only real frame boundaries count.
        let fake = frame(0x1, 0x4, 1, &[]);
        assert!(!s.feed(&frame(SETTINGS, 0, 0, &fake)));
        assert!(!s.feed(&frame(WINDOW_UPDATE, 0, 0, &[0, 0, 1, 0])));
        assert!(s.feed(&frame(0x0, 0x1, 3, &[0; 300])));
        assert!(!s.feed(&frame(PING, 1, 0, &[0; 8])));
    }
}
