//! A real etcd for the tests (Debian's `etcd-server`): started on random loopback ports with
//! its data in a temp dir; stopped and restarted on the same data.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct Etcd {
    pub dir: tempfile::TempDir,
    pub client_url: String,
    peer_url: String,
    /// The member's name, and every member's `name=peer URL`.
    name: String,
    initial_cluster: String,
    /// https with client certificates: the directory of `pki::make`'s files.
    tls: Option<PathBuf>,
    child: Option<Child>,
}

/// The etcd binary, when it is installed.
pub fn etcd_bin() -> Option<PathBuf> {
    let p = PathBuf::from("/usr/bin/etcd");
    p.exists().then_some(p)
}

/// Runs `f` with a store on the etcd at `url` (both on one runtime of its own: a connection
/// lives on the runtime that made it).
pub fn with_store<T, F: std::future::Future<Output = T>>(
    url: &str,
    f: impl FnOnce(ipool_server::cluster::etcd::EtcdStore) -> F,
) -> T {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let s = ipool_server::cluster::etcd::EtcdStore::connect(
            &[url.to_string()],
            ipool_server::cluster::etcd::DEFAULT_PREFIX,
            Duration::from_secs(5),
            None,
        )
        .await
        .expect("connect");
        f(s).await
    })
}

impl Etcd {
    /// Starts an etcd. Tests that call this are `#[ignore]`d with the reason (a fresh machine
    /// has no etcd); run anyway (`--include-ignored`, as CI does) without etcd-server, they
    /// fail here rather than pass.
    pub fn start() -> Etcd {
        Etcd::start_cluster_with(1, None).remove(0)
    }

    /// Starts an etcd that serves https with `pki`'s server certificate (see `pki::make`) and
    /// asks every client for a certificate its CA signed.
    pub fn start_tls(pki: &std::path::Path) -> Etcd {
        Etcd::start_cluster_with(1, Some(pki.to_path_buf())).remove(0)
    }

    /// Starts an etcd cluster of `n` members on loopback.
    pub fn start_cluster(n: usize) -> Vec<Etcd> {
        Etcd::start_cluster_with(n, None)
    }

    fn start_cluster_with(n: usize, tls: Option<PathBuf>) -> Vec<Etcd> {
        super::require(
            etcd_bin().is_some(),
            "needs etcd-server (/usr/bin/etcd): apt-get install etcd-server",
        );
        let scheme = if tls.is_some() { "https" } else { "http" };
        let mut members: Vec<Etcd> = (0..n)
            .map(|i| Etcd {
                dir: tempfile::tempdir().expect("tempdir"),
                client_url: format!("{scheme}://127.0.0.1:{}", super::free_port()),
                peer_url: format!("http://127.0.0.1:{}", super::free_port()),
                name: format!("m{i}"),
                initial_cluster: String::new(),
                tls: tls.clone(),
                child: None,
            })
            .collect();
        let initial = members
            .iter()
            .map(|m| format!("{}={}", m.name, m.peer_url))
            .collect::<Vec<_>>()
            .join(",");
        // Every member is started before any is waited for: a member serves once a quorum
        // of them runs.
        for m in members.iter_mut() {
            m.initial_cluster = initial.clone();
            m.launch();
        }
        for m in &members {
            m.wait_ready();
        }
        if n > 1 {
            for m in &members {
                m.wait_healthy();
            }
        }
        members
    }

    /// Waits until the member says it is healthy (it has a leader): a cluster serves once a
    /// leader is elected. http only.
    fn wait_healthy(&self) {
        let addr = self.client_url.trim_start_matches("http://").to_string();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let healthy = std::panic::catch_unwind(|| super::http_get(&addr, "/health"))
                .is_ok_and(|(status, body)| status.contains("200") && body.contains("true"));
            if healthy {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "etcd member {} has no leader:\n{}",
                self.name,
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Starts (again) on the same data and ports; waits until it answers.
    pub fn spawn(&mut self) {
        self.launch();
        self.wait_ready();
    }

    fn launch(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("etcd.log"))
            .expect("log");
        let mut cmd = Command::new(etcd_bin().expect("etcd"));
        if let Some(pki) = &self.tls {
            cmd.arg("--cert-file")
                .arg(pki.join("server.pem"))
                .arg("--key-file")
                .arg(pki.join("server.key"))
                .arg("--trusted-ca-file")
                .arg(pki.join("ca.pem"))
                .arg("--client-cert-auth");
        }
        let child = cmd
            .args(["--name", &self.name])
            .arg("--data-dir")
            .arg(self.dir.path().join("data"))
            .args(["--listen-client-urls", &self.client_url])
            .args(["--advertise-client-urls", &self.client_url])
            .args(["--listen-peer-urls", &self.peer_url])
            .args(["--initial-advertise-peer-urls", &self.peer_url])
            .args(["--initial-cluster", &self.initial_cluster])
            .env("ETCD_UNSUPPORTED_ARCH", "")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .spawn()
            .expect("spawn etcd");
        self.child = Some(child);
    }

    fn wait_ready(&self) {
        let addr = self
            .client_url
            .split("://")
            .nth(1)
            .expect("a URL")
            .to_string();
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if std::net::TcpStream::connect(&addr).is_ok() {
                // Listening; a moment more for the member to be ready to serve.
                std::thread::sleep(Duration::from_millis(200));
                return;
            }
            assert!(
                Instant::now() < deadline,
                "etcd did not start:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// A copy of etcd's data directory, taken while etcd is stopped (a backup); etcd runs
    /// again.
    pub fn back_up(&mut self) -> tempfile::TempDir {
        self.stop();
        let backup = tempfile::tempdir().unwrap();
        copy_dir(&self.dir.path().join("data"), backup.path());
        self.spawn();
        backup
    }

    /// etcd's data directory replaced by `backup` (etcd stopped): its data copied, so that
    /// its revision goes back to the backup's and writes are numbered again from there.
    pub fn put_back(&self, backup: &tempfile::TempDir) {
        std::fs::remove_dir_all(self.dir.path().join("data")).unwrap();
        copy_dir(&backup.path().join("data"), &self.dir.path().join("data"));
    }

    /// etcd restored from `backup`: stopped, its data put back, started again.
    pub fn restore(&mut self, backup: &tempfile::TempDir) {
        self.stop();
        self.put_back(backup);
        self.spawn();
    }

    /// `ipoolctl cluster` against this etcd.
    pub fn ctl(&self, args: &[&str]) -> std::process::Output {
        Command::new(super::ipoolctl_bin())
            .args(["cluster", "--etcd-endpoints", &self.client_url])
            .args(args)
            .output()
            .expect("run ipoolctl")
    }

    /// An ipoold config for node `node` with network "pods" on cluster pool `pool`; `extra`
    /// goes into `[cluster]` (and may open tables of its own).
    pub fn daemon_config(&self, node: &str, pool: &str, extra: &str) -> String {
        format!(
            r#"
[cni]
add_wait_ms = 5000
[cluster]
etcd_endpoints = ["{}"]
node_name = "{node}"
store_timeout_ms = 500
{extra}
[[network]]
name = "pods"
ranges_from = "cluster"
cluster_pool = "{pool}"
routes = [{{ dst = "0.0.0.0/0" }}]
"#,
            self.client_url
        )
    }

    /// `ipoolctl cluster pool create ARGS...`, which must succeed.
    pub fn create_pool(&self, args: &[&str]) {
        let mut all = vec!["pool", "create"];
        all.extend_from_slice(args);
        let o = self.ctl(&all);
        assert!(o.status.success(), "pool create: {}", super::stderr(&o));
    }

    /// Each block in etcd and its owner, as `ipoolctl cluster blocks` lists them.
    pub fn owners(&self) -> std::collections::BTreeMap<ipnet::IpNet, String> {
        let o = self.ctl(&["-o", "json", "blocks"]);
        assert!(o.status.success(), "blocks: {}", super::stderr(&o));
        super::json(&o)
            .as_array()
            .expect("a list")
            .iter()
            .map(|b| {
                (
                    b["block"].as_str().expect("block").parse().expect("a CIDR"),
                    b["node"].as_str().expect("node").to_string(),
                )
            })
            .collect()
    }

    /// ipoold as node `node` with network "pods" on cluster pool `pool`, started.
    pub fn daemon(&self, node: &str, pool: &str, extra: &str) -> super::Daemon {
        let mut d = super::Daemon::prepare_with_config(&self.daemon_config(node, pool, extra));
        d.spawn();
        d
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("etcd.log")).unwrap_or_default()
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.stop();
    }
}

fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    let ok = std::process::Command::new("cp")
        .arg("-a")
        .arg(from)
        .arg(to)
        .status()
        .expect("cp");
    assert!(ok.success());
}
