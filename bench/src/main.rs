//! ipool-bench: the `ipool` plugin and `ipoold` against the real host-local plugin, with the
//! real binaries, on this machine. Prints markdown tables (progress goes to stderr).
//!
//! ```sh
//! cargo build --release --bins && cargo build --release -p ipool-sim && cargo build-plugin && ./target/release/ipool-bench [--quick] [--json out.json]
//! ```
//!
//! Layout: the arguments and the run's order here; `setup` (plan, binaries, names), `phases`
//! (each measurement), `report` (the tables), `daemon`, `plugin` and `grpc` (driving ipoold, the
//! plugins and the gRPC load), `live`, `machine`, `stats`.
//!
//! # Layout
//! - `cluster`: cluster mode against a real etcd (Debian's `etcd-server`, started here);
//! - `daemon`: an `ipoold` of the benchmark's own;
//! - `flood`: ADD latency while operators' reads flood the daemon;
//! - `grpc`: talking to ipoold directly over gRPC;
//! - `kube`: the Kubernetes watch cache's memory;
//! - `live`: the correctness check;
//! - `machine`: what machine the numbers come from;
//! - `phases`: the benchmark's phases against a running ipoold;
//! - `plugin`: exec'ing the real plugins the way a container runtime does;
//! - `report`: the measurements, printed as markdown tables and written as JSON;
//! - `setup`: what a run works with;
//! - `sim`: the deterministic simulation's row (`ipool-sim bench`);
//! - `stats`: percentiles of a set of latency samples (nearest rank on the sorted samples).

// Before the modules, so that every one of them can use it.
macro_rules! progress {
    ($($t:tt)*) => { eprintln!("[ipool-bench] {}", format!($($t)*)) };
}

mod cluster;
mod daemon;
mod flood;
mod grpc;
mod kube;
mod live;
mod machine;
mod phases;
mod plugin;
mod report;
mod setup;
mod sim;
mod stats;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use clap::Parser;

use daemon::Daemon;
use grpc::NetSpec;
use phases::{breakdown, latency_at, restart, throughput_at};
use plugin::{ipool_ipam_json, ipool_subnet, Op};
use report::{LoadRow, Report};
use setup::{Bins, Names, Plan};

#[derive(Parser, Debug)]
#[command(
    about = "Benchmarks the ipool CNI plugin and ipoold against host-local, with the real binaries",
    after_help = "Build first: cargo build --release --bins && cargo build --release -p ipool-sim && cargo build-plugin (ipoold, ipoolctl and ipool-sim are looked for next to this executable; the plugin in target/plugin/, else next to it)."
)]
struct Args {
    /// Sequential samples per latency row [default: 200; 20 with --quick].
    #[arg(long)]
    samples: Option<usize>,
    /// A tiny configuration for CI (fills 0 and 100, concurrency 1 and 8, 1024 allocations for
    /// the restart); finishes in well under a minute.
    #[arg(long)]
    quick: bool,
    /// The host-local plugin to compare with.
    #[arg(long, default_value = "/usr/lib/cni/host-local")]
    host_local: PathBuf,
    /// Also write the raw numbers to this file as JSON.
    #[arg(long)]
    json: Option<PathBuf>,
    /// An ipoold --config file for the daemons the benchmark starts [default: ipoold's
    /// embedded default configuration].
    #[arg(long)]
    ipoold_config: Option<PathBuf>,
    /// Only cluster mode's rows (ADD on a cluster pool's network against a local one, block
    /// claims against a real etcd).
    #[arg(long)]
    cluster_only: bool,
    /// Only the Kubernetes watch cache's row (ipoold's RSS with 0 and 1000 pods cached).
    #[arg(long)]
    kube_only: bool,
    /// The etcd binary for cluster mode's rows (skipped, with a note, when it is missing).
    #[arg(long, default_value = "/usr/bin/etcd")]
    etcd: PathBuf,
    /// Only the deterministic simulation's row (ipool-sim: store requests a minute on one
    /// core, the exhaustive walk's depth).
    #[arg(long)]
    sim_only: bool,
    /// Seconds of seeds for the simulation's row [default: 30; 3 with --quick].
    #[arg(long)]
    sim_secs: Option<u64>,
    /// The ipool plugin binary to run [default: target/plugin/ipool, the shipped build made by
    /// `cargo build-plugin`, when it exists; else the ipool next to this executable].
    #[arg(long)]
    plugin: Option<PathBuf>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ipool-bench: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &Args) -> Result<()> {
    let total = Instant::now();
    let sim_secs = args.sim_secs.unwrap_or(if args.quick { 3 } else { 30 });
    let sim_depth = if args.quick { 2 } else { 4 };
    if args.sim_only {
        let s = sim::run(sim_secs, sim_depth)?;
        let mut o = String::new();
        s.markdown(&mut o);
        print!("{o}");
        return Ok(());
    }
    let plan = Plan::of(args);
    ensure!(plan.samples > 0, "--samples must be at least 1");
    let bins = Bins::locate(&args.host_local, args.plugin.as_deref())?;
    let machine = machine::probe(&bins.host_local, &bins.ipool);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    let mut phases: Vec<(String, Duration)> = Vec::new();
    let mut names = Names::default();

    if args.kube_only {
        let kube = kube::run(&rt, &bins.ipoold, KUBE_PODS)?;
        for r in &kube {
            println!(
                "| {} pods in the cache | served {} KiB | ipoold RSS {:.1} MiB |",
                r.pods,
                r.served_bytes / 1024,
                r.rss_kib as f64 / 1024.0
            );
        }
        return Ok(());
    }

    if args.cluster_only {
        let cluster = cluster::run(&rt, &bins, &plan, &args.etcd, &mut names, &mut phases)?;
        let mut o = String::from("# ipool cluster mode\n\n");
        machine.markdown(&mut o, plan.mode, plan.samples);
        cluster.markdown(&mut o);
        print!("{o}");
        if let Some(path) = &args.json {
            let text =
                serde_json::to_string_pretty(&serde_json::json!({ "cluster": cluster.json() }))
                    .context("encoding the JSON")?;
            std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
        }
        return Ok(());
    }

    let t = Instant::now();
    progress!(
        "checking host-local's on-disk format with {}",
        bins.host_local.display()
    );
    let host_local_check = plugin::verify_host_local_format(&bins.host_local)?;
    progress!("starting ipoold ({})", bins.ipoold.display());
    let mut daemon = Daemon::start(&bins.ipoold, args.ipoold_config.as_deref())?;
    phases.push(("checks, ipoold start".into(), t.elapsed()));

    let t = Instant::now();
    progress!("where the time goes ({} samples)", plan.samples);
    let breakdown = alive(&mut daemon, |d| breakdown(&rt, &bins, d, &plan, &mut names))?;
    phases.push(("breakdown (VERSION execs, direct gRPC)".into(), t.elapsed()));

    let mut latency = Vec::new();
    for &fill in &plan.fills {
        let rows = alive(&mut daemon, |d| {
            latency_at(&rt, &bins, d, &plan, fill, &mut names, &mut phases)
        })?;
        latency.extend(rows);
    }
    // ADD rows first, then DEL rows, each by fill.
    latency.sort_by_key(|r| (r.op == Op::Del, r.fill));

    let t = Instant::now();
    let mut throughput = Vec::new();
    for &c in &plan.concurrency {
        progress!("throughput at concurrency {c}");
        let row = alive(&mut daemon, |d| {
            throughput_at(&bins, d, &plan, c, &mut names)
        })?;
        throughput.push(row);
    }
    phases.push(("throughput".into(), t.elapsed()));
    drop(daemon);

    // The daemon-only phases measure the engine and its group commit, not the source's rate
    // policy: unless told otherwise, they run with the token bucket out of the way.
    let uncapped_dir = tempfile::tempdir().context("temp dir")?;
    let store_config = match &args.ipoold_config {
        Some(p) => p.clone(),
        None => {
            let p = uncapped_dir.path().join("uncapped.toml");
            std::fs::write(&p, UNCAPPED_SOURCE).context("writing the uncapped config")?;
            p
        }
    };
    let mut daemon = Daemon::start(&bins.ipoold, Some(&store_config))?;
    let t = Instant::now();
    let mut load = Vec::new();
    for &conns in &plan.load_connections {
        progress!(
            "daemon-only load: {conns} connection(s), {} in flight, {:?}",
            plan.load_in_flight,
            plan.load_duration
        );
        let network = names.next();
        let spec = NetSpec {
            ipam_json: ipool_ipam_json(&daemon.socket, &ipool_subnet(&network)),
            network,
        };
        let cpu_before = daemon.cpu_time()?;
        let commits_before = daemon.commit_counters()?;
        let r = alive(&mut daemon, |d| {
            rt.block_on(grpc::pair_load(
                &d.socket,
                &spec,
                conns,
                plan.load_in_flight,
                plan.load_duration,
            ))
        })?;
        let daemon_cpu = daemon.cpu_time()?.saturating_sub(cpu_before);
        let commits = daemon.commit_counters()?;
        load.push(LoadRow {
            writes_per_flush: (commits.writes - commits_before.writes)
                / (commits.flushes - commits_before.flushes).max(1.0),
            daemon_cpu,
            connections: conns,
            in_flight: plan.load_in_flight,
            pairs: r.pairs,
            elapsed: r.elapsed,
            latencies: r.latencies,
        });
    }
    phases.push(("daemon-only load".into(), t.elapsed()));
    drop(daemon);

    let t = Instant::now();
    progress!(
        "ADD under an Ops read flood ({} readers over TCP)",
        flood::READERS
    );
    let flood = flood::read_flood(&rt, &bins, &store_config, &plan, &mut names)?;
    phases.push(("ADD under a read flood".into(), t.elapsed()));

    let restart = restart(&rt, &bins, &store_config, &plan, &mut phases)?;
    let t = Instant::now();
    progress!("the Kubernetes watch cache: RSS with 0 and {KUBE_PODS} pods");
    let kube = kube::run(&rt, &bins.ipoold, KUBE_PODS)?;
    phases.push(("Kubernetes watch cache".into(), t.elapsed()));
    let cluster = cluster::run(&rt, &bins, &plan, &args.etcd, &mut names, &mut phases)?;
    let t = Instant::now();
    let sim = sim::run(sim_secs, sim_depth)?;
    phases.push(("the simulation".into(), t.elapsed()));
    phases.push(("total".into(), total.elapsed()));

    let report = Report {
        machine,
        mode: plan.mode,
        samples: plan.samples,
        host_local_check,
        breakdown,
        latency,
        throughput,
        load,
        flood,
        restart,
        kube,
        cluster,
        sim,
        phases,
        notes: notes(args),
    };
    print!("{}", report.markdown());
    if let Some(path) = &args.json {
        let text = serde_json::to_string_pretty(&report.json()).context("encoding the JSON")?;
        std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
        progress!("raw numbers written to {}", path.display());
    }
    Ok(())
}

/// Pods on the node for the watch cache's row (a busy node's count).
const KUBE_PODS: usize = 1000;

/// The daemon-only phases' config: the source's token bucket (a rate policy, 1000/s by
/// default, which would cap every number) out of the way.
const UNCAPPED_SOURCE: &str = "[defaults]\nsource_rate = 1000000000.0\nsource_burst = 1000000000\n";

fn notes(args: &Args) -> Vec<String> {
    match &args.ipoold_config {
        Some(p) => vec![format!("ipoold ran with --config {}.", p.display())],
        None => vec![
            "The plugin rows ran ipoold on its embedded default configuration. The daemon-only rows (load, \
             fill, restart, RSS) ran it with `source_rate`/`source_burst` set to 1e9: by default each pool's \
             source sits behind a 1000/s token bucket, and with the 130 s cooldown every Add takes a fresh \
             address through it, so those rows would show the rate policy rather than the engine."
                .to_string(),
        ],
    }
}

/// Runs `f`; if it fails and ipoold has died meanwhile, says so (with its log).
fn alive<T>(daemon: &mut Daemon, f: impl FnOnce(&mut Daemon) -> Result<T>) -> Result<T> {
    let r = f(daemon);
    if let Err(e) = &r {
        if let Err(dead) = daemon.check_alive() {
            return Err(dead.context(format!("{e:#}")));
        }
    }
    r
}
