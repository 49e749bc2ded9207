//! The pods on this node: a watch (`fieldSelector=spec.nodeName=<node>`) reflected into a
//! cache of pods stripped to what ipool reads ([`super::meta::strip`]). The cache is a complete
//! picture only after the first full list; it is kept, as it was, while the apiserver errors
//! (the watcher reconnects with backoff and relists when its resourceVersion expired). Each
//! change between reachable and unreachable is logged once and shown by the
//! `ipool_apiserver_reachable` gauge. The node itself is looked up at start: a `--node-name`
//! the apiserver does not know serves nothing (its pods would all look bound elsewhere).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client};

use super::meta::{node_of, pod_info, same_pod, strip, uid, PodInfo};
use crate::config::KubernetesSettings;
use crate::error::Error;
use crate::metrics::Metrics;
use crate::model;

/// Pods per page of the watch's lists.
const LIST_PAGE: u32 = 50;

/// What the lookup of this node in the apiserver found.
#[derive(Clone, Debug, PartialEq, Eq)]
enum NodeLookup {
    Found,
    /// Not there: why ADDs are not served, and what to do.
    Unknown(String),
}

/// A pod's GET the apiserver did not answer (an error, or nothing within the deadline).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct PodGetFailed(pub String);

/// A handle on the pods of this node (cheap to clone).
#[derive(Clone)]
pub struct Pods(Arc<Inner>);

struct Inner {
    node: String,
    client: Client,
    cache: Store<Pod>,
    settings: KubernetesSettings,
    metrics: Arc<Metrics>,
    /// The first full list is in the cache.
    synced: AtomicBool,
    /// The apiserver answered the last call (the watch's or ours).
    reachable: AtomicBool,
    last_error: Mutex<String>,
    /// Bumped after each full list (start, and each relist).
    lists: tokio::sync::watch::Sender<u64>,
    /// 1 + the ranges version (`Ipam::ranges_version`) the live pods' addresses were last
    /// quarantined against; 0: not yet. ADDs wait for it (see [`Pods::ready`]).
    quarantined: std::sync::atomic::AtomicU64,
    /// Whether the apiserver knows this node: None until it said.
    node_found: Mutex<Option<NodeLookup>>,
    /// The namespaces' choices of cluster pools, once watched ([`Pods::watch_namespaces`]).
    namespaces: std::sync::OnceLock<super::selection::Namespaces>,
    /// Refused ADDs, recorded on their pods.
    events: super::events::Events,
}

impl Pods {
    /// Starts watching the pods of `node`.
    pub fn start(
        client: Client,
        node: &str,
        settings: KubernetesSettings,
        metrics: Arc<Metrics>,
    ) -> Pods {
        let (cache, writer) = reflector::store();
        let (lists, _) = tokio::sync::watch::channel(0);
        let events = super::events::Events::start(client.clone(), node, metrics.clone());
        let pods = Pods(Arc::new(Inner {
            node: node.to_string(),
            client: client.clone(),
            cache,
            settings,
            metrics,
            synced: AtomicBool::new(false),
            reachable: AtomicBool::new(true),
            last_error: Mutex::new(String::new()),
            lists,
            quarantined: Default::default(),
            node_found: Mutex::new(None),
            namespaces: std::sync::OnceLock::new(),
            events,
        }));
        pods.0.metrics.apiserver_reachable.set(1);
        tokio::spawn(pods.clone().look_up_node());
        let api: Api<Pod> = Api::all(client);
        let read_timeout = Duration::from_secs(pods.0.settings.read_timeout_secs);
        // Listed in small pages: a page of whole pods is what the list holds at once before
        // they are stripped.
        let config = super::watch_config(read_timeout)
            .fields(&format!("spec.nodeName={node}"))
            .page_size(LIST_PAGE);
        let stream = watcher(api, config)
            .default_backoff()
            .modify(strip)
            .reflect(writer);
        let me = pods.clone();
        tokio::spawn(async move {
            let mut stream = std::pin::pin!(stream);
            tracing::info!(node = %me.0.node, "watching the pods of this node");
            while let Some(event) = stream.next().await {
                match event {
                    Ok(watcher::Event::InitDone) => {
                        me.answered();
                        if !me.0.synced.swap(true, Ordering::SeqCst) {
                            tracing::info!(node = %me.0.node, pods = me.0.cache.len(), "pods listed: the watch cache is complete");
                        }
                        me.0.lists.send_modify(|n| *n += 1);
                    }
                    // Made without a request (it starts a relist): says nothing of the apiserver.
                    Ok(watcher::Event::Init) => {}
                    Ok(_) => me.answered(),
                    // An expired resourceVersion: the apiserver answered; the watcher relists.
                    Err(watcher::Error::WatchError(s)) if s.code == 410 => {
                        tracing::debug!(node = %me.0.node, "pod watch expired; relisting");
                    }
                    Err(e) => me.failed(&e.to_string()),
                }
            }
        });
        pods
    }

    pub fn node(&self) -> &str {
        &self.0.node
    }

    /// Records on `pod` that its ADD was refused for `refusal` (an Event, in the background).
    pub fn refused(&self, pod: &model::Pod, refusal: crate::error::Refusal, message: &str) {
        if pod.name.is_empty() || pod.namespace.is_empty() {
            return;
        }
        let pod = super::events::PodRef {
            namespace: pod.namespace.clone(),
            name: pod.name.clone(),
            uid: pod.uid.clone(),
        };
        self.0.events.refused(pod, refusal, message);
    }

    /// Watches the namespaces from now on: a pod that chooses no cluster pool gets its
    /// namespace's choice (see [`super::selection`]).
    pub fn watch_namespaces(&self) {
        let s = &self.0.settings;
        let ns = super::selection::Namespaces::start(
            self.0.client.clone(),
            Duration::from_secs(s.read_timeout_secs),
            Duration::from_millis(s.pod_get_timeout_ms),
        );
        let _ = self.0.namespaces.set(ns);
    }

    pub fn settings(&self) -> &KubernetesSettings {
        &self.0.settings
    }

    /// Asks the apiserver for this node until it answers: a node it does not know (a
    /// `--node-name` that is not the node's name) is an error logged and shown by
    /// [`Pods::ready`], and asked again every 10 s.
    async fn look_up_node(self) {
        let api: Api<Node> = Api::all(self.0.client.clone());
        let deadline = Duration::from_millis(self.0.settings.pod_get_timeout_ms.max(1000));
        let mut wait = Duration::from_secs(1);
        loop {
            let found = match tokio::time::timeout(deadline, api.get_opt(&self.0.node)).await {
                Ok(Ok(Some(_))) => NodeLookup::Found,
                Ok(Ok(None)) => NodeLookup::Unknown(format!(
                    "node {:?} does not exist in the apiserver: --node-name (NODE_NAME) must be the node's name as `kubectl get nodes` shows it",
                    self.0.node
                )),
                Ok(Err(e)) => {
                    self.failed(&e.to_string());
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(Duration::from_secs(30));
                    continue;
                }
                Err(_) => {
                    self.failed("no answer");
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(Duration::from_secs(30));
                    continue;
                }
            };
            self.answered();
            let ok = found == NodeLookup::Found;
            match &found {
                NodeLookup::Found => {
                    tracing::info!(node = %self.0.node, "this node is in the apiserver")
                }
                NodeLookup::Unknown(why) => {
                    tracing::error!(%why, "ADDs are not served and the pod GC does not run")
                }
            }
            *self.0.node_found.lock().expect("not poisoned") = Some(found);
            if ok {
                return;
            }
            tokio::time::sleep(Duration::from_secs(10)).await;
        }
    }

    /// The apiserver knows this node (the pod GC runs only then).
    pub fn node_found(&self) -> bool {
        matches!(
            *self.0.node_found.lock().expect("not poisoned"),
            Some(NodeLookup::Found)
        )
    }

    /// The cache holds the first full list.
    pub fn synced(&self) -> bool {
        self.0.synced.load(Ordering::SeqCst)
    }

    /// The apiserver answered the last call made to it.
    pub fn reachable(&self) -> bool {
        self.0.reachable.load(Ordering::SeqCst)
    }

    /// Wakes after each full list.
    pub fn lists(&self) -> tokio::sync::watch::Receiver<u64> {
        self.0.lists.subscribe()
    }

    /// How many full lists there were.
    pub fn list_count(&self) -> u64 {
        *self.0.lists.borrow()
    }

    /// Notes that the live pods' addresses were quarantined against ranges version `v`.
    pub fn quarantined(&self, v: u64) {
        self.0.quarantined.store(v + 1, Ordering::SeqCst);
    }

    /// Ok when ADDs may be served: the pods are listed and their addresses quarantined against
    /// the ranges now (`ranges_version`); else why not (a retryable error). Until then an
    /// address a running pod holds could look free (a lost store, ranges that just came).
    pub fn ready(&self, ranges_version: u64) -> Result<(), Error> {
        match &*self.0.node_found.lock().expect("not poisoned") {
            Some(NodeLookup::Found) => {}
            Some(NodeLookup::Unknown(why)) => return Err(Error::Busy(why.clone())),
            None => {
                return Err(Error::Busy(format!(
                    "looking up node {} in the apiserver (apiserver: {})",
                    self.0.node,
                    self.last_error()
                )))
            }
        }
        if !self.synced() {
            return Err(Error::Busy(format!(
                "the pods of node {} are not listed yet (apiserver: {})",
                self.0.node,
                self.last_error()
            )));
        }
        if self.0.quarantined.load(Ordering::SeqCst) != ranges_version + 1 {
            return Err(Error::Busy(format!(
                "checking the addresses the pods of node {} report against the store",
                self.0.node
            )));
        }
        Ok(())
    }

    fn answered(&self) {
        if !self.0.reachable.swap(true, Ordering::SeqCst) {
            tracing::info!(node = %self.0.node, "the apiserver answers again");
            self.0.metrics.apiserver_reachable.set(1);
        }
    }

    fn failed(&self, error: &str) {
        *self.0.last_error.lock().expect("not poisoned") = error.to_string();
        if self.0.reachable.swap(false, Ordering::SeqCst) {
            tracing::warn!(node = %self.0.node, %error, "the apiserver does not answer: pods in the cache are served, the pod GC pauses; retrying with backoff");
            self.0.metrics.apiserver_reachable.set(0);
        }
    }

    /// The pod `namespace/name` in the cache.
    pub fn cached(&self, namespace: &str, name: &str) -> Option<Arc<Pod>> {
        self.0.cache.get(&ObjectRef::new(name).within(namespace))
    }

    /// Every pod in the cache.
    pub fn all(&self) -> Vec<Arc<Pod>> {
        self.0.cache.state()
    }

    /// The pod as the apiserver has it now (None: not found), within the configured deadline.
    pub async fn get_live(&self, namespace: &str, name: &str) -> Result<Option<Pod>, PodGetFailed> {
        let api: Api<Pod> = Api::namespaced(self.0.client.clone(), namespace);
        let deadline = Duration::from_millis(self.0.settings.pod_get_timeout_ms);
        let got = match tokio::time::timeout(deadline, api.get_opt(name)).await {
            Ok(Ok(pod)) => Ok(pod),
            Ok(Err(e)) => Err(PodGetFailed(e.to_string())),
            Err(_) => Err(PodGetFailed(format!(
                "no answer within {} ms",
                deadline.as_millis()
            ))),
        };
        match &got {
            Ok(_) => self.answered(),
            Err(e) => self.failed(&e.0),
        }
        got
    }

    /// Asks the apiserver whether it answers (the watch may be quiet after a reconnection):
    /// `GET /version`, which costs it nothing.
    pub async fn probe(&self) -> bool {
        let deadline = Duration::from_millis(self.0.settings.pod_get_timeout_ms);
        match tokio::time::timeout(deadline, self.0.client.apiserver_version()).await {
            Ok(Ok(_)) => {
                self.answered();
                true
            }
            Ok(Err(e)) => {
                self.failed(&e.to_string());
                false
            }
            Err(_) => {
                self.failed("no answer");
                false
            }
        }
    }

    /// The metadata an ADD of `want` records: its pod from the cache when the runtime gave
    /// its UID and the cached pod has it, else from one live GET (a cached pod of that name
    /// may be an earlier one). Fails with a retryable error when the apiserver cannot say,
    /// never silently without the metadata; a pod bound to another node is refused, naming
    /// both nodes.
    pub async fn info_for(&self, want: &model::Pod) -> Result<PodInfo, Error> {
        let who = format!("pod {}/{}", want.namespace, want.name);
        let matches = |p: &Pod| same_pod(p, &want.uid);
        let pod = match self.cached(&want.namespace, &want.name) {
            Some(p) if !want.uid.is_empty() && matches(&p) => (*p).clone(),
            _ => match self.get_live(&want.namespace, &want.name).await {
                Ok(Some(p)) if matches(&p) => p,
                Ok(Some(p)) => {
                    return Err(Error::Busy(format!(
                        "{who} has UID {} in the apiserver; the runtime says {}",
                        uid(&p),
                        want.uid
                    )))
                }
                Ok(None) => return Err(Error::Busy(format!("{who} is not in the apiserver"))),
                Err(e) => {
                    return Err(Error::Busy(format!(
                        "cannot get {who} from the apiserver: {e}"
                    )))
                }
            },
        };
        let bound = node_of(&pod);
        if !bound.is_empty() && bound != self.0.node {
            return Err(Error::InvalidRequest(format!(
                "{who} is bound to node {bound:?}, and this ipoold is node {:?} (is --node-name the node's name?)",
                self.0.node
            )));
        }
        pod_info(&pod, &self.0.settings.sticky_kinds).map_err(|e| Error::InvalidRequest(e.0))
    }

    /// The cluster pools namespace `ns` chooses (None: none, or the namespaces are not
    /// watched), from the watch's cache.
    pub async fn namespace_choice(&self, ns: &str) -> Result<Option<model::PoolChoice>, Error> {
        match self.0.namespaces.get() {
            Some(n) => n.choice_of(ns).await,
            None => Ok(None),
        }
    }

    fn last_error(&self) -> String {
        let e = self.0.last_error.lock().expect("not poisoned").clone();
        match e.is_empty() {
            true => "no answer yet".to_string(),
            false => e,
        }
    }
}
