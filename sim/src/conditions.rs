//! The conditions of the stores' writes, named, and one of them dropped on purpose: what
//! issue 54's item 4 measures the simulation by. Every conditioned write of both stores (a
//! claim, a settle, a give-back, a release, a pool or CIDR change, a pin) names what it was
//! read at: etcd's transaction compares a key's version, create or mod revision, or value;
//! the apiserver's update carries the `resourceVersion` read, its delete preconditions on
//! the uid and `resourceVersion`. A condition dropped (the slip a refactor makes) is a write
//! that applies whatever came between its read and its write; the simulation should fail a
//! run over it within `cargo test`'s minute.
//!
//! Each condition is named by what it guards, not by the line that makes it, so that the
//! store can drop it without a change to the code under test ([`Dropped::apply`]):
//! - on etcd: `<what the transaction writes> if <key> <target> <result>`, each key by its
//!   kind (`blocks`, `index` for a node's entry of its block, `pools`, `pins`, `alive`, ...),
//!   a comparison over a prefix with `*`. The node's witness, which every write of a node
//!   compares in one place, is named once for every write (`any write if witness ...`);
//! - on the Kubernetes API: `<method> <resource> <field>` (`PUT ipblocks resourceVersion`,
//!   `DELETE leases uid`).
//!
//! `ipool-sim conditions` lists the conditions a search met; `ipool-sim races` drops each in
//! turn and searches for the run it fails (docs/simulation.md has the table).

use std::collections::BTreeSet;

use ipool_proto::etcd::etcdserverpb as pb;
use pb::compare::{CompareResult, CompareTarget};
use pb::request_op::Request as Op;
use serde_json::Value;

/// What the stores' conditions came to in a run: the one dropped, and every one met.
#[derive(Debug, Default)]
pub struct Conditions {
    /// The condition the store ignores (None: every one holds as written).
    pub dropped: Option<String>,
    /// Every condition met by a write delivered in the run.
    pub met: BTreeSet<String>,
    /// Writes whose dropped condition was taken out.
    pub dropped_in: u64,
}

/// The kind of an etcd key (its prefix taken off): what the names of conditions say.
pub fn key_kind(key: &[u8]) -> String {
    let key = String::from_utf8_lossy(key);
    let rest = key.trim_start_matches('/');
    let rest = rest.strip_prefix("ipool/v1/").unwrap_or(rest);
    let parts: Vec<&str> = rest.split('/').collect();
    match parts.as_slice() {
        // A node's entry of one of its blocks, and its other keys by their last word.
        ["nodes", _, "blocks", ..] => "index".into(),
        ["nodes", _, what, ..] => what.to_string(),
        ["nodes", ..] => "nodes".into(),
        ["pins", _, "set-aside", ..] => "set-aside".into(),
        [first, ..] => first.to_string(),
        [] => String::new(),
    }
}

fn target(c: &pb::Compare) -> &'static str {
    match CompareTarget::try_from(c.target) {
        Ok(CompareTarget::Version) => "version",
        Ok(CompareTarget::Create) => "create",
        Ok(CompareTarget::Mod) => "mod",
        Ok(CompareTarget::Value) => "value",
        Ok(CompareTarget::Lease) => "lease",
        Err(_) => "?",
    }
}

fn result(c: &pb::Compare) -> &'static str {
    match CompareResult::try_from(c.result) {
        Ok(CompareResult::Equal) => "=",
        Ok(CompareResult::Greater) => ">",
        Ok(CompareResult::Less) => "<",
        Ok(CompareResult::NotEqual) => "!=",
        Err(_) => "?",
    }
}

/// What a transaction writes, by kind: `put blocks+put index`; empty when it writes nothing.
fn writes_of(t: &pb::TxnRequest) -> String {
    let mut w = BTreeSet::new();
    for op in t.success.iter().chain(&t.failure) {
        match &op.request {
            Some(Op::RequestPut(p)) if key_kind(&p.key) != "witness" => {
                w.insert(format!("put {}", key_kind(&p.key)));
            }
            Some(Op::RequestDeleteRange(d)) => {
                w.insert(format!("delete {}", key_kind(&d.key)));
            }
            _ => {}
        }
    }
    w.into_iter().collect::<Vec<_>>().join("+")
}

/// The names of a transaction's comparisons, one per comparison (empty when it writes
/// nothing: a read sent as a transaction is no conditioned write).
pub fn etcd_names(t: &pb::TxnRequest) -> Vec<String> {
    let writes = writes_of(t);
    if writes.is_empty() {
        return Vec::new();
    }
    t.compare
        .iter()
        .map(|c| {
            let kind = key_kind(&c.key);
            let star = if c.range_end.is_empty() { "" } else { "*" };
            let site = if kind == "witness" {
                "any write"
            } else {
                &writes
            };
            format!("{site} if {kind}{star} {} {}", target(c), result(c))
        })
        .collect()
}

/// The resource a path to the apiserver names, with its subresource: `ipblocks`,
/// `ippools/status`.
fn resource_of(path: &str) -> String {
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let rest = match parts.as_slice() {
        ["apis", _, _, "namespaces", _, rest @ ..] => rest,
        ["apis", _, _, rest @ ..] => rest,
        ["api", _, "namespaces", _, rest @ ..] => rest,
        ["api", _, rest @ ..] => rest,
        _ => return "?".into(),
    };
    match rest {
        [r, _, sub, ..] => format!("{r}/{sub}"),
        [r, ..] => r.to_string(),
        [] => "?".into(),
    }
}

/// The names of an apiserver request's conditions.
pub fn api_names(method: &str, path: &str, body: &[u8]) -> Vec<String> {
    let Ok(v) = serde_json::from_slice::<Value>(body) else {
        return Vec::new();
    };
    let r = resource_of(path);
    let mut names = Vec::new();
    match method {
        "PUT" | "PATCH" if v["metadata"]["resourceVersion"].is_string() => {
            names.push(format!("{method} {r} resourceVersion"));
        }
        "DELETE" => {
            for f in ["uid", "resourceVersion"] {
                if v["preconditions"][f].is_string() {
                    names.push(format!("DELETE {r} {f}"));
                }
            }
        }
        _ => {}
    }
    names
}

impl Conditions {
    /// Records the conditions of transaction `t`, and takes the dropped one out of it.
    pub fn apply_txn(&mut self, t: &mut pb::TxnRequest) {
        let names = etcd_names(t);
        if let Some(d) = self.dropped.as_ref() {
            if let Some(k) = names.iter().position(|n| n == d) {
                t.compare.remove(k);
                self.dropped_in += 1;
            }
        }
        self.met.extend(names);
    }

    /// Records the conditions of an apiserver request, and takes the dropped one out of its
    /// `body`: an update is made on the `resourceVersion` stored now (`current`, if any), a
    /// delete loses the precondition.
    pub fn apply_api(
        &mut self,
        method: &str,
        path: &str,
        body: &mut bytes::Bytes,
        current: impl Fn(&str) -> Option<String>,
    ) {
        let names = api_names(method, path, body);
        if let Some(dropped) = self.dropped.as_ref().filter(|d| names.contains(d)) {
            let mut v: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
            let field = dropped.rsplit(' ').next().unwrap_or("");
            if method == "DELETE" {
                if let Some(p) = v["preconditions"].as_object_mut() {
                    p.remove(field);
                }
            } else if let Some(rv) = current(path) {
                v["metadata"]["resourceVersion"] = Value::String(rv);
            }
            *body = bytes::Bytes::from(v.to_string());
            self.dropped_in += 1;
        }
        self.met.extend(names);
    }
}

#[cfg(test)]
mod tests;
