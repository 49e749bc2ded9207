//! ADD latency while operators' reads flood the daemon: a daemon holding
//! many attachments, its TCP Ops listener on loopback, and 8 clients that call
//! `ListAllocations` back to back. The plugin's ADD p50 is measured quiet and then during the
//! flood, on the same daemon; the target is a ratio of at most 1.5. A refused call
//! (RESOURCE_EXHAUSTED: too many at once from one address) is retried after 20 ms.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use ipool_proto::v1 as pb;

use crate::daemon::Daemon;
use crate::grpc::{self, NetSpec};
use crate::live::Live;
use crate::plugin::{ipool_ipam_json, Net, Op};
use crate::setup::{Bins, Names, Plan};
use crate::stats::Summary;

/// Clients calling `ListAllocations` back to back.
pub const READERS: usize = 8;

pub struct Flood {
    pub fill: usize,
    pub readers: usize,
    /// Plugin ADD times, quiet and during the flood.
    pub quiet: Vec<Duration>,
    pub flooded: Vec<Duration>,
    /// Pages served, and calls refused (RESOURCE_EXHAUSTED), while the flooded ADDs ran.
    pub pages: usize,
    pub refused: usize,
    pub flood_time: Duration,
}

/// Runs the phase on a daemon of its own (`config`: the uncapped source).
pub fn read_flood(
    rt: &tokio::runtime::Runtime,
    bins: &Bins,
    config: &std::path::Path,
    plan: &Plan,
    names: &mut Names,
) -> Result<Flood> {
    let fill = if plan.mode == "quick" { 1024 } else { 20_000 };
    let ops = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .context("finding a free loopback port for the Ops listener")?;
    let daemon = Daemon::start_with(
        &bins.ipoold,
        Some(config),
        &["--ops-listen".into(), ops.to_string()],
    )?;
    let name = names.next();
    let filled = NetSpec {
        network: names.next(),
        ipam_json: ipool_ipam_json(&daemon.socket, "10.128.0.0/16"),
    };
    let live = Arc::new(Live::new(format!("flood fill {}", filled.network)));
    rt.block_on(grpc::prefill(
        &daemon.socket,
        &filled,
        fill,
        plan.prefill_connections,
        plan.prefill_in_flight,
        "f",
        live,
    ))?;
    let net = Net::ipool(&bins.ipool, &daemon.socket, &name);
    let sample = |tag: &str| -> Result<Vec<Duration>> {
        let mut v = Vec::new();
        for i in 0..plan.warmup + plan.samples {
            let c = format!("{tag}{i}");
            let t = net.call(Op::Add, &c)?;
            net.call(Op::Del, &c)?;
            if i >= plan.warmup {
                v.push(t);
            }
        }
        Ok(v)
    };
    let quiet = sample("q")?;

    let stop = Arc::new(AtomicBool::new(false));
    let (pages, refused) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let mut readers = Vec::new();
    for _ in 0..READERS {
        let (stop, pages, refused) = (stop.clone(), pages.clone(), refused.clone());
        readers.push(rt.spawn(async move {
            let mut client = pb::ops_client::OpsClient::connect(format!("http://{ops}")).await?;
            while !stop.load(Ordering::Relaxed) {
                let mut token = String::new();
                loop {
                    let r = client
                        .list_allocations(pb::ListAllocationsRequest {
                            page_token: token.clone(),
                            ..Default::default()
                        })
                        .await;
                    match r {
                        Ok(page) => {
                            pages.fetch_add(1, Ordering::Relaxed);
                            token = page.into_inner().next_page_token;
                        }
                        // Refused (too many at once from this address): back off a little, as
                        // a client that retries should.
                        Err(s) if s.code() == tonic::Code::ResourceExhausted => {
                            refused.fetch_add(1, Ordering::Relaxed);
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                        Err(s) => return Err(anyhow::anyhow!("ListAllocations: {s}")),
                    }
                    if token.is_empty() || stop.load(Ordering::Relaxed) {
                        break;
                    }
                }
            }
            Ok::<(), anyhow::Error>(())
        }));
    }
    // Let the readers get going.
    std::thread::sleep(Duration::from_millis(500));
    let (pages_before, refused_before) = (
        pages.load(Ordering::Relaxed),
        refused.load(Ordering::Relaxed),
    );
    let started = Instant::now();
    let flooded = sample("l");
    let flood_time = started.elapsed();
    let (pages_during, refused_during) = (
        pages.load(Ordering::Relaxed) - pages_before,
        refused.load(Ordering::Relaxed) - refused_before,
    );
    stop.store(true, Ordering::Relaxed);
    for r in readers {
        rt.block_on(r).context("a reader panicked")??;
    }
    Ok(Flood {
        fill,
        readers: READERS,
        quiet,
        flooded: flooded?,
        pages: pages_during,
        refused: refused_during,
        flood_time,
    })
}

impl Flood {
    /// ADD p50 during the flood over quiet (target: at most 1.5).
    pub fn ratio(&self) -> f64 {
        Summary::of(&self.flooded).p50 / Summary::of(&self.quiet).p50
    }

    /// The section of the report.
    pub fn markdown(&self, o: &mut String) {
        use std::fmt::Write as _;
        let (q, f) = (Summary::of(&self.quiet), Summary::of(&self.flooded));
        let _ = writeln!(
            o,
            "\n## ADD under an Ops read flood ({} allocations; {} clients calling ListAllocations over loopback TCP back to back)\n",
            self.fill, self.readers
        );
        let _ = writeln!(
            o,
            "| | p50 (ms) | p90 (ms) | p99 (ms) |\n|---|---:|---:|---:|"
        );
        let _ = writeln!(
            o,
            "| plugin ADD, quiet | {:.2} | {:.2} | {:.2} |",
            q.p50, q.p90, q.p99
        );
        let _ = writeln!(
            o,
            "| plugin ADD, during the flood | {:.2} | {:.2} | {:.2} |",
            f.p50, f.p90, f.p99
        );
        let secs = self.flood_time.as_secs_f64().max(1e-9);
        let _ = writeln!(
            o,
            "\nADD p50 during / quiet: **{:.2}x** (target <= 1.5). Meanwhile {} pages served ({:.0}/s), {} reads refused (RESOURCE_EXHAUSTED).",
            self.ratio(),
            self.pages,
            self.pages as f64 / secs,
            self.refused
        );
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "fill": self.fill,
            "readers": self.readers,
            "quiet": Summary::of(&self.quiet).json(),
            "flooded": Summary::of(&self.flooded).json(),
            "ratio": self.ratio(),
            "pages": self.pages,
            "refused": self.refused,
            "flood_secs": self.flood_time.as_secs_f64(),
        })
    }
}
