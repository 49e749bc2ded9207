//! The operators' side through a real daemon: every Ops call via ipoolctl (socket and TCP),
//! auth refusals, health transitions, reflection, the CNI service's uid check.

mod common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use common::*;
use serde_json::Value;

const SUBNET: &str = r#""subnet":"10.61.0.0/24""#;

fn code(o: &Output) -> i32 {
    o.status.code().expect("ipoolctl exited")
}

fn json(o: &Output) -> Value {
    assert!(o.status.success(), "ipoolctl failed: {o:?}");
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {o:?}"))
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn ip_of(run: &Run) -> String {
    run.addresses()[0]
        .split('/')
        .next()
        .expect("ip")
        .to_string()
}

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

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port()
}

#[test]
fn tcp_reads_are_open_on_loopback_and_writes_need_the_token() {
    let aux = tempfile::tempdir().expect("tempdir");
    let token = aux.path().join("token");
    std::fs::write(&token, "s3cret-s3cret-s3cret\n").expect("token");
    let wrong = aux.path().join("wrong");
    std::fs::write(&wrong, "not-the-token-at-all\n").expect("token");
    let addr = format!("127.0.0.1:{}", free_port());
    let token_arg = token.display().to_string();
    let d = Daemon::start_with(&["--ops-listen", &addr, "--ops-token-file", &token_arg]);
    let conf = d.conf("1.0.0", "tcp", SUBNET);
    assert!(cni("ADD", "t-1", &conf).ok);

    let tcp = |extra: &[&str]| {
        Command::new(ipoolctl_bin())
            .args(["--addr", &addr])
            .args(extra)
            .output()
            .expect("ipoolctl")
    };
    let list = json(&tcp(&["list", "-o", "json"]));
    assert_eq!(list[0]["containerID"], "t-1");
    assert!(tcp(&["status"]).status.success());

    let no_token = tcp(&["drain", "--network", "tcp"]);
    assert_eq!(code(&no_token), 4, "{no_token:?}");
    assert!(
        stderr(&no_token).contains("authorization: Bearer"),
        "{no_token:?}"
    );
    let bad = tcp(&[
        "--token-file",
        &wrong.display().to_string(),
        "drain",
        "--network",
        "tcp",
    ]);
    assert_eq!(code(&bad), 4, "{bad:?}");
    assert!(stderr(&bad).contains("wrong"), "{bad:?}");
    let ok = tcp(&[
        "--token-file",
        &token_arg,
        "drain",
        "--network",
        "tcp",
        "--undo",
    ]);
    assert!(ok.status.success(), "{ok:?}");
    let rel = tcp(&[
        "--token-file",
        &token_arg,
        "release",
        "--network",
        "tcp",
        "--container",
        "t-1",
        "--reason",
        "tcp test",
    ]);
    assert!(rel.status.success(), "{rel:?}");

    // The CNI service is only on the Unix socket.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let err = rt.block_on(async {
        let mut c = ipool_proto::v1::cni_client::CniClient::connect(format!("http://{addr}"))
            .await
            .expect("connect");
        c.status(ipool_proto::v1::StatusRequest::default()).await
    });
    assert_eq!(
        err.expect_err("not served").code(),
        tonic::Code::Unimplemented
    );
}

#[test]
fn tcp_without_auth_stays_on_loopback_and_refuses_writes() {
    let addr = format!("127.0.0.1:{}", free_port());
    let d = Daemon::start_with(&["--ops-listen", &addr]);
    let out = Command::new(ipoolctl_bin())
        .args(["--addr", &addr, "drain"])
        .output()
        .expect("ipoolctl");
    assert_eq!(code(&out), 4, "{out:?}");
    assert!(stderr(&out).contains("--ops-token-file"), "{out:?}");
    drop(d);

    let any = format!("0.0.0.0:{}", free_port());
    let e = Daemon::prepare(&["--ops-listen", &any]).run_expecting_failure();
    assert!(
        e.contains("not a loopback address") && e.contains("--ops-token-file"),
        "{e}"
    );
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("openssl");
    assert!(out.status.success(), "openssl {args:?}: {out:?}");
}

/// A CA, a server certificate for 127.0.0.1 and a client certificate, all by openssl.
fn make_pki(dir: &Path) {
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=ipool test CA",
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
        ],
    );
    for (name, ext) in [
        (
            "server",
            "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth",
        ),
        ("client", "extendedKeyUsage=clientAuth"),
    ] {
        std::fs::write(dir.join(format!("{name}.ext")), ext).expect("ext");
        openssl(
            dir,
            &[
                "req",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-subj",
                &format!("/CN={name}"),
                "-keyout",
                &format!("{name}.key"),
                "-out",
                &format!("{name}.csr"),
            ],
        );
        openssl(
            dir,
            &[
                "x509",
                "-req",
                "-in",
                &format!("{name}.csr"),
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-days",
                "2",
                "-extfile",
                &format!("{name}.ext"),
                "-out",
                &format!("{name}.pem"),
            ],
        );
    }
}

#[test]
fn mutual_tls_authenticates_every_call() {
    let pki = tempfile::tempdir().expect("tempdir");
    make_pki(pki.path());
    let p = |f: &str| pki.path().join(f).display().to_string();
    let addr = format!("127.0.0.1:{}", free_port());
    let d = Daemon::start_with(&[
        "--ops-listen",
        &addr,
        "--tls-cert",
        &p("server.pem"),
        "--tls-key",
        &p("server.key"),
        "--tls-client-ca",
        &p("ca.pem"),
    ]);
    let conf = d.conf("1.0.0", "mtls", SUBNET);
    assert!(cni("ADD", "m-1", &conf).ok);
    let with_cert = Command::new(ipoolctl_bin())
        .args([
            "--addr",
            &addr,
            "--tls-ca",
            &p("ca.pem"),
            "--tls-cert",
            &p("client.pem"),
            "--tls-key",
            &p("client.key"),
            "drain",
            "--network",
            "mtls",
            "-o",
            "json",
        ])
        .output()
        .expect("ipoolctl");
    assert_eq!(json(&with_cert)["drained"], serde_json::json!(["mtls"]));
    let without = Command::new(ipoolctl_bin())
        .args(["--addr", &addr, "--tls-ca", &p("ca.pem"), "status"])
        .output()
        .expect("ipoolctl");
    assert!(
        !without.status.success(),
        "no client certificate, no call: {without:?}"
    );
    let plaintext = Command::new(ipoolctl_bin())
        .args(["--addr", &addr, "status"])
        .output()
        .expect("ipoolctl");
    assert!(!plaintext.status.success(), "{plaintext:?}");
}

#[test]
fn health_follows_drain_and_reflection_lists_the_services() {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::health_client::HealthClient;
    use tonic_health::pb::HealthCheckRequest;
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
    use tonic_reflection::pb::v1::ServerReflectionRequest;

    let d = Daemon::start();
    let conf = d.conf("1.0.0", "health", SUBNET);
    assert!(cni("ADD", "h-1", &conf).ok);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let socket = d.socket.clone();
    let channel = rt.block_on(async {
        tonic::transport::Endpoint::from_shared(format!("unix://{}", socket.display()))
            .expect("endpoint")
            .connect()
            .await
            .expect("connect")
    });
    let status = |service: &str| {
        rt.block_on(
            HealthClient::new(channel.clone()).check(HealthCheckRequest {
                service: service.into(),
            }),
        )
        .expect("health check")
        .into_inner()
        .status
    };
    assert_eq!(status(""), ServingStatus::Serving as i32);
    assert_eq!(status("ipool.v1.Cni"), ServingStatus::Serving as i32);
    assert!(d.ctl(&["drain"]).status.success());
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(status(""), ServingStatus::NotServing as i32);
    assert!(d.ctl(&["drain", "--undo"]).status.success());
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(status(""), ServingStatus::Serving as i32);

    let names: Vec<String> = rt.block_on(async {
        let req = ServerReflectionRequest {
            host: String::new(),
            message_request: Some(MessageRequest::ListServices(String::new())),
        };
        let mut stream = ServerReflectionClient::new(channel.clone())
            .server_reflection_info(tokio_stream::iter(vec![req]))
            .await
            .expect("reflection")
            .into_inner();
        let resp = stream
            .message()
            .await
            .expect("message")
            .expect("a response");
        match resp.message_response {
            Some(MessageResponse::ListServicesResponse(l)) => {
                l.service.into_iter().map(|s| s.name).collect()
            }
            other => panic!("unexpected reflection answer {other:?}"),
        }
    });
    for want in ["ipool.v1.Cni", "ipool.v1.Ops", "grpc.health.v1.Health"] {
        assert!(
            names.iter().any(|n| n == want),
            "{want} missing from {names:?}"
        );
    }
}

#[test]
fn the_cni_service_refuses_callers_other_than_root() {
    if !is_root() {
        eprintln!("skipped: needs root to run the plugin as another user");
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    let d = Daemon::start();
    // Open the socket to everyone, as a misconfiguration would; the peer check still holds.
    std::fs::set_permissions(&d.socket, std::fs::Permissions::from_mode(0o666)).expect("chmod");
    let conf = d.conf("1.0.0", "uid", SUBNET);
    let mut child = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(plugin_bin())
        .env_clear()
        .envs([
            ("CNI_COMMAND", "ADD"),
            ("CNI_CONTAINERID", "intruder"),
            ("CNI_NETNS", "/var/run/netns/x"),
            ("CNI_IFNAME", "eth0"),
            ("CNI_PATH", "/usr/lib/cni"),
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("setpriv");
    use std::io::Write;
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(conf.as_bytes())
        .expect("write");
    let out = child.wait_with_output().expect("wait");
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {out:?}"));
    assert_eq!(v["code"], 103, "{v}");
    assert!(
        v["details"]
            .as_str()
            .expect("details")
            .contains("uid 65534"),
        "{v}"
    );
    assert_eq!(json(&d.ctl(&["list", "-o", "json"])), serde_json::json!([]));
    // Root still gets through.
    assert!(cni("ADD", "root-ok", &conf).ok);
}

/// GET over plain HTTP/1.1; returns (status line, body).
fn http_get(addr: &str, path: &str) -> (String, String) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).expect("connect metrics");
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .expect("write");
    let mut raw = String::new();
    s.read_to_string(&mut raw).expect("read");
    let (head, body) = raw.split_once("\r\n\r\n").expect("http response");
    (
        head.lines().next().expect("status").to_string(),
        body.to_string(),
    )
}

/// Sample lines of an OpenMetrics text body: "name{labels}" -> value.
fn samples(body: &str) -> std::collections::HashMap<String, f64> {
    body.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| {
            let (k, v) = l.rsplit_once(' ')?;
            Some((k.to_string(), v.parse().ok()?))
        })
        .collect()
}

#[test]
fn metrics_match_the_pools_after_a_known_sequence() {
    let addr = format!("127.0.0.1:{}", free_port());
    let d = Daemon::start_with(&["--metrics-listen", &addr]);
    let conf = d.conf("1.0.0", "m", SUBNET);
    let mut adds = Vec::new();
    for i in 0..5 {
        let r = cni("ADD", &format!("m-{i}"), &conf);
        assert!(r.ok, "{r:?}");
        adds.push(r);
    }
    assert!(cni("DEL", "m-0", &conf).ok);
    assert!(cni("DEL", "m-1", &conf).ok);
    assert!(cni("CHECK", "m-2", &with_prev(&conf, &adds[2].json)).ok);
    assert_eq!(
        cni("CHECK", "m-0", &with_prev(&conf, &adds[0].json)).code(),
        3
    );
    let outside = plugin(
        &[
            ("CNI_COMMAND", "ADD"),
            ("CNI_CONTAINERID", "m-bad"),
            ("CNI_NETNS", "/var/run/netns/m-bad"),
            ("CNI_IFNAME", "eth0"),
            ("CNI_PATH", "/usr/lib/cni"),
            ("CNI_ARGS", "IP=192.168.77.7"),
        ],
        &conf,
    );
    assert_eq!(outside.code(), 7, "{outside:?}");

    let (status, body) = http_get(&addr, "/metrics");
    assert!(status.contains("200"), "{status}");
    let m = samples(&body);
    let get = |k: &str| {
        *m.get(k)
            .unwrap_or_else(|| panic!("{k} missing in:\n{body}"))
    };
    let pool = json(&d.ctl(&["status", "-o", "json"]));
    let l = r#"{network="m",family="ipv4"}"#;
    for (metric, field) in [
        ("ipool_pool_in_use", "inUse"),
        ("ipool_pool_idle", "idle"),
        ("ipool_pool_cooling", "cooling"),
        ("ipool_pool_reserved", "reserved"),
        ("ipool_pool_capacity", "capacity"),
        ("ipool_pool_free_in_source", "freeInSource"),
    ] {
        assert_eq!(
            get(&format!("{metric}{l}")),
            pool[0][field].as_f64().expect("number"),
            "{metric} vs status {field}"
        );
    }
    assert_eq!(get(&format!("ipool_pool_in_use{l}")), 3.0);
    assert_eq!(get(&format!("ipool_pool_cooling{l}")), 2.0);
    assert_eq!(get(&format!("ipool_source_calls_total{l}")), 5.0);
    assert_eq!(get(r#"ipool_requests_total{op="ADD",result="ok"}"#), 5.0);
    assert_eq!(
        get(r#"ipool_requests_total{op="ADD",result="invalidargument"}"#),
        1.0
    );
    assert_eq!(get(r#"ipool_requests_total{op="DEL",result="ok"}"#), 2.0);
    assert_eq!(get(r#"ipool_requests_total{op="CHECK",result="ok"}"#), 1.0);
    assert_eq!(
        get(r#"ipool_requests_total{op="CHECK",result="notfound"}"#),
        1.0
    );
    assert_eq!(get("ipool_add_duration_seconds_count"), 5.0);
    assert!(get("ipool_store_flush_duration_seconds_count") >= 1.0);
    assert!(get("ipool_store_commits_total") >= 7.0, "5 ADDs, 2 DELs");

    let (status, _) = http_get(&addr, "/nope");
    assert!(status.contains("404"), "{status}");
}

/// A client that sends its preface and SETTINGS and then waits for the server's SETTINGS before
/// it sends a request (grpc-go does) gets them.
#[test]
fn a_client_that_waits_for_the_servers_settings_gets_them() {
    use std::io::{Read, Write};
    let d = Daemon::start();
    let mut s = std::os::unix::net::UnixStream::connect(&d.socket).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    // The client preface and an empty SETTINGS frame.
    s.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0")
        .expect("write");
    // Read frames until both the server's SETTINGS and its ack of ours have arrived.
    let (mut settings, mut ack) = (false, false);
    let mut buf = Vec::new();
    while !(settings && ack) {
        let mut chunk = [0u8; 512];
        let n = s
            .read(&mut chunk)
            .expect("the daemon's SETTINGS arrive without a request being sent");
        assert!(n > 0, "the daemon closed the connection");
        buf.extend_from_slice(&chunk[..n]);
        while buf.len() >= 9 {
            let len = usize::from(buf[0]) << 16 | usize::from(buf[1]) << 8 | usize::from(buf[2]);
            if buf.len() < 9 + len {
                break;
            }
            if buf[3] == 0x4 {
                if buf[4] & 0x1 == 0 {
                    settings = true;
                } else {
                    ack = true;
                }
            }
            buf.drain(..9 + len);
        }
    }
}
