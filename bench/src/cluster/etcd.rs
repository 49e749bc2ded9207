//! The benchmark's own etcd (Debian's `etcd-server`): random loopback ports, data in a temp dir,
//! killed when dropped.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

pub struct Etcd {
    dir: tempfile::TempDir,
    pub client_url: String,
    child: Child,
}

fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .context("finding a free loopback port for etcd")?
        .port())
}

impl Etcd {
    /// Starts `bin` and waits until it answers on its client port.
    pub fn start(bin: &Path) -> Result<Etcd> {
        let dir = tempfile::Builder::new()
            .prefix("ipool-bench-etcd-")
            .tempdir()
            .context("creating a temp dir for etcd")?;
        let client_url = format!("http://127.0.0.1:{}", free_port()?);
        let peer_url = format!("http://127.0.0.1:{}", free_port()?);
        let log = std::fs::File::create(dir.path().join("etcd.log")).context("etcd's log")?;
        let child = Command::new(bin)
            .args(["--name", "bench"])
            .arg("--data-dir")
            .arg(dir.path().join("data"))
            .args(["--listen-client-urls", &client_url])
            .args(["--advertise-client-urls", &client_url])
            .args(["--listen-peer-urls", &peer_url])
            .args(["--initial-advertise-peer-urls", &peer_url])
            .args(["--initial-cluster", &format!("bench={peer_url}")])
            .env("ETCD_UNSUPPORTED_ARCH", "")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let mut etcd = Etcd {
            dir,
            client_url,
            child,
        };
        let addr = etcd.client_url.trim_start_matches("http://").to_string();
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(&addr).is_err() {
            if let Some(status) = etcd.child.try_wait().context("waiting for etcd")? {
                bail!("etcd exited ({status}) at its start:\n{}", etcd.log());
            }
            if Instant::now() > deadline {
                bail!("etcd did not listen within 20 s:\n{}", etcd.log());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(etcd)
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("etcd.log")).unwrap_or_default()
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
