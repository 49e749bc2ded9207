//! Installing on the host: `ipoold install-cni` (the plugin into the CNI bin dir) and the
//! conflist ipoold writes once its socket is up.

use std::os::unix::fs::PermissionsExt;
use std::process::Command;

use crate::common::*;

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

/// A CNI bin dir holding the ipool plugin and `plugins` (name, path).
fn plugin_dir(
    parent: &std::path::Path,
    plugins: &[(&str, &std::path::Path)],
) -> std::path::PathBuf {
    let dir = parent.join("opt-cni-bin");
    std::fs::create_dir_all(&dir).unwrap();
    std::os::unix::fs::symlink(plugin_bin(), dir.join("ipool")).unwrap();
    for (name, path) in plugins {
        std::os::unix::fs::symlink(path, dir.join(name)).unwrap();
    }
    dir
}

/// A main plugin of the test's own that does nothing but answer VERSION with every version
/// up to 1.1.0.
fn noop_plugin(dir: &std::path::Path) -> std::path::PathBuf {
    let path = dir.join("noop-plugin");
    std::fs::write(
        &path,
        "#!/bin/sh\ncat >/dev/null\necho '{\"cniVersion\":\"1.1.0\",\"supportedVersions\":[\"0.3.1\",\"0.4.0\",\"1.0.0\",\"1.1.0\"]}'\n",
    )
    .unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

/// ipoold writing `template` (SOCKET replaced) into its net.d, checking plugins in
/// `bin_dir`; started.
fn daemon_writing(
    template: &str,
    bin_dir: &std::path::Path,
    extra: &[&str],
) -> (Daemon, std::path::PathBuf) {
    let mut d = Daemon::prepare(&[]);
    let conf_dir = d.dir.path().join("net.d");
    std::fs::create_dir_all(&conf_dir).unwrap();
    let path = d.dir.path().join("conflist.json");
    std::fs::write(
        &path,
        template.replace("SOCKET", &d.socket.display().to_string()),
    )
    .unwrap();
    d.add_args(&["--cni-conf-dir", &conf_dir.display().to_string()]);
    d.add_args(&["--cni-conflist-template", &path.display().to_string()]);
    d.add_args(&["--cni-plugin-dir", &bin_dir.display().to_string()]);
    d.add_args(extra);
    d.spawn();
    (d, conf_dir)
}

/// A chain whose every plugin supports CNI 1.1.0 gets a conflist of 1.1.0 (so that runtimes
/// call STATUS and GC), whatever the template says.
#[test]
fn a_chain_that_supports_1_1_0_gets_a_conflist_of_1_1_0() {
    let tmp = tempfile::tempdir().unwrap();
    let noop = noop_plugin(tmp.path());
    let bin = plugin_dir(tmp.path(), &[("noop", &noop)]);
    let template = r#"{"cniVersion":"0.4.0","name":"solo","plugins":[
      {"type":"noop","ipam":{"type":"ipool","socket":"SOCKET"}}]}"#;
    let (_d, conf_dir) = daemon_writing(template, &bin, &[]);
    let path = conf_dir.join("10-ipool.conflist");
    let written = eventually(10, "the conflist", || std::fs::read_to_string(&path));
    let v: serde_json::Value = serde_json::from_str(&written).unwrap();
    assert_eq!(v["cniVersion"], "1.1.0", "{v}");
}

/// A conflist naming a plugin the node lacks is not written (the node would turn Ready and
/// every ADD fail): the log and `ipoolctl status` name the plugin, and the conflist appears
/// once the plugin does.
#[test]
fn a_conflist_naming_a_missing_plugin_waits_for_it() {
    let tmp = tempfile::tempdir().unwrap();
    let noop = noop_plugin(tmp.path());
    let bin = plugin_dir(tmp.path(), &[("noop", &noop)]);
    let template = r#"{"cniVersion":"1.0.0","name":"chain","plugins":[
      {"type":"noop","ipam":{"type":"ipool","socket":"SOCKET"}},
      {"type":"tuning-x"}]}"#;
    let metrics = format!("127.0.0.1:{}", free_port());
    let (d, conf_dir) = daemon_writing(template, &bin, &["--metrics-listen", &metrics]);
    d.wait_log(&["the CNI conflist is not written", "tuning-x"]);
    let problems = || {
        let (_, body) = http_get(&metrics, "/metrics");
        samples(&body).get("ipool_host_problems").copied()
    };
    assert_eq!(problems(), Some(1.0));
    let o = d.ctl(&["status"]);
    assert!(
        stderr(&o).contains("tuning-x") && stderr(&o).contains("conflist not written"),
        "{o:?}"
    );
    assert_eq!(std::fs::read_dir(&conf_dir).unwrap().count(), 0);
    std::os::unix::fs::symlink(&noop, bin.join("tuning-x")).unwrap();
    let path = conf_dir.join("10-ipool.conflist");
    eventually(20, "the conflist once the plugin is there", || {
        std::fs::read_to_string(&path)
    });
    let o = d.ctl(&["status"]);
    assert!(!stderr(&o).contains("conflist not written"), "{o:?}");
    assert_eq!(problems(), Some(0.0));
}

/// Debian's plugins (containernetworking-plugins) support CNI 1.0.0: a conflist of bridge,
/// ipool and portmap is written at 1.0.0.
#[test]
#[ignore = "needs containernetworking-plugins (apt-get install containernetworking-plugins); CI runs it with --include-ignored"]
fn the_conflist_is_written_once_the_socket_is_up_and_kept() {
    require(
        std::path::Path::new("/usr/lib/cni/bridge").exists(),
        "needs /usr/lib/cni/bridge (apt-get install containernetworking-plugins)",
    );
    let tmp = tempfile::tempdir().unwrap();
    let bin = plugin_dir(
        tmp.path(),
        &[
            ("bridge", std::path::Path::new("/usr/lib/cni/bridge")),
            ("portmap", std::path::Path::new("/usr/lib/cni/portmap")),
        ],
    );
    let (mut d, conf_dir) = daemon_writing(TEMPLATE, &bin, &[]);
    let path = conf_dir.join("10-ipool.conflist");
    let written = eventually(10, "the conflist", || std::fs::read_to_string(&path));
    let v: serde_json::Value = serde_json::from_str(&written).expect("JSON");
    assert_eq!(v["plugins"][0]["ipam"]["type"], "ipool");
    assert_eq!(
        v["cniVersion"], "1.0.0",
        "Debian's plugins support up to 1.0.0"
    );
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
