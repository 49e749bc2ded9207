//! This node in cluster mode: its name and the daemon instance that holds it, its store
//! connection (made when first needed, again after a failure), the limiter every store request
//! goes through (`store_rate`), whether the store answers, the pools it read, its index of blocks
//! made complete once, and the heartbeat that holds its name and fences it.
//!
//! The node *serves* (its sources may hand out addresses) only while this daemon holds the
//! node's name in the store and renewed its heartbeat within `fence_secs`. Each time it starts
//! to serve again (name taken, fence lifted, the store found reset), the serving [`epoch`] moves on,
//! and a source hands out nothing until it has synced its blocks within the new epoch.
//!
//! [`epoch`]: ClusterNode::serving
//!
//! # Layout
//! - `heartbeat`: the heartbeat that holds this node's name;
//! - [`pins`]: the pins this node knows (see [`crate::cluster::pin`]), by pool;
//! - [`pools`]: the pools as this node read them;
//! - [`watching`]: the store's watches of this node's blocks and of the pools, run for as long as
//!   the node runs, what they say taken in by its [`Heard`](crate::cluster::heard::Heard).

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use super::claim::Views;
use super::connect::{connector, Connector};
use super::datastore::{StoreHandle, Watched};
use super::etcd::Tls;
use super::heard::Heard;
use super::limiter::Limiter;
use super::vocab::{ClusterError, Heartbeat};
use crate::config::ClusterSettings;
use crate::metrics::Metrics;

/// Whether this daemon holds its node's name in the store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Identity {
    /// Not yet: the heartbeat's first start is on its way (None), or failed (why).
    Starting(Option<String>),
    /// This daemon holds it.
    Held,
    /// Another daemon (instance) holds it: this one serves nothing until that one's lease is
    /// gone.
    Taken { instance: String },
}

/// What the heartbeat knows.
struct Beat {
    identity: Identity,
    /// When the last renewal that succeeded was sent (a fence counts from there: the lease's
    /// TTL counts from the store's receipt, which is later).
    renewed: Option<Instant>,
    /// Moves on each time the node starts to serve again.
    epoch: u64,
    /// Store resets (etcd: see `EtcdClient::resets`) taken into the epoch.
    resets: u64,
    /// Since when the name is in doubt (a store reset seen: the restored store may show it
    /// held by another daemon, or by none); a renewal sent after that settles it.
    doubt: Option<Instant>,
    /// The watch of the node's name key is on (etcd; see [`Watched::NameWatch`]).
    name_watched: bool,
    /// Moves on with whatever the watch said of the name key (written, deleted, the watch
    /// made or broken): a renewal after it reads the key back.
    name_news: u64,
}

/// Why the node does not serve; `pending`: it is on its way to (the first start).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NotServing {
    pub why: String,
    pub pending: bool,
    /// The node is fenced (it has not renewed its heartbeat within its fence).
    pub fenced: bool,
}

pub struct ClusterNode {
    name: String,
    /// This daemon's instance: the id of its state dir.
    instance: String,
    settings: ClusterSettings,
    tls: Option<Tls>,
    /// Makes the store connection.
    connector: Connector,
    conn: tokio::sync::Mutex<Option<StoreHandle>>,
    /// The connection in use, for the checks made without waiting (see `serving`).
    current: Mutex<Option<StoreHandle>>,
    /// Every store request goes through it (`store_rate`, `store_burst`).
    limiter: Arc<Limiter>,
    /// The node's index of its blocks is complete (made so once, at start).
    index: tokio::sync::OnceCell<()>,
    /// Since when, and why, the store does not answer (None: the last call succeeded).
    down: Mutex<Option<(Instant, String)>>,
    /// Ready pools as last read (with the revision a claim is conditioned on).
    /// Each pool's reservations and whether it is disabled, as last read (of any phase; kept
    /// when the pool as read is forgotten: only a read changes them).
    policy: Mutex<HashMap<String, pools::Policy>>,
    /// This node's labels, for the pools' nodeSelectors; None: not known yet.
    labels: Mutex<Option<std::collections::BTreeMap<String, String>>>,
    /// Pool reads sent so far (each read's number orders what it found).
    pool_reads: std::sync::atomic::AtomicU64,
    /// This node's view of each pool's blocks, kept between claims (see `claim`).
    views: Views,
    beat: Mutex<Beat>,
    /// The heartbeat this daemon holds now (its leases, its Lease), to give up at a clean
    /// stop.
    held: Mutex<Option<Heartbeat>>,
    /// Keys (objects) that name no owner, from the last listing of each kind of each pool:
    /// by (pool, the listing was of the whole pool), then by key.
    malformed: Mutex<HashMap<(String, bool), std::collections::BTreeMap<String, String>>>,
    /// The identity's changes, for health.
    identity_changes: tokio::sync::watch::Sender<Identity>,
    /// Wakes the heartbeat to renew at once (a store reset seen).
    renew_now: tokio::sync::Notify,
    /// What the store's watches said (`[cluster] watch`).
    heard: Heard,
    /// The pins this node knows (see `pins`).
    pins: Mutex<pins::PinBook>,
    /// The name of this node's Node object, where the daemon knows it: recorded with its name
    /// in the store ([`super::vocab::Alive::k8s_node`]).
    k8s_node: std::sync::OnceLock<String>,
    metrics: Arc<Metrics>,
}

/// Why a node cannot start in cluster mode (its settings, its name, its TLS files): what to
/// fix, in words.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct InvalidNode(pub String);

/// A check of the settings' or the name's, in its words.
impl From<crate::model::Invalid> for InvalidNode {
    fn from(e: crate::model::Invalid) -> InvalidNode {
        InvalidNode(e.0)
    }
}

impl From<String> for InvalidNode {
    fn from(why: String) -> InvalidNode {
        InvalidNode(why)
    }
}

impl ClusterNode {
    /// Reads the TLS files (an unreadable one is an error now, not at the first claim).
    /// `instance` says which daemon this is (the same across restarts on one state dir).
    pub fn new(
        settings: ClusterSettings,
        name: String,
        instance: String,
        metrics: Arc<Metrics>,
    ) -> Result<Arc<ClusterNode>, InvalidNode> {
        ClusterNode::with_connector(settings, name, instance, metrics, connector())
    }

    /// [`ClusterNode::new`], its store connection made by `connector`.
    pub fn with_connector(
        settings: ClusterSettings,
        name: String,
        instance: String,
        metrics: Arc<Metrics>,
        connector: Connector,
    ) -> Result<Arc<ClusterNode>, InvalidNode> {
        settings.validate()?;
        ipool_proto::names::check_name("node name", &name)?;
        if settings.datastore == crate::config::cluster::DatastoreKind::Kubernetes {
            // It labels the node's blocks (ipool.io/node) and names its Lease.
            ipool_proto::names::check_kube_name(
                "node name",
                &name,
                ipool_proto::names::MAX_KUBE_LABELLED_NAME,
            )
            .map_err(|e| {
                format!("{e} (it labels the node's blocks and names its Lease): set another [cluster] node_name, or use datastore = \"etcd\"")
            })?;
        }
        let tls = Tls::read(
            settings.ca_file.as_deref(),
            settings
                .cert_file
                .as_deref()
                .zip(settings.key_file.as_deref()),
        )
        .map_err(|e| InvalidNode(e.to_string()))?;
        let tls = settings
            .etcd_endpoints
            .iter()
            .any(|e| e.starts_with("https://"))
            .then_some(tls);
        Ok(Arc::new(ClusterNode {
            limiter: Arc::new(Limiter::new(settings.store_rate, settings.store_burst)),
            index: tokio::sync::OnceCell::new(),
            name,
            instance,
            settings,
            tls,
            connector,
            conn: tokio::sync::Mutex::new(None),
            current: Mutex::new(None),
            down: Mutex::new(None),
            policy: Mutex::default(),
            pins: Mutex::default(),
            labels: Mutex::new(None),
            pool_reads: std::sync::atomic::AtomicU64::new(1),
            views: Views::default(),
            beat: Mutex::new(Beat {
                identity: Identity::Starting(None),
                renewed: None,
                epoch: 0,
                resets: 0,
                doubt: None,
                name_watched: false,
                name_news: 0,
            }),
            held: Mutex::new(None),
            malformed: Mutex::default(),
            identity_changes: tokio::sync::watch::Sender::new(Identity::Starting(None)),
            renew_now: tokio::sync::Notify::new(),
            heard: Heard::default(),
            k8s_node: std::sync::OnceLock::new(),
            metrics,
        }))
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn instance(&self) -> &str {
        &self.instance
    }

    /// Names this node's Node object (set once, before the heartbeat starts): the store
    /// records it with the node's name, and the release of departed nodes asks whether that
    /// Node is gone.
    pub fn set_k8s_node(&self, name: &str) {
        let _ = self.k8s_node.set(name.to_string());
    }

    /// This node's Node object's name, where it was given.
    pub fn k8s_node(&self) -> Option<&str> {
        self.k8s_node.get().map(String::as_str)
    }

    /// The store, as messages name it.
    pub fn store_name(&self) -> &'static str {
        match self.settings.datastore {
            crate::config::cluster::DatastoreKind::Etcd => "etcd",
            crate::config::cluster::DatastoreKind::Kubernetes => "the Kubernetes API",
        }
    }

    pub fn settings(&self) -> &ClusterSettings {
        &self.settings
    }

    /// This node's view of each pool's blocks, kept between its claims.
    pub fn views(&self) -> &Views {
        &self.views
    }

    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// The fence: how long after its last renewal the node stops handing out.
    pub fn fence(&self) -> Duration {
        Duration::from_secs(self.settings.fence())
    }

    /// When the store's rate limit (`store_rate`) made a request wait within the last minute:
    /// what status says about it.
    pub fn rate_note(&self) -> Option<String> {
        let (ago, took) = self.limiter.last_wait(Duration::from_secs(60))?;
        let (rate, burst) = self.limiter.rate();
        Some(format!(
            "store_rate: a request waited {} ms for a token {} s ago (store_rate {rate}/s, store_burst {burst})",
            took.as_millis(),
            ago.as_secs()
        ))
    }

    /// Makes this node's index of its blocks complete, once (see `EtcdStore::ensure_index`).
    pub async fn ensure_index(&self) -> Result<(), ClusterError> {
        self.index
            .get_or_try_init(|| async {
                let node = self.name.clone();
                let written = self
                    .call("ensure_index", |s| async move { s.ensure_index(&node).await })
                    .await?;
                if written > 0 {
                    tracing::info!(node = %self.name, blocks = written, "indexed this node's blocks (claimed by an older ipoold)");
                }
                Ok(())
            })
            .await
            .map(|_| ())
    }

    /// What the store's watches said so far.
    pub fn heard(&self) -> &Heard {
        &self.heard
    }

    /// Takes in what a watch said: a pool written is read again at its next use.
    pub fn hear(&self, w: Watched) {
        match &w {
            Watched::Pool(name) => self.forget_pool(name),
            Watched::Restarted => self.forget_pools(),
            Watched::BlockGone { .. } => {}
            Watched::Name | Watched::NameWatch(_) => {
                let mut beat = self.beat.lock().expect("beat lock");
                beat.name_news += 1;
                if let Watched::NameWatch(on) = w {
                    beat.name_watched = on;
                }
                drop(beat);
                if w == Watched::Name {
                    // Another daemon's key, or none: known at once.
                    self.renew_now.notify_one();
                }
            }
        }
        tracing::debug!(node = %self.name, heard = ?w, "the store's watch");
        self.heard.hear(w);
    }

    /// The store connection (made now if there is none), for what runs outside [`call`]: the
    /// watches.
    ///
    /// [`call`]: ClusterNode::call
    pub async fn connection(&self) -> Result<StoreHandle, ClusterError> {
        self.store().await
    }

    async fn store(&self) -> Result<StoreHandle, ClusterError> {
        let mut conn = self.conn.lock().await;
        if let Some(s) = conn.as_ref() {
            return Ok(s.clone());
        }
        let s = (self.connector)(&self.settings, self.tls.as_ref(), &self.limiter).await?;
        *conn = Some(s.clone());
        *self.current.lock().expect("current lock") = Some(s.clone());
        Ok(s)
    }

    /// Runs `f` against the store: timed (`op`), and the store counted up or down by its
    /// outcome.
    pub async fn call<T, F, Fut>(&self, op: &str, f: F) -> Result<T, ClusterError>
    where
        F: FnOnce(StoreHandle) -> Fut,
        Fut: Future<Output = Result<T, ClusterError>>,
    {
        let t = Instant::now();
        let (r, store) = match self.store().await {
            Ok(s) => (f(s.clone()).await, Some(s)),
            Err(e) => (Err(e), None),
        };
        if let Some(s) = store {
            self.check_resets(&s);
        }
        let reached = !matches!(&r, Err(e) if e.is_unreachable());
        self.metrics.cluster.store_call(op, t.elapsed(), reached);
        let mut down = self.down.lock().expect("down lock");
        match (&r, reached) {
            (Err(e), false) => {
                if down.is_none() {
                    tracing::warn!(node = %self.name, store = %self.store_name(), error = %e, "the store does not answer: serving the blocks this node owns, claiming none until it does");
                    *down = Some((Instant::now(), e.to_string()));
                }
            }
            _ => {
                if let Some((since, _)) = down.take() {
                    tracing::info!(node = %self.name, store = %self.store_name(), after_secs = since.elapsed().as_secs(), "the store answers again");
                }
            }
        }
        r
    }

    /// A store found reset (restored from a backup, made anew): the pools are read again, and
    /// no source serves before it has synced in the new epoch.
    fn check_resets(&self, store: &StoreHandle) {
        let (resets, why) = store.resets();
        self.resets_seen(resets, why);
    }

    /// The store's count of resets seen (and why the last), taken in.
    fn resets_seen(&self, resets: u64, why: Option<String>) {
        let mut beat = self.beat.lock().expect("beat lock");
        if resets > beat.resets {
            beat.resets = resets;
            beat.epoch += 1;
            // The bug, put back: the name trusted as held until the next renewal found otherwise.
            let doubt = !crate::bugs::on(crate::bugs::Bug::ResetNameTrusted);
            if doubt {
                beat.doubt = Some(Instant::now());
            }
            drop(beat);
            if doubt {
                self.renew_now.notify_one();
            }
            self.identity_changes.send_modify(|_| {});
            self.forget_pools();
            self.pins_reset();
            self.metrics.cluster.store_resets.inc();
            tracing::error!(node = %self.name, why = why.as_deref().unwrap_or_default(), "the store was reset: every block is synced again before anything more is handed out");
        }
    }

    /// Why this node is degraded (the store unreachable), if it is.
    pub fn degraded(&self) -> Option<String> {
        self.down
            .lock()
            .expect("down lock")
            .as_ref()
            .map(|(since, why)| {
                format!(
                    "{} unreachable for {} s ({why}): serving owned blocks only",
                    self.store_name(),
                    since.elapsed().as_secs()
                )
            })
    }

    /// The serving epoch, when the node serves; else why not (for ADD 11 and STATUS 50).
    /// A store reset its client has seen counts at once, though the call that saw it has not
    /// returned yet: asked on every path that hands an address out, this is where a node stops
    /// serving from what the store may no longer hold.
    pub fn serving(&self) -> Result<u64, NotServing> {
        if !crate::bugs::on(crate::bugs::Bug::ResetSeenLate) {
            let store = self.current.lock().expect("current lock").clone();
            if let Some(s) = store {
                self.check_resets(&s);
            }
        }
        let beat = self.beat.lock().expect("beat lock");
        let name = &self.name;
        let store = self.store_name();
        let not = |why: String, pending: bool| {
            Err(NotServing {
                why,
                pending,
                fenced: false,
            })
        };
        match &beat.identity {
            Identity::Starting(None) => not(
                format!("registering node name {name:?} in {store} (its heartbeat)"),
                true,
            ),
            Identity::Starting(Some(e)) => not(
                format!(
                    "this daemon cannot register node name {name:?} in {store} ({e}): nothing is handed out before"
                ),
                false,
            ),
            Identity::Taken { instance } => not(
                format!(
                    "another ipoold (instance {instance}) holds node name {name:?} in {store}: this one (instance {}) hands out nothing until that one's heartbeat lease is gone (the same [cluster] node_name on two nodes?)",
                    self.instance
                ),
                false,
            ),
            Identity::Held if beat.doubt.is_some() => not(
                format!(
                    "{store} was reset (restored from a backup?): this daemon's hold on node name {name:?} is checked again before anything more is handed out"
                ),
                false,
            ),
            Identity::Held => match beat.renewed {
                Some(t) if t.elapsed() <= self.fence() => Ok(beat.epoch),
                // The bug, put back: no fence.
                Some(_) if crate::bugs::on(crate::bugs::Bug::NoFence) => Ok(beat.epoch),
                _ => Err(NotServing {
                    why: format!(
                        "fenced: node {name:?} could not renew its heartbeat in {store} for {} s or more (fence_secs); existing pods keep their addresses, new ones wait until it has renewed and synced its blocks again",
                        self.fence().as_secs()
                    ),
                    pending: false,
                    fenced: true,
                }),
            },
        }
    }

    /// Whether the next renewal must read the name back, given the watch's news about it that
    /// the last read saw (`checked`); and the news now. Without a watch of it that is on, or
    /// with news since, or in doubt after a reset: yes.
    pub(crate) fn name_check(&self, checked: u64) -> (bool, u64) {
        let beat = self.beat.lock().expect("beat lock");
        let quiet = self.settings.watch && beat.name_watched && beat.name_news == checked;
        (!quiet || beat.doubt.is_some(), beat.name_news)
    }

    /// Whether this daemon holds its node's name, as the heartbeat last found.
    pub fn identity(&self) -> Identity {
        self.beat.lock().expect("beat lock").identity.clone()
    }

    /// The identity, as it changes.
    pub fn watch_identity(&self) -> tokio::sync::watch::Receiver<Identity> {
        self.identity_changes.subscribe()
    }

    /// Reports malformed keys (objects) found by a listing of pool `pool`'s blocks (`whole`:
    /// all of them, for a claim; else this node's, for a sync): logged once each, counted, and
    /// shown in status, until the next listing of the same kind no longer finds them.
    pub fn malformed_seen(&self, pool: &str, whole: bool, found: &[super::vocab::MalformedKey]) {
        let mut m = self.malformed.lock().expect("malformed lock");
        let known: std::collections::HashSet<String> =
            m.values().flat_map(|keys| keys.keys().cloned()).collect();
        let now: std::collections::BTreeMap<String, String> = found
            .iter()
            .map(|f| (f.key.clone(), f.why.clone()))
            .collect();
        for (key, why) in &now {
            if !known.contains(key) {
                tracing::error!(node = %self.name, %key, %why, store = self.store_name(), "a malformed entry in ipool's part of the store: counted as occupied (fix or delete it)");
            }
        }
        match now.is_empty() {
            true => m.remove(&(pool.to_string(), whole)),
            false => m.insert((pool.to_string(), whole), now),
        };
        let count = m
            .values()
            .flat_map(|keys| keys.keys())
            .collect::<std::collections::HashSet<_>>()
            .len();
        self.metrics.cluster.malformed_keys.set(count as i64);
    }

    /// The malformed keys last seen, for status.
    pub fn malformed(&self) -> Vec<String> {
        let m = self.malformed.lock().expect("malformed lock");
        let all: std::collections::BTreeMap<&String, &String> =
            m.values().flat_map(|keys| keys.iter()).collect();
        all.into_iter()
            .map(|(k, why)| format!("{k} ({why})"))
            .collect()
    }

    fn set_identity(&self, identity: Identity) {
        let mut beat = self.beat.lock().expect("beat lock");
        if beat.identity == identity {
            return;
        }
        match &identity {
            Identity::Held => {
                beat.epoch += 1;
                tracing::info!(node = %self.name, instance = %self.instance, store = %self.store_name(), "this daemon holds its node name in the store");
            }
            Identity::Taken { instance } => {
                tracing::error!(node = %self.name, instance = %self.instance, other = %instance, store = %self.store_name(), "another ipoold holds this node name in the store: handing out nothing until its heartbeat lease is gone");
            }
            Identity::Starting(_) => {}
        }
        let taken = matches!(identity, Identity::Taken { .. });
        self.metrics.cluster.node_name_taken.set(i64::from(taken));
        beat.identity = identity.clone();
        drop(beat);
        self.identity_changes.send_replace(identity);
    }

    /// Notes a renewal sent at `sent` that succeeded; a node that was fenced starts a new
    /// epoch (it syncs before it serves again).
    fn renewed(&self, sent: Instant) {
        let mut beat = self.beat.lock().expect("beat lock");
        if beat.doubt.is_some_and(|d| sent < d) {
            // Sent before the reset was seen: it says nothing of the name in the store now.
            return;
        }
        let doubted = beat.doubt.take().is_some();
        let fenced = beat.renewed.is_none_or(|t| t.elapsed() > self.fence());
        let lifted = (fenced && beat.renewed.is_some()) || doubted;
        if lifted {
            beat.epoch += 1;
            tracing::info!(node = %self.name, "heartbeat renewed: the fence lifts once the blocks are synced again");
        }
        beat.renewed = Some(sent);
        drop(beat);
        self.metrics.cluster.fenced.set(0);
        if lifted {
            // Watchers of the identity (the engine) look again: the sources sync now.
            self.identity_changes.send_modify(|_| {});
        }
    }

    /// Tests: the node as its heartbeat would leave it, holding its name and renewed
    /// `ago` before now.
    #[cfg(test)]
    pub(crate) fn pretend_renewed(&self, ago: Duration) {
        self.set_identity(Identity::Held);
        let sent = Instant::now()
            .checked_sub(ago)
            .expect("a monotonic clock this old");
        self.renewed(sent);
    }

    /// Tests: the node's name as the heartbeat would find it.
    #[cfg(test)]
    pub(crate) fn pretend_identity(&self, identity: Identity) {
        self.set_identity(identity);
    }
}

#[cfg(test)]
mod tests;

mod heartbeat;
pub mod pins;
pub mod pools;
pub mod watching;
