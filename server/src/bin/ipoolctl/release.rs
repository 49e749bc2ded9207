//! `ipoolctl cluster release-node`: what release-node gave back, kept and released, printed.

use ipool_server::cluster::datastore::Datastore;
use ipool_server::cluster::model::ClusterError;

use crate::cluster::{print_blocks, warn_malformed};
use crate::Output;

/// Gives back `node`'s blocks once the store says it has been away long enough (or with
/// `force`), printing what was given back.
pub(crate) async fn release_node(
    store: &dyn Datastore,
    place: &str,
    node: &str,
    absent_for: u64,
    force: bool,
    out: Output,
) -> Result<(), ClusterError> {
    let r =
        ipool_server::cluster::release::release_node(store, place, node, absent_for, force).await?;
    warn_malformed(place, &r.malformed);
    for why in &r.forced {
        eprintln!("ipoolctl: --force: {why}; giving its blocks back anyway");
    }
    if out == Output::Json {
        print_blocks(&r.blocks, out);
        return Ok(());
    }
    for b in &r.blocks {
        outln!(
            "released {} of pool {} (owned by {node} since {} ms after the epoch)",
            b.block,
            b.pool,
            b.owner.claimed_at_ms
        );
    }
    for b in &r.pinned {
        outln!(
            "kept {} of pool {}: a pin was made in it (ipoolctl cluster pins; unpin ends it)",
            b.block,
            b.pool
        );
    }
    for p in &r.unheld {
        outln!(
            "released its hold on pin {} of {} (pool {})",
            p.address,
            p.owner,
            p.pool
        );
    }
    let kept = r.listed - r.blocks.len() - r.pinned.len();
    outln!(
        "node {node}: {} block(s) given back{}",
        r.blocks.len(),
        match kept {
            0 => String::new(),
            k => format!(", {k} re-created by another owner meanwhile and left alone"),
        }
    );
    Ok(())
}
