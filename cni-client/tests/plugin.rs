//! The real `ipool` binary without a daemon: VERSION, plugin-side errors, and the deadline.
//! (The tests with a daemon are in server/tests; they need this binary built, which this
//! integration test makes `cargo test --workspace` do.)

use std::io::{Read, Write};
use std::os::unix::process::ExitStatusExt;
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

struct Out {
    ok: bool,
    status: ExitStatus,
    json: Value,
    stdout: String,
    elapsed: Duration,
}

/// A plugin still running after this long is killed and the test fails (a plugin that reads
/// without end, or waits on a FIFO, must fail the test, not hang it).
const KILL_AFTER: Duration = Duration::from_secs(5);

fn plugin(env: &[(&str, &str)], stdin: &str) -> Out {
    plugin_bytes(env, stdin.as_bytes().to_vec())
}

fn plugin_bytes(env: &[(&str, &str)], stdin: Vec<u8>) -> Out {
    let started = Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_ipool"))
        .env_clear()
        .envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn ipool");
    let mut input = child.stdin.take().expect("stdin");
    // A plugin that exits before reading all of stdin closes the pipe; that is its business.
    let writer = std::thread::spawn(move || drop(input.write_all(&stdin)));
    let mut output = child.stdout.take().expect("stdout");
    let reader = std::thread::spawn(move || {
        let mut out = Vec::new();
        output.read_to_end(&mut out).map(|_| out)
    });
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if started.elapsed() > KILL_AFTER {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the plugin was still running after {KILL_AFTER:?}");
        }
        std::thread::sleep(Duration::from_millis(2));
    };
    let elapsed = started.elapsed();
    writer.join().expect("stdin writer");
    let stdout = reader.join().expect("stdout reader").expect("read stdout");
    let stdout = String::from_utf8_lossy(&stdout).into_owned();
    let json = if stdout.trim().is_empty() {
        Value::Null
    } else {
        serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {stdout:?}"))
    };
    Out {
        ok: status.success(),
        status,
        json,
        stdout,
        elapsed,
    }
}

fn add_env(cmd: &str) -> Vec<(&str, &str)> {
    vec![
        ("CNI_COMMAND", cmd),
        ("CNI_CONTAINERID", "c1"),
        ("CNI_NETNS", "/var/run/netns/c1"),
        ("CNI_IFNAME", "eth0"),
        ("CNI_PATH", "/usr/lib/cni"),
    ]
}

fn conf(version: &str, socket: &str, extra: &str) -> String {
    format!(
        r#"{{"cniVersion":"{version}","name":"n","type":"bridge","ipam":{{"type":"ipool","subnet":"10.42.0.0/24","socket":"{socket}"{extra}}}}}"#
    )
}

#[test]
fn version_lists_every_supported_version_in_the_asked_version() {
    for v in ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"] {
        let r = plugin(
            &[("CNI_COMMAND", "VERSION")],
            &format!(r#"{{"cniVersion":"{v}"}}"#),
        );
        assert!(r.ok, "{}", r.stdout);
        assert_eq!(r.json["cniVersion"], v);
        assert_eq!(
            r.json["supportedVersions"],
            serde_json::json!(["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"])
        );
    }
}

#[test]
fn absent_daemon_is_error_11_and_status_50() {
    let dir = tempfile::tempdir().expect("tempdir");
    let sock = dir.path().join("absent.sock");
    let sock = sock.to_str().expect("utf8");
    for cmd in ["ADD", "DEL", "CHECK"] {
        let mut c: Value = serde_json::from_str(&conf("1.0.0", sock, "")).expect("json");
        c["prevResult"] = serde_json::json!({"ips": [{"address": "10.42.0.2/24"}]});
        let r = plugin(&add_env(cmd), &c.to_string());
        assert!(!r.ok);
        assert_eq!(r.json["code"], 11, "{cmd}: {}", r.stdout);
        assert!(r.json["details"]
            .as_str()
            .is_some_and(|d| d.contains("absent.sock")));
    }
    let r = plugin(&[("CNI_COMMAND", "STATUS")], &conf("1.1.0", sock, ""));
    assert_eq!(r.json["code"], 50, "{}", r.stdout);
    assert!(r.json["details"]
        .as_str()
        .is_some_and(|d| d.contains("cannot reach ipoold")));
}

#[test]
fn silent_daemon_is_error_11_within_the_deadline() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("silent.sock");
    // Accepts connections (the kernel backlog) but never speaks.
    let _listener = std::os::unix::net::UnixListener::bind(&path).expect("bind");
    let sock = path.to_str().expect("utf8");
    for cmd in ["ADD", "DEL"] {
        let r = plugin(&add_env(cmd), &conf("1.0.0", sock, r#","timeoutMs":300"#));
        assert_eq!(r.json["code"], 11, "{cmd}: {}", r.stdout);
        assert!(
            r.elapsed < Duration::from_secs(5),
            "{cmd} took {:?}: the deadline did not hold",
            r.elapsed
        );
    }
}

#[test]
fn plugin_side_errors_never_reach_the_daemon() {
    let sock = "/nonexistent/never-used.sock";
    type Case<'a> = (Vec<(&'a str, &'a str)>, String, u64);
    let cases: Vec<Case> = vec![
        (vec![], conf("1.0.0", sock, ""), 4),
        (vec![("CNI_COMMAND", "ADD")], conf("1.0.0", sock, ""), 4),
        (add_env("ADD"), "{not json".into(), 6),
        (add_env("ADD"), conf("9.9.9", sock, ""), 1),
        (
            add_env("ADD"),
            r#"{"cniVersion":"1.0.0","name":"n"}"#.into(),
            7,
        ),
        (
            add_env("ADD"),
            conf("1.0.0", sock, r#","timeoutMs":"soon""#),
            7,
        ),
        (
            add_env("ADD"),
            r#"{"cniVersion":"1.0.0","name":"n","ipam":{},"args":{"cni":{"ips":["x"]}}}"#.into(),
            7,
        ),
    ];
    for (env, stdin, code) in cases {
        let r = plugin(&env, &stdin);
        assert!(!r.ok, "{stdin}");
        assert_eq!(r.json["code"], code, "{env:?} {stdin}: {}", r.stdout);
        // Exactly one JSON document on stdout, nothing else.
        assert_eq!(r.stdout.trim().lines().count(), 1);
    }
}

fn details(r: &Out) -> &str {
    r.json["details"].as_str().unwrap_or_default()
}

/// `resolvConf` naming a device or a FIFO: refused at once (code 7, the file named), well
/// within `timeoutMs`; nothing is read from it and no daemon is called.
#[test]
fn resolv_conf_that_is_dev_zero_or_a_silent_fifo_is_refused_in_time() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fifo = dir.path().join("resolv.fifo");
    let made = Command::new("mkfifo").arg(&fifo).status().expect("mkfifo");
    assert!(made.success());
    let fifo = fifo.to_str().expect("utf8");
    for (path, kind) in [("/dev/zero", "character device"), (fifo, "FIFO")] {
        let extra = format!(r#","timeoutMs":300,"resolvConf":"{path}""#);
        let r = plugin(
            &add_env("ADD"),
            &conf("1.0.0", "/nonexistent/ipool.sock", &extra),
        );
        assert_eq!(r.json["code"], 7, "{path}: {}", r.stdout);
        assert!(
            details(&r).contains(path) && details(&r).contains(kind),
            "{}",
            r.stdout
        );
        assert!(
            r.elapsed < Duration::from_millis(1500),
            "{path}: {:?}",
            r.elapsed
        );
    }
}

/// A resolv.conf over 64 KiB is refused with the file and the limit named.
#[test]
fn a_resolv_conf_over_64_kib_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("resolv.conf");
    std::fs::write(&path, "nameserver 10.96.0.10\n".repeat(4096)).expect("write");
    let path = path.to_str().expect("utf8");
    let extra = format!(r#","resolvConf":"{path}""#);
    let r = plugin(
        &add_env("ADD"),
        &conf("1.0.0", "/nonexistent/ipool.sock", &extra),
    );
    assert_eq!(r.json["code"], 7, "{}", r.stdout);
    assert!(
        details(&r).contains(path) && details(&r).contains("64 KiB"),
        "{}",
        r.stdout
    );
}

/// stdin past 1 MiB is refused (code 7, the limit named), not read to its end: here 1 MiB of
/// trailing spaces after a valid config, then 7 MiB more the plugin never reads.
#[test]
fn an_oversized_stdin_is_refused() {
    let mut stdin = conf("1.0.0", "/nonexistent/ipool.sock", "").into_bytes();
    stdin.resize(8 << 20, b' ');
    for cmd in ["ADD", "VERSION"] {
        let r = plugin_bytes(&add_env(cmd), stdin.clone());
        assert_eq!(r.json["code"], 7, "{cmd}: {}", r.stdout);
        assert!(
            details(&r).contains("stdin") && details(&r).contains("1 MiB"),
            "{}",
            r.stdout
        );
    }
}

/// Reads the client's preface and frames up to the end of its request.
fn read_request(s: &mut std::os::unix::net::UnixStream) {
    let mut preface = [0u8; 24];
    s.read_exact(&mut preface).expect("preface");
    loop {
        let mut h = [0u8; 9];
        s.read_exact(&mut h).expect("frame header");
        let len = usize::from(h[0]) << 16 | usize::from(h[1]) << 8 | usize::from(h[2]);
        let mut payload = vec![0u8; len];
        s.read_exact(&mut payload).expect("frame payload");
        // DATA with END_STREAM.
        if h[3] == 0 && h[4] & 1 != 0 {
            return;
        }
    }
}

/// A daemon that hangs up mid-call is error 11, and the plugin exits 1 with its error printed:
/// never killed by SIGPIPE (its C `main` leaves SIGPIPE at its default action, and std's
/// `Command` resets it in the child, as a runtime's exec would find it).
#[test]
fn a_daemon_that_hangs_up_is_error_11_not_sigpipe() {
    use std::net::Shutdown;
    use std::os::unix::net::{UnixListener, UnixStream};
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("hangs-up.sock");
    let listener = UnixListener::bind(&path).expect("bind");
    let sock = path.to_str().expect("utf8");
    // An empty SETTINGS frame: the plugin owes an acknowledgement, so it writes again.
    const SETTINGS: [u8; 9] = [0, 0, 0, 4, 0, 0, 0, 0, 0];
    // Each way returns the connection if it keeps it open until the plugin has exited.
    type HangUp = fn(UnixStream) -> Option<UnixStream>;
    let ways: [(&str, HangUp); 3] = [
        ("closes after the request", |_| None),
        ("sends SETTINGS and closes", |mut s| {
            s.write_all(&SETTINGS).expect("write");
            None
        }),
        // Deterministic: the acknowledgement is written to a socket that no longer reads.
        ("stops reading, then sends SETTINGS", |mut s| {
            s.shutdown(Shutdown::Read).expect("shutdown");
            s.write_all(&SETTINGS).expect("write");
            Some(s)
        }),
    ];
    for (how, hang_up) in ways {
        let l = listener.try_clone().expect("listener");
        let daemon = std::thread::spawn(move || {
            let (mut s, _) = l.accept().expect("accept");
            read_request(&mut s);
            hang_up(s)
        });
        let r = plugin(
            &add_env("ADD"),
            &conf("1.0.0", sock, r#","timeoutMs":3000"#),
        );
        drop(daemon.join().expect("daemon"));
        assert_eq!(r.status.signal(), None, "{how}: killed by a signal");
        assert_eq!(r.status.code(), Some(1), "{how}");
        assert_eq!(r.json["code"], 11, "{how}: {}", r.stdout);
        assert!(details(&r).contains("broke"), "{how}: {}", r.stdout);
    }
}
