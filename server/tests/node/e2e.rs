//! End to end: a real ipoold on a temp socket, driven by the real ipool plugin binary.

use std::collections::HashSet;
use std::os::unix::fs::PermissionsExt;

use crate::common::*;
use serde_json::Value;

const SUBNET: &str = r#""subnet":"10.42.0.0/24","routes":[{"dst":"0.0.0.0/0"}]"#;

#[test]
fn add_check_del_through_the_real_plugin() {
    let d = Daemon::start();
    let conf = d.conf("1.0.0", "e2e", SUBNET);

    let a = cni("ADD", "ctr-a", &conf);
    assert!(a.ok, "{a:?}");
    assert_eq!(a.json["cniVersion"], "1.0.0");
    assert_eq!(a.json["ips"][0]["address"], "10.42.0.2/24");
    assert_eq!(a.json["ips"][0]["gateway"], "10.42.0.1");
    assert!(a.json["ips"][0].get("version").is_none());
    assert!(a.json.get("interfaces").is_none());
    assert_eq!(a.json["routes"][0]["dst"], "0.0.0.0/0");

    let again = cni("ADD", "ctr-a", &conf);
    assert_eq!(again.json, a.json, "ADD is idempotent");
    let b = cni("ADD", "ctr-b", &conf);
    assert_eq!(b.addresses(), vec!["10.42.0.3/24"]);

    let check = cni("CHECK", "ctr-a", &with_prev(&conf, &a.json));
    assert!(check.ok && check.stdout.is_empty(), "{check:?}");
    let wrong = cni("CHECK", "ctr-a", &with_prev(&conf, &b.json));
    assert!(!wrong.ok);
    assert_eq!(wrong.code(), 102, "{wrong:?}");
    assert!(wrong.json["details"]
        .as_str()
        .is_some_and(|d| d.contains("10.42.0.3") && d.contains("ctr-b")));
    let gone = cni("CHECK", "ctr-zzz", &with_prev(&conf, &a.json));
    assert_eq!(gone.code(), 3, "{gone:?}");

    // ipoolctl sees both, with the pod identity from CNI_ARGS.
    let list = d.ctl(&["-o", "json", "list"]);
    assert!(list.status.success());
    let list: Value = serde_json::from_slice(&list.stdout).expect("json");
    assert_eq!(list.as_array().map(Vec::len), Some(2));
    assert_eq!(list[0]["podName"], "ctr-a");
    assert_eq!(list[0]["addresses"][0], "10.42.0.2");

    for _ in 0..2 {
        let del = cni("DEL", "ctr-a", &conf);
        assert!(
            del.ok && del.stdout.is_empty(),
            "DEL is permissive: {del:?}"
        );
    }
    assert!(cni("DEL", "never-added", &conf).ok);

    let status = d.ctl(&["-o", "json", "status"]);
    let status: Value = serde_json::from_slice(&status.stdout).expect("json");
    assert_eq!(status[0]["inUse"], 1);
    assert_eq!(status[0]["idle"], 1);
    assert_eq!(status[0]["cooling"], 1);

    // The released address is cooling: the next ADD gets a fresh one.
    let c = cni("ADD", "ctr-c", &conf);
    assert_eq!(c.addresses(), vec!["10.42.0.4/24"]);
    let table = String::from_utf8_lossy(&d.ctl(&["status"]).stdout).into_owned();
    assert!(
        table.contains("NETWORK") && table.contains("e2e"),
        "{table}"
    );
    // One log line per request, readable in a file (no terminal colour codes).
    let log = d.wait_log(&["ctr-c", "10.42.0.4"]);
    assert!(!log.contains('\x1b'), "colour codes in a log file: {log}");
}

#[test]
fn older_versions_carry_ip_version() {
    let d = Daemon::start();
    for (i, v) in ["0.3.0", "0.3.1", "0.4.0"].iter().enumerate() {
        let conf = d.conf(v, "legacy", SUBNET);
        let r = cni("ADD", &format!("c{i}"), &conf);
        assert!(r.ok, "{r:?}");
        assert_eq!(r.json["cniVersion"], *v);
        assert_eq!(r.json["ips"][0]["version"], "4");
    }
}

#[test]
fn restart_after_kill_keeps_every_allocation() {
    let mut d = Daemon::start();
    let conf = d.conf("1.0.0", "restart", SUBNET);
    let mut results = Vec::new();
    for i in 0..20 {
        let r = cni("ADD", &format!("pod-{i}"), &conf);
        assert!(r.ok, "{r:?}");
        results.push(r.json);
    }
    for i in (0..20).step_by(4) {
        assert!(cni("DEL", &format!("pod-{i}"), &conf).ok);
    }
    d.kill9();
    assert!(d.socket.exists(), "kill -9 leaves the socket file behind");
    d.spawn(); // removes the stale socket and serves again

    for (i, prev) in results.iter().enumerate() {
        let check = cni("CHECK", &format!("pod-{i}"), &with_prev(&conf, prev));
        if i % 4 == 0 {
            assert_eq!(check.code(), 3, "pod-{i} was deleted: {check:?}");
        } else {
            assert!(check.ok, "pod-{i} must survive the restart: {check:?}");
            let again = cni("ADD", &format!("pod-{i}"), &conf);
            assert_eq!(&again.json, prev, "same address after restart");
        }
    }
    // New pods get addresses nobody holds; released ones are still cooling.
    let mut held: HashSet<String> = results
        .iter()
        .enumerate()
        .filter(|(i, _)| i % 4 != 0)
        .map(|(_, r)| r["ips"][0]["address"].as_str().expect("addr").to_string())
        .collect();
    let released: HashSet<String> = results
        .iter()
        .step_by(4)
        .map(|r| r["ips"][0]["address"].as_str().expect("addr").to_string())
        .collect();
    for i in 20..30 {
        let r = cni("ADD", &format!("pod-{i}"), &conf);
        let a = r.addresses().pop().expect("one address");
        assert!(!released.contains(&a), "{a} reused inside its cooldown");
        assert!(held.insert(a.clone()), "{a} handed out twice");
    }
}

#[test]
fn socket_is_private_and_not_taken_over() {
    let mut d = Daemon::start();
    let mode = std::fs::metadata(&d.socket)
        .expect("socket")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    // Same state dir: the store's lock refuses it.
    let err = d.run_expecting_failure();
    assert!(err.contains("locked"), "{err}");
    // Other state dir, same socket: the live socket is not taken over.
    let out = std::process::Command::new(ipoold_bin())
        .arg("--socket")
        .arg(&d.socket)
        .arg("--state-dir")
        .arg(d.dir.path().join("second"))
        .output()
        .expect("run");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("another ipoold"), "{err}");
    assert!(cni("ADD", "still-served", &d.conf("1.0.0", "n", SUBNET)).ok);
    // SIGTERM: clean exit, socket removed.
    let status = d.terminate();
    assert!(status.success(), "{status}");
    assert!(!d.socket.exists());
}

#[test]
fn daemon_errors_reach_the_runtime_as_cni_errors() {
    let d = Daemon::start();
    // Unknown network without ranges: invalid config, naming the keys to set.
    let r = cni("ADD", "c1", &d.conf("1.0.0", "bare", ""));
    assert_eq!(r.code(), 7, "{r:?}");
    assert!(r.json["details"]
        .as_str()
        .is_some_and(|m| m.contains("ipam.subnet")));
    // Invalid range: invalid config naming the value.
    let r = cni(
        "ADD",
        "c1",
        &d.conf("1.0.0", "bad", r#""subnet":"10.0.0.1/24""#),
    );
    assert_eq!(r.code(), 7, "{r:?}");
    assert!(r.json["details"]
        .as_str()
        .is_some_and(|m| m.contains("host bits")));
    // Exhaustion: a /30 has one address to give.
    let tiny = d.conf("1.0.0", "tiny", r#""subnet":"10.9.9.0/30""#);
    assert!(cni("ADD", "c1", &tiny).ok);
    let r = cni("ADD", "c2", &tiny);
    assert_eq!(r.code(), 100, "{r:?}");
    let details = r.json["details"].as_str().unwrap_or_default();
    assert!(
        details.contains("tiny") && details.contains("1 in use"),
        "{details}"
    );
    // Nothing already allocated was lost on the way.
    assert!(
        cni(
            "CHECK",
            "c1",
            &with_prev(&tiny, &cni("ADD", "c1", &tiny).json)
        )
        .ok
    );
    // Plugin-side validation: the daemon is never asked.
    let r = plugin(&[("CNI_COMMAND", "ADD")], &tiny);
    assert_eq!(r.code(), 4, "{r:?}");
    let r = cni("ADD", "c3", "{not json");
    assert_eq!(r.code(), 6, "{r:?}");
}

#[test]
fn config_file_networks_and_bad_config_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("ipoold.toml");
    std::fs::write(
        &path,
        "[[network]]\nname = \"pods\"\nranges = [[{ subnet = \"10.77.0.0/24\", rangeStart = \"10.77.0.50\" }]]\n",
    )
    .expect("write");
    let d = Daemon::start_with(&["--config", path.to_str().expect("utf8 path")]);
    let r = cni("ADD", "c1", &d.conf("1.0.0", "pods", ""));
    assert_eq!(r.addresses(), vec!["10.77.0.50/24"], "{r:?}");

    std::fs::write(&path, "[defaults]\nmin_idl = 3\n").expect("write");
    let out = std::process::Command::new(ipoold_bin())
        .arg("--socket")
        .arg(dir.path().join("bad.sock"))
        .arg("--state-dir")
        .arg(dir.path().join("bad-state"))
        .arg("--config")
        .arg(&path)
        .output()
        .expect("run");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("min_idl") && err.contains("ipoold.toml"),
        "{err}"
    );
}

#[test]
fn a_reboot_releases_old_attachments_and_sticky_pods_get_theirs_back() {
    let aux = tempfile::tempdir().expect("tempdir");
    let boot = aux.path().join("boot_id");
    let config = aux.path().join("ipoold.toml");
    std::fs::write(&boot, "11111111-aaaa\n").expect("boot id");
    std::fs::write(
        &config,
        "[defaults]\nsticky = \"statefulset\"\nsticky_ttl_secs = 300\n",
    )
    .expect("config");
    let boot_arg = boot.display().to_string();
    let config_arg = config.display().to_string();
    let mut d = Daemon::start_with(&["--boot-id-file", &boot_arg, "--config", &config_arg]);
    let conf = d.conf("1.0.0", "boot", SUBNET);
    // cni() names the pod after the container: "web-0" is StatefulSet-like, "plain" is not.
    let web = cni("ADD", "web-0", &conf);
    let plain = cni("ADD", "plain", &conf);
    assert!(web.ok && plain.ok, "{web:?} {plain:?}");

    // Same boot: a restart keeps both.
    assert!(d.terminate().success());
    d.spawn();
    let list = d.ctl(&["list", "-o", "json"]);
    let v: Value = serde_json::from_slice(&list.stdout).expect("json");
    assert_eq!(v.as_array().map(Vec::len), Some(2), "{v}");

    // Reboot: both network namespaces died with the old boot.
    assert!(d.terminate().success());
    std::fs::write(&boot, "22222222-bbbb\n").expect("boot id");
    d.spawn();
    let list = d.ctl(&["list", "-o", "json"]);
    let v: Value = serde_json::from_slice(&list.stdout).expect("json");
    assert_eq!(v, serde_json::json!([]), "nothing of the old boot is held");
    let log = d.log();
    assert!(log.contains("the machine rebooted"), "{log}");
    assert!(
        log.contains("kept as a reservation for the sticky pod") && log.contains("web-0"),
        "{log}"
    );
    let status = d.ctl(&["status", "-o", "json"]);
    let s: Value = serde_json::from_slice(&status.stdout).expect("json");
    assert_eq!(s[0]["reserved"], 1, "{s}");
    assert_eq!(s[0]["inUse"], 0, "{s}");

    // The sticky pod comes back and gets its address; the other one's is cooling.
    let again = cni("ADD", "web-0", &conf);
    assert!(again.ok, "{again:?}");
    assert_eq!(again.addresses(), web.addresses());
    let other = cni("ADD", "plain-2", &conf);
    assert_ne!(other.addresses(), plain.addresses());
}

/// A SIGTERM that comes as soon as the socket answers (a pod deleted right after it started)
/// is a clean stop, exit 0: the signal handlers are in place before the socket is bound.
#[test]
fn a_sigterm_right_after_start_is_a_clean_stop() {
    let mut d = Daemon::prepare(&[]);
    for i in 0..20 {
        d.spawn();
        let status = d.terminate();
        assert!(status.success(), "start {i}: {status}\n{}", d.log());
    }
}
