//! The TCP Ops listener's guard: at most [`MAX_TCP_CONNECTIONS`] connections at once (the
//! rest wait in the kernel's backlog, holding none of the daemon's descriptors), and a
//! connection that sends nothing for [`IDLE`] is closed: one that never finishes its TLS or
//! HTTP/2 handshake, or a peer that is gone. A live client always sends within it: the server
//! pings every [`PING_EVERY`] and a client answers each ping.
//!
//! Whatever happens here, the Unix socket (the CNI path) is served apart: its own listener,
//! its own connections.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio_io_timeout::TimeoutStream;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::server::{Connected, TcpConnectInfo};

/// Most TCP Ops connections served at once.
pub const MAX_TCP_CONNECTIONS: usize = 256;
/// Calls (HTTP/2 streams) one TCP connection may have open at once.
pub const MAX_STREAMS: u32 = 32;
/// A connection that sends nothing for this long is closed.
pub const IDLE: Duration = Duration::from_secs(20);
/// How often the server pings each HTTP/2 connection (a client answers each ping).
pub const PING_EVERY: Duration = Duration::from_secs(10);

/// An accepted TCP connection that holds one of the listener's slots until it is closed.
pub struct Guarded {
    stream: Pin<Box<TimeoutStream<TcpStream>>>,
    _slot: OwnedSemaphorePermit,
}

/// The listener's connections, at most `max` at once, each closed after `idle` without a read.
/// The accepting task ends when the server drops the stream.
pub fn incoming(
    listener: std::net::TcpListener,
    max: usize,
    idle: Duration,
) -> ReceiverStream<io::Result<Guarded>> {
    let (tx, rx) = mpsc::channel(1);
    tokio::spawn(async move {
        let listener = match listener
            .set_nonblocking(true)
            .and_then(|()| TcpListener::from_std(listener))
        {
            Ok(l) => l,
            Err(e) => {
                let _ = tx.send(Err(e)).await;
                return;
            }
        };
        let slots = Arc::new(Semaphore::new(max));
        loop {
            let Ok(slot) = slots.clone().acquire_owned().await else {
                return; // never closed
            };
            let tcp = loop {
                match listener.accept().await {
                    Ok((tcp, _)) => break tcp,
                    // Out of descriptors, or the peer gave up before the accept: wait a little
                    // instead of spinning, and go on.
                    Err(e) => {
                        tracing::warn!(error = %e, "accepting a TCP Ops connection failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }
            };
            let _ = tcp.set_nodelay(true);
            let mut stream = TimeoutStream::new(tcp);
            stream.set_read_timeout(Some(idle));
            let guarded = Guarded {
                stream: Box::pin(stream),
                _slot: slot,
            };
            if tx.send(Ok(guarded)).await.is_err() {
                return;
            }
        }
    });
    ReceiverStream::new(rx)
}

impl Connected for Guarded {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.stream.get_ref().connect_info()
    }
}

impl AsyncRead for Guarded {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        self.stream.as_mut().poll_read(cx, buf)
    }
}

impl AsyncWrite for Guarded {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.stream.as_mut().poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.stream.as_mut().poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.stream.as_mut().poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.stream.as_mut().poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}
