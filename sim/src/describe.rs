//! An etcd call in a few words, for the trace.

use ipool_proto::etcd::etcdserverpb::{compare::TargetUnion, request_op::Request};
use ipool_server::cluster::etcd::client::Call;

/// An etcd call in a few words, for the trace.
pub(crate) fn describe_call(c: &Call) -> String {
    let key = |k: &[u8]| String::from_utf8_lossy(k).replace("/ipool/v1/", "");
    match c {
        Call::Range(r) => format!("range {}", key(&r.key)),
        Call::Put(p) => format!("put {}", key(&p.key)),
        Call::DeleteRange(d) => format!("delete {}", key(&d.key)),
        Call::Txn(t) => {
            let writes: Vec<String> = t
                .success
                .iter()
                .filter_map(|op| match &op.request {
                    Some(Request::RequestPut(p)) => Some(format!("put {}", key(&p.key))),
                    Some(Request::RequestDeleteRange(d)) => Some(format!("delete {}", key(&d.key))),
                    _ => None,
                })
                .collect();
            let on: Vec<String> = t
                .compare
                .iter()
                .map(|c| {
                    let v = match &c.target_union {
                        Some(TargetUnion::Version(v)) => format!("version {v}"),
                        Some(TargetUnion::CreateRevision(v)) => format!("create {v}"),
                        Some(TargetUnion::ModRevision(v)) => format!("mod {v}"),
                        // A write's id (its wall-clock start varies from run to run).
                        Some(TargetUnion::Value(_)) => "value (a write's id)".into(),
                        _ => "?".into(),
                    };
                    format!("{} {v}", key(&c.key))
                })
                .collect();
            if writes.is_empty() && on.is_empty() {
                // A read sent as a transaction (with the node's witness).
                let reads: Vec<String> = t
                    .success
                    .iter()
                    .filter_map(|op| match &op.request {
                        Some(Request::RequestRange(r)) => Some(key(&r.key)),
                        _ => None,
                    })
                    .collect();
                return format!("read [{}]", reads.join(", "));
            }
            format!("txn [{}] if [{}]", writes.join(", "), on.join(", "))
        }
        Call::LeaseGrant(g) => format!("lease grant {} s", g.ttl),
        Call::LeaseRevoke(r) => format!("lease revoke {:x}", r.id),
        Call::LeaseKeepAlive(k) => format!("lease keep-alive {:x}", k.id),
        Call::LeaseTimeToLive(t) => format!("lease ttl {:x}", t.id),
    }
}
