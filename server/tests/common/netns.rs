//! Network namespaces and interface plugins exec'd as a container runtime does, for the tests
//! that need root (bridge, ptp).
#![allow(dead_code)]

use std::path::Path;
use std::process::Command;

use super::Run;

pub struct Netns(pub String);

impl Netns {
    pub fn new(name: String) -> Netns {
        let ok = Command::new("ip")
            .args(["netns", "add", &name])
            .status()
            .expect("ip netns add");
        assert!(ok.success(), "cannot create netns {name}");
        Netns(name)
    }
    pub fn path(&self) -> String {
        format!("/var/run/netns/{}", self.0)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

pub struct Link(pub String);

impl Drop for Link {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["link", "del", &self.0]).status();
    }
}

/// What a network-namespace test needs that this machine lacks, if anything.
pub fn missing_prerequisite() -> Option<String> {
    if !super::is_root() {
        return Some("needs root".into());
    }
    if !Path::new("/usr/lib/cni/bridge").exists() {
        return Some(
            "needs /usr/lib/cni/bridge (apt-get install containernetworking-plugins)".into(),
        );
    }
    for tool in ["ip", "ping"] {
        let found = Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false);
        if !found {
            return Some(format!("needs {tool}(8) (iproute2, iputils-ping)"));
        }
    }
    None
}

/// Fails the test (never passes it) when namespaces cannot be made here; such tests are
/// `#[ignore]`d with the reason, and CI runs them.
pub fn require_netns() {
    let missing = missing_prerequisite();
    super::require(missing.is_none(), missing.as_deref().unwrap_or_default());
}

/// Execs interface plugin `bin` as a container runtime would, for a container in `ns`, with
/// `plugin_dir` (where ipool is) first on CNI_PATH.
pub fn runtime(bin: &str, cmd: &str, ns: &Netns, conf: &str, plugin_dir: &Path) -> Run {
    let cni_path = format!("{}:/usr/lib/cni", plugin_dir.display());
    let mut child = Command::new(bin)
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .env("CNI_COMMAND", cmd)
        .env("CNI_CONTAINERID", format!("ctr-{}", ns.0))
        .env("CNI_NETNS", ns.path())
        .env("CNI_IFNAME", "eth0")
        .env("CNI_PATH", cni_path)
        .env(
            "CNI_ARGS",
            format!(
                "IgnoreUnknown=1;K8S_POD_NAMESPACE=bridge;K8S_POD_NAME={}",
                ns.0
            ),
        )
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {bin}: {e}"));
    use std::io::Write;
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(conf.as_bytes())
        .expect("write stdin");
    let out = child.wait_with_output().expect("wait for the plugin");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    Run {
        ok: out.status.success(),
        json: serde_json::from_str(&stdout).unwrap_or(serde_json::Value::Null),
        stdout,
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        elapsed: std::time::Duration::ZERO,
    }
}

/// [`runtime`] inside network namespace `node` (as a node of its own would run the plugin:
/// its bridge there), through `ip netns exec`.
pub fn runtime_on(
    node: &Netns,
    bin: &str,
    cmd: &str,
    ns: &Netns,
    conf: &str,
    plugin_dir: &Path,
) -> Run {
    let wrapper = std::env::temp_dir().join(format!("ipool-on-{}-{}", node.0, std::process::id()));
    if !wrapper.exists() {
        std::fs::write(
            &wrapper,
            format!("#!/bin/sh\nexec ip netns exec {} {bin}\n", node.0),
        )
        .expect("write the wrapper");
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755))
            .expect("chmod the wrapper");
    }
    runtime(&wrapper.display().to_string(), cmd, ns, conf, plugin_dir)
}
