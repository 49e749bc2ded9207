//! Faults of the environment, with real filesystems and a real clock step: a tmpfs that fills
//! up, an ext4 loop device forced read-only, files damaged or removed between a `kill -9` and
//! the restart, the wall clock stepped by libfaketime. After each: what clients were told is
//! what the store holds after a restart, and nothing is held twice.
//!
//! Mounting needs root (and mount(8), losetup(8), mkfs.ext4(8)); the clock test needs
//! libfaketime (Debian's `faketime`). Without them those tests say so and pass; CI runs as root
//! and installs them.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::common::*;
use serde_json::Value;

fn have(tool: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .output()
        .is_ok_and(|o| o.status.success())
}

fn run(cmd: &str, args: &[&str]) -> std::process::Output {
    let out = Command::new(cmd)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{cmd}: {e}"));
    assert!(
        out.status.success(),
        "{cmd} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// A filesystem mounted for one test; unmounted (and its loop device freed) on drop.
struct Mount {
    _dir: tempfile::TempDir,
    at: PathBuf,
    loop_dev: Option<String>,
}

impl Mount {
    fn tmpfs(size: &str) -> Mount {
        let dir = tempfile::tempdir().expect("tempdir");
        let at = dir.path().join("fs");
        std::fs::create_dir(&at).expect("mkdir");
        let opts = format!("size={size}");
        run("mount", &["-t", "tmpfs", "-o", &opts, "tmpfs", path(&at)]);
        Mount {
            _dir: dir,
            at,
            loop_dev: None,
        }
    }

    /// A fresh ext4 filesystem on a loop device, mounted with errors=remount-ro.
    fn ext4(mib: u64) -> Mount {
        let dir = tempfile::tempdir().expect("tempdir");
        let image = dir.path().join("ext4.img");
        let f = std::fs::File::create(&image).expect("image");
        f.set_len(mib << 20).expect("size the image");
        run("mkfs.ext4", &["-q", "-F", path(&image)]);
        let out = run("losetup", &["-f", "--show", path(&image)]);
        let dev = String::from_utf8_lossy(&out.stdout).trim().to_string();
        let at = dir.path().join("fs");
        std::fs::create_dir(&at).expect("mkdir");
        let m = Mount {
            _dir: dir,
            at,
            loop_dev: Some(dev),
        };
        m.mount_ext4();
        m
    }

    fn mount_ext4(&self) {
        let dev = self.loop_dev.as_deref().expect("a loop device");
        run("mount", &["-o", "errors=remount-ro", dev, path(&self.at)]);
    }

    /// The name under /sys/fs/ext4/ of the loop device.
    fn sys_name(&self) -> String {
        let dev = self.loop_dev.as_deref().expect("a loop device");
        dev.trim_start_matches("/dev/").to_string()
    }

    fn unmount(&self) {
        let _ = Command::new("umount").arg(&self.at).status();
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.at).status();
        if let Some(dev) = &self.loop_dev {
            let _ = Command::new("losetup").args(["-d", dev]).status();
        }
    }
}

fn path(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

/// A daemon whose state directory is `state` (a mounted filesystem, or a copy).
fn daemon_on(state: &Path, toml: &str) -> Daemon {
    let mut d = Daemon::prepare_with_config(toml);
    d.state = state.to_path_buf();
    d
}

/// What the daemon holds: container ID -> addresses.
fn held(d: &Daemon) -> BTreeMap<String, Vec<String>> {
    let out = d.ctl(&["list", "-o", "json"]);
    assert!(out.status.success(), "ipoolctl list: {out:?}");
    let v: Value = serde_json::from_slice(&out.stdout).expect("list json");
    v.as_array()
        .expect("an array")
        .iter()
        .map(|a| {
            let addrs = a["addresses"]
                .as_array()
                .expect("addresses")
                .iter()
                .map(|x| x.as_str().expect("address").to_string())
                .collect();
            (a["containerID"].as_str().expect("id").to_string(), addrs)
        })
        .collect()
}

/// What clients were told: the ADDs answered with an address, by container.
#[derive(Default)]
struct Told {
    ok: BTreeMap<String, Vec<String>>,
    failed: BTreeSet<String>,
}

impl Told {
    fn add(&mut self, container: &str, conf: &str) -> Run {
        let r = cni("ADD", container, conf);
        if r.ok {
            let addrs = r
                .addresses()
                .iter()
                .map(|a| a.split('/').next().expect("ip").to_string())
                .collect();
            self.ok.insert(container.to_string(), addrs);
        } else {
            self.failed.insert(container.to_string());
        }
        r
    }

    /// The store after a restart holds exactly what was acknowledged, each address once.
    fn matches(&self, d: &Daemon) {
        let now = held(d);
        assert_eq!(
            now, self.ok,
            "held after the restart differs from what ADDs were answered"
        );
        let mut seen = BTreeSet::new();
        for ip in now.values().flatten() {
            assert!(seen.insert(ip.clone()), "{ip} is held twice: {now:?}");
        }
        for c in &self.failed {
            assert!(
                !now.contains_key(c),
                "{c} was answered an error but is held"
            );
        }
    }
}

fn status(conf: &str) -> Run {
    plugin(&[("CNI_COMMAND", "STATUS")], conf)
}

/// gRPC health of the daemon's socket ("" service).
fn serving(d: &Daemon) -> bool {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::health_client::HealthClient;
    use tonic_health::pb::HealthCheckRequest;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let socket = d.socket.clone();
    rt.block_on(async {
        let channel =
            tonic::transport::Endpoint::from_shared(format!("unix://{}", socket.display()))
                .expect("endpoint")
                .connect()
                .await
                .expect("connect");
        let s = HealthClient::new(channel)
            .check(HealthCheckRequest {
                service: String::new(),
            })
            .await
            .expect("health check")
            .into_inner()
            .status;
        s == ServingStatus::Serving as i32
    })
}

fn wait_until(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !done() {
        assert!(Instant::now() < deadline, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Fills the filesystem at `dir` with one file; returns it.
fn fill(dir: &Path) -> PathBuf {
    use std::io::Write;
    let p = dir.join("filler");
    let mut f = std::fs::File::create(&p).expect("filler");
    let block = vec![0xa5u8; 64 << 10];
    while f.write_all(&block).is_ok() {}
    let _ = f.sync_all();
    p
}

const FAST_CHECKPOINTS: &str = "[store]\ncheckpoint_secs = 1\n";

/// A full disk: the store fails, STATUS answers 50 and health says NOT_SERVING with the
/// reason in `ipoolctl status`; once space is back it serves again by itself; nothing
/// acknowledged is lost and nothing answered with an error is kept.
#[test]
#[ignore = "needs root (mounts a tmpfs); CI runs it with --include-ignored"]
fn a_full_disk_stops_serving_and_recovers_by_itself() {
    require(is_root(), "needs root (mounts a tmpfs)");
    let fs = Mount::tmpfs("16m");
    let mut d = daemon_on(&fs.at.join("state"), FAST_CHECKPOINTS);
    d.spawn();
    let conf = d.conf("1.1.0", "full", r#""subnet":"10.80.0.0/20""#);
    let mut told = Told::default();
    for i in 0..10 {
        assert!(told.add(&format!("before-{i}"), &conf).ok);
    }
    let filler = fill(&fs.at);
    // ADDs go on until the store notices: sled writes into the space its file already has
    // until that is used up (about 600 ADDs), and a checkpoint then fails.
    let mut i = 0;
    wait_until(
        "the store noticing the full disk",
        Duration::from_secs(120),
        || {
            for _ in 0..20 {
                told.add(&format!("full-{i}"), &conf);
                i += 1;
            }
            status(&conf).code() == 50
        },
    );
    let st = status(&conf);
    assert!(st.stdout.contains("store"), "{st:?}");
    assert!(
        !serving(&d),
        "health is NOT_SERVING while the store has failed"
    );
    let ctl = d.ctl(&["status"]);
    assert!(
        String::from_utf8_lossy(&ctl.stderr).contains("store has failed"),
        "{ctl:?}"
    );
    let refused = told.add("while-failed", &conf);
    assert_eq!(refused.code(), 11, "{refused:?}");

    std::fs::remove_file(&filler).expect("free the space");
    wait_until("serving again", Duration::from_secs(90), || {
        status(&conf).ok
    });
    assert!(serving(&d));
    for i in 0..5 {
        assert!(told.add(&format!("after-{i}"), &conf).ok);
    }
    told.matches(&d);
    d.kill9();
    d.spawn();
    told.matches(&d);
}

/// A state dir without room for the log files: the start is refused with the reason, and
/// leaves no log file behind that a later start could take for a log.
#[test]
#[ignore = "needs root (mounts a tmpfs); CI runs it with --include-ignored"]
fn a_start_without_room_for_the_log_is_refused_with_the_reason() {
    require(is_root(), "needs root (mounts a tmpfs)");
    let fs = Mount::tmpfs("1m");
    let state = fs.at.join("state");
    let err = daemon_on(&state, "").run_expecting_failure();
    assert!(
        err.contains("No space left on device") && err.contains(path(&state)),
        "{err}"
    );
    assert!(!state.join("wal-0").exists() && !state.join("wal-1").exists());
}

/// ext4 remounted read-only under the daemon (errors=remount-ro, an error triggered through
/// sysfs): ADDs after it are answered with an error, and none of them is held after the
/// filesystem is repaired and the daemon restarted; every acknowledged one is.
#[test]
#[ignore = "needs root, mkfs.ext4 (e2fsprogs) and losetup (mount); CI runs it with --include-ignored"]
fn a_filesystem_gone_read_only_keeps_only_what_was_acknowledged() {
    require(
        is_root() && have("mkfs.ext4") && have("losetup"),
        "needs root, mkfs.ext4 (e2fsprogs) and losetup (mount)",
    );
    let fs = Mount::ext4(64);
    let mut d = daemon_on(&fs.at.join("state"), "");
    let metrics = format!("127.0.0.1:{}", common::free_port());
    d.add_args(&["--metrics-listen", &metrics]);
    d.spawn();
    let store_failed = || {
        let (_, body) = common::http_get(&metrics, "/metrics");
        common::samples(&body).get("ipool_store_failed").copied()
    };
    assert_eq!(store_failed(), Some(0.0));
    let conf = d.conf("1.1.0", "rofs", r#""subnet":"10.81.0.0/22""#);
    let mut told = Told::default();
    for i in 0..20 {
        assert!(told.add(&format!("before-{i}"), &conf).ok);
    }
    let trigger = format!("/sys/fs/ext4/{}/trigger_fs_error", fs.sys_name());
    std::fs::write(&trigger, "ipool fault test\n").expect("trigger an ext4 error");
    for i in 0..40 {
        told.add(&format!("after-{i}"), &conf);
    }
    assert!(
        !told.failed.is_empty(),
        "ADDs on a read-only filesystem were all acknowledged"
    );
    assert_eq!(status(&conf).code(), 50);
    // What the IpoolStoreFailed alert (deploy/monitoring) watches.
    assert_eq!(store_failed(), Some(1.0));
    d.kill9();
    fs.unmount();
    let dev = fs.loop_dev.clone().expect("loop device");
    // e2fsck exits 1 when it corrected errors.
    let fsck = Command::new("e2fsck")
        .args(["-fy", &dev])
        .output()
        .expect("e2fsck");
    assert!(fsck.status.code().is_some_and(|c| c <= 1), "{fsck:?}");
    fs.mount_ext4();
    d.spawn();
    told.matches(&d);
}

/// The state of a daemon killed after 300 acknowledged ADDs, copied, damaged, and started:
/// every kind of damage is refused, naming the file; the undamaged copy holds all 300.
#[test]
fn damaged_or_missing_files_are_refused_naming_them() {
    // Checkpoints only when a log file fills: the records after the start are all needed.
    let toml = "[store]\ncheckpoint_secs = 0\n";
    let mut d = Daemon::with_config(toml);
    let conf = d.conf("1.1.0", "damage", r#""subnet":"10.82.0.0/22""#);
    let mut told = Told::default();
    for i in 0..300 {
        assert!(told.add(&format!("c{i}"), &conf).ok);
    }
    d.kill9();
    let copies = tempfile::tempdir().expect("tempdir");
    let copy = |name: &str| {
        let to = copies.path().join(name);
        run("cp", &["-a", path(&d.state), path(&to)]);
        to
    };
    let wal0 = |dir: &Path| dir.join("wal-0");
    // Where the records end: the last non-zero byte of wal-0.
    let bytes = std::fs::read(wal0(&d.state)).expect("read wal-0");
    let end = bytes.iter().rposition(|b| *b != 0).expect("records");
    assert!(end > 80_000, "300 ADDs wrote {end} bytes of log");

    let flipped = copy("flipped");
    let mut b = bytes.clone();
    b[80_000] ^= 0x01;
    std::fs::write(wal0(&flipped), &b).expect("write");
    let truncated = copy("truncated");
    std::fs::OpenOptions::new()
        .write(true)
        .open(wal0(&truncated))
        .expect("open")
        .set_len(40_000)
        .expect("truncate");
    let no_log = copy("no-log");
    std::fs::remove_file(wal0(&no_log)).expect("rm wal-0");
    let no_db = copy("no-db");
    std::fs::remove_dir_all(no_db.join("db")).expect("rm db");
    let other = copy("other");
    let foreign = tempfile::tempdir().expect("tempdir");
    {
        let mut f = Daemon::prepare(&[]);
        f.state = foreign.path().join("state");
        f.spawn();
        assert!(f.terminate().success());
        std::fs::copy(wal0(&f.state), wal0(&other)).expect("copy a foreign log");
    }

    for (dir, names) in [
        (&flipped, "wal-0"),
        (&truncated, "wal-0"),
        (&no_log, "wal-0"),
        (&no_db, "db"),
        (&other, "wal-0"),
    ] {
        let err = daemon_on(dir, toml).run_expecting_failure();
        let named = dir.join(names);
        assert!(
            err.contains(&named.display().to_string()),
            "{}: the refusal names {}:\n{err}",
            dir.display(),
            named.display()
        );
        assert!(
            err.contains("Damaged or missing state"),
            "the refusal points at the recovery section (docs/operations.md):\n{err}"
        );
    }
    let mut intact = daemon_on(&copy("intact"), toml);
    intact.spawn();
    told.matches(&intact);
}

const FAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";

/// The wall clock stepped under a running daemon (libfaketime; the monotonic clocks are left
/// alone, as a real step leaves them): +1 h does not end a 130 s cooldown, +2 years does not
/// expire a 600 s reservation (not even across a restart), and -1 day does not stall ADDs.
#[test]
#[ignore = "needs libfaketime (apt-get install faketime); CI runs it with --include-ignored"]
fn clock_steps_neither_end_cooldowns_nor_expire_reservations() {
    require(
        Path::new(FAKETIME).exists(),
        "needs libfaketime (apt-get install faketime)",
    );
    let toml = "[defaults]\nsticky = \"statefulset\"\nsticky_ttl_secs = 600\n";
    let mut d = Daemon::prepare_with_config(toml);
    let offset = d.dir.path().join("faketime");
    let step = |to: &str| std::fs::write(&offset, format!("{to}\n")).expect("faketime file");
    step("+0");
    d.envs = vec![
        ("LD_PRELOAD".into(), FAKETIME.into()),
        ("FAKETIME_TIMESTAMP_FILE".into(), path(&offset).into()),
        ("FAKETIME_NO_CACHE".into(), "1".into()),
        ("FAKETIME_DONT_FAKE_MONOTONIC".into(), "1".into()),
    ];
    d.spawn();
    let conf = d.conf("1.1.0", "clock", r#""subnet":"10.83.0.0/24""#);
    let first = cni("ADD", "pod-a", &conf);
    assert!(first.ok, "{first:?}");
    assert!(cni("DEL", "pod-a", &conf).ok);
    step("+1h");
    std::thread::sleep(Duration::from_millis(1500));
    let next = cni("ADD", "pod-b", &conf);
    assert!(next.ok, "{next:?}");
    assert_ne!(
        next.addresses(),
        first.addresses(),
        "an address released 2 s ago was handed out again after a +1 h step"
    );

    let web = cni("ADD", "web-0", &conf);
    assert!(web.ok && cni("DEL", "web-0", &conf).ok, "{web:?}");
    let reserved = |d: &Daemon| {
        let out = d.ctl(&["reservations", "-o", "json"]);
        let v: Value = serde_json::from_slice(&out.stdout).expect("reservations json");
        v.as_array()
            .expect("array")
            .iter()
            .any(|r| r["pod"] == "web-0")
    };
    assert!(reserved(&d));
    step("+730d");
    // The step took: ipoold's log lines (wall clock) are two years on.
    assert!(cni("ADD", "probe", &conf).ok);
    let year = |line: &str| line.get(..4).and_then(|y| y.parse::<u32>().ok());
    let log = d.wait_log(&["probe"]);
    let first = log.lines().next().and_then(year).expect("a dated line");
    let stepped = log
        .lines()
        .find(|l| l.contains("probe"))
        .and_then(year)
        .expect("a dated line");
    assert!(
        stepped > first,
        "libfaketime did not step the clock:\n{log}"
    );
    std::thread::sleep(Duration::from_millis(2500));
    assert!(reserved(&d), "a 600 s reservation expired on a +2 y step");
    d.kill9();
    d.spawn();
    std::thread::sleep(Duration::from_millis(1500));
    assert!(
        reserved(&d),
        "a 600 s reservation expired across a restart after a +2 y step"
    );

    step("-1d");
    std::thread::sleep(Duration::from_millis(500));
    for i in 0..5 {
        let r = cni("ADD", &format!("late-{i}"), &conf);
        assert!(r.ok, "ADD after a backward step: {r:?}");
    }
    let again = cni("ADD", "web-0", &conf);
    assert_eq!(
        again.addresses(),
        web.addresses(),
        "the sticky pod gets its address back"
    );
}
