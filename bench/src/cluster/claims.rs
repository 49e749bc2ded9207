//! Simulated nodes: each runs the daemon's claim code (`claim::claim_next`, what a
//! node's background claim does: one create-if-absent transaction per candidate of its view of
//! the pool, in its own order) against the real etcd, with an etcd client of its own.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use ipnet::IpNet;
use ipool_server::cluster::claim::{self, Views};
use ipool_server::cluster::datastore::{BlockStore, PoolStore};
use ipool_server::cluster::etcd::EtcdStore;
use ipool_server::cluster::ippool::PoolSpec;

/// Claims made by `claimers` simulated nodes.
pub struct ClaimRun {
    pub claimers: usize,
    /// Blocks won.
    pub claims: usize,
    /// Candidates another node had won first (each cost a transaction).
    pub lost: usize,
    pub elapsed: Duration,
    /// Each claim_next call, from its start to the block won.
    pub latencies: Vec<Duration>,
    /// Blocks listed in etcd afterwards, each checked against its winner.
    pub verified: usize,
    /// Creating the pool and every claimer's etcd client (before the clock starts).
    pub setup: Duration,
}

impl ClaimRun {
    pub fn rate(&self) -> f64 {
        self.claims as f64 / self.elapsed.as_secs_f64()
    }
}

/// A pool of IPv4 blocks of /26 in `cidr`.
pub fn pool(name: &str, cidr: &str) -> Result<PoolSpec> {
    Ok(PoolSpec {
        name: name.to_string(),
        cidrs: vec![cidr.parse().with_context(|| format!("CIDR {cidr}"))?],
        block_v4: 26,
        block_v6: 122,
        exclude: Vec::new(),
        ..PoolSpec::default()
    })
}

async fn connect(url: &str, prefix: &str) -> Result<EtcdStore> {
    EtcdStore::connect(&[url.to_string()], prefix, Duration::from_secs(10), None)
        .await
        .with_context(|| format!("connecting to etcd at {url}"))
}

/// Waits (up to 20 s) until etcd answers a request.
pub async fn wait_ready(url: &str, prefix: &str) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let r = match connect(url, prefix).await {
            Ok(s) => s.pools().await.map(|_| ()).map_err(anyhow::Error::from),
            Err(e) => Err(e),
        };
        match r {
            Ok(()) => return Ok(()),
            Err(e) if Instant::now() > deadline => {
                return Err(e.context("etcd did not answer within 20 s"))
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

/// Creates `spec` in etcd; the connection that did.
pub async fn create(url: &str, prefix: &str, spec: &PoolSpec) -> Result<EtcdStore> {
    let admin = connect(url, prefix).await?;
    admin
        .create_pool(spec)
        .await
        .with_context(|| format!("creating pool {}", spec.name))?;
    Ok(admin)
}

/// How many blocks of `pool` `node` owns.
pub async fn owned(url: &str, prefix: &str, pool: &str, node: &str) -> Result<usize> {
    let store = connect(url, prefix).await?;
    let blocks = store
        .list_blocks(Some(pool), Some(node))
        .await
        .with_context(|| format!("listing {node}'s blocks of pool {pool}"))?;
    Ok(blocks.blocks.len())
}

/// One claim by `node`, timed; the block it won (None: the pool is full, and `until` allows
/// that).
async fn claim_one(
    store: &EtcdStore,
    views: &Views,
    spec: &PoolSpec,
    revision: i64,
    node: &str,
    until: Until,
) -> Result<Option<(IpNet, usize, Duration)>> {
    let t = Instant::now();
    let out = claim::claim_next(store, views, spec, revision, true, node)
        .await
        .with_context(|| format!("{node}: claiming a block of pool {}", spec.name))?;
    let elapsed = t.elapsed();
    match (out.block, until) {
        (Some(b), _) => Ok(Some((b.block, out.lost, elapsed))),
        (None, Until::Full) => Ok(None),
        (None, _) => bail!(
            "{node}: pool {} has no free block ({} blocks, {} owned): the benchmark's pool is too small",
            spec.name,
            out.blocks,
            out.owned_elsewhere + out.owned_here
        ),
    }
}

/// How long each claimer goes on.
#[derive(Clone, Copy)]
pub enum Until {
    Claims(usize),
    Time(Duration),
    /// Until the pool has no free block.
    Full,
}

/// `claimers` simulated nodes ("<pool>-<i>", each with a connection of its own) claiming
/// blocks of a fresh pool back to back.
pub async fn run(
    url: &str,
    prefix: &str,
    spec: &PoolSpec,
    claimers: usize,
    until: Until,
) -> Result<ClaimRun> {
    let t = Instant::now();
    let admin = create(url, prefix, spec).await?;
    claim_with(admin, url, prefix, spec, claimers, until, t, "").await
}

/// `claimers` nodes claiming the free blocks of `spec`, an existing pool whose other blocks are
/// owned by nodes named `filler*`, until it is full.
pub async fn drain(url: &str, prefix: &str, spec: &PoolSpec, claimers: usize) -> Result<ClaimRun> {
    let t = Instant::now();
    let admin = connect(url, prefix).await?;
    claim_with(
        admin,
        url,
        prefix,
        spec,
        claimers,
        Until::Full,
        t,
        "scale-node-",
    )
    .await
}

#[allow(clippy::too_many_arguments)]
async fn claim_with(
    admin: EtcdStore,
    url: &str,
    prefix: &str,
    spec: &PoolSpec,
    claimers: usize,
    until: Until,
    t: Instant,
    filler: &str,
) -> Result<ClaimRun> {
    // Read once, as a daemon keeps it: every claim is conditioned on it.
    let revision = admin
        .get_pool(&spec.name)
        .await?
        .with_context(|| format!("pool {} is gone", spec.name))?
        .revision;
    let mut stores = Vec::with_capacity(claimers);
    for _ in 0..claimers {
        stores.push(connect(url, prefix).await?);
    }
    let setup = t.elapsed();
    let start = Instant::now();
    let more = move |won: usize| match until {
        Until::Claims(n) => won < n,
        Until::Time(d) => start.elapsed() < d,
        Until::Full => true,
    };
    let mut tasks = tokio::task::JoinSet::new();
    for (i, store) in stores.into_iter().enumerate() {
        let (spec, node) = (spec.clone(), format!("{}-{i}", spec.name));
        tasks.spawn(async move {
            // The simulated node's view of the pool, kept between its claims as a daemon's is.
            let views = Views::default();
            let mut won = Vec::new();
            let mut lost = 0;
            let mut latencies = Vec::new();
            while more(won.len()) {
                let Some((block, l, d)) =
                    claim_one(&store, &views, &spec, revision, &node, until).await?
                else {
                    break;
                };
                won.push((block, node.clone()));
                lost += l;
                latencies.push(d);
            }
            Ok::<_, anyhow::Error>((won, lost, latencies))
        });
    }
    let mut won = Vec::new();
    let mut run = ClaimRun {
        claimers,
        claims: 0,
        lost: 0,
        elapsed: Duration::ZERO,
        latencies: Vec::new(),
        verified: 0,
        setup,
    };
    while let Some(r) = tasks.join_next().await {
        let (w, lost, latencies) = r.context("a claimer panicked")??;
        won.extend(w);
        run.lost += lost;
        run.latencies.extend(latencies);
    }
    run.elapsed = start.elapsed();
    run.claims = won.len();
    run.verified = verify(&admin, &spec.name, &won, filler).await?;
    Ok(run)
}

/// Checks what etcd lists for `pool` against the claims won: every block won by exactly one
/// node, listed with that node as its owner, nothing else listed but blocks of nodes named
/// `filler*` (when not empty). Returns the blocks checked.
async fn verify(
    store: &EtcdStore,
    pool: &str,
    won: &[(IpNet, String)],
    filler: &str,
) -> Result<usize> {
    let mut winners: HashMap<IpNet, &str> = HashMap::new();
    for (block, node) in won {
        if let Some(other) = winners.insert(*block, node) {
            bail!("block {block} of pool {pool} was won by both {other} and {node}");
        }
    }
    let listed = store
        .list_blocks(Some(pool), None)
        .await
        .with_context(|| format!("listing the blocks of pool {pool}"))?;
    for b in &listed.blocks {
        match winners.get(&b.block) {
            Some(n) if *n == b.owner.node => {}
            Some(n) => bail!(
                "block {} of pool {pool}: won by {n}, listed as {}'s",
                b.block,
                b.owner.node
            ),
            None if !filler.is_empty() && b.owner.node.starts_with(filler) => {}
            None => bail!(
                "block {} of pool {pool} is listed as {}'s, but no claim won it",
                b.block,
                b.owner.node
            ),
        }
    }
    let fillers = listed
        .blocks
        .iter()
        .filter(|b| !filler.is_empty() && b.owner.node.starts_with(filler))
        .count();
    if listed.blocks.len() != winners.len() + fillers || !listed.malformed.is_empty() {
        bail!(
            "pool {pool}: {} blocks won, {} listed in etcd ({} malformed keys)",
            winners.len(),
            listed.blocks.len(),
            listed.malformed.len()
        );
    }
    let mut sorted: Vec<IpNet> = listed.blocks.iter().map(|b| b.block).collect();
    sorted.sort();
    if let Some(w) = sorted.windows(2).find(|w| w[0].contains(&w[1])) {
        bail!("pool {pool}: blocks {} and {} overlap", w[0], w[1]);
    }
    Ok(listed.blocks.len())
}
