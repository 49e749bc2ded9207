//! Cluster mode against a real etcd (Debian's `etcd-server`, started here): ADD through the
//! plugin on a cluster pool's network against a local one of the same daemon, then simulated
//! nodes running the daemon's claim code: claim latency, claims per second with 1, 10 and 100
//! claimers, and 1 000 nodes' first blocks, each checked for blocks with two owners.
//!
//! # Layout
//! - `claims`: simulated nodes claiming blocks of one pool, racing;
//! - `etcd`: the benchmark's own etcd (Debian's `etcd-server`);
//! - [`load`]: what cluster mode's nodes cost their store at steady state, counted at the store;
//! - `load_pins`: the store-load row of pods with fixed addresses;
//! - `load_report`: the store-load rows' table and JSON (see `load`);
//! - `report`: cluster mode's tables and JSON;
//! - `scale`: cluster mode at scale.

mod claims;
mod etcd;
pub mod load;
mod load_pins;
mod load_report;
mod report;
mod scale;

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::daemon::Daemon;
use crate::plugin::{Net, Op};
use crate::setup::{Bins, Names, Plan};
pub use claims::ClaimRun;
use claims::Until;

/// The key prefix the benchmark's pools live under.
const PREFIX: &str = "/ipool-bench";
/// The cluster pool the daemon's network uses.
const ADD_POOL: (&str, &str) = ("add", "172.16.0.0/16");
/// The pool of the network addressed as one subnet (`addressing = "subnet"`).
const SUBNET_POOL: (&str, &str) = ("l2", "172.17.0.0/16");

/// Cluster mode's rows, or why there are none.
pub enum Cluster {
    Ran(Box<ClusterReport>),
    Skipped(String),
}

pub struct ClusterReport {
    pub etcd: String,
    pub add: AddRows,
    /// One node claiming blocks back to back.
    pub sequential: ClaimRun,
    /// 1, 10, 100 claimers at once.
    pub rates: Vec<ClaimRun>,
    /// 1 000 nodes starting together, each claiming its first block.
    pub first: ClaimRun,
    /// A pool nearly all owned by other nodes.
    pub scale: scale::ScaleReport,
    /// What nodes at steady state cost either store, and how soon a block taken is noticed.
    pub load: load::LoadReport,
}

/// ADD and DEL through the plugin, a cluster pool's network and a local network of the same
/// daemon interleaved.
pub struct AddRows {
    pub cluster_add: Vec<Duration>,
    pub local_add: Vec<Duration>,
    pub cluster_del: Vec<Duration>,
    pub local_del: Vec<Duration>,
    /// The same on a network of a cluster pool addressed as one subnet, with a gateway and
    /// excluded addresses.
    pub subnet_add: Vec<Duration>,
    pub subnet_del: Vec<Duration>,
    /// Blocks the daemon owned at the end (claimed in the background during the run).
    pub blocks: usize,
}

pub(crate) fn run(
    rt: &tokio::runtime::Runtime,
    bins: &Bins,
    plan: &Plan,
    etcd_bin: &Path,
    names: &mut Names,
    phases: &mut Vec<(String, Duration)>,
) -> Result<Cluster> {
    if !etcd_bin.is_file() {
        return Ok(Cluster::Skipped(format!(
            "no etcd at {} (install etcd-server, or pass --etcd PATH)",
            etcd_bin.display()
        )));
    }
    let etcd = etcd::Etcd::start(etcd_bin)?;
    let url = etcd.client_url.clone();
    let version = etcd_version(etcd_bin);
    let r = rt.block_on(async {
        claims::wait_ready(&url, PREFIX).await?;
        claims::create(&url, PREFIX, &claims::pool(ADD_POOL.0, ADD_POOL.1)?).await?;
        claims::create(&url, PREFIX, &claims::pool(SUBNET_POOL.0, SUBNET_POOL.1)?).await
    });
    r.with_context(|| format!("etcd's log:\n{}", etcd.log()))?;

    let t = Instant::now();
    progress!(
        "cluster mode: ADD on a cluster pool's network vs a local one ({} samples)",
        plan.samples
    );
    let add = add_rows(rt, bins, plan, &url, names)?;
    phases.push(("cluster: ADD, cluster vs local".into(), t.elapsed()));

    let t = Instant::now();
    progress!(
        "cluster mode: {} claims by one node, back to back",
        plan.samples
    );
    let seq = claims::pool("seq", "10.0.0.0/12")?;
    let sequential = rt.block_on(claims::run(
        &url,
        PREFIX,
        &seq,
        1,
        Until::Claims(plan.samples),
    ))?;
    let mut rates = Vec::new();
    for (k, &c) in plan.cluster_claimers.iter().enumerate() {
        progress!(
            "cluster mode: {c} claimer(s) for {:?}",
            plan.cluster_duration
        );
        let spec = claims::pool(&format!("rate-{c}"), &format!("10.{}.0.0/10", 64 * (k + 1)))?;
        rates.push(rt.block_on(claims::run(
            &url,
            PREFIX,
            &spec,
            c,
            Until::Time(plan.cluster_duration),
        ))?);
    }
    phases.push(("cluster: claims".into(), t.elapsed()));

    let t = Instant::now();
    progress!(
        "cluster mode: {} nodes claiming their first block together",
        plan.cluster_first_nodes
    );
    let spec = claims::pool("first", "10.16.0.0/12")?;
    let first = rt.block_on(claims::run(
        &url,
        PREFIX,
        &spec,
        plan.cluster_first_nodes,
        Until::Claims(1),
    ))?;
    phases.push(("cluster: first blocks".into(), t.elapsed()));

    let t = Instant::now();
    progress!(
        "cluster mode at scale: {} blocks owned by other nodes",
        plan.cluster_scale.owned
    );
    let scale = scale::run(rt, bins, &url, plan.cluster_scale, plan.samples)?;
    phases.push(("cluster: scale".into(), t.elapsed()));

    let t = Instant::now();
    progress!("cluster mode: what nodes at steady state cost etcd and the Kubernetes API");
    let load = load::run(rt, bins, etcd_bin, plan.mode == "quick")?;
    phases.push(("cluster: store load".into(), t.elapsed()));

    Ok(Cluster::Ran(Box::new(ClusterReport {
        etcd: version,
        add,
        sequential,
        rates,
        first,
        scale,
        load,
    })))
}

fn add_rows(
    rt: &tokio::runtime::Runtime,
    bins: &Bins,
    plan: &Plan,
    url: &str,
    names: &mut Names,
) -> Result<AddRows> {
    let dir = tempfile::tempdir().context("temp dir")?;
    let config = dir.path().join("cluster.toml");
    let node = "bench-node";
    std::fs::write(
        &config,
        format!(
            "[cluster]\netcd_endpoints = [\"{url}\"]\nprefix = \"{PREFIX}\"\nnode_name = \"{node}\"\n\n\
             [[network]]\nname = \"cluster\"\nranges_from = \"cluster\"\ncluster_pool = \"{}\"\n\n\
             [[network]]\nname = \"l2\"\nranges_from = \"cluster\"\ncluster_pool = \"{}\"\n\
             addressing = \"subnet\"\ngateway = \"172.17.0.1\"\nexclude = [\"172.17.0.2/31\"]\n",
            ADD_POOL.0, SUBNET_POOL.0
        ),
    )
    .context("writing the cluster config")?;
    let daemon = Daemon::start(&bins.ipoold, Some(&config))?;
    let clu = Net::ipool_configured(&bins.ipool, &daemon.socket, "cluster");
    let sub = Net::ipool_configured(&bins.ipool, &daemon.socket, "l2");
    let loc = Net::ipool(&bins.ipool, &daemon.socket, &names.next());
    // Served once the daemon has listed its blocks and claimed its first.
    let deadline = Instant::now() + Duration::from_secs(30);
    for net in [&clu, &sub] {
        while let Err(e) = net.call(Op::Add, "first") {
            if Instant::now() > deadline {
                bail!("a cluster network served no ADD within 30 s: {e:#}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        net.call(Op::Del, "first")?;
    }
    let mut rows = AddRows {
        cluster_add: Vec::new(),
        local_add: Vec::new(),
        cluster_del: Vec::new(),
        local_del: Vec::new(),
        subnet_add: Vec::new(),
        subnet_del: Vec::new(),
        blocks: 0,
    };
    for i in 0..plan.warmup + plan.samples {
        let c = format!("clu-{i}");
        let round = [
            clu.call(Op::Add, &c)?,
            loc.call(Op::Add, &c)?,
            clu.call(Op::Del, &c)?,
            loc.call(Op::Del, &c)?,
            sub.call(Op::Add, &c)?,
            sub.call(Op::Del, &c)?,
        ];
        if i >= plan.warmup {
            rows.cluster_add.push(round[0]);
            rows.local_add.push(round[1]);
            rows.cluster_del.push(round[2]);
            rows.local_del.push(round[3]);
            rows.subnet_add.push(round[4]);
            rows.subnet_del.push(round[5]);
        }
    }
    rows.blocks = rt.block_on(claims::owned(url, PREFIX, ADD_POOL.0, node))?;
    drop(daemon);
    Ok(rows)
}

fn etcd_version(bin: &Path) -> String {
    std::process::Command::new(bin)
        .arg("--version")
        .env("ETCD_UNSUPPORTED_ARCH", "")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| {
            s.lines()
                .next()
                .map(|l| l.replace("Version:", "").trim().to_string())
        })
        .map(|v| format!("etcd {}", v.trim_start_matches("etcd").trim()))
        .unwrap_or_else(|| "etcd (version unknown)".into())
}
