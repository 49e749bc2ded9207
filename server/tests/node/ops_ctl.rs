//! The operators' side through a real daemon, on the Unix socket: every Ops call via ipoolctl
//! (list, get, reserve, unreserve, release, drain, exit codes) and the watch stream.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::common::*;
use serde_json::Value;

const SUBNET: &str = r#""subnet":"10.61.0.0/24""#;

#[test]
fn every_ops_call_through_ipoolctl_on_the_socket() {
    let mut d = Daemon::start();
    let conf = d.conf("1.0.0", "ops", SUBNET);
    let (a, b) = (cni("ADD", "pod-a", &conf), cni("ADD", "pod-b", &conf));
    assert!(a.ok && b.ok, "{a:?} {b:?}");

    // list: filters combine; table and JSON.
    let all = json(&d.ctl(&["list", "-o", "json"]));
    assert_eq!(all.as_array().map(Vec::len), Some(2));
    let by_pod = json(&d.ctl(&["list", "--pod", "pod-b", "-o", "json"]));
    assert_eq!(by_pod[0]["containerID"], "pod-b");
    assert_eq!(by_pod.as_array().map(Vec::len), Some(1));
    let by_ip = json(&d.ctl(&["list", "--address", &ip_of(&a), "-o", "json"]));
    assert_eq!(by_ip[0]["containerID"], "pod-a");
    let none = json(&d.ctl(&["list", "--namespace", "elsewhere", "-o", "json"]));
    assert_eq!(none, serde_json::json!([]));
    let table = String::from_utf8(d.ctl(&["list"]).stdout).expect("utf8");
    assert!(
        table.starts_with("NETWORK") && table.contains("test/pod-a"),
        "{table}"
    );

    // get: by container or by address; unknown is exit 3.
    let g = json(&d.ctl(&[
        "get",
        "--network",
        "ops",
        "--container",
        "pod-a",
        "-o",
        "json",
    ]));
    assert_eq!(g[0]["addresses"][0], ip_of(&a));
    let g = json(&d.ctl(&[
        "get",
        "--network",
        "ops",
        "--address",
        &ip_of(&b),
        "-o",
        "json",
    ]));
    assert_eq!(g[0]["containerID"], "pod-b");
    let missing = d.ctl(&["get", "--network", "ops", "--container", "nope"]);
    assert_eq!(code(&missing), 3, "{missing:?}");
    assert!(stderr(&missing).contains("no attachment ops/nope/eth0"));

    // reserve a named address for a pod; its ADD gets it; nobody else does.
    let r = json(&d.ctl(&[
        "reserve",
        "--network",
        "ops",
        "--namespace",
        "test",
        "--pod",
        "pod-c",
        "--address",
        "10.61.0.200",
        "--ttl",
        "300",
        "--reason",
        "migration",
        "-o",
        "json",
    ]));
    assert_eq!(r[0]["addresses"][0], "10.61.0.200");
    assert!(r[0]["reason"]
        .as_str()
        .expect("reason")
        .contains("migration"));
    let again = d.ctl(&[
        "reserve",
        "--network",
        "ops",
        "--namespace",
        "test",
        "--pod",
        "pod-c",
    ]);
    assert_eq!(code(&again), 1, "{again:?}");
    assert!(
        stderr(&again).contains("already has a reservation"),
        "{again:?}"
    );
    let status = json(&d.ctl(&["status", "-o", "json"]));
    assert_eq!(status[0]["reserved"], 1);
    let c = cni("ADD", "pod-c", &conf);
    assert_eq!(ip_of(&c), "10.61.0.200");
    assert_eq!(
        json(&d.ctl(&["reservations", "-o", "json"])),
        serde_json::json!([])
    );

    // reserve without an address, then unreserve: exit 0, then 3.
    let r = json(&d.ctl(&[
        "reserve",
        "--network",
        "ops",
        "--namespace",
        "test",
        "--pod",
        "pod-d",
        "-o",
        "json",
    ]));
    assert_eq!(r[0]["addresses"].as_array().map(Vec::len), Some(1));
    let listed = json(&d.ctl(&["reservations", "--network", "ops", "-o", "json"]));
    assert_eq!(listed[0]["pod"], "pod-d");
    let unreserve = || {
        d.ctl(&[
            "unreserve",
            "--network",
            "ops",
            "--namespace",
            "test",
            "--pod",
            "pod-d",
        ])
    };
    let un = unreserve();
    assert!(un.status.success(), "{un:?}");
    let un = unreserve();
    assert_eq!(code(&un), 3, "{un:?}");

    // release: needs a reason (usage error 64 without), logs it, frees the address.
    let no_reason = d.ctl(&["release", "--network", "ops", "--container", "pod-b"]);
    assert_eq!(code(&no_reason), 64, "{no_reason:?}");
    let rel = json(&d.ctl(&[
        "release",
        "--network",
        "ops",
        "--container",
        "pod-b",
        "--reason",
        "node repair",
        "-o",
        "json",
    ]));
    assert_eq!(rel["released"][0], ip_of(&b));
    d.wait_log(&["node repair", "pod-b"]);
    let gone = d.ctl(&["get", "--network", "ops", "--container", "pod-b"]);
    assert_eq!(code(&gone), 3);

    // drain: no new ADDs (retryable error 11 naming the way out); existing ones keep working.
    let dr = json(&d.ctl(&["drain", "--network", "ops", "-o", "json"]));
    assert_eq!(dr["drained"], serde_json::json!(["ops"]));
    let refused = cni("ADD", "pod-e", &conf);
    assert_eq!(refused.code(), 11, "{refused:?}");
    assert!(refused.stdout.contains("drained"), "{refused:?}");
    let same = cni("ADD", "pod-a", &conf);
    assert!(
        same.ok,
        "an existing attachment's ADD still answers: {same:?}"
    );
    assert!(cni("CHECK", "pod-a", &with_prev(&conf, &a.json)).ok);
    let status = json(&d.ctl(&["status", "-o", "json"]));
    assert_eq!(status[0]["drained"], true);
    // It survives a restart.
    assert!(d.terminate().success());
    d.spawn();
    assert_eq!(cni("ADD", "pod-e", &conf).code(), 11);
    let undo = json(&d.ctl(&["drain", "--network", "ops", "--undo", "-o", "json"]));
    assert_eq!(undo["drained"], serde_json::json!([]));
    assert!(cni("ADD", "pod-e", &conf).ok);
    assert!(cni("DEL", "pod-a", &conf).ok);

    // Bad usage and an unknown network are distinct exit codes.
    assert_eq!(code(&d.ctl(&["status", "--bogus"])), 64);
    assert_eq!(code(&d.ctl(&["drain", "--network", "nope"])), 3);
}

#[test]
fn watch_streams_allocation_events() {
    let d = Daemon::with_config(NO_GC_GRACE);
    let conf = d.conf("1.0.0", "watched", SUBNET);
    let mut watcher = Command::new(ipoolctl_bin())
        .args(["--socket"])
        .arg(&d.socket)
        .args(["watch", "--network", "watched", "-o", "json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("ipoolctl watch");
    // Give the stream a moment to be registered before the events happen.
    std::thread::sleep(Duration::from_millis(300));
    let a = cni("ADD", "w-1", &conf);
    assert!(a.ok, "{a:?}");
    assert!(cni("DEL", "w-1", &conf).ok);
    let other = d.conf("1.0.0", "unwatched", r#""subnet":"10.62.0.0/24""#);
    assert!(cni("ADD", "w-2", &other).ok);
    let w3 = cni("ADD", "w-3", &conf);
    assert!(w3.ok, "{w3:?}");
    let mut gc_conf: Value =
        serde_json::from_str(&d.conf("1.1.0", "watched", SUBNET)).expect("json");
    gc_conf["cni.dev/valid-attachments"] = serde_json::json!([]);
    let gc = plugin(
        &[("CNI_COMMAND", "GC"), ("CNI_PATH", "/usr/lib/cni")],
        &gc_conf.to_string(),
    );
    assert!(gc.ok, "{gc:?}");

    let mut lines = BufReader::new(watcher.stdout.take().expect("stdout")).lines();
    let mut events: Vec<Value> = Vec::new();
    while events.len() < 4 {
        let line = lines.next().expect("an event").expect("read");
        events.push(serde_json::from_str(&line).expect("event json"));
    }
    let _ = watcher.kill();
    let _ = watcher.wait();
    let kinds: Vec<&str> = events
        .iter()
        .map(|e| e["kind"].as_str().expect("kind"))
        .collect();
    assert_eq!(kinds, vec!["ADD", "RELEASE", "ADD", "GC"], "{events:?}");
    assert_eq!(events[0]["containerID"], "w-1");
    assert_eq!(events[0]["pod"], "w-1");
    assert_eq!(events[0]["addresses"][0], ip_of(&a));
    assert_eq!(events[1]["reason"], "CNI DEL");
    assert_eq!(events[3]["containerID"], "w-3");
    assert!(
        events.iter().all(|e| e["network"] == "watched"),
        "{events:?}"
    );
}

/// `ipoolctl health` for probes: 0 SERVING, 1 NOT_SERVING, 2 unreachable.
#[test]
fn health_exit_codes_follow_the_daemon() {
    let mut d = Daemon::start();
    let ok = d.ctl(&["health"]);
    assert_eq!(code(&ok), 0, "{ok:?}");
    assert_eq!(String::from_utf8_lossy(&ok.stdout).trim(), "SERVING");
    assert_eq!(code(&d.ctl(&["health", "--service", "ipool.v1.Cni"])), 0);
    assert_eq!(code(&d.ctl(&["health", "--service", "nope"])), 1);
    assert_eq!(code(&d.ctl(&["drain"])), 0);
    let drained = d.ctl(&["health"]);
    assert_eq!(code(&drained), 1, "{drained:?}");
    assert_eq!(
        String::from_utf8_lossy(&drained.stdout).trim(),
        "NOT_SERVING"
    );
    assert_eq!(
        code(&d.ctl(&["health", "--live"])),
        0,
        "alive, if not serving"
    );
    assert_eq!(code(&d.ctl(&["drain", "--undo"])), 0);
    assert_eq!(code(&d.ctl(&["health"])), 0);
    d.kill9();
    let gone = d.ctl(&["health"]);
    assert_eq!(code(&gone), 2, "{gone:?}");
    assert_eq!(code(&d.ctl(&["health", "--live"])), 2);
}

/// Options come before or after the subcommand, as kubectl's and etcdctl's do, and `--help`
/// gives every command its own line.
#[test]
fn options_go_after_the_subcommand_and_help_names_each_command() {
    let d = Daemon::start();
    let ctl = |args: &[&str]| {
        Command::new(ipoolctl_bin())
            .args(args)
            .output()
            .expect("run ipoolctl")
    };
    let socket = d.socket.display().to_string();
    // ipoold's options after the subcommand.
    let o = ctl(&["status", "--socket", &socket, "-o", "json"]);
    assert_eq!(code(&o), 0, "{o:?}");
    assert!(json(&o).is_array(), "{o:?}");
    let o = ctl(&["list", "--output", "json", "--socket", &socket]);
    assert_eq!(json(&o), serde_json::json!([]));
    // The TLS and token options are read after the subcommand too: a CA that is not there is
    // named (not a usage error).
    let o = ctl(&[
        "status",
        "--addr",
        "127.0.0.1:1",
        "--tls-ca",
        "/nonexistent/ca.pem",
    ]);
    assert_ne!(code(&o), 64, "{o:?}");
    assert!(stderr(&o).contains("/nonexistent/ca.pem"), "{o:?}");
    let o = ctl(&["status", "--tls-cert", "/nonexistent/c.pem"]);
    assert_eq!(code(&o), 64, "--tls-cert without --tls-key: {o:?}");

    // etcd's options after `cluster`'s subcommands: an etcd that is not there is exit 2,
    // naming the endpoint; a usage error would be 64.
    let dead = format!("http://127.0.0.1:{}", free_port());
    for args in [
        &[
            "cluster",
            "pool",
            "create",
            "pods",
            "--cidr",
            "10.244.0.0/16",
            "--etcd-endpoints",
            &dead,
        ][..],
        &[
            "cluster",
            "blocks",
            "--node",
            "n1",
            "--etcd-endpoints",
            &dead,
            "--store-timeout",
            "1",
            "--etcd-prefix",
            "/other",
        ][..],
        &[
            "cluster",
            "pool",
            "list",
            "-o",
            "json",
            "--etcd-endpoints",
            &dead,
        ][..],
        &["cluster", "release-node", "n1", "--etcd-endpoints", &dead][..],
    ] {
        let o = ctl(args);
        assert_eq!(code(&o), 2, "{args:?}: {o:?}");
        assert!(stderr(&o).contains(&dead), "{args:?}: {o:?}");
    }
    let o = ctl(&[
        "cluster",
        "pool",
        "list",
        "--etcd-endpoints",
        "https://127.0.0.1:2379",
        "--etcd-cacert",
        "/nonexistent/etcd-ca.pem",
    ]);
    assert!(stderr(&o).contains("/nonexistent/etcd-ca.pem"), "{o:?}");

    // --help: one line per command, each with its own text.
    let help = String::from_utf8(ctl(&["--help"]).stdout).expect("utf8");
    let commands: Vec<(&str, &str)> = help
        .split("Commands:")
        .nth(1)
        .and_then(|s| s.split("\n\n").next())
        .expect("a Commands section")
        .lines()
        .filter_map(|l| l.trim().split_once(char::is_whitespace))
        .map(|(name, text)| (name, text.trim()))
        .collect();
    let names: Vec<&str> = commands.iter().map(|(n, _)| *n).collect();
    for want in ["status", "list", "cluster", "health", "watch"] {
        assert!(names.contains(&want), "{want} missing from {help}");
    }
    for (name, text) in &commands {
        assert!(!text.is_empty(), "{name} has no text: {help}");
        let same: Vec<_> = commands.iter().filter(|(_, t)| t == text).collect();
        assert_eq!(same.len(), 1, "{name} shares its text: {help}");
    }
    let text = |n: &str| commands.iter().find(|(c, _)| *c == n).map(|(_, t)| *t);
    assert!(
        text("cluster").is_some_and(|t| t.contains("etcd")),
        "{help}"
    );
    assert!(
        text("health").is_some_and(|t| t.contains("probes")),
        "{help}"
    );
    assert!(
        !text("cluster").is_some_and(|t| t.contains("probes")),
        "{help}"
    );
    // Every option has a text (on the line after its name).
    let options: Vec<&str> = help
        .split("Options:")
        .nth(1)
        .expect("an Options section")
        .lines()
        .collect();
    for (i, l) in options.iter().enumerate() {
        if l.trim_start().starts_with('-') {
            let text = options.get(i + 1).map(|t| t.trim()).unwrap_or_default();
            assert!(
                !text.is_empty() && !text.starts_with('-'),
                "{l} has no text: {help}"
            );
        }
    }
}
