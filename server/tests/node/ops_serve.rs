//! What a real daemon serves besides the Ops calls: health transitions and reflection, the
//! CNI service's uid check, Prometheus metrics, and HTTP/2 SETTINGS to a client that waits.

use std::process::{Command, Stdio};
use std::time::Duration;

use crate::common::*;
use serde_json::Value;

const SUBNET: &str = r#""subnet":"10.61.0.0/24""#;

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
#[ignore = "needs root (to run the plugin as another user); CI runs it with --include-ignored"]
fn the_cni_service_refuses_callers_other_than_root() {
    require(is_root(), "needs root (to run the plugin as another user)");
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
    // What a new ADD could still get: the idle ones, and the source's within the capacity.
    let n = |f: &str| pool[0][f].as_f64().expect("number");
    let room = n("capacity") - n("inUse") - n("idle") - n("reserved");
    assert_eq!(
        get(&format!("ipool_pool_available{l}")),
        n("idle") + n("freeInSource").min(room)
    );
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
    assert_eq!(get("ipool_store_failed"), 0.0);
    assert_eq!(get("ipool_host_problems"), 0.0);
    assert!(
        !body.contains("ipool_apiserver") && !body.contains("ipool_pod_gc"),
        "no Kubernetes metrics without [kubernetes]:\n{body}"
    );
    let list = String::from_utf8_lossy(&d.ctl(&["list"]).stdout).into_owned();
    assert!(!list.contains("OWNER"), "{list}");

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
