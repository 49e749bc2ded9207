//! The simulated network between the nodes (and the operator's `ipoolctl`) and the store.
//!
//! Every request a store client sends waits in one queue ([`Net`]) until the simulation's
//! driver decides what becomes of it: delivered (applied, answered), failed (not applied, an
//! error answered), applied with its answer lost (the caller sees an error: it cannot know),
//! dropped (never applied; the caller waits out its deadline), or delivered after its caller
//! gave up (applied late, the answer going nowhere). A node whose connection is cut gets an
//! error at once for every request it sends.
//!
//! Two kinds of client go through it, each the real one: etcd's [`EtcdClient`] over
//! [`EtcdWire`] (a [`Transport`]), and a real `kube::Client` over [`ApiWire`] (a tower
//! service speaking HTTP requests and responses, bodies as the client writes and reads them).
//! A watch is made by a request through the queue too; once made, it is one of the open
//! [`Watches`], which hear only when the driver says.
//!
//! [`EtcdClient`]: ipool_server::cluster::etcd::client::EtcdClient

use std::collections::{BTreeSet, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use ipool_proto::etcd::etcdserverpb as pb;
use ipool_server::cluster::etcd::client::{Call, EtcdError, Reply, Transport, Watching};
use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::watch::{ApiStream, EtcdStream, Watches};

/// What a request carries.
#[derive(Clone, Debug)]
pub enum Wire {
    Etcd(Call),
    /// etcd's Watch: the create request.
    EtcdWatch(pb::WatchCreateRequest),
    /// An HTTP request to the apiserver: method, path, query, body.
    Api {
        method: String,
        path: String,
        query: String,
        body: Bytes,
    },
}

impl Wire {
    /// Records its conditions in `c`, and takes out the one `c` drops (`crate::conditions`);
    /// `current` finds the `resourceVersion` the apiserver holds now for a path.
    pub fn drop_condition(
        &mut self,
        c: &mut crate::conditions::Conditions,
        current: impl Fn(&str) -> Option<String>,
    ) {
        match self {
            Wire::Etcd(Call::Txn(t)) => c.apply_txn(t),
            Wire::Api {
                method, path, body, ..
            } => c.apply_api(method, path, body, current),
            _ => {}
        }
    }

    /// What it is conditioned on, if it is a conditioned write (`crate::rivals`).
    pub fn conditioned_on(&self) -> crate::rivals::Keys {
        match self {
            Wire::Etcd(Call::Txn(t)) => crate::rivals::txn_conditioned_on(t),
            Wire::Api {
                method, path, body, ..
            } => crate::rivals::api_conditioned_on(method, path, body),
            _ => crate::rivals::Keys::default(),
        }
    }

    /// What it writes, if it is delivered (`crate::rivals`).
    pub fn written(&self) -> crate::rivals::Keys {
        match self {
            Wire::Etcd(c) => crate::rivals::call_writes(c),
            Wire::Api {
                method, path, body, ..
            } => crate::rivals::api_writes(method, path, body),
            Wire::EtcdWatch(_) => crate::rivals::Keys::default(),
        }
    }
}

/// What comes back.
#[derive(Debug)]
pub enum Back {
    Etcd(Result<Reply, EtcdError>),
    /// A watch made, or refused.
    EtcdWatch(Result<EtcdStream, EtcdError>),
    /// The HTTP status and body, or a broken connection.
    Api(Result<(u16, Bytes), String>),
    /// An apiserver watch made: its body, as it streams.
    ApiWatch(ApiStream),
}

/// A request on its way.
pub struct Request {
    pub id: u64,
    /// Who sent it: a node's index, or an operator's command ([`operator`]).
    pub from: usize,
    pub sent: Instant,
    pub wire: Wire,
    /// It was held on its way once already.
    pub held: bool,
    reply: oneshot::Sender<Back>,
}

/// `c` may write: a put, a delete, a transaction with one in a branch (a read sent as a
/// transaction, with the node's witness, writes nothing).
pub fn etcd_writes(c: &Call) -> bool {
    use pb::request_op::Request as Op;
    match c {
        Call::Txn(t) => t.success.iter().chain(&t.failure).any(|op| {
            matches!(
                op.request,
                Some(Op::RequestPut(_) | Op::RequestDeleteRange(_))
            )
        }),
        Call::Put(_) | Call::DeleteRange(_) => true,
        _ => false,
    }
}

impl Request {
    /// It writes (etcd's transactions with writes, puts and deletes; the apiserver's POST,
    /// PUT and DELETE).
    pub fn writes(&self) -> bool {
        match &self.wire {
            Wire::Etcd(c) => etcd_writes(c),
            Wire::EtcdWatch(_) => false,
            Wire::Api { method, .. } => method != "GET",
        }
    }

    /// Its caller still waits for the answer (it did not time out or stop).
    pub fn awaited(&self) -> bool {
        !self.reply.is_closed()
    }

    /// Answers it (no one hears it when the caller gave up).
    pub fn answer(self, back: Back) {
        let _ = self.reply.send(back);
    }

    /// Never answers it: its caller waits out its deadline.
    pub fn into_silence(self, limbo: &mut Vec<oneshot::Sender<Back>>) {
        limbo.push(self.reply);
    }
}

/// The operator's commands send as `OPERATOR - n` (the `n`th command), above every node.
pub const OPERATOR: usize = usize::MAX;

/// The sender of the operator's `n`th command.
pub fn operator(n: usize) -> usize {
    OPERATOR - n
}

/// The operator's command `from` sent for, if it is one of the operator's.
pub fn command_of(from: usize) -> Option<usize> {
    (from > OPERATOR / 2).then(|| OPERATOR - from)
}

#[derive(Default)]
struct State {
    pending: VecDeque<Request>,
    /// Requests held on the way (in a socket, at a slow member) until their time: then they
    /// are the next to arrive, their callers most likely gone.
    held: Vec<(Instant, Request)>,
    /// Conditioned writes parked until a rival's write touches what they are conditioned on
    /// (`crate::rivals`), or until their time.
    /// Each with the rivals' writes it waits for still (one or two).
    parked: Vec<(Instant, crate::rivals::Keys, Request, u8)>,
    next: u64,
    /// Senders whose connection is cut.
    cut: BTreeSet<usize>,
    /// Requests sent so far (cut ones too).
    sent: u64,
    /// When each sender last had a request refused (its connection cut).
    refused: std::collections::BTreeMap<usize, Instant>,
    watches: Watches,
}

/// The queue of requests on their way to the store.
#[derive(Clone, Default)]
pub struct Net(Arc<Mutex<State>>);

impl Net {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.0.lock().expect("net lock")
    }

    /// Sends `wire` from `from`; None when `from`'s connection is cut.
    pub fn send(&self, from: usize, wire: Wire) -> Option<oneshot::Receiver<Back>> {
        let mut s = self.lock();
        s.sent += 1;
        if s.cut.contains(&from) {
            s.refused.insert(from, Instant::now());
            return None;
        }
        let (tx, rx) = oneshot::channel();
        s.next += 1;
        let id = s.next;
        s.pending.push_back(Request {
            id,
            from,
            sent: Instant::now(),
            wire,
            held: false,
            reply: tx,
        });
        Some(rx)
    }

    /// The requests on their way that write: the ones worth holding.
    pub fn writes(&self) -> Vec<usize> {
        self.lock()
            .pending
            .iter()
            .enumerate()
            .filter(|(_, r)| r.writes())
            .map(|(i, _)| i)
            .collect()
    }

    /// Holds the `i`th request on its way until `until`.
    pub fn hold(&self, i: usize, until: Instant) {
        let mut s = self.lock();
        if let Some(mut r) = s.pending.remove(i) {
            r.held = true;
            s.held.push((until, r));
        }
    }

    /// Parks the `i`th request on its way until a write touching `on` is delivered, or until
    /// `until` (`crate::rivals`).
    /// `rivals`: how many rivals' writes it waits for (the second may be the one that does
    /// harm: a block released, then claimed by another node).
    pub fn park(&self, i: usize, on: crate::rivals::Keys, until: Instant, rivals: u8) {
        let mut s = self.lock();
        if let Some(mut r) = s.pending.remove(i) {
            r.held = true;
            s.parked.push((until, on, r, rivals.max(1)));
        }
    }

    /// A write touching `written` was delivered: the requests parked on it arrive next (oldest
    /// first); how many.
    pub fn rival_landed(&self, written: &crate::rivals::Keys) -> usize {
        let mut s = self.lock();
        if s.parked.is_empty() || written.is_empty() {
            return 0;
        }
        let mut met = Vec::new();
        for (until, on, r, left) in std::mem::take(&mut s.parked) {
            match (on.meets(written), left) {
                (true, 0 | 1) => met.push(r),
                (true, _) => s.parked.push((until, on, r, left - 1)),
                (false, _) => s.parked.push((until, on, r, left)),
            }
        }
        met.sort_by_key(|r| r.id);
        let n = met.len();
        for r in met.into_iter().rev() {
            s.pending.push_front(r);
        }
        n
    }

    /// What the `i`th request on its way is conditioned on, if it is a conditioned write
    /// never held or parked.
    pub fn conditioned(&self, i: usize) -> Option<crate::rivals::Keys> {
        let s = self.lock();
        let r = s.pending.get(i).filter(|r| !r.held)?;
        Some(r.wire.conditioned_on()).filter(|k| !k.is_empty())
    }

    /// The `i`th request on its way, in words.
    pub fn describe(&self, i: usize) -> String {
        match self.lock().pending.get(i).map(|r| &r.wire) {
            Some(Wire::Etcd(c)) => crate::describe::describe_call(c),
            Some(Wire::Api { method, path, .. }) => format!("{method} {path}"),
            Some(Wire::EtcdWatch(_)) => "a watch".into(),
            None => "?".into(),
        }
    }

    /// The operator's commands with a write on its way (pending, held or parked): one that
    /// failed may still land.
    pub fn commands_writing(&self) -> BTreeSet<usize> {
        let s = self.lock();
        let held = s.held.iter().map(|(_, r)| r);
        let parked = s.parked.iter().map(|(_, _, r, _)| r);
        s.pending
            .iter()
            .chain(held)
            .chain(parked)
            .filter(|r| r.writes())
            .filter_map(|r| command_of(r.from))
            .collect()
    }

    /// Writes parked for a rival (`crate::rivals`).
    pub fn parked(&self) -> usize {
        self.lock().parked.len()
    }

    /// The `i`th request on its way is an operator's write, never held yet.
    pub fn operators_unheld(&self, i: usize) -> bool {
        self.lock()
            .pending
            .get(i)
            .is_some_and(|r| command_of(r.from).is_some() && !r.held && r.writes())
    }

    /// Requests held until `now` or before arrive next (oldest hold first).
    pub fn release_held(&self, now: Instant) {
        let mut s = self.lock();
        let (due, parked): (Vec<_>, Vec<_>) =
            s.parked.drain(..).partition(|(t, _, _, _)| *t <= now);
        s.parked = parked;
        s.held.extend(due.into_iter().map(|(t, _, r, _)| (t, r)));
        if s.held.iter().all(|(t, _)| *t > now) {
            return;
        }
        let (mut due, rest): (Vec<_>, Vec<_>) = s.held.drain(..).partition(|(t, _)| *t <= now);
        s.held = rest;
        due.sort_by_key(|(t, r)| (*t, r.id));
        for (_, r) in due.into_iter().rev() {
            s.pending.push_front(r);
        }
    }

    /// Releases every held request at once (the end of a run).
    pub fn release_all(&self) {
        let far = Instant::now() + Duration::from_secs(1 << 30);
        self.release_held(far);
    }

    /// Requests on their way.
    pub fn len(&self) -> usize {
        self.lock().pending.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Takes the `i`th request on its way (oldest first).
    pub fn take(&self, i: usize) -> Option<Request> {
        self.lock().pending.remove(i)
    }

    /// The senders of the requests on their way, oldest first, and whether each is awaited.
    pub fn senders(&self) -> Vec<(usize, bool)> {
        self.lock()
            .pending
            .iter()
            .map(|r| (r.from, r.awaited()))
            .collect()
    }

    /// Cuts `from`'s connection, or heals it.
    pub fn set_cut(&self, from: usize, cut: bool) {
        let mut s = self.lock();
        match cut {
            true => s.cut.insert(from),
            false => s.cut.remove(&from),
        };
        if cut {
            s.watches.cut_from(Some(from));
        }
    }

    /// The open watches.
    pub fn watches<R>(&self, f: impl FnOnce(&mut Watches) -> R) -> R {
        f(&mut self.lock().watches)
    }

    pub fn is_cut(&self, from: usize) -> bool {
        self.lock().cut.contains(&from)
    }

    /// When `from` last had a request refused, and when its oldest request on its way was
    /// sent.
    pub fn troubles(&self, from: usize) -> (Option<Instant>, Option<Instant>) {
        let s = self.lock();
        let oldest = s
            .pending
            .iter()
            .chain(s.held.iter().map(|(_, r)| r))
            .chain(s.parked.iter().map(|(_, _, r, _)| r))
            .filter(|r| r.from == from)
            .map(|r| r.sent)
            .min();
        (s.refused.get(&from).copied(), oldest)
    }

    /// Requests sent so far.
    pub fn sent(&self) -> u64 {
        self.lock().sent
    }
}

/// etcd's calls of one sender, through the network (none once `alive` is false: a dead
/// process sends nothing).
pub struct EtcdWire {
    pub net: Net,
    pub from: usize,
    pub alive: Arc<AtomicBool>,
}

impl EtcdWire {
    /// Sends `wire` and waits for its answer until `deadline`: the answer, or what the caller
    /// sees instead (a dead process, a cut connection, a closed one, a timeout).
    async fn exchange(&self, wire: Wire, deadline: Instant) -> Result<Back, EtcdError> {
        let waited = deadline.saturating_duration_since(Instant::now());
        if !self.alive.load(Ordering::Relaxed) {
            return Err(EtcdError::Connect("simulated: a dead process".into()));
        }
        let Some(rx) = self.net.send(self.from, wire) else {
            return Err(EtcdError::Connect(
                "simulated: this node's connection to etcd is cut".into(),
            ));
        };
        match tokio::time::timeout_at(deadline, rx).await {
            Ok(Ok(back)) => Ok(back),
            Ok(Err(_)) => Err(EtcdError::Connect(
                "simulated: the connection was closed".into(),
            )),
            Err(_) => Err(EtcdError::Timeout(waited)),
        }
    }
}

#[async_trait::async_trait]
impl Transport for EtcdWire {
    async fn call(&self, call: Call, deadline: Instant) -> Result<Reply, EtcdError> {
        match self.exchange(Wire::Etcd(call), deadline).await? {
            Back::Etcd(r) => r,
            _ => Err(EtcdError::Connect(
                "simulated: another store's answer to an etcd call".into(),
            )),
        }
    }

    async fn watch(
        &self,
        create: pb::WatchCreateRequest,
        deadline: Instant,
    ) -> Result<Watching, EtcdError> {
        use futures::StreamExt;
        match self.exchange(Wire::EtcdWatch(create), deadline).await? {
            Back::EtcdWatch(r) => {
                r.map(|s| tokio_stream::wrappers::UnboundedReceiverStream::new(s).boxed())
            }
            _ => Err(EtcdError::Connect(
                "simulated: another answer to a watch".into(),
            )),
        }
    }
}

/// The apiserver's HTTP of one sender, through the network, as a tower service for a real
/// `kube::Client`; each request bounded by `timeout` (the client's read deadline).
#[derive(Clone)]
pub struct ApiWire {
    pub net: Net,
    pub from: usize,
    pub timeout: Duration,
    pub alive: Arc<AtomicBool>,
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl tower::Service<http::Request<kube::client::Body>> for ApiWire {
    type Response = http::Response<BoxBody<Bytes, BoxError>>;
    type Error = BoxError;
    type Future = futures::future::BoxFuture<'static, Result<Self::Response, BoxError>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<kube::client::Body>) -> Self::Future {
        let (net, from, timeout) = (self.net.clone(), self.from, self.timeout);
        let alive = self.alive.load(Ordering::Relaxed);
        Box::pin(async move {
            if !alive {
                return Err("simulated: a dead process".into());
            }
            let (parts, body) = req.into_parts();
            let body = body.collect().await?.to_bytes();
            let wire = Wire::Api {
                method: parts.method.to_string(),
                path: parts.uri.path().to_string(),
                query: parts.uri.query().unwrap_or_default().to_string(),
                body,
            };
            let Some(rx) = net.send(from, wire) else {
                return Err("simulated: the connection to the apiserver is cut".into());
            };
            let answer = |status: u16, body: BoxBody<Bytes, BoxError>| {
                http::Response::builder()
                    .status(status)
                    .header("content-type", "application/json")
                    .body(body)
            };
            match tokio::time::timeout(timeout, rx).await {
                Ok(Ok(Back::Api(Ok((status, body))))) => Ok(answer(
                    status,
                    Full::new(body).map_err(|never| match never {}).boxed(),
                )?),
                Ok(Ok(Back::ApiWatch(stream))) => {
                    use futures::StreamExt;
                    let frames = tokio_stream::wrappers::UnboundedReceiverStream::new(stream)
                        .map(|chunk| chunk.map(http_body::Frame::data).map_err(BoxError::from));
                    Ok(answer(200, BodyExt::boxed(StreamBody::new(frames)))?)
                }
                Ok(Ok(Back::Api(Err(e)))) => Err(e.into()),
                Ok(Ok(_)) => Err("simulated: an etcd answer to an HTTP request".into()),
                Ok(Err(_)) => Err("simulated: the connection was closed".into()),
                Err(_) => Err(format!("simulated: no answer within {timeout:?}").into()),
            }
        })
    }
}
