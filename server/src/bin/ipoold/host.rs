//! The node side of ipoold: what it installs on the host (the plugin, the conflist), the
//! process's limits and permissions, and the heap trimmer.

use anyhow::Context;
use ipool_server::install;
use ipool_server::install::chain::ChainError;
use ipool_server::ipam::Ipam;

/// `ipoold install-cni`.
pub(crate) fn install_cni(
    bin_dir: &std::path::Path,
    plugin: Option<&std::path::Path>,
) -> anyhow::Result<()> {
    let plugin = match plugin {
        Some(p) => p.to_path_buf(),
        None => std::env::current_exe()
            .context("locating ipoold")?
            .with_file_name("ipool"),
    };
    anyhow::ensure!(
        bin_dir.is_dir(),
        "the CNI bin dir {} is not a directory (mount the host's /opt/cni/bin there)",
        bin_dir.display()
    );
    let dest = bin_dir.join("ipool");
    let outcome = install::install_file(&plugin, &dest, 0o755)?;
    eprintln!(
        "ipoold install-cni: {} {}",
        dest.display(),
        match outcome {
            install::Outcome::Written => "installed",
            install::Outcome::Unchanged => "already up to date",
        }
    );
    Ok(())
}

/// Where the conflist goes, from what, for which socket, checked against which bin dir.
#[derive(Clone, Debug)]
pub(crate) struct Conflist {
    pub dir: std::path::PathBuf,
    pub template: std::path::PathBuf,
    pub name: String,
    pub socket: std::path::PathBuf,
    pub bin_dir: std::path::PathBuf,
}

/// The host problem `ipoolctl status` shows while the conflist is not written.
const NOT_WRITTEN: &str = "conflist not written";

impl Conflist {
    /// Writes the conflist from the template once every plugin it names is in the bin dir,
    /// at the highest CNI version they all support; else says why not (Ok(Err)), to be tried
    /// again. A template that is wrong is an error.
    pub(crate) fn write(&self) -> anyhow::Result<Result<install::chain::Chain, ChainError>> {
        let template = &self.template;
        let text = std::fs::read_to_string(template)
            .with_context(|| format!("reading --cni-conflist-template {}", template.display()))?;
        let conflist = install::render_conflist(&text, &self.socket)
            .map_err(|e| anyhow::anyhow!("--cni-conflist-template {}: {e}", template.display()))?;
        let name = &self.name;
        anyhow::ensure!(
            [".conflist", ".conf", ".json"]
                .iter()
                .any(|s| name.ends_with(s))
                && !name.contains('/'),
            "--cni-conf-name {name:?} must be a file name ending in .conflist (or .conf, .json)"
        );
        let mut v: serde_json::Value = serde_json::from_str(&conflist)?;
        let chain = match install::chain::common_version(&v, &self.bin_dir) {
            Ok(chain) => chain,
            Err(why) => return Ok(Err(why)),
        };
        for plugin in &chain.assumed {
            tracing::warn!(%plugin, cni_version = %chain.version, "a plugin of the conflist could not be asked its CNI versions: the template's cniVersion is assumed for it");
        }
        v["cniVersion"] = chain.version.clone().into();
        let text = serde_json::to_string_pretty(&v)? + "\n";
        let dest = self.dir.join(name);
        let outcome = install::install_bytes(&dest, text.as_bytes(), 0o644)
            .with_context(|| format!("writing the conflist {}", dest.display()))?;
        tracing::info!(path = %dest.display(), cni_version = %chain.version, written = outcome == install::Outcome::Written, "CNI conflist in place");
        Ok(Ok(chain))
    }

    /// Writes the conflist now if it can. If a plugin of the chain is missing (flannel's or
    /// the runtime's not installed yet, say), says why (log, `ipoolctl status`) and tries
    /// again every 10 s in the background: the node stays NotReady until then.
    pub(crate) fn write_or_retry(self, ipam: &Ipam) -> anyhow::Result<()> {
        let why = match self.write()? {
            Ok(_) => return Ok(()),
            Err(why) => why,
        };
        tracing::error!(%why, "the CNI conflist is not written: the node's runtime cannot use ipool until it is (tried again every 10 s)");
        ipam.set_host_problem(NOT_WRITTEN, Some(why.to_string()));
        let ipam = ipam.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(std::time::Duration::from_secs(10)).await;
                match self.write() {
                    Ok(Ok(_)) => return ipam.set_host_problem(NOT_WRITTEN, None),
                    Ok(Err(why)) => ipam.set_host_problem(NOT_WRITTEN, Some(why.to_string())),
                    Err(e) => {
                        tracing::error!(error = %format!("{e:#}"), "writing the CNI conflist")
                    }
                }
            }
        });
        Ok(())
    }
}

/// Raises the soft limit on open files to the hard one: each TCP Ops connection holds a
/// descriptor, and the soft default (1 024) is reached long before the hard one.
pub(crate) fn raise_fd_limit() {
    use rustix::process::{getrlimit, setrlimit, Resource};
    let mut limit = getrlimit(Resource::Nofile);
    let was = limit.current;
    if was.is_some() && was != limit.maximum {
        limit.current = limit.maximum;
        match setrlimit(Resource::Nofile, limit) {
            Ok(()) => {
                tracing::debug!(from = ?was, to = ?limit.maximum, "open-file limit raised")
            }
            Err(e) => tracing::warn!(error = %e, "cannot raise the open-file limit"),
        }
    }
}

/// What ipoold writes is its own (umask 077): the state holds pod names and netns paths. The
/// state dir is made, or brought to, 0700 and its files to 0600 (earlier versions made them
/// 0755 and 0644).
pub(crate) fn keep_private(state_dir: &std::path::Path) -> anyhow::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    rustix::process::umask(rustix::fs::Mode::from_raw_mode(0o077));
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(state_dir)
        .with_context(|| format!("creating the state dir {}", state_dir.display()))?;
    let mut dirs = vec![state_dir.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))
            .with_context(|| format!("making {} private (0700)", dir.display()))?;
        let entries = std::fs::read_dir(&dir)
            .with_context(|| format!("reading the state dir {}", dir.display()))?;
        for entry in entries {
            let entry = entry.with_context(|| format!("reading {}", dir.display()))?;
            let kind = entry.file_type()?;
            if kind.is_dir() {
                dirs.push(entry.path());
            } else if kind.is_file() {
                std::fs::set_permissions(entry.path(), std::fs::Permissions::from_mode(0o600))
                    .with_context(|| format!("making {} private (0600)", entry.path().display()))?;
            }
        }
    }
    Ok(())
}

/// How often the heap is trimmed while serving. A DEL, a GC or a leak reclaim frees memory that
/// glibc keeps in its arenas; without a trim a node's RSS stays at its high-water mark. A trim
/// walks the free chunks of a heap of tens of MB and holds an arena's lock while it does, so
/// it is kept rare: every 5 s is soon enough for an RSS that is scraped or read by a person,
/// and keeps the trim off the request path nearly all the time (its duration is logged at
/// trace level). Measured at 65 536 allocations, trimming every 250 ms or every second gave
/// the same RSS.
const HEAP_TRIM_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

/// A thread that trims the heap every [`HEAP_TRIM_EVERY`] (none where there is no trim).
pub(crate) fn spawn_heap_trimmer() {
    if !cfg!(all(target_os = "linux", target_env = "gnu")) {
        return;
    }
    let spawned = std::thread::Builder::new()
        .name("heap-trim".into())
        .spawn(|| loop {
            std::thread::sleep(HEAP_TRIM_EVERY);
            let t = std::time::Instant::now();
            trim_heap();
            tracing::trace!(took = ?t.elapsed(), "heap trimmed");
        });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "cannot start the heap-trim thread; freed memory stays in the allocator");
    }
}

/// Gives the memory glibc's allocator holds free back to the OS (glibc returns it only from
/// the top of the main heap by itself).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
pub(crate) fn trim_heap() {
    // SAFETY: malloc_trim takes no pointers from us; it works on glibc's own free lists under
    // its arena locks and is MT-Safe (malloc_trim(3)), so any thread may call it at any time.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub(crate) fn trim_heap() {}

/// `--metrics-listen`: `IP:PORT`, `[IPv6]:PORT`, or an IPv6 address and a port joined by one
/// colon, as `$(NODE_IP):9655` gives on an IPv6 node (the port is what follows the last colon).
pub(crate) fn parse_listen(v: &str) -> Result<std::net::SocketAddr, String> {
    if let Ok(a) = v.parse() {
        return Ok(a);
    }
    let bad = || format!("{v:?} is not IP:PORT (e.g. 127.0.0.1:9655, [::1]:9655)");
    let (ip, port) = v.rsplit_once(':').ok_or_else(bad)?;
    let ip: std::net::Ipv6Addr = ip.parse().map_err(|_| bad())?;
    let port: u16 = port.parse().map_err(|_| bad())?;
    Ok((ip, port).into())
}

#[cfg(test)]
mod tests;
