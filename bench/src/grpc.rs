//! Talking to ipoold directly over gRPC: prefill, the daemon-only load generator, the restart
//! probe.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use ipool_proto::v1 as pb;
use pb::cni_client::CniClient;
use tokio::task::JoinSet;
use tonic::transport::{Channel, Endpoint};

use crate::live::{strip_prefix_len, Live};

pub type Client = CniClient<Channel>;

/// A network as the daemon sees it: its name and the `ipam` JSON that declares it.
#[derive(Clone, Debug)]
pub struct NetSpec {
    pub network: String,
    pub ipam_json: String,
}

/// One HTTP/2 connection over the Unix socket.
pub async fn connect(socket: &Path) -> Result<Client> {
    let channel = Endpoint::from_shared(format!("unix://{}", socket.display()))
        .context("socket path is not a valid endpoint")?
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .with_context(|| format!("connecting to ipoold at {}", socket.display()))?;
    Ok(CniClient::new(channel))
}

/// `n` separate connections.
pub async fn connect_many(socket: &Path, n: usize) -> Result<Vec<Client>> {
    let mut v = Vec::with_capacity(n);
    for _ in 0..n.max(1) {
        v.push(connect(socket).await?);
    }
    Ok(v)
}

fn key(net: &NetSpec, container: &str) -> Option<pb::AttachmentKey> {
    Some(pb::AttachmentKey {
        network: net.network.clone(),
        container_id: container.to_string(),
        ifname: "eth0".to_string(),
    })
}

/// Add; returns the one address (without prefix length).
pub async fn add(client: &mut Client, net: &NetSpec, container: &str) -> Result<String> {
    let reply = client
        .add(pb::AddRequest {
            key: key(net, container),
            pod: Some(pb::PodIdentity {
                namespace: "bench".to_string(),
                name: container.to_string(),
                uid: String::new(),
            }),
            ipam_json: net.ipam_json.clone(),
            netns: format!("/var/run/netns/bench-{container}"),
            requested_ips: Vec::new(),
        })
        .await
        .with_context(|| format!("gRPC Add {container} on {}", net.network))?
        .into_inner();
    match reply.ips.as_slice() {
        [ip] => Ok(strip_prefix_len(&ip.address)),
        other => bail!(
            "gRPC Add {container}: expected one address, got {}",
            other.len()
        ),
    }
}

pub async fn del(client: &mut Client, net: &NetSpec, container: &str) -> Result<()> {
    client
        .del(pb::DelRequest {
            key: key(net, container),
            ipam_json: net.ipam_json.clone(),
        })
        .await
        .with_context(|| format!("gRPC Del {container} on {}", net.network))?;
    Ok(())
}

/// `n` Adds (containers `<prefix><i>`), `in_flight` at a time over `conns` connections; every
/// address goes through `live`. Returns the wall time.
pub async fn prefill(
    socket: &Path,
    net: &NetSpec,
    n: usize,
    conns: usize,
    in_flight: usize,
    prefix: &str,
    live: Arc<Live>,
) -> Result<Duration> {
    let clients = connect_many(socket, conns).await?;
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut tasks = JoinSet::new();
    for t in 0..in_flight.max(1) {
        let mut client = clients[t % clients.len()].clone();
        let (next, net, live, prefix) =
            (next.clone(), net.clone(), live.clone(), prefix.to_string());
        tasks.spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n {
                    return Ok::<(), anyhow::Error>(());
                }
                let container = format!("{prefix}{i}");
                let addr = add(&mut client, &net, &container).await?;
                live.added(&container, &[addr])?;
            }
        });
    }
    while let Some(r) = tasks.join_next().await {
        r.context("prefill task panicked")??;
    }
    Ok(started.elapsed())
}

/// What the daemon-only load generator measured.
pub struct PairLoad {
    pub pairs: usize,
    pub elapsed: Duration,
    /// Add+Del time of each pair.
    pub latencies: Vec<Duration>,
}

/// `in_flight` tasks over `conns` connections, each repeating Add then Del of a new key until
/// `duration` has passed.
pub async fn pair_load(
    socket: &Path,
    net: &NetSpec,
    conns: usize,
    in_flight: usize,
    duration: Duration,
) -> Result<PairLoad> {
    let clients = connect_many(socket, conns).await?;
    let live = Arc::new(Live::new(format!("ipool (gRPC) network {}", net.network)));
    let started = Instant::now();
    let deadline = started + duration;
    let mut tasks = JoinSet::new();
    for t in 0..in_flight.max(1) {
        let mut client = clients[t % clients.len()].clone();
        let (net, live) = (net.clone(), live.clone());
        tasks.spawn(async move {
            let mut lat = Vec::new();
            let mut k = 0usize;
            while Instant::now() < deadline {
                let container = format!("load-{t}-{k}");
                k += 1;
                let t0 = Instant::now();
                let addr = add(&mut client, &net, &container).await?;
                live.added(&container, &[addr])?;
                live.deleting(&container);
                del(&mut client, &net, &container).await?;
                lat.push(t0.elapsed());
            }
            Ok::<_, anyhow::Error>(lat)
        });
    }
    let mut latencies = Vec::new();
    while let Some(r) = tasks.join_next().await {
        latencies.extend(r.context("load task panicked")??);
    }
    Ok(PairLoad {
        pairs: latencies.len(),
        elapsed: started.elapsed(),
        latencies,
    })
}

/// Sequential direct calls, to split a plugin call's time: for each sample a fresh connection
/// (as the plugin makes one) and key; returns (connect, Add, Del) times.
pub async fn sequential(
    socket: &Path,
    net: &NetSpec,
    samples: usize,
    live: &Live,
) -> Result<Vec<(Duration, Duration, Duration)>> {
    let mut out = Vec::with_capacity(samples);
    for i in 0..samples {
        let container = format!("direct-{i}");
        let t0 = Instant::now();
        let mut client = connect(socket).await?;
        let t1 = Instant::now();
        let addr = add(&mut client, net, &container).await?;
        let t2 = Instant::now();
        live.added(&container, &[addr])?;
        live.deleting(&container);
        del(&mut client, net, &container).await?;
        out.push((t1 - t0, t2 - t1, t2.elapsed()));
    }
    Ok(out)
}

/// Sequential first calls of `Status` (which reads the pool and writes nothing) on fresh
/// connections: what a call costs before the engine and the store do any work.
pub async fn sequential_status(
    socket: &Path,
    net: &NetSpec,
    samples: usize,
) -> Result<Vec<Duration>> {
    let mut out = Vec::with_capacity(samples);
    for _ in 0..samples {
        let mut client = connect(socket).await?;
        let t = Instant::now();
        client
            .status(pb::StatusRequest {
                network: net.network.clone(),
                ipam_json: net.ipam_json.clone(),
            })
            .await
            .context("Status")?;
        out.push(t.elapsed());
    }
    Ok(out)
}

/// When the restarted daemon first accepted a connection and first answered an Add, both
/// measured from `spawned`.
pub struct FirstAdd {
    pub connected: Duration,
    pub added: Duration,
    pub address: String,
}

/// Polls connect + Add (every millisecond) until an Add succeeds or `limit` passes.
pub async fn first_add(
    socket: PathBuf,
    net: &NetSpec,
    container: &str,
    spawned: Instant,
    limit: Duration,
) -> Result<FirstAdd> {
    let mut connected = None;
    let mut last_error = String::from("never connected");
    loop {
        if spawned.elapsed() > limit {
            bail!("no successful Add within {limit:?} of the restart; last error: {last_error}");
        }
        match connect(&socket).await {
            Ok(mut client) => {
                let at = *connected.get_or_insert_with(|| spawned.elapsed());
                match add(&mut client, net, container).await {
                    Ok(address) => {
                        return Ok(FirstAdd {
                            connected: at,
                            added: spawned.elapsed(),
                            address,
                        })
                    }
                    Err(e) => last_error = format!("{e:#}"),
                }
            }
            Err(e) => last_error = format!("{e:#}"),
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}
