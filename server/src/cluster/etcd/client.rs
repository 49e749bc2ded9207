//! etcd's v3 API over tonic: the calls cluster mode makes (KV range, put, delete, txn; lease
//! grant, revoke, keep-alive, time to live), generated from `proto/etcd/*.proto` by protox, so
//! the build needs no system protoc.
//!
//! - Several endpoints: the client talks to one at a time. A connection that cannot be made
//!   moves on to the next endpoint within the same call; a call that fails for want of a
//!   working connection (unavailable, deadline, transport) drops the connection, and the next
//!   call starts from the next endpoint. A failed call is never sent again by the client: a
//!   write whose answer was lost is ambiguous, and the caller settles it (by reading).
//! - Every call has a deadline (`timeout`), sent to etcd as `grpc-timeout` too.
//! - TLS: the CA that signed etcd's certificate, and a client certificate when etcd asks.
//! - Every answer's header is watched: an etcd whose cluster id changed, or whose revision is
//!   below one seen before the request was sent (restored from an older backup), counts as
//!   reset ([`EtcdClient::resets`]); what this node knew of it may no longer hold.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ipool_proto::etcd::etcdserverpb as pb;
use pb::{kv_client::KvClient, lease_client::LeaseClient};
use tokio::time::Instant;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

/// What a failed etcd call says.
#[derive(Debug, thiserror::Error)]
pub enum EtcdError {
    /// etcd answered with an error status (or the connection failed mid-call).
    #[error("{}", describe_status(.0))]
    Status(tonic::Status),
    /// No endpoint could be connected to.
    #[error("cannot connect: {0}")]
    Connect(String),
    /// No answer within the call's deadline.
    #[error("no answer within {0:?}")]
    Timeout(Duration),
}

fn describe_status(s: &tonic::Status) -> String {
    let mut out = format!("{:?}: {}", s.code(), s.message());
    let mut src = std::error::Error::source(s);
    while let Some(e) = src {
        out.push_str(&format!(": {e}"));
        src = e.source();
    }
    out
}

impl EtcdError {
    /// etcd could not be used (no connection, no answer, or this client refused), as opposed
    /// to etcd answering the request no.
    pub fn is_unreachable(&self) -> bool {
        use tonic::Code;
        match self {
            EtcdError::Connect(_) | EtcdError::Timeout(_) => true,
            EtcdError::Status(s) => matches!(
                s.code(),
                Code::Unavailable
                    | Code::DeadlineExceeded
                    | Code::Unknown
                    | Code::Cancelled
                    | Code::Unauthenticated
                    | Code::PermissionDenied
            ),
        }
    }

    /// The connection this failure came over is not worth keeping.
    fn drops_connection(&self) -> bool {
        use tonic::Code;
        match self {
            EtcdError::Connect(_) | EtcdError::Timeout(_) => true,
            EtcdError::Status(s) => matches!(
                s.code(),
                Code::Unavailable | Code::DeadlineExceeded | Code::Unknown | Code::Cancelled
            ),
        }
    }
}

/// TLS towards etcd: the CA that signed its server certificate (ipool's image has no system
/// roots), and this node's client identity when etcd asks for one. PEM.
#[derive(Clone, Debug, Default)]
pub struct TlsFiles {
    pub ca: Option<Vec<u8>>,
    pub identity: Option<(Vec<u8>, Vec<u8>)>,
}

impl TlsFiles {
    fn config(&self) -> ClientTlsConfig {
        let mut c = ClientTlsConfig::new();
        if let Some(ca) = &self.ca {
            c = c.ca_certificate(Certificate::from_pem(ca));
        }
        if let Some((cert, key)) = &self.identity {
            c = c.identity(Identity::from_pem(cert, key));
        }
        c
    }
}

/// A client of one etcd cluster. Cheap to clone: clones share the connection.
#[derive(Clone)]
pub struct EtcdClient {
    inner: Arc<Inner>,
}

struct Inner {
    endpoints: Vec<Endpoint>,
    timeout: Duration,
    /// The endpoint in use and its connection.
    conn: tokio::sync::Mutex<Option<(usize, Channel)>>,
    /// The endpoint the next connection starts from.
    next: AtomicUsize,
    history: std::sync::Mutex<History>,
}

/// What the answers' headers said so far.
#[derive(Default)]
struct History {
    cluster_id: u64,
    revision: i64,
    resets: u64,
    last_reset: Option<String>,
}

/// An answer that carries etcd's response header (KV answers do; lease answers are left out:
/// their revision is not that of the keys).
pub trait Answer {
    fn header(&self) -> Option<&pb::ResponseHeader> {
        None
    }
}

macro_rules! kv_answer {
    ($($t:ty),*) => {$(
        impl Answer for $t {
            fn header(&self) -> Option<&pb::ResponseHeader> {
                self.header.as_ref()
            }
        }
    )*};
}
kv_answer!(
    pb::RangeResponse,
    pb::PutResponse,
    pb::DeleteRangeResponse,
    pb::TxnResponse
);
impl Answer for pb::LeaseGrantResponse {}
impl Answer for pb::LeaseRevokeResponse {}
impl Answer for pb::LeaseKeepAliveResponse {}
impl Answer for pb::LeaseTimeToLiveResponse {}

impl EtcdClient {
    /// A client of `endpoints` (`http://IP:PORT`, or `https://` with `tls`); every call is
    /// bounded by `timeout`. Connects when first called.
    pub fn new(
        endpoints: &[String],
        tls: Option<&TlsFiles>,
        timeout: Duration,
    ) -> Result<EtcdClient, EtcdError> {
        if endpoints.is_empty() {
            return Err(EtcdError::Connect("no endpoint given".into()));
        }
        let endpoints = endpoints
            .iter()
            .map(|url| {
                let mut e = Endpoint::from_shared(url.clone())
                    .map_err(|e| EtcdError::Connect(format!("endpoint {url:?}: {e}")))?
                    .connect_timeout(timeout)
                    .timeout(timeout)
                    .tcp_nodelay(true)
                    .http2_keep_alive_interval(Duration::from_secs(10))
                    .keep_alive_timeout(timeout)
                    .keep_alive_while_idle(true);
                if url.starts_with("https://") {
                    e = e
                        .tls_config(tls.cloned().unwrap_or_default().config())
                        .map_err(|e| EtcdError::Connect(format!("endpoint {url:?}: {e}")))?;
                }
                Ok(e)
            })
            .collect::<Result<Vec<_>, EtcdError>>()?;
        Ok(EtcdClient {
            inner: Arc::new(Inner {
                endpoints,
                timeout,
                conn: tokio::sync::Mutex::new(None),
                next: AtomicUsize::new(0),
                history: Default::default(),
            }),
        })
    }

    /// Each call's deadline.
    pub fn timeout(&self) -> Duration {
        self.inner.timeout
    }

    /// How many times etcd was found reset (another cluster id, or its revision gone back),
    /// and what was seen the last time.
    pub fn resets(&self) -> (u64, Option<String>) {
        let h = self.inner.history.lock().expect("history lock");
        (h.resets, h.last_reset.clone())
    }

    fn revision_seen(&self) -> i64 {
        self.inner.history.lock().expect("history lock").revision
    }

    /// Takes in an answer's header; `floor` is the highest revision seen before the request
    /// was sent: a linearizable answer cannot be older.
    fn observe(&self, floor: i64, header: &pb::ResponseHeader) {
        let mut h = self.inner.history.lock().expect("history lock");
        let mut reset = None;
        if h.cluster_id != 0 && header.cluster_id != 0 && header.cluster_id != h.cluster_id {
            reset = Some(format!(
                "etcd's cluster id changed from {:x} to {:x} (a cluster made anew, from a backup?)",
                h.cluster_id, header.cluster_id
            ));
        } else if header.revision > 0 && header.revision < floor {
            reset = Some(format!(
                "etcd's revision went back from {floor} to {} (restored from an older backup?)",
                header.revision
            ));
        }
        if header.cluster_id != 0 {
            h.cluster_id = header.cluster_id;
        }
        match reset {
            Some(why) => {
                tracing::error!(%why, "etcd was reset: what this node knew of it is read again");
                h.resets += 1;
                h.last_reset = Some(why);
                h.revision = header.revision;
            }
            None => h.revision = h.revision.max(header.revision),
        }
    }

    /// The connection in use, or a new one: the endpoints are tried in turn from the one
    /// after the last that failed, until `deadline`.
    async fn channel(&self, deadline: Instant) -> Result<(usize, Channel), EtcdError> {
        let mut conn = self.inner.conn.lock().await;
        if let Some(c) = conn.as_ref() {
            return Ok(c.clone());
        }
        let n = self.inner.endpoints.len();
        let first = self.inner.next.load(Ordering::Relaxed);
        let mut why = Vec::new();
        for i in 0..n {
            let at = (first + i) % n;
            let endpoint = &self.inner.endpoints[at];
            match tokio::time::timeout_at(deadline, endpoint.connect()).await {
                Ok(Ok(ch)) => {
                    self.inner.next.store(at, Ordering::Relaxed);
                    *conn = Some((at, ch.clone()));
                    return Ok((at, ch));
                }
                Ok(Err(e)) => {
                    let mut text = format!("{}: {e}", endpoint.uri());
                    let mut src = std::error::Error::source(&e);
                    while let Some(s) = src {
                        text.push_str(&format!(": {s}"));
                        src = s.source();
                    }
                    why.push(text);
                }
                Err(_) => {
                    why.push(format!("{}: no connection in time", endpoint.uri()));
                    self.inner.next.store((at + 1) % n, Ordering::Relaxed);
                    break;
                }
            }
        }
        Err(EtcdError::Connect(why.join("; ")))
    }

    /// Forgets connection `at` after a failure on it: the next call connects anew, starting
    /// from the next endpoint.
    async fn failed(&self, at: usize) {
        let mut conn = self.inner.conn.lock().await;
        if conn.as_ref().is_some_and(|(i, _)| *i == at) {
            *conn = None;
            self.inner
                .next
                .store((at + 1) % self.inner.endpoints.len(), Ordering::Relaxed);
        }
    }

    /// Runs one call on the connection in use, within the deadline.
    async fn run<T: Answer, F, Fut>(&self, f: F) -> Result<T, EtcdError>
    where
        F: FnOnce(Channel, Duration) -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let timeout = self.inner.timeout;
        let deadline = Instant::now() + timeout;
        let floor = self.revision_seen();
        let (at, ch) = self.channel(deadline).await?;
        let left = deadline.saturating_duration_since(Instant::now());
        let r = match tokio::time::timeout_at(deadline, f(ch, left)).await {
            Ok(Ok(r)) => Ok(r.into_inner()),
            Ok(Err(s)) => Err(EtcdError::Status(s)),
            Err(_) => Err(EtcdError::Timeout(timeout)),
        };
        match &r {
            Ok(answer) => {
                if let Some(h) = answer.header() {
                    self.observe(floor, h);
                }
            }
            Err(e) if e.drops_connection() => self.failed(at).await,
            Err(_) => {}
        }
        r
    }

    pub async fn range(&self, req: pb::RangeRequest) -> Result<pb::RangeResponse, EtcdError> {
        self.run(|ch, left| async move { KvClient::new(ch).range(request(req, left)).await })
            .await
    }

    pub async fn put(&self, req: pb::PutRequest) -> Result<pb::PutResponse, EtcdError> {
        self.run(|ch, left| async move { KvClient::new(ch).put(request(req, left)).await })
            .await
    }

    pub async fn delete_range(
        &self,
        req: pb::DeleteRangeRequest,
    ) -> Result<pb::DeleteRangeResponse, EtcdError> {
        self.run(|ch, left| async move { KvClient::new(ch).delete_range(request(req, left)).await })
            .await
    }

    pub async fn txn(&self, req: pb::TxnRequest) -> Result<pb::TxnResponse, EtcdError> {
        self.run(|ch, left| async move { KvClient::new(ch).txn(request(req, left)).await })
            .await
    }

    /// A lease of `ttl_secs`.
    pub async fn lease_grant(&self, ttl_secs: i64) -> Result<pb::LeaseGrantResponse, EtcdError> {
        let req = pb::LeaseGrantRequest {
            ttl: ttl_secs,
            id: 0,
        };
        self.run(
            |ch, left| async move { LeaseClient::new(ch).lease_grant(request(req, left)).await },
        )
        .await
    }

    pub async fn lease_revoke(&self, id: i64) -> Result<pb::LeaseRevokeResponse, EtcdError> {
        let req = pb::LeaseRevokeRequest { id };
        self.run(
            |ch, left| async move { LeaseClient::new(ch).lease_revoke(request(req, left)).await },
        )
        .await
    }

    /// Renews lease `id` once: its new TTL (0 or less: the lease is gone).
    pub async fn lease_keep_alive(&self, id: i64) -> Result<pb::LeaseKeepAliveResponse, EtcdError> {
        self.run(|ch, left| async move {
            let once = tokio_stream::once(pb::LeaseKeepAliveRequest { id });
            let mut replies = LeaseClient::new(ch)
                .lease_keep_alive(request(once, left))
                .await?
                .into_inner();
            let first = replies.message().await?.ok_or_else(|| {
                tonic::Status::unavailable("the keep-alive stream ended without an answer")
            })?;
            Ok(tonic::Response::new(first))
        })
        .await
    }

    /// Lease `id`'s remaining TTL (-1: gone).
    pub async fn lease_time_to_live(
        &self,
        id: i64,
    ) -> Result<pb::LeaseTimeToLiveResponse, EtcdError> {
        let req = pb::LeaseTimeToLiveRequest { id, keys: false };
        self.run(|ch, left| async move {
            LeaseClient::new(ch)
                .lease_time_to_live(request(req, left))
                .await
        })
        .await
    }
}

fn request<T>(msg: T, timeout: Duration) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    r.set_timeout(timeout);
    r
}

#[cfg(test)]
mod tests {
    use super::super::request::get;
    use super::*;

    #[tokio::test]
    async fn no_endpoint_is_an_error_and_bad_urls_are_named() {
        assert!(EtcdClient::new(&[], None, Duration::from_secs(1)).is_err());
        let e = EtcdClient::new(&["not a url".into()], None, Duration::from_secs(1))
            .err()
            .expect("refused");
        assert!(e.to_string().contains("not a url"), "{e}");
    }

    #[tokio::test]
    async fn unreachable_endpoints_are_each_named_and_count_as_unreachable() {
        // Two closed loopback ports: both are tried within the one call.
        let ports: Vec<u16> = (0..2)
            .map(|_| {
                std::net::TcpListener::bind("127.0.0.1:0")
                    .expect("bind")
                    .local_addr()
                    .expect("addr")
                    .port()
            })
            .collect();
        let urls: Vec<String> = ports
            .iter()
            .map(|p| format!("http://127.0.0.1:{p}"))
            .collect();
        let c = EtcdClient::new(&urls, None, Duration::from_secs(2)).expect("client");
        let e = c.range(get("k")).await.expect_err("no etcd there");
        assert!(e.is_unreachable(), "{e}");
        for p in ports {
            assert!(e.to_string().contains(&p.to_string()), "{e}");
        }
    }
}
