//! What the daemons cost their store, counted at the store: the fake apiserver's request lines
//! and the bytes it sent; a real etcd's own counters (`/metrics`: gRPC messages received by
//! method, bytes sent to clients).
#![allow(dead_code)]

use super::backend::Backend;

/// Requests by kind, and bytes sent, so far (subtract two to get a window's).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Load {
    pub requests: u64,
    /// Creates, updates, deletes (apiserver); Put, Txn, DeleteRange, lease grants and revokes
    /// (etcd).
    pub writes: u64,
    /// The writes of Leases (apiserver) or lease keep-alives (etcd): renewals.
    pub renewals: u64,
    /// Lists of a collection (apiserver); etcd's ranges (a key or a prefix: it does not say).
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

/// How many path segments name a collection: `/apis/G/V/R`, `/apis/G/V/namespaces/NS/R`,
/// `/api/v1/R`, `/api/v1/namespaces/NS/R`.
fn is_collection(path: &str) -> bool {
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    match parts.first() {
        Some(&"apis") => parts.len() == 4 || (parts.len() == 6 && parts[3] == "namespaces"),
        Some(&"api") => parts.len() == 3 || (parts.len() == 5 && parts[2] == "namespaces"),
        _ => false,
    }
}

impl Backend {
    /// The store's counts so far.
    pub fn load(&self) -> Load {
        match self {
            Backend::Kube { api, .. } => {
                let mut l = Load {
                    bytes: api.sent_bytes(),
                    ..Load::default()
                };
                for line in api.requests() {
                    let (method, uri) = line.split_once(' ').unwrap_or((&line, ""));
                    let (path, query) = uri.split_once('?').unwrap_or((uri, ""));
                    l.requests += 1;
                    match method {
                        "GET"
                            if query
                                .split('&')
                                .any(|kv| kv == "watch=true" || kv == "watch=1") =>
                        {
                            l.watches += 1
                        }
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
            Backend::Etcd(e) => {
                let url = e.lock().unwrap().client_url.clone();
                let (_, body) = super::http_get(url.trim_start_matches("http://"), "/metrics");
                let m = super::samples(&body);
                let received = |method: &str| -> u64 {
                    m.iter()
                        .filter(|(k, _)| {
                            k.starts_with("grpc_server_msg_received_total{")
                                && k.contains(&format!("grpc_method=\"{method}\""))
                        })
                        .map(|(_, v)| *v as u64)
                        .sum()
                };
                let writes = ["Put", "Txn", "DeleteRange", "LeaseGrant", "LeaseRevoke"]
                    .iter()
                    .map(|w| received(w))
                    .sum();
                let renewals = received("LeaseKeepAlive");
                let (reads, watches) = (received("Range"), received("Watch"));
                Load {
                    requests: writes + renewals + reads + watches + received("LeaseTimeToLive"),
                    writes,
                    renewals,
                    reads,
                    gets: 0,
                    watches,
                    bytes: m
                        .get("etcd_network_client_grpc_sent_bytes_total")
                        .copied()
                        .unwrap_or(0.0) as u64,
                }
            }
        }
    }
}
