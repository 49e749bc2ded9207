//! Test certificates by openssl: a CA, a server certificate for 127.0.0.1 and a client
//! certificate (ca.pem, server.pem/key, client.pem/key in `dir`).
#![allow(dead_code)]

use std::path::Path;
use std::process::Command;

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("openssl");
    assert!(out.status.success(), "openssl {args:?}: {out:?}");
}

/// A CA, a server certificate for 127.0.0.1 and a client certificate, all by openssl.
pub fn make(dir: &Path) {
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
