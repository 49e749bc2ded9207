//! host-local's files: one per address in `<dataDir>/<network>`, named by the address, holding
//! `<container id>\r\n<interface>` (a host-local older than v0.7: the container id alone), beside
//! its own `lock` and `last_reserved_ip.<n>`.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::Path;
use std::time::SystemTime;

/// One container's interface as host-local recorded it: its addresses (IPv4 first).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Allocation {
    pub container_id: String,
    pub ifname: String,
    pub ips: Vec<IpAddr>,
}

/// What a listing found.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Found {
    pub allocations: Vec<Allocation>,
    /// Addresses whose file was written before `since` (the node's last boot): their
    /// containers did not survive it.
    pub stale: Vec<IpAddr>,
}

/// host-local's allocations in `dir`, by container and interface; nothing when the directory
/// does not exist. Listed under host-local's own lock (`<dir>/lock`, shared), so that no
/// host-local ADD or DEL is half done meanwhile. A file written before `since` is stale; any
/// file not named by an address is passed over, and so is one gone before it was read. A file
/// naming no container is passed over, said in the log.
pub fn read_allocations(dir: &Path, since: Option<SystemTime>) -> std::io::Result<Found> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Found::default()),
        Err(e) => return Err(e),
    };
    let _lock = lock_shared(&dir.join("lock"))?;
    let mut found = Found::default();
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
        let (text, modified) = match read_file(&entry.path()) {
            Ok(Some(f)) => f,
            Ok(None) => continue,
            Err(e) => return Err(e),
        };
        if since.is_some_and(|boot| modified < boot) {
            found.stale.push(ip);
            continue;
        }
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
    found.allocations = by_owner
        .into_iter()
        .map(|((container_id, ifname), mut ips)| {
            ips.sort_by_key(|ip| (ip.is_ipv6(), *ip));
            Allocation {
                container_id,
                ifname,
                ips,
            }
        })
        .collect();
    found.stale.sort();
    Ok(found)
}

/// A regular file's text and when it was last written; None: not a regular file, or gone.
fn read_file(path: &Path) -> std::io::Result<Option<(String, SystemTime)>> {
    let gone = |e: &std::io::Error| e.kind() == std::io::ErrorKind::NotFound;
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) if m.is_file() => m,
        Ok(_) => return Ok(None),
        Err(e) if gone(&e) => return Ok(None),
        Err(e) => return Err(e),
    };
    match std::fs::read_to_string(path) {
        Ok(t) => Ok(Some((t, meta.modified()?))),
        Err(e) if gone(&e) => Ok(None),
        Err(e) => Err(e),
    }
}

/// host-local's lock on its directory, shared (it takes it exclusively for each call); none
/// when host-local never made one (a read-only mount cannot make it either).
fn lock_shared(path: &Path) -> std::io::Result<Option<std::fs::File>> {
    let file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    rustix::fs::flock(&file, rustix::fs::FlockOperation::LockShared)?;
    Ok(Some(file))
}

/// When this machine last booted (`btime` in /proc/stat); None where it cannot be read.
pub fn booted_at() -> Option<SystemTime> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let secs: u64 = stat
        .lines()
        .find_map(|l| l.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()?;
    Some(SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(secs))
}

#[cfg(test)]
mod tests;
