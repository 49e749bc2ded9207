//! ipoolctl: look at and steer a running ipoold, over its Unix socket or TCP (`--addr`).
//!
//! Exit codes: 0 success; 1 ipoold refused the call; 2 ipoold could not be reached; 3 what was
//! asked for does not exist; 4 not allowed (authentication); 64 bad usage. `health`: 0
//! SERVING, 1 NOT_SERVING, 2 unreachable (for probes).
//!
//! Layout: the arguments and `main` here; `connect` (socket or TCP, TLS, token), `run` (one
//! subcommand and its exit code), `print` (tables and JSON).
//!
//! # Layout
//! - `check`: `ipoolctl cluster check`;
//! - `cluster`: `ipoolctl cluster ...`;
//! - `cluster_out`: what `ipoolctl cluster`'s commands share in what they say;
//! - `cluster_store`: which store `ipoolctl cluster` works on, and the connection to it;
//! - `connect`: reaching ipoold;
//! - `nodes`: `ipoolctl cluster nodes`;
//! - `pins`: `ipoolctl cluster pins` and `cluster unpin`;
//! - `pools`: `ipoolctl cluster pool list` (and a pool changed);
//! - `print`: tables and JSON as every command prints them;
//! - `release`: `ipoolctl cluster release-node`;
//! - `reservations`: `ipoolctl cluster reserve` and `cluster reservations`;
//! - `run`: one subcommand run against the daemon's Ops API.

// Standard output for every command: a reader that has gone (`ipoolctl list | head`) ends
// ipoolctl quietly, with status 0, instead of the panic of `println!`. SIGPIPE stays ignored,
// as Rust starts programs, so that a peer closing a socket (etcd refusing a TLS client) is an
// error ipoolctl reports rather than a signal that kills it silently.
macro_rules! out {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        if write!(std::io::stdout(), $($t)*).is_err() {
            std::process::exit(0);
        }
    }};
}
macro_rules! outln {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        if writeln!(std::io::stdout(), $($t)*).is_err() {
            std::process::exit(0);
        }
    }};
}

mod check;
mod cluster;
mod cluster_out;
mod cluster_store;
mod connect;
mod nodes;
mod pins;
mod pools;
mod print;
mod release;
mod reservations;
mod run;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use ipool_proto::v1 as pb;

use run::run;

/// Every option is global, as kubectl's and etcdctl's are: it may come before or after the
/// subcommand (`ipoolctl status -o json`, `ipoolctl cluster pool list --etcd-endpoints ...`).
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
    /// The client certificate's key (PEM), with --tls-cert.
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
    /// Cluster mode: pools and blocks in etcd (talks to etcd, not to ipoold).
    Cluster {
        #[command(flatten)]
        etcd: Box<cluster::StoreArgs>,
        #[command(subcommand)]
        command: cluster::ClusterCommand,
    },
    /// ipoold's health, for probes: exit 0 when SERVING, 1 when NOT_SERVING (the store failed,
    /// every network drained), 2 when it cannot be reached.
    Health {
        /// The service asked about ("" = the daemon; or ipool.v1.Cni, ipool.v1.Ops).
        #[arg(long, default_value = "")]
        service: String,
        /// Liveness: exit 0 whenever ipoold answers, NOT_SERVING included (it recovers a
        /// failed store by itself, and a drained node is not a dead one).
        #[arg(long)]
        live: bool,
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

/// `kubectl ipool ...`: ipoolctl installed as kubectl's plugin (`kubectl-ipool` on the PATH),
/// whose commands are `ipoolctl cluster`'s, on the Kubernetes API found as kubectl finds it
/// unless said otherwise (`--datastore`, `--config`).
#[derive(Parser, Debug)]
#[command(
    name = "kubectl-ipool",
    bin_name = "kubectl ipool",
    version,
    about = "ipool's cluster pools, blocks and pins, as kubectl's plugin (ipoolctl cluster)"
)]
struct PluginArgs {
    #[command(flatten)]
    store: cluster::StoreArgs,
    /// Output format.
    #[arg(short, long, value_enum, default_value = "table", global = true)]
    output: Output,
    #[command(subcommand)]
    command: cluster::ClusterCommand,
}

/// Whether this process runs as kubectl's plugin: its name (`argv[0]`) is `kubectl-ipool`.
fn as_kubectl_plugin() -> bool {
    std::env::args_os()
        .next()
        .and_then(|a| {
            Path::new(&a)
                .file_name()
                .map(|n| n.to_string_lossy().starts_with("kubectl-ipool"))
        })
        .unwrap_or(false)
}

fn usage(e: clap::Error) -> ExitCode {
    let code = if e.use_stderr() { EXIT_USAGE } else { 0 };
    let _ = e.print();
    ExitCode::from(code)
}

fn main() -> ExitCode {
    let rt = || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| {
                eprintln!("ipoolctl: cannot start the async runtime: {e}");
                ExitCode::from(EXIT_REFUSED)
            })
    };
    if as_kubectl_plugin() {
        let mut args = match PluginArgs::try_parse() {
            Ok(a) => a,
            Err(e) => return usage(e),
        };
        args.store.kubectl = true;
        return match rt() {
            Ok(rt) => rt.block_on(cluster::run(&args.store, &args.command, args.output)),
            Err(code) => code,
        };
    }
    let args = match Args::try_parse() {
        Ok(a) => a,
        Err(e) => return usage(e),
    };
    match rt() {
        Ok(rt) => rt.block_on(run(args)),
        Err(code) => code,
    }
}

fn read(path: &Path, what: &str) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("cannot read {what} {}: {e}", path.display()))
}
