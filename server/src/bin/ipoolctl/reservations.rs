//! `ipoolctl cluster reserve` and `cluster reservations`: a pool's reserved addresses, and
//! which block (and node) holds each.

use ipool_server::cluster::datastore::Datastore;
use ipool_server::cluster::ippool::{PoolChange, Reserved};
use ipool_server::cluster::vocab::{Block, ClusterError};

use crate::Output;

/// The blocks over `r` and their owners ("10.0.0.0/26 (node n1)"), "-" when none.
fn held_by(r: &Reserved, blocks: &[Block], pool: &str) -> String {
    let over: Vec<String> = blocks
        .iter()
        .filter(|b| b.pool == pool && (b.block.contains(&r.cidr) || r.cidr.contains(&b.block)))
        .map(|b| format!("{} (node {})", b.block, b.owner.node))
        .collect();
    match over.is_empty() {
        true => "-".into(),
        false => over.join(", "),
    }
}

/// Reserves as `change` says, then says which owned blocks hold the range: an address in use
/// there stays with its pod (the node that holds the block logs it).
pub(crate) async fn reserve(
    store: &dyn Datastore,
    pool: &str,
    change: &PoolChange,
    out: Output,
) -> Result<(), ClusterError> {
    let PoolChange::Reserve(r) = change else {
        return Err(ClusterError::Refused(format!("{change} is no reservation")));
    };
    store.change_pool(pool, change).await?;
    let blocks = store.list_blocks(Some(pool), None).await?;
    let held = held_by(r, &blocks.blocks, pool);
    if out == Output::Json {
        outln!(
            "{}",
            serde_json::json!({"pool": pool, "cidr": r.cidr.to_string(), "reason": r.reason, "blocks": held})
        );
        return Ok(());
    }
    outln!("pool {pool}: reserved {}", r.cidr);
    if held != "-" {
        outln!(
            "in owned block(s) {held}: an address of it in use there stays with its pod (its node logs it) and is not handed out again once released"
        );
    }
    Ok(())
}

/// Every pool's reservations (or `only`'s), with the blocks holding them.
pub(crate) async fn list(
    store: &dyn Datastore,
    place: &str,
    only: Option<&str>,
    out: Output,
) -> Result<(), ClusterError> {
    let pools = store.pools().await?;
    crate::cluster_out::warn_malformed(place, &pools.malformed);
    if let Some(p) = only {
        if !pools.pools.iter().any(|x| x.spec.name == p) {
            return Err(ClusterError::NotFound(format!("no pool {p:?}")));
        }
    }
    let blocks = store.list_blocks(only, None).await?;
    let rows: Vec<(String, &Reserved, String)> = pools
        .pools
        .iter()
        .filter(|p| only.is_none_or(|o| o == p.spec.name))
        .flat_map(|p| {
            p.spec.reserved.iter().map(|r| {
                (
                    p.spec.name.clone(),
                    r,
                    held_by(r, &blocks.blocks, &p.spec.name),
                )
            })
        })
        .collect();
    if out == Output::Json {
        let v: Vec<serde_json::Value> = rows
            .iter()
            .map(|(pool, r, held)| {
                serde_json::json!({"pool": pool, "cidr": r.cidr.to_string(), "reason": r.reason, "blocks": held})
            })
            .collect();
        outln!("{}", serde_json::Value::Array(v));
        return Ok(());
    }
    crate::print::table(
        &["POOL", "RESERVED", "REASON", "IN BLOCKS"],
        rows.into_iter()
            .map(|(pool, r, held)| {
                let reason = match r.reason.is_empty() {
                    true => "-".to_string(),
                    false => r.reason.clone(),
                };
                vec![pool, r.cidr.to_string(), reason, held]
            })
            .collect(),
    );
    Ok(())
}
