//! ipoolctl: look at a running ipoold.
//!
//! Exit codes: 0 success, 1 the daemon answered with an error, 2 the daemon could not be
//! reached, 64 bad usage (clap's own errors exit 2 as well).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use ipool_proto::v1 as pb;
use pb::ops_client::OpsClient;
use tonic::transport::{Channel, Endpoint};

#[derive(Parser, Debug)]
#[command(version, about = "Operate a running ipoold")]
struct Args {
    /// The daemon's Unix socket.
    #[arg(
        long,
        env = "IPOOL_SOCKET",
        default_value = "/run/ipool/ipool.sock",
        global = true
    )]
    socket: PathBuf,
    /// Output format.
    #[arg(short, long, value_enum, default_value = "table", global = true)]
    output: Output,
    #[command(subcommand)]
    command: Command,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq)]
enum Output {
    Table,
    Json,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Each pool's counts (per network and address family).
    Status {
        /// Only this network.
        #[arg(long)]
        network: Option<String>,
    },
    /// Live attachments and their addresses.
    List {
        /// Only this network.
        #[arg(long)]
        network: Option<String>,
    },
}

fn main() -> ExitCode {
    let args = Args::parse();
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("ipoolctl: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    rt.block_on(run(args))
}

async fn connect(socket: &std::path::Path) -> Result<OpsClient<Channel>, String> {
    let endpoint = Endpoint::from_shared(format!("unix://{}", socket.display()))
        .map_err(|e| format!("bad socket path {}: {e}", socket.display()))?
        .connect_timeout(Duration::from_secs(3))
        .timeout(Duration::from_secs(10));
    let channel = endpoint.connect().await.map_err(|e| {
        format!(
            "cannot reach ipoold at {}: {e} (is it running? is --socket / IPOOL_SOCKET right?)",
            socket.display()
        )
    })?;
    Ok(OpsClient::new(channel))
}

async fn run(args: Args) -> ExitCode {
    let mut client = match connect(&args.socket).await {
        Ok(c) => c,
        Err(e) => {
            eprintln!("ipoolctl: {e}");
            return ExitCode::from(2);
        }
    };
    let result = match &args.command {
        Command::Status { network } => client
            .pool_status(pb::PoolStatusRequest {
                network: network.clone().unwrap_or_default(),
            })
            .await
            .map(|r| print_status(&r.into_inner(), args.output)),
        Command::List { network } => client
            .list_allocations(pb::ListAllocationsRequest {
                network: network.clone().unwrap_or_default(),
            })
            .await
            .map(|r| print_list(&r.into_inner(), args.output)),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(status) => {
            eprintln!(
                "ipoolctl: ipoold: {:?}: {}",
                status.code(),
                status.message()
            );
            ExitCode::from(1)
        }
    }
}

fn table(header: &[&str], rows: Vec<Vec<String>>) {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for r in &rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.len());
        }
    }
    let line = |cells: Vec<String>| {
        let parts: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        println!("{}", parts.join("  ").trim_end());
    };
    line(header.iter().map(|s| s.to_string()).collect());
    for r in rows {
        line(r);
    }
}

fn print_status(r: &pb::PoolStatusResponse, out: Output) {
    if out == Output::Json {
        let v: Vec<serde_json::Value> = r
            .pools
            .iter()
            .map(|p| {
                serde_json::json!({
                    "network": p.network, "family": p.family, "ranges": p.ranges,
                    "capacity": p.capacity, "inUse": p.in_use, "idle": p.idle,
                    "cooling": p.cooling, "reserved": p.reserved, "freeInSource": p.free_in_source,
                    "minIdle": p.min_idle, "maxIdle": p.max_idle, "bucketTokens": p.bucket_tokens,
                })
            })
            .collect();
        println!("{}", serde_json::Value::Array(v));
        return;
    }
    let rows = r
        .pools
        .iter()
        .map(|p| {
            vec![
                p.network.clone(),
                format!("IPv{}", p.family),
                p.ranges.join(","),
                p.in_use.to_string(),
                p.idle.to_string(),
                p.cooling.to_string(),
                p.reserved.to_string(),
                p.capacity.to_string(),
                p.free_in_source.to_string(),
            ]
        })
        .collect();
    table(
        &[
            "NETWORK", "FAMILY", "RANGES", "IN-USE", "IDLE", "COOLING", "RESERVED", "CAPACITY",
            "FREE",
        ],
        rows,
    );
}

fn print_list(r: &pb::ListAllocationsResponse, out: Output) {
    if out == Output::Json {
        let v: Vec<serde_json::Value> = r
            .allocations
            .iter()
            .map(|a| {
                serde_json::json!({
                    "network": a.network, "containerID": a.container_id, "ifname": a.ifname,
                    "podNamespace": a.pod_namespace, "podName": a.pod_name, "podUID": a.pod_uid,
                    "addresses": a.addresses, "netns": a.netns, "createdAtMs": a.created_at_ms,
                })
            })
            .collect();
        println!("{}", serde_json::Value::Array(v));
        return;
    }
    let rows = r
        .allocations
        .iter()
        .map(|a| {
            let pod = if a.pod_name.is_empty() {
                "-".to_string()
            } else {
                format!("{}/{}", a.pod_namespace, a.pod_name)
            };
            vec![
                a.network.clone(),
                a.addresses.join(","),
                pod,
                a.container_id.chars().take(12).collect(),
                a.ifname.clone(),
            ]
        })
        .collect();
    table(
        &["NETWORK", "ADDRESSES", "POD", "CONTAINER", "IFNAME"],
        rows,
    );
}
