//! `ipoolctl cluster check`: the store (pools, blocks, nodes' names, pins) and, where the
//! apiserver can be asked, its Nodes and pods, read and judged (`cluster::check`); every
//! finding printed with what to do; exit 0 when clean, 1 with findings. And `release-node
//! --from-check FILE`: the nodes such a report found gone or away, each checked again and
//! released as `release-node` releases one.

use std::path::Path;
use std::process::ExitCode;

use ipool_server::cluster::check::{self, Apiserver, Kind, Report, Stored};
use ipool_server::cluster::datastore::Datastore;
use ipool_server::cluster::departed::Directory;
use ipool_server::cluster::vocab::ClusterError;
use ipool_server::k8s::nodes::Nodes;

use crate::cluster_out::exit_for;
use crate::{Output, EXIT_REFUSED, EXIT_UNREACHABLE, EXIT_USAGE};

/// Reads everything and prints the report; the exit code (0 clean, 1 findings).
pub(crate) async fn run(
    store: &dyn Datastore,
    place: &str,
    client: Option<kube::Client>,
    out: Output,
) -> ExitCode {
    let report = match read_and_check(store, client).await {
        Ok(r) => r,
        Err(e) => {
            eprintln!("ipoolctl: {e}");
            return ExitCode::from(e.code);
        }
    };
    if out == Output::Json {
        outln!(
            "{}",
            serde_json::to_string_pretty(&report).unwrap_or_default()
        );
    } else {
        print(&report, place);
    }
    match report.findings.is_empty() {
        true => ExitCode::SUCCESS,
        false => ExitCode::from(EXIT_REFUSED),
    }
}

/// A failed read: the message and the exit code.
struct Failed {
    message: String,
    code: u8,
}

impl std::fmt::Display for Failed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl From<ClusterError> for Failed {
    fn from(e: ClusterError) -> Failed {
        Failed {
            code: exit_for(&e),
            message: e.to_string(),
        }
    }
}

fn apiserver_failed(what: &str, e: String) -> Failed {
    Failed {
        message: format!("the apiserver: {what}: {e}"),
        code: EXIT_UNREACHABLE,
    }
}

async fn read_and_check(
    store: &dyn Datastore,
    client: Option<kube::Client>,
) -> Result<Report, Failed> {
    let pools = store.pools().await?;
    let blocks = store.list_blocks(None, None).await?;
    let nodes = store.nodes_seen().await?;
    let pins = store.pins(None).await?;
    let api = match client {
        None => None,
        Some(c) => {
            let names = Nodes::new(c.clone())
                .names()
                .await
                .map_err(|e| apiserver_failed("listing the Nodes", e.to_string()))?;
            let pods = ipool_server::k8s::nodes::pod_ips(c)
                .await
                .map_err(|e| apiserver_failed("listing the pods", e.to_string()))?;
            Some(Apiserver { nodes: names, pods })
        }
    };
    let stored = Stored {
        pools: &pools,
        blocks: &blocks,
        nodes: &nodes,
        pins: &pins,
    };
    Ok(check::check(&stored, api.as_ref()))
}

fn print(r: &Report, place: &str) {
    for f in &r.findings {
        outln!(
            "{}{}: {}",
            serde_json::to_value(f.kind)
                .ok()
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_default(),
            f.node
                .as_deref()
                .map(|n| format!(" ({n})"))
                .unwrap_or_default(),
            f.what
        );
        outln!("  do: {}", f.fix);
    }
    let scope = match r.apiserver {
        true => format!("{} pods' addresses and the Nodes", r.pods),
        false => "not the Nodes nor the pods (no apiserver: --kubeconfig)".to_string(),
    };
    outln!(
        "{} finding(s) in {place}: {} pools, {} blocks of {} nodes checked; {scope}",
        r.findings.len(),
        r.pools,
        r.blocks,
        r.nodes
    );
}

/// `release-node --from-check FILE`: each node the report found gone or away, checked again
/// (its Node gone now, read from the apiserver; the store's judgement as release-node's,
/// `absent_for`), then released. Exit 0 when every one was released, 1 when one was left
/// alone or refused.
pub(crate) async fn release_from(
    store: &dyn Datastore,
    place: &str,
    client: Option<kube::Client>,
    file: &Path,
    absent_for: u64,
    out: Output,
) -> ExitCode {
    let report: Report = match std::fs::read(file)
        .map_err(|e| e.to_string())
        .and_then(|b| serde_json::from_slice(&b).map_err(|e| e.to_string()))
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!(
                "ipoolctl: --from-check {}: {e} (give the output of ipoolctl cluster check -o json)",
                file.display()
            );
            return ExitCode::from(EXIT_USAGE);
        }
    };
    let mut nodes: Vec<(String, Kind)> = report
        .findings
        .iter()
        .filter(|f| matches!(f.kind, Kind::NodeGone | Kind::NodeAway))
        .filter_map(|f| f.node.clone().map(|n| (n, f.kind)))
        .collect();
    nodes.dedup();
    if nodes.is_empty() {
        outln!("the check found no node gone or away: nothing to release");
        return ExitCode::SUCCESS;
    }
    // Departed is what the apiserver says: a Node that is there (a node away, its daemon
    // crashlooping while its pods run) is never released from a report.
    let Some(directory) = client.map(Nodes::new) else {
        eprintln!("ipoolctl: --from-check reads each node's Node again before releasing it: give --kubeconfig (the store is etcd)");
        return ExitCode::from(EXIT_USAGE);
    };
    // Each node's Node, as its daemon recorded it (the names may differ).
    let recorded: std::collections::BTreeMap<String, String> = match store.nodes_seen().await {
        Ok(seen) => seen
            .into_iter()
            .filter_map(|n| n.k8s_node.map(|k| (n.node, k)))
            .collect(),
        Err(e) => {
            eprintln!("ipoolctl: {e}");
            return ExitCode::from(exit_for(&e));
        }
    };
    let mut refused = 0;
    for (node, kind) in nodes {
        let k8s = recorded.get(&node).unwrap_or(&node);
        match directory.exists(k8s).await {
            Ok(false) => {}
            Ok(true) => {
                match kind {
                    Kind::NodeGone => outln!("node {node}: its Node is back: left alone"),
                    _ => outln!("node {node}: its Node is there: left alone (drain it and delete its Node first, if it is gone)"),
                }
                refused += 1;
                continue;
            }
            Err(e) => {
                eprintln!("ipoolctl: node {node}: reading its Node: {e}");
                refused += 1;
                continue;
            }
        }
        match crate::release::release_node(store, place, &node, absent_for, false, out).await {
            Ok(()) => {}
            Err(e) => {
                eprintln!("ipoolctl: node {node}: {e}");
                refused += 1;
            }
        }
    }
    match refused {
        0 => ExitCode::SUCCESS,
        _ => ExitCode::from(EXIT_REFUSED),
    }
}
