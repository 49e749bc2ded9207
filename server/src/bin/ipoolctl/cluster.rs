//! `ipoolctl cluster ...`: cluster mode's pools and blocks, read and written in etcd directly
//! (no ipoold involved).

use std::process::ExitCode;
use std::time::Duration;

use ipnet::IpNet;
use ipool_server::cluster::etcd::{
    ClusterError, ClusterStore, PoolSpec, Tls, DEFAULT_BLOCK_V4, DEFAULT_BLOCK_V6,
};

use crate::{Output, EXIT_NOT_FOUND, EXIT_REFUSED, EXIT_UNREACHABLE, EXIT_USAGE};

/// Where etcd is. Global to `cluster`'s subcommands: accepted after them too.
#[derive(clap::Args, Debug)]
pub(super) struct EtcdArgs {
    /// etcd endpoints, comma-separated (http://10.0.0.1:2379,...).
    #[arg(
        long,
        global = true,
        env = "IPOOL_ETCD_ENDPOINTS",
        value_delimiter = ',',
        default_value = "http://127.0.0.1:2379"
    )]
    etcd_endpoints: Vec<String>,
    /// Key prefix of ipool's data in etcd.
    #[arg(long, global = true, env = "IPOOL_ETCD_PREFIX", default_value = ipool_server::cluster::etcd::DEFAULT_PREFIX)]
    etcd_prefix: String,
    /// Seconds an etcd call may take.
    #[arg(long, global = true, default_value_t = 5)]
    etcd_timeout: u64,
    /// The CA that signed etcd's server certificate (https endpoints).
    #[arg(long, global = true, env = "IPOOL_ETCD_CACERT")]
    etcd_cacert: Option<std::path::PathBuf>,
    /// A client certificate for etcd (with --etcd-key).
    #[arg(long, global = true, env = "IPOOL_ETCD_CERT", requires = "etcd_key")]
    etcd_cert: Option<std::path::PathBuf>,
    /// The client certificate's key (with --etcd-cert).
    #[arg(long, global = true, env = "IPOOL_ETCD_KEY", requires = "etcd_cert")]
    etcd_key: Option<std::path::PathBuf>,
}

#[derive(clap::Subcommand, Debug)]
pub(super) enum ClusterCommand {
    /// Cluster pools: create, list, delete.
    #[command(subcommand)]
    Pool(PoolCommand),
    /// Owned blocks (filters combine).
    Blocks {
        #[arg(long)]
        pool: Option<String>,
        #[arg(long)]
        node: Option<String>,
    },
    /// Give back every block of a node that is gone. Refused while its daemon's heartbeat
    /// lease lives, or while it was seen in the last --absent-for seconds; --force gives them
    /// back anyway (and reports what it dropped).
    ReleaseNode {
        node: String,
        /// Seconds the node's daemon must have been silent.
        #[arg(long, default_value_t = 3600)]
        absent_for: u64,
        #[arg(long)]
        force: bool,
    },
}

#[derive(clap::Subcommand, Debug)]
pub(super) enum PoolCommand {
    /// Create a pool of one or more CIDRs (IPv4 and/or IPv6).
    Create {
        name: String,
        #[arg(long = "cidr", required = true)]
        cidrs: Vec<String>,
        /// Block prefix length for IPv4 CIDRs.
        #[arg(long, default_value_t = DEFAULT_BLOCK_V4)]
        block_size: u8,
        /// Block prefix length for IPv6 CIDRs.
        #[arg(long, default_value_t = DEFAULT_BLOCK_V6)]
        block_size_v6: u8,
        /// Ranges never handed out (the service CIDR, say).
        #[arg(long = "exclude")]
        exclude: Vec<String>,
    },
    List,
    /// Delete a pool (refused while any of its blocks is owned).
    Delete {
        name: String,
    },
}

fn parse_nets(what: &str, v: &[String]) -> Result<Vec<IpNet>, String> {
    v.iter()
        .map(|s| {
            s.parse::<IpNet>()
                .map_err(|_| format!("{what} {s:?} is not a CIDR"))
        })
        .collect()
}

fn exit_for(e: &ClusterError) -> u8 {
    match e {
        ClusterError::Etcd(_) => EXIT_UNREACHABLE,
        ClusterError::Refused(m) if m.starts_with("no pool") => EXIT_NOT_FOUND,
        _ => EXIT_REFUSED,
    }
}

pub(super) async fn run(etcd: &EtcdArgs, cmd: &ClusterCommand, out: Output) -> ExitCode {
    for e in &etcd.etcd_endpoints {
        if let Err(e) = ipool_server::config::cluster::check_endpoint(e) {
            eprintln!("ipoolctl: --etcd-endpoints: {e}");
            return ExitCode::from(EXIT_USAGE);
        }
    }
    let tls = match Tls::read(
        etcd.etcd_cacert.as_deref(),
        etcd.etcd_cert.as_deref().zip(etcd.etcd_key.as_deref()),
    ) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("ipoolctl: {e}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    let https = etcd
        .etcd_endpoints
        .iter()
        .any(|e| e.starts_with("https://"));
    let store = match ClusterStore::connect(
        &etcd.etcd_endpoints,
        &etcd.etcd_prefix,
        Duration::from_secs(etcd.etcd_timeout.max(1)),
        https.then_some(&tls),
    )
    .await
    {
        Ok(s) => s,
        Err(e) => {
            eprintln!(
                "ipoolctl: cannot reach etcd at {}: {e}",
                etcd.etcd_endpoints.join(",")
            );
            return ExitCode::from(EXIT_UNREACHABLE);
        }
    };
    let result = match cmd {
        ClusterCommand::Pool(PoolCommand::Create {
            name,
            cidrs,
            block_size,
            block_size_v6,
            exclude,
        }) => {
            let spec = match (
                parse_nets("--cidr", cidrs),
                parse_nets("--exclude", exclude),
            ) {
                (Ok(cidrs), Ok(exclude)) => PoolSpec {
                    name: name.clone(),
                    cidrs,
                    block_v4: *block_size,
                    block_v6: *block_size_v6,
                    exclude,
                },
                (Err(e), _) | (_, Err(e)) => {
                    eprintln!("ipoolctl: {e}");
                    return ExitCode::from(EXIT_USAGE);
                }
            };
            store.create_pool(&spec).await.map(|()| {
                if out == Output::Table {
                    outln!("pool {name} created");
                }
            })
        }
        ClusterCommand::Pool(PoolCommand::List) => store.list_pools().await.map(|pools| {
            print_pools(&pools, out);
        }),
        ClusterCommand::Pool(PoolCommand::Delete { name }) => {
            store.delete_pool(name).await.map(|()| {
                if out == Output::Table {
                    outln!("pool {name} deleted");
                }
            })
        }
        ClusterCommand::Blocks { pool, node } => store
            .list_blocks(pool.as_deref(), node.as_deref())
            .await
            .map(|blocks| print_blocks(&blocks, out)),
        ClusterCommand::ReleaseNode {
            node,
            absent_for,
            force,
        } => release_node(&store, node, *absent_for, *force, out).await,
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ipoolctl: {e}");
            ExitCode::from(exit_for(&e))
        }
    }
}

fn print_pools(pools: &[PoolSpec], out: Output) {
    if out == Output::Json {
        let v: Vec<serde_json::Value> = pools
            .iter()
            .map(|p| {
                serde_json::json!({
                    "name": p.name, "cidrs": p.cidrs, "blockSize": p.block_v4,
                    "blockSizeV6": p.block_v6, "exclude": p.exclude,
                })
            })
            .collect();
        outln!("{}", serde_json::Value::Array(v));
        return;
    }
    let rows = pools
        .iter()
        .map(|p| {
            let join = |v: &[IpNet]| {
                let s: Vec<String> = v.iter().map(|n| n.to_string()).collect();
                if s.is_empty() {
                    "-".to_string()
                } else {
                    s.join(",")
                }
            };
            vec![
                p.name.clone(),
                join(&p.cidrs),
                format!("/{} /{}", p.block_v4, p.block_v6),
                join(&p.exclude),
            ]
        })
        .collect();
    crate::print::table(&["POOL", "CIDRS", "BLOCKS (v4 v6)", "EXCLUDED"], rows);
}

fn print_blocks(blocks: &[ipool_server::cluster::etcd::Block], out: Output) {
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

/// Gives back `node`'s blocks once it is gone (or with `force`), printing what was dropped.
async fn release_node(
    store: &ClusterStore,
    node: &str,
    absent_for: u64,
    force: bool,
    out: Output,
) -> Result<(), ClusterError> {
    let state = store.node_state(node).await?;
    let now = ipool_server::cluster::etcd::now_ms();
    let silent_secs = state.seen_ms.map(|s| now.saturating_sub(s) / 1000);
    let refusal = if state.alive {
        Some(format!(
            "node {node:?} is alive: its daemon keeps its heartbeat lease in etcd"
        ))
    } else {
        match silent_secs {
            Some(s) if s < absent_for => Some(format!(
                "node {node:?} was seen {s} s ago, less than --absent-for {absent_for} s: it may be restarting or cut off from etcd"
            )),
            _ => None,
        }
    };
    if let Some(why) = &refusal {
        if !force {
            return Err(ClusterError::Refused(format!(
                "{why}; its {} block(s) stay (--force gives them back anyway)",
                state.blocks.len()
            )));
        }
        eprintln!("ipoolctl: --force: {why}; giving its blocks back anyway");
    }
    let released = store.release_node(node, &state.blocks).await?;
    if out == Output::Json {
        print_blocks(&released, out);
        return Ok(());
    }
    for b in &released {
        outln!(
            "released {} of pool {} (owned by {node} since {} ms after the epoch)",
            b.block,
            b.pool,
            b.owner.claimed_at_ms
        );
    }
    let kept = state.blocks.len() - released.len();
    outln!(
        "node {node}: {} block(s) given back{}",
        released.len(),
        match kept {
            0 => String::new(),
            k => format!(", {k} re-created by another owner meanwhile and left alone"),
        }
    );
    Ok(())
}
