//! `ranges_from = "flannel"`: the node's subnet as flannel writes it to
//! `/run/flannel/subnet.env` (atomically, by rename): `FLANNEL_SUBNET=10.244.1.1/24` is the
//! first usable address with the prefix (subnet 10.244.1.0/24, gateway 10.244.1.1),
//! `FLANNEL_IPV6_SUBNET` likewise; `FLANNEL_NETWORK` and `FLANNEL_IPV6_NETWORK` (the whole
//! cluster's networks, one CIDR or a comma-separated list) become routes. The file is read
//! again every [`POLL_EVERY`]; a change takes effect once two reads [`CONFIRM_AFTER`] apart
//! agree (a file written in place can be read half written).

use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Duration;

use ipnet::IpNet;
use ipool_proto::names::shown;

use super::{Feed, Seen, REMIND_EVERY};
use crate::model::RouteSpec;
use crate::range::RangeSpec;

/// How often the file is read (a change is picked up within this).
pub const POLL_EVERY: Duration = Duration::from_secs(2);

/// How soon a read that differs from what applies is read again, to confirm it.
pub const CONFIRM_AFTER: Duration = Duration::from_millis(250);

/// The largest subnet file read (flannel's is about 100 bytes).
const MAX_FILE: u64 = 64 * 1024;

/// What a subnet file says, as ranges and routes.
pub fn parse(path: &Path, text: &str) -> Seen {
    let mut subnets = Vec::new();
    let mut routes = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let Some((key, value)) = line.split_once('=') else {
            return Seen::Bad(format!(
                "{} line {}: {} is not KEY=VALUE",
                path.display(),
                n + 1,
                shown(line)
            ));
        };
        let value = value.trim().trim_matches('"');
        let bad = |what: &str| {
            Seen::Bad(format!(
                "{}: {key}={} is not {what}",
                path.display(),
                shown(value)
            ))
        };
        match key.trim() {
            "FLANNEL_SUBNET" | "FLANNEL_IPV6_SUBNET" => {
                let Ok(net) = value.parse::<IpNet>() else {
                    return bad("an address with a prefix length (10.244.1.1/24)");
                };
                let v6 = key.contains("IPV6");
                if net.addr().is_ipv6() != v6 {
                    return bad(if v6 { "an IPv6 one" } else { "an IPv4 one" });
                }
                if net.addr() == net.network() {
                    return bad("the subnet's first usable address with the prefix (flannel writes 10.244.1.1/24)");
                }
                subnets.push((v6, net));
            }
            "FLANNEL_NETWORK" | "FLANNEL_IPV6_NETWORK" => {
                for part in value.split(',').map(str::trim).filter(|p| !p.is_empty()) {
                    let Ok(net) = part.parse::<IpNet>() else {
                        return bad("a CIDR or a comma-separated list of CIDRs");
                    };
                    routes.push(RouteSpec {
                        dst: net.trunc().to_string(),
                        gw: None,
                    });
                }
            }
            _ => {}
        }
    }
    if subnets.is_empty() {
        return Seen::Missing(format!(
            "{} has no FLANNEL_SUBNET or FLANNEL_IPV6_SUBNET",
            path.display()
        ));
    }
    subnets.sort_by_key(|(v6, _)| *v6);
    if subnets.windows(2).any(|w| w[0].0 == w[1].0) {
        return Seen::Bad(format!("{} names a family's subnet twice", path.display()));
    }
    let sets = subnets
        .into_iter()
        .map(|(_, net)| {
            vec![RangeSpec {
                subnet: net.trunc().to_string(),
                range_start: None,
                range_end: None,
                gateway: Some(net.addr().to_string()),
            }]
        })
        .collect();
    Seen::Ranges { sets, routes }
}

/// Why flannel's subnet file cannot be read (it names the file).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
struct SubnetFileUnreadable(String);

/// Reads the subnet file: None when it is not there.
fn read(path: &Path) -> Result<Option<String>, SubnetFileUnreadable> {
    let file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            return Err(SubnetFileUnreadable(format!(
                "cannot open {}: {e}",
                path.display()
            )))
        }
    };
    let meta = file
        .metadata()
        .map_err(|e| SubnetFileUnreadable(format!("cannot stat {}: {e}", path.display())))?;
    if !meta.is_file() {
        return Err(SubnetFileUnreadable(format!(
            "{} is not a regular file",
            path.display()
        )));
    }
    let mut text = String::new();
    file.take(MAX_FILE + 1)
        .read_to_string(&mut text)
        .map_err(|e| SubnetFileUnreadable(format!("cannot read {}: {e}", path.display())))?;
    if text.len() as u64 > MAX_FILE {
        return Err(SubnetFileUnreadable(format!(
            "{} is larger than {MAX_FILE} bytes",
            path.display()
        )));
    }
    Ok(Some(text))
}

/// What the file at `path` says now.
pub fn look(path: &Path) -> Seen {
    match read(path) {
        Ok(Some(text)) => parse(path, &text),
        Ok(None) => Seen::Missing(format!(
            "flannel's subnet file {} is missing (is flannel running on this node?)",
            path.display()
        )),
        Err(e) => Seen::Bad(e.0),
    }
}

/// What the reads of the file settle on: a read that differs from what applies is a candidate,
/// applied when the next read agrees.
#[derive(Default)]
pub struct Settle {
    applied: Option<Seen>,
    candidate: Option<Seen>,
}

impl Settle {
    /// Takes a read: what to apply now, if anything.
    pub fn read(&mut self, seen: Seen) -> Option<Seen> {
        if self.applied.as_ref() == Some(&seen) {
            self.candidate = None;
            return None;
        }
        if self.candidate.as_ref() == Some(&seen) {
            return Some(seen);
        }
        self.candidate = Some(seen);
        None
    }

    /// `seen` applies now (an apply can fail and is tried again at the next read).
    pub fn applied(&mut self, seen: Seen) {
        self.applied = Some(seen);
        self.candidate = None;
    }

    /// A candidate waits for its confirming read.
    pub fn waiting(&self) -> bool {
        self.candidate.is_some()
    }
}

/// Follows the file for `feed`'s network, forever.
pub async fn follow(mut feed: Feed, path: PathBuf) {
    tracing::info!(network = feed.network(), file = %path.display(), "ranges from flannel's subnet file");
    let mut remind = tokio::time::interval(REMIND_EVERY);
    remind.tick().await;
    let mut settle = Settle::default();
    let mut next = tokio::time::Instant::now();
    loop {
        tokio::select! {
            _ = tokio::time::sleep_until(next) => {
                let p = path.clone();
                let seen = match tokio::task::spawn_blocking(move || look(&p)).await {
                    Ok(seen) => seen,
                    Err(e) => Seen::Bad(format!("reading {}: {e}", path.display())),
                };
                if let Some(seen) = settle.read(seen) {
                    // Kept as the candidate when the apply fails (the store failed for a
                    // while, ...): tried again at the next read.
                    if feed.apply(seen.clone()).await {
                        settle.applied(seen);
                    }
                }
                next = tokio::time::Instant::now()
                    + if settle.waiting() { CONFIRM_AFTER } else { POLL_EVERY };
            }
            _ = remind.tick() => feed.remind(),
        }
    }
}

#[cfg(test)]
mod tests;
