//! What `ipoolctl cluster`'s commands share in what they say: the exit code for a store's
//! error, the warning for entries of the store that name no owner, the blocks' table.

use ipool_server::cluster::vocab::{ClusterError, MalformedKey};

use crate::{Output, EXIT_NOT_FOUND, EXIT_REFUSED, EXIT_UNREACHABLE};

pub(crate) fn exit_for(e: &ClusterError) -> u8 {
    match e {
        ClusterError::Etcd(_) => EXIT_UNREACHABLE,
        ClusterError::Kube(_) if e.is_unreachable() => EXIT_UNREACHABLE,
        ClusterError::Kube(_) => EXIT_REFUSED,
        ClusterError::NotFound(_) => EXIT_NOT_FOUND,
        ClusterError::Refused(_) | ClusterError::Malformed { .. } => EXIT_REFUSED,
        ClusterError::Undone { error, .. } => exit_for(error),
    }
}

/// Says on stderr which keys under the prefix (objects) name no owner (they count as
/// occupied).
pub(crate) fn warn_malformed(place: &str, found: &[MalformedKey]) {
    for m in found {
        eprintln!("ipoolctl: warning: a malformed entry in {place}, counted as occupied: {m}");
    }
}

pub(crate) fn print_blocks(blocks: &[ipool_server::cluster::vocab::Block], out: Output) {
    if out == Output::Json {
        let v: Vec<serde_json::Value> = blocks
            .iter()
            .map(|b| {
                serde_json::json!({
                    "pool": b.pool, "block": b.block.to_string(), "node": b.owner.node,
                    "claimedAtMs": b.owner.claimed_at_ms,
                })
            })
            .collect();
        outln!("{}", serde_json::Value::Array(v));
        return;
    }
    let rows = blocks
        .iter()
        .map(|b| vec![b.pool.clone(), b.block.to_string(), b.owner.node.clone()])
        .collect();
    crate::print::table(&["POOL", "BLOCK", "NODE"], rows);
}
