//! Cluster mode at scale: a pool whose blocks are nearly all owned by other nodes (60 000 of a
//! /10's 65 536 /26 blocks, 8 per node), then what a node pays: a joining node's first address
//! (the real ipoold and plugin), a node's resync (its blocks: the index, checked), `ipoolctl
//! cluster blocks --node`, thousands of nodes resyncing once (etcd requests and bytes read, as
//! counted by the client), and claims at 90 % fill. Before the index, a node's sync was a
//! listing of the whole pool: that listing is measured too, for the comparison.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use ipnet::IpNet;
use ipool_server::cluster::datastore::{BlockStore, PoolStore};
use ipool_server::cluster::etcd::EtcdStore;
use ipool_server::cluster::ippool::PoolSpec;

use super::claims;
use super::PREFIX;
use crate::daemon::Daemon;
use crate::plugin::{Net, Op};
use crate::setup::{Bins, Scale};

/// Blocks per simulated node.
pub const PER_NODE: usize = 8;

pub struct ScaleReport {
    pub scale: Scale,
    pub pool: String,
    pub fill: Duration,
    /// Spawn of a joining node's ipoold to its first ADD answered.
    pub join_first_add: Duration,
    /// One node's resync (8 blocks), repeated.
    pub resync: Vec<Duration>,
    pub resync_requests: f64,
    pub resync_bytes: f64,
    /// What a sync was before the index: a listing of the whole pool.
    pub full_listing: Duration,
    pub full_listing_bytes: u64,
    pub full_listing_requests: u64,
    /// `ipoolctl cluster blocks --node` wall time.
    pub ctl_node: Duration,
    /// `resyncing` nodes resyncing once together.
    pub many: Duration,
    pub many_requests: u64,
    pub many_bytes: u64,
    /// Claims at 90 % fill.
    pub fill90: claims::ClaimRun,
}

async fn connect(url: &str) -> Result<EtcdStore> {
    EtcdStore::connect(&[url.to_string()], PREFIX, Duration::from_secs(30), None)
        .await
        .with_context(|| format!("connecting to etcd at {url}"))
}

fn node(i: usize) -> String {
    format!("scale-node-{i:05}")
}

/// Claims `count` blocks of `spec`, `PER_NODE` per node, with `parallel` connections.
async fn fill(url: &str, spec: &PoolSpec, count: usize, parallel: usize) -> Result<()> {
    let admin = connect(url).await?;
    let revision = admin
        .get_pool(&spec.name)
        .await?
        .with_context(|| format!("pool {} is gone", spec.name))?
        .revision;
    let mut sets = spec.carve().map_err(anyhow::Error::msg)?;
    let set = sets.remove(0);
    let blocks: Arc<Vec<IpNet>> = Arc::new((0..count).map(|i| set.block(i)).collect());
    let next = Arc::new(AtomicUsize::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..parallel {
        let (store, blocks, next, name) = (
            connect(url).await?,
            blocks.clone(),
            next.clone(),
            spec.name.clone(),
        );
        tasks.spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(b) = blocks.get(i) else {
                    return Ok::<_, anyhow::Error>(());
                };
                let won = store.claim(&name, revision, b, &node(i / PER_NODE)).await?;
                if !matches!(won, ipool_server::cluster::vocab::Claimed::Won(_)) {
                    bail!("filling pool {name}: block {b}: {won:?}");
                }
            }
        });
    }
    while let Some(r) = tasks.join_next().await {
        r.context("a filler panicked")??;
    }
    Ok(())
}

pub(crate) fn run(
    rt: &tokio::runtime::Runtime,
    bins: &Bins,
    url: &str,
    scale: Scale,
    samples: usize,
) -> Result<ScaleReport> {
    // A /10 in /26 blocks: 65 536 (fewer for a quick run: a /13, 8 192); the other pools of
    // the run use 10.0.0.0/8.
    let cidr = if scale.owned > 8192 {
        "100.64.0.0/10"
    } else {
        "100.64.0.0/13"
    };
    let spec = claims::pool("scale", cidr)?;
    let t = Instant::now();
    rt.block_on(async {
        claims::create(url, PREFIX, &spec).await?;
        fill(url, &spec, scale.owned, 16).await
    })?;
    let fill_time = t.elapsed();
    progress!(
        "cluster scale: {} blocks owned by {} nodes in {:.1} s",
        scale.owned,
        scale.owned / PER_NODE,
        fill_time.as_secs_f64()
    );

    // A node joining: its ipoold's first ADD.
    let dir = tempfile::tempdir().context("temp dir")?;
    let config = dir.path().join("join.toml");
    std::fs::write(
        &config,
        format!(
            "[cluster]\netcd_endpoints = [\"{url}\"]\nprefix = \"{PREFIX}\"\nnode_name = \"joiner\"\n\n\
             [[network]]\nname = \"scale\"\nranges_from = \"cluster\"\ncluster_pool = \"scale\"\n"
        ),
    )?;
    let t = Instant::now();
    let daemon = Daemon::start(&bins.ipoold, Some(&config))?;
    let net = Net::ipool_configured(&bins.ipool, &daemon.socket, "scale");
    let deadline = Instant::now() + Duration::from_secs(60);
    while let Err(e) = net.call(Op::Add, "first") {
        if Instant::now() > deadline {
            bail!(
                "the joining node served no ADD within 60 s: {e:#}\n{}",
                daemon.log()
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let join_first_add = t.elapsed();
    drop(daemon);

    // One node's resync, and the whole pool's listing it replaced.
    let (resync, resync_requests, resync_bytes, full_listing, full_listing_stats) =
        rt.block_on(async {
            let s = connect(url).await?;
            let mut times = Vec::new();
            let before = s.client().stats();
            for k in 0..samples {
                let t = Instant::now();
                let l = s
                    .node_blocks(&node(k % (scale.owned / PER_NODE)), Some("scale"))
                    .await?;
                times.push(t.elapsed());
                if l.blocks.len() != PER_NODE {
                    bail!("{} has {} blocks, not {PER_NODE}", node(k), l.blocks.len());
                }
            }
            let after = s.client().stats();
            let n = samples.max(1) as f64;
            let before_full = s.client().stats();
            let t = Instant::now();
            let all = s.list_blocks(Some("scale"), None).await?;
            let full = t.elapsed();
            let after_full = s.client().stats();
            // The joining node's block besides.
            if all.blocks.len() < scale.owned {
                bail!(
                    "the pool lists {} blocks, not {}",
                    all.blocks.len(),
                    scale.owned
                );
            }
            Ok::<_, anyhow::Error>((
                times,
                (after.requests - before.requests) as f64 / n,
                (after.bytes - before.bytes) as f64 / n,
                full,
                (
                    after_full.requests - before_full.requests,
                    after_full.bytes - before_full.bytes,
                ),
            ))
        })?;

    let t = Instant::now();
    let ctl = std::process::Command::new(&bins.ipoolctl)
        .args(["cluster", "blocks", "--node", &node(0)])
        .args(["--etcd-endpoints", url, "--etcd-prefix", PREFIX])
        .output()
        .context("running ipoolctl")?;
    let ctl_node = t.elapsed();
    if !ctl.status.success() {
        bail!(
            "ipoolctl cluster blocks --node: {}",
            String::from_utf8_lossy(&ctl.stderr)
        );
    }

    // Many nodes resyncing once, together (each with a connection of its own).
    let (many, many_requests, many_bytes) = rt.block_on(async {
        let mut stores = Vec::new();
        for _ in 0..scale.resyncing.min(64) {
            stores.push(connect(url).await?);
        }
        let before: Vec<_> = stores.iter().map(|s| s.client().stats()).collect();
        let next = Arc::new(AtomicUsize::new(0));
        let t = Instant::now();
        let mut tasks = tokio::task::JoinSet::new();
        for s in &stores {
            let (s, next, total) = (s.clone(), next.clone(), scale.resyncing);
            tasks.spawn(async move {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= total {
                        return Ok::<_, anyhow::Error>(());
                    }
                    s.node_blocks(&node(i), Some("scale")).await?;
                }
            });
        }
        while let Some(r) = tasks.join_next().await {
            r.context("a resync panicked")??;
        }
        let elapsed = t.elapsed();
        let (mut req, mut bytes) = (0, 0);
        for (s, b) in stores.iter().zip(before) {
            let a = s.client().stats();
            req += a.requests - b.requests;
            bytes += a.bytes - b.bytes;
        }
        Ok::<_, anyhow::Error>((elapsed, req, bytes))
    })?;

    // Claims at 90 % fill: a /16 in /26s (1 024 blocks), 922 owned, the rest claimed by
    // `claimers` nodes at once.
    let spec90 = claims::pool("fill90", "100.128.0.0/16")?;
    let fill90 = rt.block_on(async {
        claims::create(url, PREFIX, &spec90).await?;
        fill(url, &spec90, 922, 16).await?;
        claims::drain(url, PREFIX, &spec90, scale.claimers).await
    })?;

    Ok(ScaleReport {
        scale,
        pool: format!("{cidr} in /26 blocks"),
        fill: fill_time,
        join_first_add,
        resync,
        resync_requests,
        resync_bytes,
        full_listing,
        full_listing_requests: full_listing_stats.0,
        full_listing_bytes: full_listing_stats.1,
        ctl_node,
        many,
        many_requests,
        many_bytes,
        fill90,
    })
}
