//! The pod GC (Calico's rules, Terway's re-check): an attachment whose pod is gone (not in the
//! watch cache, or there with another UID) is released only when it was seen gone at two
//! checks at least `gc_grace_secs` apart, it is at least that old, and a live GET just before
//! confirms it (404, or another UID). Any check that finds the pod clears the suspicion. No
//! check runs before the first full list, nor while the apiserver does not answer. A sticky
//! pod's addresses become its reservation. Quarantines (see [`crate::ipam::Ipam::quarantine`])
//! end by the same rules; they are made after each full list.

use std::collections::HashMap;
use std::time::Duration;

use super::meta::{pod_ips, same_pod, uid};
use super::Pods;
use crate::ipam::{Ipam, LivePod, Quarantine};
use crate::model::{Millis, Pod};
use crate::store::AttachmentKey;

/// What the GC may release.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Held {
    Attachment(AttachmentKey),
    Quarantine(crate::model::ReservationKey),
}

/// Things seen without their pod: -> (their creation time, when first seen so).
#[derive(Default)]
pub struct Suspects(HashMap<Held, (Millis, Millis)>);

/// A thing the GC judges, with its pod.
struct Candidate {
    held: Held,
    pod: Pod,
    created: Millis,
    quarantine: Option<Quarantine>,
}

/// How often the GC checks: half the grace, within [0.2 s, 10 s].
pub fn period(grace_secs: u64) -> Duration {
    Duration::from_millis((grace_secs.saturating_mul(500)).clamp(200, 10_000))
}

/// How often the loop looks for a new list or new ranges to quarantine against (ADDs wait
/// for it).
const QUARANTINE_CHECK: Duration = Duration::from_millis(100);

/// Runs the GC and the quarantines, forever.
pub async fn run(ipam: Ipam, pods: Pods) {
    let every = period(pods.settings().gc_grace_secs);
    let mut suspects = Suspects::default();
    let mut paused = false;
    // (list count, ranges version) last quarantined against.
    let mut done = None;
    let mut next_check = tokio::time::Instant::now() + every;
    loop {
        tokio::time::sleep(QUARANTINE_CHECK).await;
        if !pods.synced() {
            continue;
        }
        let now = (pods.list_count(), ipam.ranges_version());
        if done != Some(now) && quarantine(&ipam, &pods).await {
            pods.quarantined(now.1);
            ipam.gate_opened();
            done = Some(now);
        }
        if tokio::time::Instant::now() < next_check {
            continue;
        }
        next_check = tokio::time::Instant::now() + every;
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
        check(&ipam, &pods, &mut suspects).await;
    }
}

/// Quarantines the addresses live pods report that the store does not hold for them. False
/// when it could not be done (the store failed).
pub async fn quarantine(ipam: &Ipam, pods: &Pods) -> bool {
    let live: Vec<LivePod> = pods
        .all()
        .iter()
        .map(|p| LivePod {
            pod: Pod {
                namespace: p.metadata.namespace.clone().unwrap_or_default(),
                name: p.metadata.name.clone().unwrap_or_default(),
                uid: uid(p).to_string(),
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
        Err(crate::error::Error::Busy(why)) => {
            tracing::debug!(%why, "the live pods' addresses are not quarantined yet");
            false
        }
        Err(e) => {
            tracing::error!(error = %e, "cannot quarantine the live pods' addresses");
            false
        }
    }
}

/// One GC check.
pub async fn check(ipam: &Ipam, pods: &Pods, suspects: &mut Suspects) {
    let grace = pods.settings().gc_grace_secs.saturating_mul(1000);
    let now = ipam.now();
    let attachments = ipam.pod_attachments().into_iter().map(|a| Candidate {
        held: Held::Attachment(a.key),
        pod: a.pod,
        created: a.created_at_ms,
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
        quarantine: Some(q),
    });
    let mut due = Vec::new();
    let mut seen = HashMap::new();
    for c in attachments.chain(quarantines) {
        let alive = pods
            .cached(&c.pod.namespace, &c.pod.name)
            .is_some_and(|p| same_pod(&p, &c.pod.uid));
        if alive {
            continue;
        }
        let first = suspects
            .0
            .get(&c.held)
            .filter(|(created, _)| *created == c.created)
            .map_or(now, |(_, first)| *first);
        seen.insert(c.held.clone(), (c.created, first));
        if first == now {
            tracing::info!(pod = %format!("{}/{}", c.pod.namespace, c.pod.name), uid = %c.pod.uid, held = ?c.held, "pod not in the apiserver's list; released if still gone after the grace");
        }
        if now.saturating_sub(first) >= grace && now.saturating_sub(c.created) >= grace {
            due.push(c);
        }
    }
    // Seen alive (or gone from the store) since: no longer suspects.
    suspects.0 = seen;
    let mut gone = Vec::new();
    let mut ended = Vec::new();
    for c in due {
        match pods.get_live(&c.pod.namespace, &c.pod.name).await {
            // The same pod, still on this node (a pod bound elsewhere holds nothing here).
            Ok(Some(p))
                if same_pod(&p, &c.pod.uid)
                    && p.spec.as_ref().and_then(|s| s.node_name.as_deref())
                        == Some(pods.node()) =>
            {
                suspects.0.remove(&c.held);
            }
            Ok(_) => match (c.held, c.quarantine) {
                (Held::Attachment(key), _) => gone.push((key, c.created)),
                (Held::Quarantine(_), Some(q)) => ended.push(q),
                _ => {}
            },
            Err(e) => {
                tracing::warn!(error = %e, "pod GC: the apiserver cannot confirm; nothing released");
                break;
            }
        }
    }
    if !gone.is_empty() {
        match ipam.release_pods_gone(&gone).await {
            Ok(released) => {
                ipam.metrics().pod_gc("released", released.len());
                for r in &released {
                    suspects.0.remove(&Held::Attachment(r.key.clone()));
                }
            }
            Err(e) => tracing::error!(error = %e, "pod GC: release failed"),
        }
    }
    for q in ended {
        match ipam.end_quarantine(&q).await {
            Ok(Some(_)) => {
                ipam.metrics().pod_gc("unquarantined", 1);
                suspects.0.remove(&Held::Quarantine(q.key));
            }
            Ok(None) => {}
            Err(e) => tracing::error!(error = %e, "pod GC: ending a quarantine failed"),
        }
    }
}
