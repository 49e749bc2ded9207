//! Leak reclaim without Kubernetes: an attachment whose network namespace path no longer exists
//! lost its DEL. It is released only when two checks at least `min_gap` apart both find the path
//! missing (Calico's rule: one observation can race a runtime that is still setting up), never
//! for a sticky pod, and never when the path's directory itself is not visible (ipoold cannot
//! tell, e.g. /var/run/netns is not mounted into its container).

use std::path::Path;
use std::time::Duration;

use super::suspects::Suspects;
use super::{Ipam, ReleaseBy, Released};
use crate::error::Error;
use crate::model::Millis;
use crate::store::AttachmentKey;

/// Attachments seen without their network namespace. Kept by the caller between checks.
pub type LeakSuspects = Suspects<AttachmentKey>;

/// Some(true): the namespace at `path` is gone; Some(false): it is there; None: ipoold cannot
/// tell (the directory it would be in is not visible here).
pub fn netns_gone(path: &str) -> Option<bool> {
    let p = Path::new(path);
    if p.symlink_metadata().is_ok() {
        return Some(false);
    }
    let judge_by = if path.starts_with("/proc/") {
        // /proc/<pid>/ns/net disappears with its process; ipoold sees the runtime's processes
        // only in the host's PID namespace (a pod without hostPID sees its own).
        if !in_host_pid_namespace() {
            return None;
        }
        Path::new("/proc/self")
    } else {
        p.parent()?
    };
    judge_by.exists().then_some(true)
}

/// True when ipoold runs in the initial PID namespace (its inode is the kernel's
/// PROC_PID_INIT_INO).
fn in_host_pid_namespace() -> bool {
    use std::os::unix::fs::MetadataExt;
    const PROC_PID_INIT_INO: u64 = 0xEFFF_FFFC;
    std::fs::metadata("/proc/self/ns/pid").is_ok_and(|m| m.ino() == PROC_PID_INIT_INO)
}

impl Ipam {
    /// One leak check. Releases the attachments whose namespace was missing now and at a check
    /// at least `min_gap` earlier; returns them (each is logged with its reason).
    pub async fn leak_check(
        &self,
        suspects: &mut LeakSuspects,
        min_gap: Duration,
    ) -> Result<Vec<Released>, Error> {
        let candidates: Vec<(AttachmentKey, Millis, String)> = {
            let st = self.lock();
            st.attachments
                .iter()
                .filter(|r| !r.netns().is_empty())
                .filter(|r| {
                    st.networks
                        .get(r.network())
                        .is_none_or(|n| !n.def.tuning.sticky.applies_to(r.pod_name()))
                })
                .map(|r| (r.key(), r.created_at_ms(), r.netns().to_string()))
                .collect()
        };
        // Filesystem checks happen outside the state lock.
        let now = self.now();
        let gap = u64::try_from(min_gap.as_millis()).unwrap_or(u64::MAX);
        let missing: Vec<(AttachmentKey, Millis, String)> = candidates
            .into_iter()
            .filter(|(_, _, netns)| netns_gone(netns) == Some(true))
            .collect();
        let paths: std::collections::HashMap<AttachmentKey, String> = missing
            .iter()
            .map(|(k, _, p)| (k.clone(), p.clone()))
            .collect();
        let mut due: Vec<(AttachmentKey, Millis)> = Vec::new();
        for (key, created, first) in
            suspects.check(missing.into_iter().map(|(k, c, _)| (k, c)), now)
        {
            // A network namespace has no age of its own here: the gap alone decides.
            if first < now && now - first >= gap {
                due.push((key, created));
            } else if first == now {
                let netns = paths.get(&key).map(String::as_str).unwrap_or_default();
                tracing::info!(network = %key.network, container = %key.container_id, ifname = %key.ifname, %netns, "network namespace missing; released if still missing at the next check");
            }
        }
        for (key, _) in &due {
            suspects.clear(key);
        }
        self.release_unchanged(&due, ReleaseBy::Leak).await
    }
}
