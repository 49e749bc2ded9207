//! Races made on purpose (issue 54, item 4): in a run whose swarm says so, a conditioned
//! write (`crate::conditions`) is now and then parked on its way until a rival's write
//! touches what it is conditioned on, and then arrives next: the conflicting write between
//! its read and its write that a dropped condition lets through, made instead of waited for.
//! A write no rival touches arrives when its park runs out, before its caller gives up or
//! after (a late write).
//!
//! What a write is conditioned on, and what a write touches, are keys: etcd's keys (a
//! comparison over a prefix, a range), the apiserver's objects by their path.

use ipool_proto::etcd::etcdserverpb as pb;
use ipool_server::cluster::etcd::client::Call;
use pb::request_op::Request as Op;

use crate::conditions::{api_names, etcd_names};
use crate::etcd::in_range;

/// Keys or ranges of keys: (start, end), an empty end one key (etcd's rule).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Keys(pub Vec<(Vec<u8>, Vec<u8>)>);

impl Keys {
    /// Some key of `self` is one of `written`'s.
    pub fn meets(&self, written: &Keys) -> bool {
        self.0.iter().any(|(k, end)| {
            written
                .0
                .iter()
                .any(|(w, wend)| in_range(w, k, end) || (end.is_empty() && in_range(k, w, wend)))
        })
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// The object an apiserver request names (a create: the collection's path and the name in
/// its body).
fn object_path(method: &str, path: &str, body: &[u8]) -> Vec<u8> {
    if method != "POST" {
        return path.as_bytes().to_vec();
    }
    let name = serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v["metadata"]["name"].as_str().map(str::to_string))
        .unwrap_or_default();
    format!("{path}/{name}").into_bytes()
}

/// What transaction `t` is conditioned on, if it writes (the witness aside: every write of a
/// node compares it).
pub fn txn_conditioned_on(t: &pb::TxnRequest) -> Keys {
    Keys(
        t.compare
            .iter()
            .zip(etcd_names(t))
            .filter(|(_, name)| !name.starts_with("any write"))
            .map(|(c, _)| (c.key.clone(), c.range_end.clone()))
            .collect(),
    )
}

/// What an apiserver request is conditioned on: its object, if it names a condition.
pub fn api_conditioned_on(method: &str, path: &str, body: &[u8]) -> Keys {
    match api_names(method, path, body).is_empty() {
        true => Keys::default(),
        false => Keys(vec![(object_path(method, path, body), Vec::new())]),
    }
}

/// What etcd call `c` writes, if it is applied.
pub fn call_writes(c: &Call) -> Keys {
    let op = |o: &pb::RequestOp| match &o.request {
        Some(Op::RequestPut(p)) => Some((p.key.clone(), Vec::new())),
        Some(Op::RequestDeleteRange(d)) => Some((d.key.clone(), d.range_end.clone())),
        _ => None,
    };
    match c {
        Call::Put(p) => Keys(vec![(p.key.clone(), Vec::new())]),
        Call::DeleteRange(d) => Keys(vec![(d.key.clone(), d.range_end.clone())]),
        Call::Txn(t) => Keys(t.success.iter().chain(&t.failure).filter_map(op).collect()),
        _ => Keys::default(),
    }
}

/// What an apiserver request writes, if it is applied.
pub fn api_writes(method: &str, path: &str, body: &[u8]) -> Keys {
    match method {
        "GET" => Keys::default(),
        _ => Keys(vec![(object_path(method, path, body), Vec::new())]),
    }
}

#[cfg(test)]
mod tests;
