//! Installing on the host: `ipoold install-cni` (the plugin into the CNI bin dir) and the
//! conflist ipoold writes once its socket is up.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::process::Command;

use common::*;

const TEMPLATE: &str = r#"{"cniVersion":"1.0.0","name":"k8s-pod-network","plugins":[
  {"type":"bridge","bridge":"cni0","isGateway":true,"ipMasq":true,"ipam":{"type":"ipool","socket":"SOCKET"}},
  {"type":"portmap","capabilities":{"portMappings":true}}]}"#;

fn install_cni(bin_dir: &std::path::Path) -> std::process::Output {
    Command::new(ipoold_bin())
        .args(["install-cni", "--cni-bin-dir"])
        .arg(bin_dir)
        .arg("--plugin")
        .arg(plugin_bin())
        .output()
        .expect("run install-cni")
}

#[test]
fn install_cni_copies_the_plugin_once_and_replaces_a_running_one() {
    let host = tempfile::tempdir().unwrap();
    let bin = host.path().join("opt/cni/bin");
    std::fs::create_dir_all(&bin).unwrap();
    // An old plugin, executing while the new one is installed. Copied by cp(1): a file this
    // (multi-threaded) process wrote may be held open for a moment by a child another test
    // forked, and exec'ing it then fails with ETXTBSY.
    let cp = Command::new("cp")
        .arg("/bin/sleep")
        .arg(bin.join("ipool"))
        .status()
        .unwrap();
    assert!(cp.success());
    let mut old = Command::new(bin.join("ipool")).arg("30").spawn().unwrap();
    let out = install_cni(&bin);
    assert!(out.status.success(), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("installed"),
        "{out:?}"
    );
    let dest = bin.join("ipool");
    assert_eq!(
        std::fs::read(&dest).unwrap(),
        std::fs::read(plugin_bin()).unwrap()
    );
    let mode = std::fs::metadata(&dest).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode, 0o755);
    let again = install_cni(&bin);
    assert!(
        String::from_utf8_lossy(&again.stderr).contains("already up to date"),
        "{again:?}"
    );
    let names: Vec<String> = std::fs::read_dir(&bin)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, ["ipool"], "no temp file left");
    old.kill().unwrap();
    old.wait().unwrap();

    let missing = install_cni(&host.path().join("nope"));
    assert!(!missing.status.success());
    assert!(String::from_utf8_lossy(&missing.stderr).contains("is not a directory"));
}

#[test]
fn the_conflist_is_written_once_the_socket_is_up_and_kept() {
    let mut d = Daemon::prepare(&[]);
    let conf_dir = d.dir.path().join("net.d");
    std::fs::create_dir_all(&conf_dir).unwrap();
    let template = d.dir.path().join("conflist.json");
    std::fs::write(
        &template,
        TEMPLATE.replace("SOCKET", &d.socket.display().to_string()),
    )
    .unwrap();
    d.add_args(&["--cni-conf-dir", &conf_dir.display().to_string()]);
    d.add_args(&["--cni-conflist-template", &template.display().to_string()]);
    assert!(!conf_dir.join("10-ipool.conflist").exists());
    d.spawn();
    let path = conf_dir.join("10-ipool.conflist");
    let written = eventually(10, "the conflist", || std::fs::read_to_string(&path));
    let v: serde_json::Value = serde_json::from_str(&written).expect("JSON");
    assert_eq!(v["plugins"][0]["ipam"]["type"], "ipool");
    // The runtime's view: ADD through the IPAM of the written conflist.
    let mut conf = v["plugins"][0].clone();
    conf["cniVersion"] = v["cniVersion"].clone();
    conf["name"] = v["name"].clone();
    conf["ipam"]["subnet"] = "10.247.0.0/24".into();
    assert!(cni("ADD", "c1", &conf.to_string()).ok);
    d.terminate();
    assert!(
        path.exists(),
        "kept across a stop (STATUS and error 11 cover the gap)"
    );
    let names: Vec<_> = std::fs::read_dir(&conf_dir).unwrap().collect();
    assert_eq!(names.len(), 1, "no temp file left");
}

#[test]
fn a_conflist_template_for_another_socket_is_refused() {
    let mut d = Daemon::prepare(&[]);
    let conf_dir = d.dir.path().join("net.d");
    std::fs::create_dir_all(&conf_dir).unwrap();
    let template = d.dir.path().join("conflist.json");
    std::fs::write(&template, TEMPLATE.replace("SOCKET", "/elsewhere.sock")).unwrap();
    d.add_args(&["--cni-conf-dir", &conf_dir.display().to_string()]);
    d.add_args(&["--cni-conflist-template", &template.display().to_string()]);
    let err = d.run_expecting_failure();
    assert!(err.contains("/elsewhere.sock"), "{err}");
    assert_eq!(std::fs::read_dir(&conf_dir).unwrap().count(), 0);
}
