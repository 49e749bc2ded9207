//! What clients cost a store, counted at the store ([`Load`]): from the fake apiserver's
//! request lines and bytes sent ([`Load::of_requests`]), or from a real etcd's own counters
//! ([`Load::of_etcd_metrics`]: gRPC messages received by method, bytes sent to clients).

/// Requests by kind, and bytes sent, so far (subtract two to get a window's).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Load {
    pub requests: u64,
    /// Creates, updates, deletes (apiserver); Puts, Txns and DeleteRanges that changed a key
    /// (by etcd's revision), lease grants and revokes (etcd).
    pub writes: u64,
    /// The writes of Leases (apiserver) or lease keep-alives (etcd): renewals.
    pub renewals: u64,
    /// Lists of a collection (apiserver); etcd's ranges (a key or a prefix: it does not say),
    /// and its transactions that changed nothing (reads sent as transactions, compares
    /// failed).
    pub reads: u64,
    /// GETs of one object (apiserver).
    pub gets: u64,
    /// Watches made (each one counts once, however long it lasts).
    pub watches: u64,
    pub bytes: u64,
}

impl std::ops::Sub for Load {
    type Output = Load;
    fn sub(self, o: Load) -> Load {
        Load {
            requests: self.requests - o.requests,
            writes: self.writes - o.writes,
            renewals: self.renewals - o.renewals,
            reads: self.reads - o.reads,
            gets: self.gets - o.gets,
            watches: self.watches - o.watches,
            bytes: self.bytes - o.bytes,
        }
    }
}

/// Whether a path names a collection: `/apis/G/V/R`, `/apis/G/V/namespaces/NS/R`,
/// `/api/v1/R`, `/api/v1/namespaces/NS/R`.
fn is_collection(path: &str) -> bool {
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    match parts.first() {
        Some(&"apis") => parts.len() == 4 || (parts.len() == 6 && parts[3] == "namespaces"),
        Some(&"api") => parts.len() == 3 || (parts.len() == 5 && parts[2] == "namespaces"),
        _ => false,
    }
}

impl Load {
    /// An apiserver's load from its request lines ("GET /apis/...?watch=true") and the bytes
    /// it sent.
    pub fn of_requests(lines: &[String], bytes: u64) -> Load {
        let mut l = Load {
            bytes,
            ..Load::default()
        };
        for line in lines {
            let (method, uri) = line.split_once(' ').unwrap_or((line, ""));
            let (path, query) = uri.split_once('?').unwrap_or((uri, ""));
            let watch = query
                .split('&')
                .any(|kv| kv == "watch=true" || kv == "watch=1");
            l.requests += 1;
            match method {
                "GET" if watch => l.watches += 1,
                "GET" if is_collection(path) => l.reads += 1,
                "GET" => l.gets += 1,
                _ => {
                    l.writes += 1;
                    if path.contains("/leases") {
                        l.renewals += 1;
                    }
                }
            }
        }
        l
    }

    /// etcd's load from its `/metrics` text.
    pub fn of_etcd_metrics(body: &str) -> Load {
        let sample = |line: &str| -> Option<(String, f64)> {
            let (k, v) = line.rsplit_once(' ')?;
            Some((k.to_string(), v.parse().ok()?))
        };
        let m: Vec<(String, f64)> = body
            .lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(sample)
            .collect();
        let received = |method: &str| -> u64 {
            let label = format!("grpc_method=\"{method}\"");
            m.iter()
                .filter(|(k, _)| {
                    k.starts_with("grpc_server_msg_received_total{") && k.contains(&label)
                })
                .map(|(_, v)| *v as u64)
                .sum()
        };
        // A Put, Txn or DeleteRange that changes a key moves etcd's revision by one; one
        // that changes nothing (a transaction that only reads, or whose compares failed) does
        // not: those count as reads. The revision counts every write since etcd began (at 1),
        // and a lease that lapses with keys on it moves it too: never more than the requests.
        let kv = received("Put") + received("Txn") + received("DeleteRange");
        let revision = m
            .iter()
            .find(|(k, _)| k == "etcd_debugging_mvcc_current_revision")
            .map(|(_, v)| *v as u64);
        let landed = revision.map_or(kv, |r| r.saturating_sub(1).min(kv));
        let writes = landed + received("LeaseGrant") + received("LeaseRevoke");
        let renewals = received("LeaseKeepAlive");
        let (reads, watches) = (received("Range") + kv - landed, received("Watch"));
        Load {
            requests: writes + renewals + reads + watches + received("LeaseTimeToLive"),
            writes,
            renewals,
            reads,
            gets: 0,
            watches,
            bytes: m
                .iter()
                .find(|(k, _)| k == "etcd_network_client_grpc_sent_bytes_total")
                .map_or(0, |(_, v)| *v as u64),
        }
    }
}

#[cfg(test)]
mod tests;
