//! Taking over host-local's allocations in place (docs/configuration.md, "Switching from
//! host-local"): before the first ADD of a network is served (a network a CNI config declares,
//! or one of ipoold's config file), the addresses host-local handed out for it (its `dataDir`,
//! `/var/lib/cni/networks` unless the CNI config says otherwise: one file per address, named by
//! it, holding the container id and the interface) become ipoold's attachments. The running
//! pods keep their addresses, their DELs release them, and no new pod gets one. Once per
//! network, recorded in the store (`Change::PutTakenOver`): a restart takes nothing over again,
//! nor does ipoold for a network an older ipoold served (its pods were seen to since); one
//! interrupted (the store, the apiserver) goes on at the next ADD, finding what it took as it
//! left it. host-local's files are left as they are (going back to host-local stays possible).
//!
//! With `[kubernetes]`, an allocation is taken over for the pod on this node that reports its
//! address (so the pod GC judges it as any other pod's attachment); one no live pod reports is
//! left free: nothing uses it (a pod that comes to report it later is quarantined by the
//! pods-as-truth rules, as any address the store did not hold).

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::Arc;

use crate::config::IpamSection;
use crate::error::Error;
use crate::ipam::{AddRequest, Ipam};
use crate::k8s::Pods;
use crate::store::{AttachmentKey, Pod};

/// Tries of an allocation whose take-over failed for a reason that passes, half a second apart.
const RETRIES: usize = 60;

/// host-local's `dataDir` when its config names none.
pub const DEFAULT_DATA_DIR: &str = "/var/lib/cni/networks";

/// One container's interface as host-local recorded it: its addresses (one per range set).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Allocation {
    pub container_id: String,
    pub ifname: String,
    pub ips: Vec<IpAddr>,
}

/// host-local's allocations in `dir` (`<dataDir>/<network>`), by container and interface; none
/// when the directory does not exist. Its own files (`lock`, `last_reserved_ip.<n>`) and any
/// file not named by an address are passed over. A file written by a host-local older than
/// v0.7 holds the container id alone: its interface is taken as `eth0`, the one kubelet names.
pub fn read_allocations(dir: &Path) -> std::io::Result<Vec<Allocation>> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut by_owner: BTreeMap<(String, String), Vec<IpAddr>> = BTreeMap::new();
    for entry in entries {
        let entry = entry?;
        let Some(ip) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<IpAddr>().ok())
        else {
            continue;
        };
        if !entry.file_type()?.is_file() {
            continue;
        }
        let text = std::fs::read_to_string(entry.path())?;
        let mut lines = text.lines().map(str::trim).filter(|l| !l.is_empty());
        let Some(id) = lines.next() else {
            tracing::warn!(file = %entry.path().display(), "host-local's file of an address names no container: not taken over");
            continue;
        };
        let ifname = lines.next().unwrap_or("eth0");
        by_owner
            .entry((id.to_string(), ifname.to_string()))
            .or_default()
            .push(ip);
    }
    Ok(by_owner
        .into_iter()
        .map(|((container_id, ifname), mut ips)| {
            // IPv4 first, as host-local's range sets usually come.
            ips.sort_by_key(|ip| (ip.is_ipv6(), *ip));
            Allocation {
                container_id,
                ifname,
                ips,
            }
        })
        .collect())
}

/// Where host-local kept the allocations of `network` declared by `section`.
pub fn data_dir(section: &IpamSection, network: &str) -> PathBuf {
    Path::new(section.data_dir.as_deref().unwrap_or(DEFAULT_DATA_DIR)).join(network)
}

/// Serialises take-overs: the first ADD of a network takes it over, those that come meanwhile
/// wait and find the network known. The first take-over ADD declares the network; until the
/// last allocation is taken over, an ADD that finds it known waits too (`running`), or it
/// could be handed an address whose container is not taken over yet.
#[derive(Debug, Default)]
pub struct Takeover {
    one: Arc<tokio::sync::Mutex<()>>,
    running: Arc<AtomicBool>,
}

impl Takeover {
    /// Takes over host-local's allocations of `network` unless that was done (see the module).
    pub async fn network(
        &self,
        ipam: &Ipam,
        pods: Option<&Pods>,
        network: &str,
        section: Option<&IpamSection>,
    ) -> Result<(), Error> {
        // Done, and no take-over under way: served. (Read in this order: a take-over's first
        // ADD makes the network known before it is done, with `running` set.)
        if !ipam.host_local_due(network) && !self.running.load(SeqCst) {
            return Ok(());
        }
        let section = section.cloned().unwrap_or_default();
        // A cluster pool's network: host-local never served it.
        if section.cluster_pool.is_some() {
            return ipam.host_local_done(network).await;
        }
        // Unknown, and declared by nothing: this ADD is refused as it is.
        if !ipam.knows_network(network) && section.range_sets().is_empty() {
            return Ok(());
        }
        let (one, running) = (self.one.clone(), self.running.clone());
        let (ipam, pods, network) = (ipam.clone(), pods.cloned(), network.to_string());
        // A task of its own: the ADD that started it may be given up (the plugin's deadline),
        // the take-over must not be, or the network would be served with some of host-local's
        // allocations not taken over yet.
        let task = tokio::spawn(async move {
            let _one = one.lock().await;
            if !ipam.host_local_due(&network) {
                return Ok(());
            }
            running.store(true, SeqCst);
            let _done = Finished(&running);
            take_over_all(&ipam, pods.as_ref(), &network, &section).await?;
            ipam.host_local_done(&network).await
        });
        task.await.map_err(|e| {
            Error::Busy(format!(
                "taking over host-local's allocations failed ({e}); the next ADD tries again"
            ))
        })?
    }
}

/// Takes over host-local's allocations of `network`, under the take-over's lock. An error:
/// not done (the next ADD tries again; those taken over already are found as they are).
async fn take_over_all(
    ipam: &Ipam,
    pods: Option<&Pods>,
    network: &str,
    section: &IpamSection,
) -> Result<(), Error> {
    let dir = data_dir(section, network);
    let found = read_allocations(&dir).map_err(|e| {
        Error::InvalidConfig(format!(
            "network {network:?}: host-local's allocations in {} cannot be read: {e} (ipoold takes them over when it first serves a network; mount host-local's dataDir into ipoold, or set ipam.dataDir to where they are)",
            dir.display()
        ))
    })?;
    if found.is_empty() {
        return Ok(());
    }
    if let Some(p) = pods.filter(|p| !p.synced()) {
        return Err(Error::Busy(format!(
            "network {network:?}: waiting for the pods of node {:?} before taking over host-local's {} allocation(s) in {}",
            p.node(),
            found.len(),
            dir.display()
        )));
    }
    tracing::info!(network, dir = %dir.display(), allocations = found.len(), "taking over host-local's allocations of a network ipoold serves for the first time");
    let metrics = ipam.metrics_handle();
    for a in found {
        // What would pass (the store, the apiserver, ranges still on their way) is waited out
        // here, then left to the next ADD: an allocation not taken over could go to a new pod
        // while its container still runs.
        let mut outcome = take_over(ipam, pods, network, section, &a).await;
        for _ in 0..RETRIES {
            if !matches!(outcome, Err(Error::Busy(_) | Error::Store(_))) {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(500)).await;
            outcome = take_over(ipam, pods, network, section, &a).await;
        }
        let ips = a
            .ips
            .iter()
            .map(IpAddr::to_string)
            .collect::<Vec<_>>()
            .join(",");
        match &outcome {
            Ok(Some(pod)) => {
                tracing::info!(network, container = %a.container_id, ifname = %a.ifname, address = %ips, pod = %pod, "host-local's allocation taken over")
            }
            Ok(None) => {
                tracing::info!(network, container = %a.container_id, address = %ips, "host-local's allocation left free: no pod on this node reports its address")
            }
            Err(e @ (Error::Busy(_) | Error::Store(_))) => {
                tracing::warn!(network, container = %a.container_id, address = %ips, error = %e, "host-local's allocation not taken over yet: the next ADD tries again");
                return Err(Error::Busy(format!(
                    "network {network:?}: taking over host-local's allocation of {ips} (container {}): {e}",
                    a.container_id
                )));
            }
            Err(e) => {
                tracing::error!(network, container = %a.container_id, address = %ips, error = %e, "host-local's allocation not taken over: if its container still runs, keep its address out (ipoolctl reserve) until it is gone")
            }
        }
        let action = match outcome {
            Ok(Some(_)) => "imported",
            Ok(None) => "unused",
            Err(_) => "refused",
        };
        metrics.host_local(action);
    }
    Ok(())
}

/// Clears the take-over's mark however it ends (an ADD's future dropped with its caller).
struct Finished<'a>(&'a AtomicBool);

impl Drop for Finished<'_> {
    fn drop(&mut self) {
        self.0.store(false, SeqCst);
    }
}

/// Takes over one allocation: an ADD of its container's interface asking for its addresses.
/// Ok(None): left free (no live pod reports it, with `[kubernetes]`); Ok(Some(pod)): taken
/// over (for that pod, or "-" without `[kubernetes]`).
async fn take_over(
    ipam: &Ipam,
    pods: Option<&Pods>,
    network: &str,
    section: &IpamSection,
    a: &Allocation,
) -> Result<Option<String>, Error> {
    let (pod, k8s) = match pods {
        None => (Pod::default(), None),
        Some(pods) => {
            let live = pods.all().into_iter().find(|p| {
                crate::k8s::meta::pod_ips(p)
                    .iter()
                    .any(|ip| a.ips.contains(ip))
            });
            let Some(live) = live else {
                return Ok(None);
            };
            let pod = Pod {
                namespace: live.metadata.namespace.clone().unwrap_or_default(),
                name: live.metadata.name.clone().unwrap_or_default(),
                uid: live.metadata.uid.clone().unwrap_or_default(),
            };
            let info = pods.info_for(&pod).await?;
            (pod, Some(info.meta))
        }
    };
    let shown = match pod.name.is_empty() {
        true => "-".to_string(),
        false => format!("{}/{}", pod.namespace, pod.name),
    };
    ipam.add(AddRequest {
        key: AttachmentKey {
            network: network.to_string(),
            container_id: a.container_id.clone(),
            ifname: a.ifname.clone(),
        },
        pod,
        netns: String::new(),
        ipam: Some(section.clone()),
        requested: a.ips.clone(),
        k8s,
        pools: None,
        fixed: false,
    })
    .await?;
    Ok(Some(shown))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_locals_files_are_read_by_container_and_interface() {
        let d = tempfile::tempdir().unwrap();
        let w = |name: &str, body: &str| std::fs::write(d.path().join(name), body).unwrap();
        w("10.1.0.2", "abc\r\neth0");
        w("fd00::2", "abc\r\neth0");
        w("10.1.0.3", "abc\r\nnet1");
        w("10.1.0.4", "old");
        w("10.1.0.5", "");
        w("lock", "");
        w("last_reserved_ip.0", "10.1.0.4");
        let got = read_allocations(d.path()).unwrap();
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        assert_eq!(
            got,
            vec![
                Allocation {
                    container_id: "abc".into(),
                    ifname: "eth0".into(),
                    ips: vec![ip("10.1.0.2"), ip("fd00::2")],
                },
                Allocation {
                    container_id: "abc".into(),
                    ifname: "net1".into(),
                    ips: vec![ip("10.1.0.3")],
                },
                Allocation {
                    container_id: "old".into(),
                    ifname: "eth0".into(),
                    ips: vec![ip("10.1.0.4")],
                },
            ]
        );
        assert!(read_allocations(&d.path().join("none")).unwrap().is_empty());
    }
}
