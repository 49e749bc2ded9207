//! What a run works with: the `Plan` (how much of everything to do), the `Bins` under test,
//! and fresh network `Names`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{ensure, Context, Result};

use crate::Args;

/// How much of everything to do.
pub(crate) struct Plan {
    pub(crate) mode: &'static str,
    pub(crate) samples: usize,
    pub(crate) warmup: usize,
    pub(crate) fills: Vec<usize>,
    pub(crate) concurrency: Vec<usize>,
    /// Plugin calls per throughput run (split among the threads).
    pub(crate) calls: usize,
    pub(crate) load_connections: Vec<usize>,
    pub(crate) load_in_flight: usize,
    pub(crate) load_duration: Duration,
    pub(crate) restart_allocations: usize,
    pub(crate) prefill_connections: usize,
    pub(crate) prefill_in_flight: usize,
    /// Concurrent simulated nodes per claims/s run (at most 3 runs: each has a /10 of its own).
    pub(crate) cluster_claimers: Vec<usize>,
    pub(crate) cluster_duration: Duration,
    /// Simulated nodes claiming their first block together.
    pub(crate) cluster_first_nodes: usize,
    /// The pool nearly all owned by others, and how many nodes resync at once.
    pub(crate) cluster_scale: Scale,
}

impl Plan {
    pub(crate) fn of(args: &Args) -> Plan {
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
                cluster_claimers: vec![1, 10, 100],
                cluster_duration: Duration::from_millis(500),
                cluster_first_nodes: 100,
                cluster_scale: Scale {
                    owned: 2_000,
                    resyncing: 250,
                    claimers: 100,
                },
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
                cluster_claimers: vec![1, 10, 100],
                cluster_duration: Duration::from_secs(3),
                cluster_first_nodes: 1_000,
                cluster_scale: Scale {
                    owned: 60_000,
                    resyncing: 5_000,
                    claimers: 100,
                },
            }
        }
    }
}

/// The binaries under test.
pub(crate) struct Bins {
    pub(crate) ipoold: PathBuf,
    pub(crate) ipoolctl: PathBuf,
    pub(crate) ipool: PathBuf,
    pub(crate) host_local: PathBuf,
}

impl Bins {
    pub(crate) fn locate(host_local: &Path, plugin: Option<&Path>) -> Result<Bins> {
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
            ipoolctl: find("ipoolctl")?,
            ipool,
            host_local: host_local.to_path_buf(),
        })
    }
}

/// Fresh network names: bench1, bench2, ...
#[derive(Default)]
pub(crate) struct Names(usize);

impl Names {
    pub(crate) fn next(&mut self) -> String {
        self.0 += 1;
        format!("bench{}", self.0)
    }
}

/// How big the cluster store's scale run is (`cluster::scale`).
#[derive(Clone, Copy, Debug)]
pub struct Scale {
    /// Blocks owned by other nodes.
    pub owned: usize,
    /// Nodes that resync once together.
    pub resyncing: usize,
    /// Claimers at 90 % fill.
    pub claimers: usize,
}
