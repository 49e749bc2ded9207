//! ipool-bench: the `ipool` plugin and `ipoold` against the real host-local plugin, with the
//! real binaries, on this machine. Prints markdown tables (progress goes to stderr).
//!
//! ```sh
//! cargo build --release --bins && cargo build-plugin && ./target/release/ipool-bench [--quick] [--json out.json]
//! ```

mod daemon;
mod grpc;
mod live;
mod machine;
mod plugin;
mod report;
mod stats;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use clap::Parser;

use daemon::Daemon;
use grpc::NetSpec;
use live::Live;
use plugin::{ipool_ipam_json, Net, Op, SUBNET};
use report::{Breakdown, LatencyRow, LoadRow, Report, Restart, ThroughputRow};

#[derive(Parser, Debug)]
#[command(
    about = "Benchmarks the ipool CNI plugin and ipoold against host-local, with the real binaries",
    after_help = "Build first: cargo build --release --bins && cargo build-plugin (ipoold is looked for next to this executable; the plugin in target/plugin/, else next to it)."
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
    /// The ipool plugin binary to run [default: target/plugin/ipool, the shipped build made by
    /// `cargo build-plugin`, when it exists; else the ipool next to this executable].
    #[arg(long)]
    plugin: Option<PathBuf>,
}

/// How much of everything to do.
struct Plan {
    mode: &'static str,
    samples: usize,
    warmup: usize,
    fills: Vec<usize>,
    concurrency: Vec<usize>,
    /// Plugin calls per throughput run (split among the threads).
    calls: usize,
    load_connections: Vec<usize>,
    load_in_flight: usize,
    load_duration: Duration,
    restart_allocations: usize,
    prefill_connections: usize,
    prefill_in_flight: usize,
}

impl Plan {
    fn of(args: &Args) -> Plan {
        if args.quick {
            Plan {
                mode: "quick",
                samples: args.samples.unwrap_or(20),
                warmup: 2,
                fills: vec![0, 100],
                concurrency: vec![1, 8],
                calls: 32,
                load_connections: vec![1, 4],
                load_in_flight: 64,
                load_duration: Duration::from_secs(1),
                restart_allocations: 1024,
                prefill_connections: 4,
                prefill_in_flight: 64,
            }
        } else {
            Plan {
                mode: "full",
                samples: args.samples.unwrap_or(200),
                warmup: 5,
                fills: vec![0, 1_000, 10_000],
                concurrency: vec![1, 2, 8, 32],
                calls: 512,
                load_connections: vec![1, 4],
                load_in_flight: 64,
                load_duration: Duration::from_secs(5),
                restart_allocations: 65_536,
                prefill_connections: 4,
                prefill_in_flight: 64,
            }
        }
    }
}

/// The binaries under test.
struct Bins {
    ipoold: PathBuf,
    ipool: PathBuf,
    host_local: PathBuf,
}

impl Bins {
    fn locate(host_local: &Path, plugin: Option<&Path>) -> Result<Bins> {
        let exe = std::env::current_exe().context("cannot find this executable's path")?;
        let dir = exe
            .parent()
            .context("this executable's path has no directory")?;
        let find = |name: &str| -> Result<PathBuf> {
            let p = dir.join(name);
            ensure!(
                p.is_file(),
                "{} is missing (ipool-bench runs the {name} built next to it): build it with `cargo build --release --bins`",
                p.display()
            );
            Ok(p)
        };
        ensure!(
            host_local.is_file(),
            "host-local is missing at {} (install containernetworking-plugins, or pass --host-local PATH)",
            host_local.display()
        );
        // The shipped plugin is the static, size-optimised build of `cargo build-plugin`
        // (profile `plugin`, in target/plugin/), which sits beside target/release/.
        let shipped = dir.parent().map(|t| t.join("plugin").join("ipool"));
        let ipool = match (plugin, shipped) {
            (Some(p), _) => {
                ensure!(p.is_file(), "--plugin {} is not a file", p.display());
                p.to_path_buf()
            }
            (None, Some(s)) if s.is_file() => s,
            (None, _) => find("ipool")?,
        };
        Ok(Bins {
            ipoold: find("ipoold")?,
            ipool,
            host_local: host_local.to_path_buf(),
        })
    }
}

/// Fresh network names: bench1, bench2, ...
#[derive(Default)]
struct Names(usize);

impl Names {
    fn next(&mut self) -> String {
        self.0 += 1;
        format!("bench{}", self.0)
    }
}

macro_rules! progress {
    ($($t:tt)*) => { eprintln!("[ipool-bench] {}", format!($($t)*)) };
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
        let spec = NetSpec {
            network: names.next(),
            ipam_json: ipool_ipam_json(&daemon.socket, SUBNET),
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

    let restart = restart(&rt, &bins, &store_config, &plan, &mut phases)?;
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
        restart,
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

fn breakdown(
    rt: &tokio::runtime::Runtime,
    bins: &Bins,
    daemon: &Daemon,
    plan: &Plan,
    names: &mut Names,
) -> Result<Breakdown> {
    let name = names.next();
    let ip = Net::ipool(&bins.ipool, &daemon.socket, &name);
    let hl = Net::host_local(&bins.host_local, &name)?;
    let (mut version_ipool, mut version_host_local) = (Vec::new(), Vec::new());
    for i in 0..plan.warmup + plan.samples {
        let (a, b) = (ip.version()?, hl.version()?);
        if i >= plan.warmup {
            version_ipool.push(a);
            version_host_local.push(b);
        }
    }
    let spec = NetSpec {
        network: name.clone(),
        ipam_json: ipool_ipam_json(&daemon.socket, SUBNET),
    };
    let live = Live::new(format!("ipool (gRPC) network {name}"));
    let direct = rt.block_on(grpc::sequential(
        &daemon.socket,
        &spec,
        plan.warmup + plan.samples,
        &live,
    ))?;
    let direct = &direct[plan.warmup..];
    let status = rt.block_on(grpc::sequential_status(
        &daemon.socket,
        &spec,
        plan.warmup + plan.samples,
    ))?;
    Ok(Breakdown {
        status: status[plan.warmup..].to_vec(),
        version_ipool,
        version_host_local,
        connect: direct.iter().map(|d| d.0).collect(),
        add: direct.iter().map(|d| d.1).collect(),
        del: direct.iter().map(|d| d.2).collect(),
    })
}

/// ADD and DEL latency of both plugins in fresh networks holding `fill` attachments.
fn latency_at(
    rt: &tokio::runtime::Runtime,
    bins: &Bins,
    daemon: &Daemon,
    plan: &Plan,
    fill: usize,
    names: &mut Names,
    phases: &mut Vec<(String, Duration)>,
) -> Result<[LatencyRow; 2]> {
    let name = names.next();
    let ip = Net::ipool(&bins.ipool, &daemon.socket, &name);
    let hl = Net::host_local(&bins.host_local, &name)?;
    // The control: an empty network of the same daemon, measured in the same loop, each call
    // right after a host-local call at this fill, like `ip`'s. Only the fill differs.
    let ctl = Net::ipool(&bins.ipool, &daemon.socket, &names.next());
    if fill > 0 {
        let t = Instant::now();
        progress!(
            "prefilling {fill} attachments in network {name} (ipool over gRPC, host-local files)"
        );
        let spec = NetSpec {
            network: name.clone(),
            ipam_json: ipool_ipam_json(&daemon.socket, SUBNET),
        };
        rt.block_on(grpc::prefill(
            &daemon.socket,
            &spec,
            fill,
            plan.prefill_connections,
            plan.prefill_in_flight,
            "fill-",
            ip.live.clone(),
        ))?;
        for (c, a) in hl.prefill_host_local(fill, fill - 1, "fill-")? {
            hl.live.added(&c, &[a])?;
        }
        ensure!(
            ip.live.len() == fill && hl.live.len() == fill,
            "prefill made {} ipool and {} host-local attachments, not {fill}",
            ip.live.len(),
            hl.live.len()
        );
        phases.push((format!("prefill {fill}"), t.elapsed()));
    }
    let t = Instant::now();
    progress!(
        "sequential latency at fill {fill} ({} samples)",
        plan.samples
    );
    let row = |op| LatencyRow {
        op,
        fill,
        ipool: Vec::new(),
        host_local: Vec::new(),
        ipool_alone: Vec::new(),
        ipool_control: Vec::new(),
    };
    let (mut add, mut del) = (row(Op::Add), row(Op::Del));
    // A B A B: ipool ADD, host-local ADD, ipool DEL, host-local DEL of the same container;
    // then the control's ADD and DEL, each also right after a host-local call (of a container
    // of its own, not measured), so both ipool networks follow the same neighbour. The first
    // `warmup` rounds are not recorded.
    for i in 0..plan.warmup + plan.samples {
        let c = format!("lat-{i}");
        let k = format!("ctl-{i}");
        let round = [
            ip.call(Op::Add, &c)?,
            hl.call(Op::Add, &c)?,
            ip.call(Op::Del, &c)?,
            hl.call(Op::Del, &c)?,
            ctl.call(Op::Add, &c)?,
            hl.call(Op::Add, &k)?,
            ctl.call(Op::Del, &c)?,
            hl.call(Op::Del, &k)?,
        ];
        if i >= plan.warmup {
            add.ipool.push(round[0]);
            add.host_local.push(round[1]);
            del.ipool.push(round[2]);
            del.host_local.push(round[3]);
            add.ipool_control.push(round[4]);
            del.ipool_control.push(round[6]);
        }
    }
    // The same network, ipool only, back to back: what the fill costs ipool itself, without
    // host-local's call (~90 ms at 10 000, with a core idle) just before each measurement.
    for i in 0..plan.samples {
        let c = format!("alone-{i}");
        add.ipool_alone.push(ip.call(Op::Add, &c)?);
        del.ipool_alone.push(ip.call(Op::Del, &c)?);
    }
    ensure!(
        ip.live.len() == fill && hl.live.len() == fill && ctl.live.len() == 0,
        "after the measurement the networks hold {} (ipool), {} (host-local) and {} (the empty \
         control) attachments, not {fill}, {fill} and 0",
        ip.live.len(),
        hl.live.len(),
        ctl.live.len()
    );
    phases.push((format!("latency at fill {fill}"), t.elapsed()));
    Ok([add, del])
}

/// ADD/s then DEL/s of both plugins with `c` threads, runs interleaved.
fn throughput_at(
    bins: &Bins,
    daemon: &Daemon,
    plan: &Plan,
    c: usize,
    names: &mut Names,
) -> Result<ThroughputRow> {
    let name = names.next();
    let ip = Net::ipool(&bins.ipool, &daemon.socket, &name);
    let hl = Net::host_local(&bins.host_local, &name)?;
    let per = plan.calls.div_ceil(c);
    let id = |t: usize, k: usize| format!("thr-{t}-{k}");
    let ipool_add = plugin::run_parallel(&ip, Op::Add, c, per, id)?;
    let host_local_add = plugin::run_parallel(&hl, Op::Add, c, per, id)?;
    ensure!(
        ip.live.len() == c * per && hl.live.len() == c * per,
        "ADD runs left {} (ipool) and {} (host-local) attachments, not {}",
        ip.live.len(),
        hl.live.len(),
        c * per
    );
    let ipool_del = plugin::run_parallel(&ip, Op::Del, c, per, id)?;
    let host_local_del = plugin::run_parallel(&hl, Op::Del, c, per, id)?;
    Ok(ThroughputRow {
        concurrency: c,
        calls: c * per,
        ipool_add,
        host_local_add,
        ipool_del,
        host_local_del,
    })
}

/// A daemon with `restart_allocations` attachments is SIGKILLed and started again.
fn restart(
    rt: &tokio::runtime::Runtime,
    bins: &Bins,
    config: &Path,
    plan: &Plan,
    phases: &mut Vec<(String, Duration)>,
) -> Result<Restart> {
    let n = plan.restart_allocations;
    let subnet = "10.98.0.0/15";
    let t = Instant::now();
    progress!("restart: filling a fresh ipoold with {n} allocations in {subnet}");
    let mut d = Daemon::start(&bins.ipoold, Some(config))?;
    let spec = NetSpec {
        network: "bench-restart".to_string(),
        ipam_json: ipool_ipam_json(&d.socket, subnet),
    };
    let live = Arc::new(Live::new("ipool network bench-restart"));
    let fill_time = alive(&mut d, |d| {
        rt.block_on(grpc::prefill(
            &d.socket,
            &spec,
            n,
            plan.prefill_connections,
            plan.prefill_in_flight,
            "r-",
            live.clone(),
        ))
    })?;
    let rss_before_kib = d.rss_kib()?;
    phases.push((format!("restart: fill {n}"), t.elapsed()));

    let t = Instant::now();
    progress!("restart: SIGKILL, start again, poll connect+Add");
    d.kill9()?;
    let spawned = Instant::now();
    d.spawn()?;
    let first = alive(&mut d, |d| {
        rt.block_on(grpc::first_add(
            d.socket.clone(),
            &spec,
            "after-restart",
            spawned,
            Duration::from_secs(120),
        ))
    })?;
    let rss_after_kib = d.rss_kib()?;
    live.added("after-restart", std::slice::from_ref(&first.address))?;
    // The allocations survived: an Add of an existing key returns its address.
    let again = rt.block_on(async {
        let mut c = grpc::connect(&d.socket).await?;
        grpc::add(&mut c, &spec, "r-0").await
    })?;
    let before = live.addresses_of("r-0");
    ensure!(
        before.as_deref() == Some(std::slice::from_ref(&again)),
        "restart: r-0 held {before:?} before the restart and {again} after it"
    );
    if live.len() != n + 1 {
        bail!(
            "restart: {} live attachments, expected {}",
            live.len(),
            n + 1
        );
    }
    phases.push(("restart: measure".into(), t.elapsed()));
    Ok(Restart {
        allocations: n,
        subnet: subnet.to_string(),
        fill_time,
        rss_before_kib,
        connected: first.connected,
        first_add: first.added,
        rss_after_kib,
    })
}
