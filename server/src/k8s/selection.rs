//! Which cluster pools a pod's ADD may use, most specific first: the pod's annotation
//! `ipool.io/pool` (one name) or `ipool.io/pools` ("a,b", tried in order), else its
//! namespace's, else the network's list (None). The namespaces are watched into a cache (their
//! `ipool.io/pool*` annotations only): an ADD of a known pod makes no request. This node's
//! labels come from a watch of its Node, for the pools' nodeSelectors.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use ipool_proto::names::shown;
use k8s_openapi::api::core::v1::{Namespace, Node};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client};

use super::annotation::BadAnnotation;
use crate::error::Error;
use crate::model::PoolChoice;

pub const POOL: &str = "ipool.io/pool";
pub const POOLS: &str = "ipool.io/pools";

/// The pools an object's annotations choose (`who` names it in messages): None when it has
/// neither annotation; an error when both, or a name that cannot be a pool's.
pub fn chosen(
    annotations: Option<&BTreeMap<String, String>>,
    who: &str,
) -> Result<Option<PoolChoice>, BadAnnotation> {
    let get = |k: &str| annotations.and_then(|a| a.get(k));
    let (key, value) = match (get(POOL), get(POOLS)) {
        (None, None) => return Ok(None),
        (Some(_), Some(_)) => {
            return Err(BadAnnotation(format!(
                "{who} has both annotations {POOL} and {POOLS}: keep one"
            )))
        }
        (Some(v), None) => (POOL, v),
        (None, Some(v)) => (POOLS, v),
    };
    let names: Vec<String> = value
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect();
    if names.is_empty() || (key == POOL && names.len() > 1) {
        return Err(BadAnnotation(format!(
            "{who}: annotation {key}={} names {} (one pool for {POOL}, a list \"a,b\" for {POOLS})",
            shown(value),
            match names.len() {
                0 => "no pool".to_string(),
                n => format!("{n} pools"),
            }
        )));
    }
    for (i, n) in names.iter().enumerate() {
        ipool_proto::names::check_name("pool name", n)
            .map_err(|e| BadAnnotation(format!("{who}: annotation {key}: {e}")))?;
        if names[..i].contains(n) {
            return Err(BadAnnotation(format!(
                "{who}: annotation {key} names {n:?} twice"
            )));
        }
    }
    Ok(Some(PoolChoice {
        pools: names,
        from: format!("{who}'s annotation {key}"),
    }))
}

/// The pod's own choice, else its namespace's, else none (the network's list).
pub fn most_specific(pod: Option<PoolChoice>, namespace: Option<PoolChoice>) -> Option<PoolChoice> {
    pod.or(namespace)
}

/// The namespaces' choices of pools, from a watch.
#[derive(Clone)]
pub struct Namespaces(Arc<Inner>);

struct Inner {
    client: Client,
    cache: Store<Namespace>,
    synced: AtomicBool,
    get_timeout: Duration,
}

impl Namespaces {
    /// Starts watching the namespaces (kept with their `ipool.io/pool*` annotations only).
    pub fn start(client: Client, read_timeout: Duration, get_timeout: Duration) -> Namespaces {
        let (cache, writer) = reflector::store();
        let me = Namespaces(Arc::new(Inner {
            client: client.clone(),
            cache,
            synced: AtomicBool::new(false),
            get_timeout,
        }));
        let api: Api<Namespace> = Api::all(client);
        let stream = watcher(api, super::watch_config(read_timeout))
            .default_backoff()
            .modify(strip)
            .reflect(writer);
        let it = me.clone();
        tokio::spawn(async move {
            let mut stream = std::pin::pin!(stream);
            while let Some(event) = stream.next().await {
                match event {
                    Ok(watcher::Event::InitDone) => {
                        if !it.0.synced.swap(true, Ordering::SeqCst) {
                            tracing::info!(
                                namespaces = it.0.cache.len(),
                                "namespaces listed: their pool annotations are known"
                            );
                        }
                    }
                    Ok(_) => {}
                    // A ClusterRole without namespaces (403) says so here: ADDs on a network
                    // of cluster pools wait for the namespaces meanwhile.
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot watch the namespaces (their ipool.io/pool annotations): retrying; ADDs of pods on networks of cluster pools wait")
                    }
                }
            }
        });
        me
    }

    /// The pools namespace `ns` chooses: from the cache; a namespace not in it (made just now,
    /// the watch behind) is read once. A retryable error until the namespaces are listed.
    pub async fn choice_of(&self, ns: &str) -> Result<Option<PoolChoice>, Error> {
        if !self.0.synced.load(Ordering::SeqCst) {
            return Err(Error::Busy(
                "the namespaces are not listed yet (their ipool.io/pool annotations)".into(),
            ));
        }
        let who = format!("namespace {ns}");
        let annotations = match self.0.cache.get(&ObjectRef::new(ns)) {
            Some(n) => n.metadata.annotations.clone(),
            None => {
                let api: Api<Namespace> = Api::all(self.0.client.clone());
                match tokio::time::timeout(self.0.get_timeout, api.get_opt(ns)).await {
                    Ok(Ok(n)) => n.and_then(|n| n.metadata.annotations),
                    Ok(Err(e)) => return Err(Error::Busy(format!("cannot get {who}: {e}"))),
                    Err(_) => return Err(Error::Busy(format!("cannot get {who}: no answer"))),
                }
            }
        };
        chosen(annotations.as_ref(), &who).map_err(|e| Error::InvalidRequest(e.0))
    }
}

/// A namespace as the cache keeps it: its name and its pool annotations.
fn strip(ns: &mut Namespace) {
    ns.spec = None;
    ns.status = None;
    let md = &mut ns.metadata;
    md.managed_fields = None;
    md.labels = None;
    if let Some(a) = md.annotations.as_mut() {
        a.retain(|k, _| k == POOL || k == POOLS);
    }
}

/// Watches Node `node` forever, handing each change of its labels to `labels`.
pub async fn follow_labels(
    client: Client,
    node: String,
    read_timeout: Duration,
    labels: impl Fn(BTreeMap<String, String>) + Send + 'static,
) {
    let api: Api<Node> = Api::all(client);
    let config = super::watch_config(read_timeout).fields(&format!("metadata.name={node}"));
    let mut events = std::pin::pin!(watcher(api, config).default_backoff());
    while let Some(event) = events.next().await {
        match event {
            Ok(watcher::Event::InitApply(obj) | watcher::Event::Apply(obj)) => {
                labels(obj.metadata.labels.unwrap_or_default());
            }
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(error = %e, node = %node, "cannot watch this node's labels (for the cluster pools' nodeSelectors): retrying")
            }
        }
    }
}

#[cfg(test)]
mod tests;
