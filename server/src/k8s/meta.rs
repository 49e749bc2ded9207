//! What an ADD takes from its pod: the owner, stickiness (`ipool.io/sticky`,
//! `ipool.io/sticky-ttl`, else an owner of kind StatefulSet or one of `sticky_kinds`) and
//! static addresses (`ipool.io/ips`).

use std::net::IpAddr;

use ipool_proto::names::shown;
use k8s_openapi::api::core::v1::Pod;

use super::annotation::BadAnnotation;
use crate::model::{at_most, PodMeta, MAX_SECS};

pub const STICKY: &str = "ipool.io/sticky";
pub const STICKY_TTL: &str = "ipool.io/sticky-ttl";
pub const IPS: &str = "ipool.io/ips";

/// The pod's metadata for its attachment, and the addresses its annotation asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodInfo {
    pub meta: PodMeta,
    pub ips: Vec<IpAddr>,
    /// The pod's UID in the apiserver.
    pub uid: String,
    /// The cluster pools its annotation chooses (`ipool.io/pool(s)`, see
    /// [`super::selection`]); or why the annotation cannot be read (an error only for an ADD on
    /// a network of cluster pools).
    pub pools: Result<Option<crate::model::PoolChoice>, BadAnnotation>,
    /// The address that follows it from node to node (`ipool.io/fixed`, see [`super::fixed`]);
    /// or why the annotation cannot be read (an error only for an ADD on a network of cluster
    /// pools).
    pub fixed: Result<Option<super::fixed::Fixed>, BadAnnotation>,
}

/// Reads `pod`; an annotation that cannot be read is an error naming it and its value.
pub fn pod_info(pod: &Pod, sticky_kinds: &[String]) -> Result<PodInfo, BadAnnotation> {
    let md = &pod.metadata;
    let who = format!(
        "pod {}/{}",
        md.namespace.as_deref().unwrap_or_default(),
        md.name.as_deref().unwrap_or_default()
    );
    let owners = md.owner_references.as_deref().unwrap_or_default();
    let owner = owners
        .iter()
        .find(|o| o.controller == Some(true))
        .or(owners.first());
    let by_owner = owners
        .iter()
        .any(|o| o.kind == "StatefulSet" || sticky_kinds.contains(&o.kind));
    let annotation = |k: &str| md.annotations.as_ref().and_then(|a| a.get(k));
    let sticky = match annotation(STICKY).map(|v| v.trim()) {
        None => by_owner,
        Some("true") => true,
        Some("false") => false,
        Some(v) => {
            return Err(BadAnnotation(format!(
                "{who}: annotation {STICKY}={} is neither \"true\" nor \"false\"",
                shown(v)
            )))
        }
    };
    let sticky_ttl_secs = match annotation(STICKY_TTL) {
        None => None,
        Some(v) => {
            let secs = v
                .trim()
                .parse::<u64>()
                .ok()
                .filter(|s| *s > 0)
                .ok_or_else(|| {
                    BadAnnotation(format!(
                        "{who}: annotation {STICKY_TTL}={} is not a number of seconds (at least 1)",
                        shown(v)
                    ))
                })?;
            at_most(
                &format!("{who}: annotation {STICKY_TTL}"),
                secs,
                MAX_SECS,
                "a year",
            )?;
            Some(secs)
        }
    };
    let ips = match annotation(IPS) {
        None => Vec::new(),
        Some(v) => v
            .split(',')
            .map(str::trim)
            .filter(|a| !a.is_empty())
            .map(|a| {
                a.parse::<IpAddr>().map_err(|_| {
                    BadAnnotation(format!(
                        "{who}: annotation {IPS}={}: {} is not an IP address",
                        shown(v),
                        shown(a)
                    ))
                })
            })
            .collect::<Result<_, _>>()?,
    };
    Ok(PodInfo {
        meta: PodMeta {
            owner: owner
                .map(|o| format!("{}/{}", o.kind, o.name))
                .unwrap_or_default(),
            sticky,
            sticky_ttl_secs,
            fixed: None,
        },
        ips,
        uid: runtime_uid(pod).to_string(),
        pools: super::selection::chosen(md.annotations.as_ref(), &who),
        fixed: super::fixed::fixed(pod, &who),
    })
}

/// The pod's UID, "" when it has none.
pub fn uid(pod: &Pod) -> &str {
    pod.metadata.uid.as_deref().unwrap_or_default()
}

/// The annotation kubelet puts on a static pod's mirror: the UID kubelet (and so the runtime,
/// in K8S_POD_UID) knows the pod by, not the mirror's own.
pub const MIRROR: &str = "kubernetes.io/config.mirror";

/// The UID the runtime knows `pod` by: a static pod's (its mirror's `config.mirror`
/// annotation), else the pod's own.
pub fn runtime_uid(pod: &Pod) -> &str {
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(MIRROR))
        .map(String::as_str)
        .filter(|m| !m.is_empty())
        .unwrap_or_else(|| uid(pod))
}

/// The node the pod is bound to, "" when none yet.
pub fn node_of(pod: &Pod) -> &str {
    pod.spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .unwrap_or_default()
}

/// True when the pod has finished (phase Succeeded or Failed): its containers are gone, and
/// what it held goes with them.
pub fn finished(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

/// `pod` reduced to what ipool reads (metadata that names it, its owner, ipool's and the
/// mirror's annotations, node, hostNetwork, phase, addresses): what the watch cache keeps.
pub fn strip(pod: &mut Pod) {
    let md = &mut pod.metadata;
    md.managed_fields = None;
    // Of the labels, only KubeVirt's that name a launcher pod's VM (its fixed address) and
    // the migration a target launcher is for.
    md.labels = md
        .labels
        .take()
        .map(|l| {
            l.into_iter()
                .filter(|(k, _)| k == super::fixed::VM_LABEL || k == super::fixed::MIGRATION_LABEL)
                .collect::<std::collections::BTreeMap<_, _>>()
        })
        .filter(|l| !l.is_empty());
    md.generate_name = None;
    md.finalizers = None;
    if let Some(a) = md.annotations.as_mut() {
        a.retain(|k, _| k.starts_with("ipool.io/") || k == MIRROR);
    }
    if let Some(owners) = md.owner_references.as_mut() {
        for o in owners.iter_mut() {
            o.api_version = String::new();
            o.block_owner_deletion = None;
        }
    }
    if let Some(spec) = pod.spec.take() {
        pod.spec = Some(k8s_openapi::api::core::v1::PodSpec {
            node_name: spec.node_name,
            host_network: spec.host_network,
            ..Default::default()
        });
    }
    if let Some(status) = pod.status.take() {
        pod.status = Some(k8s_openapi::api::core::v1::PodStatus {
            phase: status.phase,
            pod_ip: status.pod_ip,
            pod_ips: status.pod_ips,
            ..Default::default()
        });
    }
}

/// True when `pod` is the pod the runtime calls `want_uid` ("" matches any).
pub fn same_pod(pod: &Pod, want_uid: &str) -> bool {
    want_uid.is_empty()
        || uid(pod) == want_uid
        || pod
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(MIRROR))
            .is_some_and(|m| m == want_uid)
}

/// The addresses `status.podIPs` reports for a running pod with its own network namespace (a
/// hostNetwork pod reports the node's; a finished pod keeps reporting addresses its DEL gave
/// back).
pub fn pod_ips(pod: &Pod) -> Vec<IpAddr> {
    if pod.spec.as_ref().and_then(|s| s.host_network) == Some(true) || finished(pod) {
        return Vec::new();
    }
    let status = pod.status.as_ref();
    let mut ips: Vec<IpAddr> = status
        .and_then(|s| s.pod_ips.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|p| p.ip.parse().ok())
        .collect();
    if ips.is_empty() {
        ips.extend(status.and_then(|s| s.pod_ip.as_ref()?.parse::<IpAddr>().ok()));
    }
    ips
}

#[cfg(test)]
mod tests;
