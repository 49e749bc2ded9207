//! ipoold: the per-node ipool daemon.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use clap::Parser;
use ipool_server::{
    clock::SystemClock,
    config::DaemonConfig,
    ipam::Ipam,
    server::{bind_socket, run, shutdown_signal},
    store::SledStore,
};

#[derive(Parser, Debug)]
#[command(
    version,
    about = "ipool daemon: hands out this node's pod addresses over gRPC"
)]
struct Args {
    /// Unix socket the CNI plugin and ipoolctl talk to.
    #[arg(long, env = "IPOOL_SOCKET", default_value = "/run/ipool/ipool.sock")]
    socket: PathBuf,
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
    /// Print the embedded default config and exit.
    #[arg(long)]
    print_default_config: bool,
    /// Log format; the level comes from RUST_LOG (default: info).
    #[arg(long, env = "IPOOL_LOG_FORMAT", value_enum, default_value = "text")]
    log_format: LogFormat,
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
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match args.log_format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("ipoold: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(daemon(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            eprintln!("ipoold: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn daemon(args: Args) -> anyhow::Result<()> {
    let config = match &args.config {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading config {}", path.display()))?;
            DaemonConfig::parse(&text).with_context(|| format!("config {}", path.display()))?
        }
        None => DaemonConfig::embedded(),
    };
    let boot_id = match std::fs::read_to_string(&args.boot_id_file) {
        Ok(id) if !id.trim().is_empty() => Some(id.trim().to_string()),
        Ok(_) => None,
        Err(e) => {
            tracing::warn!(path = %args.boot_id_file.display(), error = %e, "cannot read the boot ID; reboots will not be detected");
            None
        }
    };
    let store = SledStore::open(&args.state_dir)?;
    tracing::info!(path = %store.path().display(), boot_id = boot_id.as_deref().unwrap_or("unknown"), "store open");
    let ipam = Ipam::open(
        Arc::new(store),
        Arc::new(SystemClock),
        &config,
        boot_id.as_deref(),
    )
    .context("recovering state")?;
    ipam.maintain().context("preloading pools")?;
    let listener = bind_socket(&args.socket)
        .with_context(|| format!("binding socket {}", args.socket.display()))?;
    tracing::info!(socket = %args.socket.display(), "serving");
    let served = run(listener, ipam, shutdown_signal()).await;
    let _ = std::fs::remove_file(&args.socket);
    served.context("gRPC server")?;
    tracing::info!("stopped");
    Ok(())
}
