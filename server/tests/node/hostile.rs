//! Hostile callers and careless operators, through the real ipoold.

use crate::common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use crate::common::Daemon;

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
    let run = common::cni(
        "ADD",
        "private",
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

/// Open socket descriptors of process `pid` (not its epoll and event fds, which a runtime
/// starting on another thread adds meanwhile).
fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("/proc/pid/fd")
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|target| target.to_string_lossy().starts_with("socket:"))
        .count()
}

/// An unprivileged flood of idle TCP connections: the daemon holds at most 256 of them, closes
/// the ones that send nothing, keeps its open-file limit at the hard one, and the Unix socket
/// serves ADDs throughout.
#[test]
fn idle_tcp_connections_are_capped_and_closed_while_the_socket_serves() {
    let port = common::free_port();
    let addr = format!("127.0.0.1:{port}");
    let d = Daemon::start_with(&["--ops-listen", &addr]);
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", d.pid())).expect("limits");
    let files = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .expect("Max open files");
    let v: Vec<&str> = files.split_whitespace().collect();
    assert_eq!(v[3], v[4], "soft limit raised to the hard one: {files}");

    let before = open_fds(d.pid());
    let mut flood = Vec::new();
    // 300: past the cap, within the cap and the listen backlog (128), so that no connect
    // waits for the kernel to retry its SYN.
    for _ in 0..300 {
        flood.push(std::net::TcpStream::connect(&addr).expect("connect"));
    }
    // The daemon takes them in until it holds 256 (give it 10 s), and then no more. (Its other
    // descriptors may move by one or two meanwhile.)
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while open_fds(d.pid()).saturating_sub(before) < 254 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    std::thread::sleep(std::time::Duration::from_millis(500));
    let held = open_fds(d.pid()).saturating_sub(before);
    assert!(
        (254..=257).contains(&held),
        "the daemon holds {held} TCP connections"
    );

    let run = common::cni(
        "ADD",
        "flooded",
        &d.conf("1.0.0", "net", r#""subnet": "10.78.0.0/24""#),
    );
    assert!(
        run.ok,
        "the CNI path answers during the flood: {}",
        run.stdout
    );

    // Connections that send nothing are closed (after 20 s without a byte).
    let first = &mut flood[0];
    first
        .set_read_timeout(Some(std::time::Duration::from_secs(60)))
        .expect("timeout");
    let mut buf = [0u8; 64];
    let started = std::time::Instant::now();
    let closed = loop {
        match std::io::Read::read(first, &mut buf) {
            Ok(0) | Err(_) => break true,
            Ok(_) => {} // the server's SETTINGS or GOAWAY
        }
        if started.elapsed() > std::time::Duration::from_secs(59) {
            break false;
        }
    };
    assert!(closed, "an idle connection stays open");
    assert!(
        started.elapsed() < std::time::Duration::from_secs(59),
        "closed only by the test's own timeout"
    );
    // The slots come free for the ones waiting in the backlog, and then for new clients.
    drop(flood);
    let out = d.ctl(&["--addr", &addr, "status"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// ipoolctl as uid/gid 65534 on this daemon's socket.
fn ctl_as_nobody(d: &Daemon, args: &[&str]) -> std::process::Output {
    std::process::Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(common::ipoolctl_bin())
        .arg("--socket")
        .arg(&d.socket)
        .args(args)
        .output()
        .expect("setpriv ipoolctl")
}

/// A socket whose mode was loosened lets anyone read, but only root, ipoold's uid or the
/// `--socket-group` release, reserve or drain.
#[test]
#[ignore = "needs root (to run ipoolctl as another user); CI runs it with --include-ignored"]
fn mutating_ops_calls_on_the_socket_need_root_or_the_socket_group() {
    common::require(
        common::is_root(),
        "needs root (to run ipoolctl as another user)",
    );
    let d = Daemon::start();
    std::fs::set_permissions(&d.socket, std::fs::Permissions::from_mode(0o666)).expect("chmod");
    let read = ctl_as_nobody(&d, &["status"]);
    assert!(read.status.success(), "{read:?}");
    let drain = ctl_as_nobody(&d, &["drain"]);
    assert!(!drain.status.success(), "{drain:?}");
    let err = String::from_utf8_lossy(&drain.stderr);
    assert!(err.contains("uid 65534") && err.contains("root"), "{err}");
    // Nothing was drained.
    let status = d.ctl(&["status", "-o", "json"]);
    assert!(status.status.success());
    let ok = ctl_as_nobody(&d, &["drain", "--undo"]);
    assert!(!ok.status.success(), "undrain is a change too: {ok:?}");

    // The operators' group may.
    let g = Daemon::start_with(&["--socket-group", "65534"]);
    let meta = std::fs::metadata(&g.socket).expect("socket");
    use std::os::unix::fs::MetadataExt;
    assert_eq!((meta.mode() & 0o777, meta.gid()), (0o660, 65534));
    let drain = ctl_as_nobody(&g, &["drain"]);
    assert!(drain.status.success(), "{drain:?}");
}

/// `ipoolctl ... | head`: the reader going away ends ipoolctl quietly, never with a panic.
#[test]
fn ipoolctl_into_a_closed_pipe_ends_quietly() {
    let d = Daemon::start();
    let err = d.dir.path().join("ctl.err");
    for cmd in ["status", "list", "reservations"] {
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(r#""$0" --socket "$1" "$2" 2>"$3" | true"#)
            .arg(common::ipoolctl_bin())
            .arg(&d.socket)
            .arg(cmd)
            .arg(&err)
            .output()
            .expect("sh");
        assert!(out.status.success(), "{out:?}");
        let stderr = std::fs::read_to_string(&err).expect("stderr");
        assert!(!stderr.contains("panicked"), "{cmd}: {stderr}");
    }
}

/// Unread Watch streams are bounded: one peer address may hold 8 over TCP; the 9th is refused
/// at once, naming the limit, and the CNI path serves throughout.
#[test]
fn watch_streams_over_tcp_are_bounded_per_peer() {
    let port = common::free_port();
    let addr = format!("127.0.0.1:{port}");
    let d = Daemon::start_with(&["--ops-listen", &addr]);
    let watch = || {
        std::process::Command::new(common::ipoolctl_bin())
            .args(["--addr", &addr, "watch"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("ipoolctl watch")
    };
    let mut held: Vec<_> = (0..8).map(|_| watch()).collect();
    std::thread::sleep(std::time::Duration::from_secs(1));
    for w in &mut held {
        assert!(
            w.try_wait().expect("wait").is_none(),
            "a watcher ended early"
        );
    }
    let mut ninth = watch();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let status = loop {
        if let Some(s) = ninth.try_wait().expect("wait") {
            break s;
        }
        if std::time::Instant::now() > deadline {
            let _ = ninth.kill();
            panic!("a 9th Watch stream from one address was served");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    assert!(!status.success());
    let mut err = String::new();
    std::io::Read::read_to_string(&mut ninth.stderr.take().expect("stderr"), &mut err)
        .expect("read");
    assert!(err.contains("Watch streams"), "{err}");
    let run = common::cni(
        "ADD",
        "watched",
        &d.conf("1.0.0", "net", r#""subnet": "10.79.0.0/24""#),
    );
    assert!(run.ok, "{}", run.stdout);
    for mut w in held {
        let _ = w.kill();
        let _ = w.wait();
    }
}
