//! Taking over host-local's allocations in place (docs/configuration.md, "Switching from
//! host-local"): before the first ADD or DEL of a network is served (a network a CNI config
//! declares, or one of ipoold's config file), the addresses host-local handed out for it (its
//! `dataDir`, `/var/lib/cni/networks` unless the CNI config says otherwise; see [`files`])
//! become ipoold's attachments, one ADD per container interface asking for its addresses. The
//! running pods keep their addresses, their DELs release them, and no new pod gets one.
//!
//! Once per network, recorded in the store when it is done (`Change::PutTakenOver`): a
//! restart takes nothing over again. One stopped part-way (the store, the apiserver, a bad
//! config, a crash) is not done: the next ADD or DEL goes on with it, finding what it took as
//! it left it (an ADD of an attachment that exists is answered as it is). Until it is done
//! every ADD and DEL of the network waits for it. A network an older ipoold knew counts as
//! taken over (`ipam::recover`). host-local's files are left as they are (going back to
//! host-local stays possible).
//!
//! With `[kubernetes]` an allocation is taken over for the pod on this node that reports its
//! address, so the pod GC releases it once that pod is gone; one no pod reports (a secondary
//! network's, a pod whose status is not written yet) is taken over for no pod, and held until
//! its DEL or the runtime's GC, as without `[kubernetes]`: kept too long rather than given to
//! a second pod. Files written before the node's last boot are history: their containers are
//! gone.
//!
//! # Layout
//! - [`files`]: host-local's files read (one per address: the container id and interface).

pub mod files;

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::path::Path;
use std::sync::Arc;

use crate::config::IpamSection;
use crate::error::Error;
use crate::ipam::{AddRequest, Ipam};
use crate::k8s::Pods;
use crate::store::{AttachmentKey, Pod};
use files::{booted_at, read_allocations, Allocation};

/// host-local's `dataDir` when its config names none.
pub const DEFAULT_DATA_DIR: &str = "/var/lib/cni/networks";

/// Serialises take-overs: the first ADD or DEL of a network takes it over, those that come
/// meanwhile wait for it and then find it done.
#[derive(Debug, Default)]
pub struct Takeover {
    one: Arc<tokio::sync::Mutex<()>>,
}

impl Takeover {
    /// Takes over host-local's allocations of `network` unless that is done (see the module).
    pub async fn network(
        &self,
        ipam: &Ipam,
        pods: Option<&Pods>,
        network: &str,
        section: Option<&IpamSection>,
    ) -> Result<(), Error> {
        if !ipam.host_local_due(network) {
            return Ok(());
        }
        let section = section.cloned().unwrap_or_default();
        // A cluster pool's network: its blocks are the cluster's, not this node's range
        // (adopting addresses into a pool is another matter).
        if section.cluster_pool.is_some() {
            return ipam.host_local_done(network).await;
        }
        // Unknown, and declared by nothing: the request is refused as it is.
        if !ipam.knows_network(network) && section.range_sets().is_empty() {
            return Ok(());
        }
        let one = self.one.clone();
        let (ipam, pods, name) = (ipam.clone(), pods.cloned(), network.to_string());
        // A task of its own: the call that started it may be given up (the plugin's deadline),
        // the take-over is not.
        let task = tokio::spawn(async move {
            let _one = one.lock().await;
            if !ipam.host_local_due(&name) {
                return Ok(());
            }
            take_over_all(&ipam, pods.as_ref(), &name, &section).await?;
            ipam.host_local_done(&name).await
        });
        task.await.map_err(|e| {
            Error::Busy(format!(
                "taking over host-local's allocations of network {network:?} failed ({e}); the next call tries again"
            ))
        })?
    }
}

/// Takes over host-local's allocations of `network`. Listed twice: a host-local call under way
/// at the first listing (its lock held) shows in the second. An error: not done.
async fn take_over_all(
    ipam: &Ipam,
    pods: Option<&Pods>,
    network: &str,
    section: &IpamSection,
) -> Result<(), Error> {
    let root = section.data_dir.as_deref().unwrap_or(DEFAULT_DATA_DIR);
    if section.data_dir.is_some() && !Path::new(root).is_dir() {
        return Err(Error::InvalidConfig(format!(
            "network {network:?}: ipam.dataDir {root} is no directory ipoold can see (host-local's allocations are taken over from it: mount it into ipoold's container, or drop dataDir if host-local never served this network)"
        )));
    }
    let dir = Path::new(root).join(network);
    let metrics = ipam.metrics_handle();
    let mut taken = BTreeSet::new();
    for listing in 0..2 {
        let found = read_allocations(&dir, booted_at()).map_err(|e| {
            Error::InvalidConfig(format!(
                "network {network:?}: host-local's allocations in {} cannot be read: {e} (ipoold takes them over before it serves a network; mount host-local's dataDir into ipoold, or set ipam.dataDir to where they are)",
                dir.display()
            ))
        })?;
        if listing == 0 && !found.stale.is_empty() {
            tracing::info!(network, dir = %dir.display(), addresses = ?found.stale, "host-local's allocations from before the node's last boot passed over: their containers are gone");
            metrics.host_local("stale", found.stale.len());
        }
        let todo: Vec<Allocation> = found
            .allocations
            .into_iter()
            .filter(|a| !taken.contains(&(a.container_id.clone(), a.ifname.clone())))
            .collect();
        if todo.is_empty() {
            break;
        }
        if let Some(p) = pods.filter(|p| !p.synced()) {
            return Err(Error::Busy(format!(
                "network {network:?}: waiting for the pods of node {:?} before taking over host-local's {} allocation(s) in {}",
                p.node(),
                todo.len(),
                dir.display()
            )));
        }
        tracing::info!(network, dir = %dir.display(), allocations = todo.len(), "taking over host-local's allocations before the network is served");
        for a in todo {
            let action = take_over(ipam, pods, network, section, &a).await?;
            metrics.host_local(action, 1);
            taken.insert((a.container_id, a.ifname));
        }
    }
    Ok(())
}

/// Whether `e` ends the take-over for now (it is not done; the next call goes on): what
/// passes (the store, the apiserver, a gate) and what no allocation can get past (the network's
/// config).
fn stops(e: &Error) -> bool {
    e.is_busy()
        || matches!(
            e,
            Error::Store(_) | Error::InvalidConfig(_) | Error::NotFound(_)
        )
}

/// Takes over one allocation; what became of it (`imported`, `unreported`: for no pod, none
/// reporting its address; `refused`: the log says why). An address outside the network's
/// ranges is left out, the others taken over.
async fn take_over(
    ipam: &Ipam,
    pods: Option<&Pods>,
    network: &str,
    section: &IpamSection,
    a: &Allocation,
) -> Result<&'static str, Error> {
    let (pod, k8s) = reported_by(pods, &a.ips).await?;
    let shown = match pod.name.is_empty() {
        true => "-".to_string(),
        false => format!("{}/{}", pod.namespace, pod.name),
    };
    let add = |requested: Vec<IpAddr>| {
        ipam.add(AddRequest {
            key: AttachmentKey {
                network: network.to_string(),
                container_id: a.container_id.clone(),
                ifname: a.ifname.clone(),
            },
            pod: pod.clone(),
            netns: String::new(),
            ipam: Some(section.clone()),
            requested,
            k8s: k8s.clone(),
            pools: None,
            fixed: false,
        })
    };
    let ips = |v: &[IpAddr]| {
        v.iter()
            .map(IpAddr::to_string)
            .collect::<Vec<_>>()
            .join(",")
    };
    let mut result = add(a.ips.clone()).await;
    if matches!(&result, Err(e) if !stops(e)) && a.ips.len() > 1 {
        // One address the network cannot hold (outside its ranges, say): the others alone.
        for ip in &a.ips {
            result = add(vec![*ip]).await;
            if !matches!(&result, Err(e) if !stops(e)) {
                break;
            }
        }
    }
    match result {
        Ok(reply) => {
            let got: Vec<IpAddr> = reply.leases.iter().map(|l| l.ip).collect();
            tracing::info!(network, container = %a.container_id, ifname = %a.ifname, address = %ips(&got), host_local = %ips(&a.ips), pod = %shown, "host-local's allocation taken over");
            Ok(match pods.is_some() && pod.name.is_empty() {
                true => "unreported",
                false => "imported",
            })
        }
        Err(e) if stops(&e) => {
            tracing::warn!(network, container = %a.container_id, address = %ips(&a.ips), error = %e, "host-local's allocations not taken over yet: the next ADD or DEL of the network goes on");
            Err(e)
        }
        Err(e) => {
            tracing::error!(network, container = %a.container_id, address = %ips(&a.ips), error = %e, "host-local's allocation not taken over: if its container still runs, keep its address out (ipoolctl reserve) until it is gone");
            Ok("refused")
        }
    }
}

/// The pod on this node that reports one of `ips` (with `[kubernetes]`), as an ADD of it
/// would name it; none: no pod.
async fn reported_by(
    pods: Option<&Pods>,
    ips: &[IpAddr],
) -> Result<(Pod, Option<crate::model::PodMeta>), Error> {
    let Some(pods) = pods else {
        return Ok((Pod::default(), None));
    };
    let live = pods.all().into_iter().find(|p| {
        crate::k8s::meta::pod_ips(p)
            .iter()
            .any(|ip| ips.contains(ip))
    });
    let Some(live) = live else {
        return Ok((Pod::default(), None));
    };
    let pod = Pod {
        namespace: live.metadata.namespace.clone().unwrap_or_default(),
        name: live.metadata.name.clone().unwrap_or_default(),
        uid: live.metadata.uid.clone().unwrap_or_default(),
    };
    let info = pods.info_for(&pod).await?;
    Ok((pod, Some(info.meta)))
}

#[cfg(test)]
mod tests;
