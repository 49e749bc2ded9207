//! What cluster mode's nodes cost their store at steady state, counted at the store:
//! real ipoold daemons against the fake apiserver over real HTTP (`ipool_testkit::fake_api`,
//! its request lines and the bytes it sent) and against a real etcd (its own `/metrics`:
//! gRPC messages by method, bytes sent), idle and with 10 pod ADD/DEL a minute, single- and
//! dual-stack, each per node per minute; and how soon a node stops handing out a block another
//! node took (the store's watch), p50 and p99.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use ipool_testkit::fake_api::FakeApi;
use ipool_testkit::load::Load;

use super::etcd::Etcd;
use crate::daemon::Daemon;
use crate::plugin::{Net, Op};
use crate::setup::Bins;

/// One store of the benchmark's own.
enum Store {
    Etcd(Etcd),
    Kube {
        api: FakeApi,
        kubeconfig: PathBuf,
        _dir: tempfile::TempDir,
    },
}

impl Store {
    fn start(etcd_bin: &Path, kube: bool) -> Result<Store> {
        Ok(match kube {
            false => Store::Etcd(Etcd::start(etcd_bin)?),
            true => {
                let api = FakeApi::start();
                let dir = tempfile::tempdir().context("temp dir")?;
                let kubeconfig = api.kubeconfig(dir.path());
                Store::Kube {
                    api,
                    kubeconfig,
                    _dir: dir,
                }
            }
        })
    }

    fn name(&self) -> &'static str {
        match self {
            Store::Etcd(_) => "etcd",
            Store::Kube { .. } => "Kubernetes API",
        }
    }

    /// `ipoolctl cluster ARGS...`, which must succeed.
    fn ctl(&self, bins: &Bins, args: &[&str]) -> Result<String> {
        let mut c = std::process::Command::new(&bins.ipoolctl);
        c.arg("cluster");
        match self {
            Store::Etcd(e) => c.args(["--etcd-endpoints", &e.client_url]),
            Store::Kube { kubeconfig, .. } => c
                .args(["--datastore", "kubernetes", "--kubeconfig"])
                .arg(kubeconfig),
        };
        let o = c.args(args).output().context("running ipoolctl")?;
        if !o.status.success() {
            bail!(
                "ipoolctl cluster {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&o.stderr)
            );
        }
        Ok(String::from_utf8_lossy(&o.stdout).into_owned())
    }

    /// An ipoold config for `node`, network "pods" on pool `pool`; `extra` in `[cluster]`.
    fn config(&self, node: &str, pool: &str, extra: &str) -> String {
        let store = match self {
            Store::Etcd(e) => format!("etcd_endpoints = [\"{}\"]", e.client_url),
            Store::Kube { kubeconfig, .. } => format!(
                "datastore = \"kubernetes\"\nkubeconfig = \"{}\"",
                kubeconfig.display()
            ),
        };
        format!(
            "[cluster]\n{store}\nnode_name = \"{node}\"\n{extra}\n\n[[network]]\nname = \"pods\"\nranges_from = \"cluster\"\ncluster_pool = \"{pool}\"\n"
        )
    }

    /// What the daemons cost it so far.
    fn load(&self) -> Result<Load> {
        match self {
            Store::Kube { api, .. } => Ok(api.load()),
            Store::Etcd(e) => {
                let body = metrics(e.client_url.trim_start_matches("http://"))?;
                Ok(Load::of_etcd_metrics(&body))
            }
        }
    }

    /// Each block of `pool` and its owner.
    fn owners(&self, bins: &Bins) -> Result<Vec<(String, String)>> {
        let out = self.ctl(bins, &["-o", "json", "blocks"])?;
        let v: serde_json::Value = serde_json::from_str(&out).context("blocks -o json")?;
        Ok(v.as_array()
            .map(|a| {
                a.iter()
                    .map(|b| {
                        (
                            b["block"].as_str().unwrap_or_default().to_string(),
                            b["node"].as_str().unwrap_or_default().to_string(),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default())
    }

    /// Block `block` of `pool`, `from`'s, made `to`'s in one write (what a forced release-node
    /// and another node's claim do in two).
    fn reown(
        &self,
        rt: &tokio::runtime::Runtime,
        pool: &str,
        block: &str,
        from: &str,
        to: &str,
    ) -> Result<()> {
        match self {
            Store::Kube { api, .. } => {
                let name = block.replace(['.', '/', ':'], "-");
                let mut obj = api
                    .get("ipblocks", "", &name)
                    .with_context(|| format!("no IPBlock {name}"))?;
                obj["spec"]["node"] = serde_json::json!(to);
                obj["metadata"]["labels"]["ipool.io/node"] = serde_json::json!(to);
                api.put_custom("ipblocks", obj);
                Ok(())
            }
            Store::Etcd(e) => {
                use ipool_server::cluster::etcd::request::{op, txn};
                use ipool_server::cluster::etcd::{block_key_part, EtcdStore, DEFAULT_PREFIX};
                let net: ipnet::IpNet = block.parse().context("a block")?;
                let part = block_key_part(&net);
                let owner = format!(r#"{{"node":"{to}","claimed_at_ms":1}}"#);
                let ops = [
                    op::put(format!("{DEFAULT_PREFIX}/blocks/{pool}/{part}"), owner, 0),
                    op::delete(format!(
                        "{DEFAULT_PREFIX}/nodes/{from}/blocks/{pool}/{part}"
                    )),
                    op::put(
                        format!("{DEFAULT_PREFIX}/nodes/{to}/blocks/{pool}/{part}"),
                        "w1",
                        0,
                    ),
                ];
                let url = e.client_url.clone();
                rt.block_on(async move {
                    let s =
                        EtcdStore::connect(&[url], DEFAULT_PREFIX, Duration::from_secs(5), None)
                            .await?;
                    s.client().txn(txn([], ops, [])).await?;
                    Ok::<_, anyhow::Error>(())
                })
            }
        }
    }
}

/// GET /metrics over plain HTTP/1.1.
fn metrics(addr: &str) -> Result<String> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).context("etcd's metrics")?;
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut raw = String::new();
    s.read_to_string(&mut raw)?;
    Ok(raw
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default())
}

/// One steady-state row: per node per minute.
#[derive(Clone, Debug)]
pub struct LoadRow {
    pub store: &'static str,
    pub dual: bool,
    pub churn: bool,
    /// The pods churned are a StatefulSet's with fixed addresses, moved from node to node.
    pub pins: bool,
    pub nodes: usize,
    pub window: Duration,
    pub used: Load,
}

impl LoadRow {
    /// `count` of the window, per node per minute.
    pub fn per_node_minute(&self, count: u64) -> f64 {
        count as f64 / self.nodes as f64 * 60.0 / self.window.as_secs_f64()
    }
}

/// A block taken by another node: how long until its old owner said it stops handing it out.
pub struct Noticed {
    pub store: &'static str,
    pub samples: Vec<Duration>,
}

pub struct LoadReport {
    pub rows: Vec<LoadRow>,
    pub noticed: Vec<Noticed>,
    /// The daemons' `heartbeat_ttl_secs` (a renewal every third of it).
    pub heartbeat_ttl: u64,
}

/// A configuration measured: its store, its nodes and their networks.
struct Setup {
    store: Store,
    dual: bool,
    churn: bool,
    /// The pods' apiserver of a setup whose churn moves fixed-address pods (`load_pins`).
    pods: Option<FakeApi>,
    daemons: Vec<Daemon>,
    nets: Vec<Net>,
    _dir: tempfile::TempDir,
}

/// What a configuration's pods are: `dual`-stack or not, churned or idle, and (`pins`)
/// churned as fixed-address pods moving from node to node.
#[derive(Clone, Copy)]
struct Pods {
    dual: bool,
    churn: bool,
    pins: bool,
}

fn setup(
    bins: &Bins,
    etcd_bin: &Path,
    kube: bool,
    pods: Pods,
    nodes: usize,
    extra: &str,
) -> Result<Setup> {
    let Pods { dual, churn, pins } = pods;
    let store = Store::start(etcd_bin, kube)?;
    let mut pool = vec![
        "pool",
        "create",
        "p",
        "--cidr",
        "10.56.0.0/16",
        "--block-size",
        "26",
    ];
    if dual {
        pool.extend(["--cidr", "fd00:56::/104", "--block-size-v6", "120"]);
    }
    store.ctl(bins, &pool)?;
    let dir = tempfile::tempdir().context("temp dir")?;
    let api = pins.then(|| super::load_pins::pods_api(nodes));
    let mut daemons = Vec::new();
    let mut nets = Vec::new();
    for i in 0..nodes {
        let path = dir.path().join(format!("n{i}.toml"));
        let config = store.config(&format!("n{i}"), "p", extra);
        let (config, args) = match &api {
            Some(api) => (
                super::load_pins::config(config),
                super::load_pins::args(api, dir.path(), i)?,
            ),
            None => (config, Vec::new()),
        };
        std::fs::write(&path, config)?;
        let d = Daemon::start_with(&bins.ipoold, Some(&path), &args)?;
        nets.push(Net::ipool_configured(&bins.ipool, &d.socket, "pods"));
        daemons.push(d);
    }
    Ok(Setup {
        store,
        dual,
        churn,
        pods: api,
        daemons,
        nets,
        _dir: dir,
    })
}

/// Served: each node's first ADD.
fn first_adds(s: &Setup) -> Result<()> {
    for (i, n) in s.nets.iter().enumerate() {
        let deadline = Instant::now() + Duration::from_secs(30);
        while let Err(e) = n.call(Op::Add, &format!("first{i}")) {
            if Instant::now() > deadline {
                bail!(
                    "{}: node {i} served no ADD within 30 s: {e:#}",
                    s.store.name()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    Ok(())
}

/// The steady-state rows (all configurations measured at once, each on its own store) and the
/// forced-away latencies.
pub fn run(
    rt: &tokio::runtime::Runtime,
    bins: &Bins,
    etcd_bin: &Path,
    quick: bool,
) -> Result<LoadReport> {
    // Quick: short renewals, so that a few seconds see some.
    let (nodes, window, ttl) = match quick {
        true => (1, Duration::from_secs(4), 6),
        false => (4, Duration::from_secs(60), 30),
    };
    let extra = &format!("heartbeat_ttl_secs = {ttl}");
    let mut setups = Vec::new();
    for kube in [false, true] {
        for (dual, churn, pins) in [
            (false, false, false),
            (false, true, false),
            (true, false, false),
            (true, true, false),
            (false, true, true),
        ] {
            let pods = Pods { dual, churn, pins };
            setups.push(setup(bins, etcd_bin, kube, pods, nodes, extra)?);
        }
    }
    for s in &setups {
        first_adds(s)?;
    }
    // The first syncs and claims done, the watches made: the steady state from here.
    std::thread::sleep(Duration::from_secs(3));
    let before: Vec<Load> = setups
        .iter()
        .map(|s| s.store.load())
        .collect::<Result<_>>()?;
    let start = Instant::now();
    // 10 ADD/DEL a minute per node: one pair every 6 s.
    let mut k = 0;
    while start.elapsed() < window {
        if start.elapsed() >= Duration::from_secs(6) * k {
            for s in setups.iter().filter(|s| s.churn) {
                if let Some(api) = &s.pods {
                    super::load_pins::move_pods(api, &s.nets, k as usize)?;
                    continue;
                }
                for (i, n) in s.nets.iter().enumerate() {
                    let id = format!("churn{i}-{k}");
                    n.call(Op::Add, &id)?;
                    n.call(Op::Del, &id)?;
                }
            }
            k += 1;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let window = start.elapsed();
    let mut rows = Vec::new();
    for (s, b) in setups.iter().zip(before) {
        rows.push(LoadRow {
            store: s.store.name(),
            dual: s.dual,
            churn: s.churn,
            pins: s.pods.is_some(),
            nodes: s.daemons.len(),
            window,
            used: s.store.load()? - b,
        });
    }
    drop(setups);
    let runs = if quick { 5 } else { 50 };
    let noticed = vec![
        noticed(rt, bins, etcd_bin, false, runs)?,
        noticed(rt, bins, etcd_bin, true, runs)?,
    ];
    Ok(LoadReport {
        rows,
        noticed,
        heartbeat_ttl: ttl,
    })
}

/// `runs` of: one of n1's blocks made another node's; the time until n1 says it hands out
/// nothing more from it.
fn noticed(
    rt: &tokio::runtime::Runtime,
    bins: &Bins,
    etcd_bin: &Path,
    kube: bool,
    runs: usize,
) -> Result<Noticed> {
    let store = Store::start(etcd_bin, kube)?;
    store.ctl(
        bins,
        &[
            "pool",
            "create",
            "far",
            "--cidr",
            "10.60.0.0/16",
            "--block-size",
            "28",
        ],
    )?;
    let dir = tempfile::tempdir().context("temp dir")?;
    let path = dir.path().join("n1.toml");
    // Enough blocks claimed ahead (14 addresses each) to take `runs` of them away.
    let extra = format!("claim_ahead = {}", (runs + 2) * 14);
    std::fs::write(&path, store.config("n1", "far", &extra))?;
    let d = Daemon::start(&bins.ipoold, Some(&path))?;
    let net = Net::ipool_configured(&bins.ipool, &d.socket, "pods");
    let deadline = Instant::now() + Duration::from_secs(60);
    let blocks = loop {
        let _ = net.call(Op::Add, "first");
        let mine: Vec<String> = store
            .owners(bins)?
            .into_iter()
            .filter(|(_, n)| n == "n1")
            .map(|(b, _)| b)
            .collect();
        if mine.len() > runs {
            break mine;
        }
        if Instant::now() > deadline {
            bail!(
                "{}: n1 claimed {} blocks within 60 s, not {}",
                store.name(),
                mine.len(),
                runs + 1
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    // Its watch made by now.
    std::thread::sleep(Duration::from_secs(2));
    let mut samples = Vec::new();
    for block in blocks.iter().rev().take(runs) {
        // n1's next line naming the block is its reaction: the watch's news (no longer its
        // own), or a sync that found it gone first (dropped, lost, claimed back).
        let (_, from) = d.log_since(0);
        let t = Instant::now();
        store.reown(rt, "far", block, "n1", "bench-other")?;
        loop {
            let (new, _) = d.log_since(from);
            if new.lines().any(|l| l.contains(block.as_str())) {
                samples.push(t.elapsed());
                break;
            }
            if t.elapsed() > Duration::from_secs(30) {
                let log = d.full_log();
                let about: Vec<&str> = log.lines().filter(|l| l.contains(block.as_str())).collect();
                bail!(
                    "{}: n1 did not notice within 30 s that {block} was taken; its log of it:\n{}",
                    store.name(),
                    about.join("\n")
                );
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }
    Ok(Noticed {
        store: store.name(),
        samples,
    })
}
