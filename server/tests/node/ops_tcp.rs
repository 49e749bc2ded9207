//! The Ops service over TCP through a real daemon: reads open on loopback, writes behind the
//! bearer token; without authentication, writes are refused and only loopback may listen;
//! mutual TLS; the CNI service is not served there.

use crate::common;

use std::process::Command;

use crate::common::*;

const SUBNET: &str = r#""subnet":"10.61.0.0/24""#;

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

#[test]
fn mutual_tls_authenticates_every_call() {
    let pki = tempfile::tempdir().expect("tempdir");
    common::pki::make(pki.path());
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
