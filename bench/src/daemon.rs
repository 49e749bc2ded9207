//! An `ipoold` of the benchmark's own: temp socket, temp state dir, killed when dropped (also on
//! an error or a panic).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

pub struct Daemon {
    dir: tempfile::TempDir,
    bin: PathBuf,
    config: Option<PathBuf>,
    /// More arguments for ipoold.
    extra: Vec<String>,
    pub socket: PathBuf,
    /// Where ipoold serves /metrics (loopback, a port free when it started).
    metrics: std::net::SocketAddr,
    child: Option<Child>,
}

/// What the group commit has done, from ipoold's /metrics.
#[derive(Clone, Copy, Debug, Default)]
pub struct CommitCounters {
    pub writes: f64,
    pub flushes: f64,
}

impl Daemon {
    /// Starts ipoold and waits until its socket accepts a connection.
    pub fn start(bin: &Path, config: Option<&Path>) -> Result<Daemon> {
        Daemon::start_with(bin, config, &[])
    }

    /// [`Daemon::start`] with more arguments.
    pub fn start_with(bin: &Path, config: Option<&Path>, extra: &[String]) -> Result<Daemon> {
        let dir = tempfile::Builder::new()
            .prefix("ipool-bench-")
            .tempdir()
            .context("creating a temp dir for ipoold")?;
        let metrics = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .context("finding a free loopback port for ipoold's metrics")?;
        let mut d = Daemon {
            metrics,
            socket: dir.path().join("ipool.sock"),
            dir,
            bin: bin.to_path_buf(),
            config: config.map(Path::to_path_buf),
            extra: extra.to_vec(),
            child: None,
        };
        d.spawn()?;
        d.wait_serving(Duration::from_secs(60))?;
        Ok(d)
    }

    /// Spawns ipoold on this daemon's socket and state dir; does not wait.
    pub fn spawn(&mut self) -> Result<()> {
        if self.child.is_some() {
            bail!("ipoold is already running");
        }
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())
            .context("opening ipoold's log file")?;
        let mut cmd = Command::new(&self.bin);
        cmd.arg("--socket")
            .arg(&self.socket)
            .arg("--state-dir")
            .arg(self.dir.path().join("state"))
            .arg("--metrics-listen")
            .arg(self.metrics.to_string())
            // Its default log level (info: one line per request), as an operator runs it.
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log));
        if let Some(c) = &self.config {
            cmd.arg("--config").arg(c);
        }
        cmd.args(&self.extra);
        let child = cmd
            .spawn()
            .with_context(|| format!("cannot start {}", self.bin.display()))?;
        self.child = Some(child);
        Ok(())
    }

    /// Waits until the socket accepts a connection; an early exit is an error with the log.
    pub fn wait_serving(&mut self, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            if std::os::unix::net::UnixStream::connect(&self.socket).is_ok() {
                return Ok(());
            }
            self.check_alive()?;
            if Instant::now() > deadline {
                bail!(
                    "ipoold did not accept connections on {} within {timeout:?}; its log:\n{}",
                    self.socket.display(),
                    self.log()
                );
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// An error (with the log) if ipoold has exited.
    pub fn check_alive(&mut self) -> Result<()> {
        let child = self.child.as_mut().context("ipoold is not running")?;
        if let Some(status) = child.try_wait().context("waiting for ipoold")? {
            self.child = None;
            bail!("ipoold exited with {status}; its log:\n{}", self.log());
        }
        Ok(())
    }

    /// SIGKILL, and reap.
    pub fn kill9(&mut self) -> Result<()> {
        if let Some(mut c) = self.child.take() {
            c.kill().context("SIGKILL to ipoold")?;
            c.wait().context("reaping ipoold")?;
        }
        Ok(())
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// VmRSS of the running daemon, in KiB.
    pub fn rss_kib(&self) -> Result<u64> {
        let pid = self.pid().context("ipoold is not running")?;
        let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
            .with_context(|| format!("reading /proc/{pid}/status"))?;
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .context("no VmRSS line in /proc/<pid>/status")
    }

    /// CPU time the daemon has used so far (user + system, all threads), from /proc/PID/stat.
    pub fn cpu_time(&self) -> Result<Duration> {
        let pid = self.pid().context("ipoold is not running")?;
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .with_context(|| format!("reading /proc/{pid}/stat"))?;
        // Fields after the command (which may contain spaces) start at state, field 3;
        // utime and stime are fields 14 and 15, in clock ticks.
        let rest = stat
            .rsplit_once(')')
            .map(|(_, r)| r)
            .context("malformed /proc/<pid>/stat")?;
        let f: Vec<&str> = rest.split_whitespace().collect();
        let ticks = |i: usize| -> Result<u64> {
            f.get(i)
                .and_then(|v| v.parse().ok())
                .context("malformed /proc/<pid>/stat")
        };
        let total = ticks(11)? + ticks(12)?;
        Ok(Duration::from_secs_f64(
            total as f64 / clock_ticks_per_second(),
        ))
    }

    /// Durable writes and flushes so far (`ipool_store_commits_total`, the flush histogram's
    /// count).
    pub fn commit_counters(&self) -> Result<CommitCounters> {
        use std::io::{Read, Write};
        let mut conn = std::net::TcpStream::connect(self.metrics)
            .with_context(|| format!("connecting to ipoold's metrics at {}", self.metrics))?;
        conn.set_read_timeout(Some(Duration::from_secs(10)))?;
        write!(
            conn,
            "GET /metrics HTTP/1.0\r\nHost: {}\r\n\r\n",
            self.metrics
        )?;
        let mut text = String::new();
        conn.read_to_string(&mut text)
            .context("reading ipoold's /metrics")?;
        let value = |name: &str| -> Result<f64> {
            text.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
                .and_then(|v| v.trim().parse().ok())
                .with_context(|| format!("no {name} in ipoold's /metrics"))
        };
        Ok(CommitCounters {
            writes: value("ipool_store_commits_total")?,
            flushes: value("ipool_store_flush_duration_seconds_count")?,
        })
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("ipoold.log")
    }

    /// The log written since byte `from`, and where it ends now.
    pub fn log_since(&self, from: u64) -> (String, u64) {
        use std::io::{Read, Seek, SeekFrom};
        let mut text = String::new();
        let Ok(mut f) = std::fs::File::open(self.log_path()) else {
            return (text, from);
        };
        if f.seek(SeekFrom::Start(from)).is_err() {
            return (text, from);
        }
        let n = f.read_to_string(&mut text).unwrap_or(0) as u64;
        (text, from + n)
    }

    /// The whole log so far.
    pub fn full_log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    pub fn log(&self) -> String {
        let text = std::fs::read_to_string(self.log_path()).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// USER_HZ: what /proc/PID/stat counts CPU time in (`getconf CLK_TCK`; 100 on Linux unless
/// told otherwise).
fn clock_ticks_per_second() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100.0)
}
