//! Exec'ing the real plugins the way a container runtime does: CNI_* in the environment, the
//! network config on stdin, the result on stdout.

use std::io::Write;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};

use crate::live::{strip_prefix_len, Live};

/// The subnet both plugins allocate from in the latency and throughput scenarios.
pub const SUBNET: &str = "10.96.0.0/16";
/// Its first dynamic address (the gateway, .1, is skipped by both plugins).
const FIRST: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 2);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Ipool,
    HostLocal,
}

impl Kind {
    pub fn label(self) -> &'static str {
        match self {
            Kind::Ipool => "ipool",
            Kind::HostLocal => "host-local",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Add,
    Del,
}

impl Op {
    pub fn verb(self) -> &'static str {
        match self {
            Op::Add => "ADD",
            Op::Del => "DEL",
        }
    }
}

/// One network of one plugin: its config, and the live attachments the benchmark made in it.
pub struct Net {
    pub kind: Kind,
    pub name: String,
    bin: PathBuf,
    stdin: String,
    pub live: Arc<Live>,
    /// host-local's dataDir (removed when the network is dropped).
    data_dir: Option<tempfile::TempDir>,
}

/// The subnet of ipool network `name` ("bench<n>"): one of its own, since ipoold refuses two
/// networks whose subnets overlap. host-local's networks all use [`SUBNET`] (each has its own
/// dataDir); the sizes match.
pub fn ipool_subnet(name: &str) -> String {
    let n: u32 = name
        .trim_start_matches(|c: char| !c.is_ascii_digit())
        .parse()
        .unwrap_or(0);
    assert!(n < 96, "more bench networks than subnets 10.1-95.0.0/16");
    format!("10.{n}.0.0/16")
}

/// The `ipam` section ipool's config carries (also what gRPC requests send as `ipam_json`).
pub fn ipool_ipam_json(socket: &Path, subnet: &str) -> String {
    let socket = serde_json::Value::String(socket.display().to_string());
    format!(r#"{{"type":"ipool","socket":{socket},"ranges":[[{{"subnet":"{subnet}"}}]]}}"#)
}

impl Net {
    pub fn ipool(bin: &Path, socket: &Path, name: &str) -> Net {
        let ipam = ipool_ipam_json(socket, &ipool_subnet(name));
        Net {
            kind: Kind::Ipool,
            name: name.to_string(),
            bin: bin.to_path_buf(),
            stdin: format!(
                r#"{{"cniVersion":"1.0.0","name":"{name}","type":"bridge","ipam":{ipam}}}"#
            ),
            live: Arc::new(Live::new(format!("ipool network {name}"))),
            data_dir: None,
        }
    }

    /// An ipool network the daemon's config defines (a cluster pool's, say): the netconf
    /// names it and carries no ranges.
    pub fn ipool_configured(bin: &Path, socket: &Path, name: &str) -> Net {
        let socket = serde_json::Value::String(socket.display().to_string());
        Net {
            kind: Kind::Ipool,
            name: name.to_string(),
            bin: bin.to_path_buf(),
            stdin: format!(
                r#"{{"cniVersion":"1.0.0","name":"{name}","type":"bridge","ipam":{{"type":"ipool","socket":{socket}}}}}"#
            ),
            live: Arc::new(Live::new(format!("ipool network {name}"))),
            data_dir: None,
        }
    }

    /// A host-local network with a fresh dataDir of its own.
    pub fn host_local(bin: &Path, name: &str) -> Result<Net> {
        let dir = tempfile::Builder::new()
            .prefix("ipool-bench-host-local-")
            .tempdir()
            .context("creating a dataDir for host-local")?;
        let data = serde_json::Value::String(dir.path().display().to_string());
        Ok(Net {
            kind: Kind::HostLocal,
            name: name.to_string(),
            bin: bin.to_path_buf(),
            stdin: format!(
                r#"{{"cniVersion":"1.0.0","name":"{name}","type":"bridge","ipam":{{"type":"host-local","dataDir":{data},"ranges":[[{{"subnet":"{SUBNET}"}}]]}}}}"#
            ),
            live: Arc::new(Live::new(format!("host-local network {name}"))),
            data_dir: Some(dir),
        })
    }

    /// Where host-local keeps this network's files.
    fn network_dir(&self) -> Result<PathBuf> {
        let dir = self
            .data_dir
            .as_ref()
            .context("only host-local networks have a dataDir")?;
        Ok(dir.path().join(&self.name))
    }

    /// One ADD or DEL for `container`, timed from spawn to exit, with the live-set check.
    pub fn call(&self, op: Op, container: &str) -> Result<Duration> {
        match op {
            Op::Add => {
                let (elapsed, stdout) = self.exec("ADD", container)?;
                let addrs = addresses(&stdout).with_context(|| {
                    format!(
                        "{} ADD {container}: unexpected output {stdout:?}",
                        self.kind.label()
                    )
                })?;
                self.live.added(container, &addrs)?;
                Ok(elapsed)
            }
            Op::Del => {
                self.live.deleting(container);
                Ok(self.exec("DEL", container)?.0)
            }
        }
    }

    /// The VERSION command: what a call costs without any IPAM work.
    pub fn version(&self) -> Result<Duration> {
        Ok(self.exec("VERSION", "version")?.0)
    }

    /// Runs the plugin once; a non-zero exit is an error carrying its output.
    pub fn exec(&self, command: &str, container: &str) -> Result<(Duration, String)> {
        let started = Instant::now();
        let mut child = Command::new(&self.bin)
            .env_clear()
            .env("CNI_COMMAND", command)
            .env("CNI_CONTAINERID", container)
            .env("CNI_NETNS", format!("/var/run/netns/bench-{container}"))
            .env("CNI_IFNAME", "eth0")
            .env("CNI_PATH", "/usr/lib/cni")
            .env(
                "CNI_ARGS",
                format!("IgnoreUnknown=1;K8S_POD_NAMESPACE=bench;K8S_POD_NAME={container}"),
            )
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("cannot exec {}", self.bin.display()))?;
        {
            let mut stdin = child.stdin.take().expect("stdin is piped");
            // A plugin that exits before reading its stdin shows up in its exit status.
            let _ = stdin.write_all(self.stdin.as_bytes());
        }
        let out = child
            .wait_with_output()
            .with_context(|| format!("waiting for {}", self.bin.display()))?;
        let elapsed = started.elapsed();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        if !out.status.success() {
            bail!(
                "{} {command} for {container} on network {} failed ({}):\nstdout: {}\nstderr: {}",
                self.kind.label(),
                self.name,
                out.status,
                stdout.trim(),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok((elapsed, stdout))
    }

    /// Writes host-local's files for `n` attachments straight into its network directory, as
    /// host-local itself would have: one file per address (named by the address, content
    /// "<containerID>\r\n<ifname>") and `last_reserved_ip.0`, which is set to the address of
    /// attachment `last_reserved` (host-local continues after it). Returns (container, address).
    pub fn prefill_host_local(
        &self,
        n: usize,
        last_reserved: usize,
        prefix: &str,
    ) -> Result<Vec<(String, String)>> {
        let dir = self.network_dir()?;
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let mut made = Vec::with_capacity(n);
        for i in 0..n {
            let ip = nth_address(i)?;
            let container = format!("{prefix}{i}");
            let path = dir.join(ip.to_string());
            std::fs::write(&path, format!("{container}\r\neth0"))
                .with_context(|| format!("writing {}", path.display()))?;
            made.push((container, ip.to_string()));
        }
        if n > 0 {
            let path = dir.join("last_reserved_ip.0");
            std::fs::write(&path, nth_address(last_reserved.min(n - 1))?.to_string())
                .with_context(|| format!("writing {}", path.display()))?;
        }
        Ok(made)
    }

    /// The content of one of host-local's files in this network, if it exists.
    fn host_local_file(&self, file: &str) -> Result<Option<String>> {
        let path = self.network_dir()?.join(file);
        match std::fs::read_to_string(&path) {
            Ok(s) => Ok(Some(s)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
        }
    }
}

/// The `i`-th dynamic address of [`SUBNET`].
fn nth_address(i: usize) -> Result<Ipv4Addr> {
    let i = u32::try_from(i).context("address index out of range")?;
    let ip = u32::from(FIRST)
        .checked_add(i)
        .context("address index out of range")?;
    ensure!(
        ip < u32::from(Ipv4Addr::new(10, 97, 0, 0)) - 1,
        "{SUBNET} is full"
    );
    Ok(Ipv4Addr::from(ip))
}

/// The addresses (without prefix length) of a CNI ADD result.
fn addresses(stdout: &str) -> Result<Vec<String>> {
    let v: serde_json::Value = serde_json::from_str(stdout).context("result is not JSON")?;
    let ips = v["ips"].as_array().context("result has no ips")?;
    ips.iter()
        .map(|ip| {
            ip["address"]
                .as_str()
                .map(strip_prefix_len)
                .context("ips[] without address")
        })
        .collect()
}

/// Checks that our idea of host-local's on-disk format is right, with the real binary: a
/// network prefilled with three attachments and `last_reserved_ip.0` at the first makes
/// host-local skip the two others; the file it writes looks like ours; a DEL of a prefilled
/// container removes our file. Returns a one-line description of what was seen.
pub fn verify_host_local_format(bin: &Path) -> Result<String> {
    let net = Net::host_local(bin, "bench-format-check")?;
    let pre = net.prefill_host_local(3, 0, "pre-")?;
    for (c, a) in &pre {
        net.live.added(c, std::slice::from_ref(a))?;
    }
    net.call(Op::Add, "probe")?;
    let want = nth_address(3)?.to_string();
    let got = net
        .host_local_file(&want)?
        .with_context(|| format!("host-local did not write {want} after skipping 3 prefilled addresses (did it reuse one?)"))?;
    ensure!(
        got == "probe\r\neth0",
        "host-local wrote {got:?} into {want}, not \"probe\\r\\neth0\": the prefill format is wrong"
    );
    let last = net.host_local_file("last_reserved_ip.0")?;
    ensure!(
        last.as_deref() == Some(want.as_str()),
        "host-local's last_reserved_ip.0 is {last:?}, expected {want}"
    );
    let victim = &pre[1];
    net.call(Op::Del, &victim.0)?;
    ensure!(
        net.host_local_file(&victim.1)?.is_none(),
        "host-local DEL {} did not remove the prefilled file {}: it does not read our format",
        victim.0,
        victim.1
    );
    net.call(Op::Del, "probe")?;
    Ok(format!(
        "prefilled {}-{} with last_reserved_ip.0={}: host-local's next ADD got {want}, wrote \"probe\\r\\neth0\", and DEL of a prefilled container removed its file",
        pre[0].1, pre[2].1, pre[0].1
    ))
}

/// `threads` threads each run `per_thread` calls of `op` (container IDs from `container`),
/// started together; returns the calls per second over the wall time.
pub fn run_parallel(
    net: &Net,
    op: Op,
    threads: usize,
    per_thread: usize,
    container: impl Fn(usize, usize) -> String + Sync,
) -> Result<f64> {
    let barrier = Barrier::new(threads + 1);
    let (elapsed, results) = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let barrier = &barrier;
                let container = &container;
                s.spawn(move || -> Result<()> {
                    barrier.wait();
                    for k in 0..per_thread {
                        net.call(op, &container(t, k))?;
                    }
                    Ok(())
                })
            })
            .collect();
        barrier.wait();
        let started = Instant::now();
        let results: Vec<Result<()>> = handles
            .into_iter()
            .map(|h| h.join().expect("a plugin thread panicked"))
            .collect();
        (started.elapsed(), results)
    });
    for r in results {
        r?;
    }
    Ok((threads * per_thread) as f64 / elapsed.as_secs_f64())
}
