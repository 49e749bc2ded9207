//! ipoold: the per-node ipool daemon.
//!
//! # Layout
//! - `cluster`: ipoold's cluster-mode wiring;
//! - `host`: the node side of ipoold;
//! - `kube`: ipoold's Kubernetes wiring.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use clap::Parser;
use ipool_server::logbuf::{self, DeferredLog};
use ipool_server::{
    clock::SystemClock,
    config::DaemonConfig,
    ipam::{Ipam, Setup},
    k8s,
    server::{bind_socket, serve, shutdown_signal, Listeners, OpsTcp},
    store::SledStore,
};

mod cluster;
mod host;
mod kube;

use host::{install_cni, keep_private, raise_fd_limit, spawn_heap_trimmer, trim_heap, Conflist};
use kube::{follow_node_ranges, kube_client, node_name, refused_as_damaged, set_aside};

#[derive(Parser, Debug)]
#[command(
    version,
    about = "ipool daemon: hands out this node's pod addresses over gRPC"
)]
struct Args {
    /// Unix socket the CNI plugin and ipoolctl talk to.
    #[arg(long, env = "IPOOL_SOCKET", default_value = "/run/ipool/ipool.sock")]
    socket: PathBuf,
    /// Group (numeric gid) that may use the socket besides root: the socket becomes 0660 and
    /// owned by it, and its members may call the Ops API's mutating calls (reserve, release,
    /// drain); the CNI service stays root's.
    #[arg(long, env = "IPOOL_SOCKET_GROUP")]
    socket_group: Option<u32>,
    /// Directory of the state database (sled).
    #[arg(long, env = "IPOOL_STATE_DIR", default_value = "/var/lib/ipool")]
    state_dir: PathBuf,
    /// TOML file with pool tuning and networks; without it, the embedded default.
    #[arg(long, env = "IPOOL_CONFIG")]
    config: Option<PathBuf>,
    /// Where the machine's boot ID is read. A boot ID other than the one in the store means the
    /// machine rebooted: every attachment of the old boot is released at start.
    #[arg(
        long,
        env = "IPOOL_BOOT_ID_FILE",
        default_value = "/proc/sys/kernel/random/boot_id"
    )]
    boot_id_file: PathBuf,
    /// Also serve the Ops API (and health, reflection) on this TCP address, e.g.
    /// 127.0.0.1:9654. Read-only calls are open on loopback; mutating calls need
    /// --ops-token-file or mTLS. A non-loopback address needs one of them.
    #[arg(long, env = "IPOOL_OPS_LISTEN")]
    ops_listen: Option<std::net::SocketAddr>,
    /// File holding the bearer token for the TCP Ops API ("authorization: Bearer <token>").
    #[arg(long, env = "IPOOL_OPS_TOKEN_FILE")]
    ops_token_file: Option<PathBuf>,
    /// TLS certificate and key (PEM) for the TCP Ops API.
    #[arg(long, env = "IPOOL_TLS_CERT", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    #[arg(long, env = "IPOOL_TLS_KEY", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// CA (PEM) that client certificates must chain to: mutual TLS, every call authenticated.
    #[arg(long, env = "IPOOL_TLS_CLIENT_CA", requires = "tls_cert")]
    tls_client_ca: Option<PathBuf>,
    /// Serve Prometheus metrics at http://ADDR/metrics, e.g. 127.0.0.1:9655 (an IPv6 address
    /// may come bracketed or not: $(NODE_IP):9655 works on either family).
    #[arg(long, env = "IPOOL_METRICS_LISTEN", value_parser = host::parse_listen)]
    metrics_listen: Option<std::net::SocketAddr>,
    /// Kubernetes config file, for a daemon outside a pod (in a pod: the service account's
    /// in-cluster config; else KUBECONFIG or ~/.kube/config). Used only when a network takes
    /// its ranges from the node (`ranges_from = "node"`) or the config has `[kubernetes]`.
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// This node's name (the DaemonSet passes spec.nodeName from the downward API).
    #[arg(long, env = "NODE_NAME")]
    node_name: Option<String>,
    /// Rebuild a lost or refused store from the live pods: a state dir that cannot be opened
    /// is moved aside (to `<state-dir>.refused-<unix time>`), and before serving, every
    /// address the node's pods report is quarantined for its pod until that pod is gone.
    /// Needs `[kubernetes]` in the config and the apiserver.
    #[arg(long)]
    rebuild_from_pods: bool,
    /// Once the socket is up, write the CNI conflist made from --cni-conflist-template into
    /// this directory (the host's /etc/cni/net.d), atomically; it stays across restarts.
    #[arg(long, env = "IPOOL_CNI_CONF_DIR", requires = "cni_conflist_template")]
    cni_conf_dir: Option<PathBuf>,
    /// The conflist to write (JSON; its ipool IPAM's socket must be --socket).
    #[arg(long, env = "IPOOL_CNI_CONFLIST_TEMPLATE", requires = "cni_conf_dir")]
    cni_conflist_template: Option<PathBuf>,
    /// The conflist's file name: runtimes use the first in lexical order.
    #[arg(long, env = "IPOOL_CNI_CONF_NAME", default_value = "10-ipool.conflist")]
    cni_conf_name: String,
    /// Where the node's CNI plugins are: the conflist is written only once every plugin it
    /// names is there, at the highest CNI version all of them support.
    #[arg(
        long = "cni-plugin-dir",
        env = "IPOOL_CNI_PLUGIN_DIR",
        default_value = "/opt/cni/bin"
    )]
    cni_plugin_dir: PathBuf,
    /// Print the embedded default config and exit.
    #[arg(long)]
    print_default_config: bool,
    /// Check --config (or the embedded default) and exit: 0 when ipoold would start on it.
    #[arg(long)]
    check_config: bool,
    /// Log format; the level comes from RUST_LOG (default: info).
    #[arg(long, env = "IPOOL_LOG_FORMAT", value_enum, default_value = "text")]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Option<Sub>,
}

#[derive(clap::Subcommand, Debug)]
enum Sub {
    /// Install the CNI plugin on the host (the DaemonSet's init container): copy it into the
    /// CNI bin dir atomically (safe while the old one runs; skipped when identical), and exit.
    InstallCni {
        /// The host's CNI bin dir, as mounted.
        #[arg(long, env = "CNI_BIN_DIR", default_value = "/host/opt/cni/bin")]
        cni_bin_dir: PathBuf,
        /// The plugin to install (default: `ipool` beside this ipoold).
        #[arg(long)]
        plugin: Option<PathBuf>,
    },
}

#[derive(clap::ValueEnum, Clone, Copy, Debug)]
enum LogFormat {
    Text,
    Json,
}

fn main() -> ExitCode {
    let args = Args::parse();
    if args.print_default_config {
        print!("{}", ipool_server::config::EMBEDDED_DEFAULT);
        return ExitCode::SUCCESS;
    }
    if args.check_config {
        return match load_config(args.config.as_deref()) {
            Ok(c) => {
                println!(
                    "config ok: {} network(s), Kubernetes {}",
                    c.networks.len(),
                    if c.kubernetes.is_some() { "on" } else { "off" }
                );
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("ipoold: {e:#}");
                ExitCode::FAILURE
            }
        };
    }
    if let Some(Sub::InstallCni {
        cni_bin_dir,
        plugin,
    }) = &args.command
    {
        return match install_cni(cni_bin_dir, plugin.as_deref()) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("ipoold install-cni: {e:#}");
                ExitCode::FAILURE
            }
        };
    }
    let log = DeferredLog::new(std::io::stderr());
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        // kube's client logs every failed request (and retries some); ipoold logs each change
        // between reachable and unreachable once, with the error.
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,kube_client=off"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        // Colours only on a terminal: not in files, journald or `kubectl logs`.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        // Lines made on the runtime's thread are written when it goes idle (logbuf.rs).
        .with_writer(log.clone());
    match args.log_format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
    // One thread: a request is a few tens of microseconds of work, and on a node's few cores
    // the wake-ups between worker threads cost more than they spread (docs/performance.md).
    // Store flushes block it briefly (store/commit.rs); sled's checkpoints and the heap trims
    // run on threads of their own.
    let park_log = log.clone();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .on_thread_park(move || park_log.flush())
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("ipoold: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let panic_log = log.clone();
    let previous_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        panic_log.flush();
        previous_hook(info)
    }));
    // A current-thread runtime runs on the thread that calls block_on: this one.
    logbuf::defer_on_this_thread(true);
    let result = runtime.block_on(daemon(args));
    logbuf::defer_on_this_thread(false);
    log.flush();
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            eprintln!("ipoold: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// The TCP Ops listener, checked before anything else starts.
async fn ops_tcp(args: &Args) -> anyhow::Result<Option<OpsTcp>> {
    let Some(addr) = args.ops_listen else {
        return Ok(None);
    };
    let token = match &args.ops_token_file {
        Some(p) => {
            let t = std::fs::read_to_string(p)
                .with_context(|| format!("reading --ops-token-file {}", p.display()))?;
            let t = t.trim().to_string();
            anyhow::ensure!(
                t.len() >= 16,
                "the token in {} is shorter than 16 characters; use a long random one (e.g. `head -c 32 /dev/urandom | base64`)",
                p.display()
            );
            Some(std::sync::Arc::<str>::from(t))
        }
        None => None,
    };
    let mtls = args.tls_client_ca.is_some();
    anyhow::ensure!(
        addr.ip().is_loopback() || token.is_some() || mtls,
        "--ops-listen {addr} is not a loopback address: refusing to serve it without authentication (give --ops-token-file, or --tls-cert/--tls-key/--tls-client-ca for mTLS)"
    );
    anyhow::ensure!(
        addr.ip().is_loopback() || token.is_none() || args.tls_cert.is_some(),
        "--ops-listen {addr} is not a loopback address: refusing to take a bearer token there without TLS, where it would cross the network in plaintext (give --tls-cert/--tls-key)"
    );
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(c), Some(k)) => {
            let read = |p: &PathBuf, what: &str| {
                std::fs::read(p).with_context(|| format!("reading {what} {}", p.display()))
            };
            let mut tls = tonic::transport::ServerTlsConfig::new().identity(
                tonic::transport::Identity::from_pem(read(c, "--tls-cert")?, read(k, "--tls-key")?),
            );
            if let Some(ca) = &args.tls_client_ca {
                tls = tls.client_ca_root(tonic::transport::Certificate::from_pem(read(
                    ca,
                    "--tls-client-ca",
                )?));
            }
            Some(tls)
        }
        _ => None,
    };
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .and_then(|l| l.into_std())
        .with_context(|| format!("binding --ops-listen {addr}"))?;
    tracing::info!(%addr, token = token.is_some(), tls = tls.is_some(), mtls, "serving the Ops API over TCP");
    Ok(Some(OpsTcp {
        listener,
        token,
        tls,
        mtls,
    }))
}

async fn daemon(args: Args) -> anyhow::Result<()> {
    raise_fd_limit();
    keep_private(&args.state_dir)?;
    let config = load_config(args.config.as_deref())?;
    let boot_id = match std::fs::read_to_string(&args.boot_id_file) {
        Ok(id) if !id.trim().is_empty() => Some(id.trim().to_string()),
        Ok(_) => None,
        Err(e) => {
            tracing::warn!(path = %args.boot_id_file.display(), error = %e, "cannot read the boot ID; reboots will not be detected");
            None
        }
    };
    let node_ranges = config.node_ranges();
    let kubernetes = config.kubernetes.clone();
    anyhow::ensure!(
        !args.rebuild_from_pods || kubernetes.is_some(),
        "--rebuild-from-pods needs the pods: add a [kubernetes] table to the config"
    );
    let metrics = Arc::new(ipool_server::metrics::Metrics::default());
    let (cluster, sources) = cluster::setup(&args, &config, &metrics)?;
    let setup = |config: DaemonConfig| Setup {
        config,
        clock: Arc::new(SystemClock::new()),
        boot_id: boot_id.clone(),
        metrics: metrics.clone(),
        sources: sources.clone(),
    };
    let ipam = match open_ipam(&args, setup(config.clone())) {
        Ok(ipam) => ipam,
        // Only a store refused as damaged: one that is locked (another ipoold), newer, or
        // unreadable for now is not thrown away.
        Err(e) if args.rebuild_from_pods && refused_as_damaged(&e) => {
            let aside = set_aside(&args.state_dir)?;
            tracing::warn!(error = %format!("{e:#}"), moved_to = %aside.display(), "--rebuild-from-pods: the store cannot be opened; it is kept aside and a new one is built from the live pods");
            keep_private(&args.state_dir)?;
            open_ipam(&args, setup(config.clone()))?
        }
        Err(e) => return Err(e),
    };
    ipam.maintain().await.context("preloading pools")?;
    let mut client = None;
    // Every request to the apiserver answered within this, lists included.
    let read_timeout = std::time::Duration::from_secs(
        kubernetes
            .as_ref()
            .map_or(ipool_server::config::DEFAULT_READ_TIMEOUT_SECS, |k| {
                k.read_timeout_secs
            }),
    );
    follow_node_ranges(&args, &node_ranges, &ipam, read_timeout, &mut client).await?;
    if let Some(c) = &cluster {
        cluster::start(c, &ipam);
    }
    // One for the node: the service's ADDs and DELs and the keeper take turns on it.
    let mut holds = cluster
        .as_ref()
        .map(|c| ipool_server::cluster::pin::hold::Holds::new(c.node().clone()));
    let pods = match kubernetes {
        Some(settings) => {
            let node = node_name(&args, "[kubernetes] watches the pods of this node")?;
            let c = kube_client(&args, read_timeout, &mut client).await?;
            let pods = k8s::Pods::start(c.clone(), &node, settings, ipam.metrics_handle());
            if let Some(cl) = &cluster {
                // Pools chosen by namespace, and the Node's labels for the pools'
                // nodeSelectors.
                pods.watch_namespaces();
                let n = cl.node().clone();
                tokio::spawn(k8s::selection::follow_labels(
                    c.clone(),
                    node.clone(),
                    read_timeout,
                    move |labels| n.set_labels(labels),
                ));
            }
            // ADDs wait (CNI 11, STATUS 50) until the pods are listed and their addresses
            // quarantined against the ranges they are served from: a lost or rebuilt store
            // hands out no running pod's address.
            let gate = pods.clone();
            ipam.set_add_gate(std::sync::Arc::new(move |ranges_version| {
                gate.ready(ranges_version).err().map(|e| e.to_string())
            }));
            tokio::spawn(k8s::gc::run(ipam.clone(), pods.clone()));
            if let Some(cl) = &cluster {
                // Pins: holds no pod uses let go, pins of gone owners ended.
                // A VM's two launchers share its pin during a migration KubeVirt shows.
                let kubevirt = std::sync::Arc::new(k8s::fixed::KubeVirt::new(c.clone()));
                holds = holds.map(|h| h.with_migrations(kubevirt));
                let keeper = holds.clone().expect("cluster mode's holds");
                tokio::spawn(k8s::pin_keeper::run(ipam.clone(), keeper, c.clone()));
                cluster::release_departed(cl, Some(&c));
            }
            Some(pods)
        }
        // Quarantines stay: their pods cannot be watched, so only an operator ends them
        // (ipoolctl unreserve); a config change never does.
        None => {
            // The node's labels for the pools' nodeSelectors: the config's (none: no labels).
            if let Some(cl) = &cluster {
                let labels = config.cluster.as_ref().map(|c| c.node_labels.clone());
                cl.node().set_labels(labels.unwrap_or_default());
                cluster::release_departed(cl, None);
            }
            let kept = ipam.quarantines();
            if !kept.is_empty() {
                tracing::warn!(quarantines = kept.len(), "quarantines kept without [kubernetes]: their pods cannot be watched; `ipoolctl unreserve` ends one once its pod is gone");
            }
            None
        }
    };
    // Recovery decoded every stored record; hand the memory it freed back before serving.
    trim_heap();
    spawn_heap_trimmer();
    let ops_tcp = ops_tcp(&args).await?;
    let metrics = match args.metrics_listen {
        Some(addr) => {
            let l = tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("binding --metrics-listen {addr}"))?;
            tracing::info!(%addr, "serving metrics at /metrics");
            Some(l)
        }
        None => None,
    };
    // Before the socket answers: a SIGTERM from then on is a clean stop.
    let shutdown = shutdown_signal();
    let listener = bind_socket(&args.socket, args.socket_group)
        .with_context(|| format!("binding socket {}", args.socket.display()))?;
    let own_uid = {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(&args.socket).ok().map(|m| m.uid())
    };
    tracing::info!(socket = %args.socket.display(), "serving");
    // The runtime learns of the network only now that the IPAM answers: a node must not turn
    // Ready with an IPAM that does not.
    if let (Some(dir), Some(template)) = (&args.cni_conf_dir, &args.cni_conflist_template) {
        Conflist {
            dir: dir.clone(),
            template: template.clone(),
            name: args.cni_conf_name.clone(),
            socket: args.socket.clone(),
            bin_dir: args.cni_plugin_dir.clone(),
        }
        .write_or_retry(&ipam)?;
    }
    let listeners = Listeners {
        socket: listener,
        own_uid,
        group: args.socket_group,
        ops_tcp,
        metrics,
        pods,
        cluster: cluster.is_some(),
        holds,
    };
    let served = serve(listeners, ipam, shutdown).await;
    let _ = std::fs::remove_file(&args.socket);
    if let Some(c) = &cluster {
        c.stop().await;
    }
    served.context("gRPC server")?;
    tracing::info!("stopped");
    Ok(())
}

/// The config: the file, or the embedded default.
fn load_config(path: Option<&std::path::Path>) -> anyhow::Result<DaemonConfig> {
    Ok(match path {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading config {}", path.display()))?;
            DaemonConfig::parse(&text).with_context(|| format!("config {}", path.display()))?
        }
        None => DaemonConfig::embedded(),
    })
}

/// Opens the store and rebuilds the engine's state from it.
fn open_ipam(args: &Args, setup: Setup) -> anyhow::Result<Ipam> {
    // Read through one handle, serve through a fresh one (see Ipam::open_with).
    let state_dir = args.state_dir.clone();
    let options = setup.config.store.options();
    let serve_options = options.clone();
    let shown_boot_id = setup.boot_id.clone().unwrap_or_else(|| "unknown".into());
    Ipam::open_with(
        || {
            let store = SledStore::open_with(&args.state_dir, options)?;
            tracing::info!(path = %store.path().display(), boot_id = %shown_boot_id, "store open");
            Ok(Arc::new(store))
        },
        move || Ok(Arc::new(SledStore::open_with(&state_dir, serve_options)?)),
        setup,
    )
    .context("recovering state")
}
