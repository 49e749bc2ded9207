//! ipoolctl: look at and steer a running ipoold, over its Unix socket or TCP (`--addr`).
//!
//! Exit codes: 0 success; 1 ipoold refused the call; 2 ipoold could not be reached; 3 what was
//! asked for does not exist; 4 not allowed (authentication); 64 bad usage.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use ipool_proto::v1 as pb;
use pb::ops_client::OpsClient;
use tonic::metadata::MetadataValue;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};
use tonic::{Code, Request, Status};

#[derive(Parser, Debug)]
#[command(version, about = "Look at and steer a running ipoold")]
struct Args {
    /// The daemon's Unix socket.
    #[arg(
        long,
        env = "IPOOL_SOCKET",
        default_value = "/run/ipool/ipool.sock",
        global = true
    )]
    socket: PathBuf,
    /// Talk to ipoold's --ops-listen TCP address (HOST:PORT) instead of the socket.
    #[arg(long, env = "IPOOL_ADDR", global = true)]
    addr: Option<String>,
    /// File holding the bearer token (ipoold's --ops-token-file), for mutating calls over TCP.
    #[arg(long, env = "IPOOL_TOKEN_FILE", global = true)]
    token_file: Option<PathBuf>,
    /// CA certificate (PEM) that signed ipoold's TLS certificate: use TLS.
    #[arg(long, global = true)]
    tls_ca: Option<PathBuf>,
    /// Client certificate and key (PEM) for mutual TLS.
    #[arg(long, global = true, requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    #[arg(long, global = true, requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// TLS server name to expect (default: the host of --addr).
    #[arg(long, global = true)]
    tls_server_name: Option<String>,
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
    /// Live attachments and their addresses (filters combine).
    List {
        #[arg(long)]
        network: Option<String>,
        #[arg(long)]
        namespace: Option<String>,
        #[arg(long)]
        pod: Option<String>,
        #[arg(long)]
        address: Option<String>,
        #[arg(long)]
        container: Option<String>,
    },
    /// One attachment, by container (and interface) or by address.
    Get {
        #[arg(long)]
        network: String,
        #[arg(long, conflicts_with = "address", required_unless_present = "address")]
        container: Option<String>,
        #[arg(long, default_value = "eth0")]
        ifname: String,
        #[arg(long)]
        address: Option<String>,
    },
    /// Addresses kept for pods (sticky pods that are away, operator reservations).
    Reservations {
        #[arg(long)]
        network: Option<String>,
    },
    /// Keep addresses for a namespace/pod name; its next ADD gets them.
    Reserve {
        #[arg(long)]
        network: String,
        #[arg(long)]
        namespace: String,
        #[arg(long)]
        pod: String,
        /// Addresses to keep (one per range set); none: one of each range set.
        #[arg(long = "address")]
        addresses: Vec<String>,
        /// How long, in seconds.
        #[arg(long, default_value_t = 600)]
        ttl: u64,
        #[arg(long, default_value = "")]
        reason: String,
    },
    /// End a reservation now (its addresses go idle, cooling).
    Unreserve {
        #[arg(long)]
        network: String,
        #[arg(long)]
        namespace: String,
        #[arg(long)]
        pod: String,
    },
    /// Force-release an attachment (as a DEL would; never kept for a sticky pod).
    Release {
        #[arg(long)]
        network: String,
        #[arg(long)]
        container: String,
        #[arg(long, default_value = "eth0")]
        ifname: String,
        /// Why (logged by ipoold). Required.
        #[arg(long)]
        reason: String,
    },
    /// Stop new ADDs on a network (or on all); existing attachments keep working.
    Drain {
        #[arg(long)]
        network: Option<String>,
        /// Undrain instead.
        #[arg(long)]
        undo: bool,
    },
    /// Print allocation events as they happen, until interrupted.
    Watch {
        #[arg(long)]
        network: Option<String>,
    },
}

const EXIT_REFUSED: u8 = 1;
const EXIT_UNREACHABLE: u8 = 2;
const EXIT_NOT_FOUND: u8 = 3;
const EXIT_NOT_ALLOWED: u8 = 4;
const EXIT_USAGE: u8 = 64;

fn main() -> ExitCode {
    let args = match Args::try_parse() {
        Ok(a) => a,
        Err(e) => {
            let code = if e.use_stderr() { EXIT_USAGE } else { 0 };
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("ipoolctl: cannot start the async runtime: {e}");
            return ExitCode::from(EXIT_REFUSED);
        }
    };
    rt.block_on(run(args))
}

fn read(path: &Path, what: &str) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("cannot read {what} {}: {e}", path.display()))
}

async fn connect(args: &Args) -> Result<OpsClient<Channel>, String> {
    let watching = matches!(args.command, Command::Watch { .. });
    let endpoint = match &args.addr {
        None => Endpoint::from_shared(format!("unix://{}", args.socket.display()))
            .map_err(|e| format!("bad socket path {}: {e}", args.socket.display()))?,
        Some(addr) => {
            let scheme = if args.tls_ca.is_some() {
                "https"
            } else {
                "http"
            };
            let mut ep = Endpoint::from_shared(format!("{scheme}://{addr}"))
                .map_err(|e| format!("bad --addr {addr:?} (want HOST:PORT): {e}"))?;
            if let Some(ca) = &args.tls_ca {
                let mut tls = ClientTlsConfig::new()
                    .ca_certificate(Certificate::from_pem(read(ca, "--tls-ca")?));
                if let (Some(c), Some(k)) = (&args.tls_cert, &args.tls_key) {
                    tls = tls.identity(Identity::from_pem(
                        read(c, "--tls-cert")?,
                        read(k, "--tls-key")?,
                    ));
                }
                if let Some(name) = &args.tls_server_name {
                    tls = tls.domain_name(name.clone());
                }
                ep = ep
                    .tls_config(tls)
                    .map_err(|e| format!("TLS settings: {e}"))?;
            }
            ep
        }
    };
    let mut endpoint = endpoint.connect_timeout(Duration::from_secs(3));
    if !watching {
        endpoint = endpoint.timeout(Duration::from_secs(10));
    }
    let target = match &args.addr {
        Some(a) => a.clone(),
        None => args.socket.display().to_string(),
    };
    let channel = endpoint.connect().await.map_err(|e| {
        let cause = std::error::Error::source(&e)
            .map(|s| s.to_string())
            .unwrap_or_else(|| e.to_string());
        format!(
            "cannot reach ipoold at {target}: {cause} (is it running? is --socket / --addr right?)"
        )
    })?;
    Ok(OpsClient::new(channel))
}

/// Wraps a message, adding the bearer token when there is one.
fn request<T>(msg: T, token: &Option<String>) -> Result<Request<T>, Status> {
    let mut r = Request::new(msg);
    if let Some(t) = token {
        let v = MetadataValue::try_from(format!("Bearer {t}")).map_err(|_| {
            Status::invalid_argument("the token file holds characters a header cannot carry")
        })?;
        r.metadata_mut().insert("authorization", v);
    }
    Ok(r)
}

fn opt(s: &Option<String>) -> String {
    s.clone().unwrap_or_default()
}

async fn run(args: Args) -> ExitCode {
    let token = match &args.token_file {
        Some(p) => match read(p, "--token-file") {
            Ok(b) => Some(String::from_utf8_lossy(&b).trim().to_string()),
            Err(e) => {
                eprintln!("ipoolctl: {e}");
                return ExitCode::from(EXIT_USAGE);
            }
        },
        None => None,
    };
    let mut client = match connect(&args).await {
        Ok(c) => c,
        Err(e) => {
            eprintln!("ipoolctl: {e}");
            return ExitCode::from(EXIT_UNREACHABLE);
        }
    };
    let out = args.output;
    let result: Result<(), Status> = async {
        match &args.command {
            Command::Status { network } => {
                let r = client
                    .pool_status(request(
                        pb::PoolStatusRequest {
                            network: opt(network),
                        },
                        &token,
                    )?)
                    .await?;
                print_status(&r.into_inner(), out);
            }
            Command::List {
                network,
                namespace,
                pod,
                address,
                container,
            } => {
                let mut all = pb::ListAllocationsResponse::default();
                let mut page_token = String::new();
                loop {
                    let r = client
                        .list_allocations(request(
                            pb::ListAllocationsRequest {
                                network: opt(network),
                                namespace: opt(namespace),
                                pod: opt(pod),
                                address: opt(address),
                                container_id: opt(container),
                                page_size: 1000,
                                page_token: page_token.clone(),
                            },
                            &token,
                        )?)
                        .await?
                        .into_inner();
                    all.allocations.extend(r.allocations);
                    if r.next_page_token.is_empty() {
                        break;
                    }
                    page_token = r.next_page_token;
                }
                print_list(&all, out);
            }
            Command::Get {
                network,
                container,
                ifname,
                address,
            } => {
                let r = client
                    .get_allocation(request(
                        pb::GetAllocationRequest {
                            network: network.clone(),
                            container_id: opt(container),
                            ifname: ifname.clone(),
                            address: opt(address),
                        },
                        &token,
                    )?)
                    .await?;
                print_list(
                    &pb::ListAllocationsResponse {
                        allocations: vec![r.into_inner()],
                        next_page_token: String::new(),
                    },
                    out,
                );
            }
            Command::Reservations { network } => {
                let r = client
                    .list_reservations(request(
                        pb::ListReservationsRequest {
                            network: opt(network),
                        },
                        &token,
                    )?)
                    .await?;
                print_reservations(&r.into_inner().reservations, out);
            }
            Command::Reserve {
                network,
                namespace,
                pod,
                addresses,
                ttl,
                reason,
            } => {
                let r = client
                    .reserve(request(
                        pb::ReserveRequest {
                            network: network.clone(),
                            namespace: namespace.clone(),
                            name: pod.clone(),
                            addresses: addresses.clone(),
                            ttl_secs: *ttl,
                            reason: reason.clone(),
                        },
                        &token,
                    )?)
                    .await?;
                print_reservations(&[r.into_inner()], out);
            }
            Command::Unreserve {
                network,
                namespace,
                pod,
            } => {
                let r = client
                    .unreserve(request(
                        pb::UnreserveRequest {
                            network: network.clone(),
                            namespace: namespace.clone(),
                            name: pod.clone(),
                        },
                        &token,
                    )?)
                    .await?;
                print_reservations(&[r.into_inner()], out);
            }
            Command::Release {
                network,
                container,
                ifname,
                reason,
            } => {
                let r = client
                    .release(request(
                        pb::ReleaseRequest {
                            network: network.clone(),
                            container_id: container.clone(),
                            ifname: ifname.clone(),
                            reason: reason.clone(),
                        },
                        &token,
                    )?)
                    .await?
                    .into_inner();
                match out {
                    Output::Json => println!("{}", serde_json::json!({ "released": r.released })),
                    Output::Table => println!("released {}", r.released.join(", ")),
                }
            }
            Command::Drain { network, undo } => {
                let r = client
                    .drain(request(
                        pb::DrainRequest {
                            network: opt(network),
                            drain: !undo,
                        },
                        &token,
                    )?)
                    .await?
                    .into_inner();
                match out {
                    Output::Json => println!("{}", serde_json::json!({ "drained": r.drained })),
                    Output::Table if r.drained.is_empty() => println!("no network is drained"),
                    Output::Table => println!("drained: {}", r.drained.join(", ")),
                }
            }
            Command::Watch { network } => {
                let mut stream = client
                    .watch(request(
                        pb::WatchRequest {
                            network: opt(network),
                        },
                        &token,
                    )?)
                    .await?
                    .into_inner();
                if out == Output::Table {
                    println!("TIME(ms)  KIND  NETWORK  POD  CONTAINER  ADDRESSES  REASON");
                }
                while let Some(e) = stream.message().await? {
                    print_event(&e, out);
                }
            }
        }
        Ok(())
    }
    .await;
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(status) => {
            let (code, hint) = match status.code() {
                Code::NotFound => (EXIT_NOT_FOUND, ""),
                Code::Unauthenticated => (
                    EXIT_NOT_ALLOWED,
                    " (pass --token-file with the token of ipoold's --ops-token-file, or use mTLS)",
                ),
                Code::PermissionDenied => (EXIT_NOT_ALLOWED, ""),
                Code::Unavailable => (
                    EXIT_UNREACHABLE,
                    " (ipoold is restarting, overloaded or draining; try again)",
                ),
                Code::InvalidArgument => (EXIT_REFUSED, " (see ipoolctl <command> --help)"),
                _ => (EXIT_REFUSED, ""),
            };
            eprintln!(
                "ipoolctl: ipoold: {:?}: {}{hint}",
                status.code(),
                status.message()
            );
            ExitCode::from(code)
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
    if !r.store_error.is_empty() {
        eprintln!(
            "ipoold's store has failed: it serves no ADD or DEL until it is reopened (it retries by itself): {}",
            r.store_error
        );
    }
    if out == Output::Json {
        let v: Vec<serde_json::Value> = r
            .pools
            .iter()
            .map(|p| {
                serde_json::json!({
                    "network": p.network, "family": p.family, "ranges": p.ranges,
                    "capacity": p.capacity, "inUse": p.in_use, "idle": p.idle,
                    "cooling": p.cooling, "reserved": p.reserved, "drained": p.drained,
                    "lastSourceError": p.last_source_error, "freeInSource": p.free_in_source,
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

fn print_reservations(rs: &[pb::Reservation], out: Output) {
    if out == Output::Json {
        let v: Vec<serde_json::Value> = rs
            .iter()
            .map(|r| {
                serde_json::json!({
                    "network": r.network, "namespace": r.namespace, "pod": r.name,
                    "addresses": r.addresses, "createdAtMs": r.created_at_ms,
                    "expiresAtMs": r.expires_at_ms, "reason": r.reason,
                })
            })
            .collect();
        println!("{}", serde_json::Value::Array(v));
        return;
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0);
    let rows = rs
        .iter()
        .map(|r| {
            vec![
                r.network.clone(),
                format!("{}/{}", r.namespace, r.name),
                r.addresses.join(","),
                format!("{}s", r.expires_at_ms.saturating_sub(now) / 1000),
                r.reason.clone(),
            ]
        })
        .collect();
    table(
        &["NETWORK", "POD", "ADDRESSES", "EXPIRES-IN", "REASON"],
        rows,
    );
}

fn print_event(e: &pb::Event, out: Output) {
    let kind = pb::event::Kind::try_from(e.kind)
        .map(|k| k.as_str_name().to_string())
        .unwrap_or_else(|_| e.kind.to_string());
    if out == Output::Json {
        println!(
            "{}",
            serde_json::json!({
                "kind": kind, "atMs": e.at_ms, "network": e.network,
                "containerID": e.container_id, "ifname": e.ifname, "namespace": e.namespace,
                "pod": e.pod, "addresses": e.addresses, "reason": e.reason,
            })
        );
        return;
    }
    let pod = if e.pod.is_empty() {
        "-".to_string()
    } else {
        format!("{}/{}", e.namespace, e.pod)
    };
    let container = if e.container_id.is_empty() {
        "-"
    } else {
        &e.container_id
    };
    println!(
        "{}  {kind}  {}  {pod}  {container}  {}  {}",
        e.at_ms,
        if e.network.is_empty() {
            "-"
        } else {
            &e.network
        },
        e.addresses.join(","),
        e.reason
    );
}
