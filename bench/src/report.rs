//! The measurements, printed as markdown tables and written as JSON.

use std::fmt::Write as _;
use std::time::Duration;

use serde_json::{json, Value};

use crate::plugin::Op;
use crate::stats::{micros, Summary};

/// The machine the numbers come from.
pub struct Machine {
    pub cpu: String,
    pub cores: usize,
    pub kernel: String,
    pub host_local: String,
    /// The ipool plugin binary measured: path, size and linking.
    pub plugin: String,
    pub temp_fs: String,
    pub command: String,
}

/// Sequential latency of one op at one fill level, both plugins.
pub struct LatencyRow {
    pub op: Op,
    pub fill: usize,
    pub ipool: Vec<Duration>,
    pub host_local: Vec<Duration>,
    /// ipool in the same network with no host-local call in between.
    pub ipool_alone: Vec<Duration>,
    /// ipool in an empty network of the same daemon, in the same loop as `ipool`: each call
    /// right after a host-local call at this row's fill.
    pub ipool_control: Vec<Duration>,
}

/// Calls per second through the plugin binaries at one concurrency level.
pub struct ThroughputRow {
    pub concurrency: usize,
    pub calls: usize,
    pub ipool_add: f64,
    pub host_local_add: f64,
    pub ipool_del: f64,
    pub host_local_del: f64,
}

/// Where a call's time goes: exec alone (VERSION), and the daemon's part without exec.
pub struct Breakdown {
    pub version_ipool: Vec<Duration>,
    pub version_host_local: Vec<Duration>,
    pub connect: Vec<Duration>,
    /// First call of `Status` on a fresh connection (no store write).
    pub status: Vec<Duration>,
    pub add: Vec<Duration>,
    pub del: Vec<Duration>,
}

/// Daemon-only load: durable Add+Del pairs.
pub struct LoadRow {
    pub connections: usize,
    pub in_flight: usize,
    pub pairs: usize,
    pub elapsed: Duration,
    pub latencies: Vec<Duration>,
    /// CPU time ipoold used during the run (user + system).
    pub daemon_cpu: Duration,
    /// Durable writes per group-commit flush during the run.
    pub writes_per_flush: f64,
}

impl LoadRow {
    /// ipoold's CPU time per pair, in microseconds.
    fn cpu_per_pair_us(&self) -> f64 {
        self.daemon_cpu.as_secs_f64() * 1e6 / self.pairs.max(1) as f64
    }

    fn rate(&self) -> f64 {
        self.pairs as f64 / self.elapsed.as_secs_f64()
    }
}

pub struct Restart {
    pub allocations: usize,
    pub subnet: String,
    pub fill_time: Duration,
    pub rss_before_kib: u64,
    pub connected: Duration,
    pub first_add: Duration,
    pub rss_after_kib: u64,
}

pub struct Report {
    pub machine: Machine,
    pub mode: &'static str,
    pub samples: usize,
    pub host_local_check: String,
    pub breakdown: Breakdown,
    pub latency: Vec<LatencyRow>,
    pub throughput: Vec<ThroughputRow>,
    pub load: Vec<LoadRow>,
    pub flood: crate::flood::Flood,
    pub restart: Restart,
    /// ipoold's RSS with its Kubernetes watch cache holding 0 and N pods.
    pub kube: Vec<crate::kube::KubeRow>,
    pub cluster: crate::cluster::Cluster,
    pub sim: crate::sim::Sim,
    pub phases: Vec<(String, Duration)>,
    /// Printed under the ipoold table.
    pub notes: Vec<String>,
}

fn ms(x: f64) -> String {
    format!("{x:.2}")
}

fn ratio(a: f64, b: f64) -> String {
    if b > 0.0 {
        format!("{:.2}", a / b)
    } else {
        "-".to_string()
    }
}

fn rate(x: f64) -> String {
    format!("{x:.0}")
}

fn mib(kib: u64) -> String {
    format!("{:.1} MiB", kib as f64 / 1024.0)
}

fn secs(d: Duration) -> String {
    format!("{:.1} s", d.as_secs_f64())
}

/// 65536 -> "65 536".
fn grouped(n: usize) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(' ');
        }
        out.push(c);
    }
    out
}

impl Machine {
    /// The machine table.
    pub fn markdown(&self, o: &mut String, mode: &str, samples: usize) {
        let m = self;
        let _ = writeln!(o, "| machine | |\n|---|---|");
        let _ = writeln!(o, "| CPU | {} |", m.cpu);
        let _ = writeln!(o, "| cores | {} |", m.cores);
        let _ = writeln!(o, "| kernel | {} |", m.kernel);
        let _ = writeln!(o, "| host-local | {} |", m.host_local);
        let _ = writeln!(o, "| ipool plugin | {} |", m.plugin);
        let _ = writeln!(
            o,
            "| temp dir (ipoold state, host-local dataDir) | {} |",
            m.temp_fs
        );
        let _ = writeln!(o, "| command | `{}` |", m.command);
        let _ = writeln!(
            o,
            "| mode | {}, {} sequential samples per latency row |",
            mode, samples
        );
    }
}

impl Report {
    pub fn markdown(&self) -> String {
        let mut o = String::new();
        let _ = writeln!(o, "# ipool vs host-local\n");
        self.machine.markdown(&mut o, self.mode, self.samples);
        let _ = writeln!(o, "\nhost-local format check: {}\n", self.host_local_check);

        let _ = writeln!(
            o,
            "## Sequential latency (ms; each call is one exec of the plugin, ipool and host-local calls interleaved)\n"
        );
        let _ = writeln!(
            o,
            "| op | fill | ipool p50 | ipool p90 | ipool p99 | host-local p50 | host-local p90 | host-local p99 | ipool/host-local p50 |"
        );
        let _ = writeln!(o, "|---|---:|---:|---:|---:|---:|---:|---:|---:|");
        for r in &self.latency {
            let (a, b) = (Summary::of(&r.ipool), Summary::of(&r.host_local));
            let _ = writeln!(
                o,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                r.op.verb(),
                grouped(r.fill),
                ms(a.p50),
                ms(a.p90),
                ms(a.p99),
                ms(b.p50),
                ms(b.p90),
                ms(b.p99),
                ratio(a.p50, b.p50)
            );
        }

        let _ = writeln!(
            o,
            "\n## Flatness with fill, same neighbour (ms; in the loop above, each ipool call also \
             right after a host-local call at the row's fill)\n\n\
             The control is an empty network of the same daemon, measured in the same loop: every \
             ipool call, in either network, comes right after a host-local call at the row's fill, \
             so only ipool's fill differs. How long the machine idled during host-local's call \
             changes ipool's time (at 10 000 the call lasts ~90 ms; see docs/performance.md).\n"
        );
        let _ = writeln!(
            o,
            "| op | fill | ipool p50 (network at fill) | ipool p50 (empty network) | at fill / empty |"
        );
        let _ = writeln!(o, "|---|---:|---:|---:|---:|");
        for r in &self.latency {
            let (a, c) = (Summary::of(&r.ipool), Summary::of(&r.ipool_control));
            let _ = writeln!(
                o,
                "| {} | {} | {} | {} | {} |",
                r.op.verb(),
                grouped(r.fill),
                ms(a.p50),
                ms(c.p50),
                ratio(a.p50, c.p50)
            );
        }

        let _ = writeln!(
            o,
            "\n## ipool alone (ms; the same networks, ipool calls back to back, no host-local call in between)\n\n\
             Flatness with fill, without host-local's call just before each measurement (at \
             10 000 that call lasts ~90 ms, and a machine left that long with a core idle is slower \
             to answer the next call; see docs/performance.md).\n"
        );
        let _ = writeln!(
            o,
            "| op | fill | ipool p50 | ipool p90 | ipool p99 | p50 vs fill 0 |"
        );
        let _ = writeln!(o, "|---|---:|---:|---:|---:|---:|");
        for r in &self.latency {
            let a = Summary::of(&r.ipool_alone);
            let base = self
                .latency
                .iter()
                .find(|b| b.op == r.op && b.fill == 0)
                .map(|b| Summary::of(&b.ipool_alone).p50)
                .unwrap_or(0.0);
            let _ = writeln!(
                o,
                "| {} | {} | {} | {} | {} | {} |",
                r.op.verb(),
                grouped(r.fill),
                ms(a.p50),
                ms(a.p90),
                ms(a.p99),
                ratio(a.p50, base)
            );
        }

        let _ = writeln!(
            o,
            "\n## Where a call's time goes (ms, fill 0, sequential)\n"
        );
        let b = &self.breakdown;
        let _ = writeln!(
            o,
            "| step | ipool p50 | ipool p99 | host-local p50 | host-local p99 |"
        );
        let _ = writeln!(o, "|---|---:|---:|---:|---:|");
        let (vi, vh) = (
            Summary::of(&b.version_ipool),
            Summary::of(&b.version_host_local),
        );
        let _ = writeln!(
            o,
            "| exec with CNI_COMMAND=VERSION (process start and exit, no IPAM) | {} | {} | {} | {} |",
            ms(vi.p50),
            ms(vi.p99),
            ms(vh.p50),
            ms(vh.p99)
        );
        for (what, s) in [
            ("gRPC connect over the socket (no exec)", &b.connect),
            (
                "gRPC Status, first call on the connection (no store write, no exec)",
                &b.status,
            ),
            ("gRPC Add, durable (no exec)", &b.add),
            ("gRPC Del, durable (no exec)", &b.del),
        ] {
            let s = Summary::of(s);
            let _ = writeln!(o, "| {what} | {} | {} | - | - |", ms(s.p50), ms(s.p99));
        }

        let _ = writeln!(
            o,
            "\n## Throughput through the plugin binaries (calls/s; `concurrency` threads each exec'ing the plugin in a loop)\n\n\
             Fresh networks per level; the ADD run grows each network from 0 to `calls per run` attachments, \
             the DEL run empties it again (so host-local's per-call directory scan grows during a run).\n"
        );
        let _ = writeln!(
            o,
            "| concurrency | calls per run | ipool ADD/s | host-local ADD/s | ADD ratio | ipool DEL/s | host-local DEL/s | DEL ratio |"
        );
        let _ = writeln!(o, "|---:|---:|---:|---:|---:|---:|---:|---:|");
        for r in &self.throughput {
            let _ = writeln!(
                o,
                "| {} | {} | {} | {} | {} | {} | {} | {} |",
                r.concurrency,
                r.calls,
                rate(r.ipool_add),
                rate(r.host_local_add),
                ratio(r.ipool_add, r.host_local_add),
                rate(r.ipool_del),
                rate(r.host_local_del),
                ratio(r.ipool_del, r.host_local_del)
            );
        }

        let _ = writeln!(o, "\n## ipoold alone\n");
        let _ = writeln!(o, "| measurement | value |\n|---|---:|");
        for r in &self.load {
            let s = Summary::of(&r.latencies);
            let _ = writeln!(
                o,
                "| durable ADD+DEL pairs/s over {} UDS connection{}, {} in flight ({} pairs in {:.1} s; pair p50 {} ms, p99 {} ms; ipoold CPU {:.0} us per pair; {:.1} writes per flush) | {} |",
                r.connections,
                if r.connections == 1 { "" } else { "s" },
                r.in_flight,
                r.pairs,
                r.elapsed.as_secs_f64(),
                ms(s.p50),
                ms(s.p99),
                r.cpu_per_pair_us(),
                r.writes_per_flush,
                rate(r.rate())
            );
        }
        let x = &self.restart;
        let n = grouped(x.allocations);
        let _ = writeln!(
            o,
            "| fill: {n} Adds over gRPC into {} (4 connections, 64 in flight) | {} ({}/s) |",
            x.subnet,
            secs(x.fill_time),
            rate(x.allocations as f64 / x.fill_time.as_secs_f64())
        );
        let _ = writeln!(
            o,
            "| RSS with {n} allocations, before SIGKILL | {} |",
            mib(x.rss_before_kib)
        );
        let _ = writeln!(
            o,
            "| restart after SIGKILL with {n} allocations: spawn -> socket accepts | {} ms |",
            ms(x.connected.as_secs_f64() * 1e3)
        );
        let _ = writeln!(
            o,
            "| restart after SIGKILL with {n} allocations: spawn -> first successful ADD reply | {} ms |",
            ms(x.first_add.as_secs_f64() * 1e3)
        );
        let _ = writeln!(
            o,
            "| RSS with {n} allocations, after the restart | {} |",
            mib(x.rss_after_kib)
        );

        for n in &self.notes {
            let _ = writeln!(o, "\nNote: {n}");
        }
        if !self.kube.is_empty() {
            let _ = writeln!(
                o,
                "\n## The Kubernetes watch cache\n\nipoold with `[kubernetes]` against an apiserver of the benchmark's own (the node's pods as an apiserver serves them: labels, managedFields, containers, conditions); RSS once the cache holds them.\n\n| pods in the cache | served (JSON) | ipoold RSS |\n|---:|---:|---:|"
            );
            for r in &self.kube {
                let _ = writeln!(
                    o,
                    "| {} | {} | {} |",
                    grouped(r.pods),
                    mib((r.served_bytes / 1024) as u64),
                    mib(r.rss_kib)
                );
            }
        }
        self.flood.markdown(&mut o);
        self.cluster.markdown(&mut o);
        self.sim.markdown(&mut o);

        let _ = writeln!(o, "\n## Run time\n\n| phase | time |\n|---|---:|");
        for (p, d) in &self.phases {
            let _ = writeln!(o, "| {p} | {} |", secs(*d));
        }
        o
    }

    pub fn json(&self) -> Value {
        let m = &self.machine;
        let b = &self.breakdown;
        let x = &self.restart;
        json!({
            "machine": {
                "cpu": m.cpu,
                "cores": m.cores,
                "kernel": m.kernel,
                "host_local": m.host_local,
                "temp_fs": m.temp_fs,
                "command": m.command,
            },
            "mode": self.mode,
            "samples": self.samples,
            "host_local_check": self.host_local_check,
            "latency": self.latency.iter().map(|r| json!({
                "op": r.op.verb(),
                "fill": r.fill,
                "ipool": Summary::of(&r.ipool).json(),
                "host_local": Summary::of(&r.host_local).json(),
                "ipool_alone": Summary::of(&r.ipool_alone).json(),
                "ipool_us": micros(&r.ipool),
                "ipool_control": Summary::of(&r.ipool_control).json(),
                "ipool_alone_us": micros(&r.ipool_alone),
                "ipool_control_us": micros(&r.ipool_control),
                "host_local_us": micros(&r.host_local),
            })).collect::<Vec<_>>(),
            "breakdown": {
                "version_ipool_us": micros(&b.version_ipool),
                "version_host_local_us": micros(&b.version_host_local),
                "grpc_connect_us": micros(&b.connect),
                "grpc_status_us": micros(&b.status),
                "grpc_add_us": micros(&b.add),
                "grpc_del_us": micros(&b.del),
            },
            "throughput": self.throughput.iter().map(|r| json!({
                "concurrency": r.concurrency,
                "calls": r.calls,
                "ipool_add_per_s": r.ipool_add,
                "host_local_add_per_s": r.host_local_add,
                "ipool_del_per_s": r.ipool_del,
                "host_local_del_per_s": r.host_local_del,
            })).collect::<Vec<_>>(),
            "daemon_load": self.load.iter().map(|r| json!({
                "connections": r.connections,
                "in_flight": r.in_flight,
                "pairs": r.pairs,
                "daemon_cpu_us_per_pair": r.cpu_per_pair_us(),
                "writes_per_flush": r.writes_per_flush,
                "elapsed_s": r.elapsed.as_secs_f64(),
                "pairs_per_s": r.rate(),
                "pair_latency": Summary::of(&r.latencies).json(),
            })).collect::<Vec<_>>(),
            "flood": self.flood.json(),
            "kube": self.kube.iter().map(|r| json!({
                "pods": r.pods, "served_bytes": r.served_bytes, "rss_kib": r.rss_kib,
            })).collect::<Vec<_>>(),
            "cluster": self.cluster.json(),
            "simulation": self.sim.json(),
            "restart": {
                "allocations": x.allocations,
                "subnet": x.subnet,
                "fill_s": x.fill_time.as_secs_f64(),
                "rss_before_kib": x.rss_before_kib,
                "spawn_to_accept_ms": x.connected.as_secs_f64() * 1e3,
                "spawn_to_first_add_ms": x.first_add.as_secs_f64() * 1e3,
                "rss_after_kib": x.rss_after_kib,
            },
            "notes": self.notes,
            "phases_s": self.phases.iter().map(|(p, d)| json!({"phase": p, "s": d.as_secs_f64()})).collect::<Vec<_>>(),
        })
    }
}
