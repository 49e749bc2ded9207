//! etcd's v3 API over tonic: the calls cluster mode makes (KV range, put, delete, txn; lease
//! grant, revoke, keep-alive, time to live), generated from `proto/etcd/*.proto` by protox, so
//! the build needs no system protoc.
//!
//! - Several endpoints: the client talks to one at a time. A connection that cannot be made
//!   moves on to the next endpoint within the same call; a call that fails for want of a
//!   working connection (unavailable, deadline, transport) drops the connection, and the next
//!   call starts from the next endpoint. A failed call is never sent again by the client: a
//!   write whose answer was lost is ambiguous, and may still be applied later: the caller
//!   settles it by a write it must come after (see `EtcdStore::settle`), not by a read.
//! - Every call has a deadline (`timeout`), sent to etcd as `grpc-timeout` too.
//! - TLS: the CA that signed etcd's certificate, and a client certificate when etcd asks.
//! - Every answer's header is watched: an etcd whose cluster id changed, or whose revision is
//!   below one seen before the request was sent (restored from an older backup), counts as
//!   reset ([`EtcdClient::resets`]); what this node knew of it may no longer hold. So does
//!   one whose witness of this node's last write is older than that write (see
//!   [`super::witness`]: the other nodes' writes since the restore can hide it from the
//!   revision).
//! - Every request goes through the [`Limiter`](crate::cluster::limiter::Limiter) when one is set (`store_rate`, `store_burst`):
//!   it waits for a token, except an urgent client's (the heartbeat), which takes one anyway.
//! - Requests sent and bytes received are counted ([`EtcdClient::stats`]); reads that can grow
//!   with a pool are paged ([`EtcdClient::range_paged`]).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ipool_proto::etcd::etcdserverpb as pb;
use pb::{kv_client::KvClient, lease_client::LeaseClient, watch_client::WatchClient};
use tokio::time::Instant;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use crate::cluster::limiter::Limiter;

use super::witness::{Shown, Witness};

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
    /// Not applied: etcd was found reset (restored from an older backup), and this node's
    /// writes wait until it has read again what it knew.
    #[error("etcd was reset: {0}")]
    Reset(String),
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
            // Refused by this client until the node read again what it knew.
            EtcdError::Connect(_) | EtcdError::Timeout(_) | EtcdError::Reset(_) => true,
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
            EtcdError::Reset(_) => false,
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
    /// This handle's requests never wait for the limiter (they take a token anyway).
    urgent: bool,
}

/// What a client has sent and received so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    pub requests: u64,
    /// Encoded size of the answers (protobuf), not counting gRPC and HTTP/2 framing.
    pub bytes: u64,
}

struct Inner {
    transport: Arc<dyn Transport>,
    timeout: Duration,
    history: std::sync::Mutex<History>,
    limiter: Option<Arc<Limiter>>,
    requests: AtomicU64,
    bytes: AtomicU64,
    witness: Witness,
}

/// What the answers' headers said so far.
#[derive(Default)]
struct History {
    cluster_id: u64,
    revision: i64,
    resets: u64,
    last_reset: Option<String>,
}

/// One call to etcd, as the client sends it.
#[derive(Clone, Debug)]
pub enum Call {
    Range(pb::RangeRequest),
    Put(pb::PutRequest),
    DeleteRange(pb::DeleteRangeRequest),
    Txn(pb::TxnRequest),
    LeaseGrant(pb::LeaseGrantRequest),
    LeaseRevoke(pb::LeaseRevokeRequest),
    /// One renewal (the first answer of a keep-alive stream).
    LeaseKeepAlive(pb::LeaseKeepAliveRequest),
    LeaseTimeToLive(pb::LeaseTimeToLiveRequest),
}

/// etcd's answer to a [`Call`] of the same kind.
#[derive(Clone, Debug)]
pub enum Reply {
    Range(pb::RangeResponse),
    Put(pb::PutResponse),
    DeleteRange(pb::DeleteRangeResponse),
    Txn(pb::TxnResponse),
    LeaseGrant(pb::LeaseGrantResponse),
    LeaseRevoke(pb::LeaseRevokeResponse),
    LeaseKeepAlive(pb::LeaseKeepAliveResponse),
    LeaseTimeToLive(pb::LeaseTimeToLiveResponse),
}

impl Reply {
    /// etcd's response header, and whether its revision is that of the keys (a lease
    /// answer's is not: its cluster id is all it says).
    fn header(&self) -> Option<(&pb::ResponseHeader, bool)> {
        let (h, keys) = match self {
            Reply::Range(r) => (r.header.as_ref(), true),
            Reply::Put(r) => (r.header.as_ref(), true),
            Reply::DeleteRange(r) => (r.header.as_ref(), true),
            Reply::Txn(r) => (r.header.as_ref(), true),
            Reply::LeaseGrant(r) => (r.header.as_ref(), false),
            Reply::LeaseRevoke(r) => (r.header.as_ref(), false),
            Reply::LeaseKeepAlive(r) => (r.header.as_ref(), false),
            Reply::LeaseTimeToLive(r) => (r.header.as_ref(), false),
        };
        if !keys && crate::bugs::on(crate::bugs::Bug::LeaseHeadersIgnored) {
            return None;
        }
        h.map(|h| (h, keys))
    }

    fn encoded_len(&self) -> usize {
        use prost::Message;
        match self {
            Reply::Range(r) => r.encoded_len(),
            Reply::Put(r) => r.encoded_len(),
            Reply::DeleteRange(r) => r.encoded_len(),
            Reply::Txn(r) => r.encoded_len(),
            Reply::LeaseGrant(r) => r.encoded_len(),
            Reply::LeaseRevoke(r) => r.encoded_len(),
            Reply::LeaseKeepAlive(r) => r.encoded_len(),
            Reply::LeaseTimeToLive(r) => r.encoded_len(),
        }
    }
}

/// What carries a [`Call`] to etcd and its [`Reply`] back, by `deadline` ([`EtcdError::Timeout`]
/// past it): gRPC over tonic to the endpoints ([`EtcdClient::new`]), or the simulation's
/// in-memory etcd. A call that fails is never sent again by the transport.
#[async_trait::async_trait]
pub trait Transport: Send + Sync {
    async fn call(&self, call: Call, deadline: Instant) -> Result<Reply, EtcdError>;
    /// A watch made as `create` asks (created by `deadline`): etcd's answers as they come,
    /// until the stream breaks. Only gRPC's transport watches.
    async fn watch(
        &self,
        _create: pb::WatchCreateRequest,
        _deadline: Instant,
    ) -> Result<Watching, EtcdError> {
        Err(EtcdError::Connect("this transport does not watch".into()))
    }
}

/// The answers of one watch ([`Transport::watch`]).
pub type Watching = futures::stream::BoxStream<'static, Result<pb::WatchResponse, EtcdError>>;

/// gRPC over tonic: one endpoint at a time, the next after a failure (see the module).
struct Tonic {
    endpoints: Vec<Endpoint>,
    timeout: Duration,
    /// The endpoint in use and its connection.
    conn: tokio::sync::Mutex<Option<(usize, Channel)>>,
    /// The endpoint the next connection starts from.
    next: AtomicUsize,
}

impl EtcdClient {
    /// A client of `endpoints` (`http://IP:PORT`, or `https://` with `tls`); every call is
    /// bounded by `timeout`. Connects when first called.
    pub fn new(
        endpoints: &[String],
        tls: Option<&TlsFiles>,
        timeout: Duration,
        limiter: Option<Arc<Limiter>>,
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
        let transport = Arc::new(Tonic {
            endpoints,
            timeout,
            conn: tokio::sync::Mutex::new(None),
            next: AtomicUsize::new(0),
        });
        Ok(EtcdClient::with_transport(transport, timeout, limiter))
    }

    /// A client whose calls go through `transport`, each bounded by `timeout`.
    pub fn with_transport(
        transport: Arc<dyn Transport>,
        timeout: Duration,
        limiter: Option<Arc<Limiter>>,
    ) -> EtcdClient {
        EtcdClient {
            inner: Arc::new(Inner {
                transport,
                timeout,
                history: Default::default(),
                limiter,
                requests: AtomicU64::new(0),
                bytes: AtomicU64::new(0),
                witness: Default::default(),
            }),
            urgent: false,
        }
    }

    /// A handle on the same connection whose requests never wait for the limiter (they take
    /// a token all the same): the heartbeat's, which a burst of claims must not delay into a
    /// fence.
    pub fn urgent(&self) -> EtcdClient {
        EtcdClient {
            inner: self.inner.clone(),
            urgent: true,
        }
    }

    /// The limiter every request goes through, if any.
    pub fn limiter(&self) -> Option<&Arc<Limiter>> {
        self.inner.limiter.as_ref()
    }

    /// Requests sent and bytes received so far.
    pub fn stats(&self) -> Stats {
        Stats {
            requests: self.inner.requests.load(Ordering::Relaxed),
            bytes: self.inner.bytes.load(Ordering::Relaxed),
        }
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
    /// was sent: a linearizable answer cannot be older. A lease answer (`keys` false) says
    /// only its cluster id: a heartbeat notices an etcd made anew as soon as a read would.
    fn observe(&self, floor: i64, header: &pb::ResponseHeader, keys: bool) {
        let mut h = self.inner.history.lock().expect("history lock");
        let mut reset = None;
        let revision = if keys { header.revision } else { 0 };
        if crate::bugs::on(crate::bugs::Bug::ResetUndetected) {
            h.revision = h.revision.max(revision);
            return;
        }
        if h.cluster_id != 0 && header.cluster_id != 0 && header.cluster_id != h.cluster_id {
            reset = Some(format!(
                "etcd's cluster id changed from {:x} to {:x} (a cluster made anew, from a backup?)",
                h.cluster_id, header.cluster_id
            ));
        } else if revision > 0 && revision < floor {
            reset = Some(format!(
                "etcd's revision went back from {floor} to {revision} (restored from an older backup?)"
            ));
        }
        if header.cluster_id != 0 {
            h.cluster_id = header.cluster_id;
        }
        match reset {
            Some(why) => {
                drop(h);
                self.reset_seen(why, Some(revision));
            }
            None => h.revision = h.revision.max(revision),
        }
    }

    /// Runs one call within the deadline, through the limiter; the answer's header observed.
    async fn run(&self, call: Call) -> Result<Reply, EtcdError> {
        if let Some(l) = &self.inner.limiter {
            l.acquire(self.urgent).await;
        }
        let deadline = Instant::now() + self.inner.timeout;
        let floor = self.revision_seen();
        self.inner.requests.fetch_add(1, Ordering::Relaxed);
        let r = self.inner.transport.call(call, deadline).await;
        if let Ok(answer) = &r {
            self.inner
                .bytes
                .fetch_add(answer.encoded_len() as u64, Ordering::Relaxed);
            if let Some((h, keys)) = answer.header() {
                self.observe(floor, h, keys);
            }
        }
        r
    }

    /// Reads `req`'s range (with the witness, once this node wrote: see [`Witness`]).
    pub async fn range(&self, req: pb::RangeRequest) -> Result<pb::RangeResponse, EtcdError> {
        match self.inner.witness.range(req) {
            Err(req) => match self.run(Call::Range(req)).await? {
                Reply::Range(r) => Ok(r),
                other => Err(mismatch("range", &other)),
            },
            Ok((t, marked)) => Ok(Witness::range_answer(self.witnessed(t, marked).await?)),
        }
    }

    /// Every key of `req`'s range, read in pages of `page` keys (each page one request, the
    /// next starting after the last key read): no answer grows with the range. The pages are
    /// read at the first page's revision, so they agree.
    pub async fn range_paged(
        &self,
        mut req: pb::RangeRequest,
        page: i64,
    ) -> Result<Vec<ipool_proto::etcd::mvccpb::KeyValue>, EtcdError> {
        req.limit = page;
        let mut out = Vec::new();
        loop {
            let r = self.range(req.clone()).await?;
            if req.revision == 0 {
                req.revision = r.header.as_ref().map_or(0, |h| h.revision);
            }
            let more = r.more;
            if let Some(last) = r.kvs.last() {
                let mut next = last.key.clone();
                next.push(0);
                req.key = next;
            }
            out.extend(r.kvs);
            if !more {
                return Ok(out);
            }
        }
    }

    pub async fn put(&self, req: pb::PutRequest) -> Result<pb::PutResponse, EtcdError> {
        match self.run(Call::Put(req)).await? {
            Reply::Put(r) => Ok(r),
            other => Err(mismatch("put", &other)),
        }
    }

    pub async fn delete_range(
        &self,
        req: pb::DeleteRangeRequest,
    ) -> Result<pb::DeleteRangeResponse, EtcdError> {
        match self.run(Call::DeleteRange(req)).await? {
            Reply::DeleteRange(r) => Ok(r),
            other => Err(mismatch("delete_range", &other)),
        }
    }

    /// Runs `req`; each branch that writes also puts the witness, once one is set.
    /// Runs `req`, with the witness (see [`Witness`]): the answer is `req`'s.
    pub async fn txn(&self, mut req: pb::TxnRequest) -> Result<pb::TxnResponse, EtcdError> {
        let marked = self.inner.witness.mark(&mut req);
        self.witnessed(req, marked).await
    }

    /// Runs `t`, sent with the witness as `marked` says; takes in what the witness shows.
    async fn witnessed(
        &self,
        t: pb::TxnRequest,
        marked: super::witness::Marked,
    ) -> Result<pb::TxnResponse, EtcdError> {
        let resets = self.resets().0;
        let mut r = match self.run(Call::Txn(t)).await? {
            Reply::Txn(r) => r,
            other => return Err(mismatch("txn", &other)),
        };
        // Counted unless the answer's header already showed the reset.
        let seen = |why: String| {
            if self.resets().0 == resets {
                self.reset_seen(why.clone(), None);
            }
            why
        };
        match self.inner.witness.answered(&marked, &mut r) {
            Shown::Fine => {}
            Shown::Reset(why) => {
                seen(why);
            }
            Shown::Refused(why) => return Err(EtcdError::Reset(seen(why))),
        }
        self.inner.witness.wrote(&marked, &r);
        Ok(r)
    }

    /// From now on every transaction that writes puts `key` too, with this daemon's
    /// `instance`: this client's witness (see [`super::witness`]).
    pub fn set_witness(&self, key: impl Into<Vec<u8>>, instance: &str) {
        self.inner
            .witness
            .set(key.into(), instance.as_bytes().to_vec());
    }

    fn reset_seen(&self, why: String, revision: Option<i64>) {
        let mut h = self.inner.history.lock().expect("history lock");
        tracing::error!(%why, "etcd was reset: what this node knew of it is read again");
        h.resets += 1;
        h.last_reset = Some(why);
        // Writes before the reset witness nothing now.
        self.inner.witness.forget();
        if let Some(r) = revision {
            h.revision = r;
        }
    }

    /// A lease of `ttl_secs`.
    /// A watch as `create` asks, once etcd created it (counted as one request; its answers'
    /// bytes are not counted).
    pub async fn watch(&self, create: pb::WatchCreateRequest) -> Result<Watching, EtcdError> {
        self.inner.requests.fetch_add(1, Ordering::Relaxed);
        let deadline = Instant::now() + self.inner.timeout;
        self.inner.transport.watch(create, deadline).await
    }

    pub async fn lease_grant(&self, ttl_secs: i64) -> Result<pb::LeaseGrantResponse, EtcdError> {
        let req = pb::LeaseGrantRequest {
            ttl: ttl_secs,
            id: 0,
        };
        match self.run(Call::LeaseGrant(req)).await? {
            Reply::LeaseGrant(r) => Ok(r),
            other => Err(mismatch("lease_grant", &other)),
        }
    }

    pub async fn lease_revoke(&self, id: i64) -> Result<pb::LeaseRevokeResponse, EtcdError> {
        match self
            .run(Call::LeaseRevoke(pb::LeaseRevokeRequest { id }))
            .await?
        {
            Reply::LeaseRevoke(r) => Ok(r),
            other => Err(mismatch("lease_revoke", &other)),
        }
    }

    /// Renews lease `id` once: its new TTL (0 or less: the lease is gone).
    pub async fn lease_keep_alive(&self, id: i64) -> Result<pb::LeaseKeepAliveResponse, EtcdError> {
        match self
            .run(Call::LeaseKeepAlive(pb::LeaseKeepAliveRequest { id }))
            .await?
        {
            Reply::LeaseKeepAlive(r) => Ok(r),
            other => Err(mismatch("lease_keep_alive", &other)),
        }
    }

    /// Lease `id`'s remaining TTL (-1: gone).
    pub async fn lease_time_to_live(
        &self,
        id: i64,
    ) -> Result<pb::LeaseTimeToLiveResponse, EtcdError> {
        let req = pb::LeaseTimeToLiveRequest { id, keys: false };
        match self.run(Call::LeaseTimeToLive(req)).await? {
            Reply::LeaseTimeToLive(r) => Ok(r),
            other => Err(mismatch("lease_time_to_live", &other)),
        }
    }
}

/// A transport that answered a call with another kind of answer.
fn mismatch(call: &str, got: &Reply) -> EtcdError {
    EtcdError::Status(tonic::Status::internal(format!(
        "the transport answered {call} with {}",
        match got {
            Reply::Range(_) => "a range answer",
            Reply::Put(_) => "a put answer",
            Reply::DeleteRange(_) => "a delete answer",
            Reply::Txn(_) => "a txn answer",
            Reply::LeaseGrant(_) => "a lease grant answer",
            Reply::LeaseRevoke(_) => "a lease revoke answer",
            Reply::LeaseKeepAlive(_) => "a keep-alive answer",
            Reply::LeaseTimeToLive(_) => "a lease TTL answer",
        }
    )))
}

impl Tonic {
    /// The connection in use, or a new one: the endpoints are tried in turn from the one
    /// after the last that failed, until `deadline`.
    async fn channel(&self, deadline: Instant) -> Result<(usize, Channel), EtcdError> {
        let mut conn = self.conn.lock().await;
        if let Some(c) = conn.as_ref() {
            return Ok(c.clone());
        }
        let n = self.endpoints.len();
        let first = self.next.load(Ordering::Relaxed);
        let mut why = Vec::new();
        for i in 0..n {
            let at = (first + i) % n;
            let endpoint = &self.endpoints[at];
            match tokio::time::timeout_at(deadline, endpoint.connect()).await {
                Ok(Ok(ch)) => {
                    self.next.store(at, Ordering::Relaxed);
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
                    self.next.store((at + 1) % n, Ordering::Relaxed);
                    break;
                }
            }
        }
        Err(EtcdError::Connect(why.join("; ")))
    }

    /// Forgets connection `at` after a failure on it: the next call connects anew, starting
    /// from the next endpoint.
    async fn failed(&self, at: usize) {
        let mut conn = self.conn.lock().await;
        if conn.as_ref().is_some_and(|(i, _)| *i == at) {
            *conn = None;
            self.next
                .store((at + 1) % self.endpoints.len(), Ordering::Relaxed);
        }
    }
}

#[async_trait::async_trait]
impl Transport for Tonic {
    async fn call(&self, call: Call, deadline: Instant) -> Result<Reply, EtcdError> {
        let (at, ch) = self.channel(deadline).await?;
        let left = deadline.saturating_duration_since(Instant::now());
        let sent = async move {
            Ok::<_, tonic::Status>(match call {
                Call::Range(r) => Reply::Range(
                    KvClient::new(ch)
                        .range(request(r, left))
                        .await?
                        .into_inner(),
                ),
                Call::Put(r) => {
                    Reply::Put(KvClient::new(ch).put(request(r, left)).await?.into_inner())
                }
                Call::DeleteRange(r) => Reply::DeleteRange(
                    KvClient::new(ch)
                        .delete_range(request(r, left))
                        .await?
                        .into_inner(),
                ),
                Call::Txn(r) => {
                    Reply::Txn(KvClient::new(ch).txn(request(r, left)).await?.into_inner())
                }
                Call::LeaseGrant(r) => Reply::LeaseGrant(
                    LeaseClient::new(ch)
                        .lease_grant(request(r, left))
                        .await?
                        .into_inner(),
                ),
                Call::LeaseRevoke(r) => Reply::LeaseRevoke(
                    LeaseClient::new(ch)
                        .lease_revoke(request(r, left))
                        .await?
                        .into_inner(),
                ),
                Call::LeaseKeepAlive(r) => {
                    let once = tokio_stream::once(r);
                    let mut replies = LeaseClient::new(ch)
                        .lease_keep_alive(request(once, left))
                        .await?
                        .into_inner();
                    Reply::LeaseKeepAlive(replies.message().await?.ok_or_else(|| {
                        tonic::Status::unavailable("the keep-alive stream ended without an answer")
                    })?)
                }
                Call::LeaseTimeToLive(r) => Reply::LeaseTimeToLive(
                    LeaseClient::new(ch)
                        .lease_time_to_live(request(r, left))
                        .await?
                        .into_inner(),
                ),
            })
        };
        let r = match tokio::time::timeout_at(deadline, sent).await {
            Ok(Ok(r)) => Ok(r),
            Ok(Err(s)) => Err(EtcdError::Status(s)),
            Err(_) => Err(EtcdError::Timeout(self.timeout)),
        };
        if let Err(e) = &r {
            if e.drops_connection() {
                self.failed(at).await;
            }
        }
        r
    }

    async fn watch(
        &self,
        create: pb::WatchCreateRequest,
        deadline: Instant,
    ) -> Result<Watching, EtcdError> {
        self.watch_stream(create, deadline).await
    }
}

impl Tonic {
    /// [`Transport::watch`] over gRPC: no deadline on the stream (the channel's keep-alive
    /// finds a dead connection); the request side stays open as long as the answers are read.
    async fn watch_stream(
        &self,
        create: pb::WatchCreateRequest,
        deadline: Instant,
    ) -> Result<Watching, EtcdError> {
        use futures::StreamExt;
        let (at, ch) = self.channel(deadline).await?;
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        let first = pb::WatchRequest {
            request_union: Some(pb::watch_request::RequestUnion::CreateRequest(create)),
        };
        tx.send(first)
            .await
            .map_err(|_| EtcdError::Connect("the watch's request stream closed".into()))?;
        let mut client = WatchClient::new(ch);
        let mut req = tonic::Request::new(tokio_stream::wrappers::ReceiverStream::new(rx));
        // As etcd's own client asks (WithRequireLeader): a member cut off from the leader
        // cancels the watch instead of falling silent, so no change is missed unknowingly
        // (the heartbeat relies on it: it reads the name back only when the watch is off).
        req.metadata_mut().insert(
            "hasleader",
            tonic::metadata::MetadataValue::from_static("true"),
        );
        let opened = client.watch(req);
        let answers = match tokio::time::timeout_at(deadline, opened).await {
            Ok(Ok(r)) => r.into_inner(),
            Ok(Err(s)) => {
                let e = EtcdError::Status(s);
                if e.drops_connection() {
                    self.failed(at).await;
                }
                return Err(e);
            }
            Err(_) => return Err(EtcdError::Timeout(self.timeout)),
        };
        Ok(answers
            .map(move |r| {
                let _open = &tx;
                r.map_err(EtcdError::Status)
            })
            .boxed())
    }
}

fn request<T>(msg: T, timeout: Duration) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    r.set_timeout(timeout);
    r
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod header_tests;
