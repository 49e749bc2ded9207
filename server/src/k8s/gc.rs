//! The pod GC (Calico's rules, Terway's re-check): an attachment whose pod is gone (not in the
//! watch cache, there with another UID, or finished: Succeeded or Failed) is released only when
//! it was seen gone at two checks at least `gc_grace_secs` apart, it is at least that old, a
//! live GET just before confirms it (404, another UID, bound elsewhere, finished), and its
//! network namespace no longer exists (a sandbox that is still there keeps its address, however
//! long the apiserver has forgotten its pod). Any check that finds the pod clears the suspicion.
//! No check runs before the first full list, before the apiserver confirmed this node exists,
//! nor while it does not answer. A sticky pod's addresses become its reservation.
//!
//! Quarantines (see [`crate::ipam::Ipam::quarantine`]) are made after each full list and each
//! change of the ranges, and end by the same rules (the pod gone as the apiserver sees it). The
//! loop runs on those events and on the GC's timer, not on a poll.
//!
//! Where the node's container runtime can be asked ([`Runtime`], its CRI socket), an address
//! is let go, and a quarantine ends, only when the runtime has no ready sandbox of the pod
//! either: a pod force-deleted while its sandbox runs keeps its address; so does one the
//! runtime does not answer about.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use super::cri::{runs, CriUnanswered, Runtime, SandboxPod};
use super::meta::{finished, node_of, pod_ips, runtime_uid, same_pod};
use super::pods::PodGetFailed;
use super::Pods;
use crate::ipam::{netns_gone, Ipam, LivePod, Quarantine, Suspects};
use crate::model::{Millis, Pod};
use crate::store::AttachmentKey;

type KubePod = k8s_openapi::api::core::v1::Pod;

/// What the GC may release.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Held {
    Attachment(AttachmentKey),
    Quarantine(crate::model::ReservationKey),
}

/// The apiserver as a GC check asks it: the watch cache of this node's pods, and a pod as it
/// is now. ipoold's is [`Pods`]; the simulation's answers as its world has the pods.
#[async_trait::async_trait]
pub trait PodLookup: Send + Sync {
    /// This node's name, as its pods are bound to it.
    fn node(&self) -> &str;
    /// `[kubernetes] gc_grace_secs`.
    fn grace_secs(&self) -> u64;
    /// The pod `namespace/name` in the watch cache.
    fn cached(&self, namespace: &str, name: &str) -> Option<Arc<KubePod>>;
    /// The pod as the apiserver has it now (None: not found).
    async fn get_live(&self, namespace: &str, name: &str) -> Result<Option<KubePod>, PodGetFailed>;
}

#[async_trait::async_trait]
impl PodLookup for Pods {
    fn node(&self) -> &str {
        Pods::node(self)
    }

    fn grace_secs(&self) -> u64 {
        self.settings().gc_grace_secs
    }

    fn cached(&self, namespace: &str, name: &str) -> Option<Arc<KubePod>> {
        Pods::cached(self, namespace, name)
    }

    async fn get_live(&self, namespace: &str, name: &str) -> Result<Option<KubePod>, PodGetFailed> {
        Pods::get_live(self, namespace, name).await
    }
}

/// The container runtime as a GC check asks it: the pods whose sandboxes it runs, ready.
/// ipoold's is [`Runtime`] (its CRI socket); the simulation's answers as its world has them.
#[async_trait::async_trait]
pub trait Sandboxes: Send + Sync {
    /// Err: it did not answer (nothing may be let go on that).
    async fn ready_sandboxes(&self) -> Result<Vec<SandboxPod>, CriUnanswered>;
}

#[async_trait::async_trait]
impl Sandboxes for Runtime {
    async fn ready_sandboxes(&self) -> Result<Vec<SandboxPod>, CriUnanswered> {
        Runtime::ready_sandboxes(self).await
    }
}

/// A thing the GC judges, with its pod.
struct Candidate {
    held: Held,
    pod: Pod,
    created: Millis,
    netns: String,
    quarantine: Option<Quarantine>,
}

/// How often the GC checks: half the grace, within [0.2 s, 10 s].
pub fn period(grace_secs: u64) -> Duration {
    Duration::from_millis((grace_secs.saturating_mul(500)).clamp(200, 10_000))
}

/// How long the runtime has to answer.
const RUNTIME_TIMEOUT: Duration = Duration::from_secs(2);

/// How long a quarantine that could not be made (the store failed, a cluster pool's blocks
/// not listed yet) waits before the next try, besides the events that wake it.
const QUARANTINE_RETRY: Duration = Duration::from_secs(1);

/// Runs the GC and the quarantines, forever.
pub async fn run(ipam: Ipam, pods: Pods) {
    let every = period(pods.settings().gc_grace_secs);
    let mut suspects = Suspects::default();
    let mut paused = false;
    let mut lists = pods.lists();
    let mut ranges = ipam.watch_ranges();
    // (list count, ranges version) last quarantined against.
    let mut done = None;
    let mut retry = None;
    let mut gc = tokio::time::interval(every);
    gc.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    say_what_namespaces_are_seen(&ipam);
    let runtime = Runtime::configured(pods.settings().cri_socket.as_deref(), RUNTIME_TIMEOUT).await;
    match &runtime {
        Some(r) => tracing::info!(socket = %r.path().display(), "the container runtime is asked before an address of a pod gone from the apiserver is let go"),
        None => tracing::info!("no container runtime's CRI socket ([kubernetes] cri_socket): the pod GC judges by the apiserver and the network namespaces"),
    }
    loop {
        let wake = async {
            match retry {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        let check = tokio::select! {
            _ = lists.changed() => false,
            _ = ranges.changed() => false,
            _ = wake => false,
            _ = gc.tick() => true,
        };
        if !pods.synced() || !pods.node_found() {
            continue;
        }
        let now = (pods.list_count(), ipam.ranges_version());
        if done != Some(now) {
            match quarantine(&ipam, &pods).await {
                true => {
                    pods.quarantined(now.1);
                    ipam.gate_opened();
                    done = Some(now);
                    retry = None;
                }
                false => retry = Some(tokio::time::Instant::now() + QUARANTINE_RETRY),
            }
        }
        if !check {
            continue;
        }
        if !pods.reachable() && !pods.probe().await {
            if !paused {
                tracing::warn!("pod GC paused: the apiserver does not answer");
                paused = true;
            }
            continue;
        }
        if std::mem::take(&mut paused) {
            tracing::info!("pod GC resumed");
        }
        let runtime = runtime.as_ref().map(|r| r as &dyn Sandboxes);
        self::check(&ipam, &pods, runtime, &mut suspects).await;
    }
}

/// Says once, at start, whether the network namespaces the runtime names can be seen here: if
/// not, the GC judges by the apiserver alone.
fn say_what_namespaces_are_seen(ipam: &Ipam) {
    let paths: Vec<String> = ipam
        .pod_attachments()
        .into_iter()
        .map(|a| a.netns)
        .filter(|p| !p.is_empty())
        .collect();
    let unseen = paths.iter().filter(|p| netns_gone(p).is_none()).count();
    match (paths.len(), unseen) {
        (0, _) => {}
        (n, 0) => {
            tracing::info!(attachments = n, "the pods' network namespaces are visible: the pod GC releases none while its namespace exists")
        }
        (n, u) => {
            tracing::warn!(attachments = n, unseen = u, example = %paths[0], "the network namespaces of some pods cannot be seen here (mount the host's netns directory at the same path): for those, the pod GC judges by the apiserver alone")
        }
    }
}

/// Quarantines the addresses live pods report that the store does not hold for them. False
/// when it could not be done (the store failed, a cluster pool's blocks not listed yet).
pub async fn quarantine(ipam: &Ipam, pods: &Pods) -> bool {
    let live: Vec<LivePod> = pods
        .all()
        .iter()
        .map(|p| LivePod {
            pod: Pod {
                namespace: p.metadata.namespace.clone().unwrap_or_default(),
                name: p.metadata.name.clone().unwrap_or_default(),
                // A static pod's addresses are the runtime's: its UID, not its mirror's.
                uid: runtime_uid(p).to_string(),
            },
            ips: pod_ips(p),
        })
        .filter(|p| !p.ips.is_empty())
        .collect();
    match ipam.quarantine(&live).await {
        Ok(made) => {
            ipam.metrics().pod_gc("quarantined", made.len());
            true
        }
        // Waiting (a cluster pool's blocks not listed yet): tried again shortly.
        Err(e) if e.is_busy() => {
            tracing::debug!(why = %e, "the live pods' addresses are not quarantined yet");
            false
        }
        Err(e) => {
            tracing::error!(error = %e, "cannot quarantine the live pods' addresses");
            false
        }
    }
}

/// Whether `runtime` keeps `c`'s address: it runs a ready sandbox of the pod, or does not
/// answer (logged and counted either way). `ready`: its list, asked once per check.
async fn runtime_keeps(
    ipam: &Ipam,
    runtime: Option<&dyn Sandboxes>,
    ready: &mut Option<Result<Vec<SandboxPod>, CriUnanswered>>,
    c: &Candidate,
) -> bool {
    let Some(rt) = runtime else {
        return false;
    };
    if crate::bugs::on(crate::bugs::Bug::GcIgnoresRuntime) {
        return false;
    }
    if ready.is_none() {
        *ready = Some(rt.ready_sandboxes().await);
    }
    let pod = format!("{}/{}", c.pod.namespace, c.pod.name);
    match ready.as_ref().expect("asked above") {
        Ok(list) if !runs(list, &c.pod) => false,
        Ok(_) => {
            tracing::warn!(%pod, uid = %c.pod.uid, held = ?c.held, "the pod is gone from the apiserver but the container runtime still runs its sandbox: its address is kept until the sandbox is gone");
            ipam.metrics().pod_gc("kept_sandbox_ready", 1);
            true
        }
        Err(e) => {
            tracing::warn!(%pod, uid = %c.pod.uid, held = ?c.held, error = %e, "the container runtime does not answer: the address of a pod gone from the apiserver is kept");
            ipam.metrics().pod_gc("kept_runtime_unanswered", 1);
            true
        }
    }
}

/// One GC check: `pods` as the apiserver has them, `runtime` the node's container runtime if
/// it can be asked.
pub async fn check(
    ipam: &Ipam,
    pods: &dyn PodLookup,
    runtime: Option<&dyn Sandboxes>,
    suspects: &mut Suspects<Held>,
) {
    let grace = pods.grace_secs().saturating_mul(1000);
    let now = ipam.now();
    let attachments = ipam.pod_attachments().into_iter().map(|a| Candidate {
        held: Held::Attachment(a.key),
        pod: a.pod,
        created: a.created_at_ms,
        netns: a.netns,
        quarantine: None,
    });
    let quarantines = ipam.quarantines().into_iter().map(|q| Candidate {
        held: Held::Quarantine(q.key.clone()),
        pod: Pod {
            namespace: q.key.namespace.clone(),
            name: q.key.name.clone(),
            uid: q.uid.clone(),
        },
        created: q.created_at_ms,
        netns: String::new(),
        quarantine: Some(q),
    });
    let mut gone: HashMap<Held, Candidate> = HashMap::new();
    for c in attachments.chain(quarantines) {
        let alive = pods
            .cached(&c.pod.namespace, &c.pod.name)
            .is_some_and(|p| same_pod(&p, &c.pod.uid) && !finished(&p));
        if !alive {
            gone.insert(c.held.clone(), c);
        }
    }
    let seen = suspects.check(gone.iter().map(|(h, c)| (h.clone(), c.created)), now);
    let mut due = Vec::new();
    for (held, created, first) in seen {
        let Some(c) = gone.remove(&held) else {
            continue;
        };
        if first == now {
            tracing::info!(pod = %format!("{}/{}", c.pod.namespace, c.pod.name), uid = %c.pod.uid, held = ?c.held, "pod gone or finished in the apiserver's list; released if still so after the grace");
        }
        if Suspects::<Held>::due(first, created, now, grace) {
            due.push(c);
        }
    }
    let mut released = Vec::new();
    let mut ended = Vec::new();
    let mut ready = None;
    for c in due {
        match pods.get_live(&c.pod.namespace, &c.pod.name).await {
            // The same pod, running on this node (a pod bound elsewhere holds nothing here).
            Ok(Some(p))
                if same_pod(&p, &c.pod.uid) && node_of(&p) == pods.node() && !finished(&p) =>
            {
                suspects.clear(&c.held);
            }
            Ok(_) if runtime_keeps(ipam, runtime, &mut ready, &c).await => {}
            Ok(_) => match (c.held, c.quarantine) {
                (Held::Attachment(key), _) => {
                    // A sandbox whose network namespace still exists keeps its address.
                    if !c.netns.is_empty() && netns_gone(&c.netns) == Some(false) {
                        tracing::warn!(container = %key.container_id, network = %key.network, netns = %c.netns, pod = %format!("{}/{}", c.pod.namespace, c.pod.name), "the pod is gone from the apiserver but its network namespace still exists: its address is kept until the namespace is gone");
                        ipam.metrics().pod_gc("kept_netns_exists", 1);
                        continue;
                    }
                    released.push((key, c.created));
                }
                (Held::Quarantine(_), Some(q)) => ended.push(q),
                _ => {}
            },
            Err(e) => {
                tracing::warn!(error = %e, "pod GC: the apiserver cannot confirm; nothing released");
                break;
            }
        }
    }
    if !released.is_empty() {
        match ipam.release_pods_gone(&released).await {
            Ok(done) => {
                ipam.metrics().pod_gc("released", done.len());
                for r in &done {
                    suspects.clear(&Held::Attachment(r.key.clone()));
                }
            }
            Err(e) => tracing::error!(error = %e, "pod GC: release failed"),
        }
    }
    for q in ended {
        match ipam.end_quarantine(&q).await {
            Ok(Some(_)) => {
                ipam.metrics().pod_gc("unquarantined", 1);
                suspects.clear(&Held::Quarantine(q.key));
            }
            Ok(None) => {}
            Err(e) => tracing::error!(error = %e, "pod GC: ending a quarantine failed"),
        }
    }
}
