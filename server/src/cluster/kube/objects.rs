//! ipool's custom resources as JSON, and back: a block's name from its CIDR, an object's
//! [`KeyRevision`] from its uid and resourceVersion, and what a malformed one says.

use ipnet::IpNet;
use kube::api::{DynamicObject, ObjectMeta};
use serde_json::{json, Value};

use super::{resource, NODE_LABEL, POOL_LABEL};
use crate::cluster::ippool::{InvalidPool, PoolSpec, Reserved};
use crate::cluster::vocab::{Block, KeyRevision, MalformedKey, Owner, PoolPhase};

/// `10.0.0.0/26` as an object name: `10-0-0-0-26`; `fd00::/122`: every group, in hex,
/// `fd00-0-0-0-0-0-0-0-122` (a name has no `.`-free way to say `::`, and this one is one
/// name per block).
pub fn block_name(b: &IpNet) -> String {
    match b {
        IpNet::V4(n) => format!(
            "{}-{}",
            n.network().to_string().replace('.', "-"),
            n.prefix_len()
        ),
        IpNet::V6(n) => {
            let groups: Vec<String> = n
                .network()
                .segments()
                .iter()
                .map(|g| format!("{g:x}"))
                .collect();
            format!("{}-{}", groups.join("-"), n.prefix_len())
        }
    }
}

/// A stable 63-bit hash (FNV-1a): the uid and resourceVersion of an object as the numbers of
/// a [`KeyRevision`] (compared for equality only; the strings are read again before a write).
pub fn hash(s: &str) -> i64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in s.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    (h & (i64::MAX as u64)) as i64
}

/// Which write of an object was read.
pub(super) fn revision(meta: &ObjectMeta) -> KeyRevision {
    KeyRevision {
        create: hash(meta.uid.as_deref().unwrap_or("")),
        modified: hash(meta.resource_version.as_deref().unwrap_or("")),
        write: None,
    }
}

/// A new block object: `block` of `pool` (the one whose uid hashes to `pool_revision`),
/// owned by `node`.
pub(super) fn new_block(
    pool: &str,
    pool_revision: i64,
    block: &IpNet,
    node: &str,
    now_ms: u64,
) -> DynamicObject {
    let mut obj = DynamicObject::new(&block_name(block), &resource("IPBlock", "ipblocks")).data(
        json!({"spec": {"cidr": block.to_string(), "pool": pool, "poolRevision": pool_revision,
                        "node": node, "claimedAtMs": now_ms}}),
    );
    obj.metadata.labels = Some(
        [
            (NODE_LABEL.to_string(), node.to_string()),
            (POOL_LABEL.to_string(), pool.to_string()),
        ]
        .into(),
    );
    obj
}

/// The block an object says; a malformed one names what is wrong (and its block, when its
/// name or CIDR names one: that block counts as occupied).
pub(super) fn parse_block(obj: &DynamicObject) -> Result<Block, MalformedKey> {
    let name = obj.metadata.name.clone().unwrap_or_default();
    let spec = &obj.data["spec"];
    let cidr = spec["cidr"].as_str().and_then(|c| c.parse::<IpNet>().ok());
    let bad = |why: String| MalformedKey {
        key: format!("ipblocks/{name}"),
        why,
        block: cidr.filter(|c| c.trunc() == *c),
    };
    let Some(block) = cidr else {
        return Err(bad(format!("spec.cidr {} is not a CIDR", spec["cidr"])));
    };
    if obj.metadata.deletion_timestamp.is_some() {
        // A finalizer holds it: given back, not yet gone. Nobody's, and not free either.
        return Err(bad("being deleted (a finalizer holds it)".into()));
    }
    if block.trunc() != block || block_name(&block) != name {
        return Err(bad(format!(
            "spec.cidr {block} is not the block its name ({name}) says"
        )));
    }
    let (Some(pool), Some(node)) = (spec["pool"].as_str(), spec["node"].as_str()) else {
        return Err(bad("spec.pool or spec.node is missing".into()));
    };
    let labels = obj.metadata.labels.clone().unwrap_or_default();
    if labels.get(NODE_LABEL).map(String::as_str) != Some(node) {
        return Err(bad(format!(
            "its label {NODE_LABEL} does not say its owner {node:?} (a node's listing would miss it)"
        )));
    }
    Ok(Block {
        pool: pool.to_string(),
        block,
        owner: Owner {
            node: node.to_string(),
            claimed_at_ms: spec["claimedAtMs"].as_u64().unwrap_or(0),
        },
        revision: revision(&obj.metadata),
    })
}

/// The pool (a hash of its uid) a block object was claimed from; None: not said.
pub(super) fn pool_revision_of(obj: &DynamicObject) -> Option<i64> {
    obj.data["spec"]["poolRevision"].as_i64()
}

/// A new pool object, in `phase`.
pub(super) fn new_pool(spec: &PoolSpec, phase: PoolPhase) -> DynamicObject {
    DynamicObject::new(&spec.name, &resource("IPPool", "ippools")).data(json!({
        "spec": pool_spec_json(spec),
        "status": {"phase": phase.as_str()},
    }))
}

fn pool_spec_json(spec: &PoolSpec) -> Value {
    let strings = |nets: &[IpNet]| nets.iter().map(|c| c.to_string()).collect::<Vec<_>>();
    let mut out = json!({
        "cidrs": strings(&spec.cidrs),
        "blockSizeV4": spec.block_v4,
        "blockSizeV6": spec.block_v6,
        "exclude": strings(&spec.exclude),
    });
    // Written only when set: a pool as it was before these fields reads the same.
    if spec.disabled {
        out["disabled"] = json!(true);
    }
    if !spec.adding.is_empty() {
        out["cidrsAdding"] = json!(strings(&spec.adding));
    }
    if !spec.removing.is_empty() {
        out["cidrsRemoving"] = json!(strings(&spec.removing));
    }
    if !spec.reserved.is_empty() {
        let reserved: Vec<Value> = spec
            .reserved
            .iter()
            .map(|r| match r.reason.is_empty() {
                true => json!({"cidr": r.cidr.to_string()}),
                false => json!({"cidr": r.cidr.to_string(), "reason": r.reason}),
            })
            .collect();
        out["reserved"] = json!(reserved);
    }
    if let Some(sel) = &spec.node_selector {
        out["nodeSelector"] = json!(sel);
    }
    out
}

/// `obj` with the spec `spec` (its status as it was).
pub(super) fn with_spec(obj: &DynamicObject, spec: &PoolSpec) -> DynamicObject {
    let mut obj = obj.clone();
    obj.data["spec"] = pool_spec_json(spec);
    obj
}

/// `obj` moved to `phase`.
pub(super) fn with_phase(obj: &DynamicObject, phase: PoolPhase) -> DynamicObject {
    let mut obj = obj.clone();
    obj.data["status"] = json!({"phase": phase.as_str()});
    obj
}

/// The pool an object says, and its phase; else what is wrong with it.
pub(super) fn parse_pool(obj: &DynamicObject) -> Result<(PoolSpec, PoolPhase), InvalidPool> {
    let spec = &obj.data["spec"];
    let nets = |key: &str| -> Result<Vec<IpNet>, InvalidPool> {
        match &spec[key] {
            Value::Null => Ok(Vec::new()),
            Value::Array(items) => items
                .iter()
                .map(|v| {
                    v.as_str()
                        .and_then(|s| s.parse().ok())
                        .ok_or_else(|| InvalidPool(format!("spec.{key}: {v} is not a CIDR")))
                })
                .collect(),
            other => Err(InvalidPool(format!("spec.{key}: {other} is not a list"))),
        }
    };
    let size = |key: &str| -> Result<u8, InvalidPool> {
        spec[key]
            .as_u64()
            .and_then(|v| u8::try_from(v).ok())
            .ok_or_else(|| InvalidPool(format!("spec.{key}: {} is not a prefix length", spec[key])))
    };
    let pool = PoolSpec {
        name: obj.metadata.name.clone().unwrap_or_default(),
        cidrs: nets("cidrs")?,
        block_v4: size("blockSizeV4")?,
        block_v6: size("blockSizeV6")?,
        exclude: nets("exclude")?,
        disabled: match &spec["disabled"] {
            Value::Null => false,
            Value::Bool(b) => *b,
            other => {
                return Err(InvalidPool(format!(
                    "spec.disabled: {other} is not true or false"
                )))
            }
        },
        adding: nets("cidrsAdding")?,
        removing: nets("cidrsRemoving")?,
        reserved: match &spec["reserved"] {
            Value::Null => Vec::new(),
            Value::Array(items) => items
                .iter()
                .map(|r| {
                    let cidr = r["cidr"]
                        .as_str()
                        .and_then(|s| s.parse().ok())
                        .ok_or_else(|| InvalidPool(format!("spec.reserved: {r} has no CIDR")))?;
                    let reason = r["reason"].as_str().unwrap_or_default().to_string();
                    Ok(Reserved { cidr, reason })
                })
                .collect::<Result<_, InvalidPool>>()?,
            other => return Err(InvalidPool(format!("spec.reserved: {other} is not a list"))),
        },
        node_selector: match &spec["nodeSelector"] {
            Value::Null => None,
            Value::String(s) => Some(s.clone()),
            other => {
                return Err(InvalidPool(format!(
                    "spec.nodeSelector: {other} is not a string"
                )))
            }
        },
    };
    pool.validate()?;
    let phase = match obj.data["status"]["phase"].as_str() {
        Some("Ready") => PoolPhase::Ready,
        Some("Deleting") => PoolPhase::Deleting,
        // No phase: written by hand, not by ipoolctl; not claimed from until it is Ready.
        _ => PoolPhase::Pending,
    };
    Ok((pool, phase))
}

#[cfg(test)]
mod tests;
