//! Cluster mode against an etcd that serves https and asks every client for a certificate:
//! `ipoolctl cluster` and ipoold with the CA and a client certificate; without one, refused.

use crate::common;

use std::process::Output;

use crate::common::etcd::Etcd;
use crate::common::*;

#[test]
#[ignore = "needs etcd-server (apt-get install etcd-server); CI runs it with --include-ignored"]
fn an_https_etcd_with_client_certificates_serves_ipoolctl_and_the_daemon() {
    let pki = tempfile::tempdir().expect("tempdir");
    common::pki::make(pki.path());
    let etcd = Etcd::start_tls(pki.path());
    let file = |f: &str| pki.path().join(f).display().to_string();
    let ctl = |tls: &[&str], args: &[&str]| -> Output {
        let mut all = tls.to_vec();
        all.extend(["--etcd-timeout", "3"]); // the deprecated name of --store-timeout, still accepted
        all.extend_from_slice(args);
        etcd.ctl(&all)
    };
    let (ca, cert, key) = (file("ca.pem"), file("client.pem"), file("client.key"));
    let full = [
        "--etcd-cacert",
        ca.as_str(),
        "--etcd-cert",
        cert.as_str(),
        "--etcd-key",
        key.as_str(),
    ];
    let o = ctl(&full, &["pool", "create", "tls", "--cidr", "10.30.0.0/24"]);
    assert!(o.status.success(), "pool create over https: {}", stderr(&o));

    // No client certificate, or no CA for etcd's server certificate: etcd cannot be used.
    for (what, tls) in [("no client certificate", &full[..2]), ("no CA", &full[2..])] {
        let o = ctl(tls, &["pool", "list"]);
        assert_eq!(o.status.code(), Some(2), "{what}: {o:?}");
        assert!(stderr(&o).contains("etcd"), "{what}: {}", stderr(&o));
    }

    let config = |tls: &str| etcd.daemon_config("node-tls", "tls", tls);
    let mut d = Daemon::prepare_with_config(&config(&format!(
        "ca_file = \"{ca}\"\ncert_file = \"{cert}\"\nkey_file = \"{key}\""
    )));
    d.spawn();
    let conf = d.conf("1.0.0", "pods", "");
    let r = eventually(20, "an ADD over https", || {
        let r = cni("ADD", "tls-0", &conf);
        match r.ok {
            true => Ok(r),
            false => Err(r),
        }
    });
    assert!(ip_of(&r).starts_with("10.30.0."), "{r:?}");
    let blocks = json(&ctl(&full, &["-o", "json", "blocks"]));
    assert_eq!(blocks[0]["node"], "node-tls", "{blocks}");

    // A daemon without a client certificate: etcd refuses it, so it has not even read its
    // pool; it hands out nothing, and says etcd is the reason.
    let mut bare = Daemon::prepare_with_config(&config(&format!("ca_file = \"{ca}\"")));
    bare.spawn();
    let conf = bare.conf("1.0.0", "pods", "");
    std::thread::sleep(std::time::Duration::from_secs(2));
    let r = cni("ADD", "bare-0", &conf);
    assert!(!r.ok, "{r:?}");
    assert_eq!(r.code(), 11, "{r:?}");
    assert!(
        r.stdout
            .contains(r#"cannot read cluster pool \"tls\" from etcd"#),
        "{r:?}"
    );
    assert!(
        bare.log().contains("the store does not answer"),
        "{}",
        bare.log()
    );
}
