//! `ipoolctl cluster release-node`: what release-node gave back, kept and released, printed.

use ipool_server::cluster::datastore::Datastore;
use ipool_server::cluster::vocab::ClusterError;

use crate::cluster_out::{print_blocks, warn_malformed};
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

/// `release-departed`: one look of the release of departed nodes, as the daemon that leads it
/// looks (`cluster::departed::sweep`), by the operator or a CronJob where the daemons may not
/// write other nodes' blocks (the Kubernetes API store's admission policy): the pins nobody
/// holds in the blocks of nodes not alive, ended once their owners have been gone long enough,
/// then each node that owns blocks, whose Node the apiserver does not have (`client`) and
/// whose name has been away past its fence and the threshold, released as release-node
/// releases one. Exit 0 unless a read or a write failed.
pub(crate) async fn release_departed(
    store: &dyn Datastore,
    place: &str,
    client: Option<kube::Client>,
    limits: ipool_server::cluster::departed::Thresholds,
) -> std::process::ExitCode {
    use ipool_server::cluster::departed::pins::PinOutcome;
    use ipool_server::cluster::departed::{sweep, Outcome};
    let Some(client) = client else {
        eprintln!("ipoolctl: release-departed asks the apiserver which Nodes are gone: give --kubeconfig (the store is etcd)");
        return std::process::ExitCode::from(crate::EXIT_USAGE);
    };
    let dir = ipool_server::k8s::nodes::Nodes::new(client);
    let look = match sweep(store, place, None, limits, &dir).await {
        Ok(f) => f,
        Err(e) => {
            eprintln!("ipoolctl: {e}");
            return std::process::ExitCode::from(crate::cluster_out::exit_for(&e));
        }
    };
    let mut failed = false;
    for p in &look.pins {
        let pin = p.pin();
        let what = format!("pin {} of {} (block {})", pin.address, pin.owner, pin.block);
        match p {
            PinOutcome::Ended { why, .. } => outln!("{what}: ended ({why})"),
            PinOutcome::Waiting { why, .. } => outln!("{what}: kept ({why})"),
            PinOutcome::Failed { why, .. } => {
                failed = true;
                eprintln!("ipoolctl: {what}: {why}");
            }
        }
    }
    for (node, outcome) in &look.nodes {
        match outcome {
            Outcome::Released(r) => {
                let blocks: Vec<String> = r.blocks.iter().map(|b| b.block.to_string()).collect();
                outln!(
                    "node {node}: its Node is gone; released {} block(s) [{}], kept {} a pin was made in",
                    r.blocks.len(),
                    blocks.join(", "),
                    r.pinned.len()
                );
            }
            Outcome::Kept(r) => {
                let blocks: Vec<String> = r.pinned.iter().map(|b| b.block.to_string()).collect();
                outln!(
                    "node {node}: its Node is gone; nothing to release: its {} block(s) [{}] hold pins, and go back once those end",
                    r.pinned.len(),
                    blocks.join(", ")
                );
            }
            Outcome::Waiting(why) | Outcome::Refused(why) => {
                outln!("node {node}: its Node is gone; not released: {why}")
            }
            Outcome::Unknown(why) => outln!("node {node}: not judged: {why}"),
            Outcome::Failed(why) => {
                failed = true;
                eprintln!("ipoolctl: node {node}: {why}");
            }
        }
    }
    if look.nodes.is_empty() && look.pins.is_empty() {
        outln!("no node that owns blocks is gone from the apiserver");
    }
    match failed {
        false => std::process::ExitCode::SUCCESS,
        true => std::process::ExitCode::from(crate::EXIT_REFUSED),
    }
}
