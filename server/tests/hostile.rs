//! Hostile callers and careless operators (issue 16), through the real ipoold.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use common::Daemon;

/// Every file and directory under `dir` with a mode other than 0600 (files) or 0700 (dirs).
fn loose_modes(dir: &Path) -> Vec<String> {
    let mut loose = Vec::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(d) = dirs.pop() {
        let mode = std::fs::metadata(&d).expect("stat").permissions().mode() & 0o777;
        if mode != 0o700 {
            loose.push(format!("{} {mode:o}", d.display()));
        }
        for e in std::fs::read_dir(&d).expect("read_dir") {
            let e = e.expect("entry");
            if e.file_type().expect("type").is_dir() {
                dirs.push(e.path());
            } else {
                let mode = e.metadata().expect("stat").permissions().mode() & 0o777;
                if mode != 0o600 {
                    loose.push(format!("{} {mode:o}", e.path().display()));
                }
            }
        }
    }
    loose
}

/// The state names pods and their network namespaces: ipoold keeps it to itself, and brings
/// the state of an older version (0755/0644) to 0700/0600.
#[test]
fn the_state_dir_and_its_files_are_private() {
    let mut d = Daemon::start();
    let run = common::plugin(
        &[
            ("CNI_COMMAND", "ADD"),
            ("CNI_CONTAINERID", "private"),
            ("CNI_NETNS", "/var/run/netns/private"),
            ("CNI_IFNAME", "eth0"),
            ("CNI_PATH", "/opt/cni/bin"),
        ],
        &d.conf("1.0.0", "net", r#""subnet": "10.77.0.0/24""#),
    );
    assert!(run.ok, "{}", run.stdout);
    let loose = loose_modes(&d.state);
    assert!(loose.is_empty(), "{loose:?}");
    assert!(std::fs::read_dir(&d.state).expect("state").count() > 1);

    assert!(d.terminate().success());
    let mut dirs = vec![d.state.clone()];
    while let Some(dir) = dirs.pop() {
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        for e in std::fs::read_dir(&dir).expect("read_dir") {
            let e = e.expect("entry");
            let mode = if e.file_type().expect("type").is_dir() {
                dirs.push(e.path());
                0o755
            } else {
                0o644
            };
            std::fs::set_permissions(e.path(), std::fs::Permissions::from_mode(mode))
                .expect("chmod");
        }
    }
    assert!(!loose_modes(&d.state).is_empty());
    d.spawn();
    let loose = loose_modes(&d.state);
    assert!(loose.is_empty(), "{loose:?}");
}

/// A bearer token sent over plain TCP beyond loopback crosses the network in clear text.
#[test]
fn a_token_without_tls_beyond_loopback_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let token = dir.path().join("token");
    std::fs::write(&token, "0123456789abcdef0123456789abcdef").expect("token");
    let token = token.display().to_string();
    let d = Daemon::prepare(&["--ops-listen", "0.0.0.0:0", "--ops-token-file", &token]);
    let err = d.run_expecting_failure();
    assert!(err.contains("plaintext"), "{err}");
    // On loopback the token is fine without TLS.
    let mut ok = Daemon::prepare(&["--ops-listen", "127.0.0.1:0", "--ops-token-file", &token]);
    ok.spawn();
}
