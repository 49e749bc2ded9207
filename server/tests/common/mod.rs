//! Test harness: a real `ipoold` on a temp socket and state dir, and the real `ipool` plugin.
#![allow(dead_code)]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

pub mod backend;
pub mod containerd;
pub mod etcd;
pub mod fake_api;
pub mod fixed_pods;
pub mod history;
pub mod load;
pub mod netns;
pub mod pki;
pub mod proxy;

pub fn ipoold_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_ipoold"))
}

pub fn ipoolctl_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_ipoolctl"))
}

/// The plugin binary, built beside ipoold by `cargo test --workspace`.
pub fn plugin_bin() -> PathBuf {
    let p = ipoold_bin().with_file_name("ipool");
    assert!(
        p.exists(),
        "{} is missing: run the tests with `cargo test --workspace` so the plugin is built",
        p.display()
    );
    p
}

/// A --config for tests that GC right after their ADDs: no grace for young attachments.
pub const NO_GC_GRACE: &str = "[cni]\ngc_grace_secs = 0\n";

pub struct Daemon {
    pub dir: tempfile::TempDir,
    pub socket: PathBuf,
    pub state: PathBuf,
    child: Option<Child>,
    extra_args: Vec<String>,
    /// Environment variables ipoold runs with, besides RUST_LOG.
    pub envs: Vec<(String, String)>,
}

impl Daemon {
    pub fn start() -> Daemon {
        Daemon::start_with(&[])
    }

    pub fn start_with(args: &[&str]) -> Daemon {
        let mut d = Daemon::prepare(args);
        d.spawn();
        d
    }

    /// Starts ipoold with `toml` as its --config file (written in the daemon's directory).
    pub fn with_config(toml: &str) -> Daemon {
        let mut d = Daemon::prepare_with_config(toml);
        d.spawn();
        d
    }

    /// [`Daemon::with_config`], not started.
    pub fn prepare_with_config(toml: &str) -> Daemon {
        let mut d = Daemon::prepare(&[]);
        let path = d.dir.path().join("ipoold.toml");
        std::fs::write(&path, toml).expect("write the config");
        d.extra_args = vec!["--config".into(), path.display().to_string()];
        d
    }

    /// More arguments for ipoold.
    pub fn add_args(&mut self, args: &[&str]) {
        self.extra_args.extend(args.iter().map(|s| s.to_string()));
    }

    /// A daemon's directories and arguments, not started.
    pub fn prepare(args: &[&str]) -> Daemon {
        let dir = tempfile::tempdir().expect("tempdir");
        let socket = dir.path().join("run/ipool.sock");
        let state = dir.path().join("state");
        Daemon {
            dir,
            socket,
            state,
            child: None,
            extra_args: args.iter().map(|s| s.to_string()).collect(),
            envs: Vec::new(),
        }
    }

    fn command(&self) -> Command {
        let mut c = Command::new(ipoold_bin());
        c.arg("--socket")
            .arg(&self.socket)
            .arg("--state-dir")
            .arg(&self.state)
            .args(&self.extra_args)
            .env("RUST_LOG", "info")
            .envs(self.envs.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(self.dir.path().join("ipoold.log"))
                    .expect("log file"),
            ));
        c
    }

    /// Starts ipoold and waits until its socket answers.
    pub fn spawn(&mut self) {
        let mut child = self.command().spawn().expect("spawn ipoold");
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if std::os::unix::net::UnixStream::connect(&self.socket).is_ok() {
                break;
            }
            if let Ok(Some(status)) = child.try_wait() {
                panic!("ipoold exited with {status} at start:\n{}", self.log());
            }
            assert!(
                Instant::now() < deadline,
                "ipoold did not serve within 20 s:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        self.child = Some(child);
    }

    /// Runs ipoold in the foreground expecting it to fail; returns its stderr. One still
    /// running after 30 s (it started) is killed, and the test fails.
    pub fn run_expecting_failure(&self) -> String {
        let mut child = self
            .command()
            .stderr(Stdio::piped())
            .spawn()
            .expect("run ipoold");
        let deadline = Instant::now() + Duration::from_secs(30);
        while child.try_wait().expect("wait for ipoold").is_none() {
            if Instant::now() > deadline {
                let _ = child.kill();
                let out = child.wait_with_output().expect("ipoold's stderr");
                panic!(
                    "ipoold was expected to refuse to start, and runs:\n{}",
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let out = child.wait_with_output().expect("ipoold's stderr");
        assert!(
            !out.status.success(),
            "ipoold was expected to refuse to start"
        );
        String::from_utf8_lossy(&out.stderr).into_owned()
    }

    /// The running ipoold's process ID.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            c.kill().expect("kill -9");
            c.wait().expect("wait");
        }
    }

    /// SIGTERM; returns the exit status.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        let mut c = self.child.take().expect("running");
        let ok = Command::new("kill")
            .arg("-TERM")
            .arg(c.id().to_string())
            .status()
            .expect("kill -TERM");
        assert!(ok.success());
        c.wait().expect("wait")
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("ipoold.log")).unwrap_or_default()
    }

    /// The log once it has a line with every one of `needles` (ipoold writes its lines when its
    /// runtime goes idle, which can be just after the reply); panics after 10 s.
    pub fn wait_log(&self, needles: &[&str]) -> String {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let log = self.log();
            if log.lines().any(|l| needles.iter().all(|n| l.contains(n))) {
                return log;
            }
            assert!(
                Instant::now() < deadline,
                "no log line with all of {needles:?} within 10 s:\n{log}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn ctl(&self, args: &[&str]) -> Output {
        Command::new(ipoolctl_bin())
            .arg("--socket")
            .arg(&self.socket)
            .args(args)
            .output()
            .expect("run ipoolctl")
    }

    /// A network config whose ipam section points at this daemon.
    pub fn conf(&self, version: &str, name: &str, ipam_extra: &str) -> String {
        conf(version, name, &self.socket, ipam_extra)
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.kill9();
    }
}

pub fn conf(version: &str, name: &str, socket: &Path, ipam_extra: &str) -> String {
    let sep = if ipam_extra.is_empty() { "" } else { "," };
    format!(
        r#"{{"cniVersion":"{version}","name":"{name}","type":"bridge","ipam":{{"type":"ipool","socket":"{}"{sep}{ipam_extra}}}}}"#,
        socket.display()
    )
}

/// True when the tests run as root (mounts, namespaces, other uids).
/// A test that needs what a fresh machine may lack (root, etcd, libfaketime, Debian's CNI
/// plugins) is `#[ignore = "needs ..."]`: the plain `cargo test` lists it as ignored, and
/// `cargo test -- --include-ignored` (CI) runs it. Run without what it needs, it fails here,
/// naming what is missing: a test that cannot run never counts as passed.
pub fn require(have: bool, need: &str) {
    assert!(have, "this test {need}; it cannot run on this machine");
}

pub fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .map(|s| {
            s.lines()
                .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0"))
        })
        .unwrap_or(false)
}

/// Result of one plugin run.
#[derive(Debug)]
pub struct Run {
    pub ok: bool,
    pub json: Value,
    pub stdout: String,
    pub stderr: String,
    pub elapsed: Duration,
}

impl Run {
    pub fn code(&self) -> u64 {
        self.json["code"].as_u64().unwrap_or(0)
    }
    pub fn addresses(&self) -> Vec<String> {
        self.json["ips"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|ip| ip["address"].as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// Executes the plugin with `env` (CNI_* and more) and `stdin`.
pub fn plugin(env: &[(&str, &str)], stdin: &str) -> Run {
    let started = Instant::now();
    let mut child = Command::new(plugin_bin())
        .env_clear()
        .envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn ipool");
    // A plugin that exits before reading stdin closes the pipe; that is its business.
    let _ = child
        .stdin
        .take()
        .expect("stdin")
        .write_all(stdin.as_bytes());
    let out = child.wait_with_output().expect("wait ipool");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let json = if stdout.trim().is_empty() {
        Value::Null
    } else {
        serde_json::from_str(&stdout)
            .unwrap_or_else(|e| panic!("plugin stdout is not JSON ({e}): {stdout:?}"))
    };
    Run {
        ok: out.status.success(),
        json,
        stdout,
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        elapsed: started.elapsed(),
    }
}

/// ADD/DEL/CHECK for a container with the usual env.
pub fn cni(cmd: &str, container: &str, stdin: &str) -> Run {
    cni_with_args(
        cmd,
        container,
        &format!("IgnoreUnknown=1;K8S_POD_NAMESPACE=test;K8S_POD_NAME={container}"),
        stdin,
    )
}

/// [`cni`] with `args` as CNI_ARGS.
pub fn cni_with_args(cmd: &str, container: &str, args: &str, stdin: &str) -> Run {
    let netns = format!("/var/run/netns/{container}");
    plugin(
        &[
            ("CNI_COMMAND", cmd),
            ("CNI_CONTAINERID", container),
            ("CNI_NETNS", &netns),
            ("CNI_IFNAME", "eth0"),
            ("CNI_PATH", "/usr/lib/cni"),
            ("CNI_ARGS", args),
        ],
        stdin,
    )
}

/// A CHECK config: `conf` with `prevResult` set to an earlier ADD's output.
pub fn with_prev(conf: &str, prev: &Value) -> String {
    let mut v: Value = serde_json::from_str(conf).expect("conf json");
    v["prevResult"] = prev.clone();
    v.to_string()
}

// --- for the Ops tests (ops_*.rs): ipoolctl's output, and a free port ---

/// ipoolctl's exit code.
pub fn code(o: &Output) -> i32 {
    o.status.code().expect("ipoolctl exited")
}

/// ipoolctl's stdout as JSON; ipoolctl must have succeeded.
pub fn json(o: &Output) -> Value {
    assert!(o.status.success(), "ipoolctl failed: {o:?}");
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {o:?}"))
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The first address of an ADD, without its prefix length.
pub fn ip_of(run: &Run) -> String {
    run.addresses()[0]
        .split('/')
        .next()
        .expect("ip")
        .to_string()
}

/// Waits up to `secs` for `f` to give Some; panics with `what` (and the last value seen).
pub fn eventually<T, U: std::fmt::Debug>(
    secs: u64,
    what: &str,
    mut f: impl FnMut() -> Result<T, U>,
) -> T {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        match f() {
            Ok(v) => return v,
            Err(last) if Instant::now() > deadline => {
                panic!("{what}: not within {secs} s; last: {last:?}")
            }
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

/// A loopback TCP port that was free a moment ago.
/// ADD of `container` until it succeeds, for up to `secs`.
pub fn add_within(secs: u64, what: &str, container: &str, conf: &str) -> Run {
    eventually(secs, what, || {
        let r = cni("ADD", container, conf);
        match r.ok {
            true => Ok(r),
            false => Err(r),
        }
    })
}

/// ADDs (containers `n1`, `n2`, ..., each DELeted again) until one gets an address of each
/// family: a family added to a pool is served once `d`'s node has heard of it.
#[allow(dead_code)]
pub fn add_until_both_families(d: &Daemon, conf: &str) -> Run {
    for n in 1..100 {
        let r = add_within(20, "an ADD after the family came", &format!("n{n}"), conf);
        if r.addresses().len() == 2 {
            return r;
        }
        assert!(cni("DEL", &format!("n{n}"), conf).ok);
        std::thread::sleep(Duration::from_millis(200));
    }
    panic!("no ADD got both families\n{}", d.log());
}

/// `ipoolctl status -o json`: one entry per pool (network and family).
pub fn pool_status(d: &Daemon) -> Vec<Value> {
    let o = d.ctl(&["-o", "json", "status"]);
    assert!(o.status.success(), "status: {}", stderr(&o));
    json(&o).as_array().cloned().unwrap_or_default()
}

/// A loopback port nothing listens on, for a child (etcd, a daemon's metrics) to listen on.
/// It lies below the kernel's range of ephemeral ports: a port of that range may go to an
/// outgoing connection between this check and the child's bind (CI once lost an etcd to
/// "address already in use" so). One test process never gets the same port twice; processes
/// start at different places (by pid).
pub fn free_port() -> u16 {
    use std::sync::Mutex;
    static NEXT: Mutex<Option<u16>> = Mutex::new(None);
    const LOW: u16 = 10_000;
    let high = ephemeral_low().max(LOW + 1_000);
    let span = u32::from(high - LOW);
    let mut next = NEXT.lock().unwrap_or_else(|e| e.into_inner());
    let mut port = next.unwrap_or(LOW + (std::process::id().wrapping_mul(7_919) % span) as u16);
    for _ in 0..span {
        let candidate = port;
        port = if port + 1 >= high { LOW } else { port + 1 };
        if std::net::TcpListener::bind(("127.0.0.1", candidate)).is_ok() {
            *next = Some(port);
            return candidate;
        }
    }
    panic!("no free loopback port in {LOW}..{high}");
}

/// The first ephemeral port (`net.ipv4.ip_local_port_range`; Linux's default when unreadable).
fn ephemeral_low() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(32_768)
}

/// GET over plain HTTP/1.1; returns (status line, body).
pub fn http_get(addr: &str, path: &str) -> (String, String) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).expect("connect metrics");
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .expect("write");
    let mut raw = String::new();
    s.read_to_string(&mut raw).expect("read");
    let (head, body) = raw.split_once("\r\n\r\n").expect("http response");
    (
        head.lines().next().expect("status").to_string(),
        body.to_string(),
    )
}

/// Sample lines of an OpenMetrics text body: "name{labels}" -> value.
pub fn samples(body: &str) -> std::collections::HashMap<String, f64> {
    body.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| {
            let (k, v) = l.rsplit_once(' ')?;
            Some((k.to_string(), v.parse().ok()?))
        })
        .collect()
}

/// Runs Debian's host-local (/usr/lib/cni/host-local) on network `name` with `ipam` (its type
/// and `dataDir` set here), for container `cid`'s eth0.
pub fn host_local_on(name: &str, cmd: &str, cid: &str, ipam: &Value, data_dir: &Path) -> Run {
    let mut ipam = ipam.clone();
    ipam["type"] = serde_json::json!("host-local");
    ipam["dataDir"] = serde_json::json!(data_dir);
    let conf =
        serde_json::json!({"cniVersion": "1.0.0", "name": name, "type": "bridge", "ipam": ipam});
    let out = std::process::Command::new("/usr/lib/cni/host-local")
        .env_clear()
        .env("CNI_COMMAND", cmd)
        .env("CNI_CONTAINERID", cid)
        .env("CNI_NETNS", "/var/run/netns/x")
        .env("CNI_IFNAME", "eth0")
        .env("CNI_PATH", "/usr/lib/cni")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            use std::io::Write;
            c.stdin
                .take()
                .expect("stdin")
                .write_all(conf.to_string().as_bytes())?;
            c.wait_with_output()
        })
        .expect("host-local");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    Run {
        ok: out.status.success(),
        json: serde_json::from_str(&stdout).unwrap_or(Value::Null),
        stdout,
        stderr: String::new(),
        elapsed: std::time::Duration::ZERO,
    }
}
