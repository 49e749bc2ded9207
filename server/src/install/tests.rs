use super::*;
use std::os::unix::fs::MetadataExt;

#[test]
fn writes_then_leaves_identical_content_alone() {
    let dir = tempfile::tempdir().unwrap();
    let dest = dir.path().join("10-ipool.conflist");
    assert_eq!(
        install_bytes(&dest, b"one", 0o644).unwrap(),
        Outcome::Written
    );
    let first = fs::metadata(&dest).unwrap();
    assert_eq!(first.mode() & 0o7777, 0o644);
    assert_eq!(
        install_bytes(&dest, b"one", 0o644).unwrap(),
        Outcome::Unchanged
    );
    assert_eq!(
        fs::metadata(&dest).unwrap().ino(),
        first.ino(),
        "not rewritten"
    );
    assert_eq!(
        install_bytes(&dest, b"two", 0o644).unwrap(),
        Outcome::Written
    );
    assert_eq!(fs::read(&dest).unwrap(), b"two");
    // No temp file is left, and none was ever named like a config.
    let names: Vec<String> = fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, ["10-ipool.conflist"]);
}

/// Spawns `cmd`, again while the file is busy: a child another test thread forked may hold a
/// just-written file open until it execs.
fn spawn(cmd: &mut std::process::Command) -> std::process::Child {
    for _ in 0..100 {
        match cmd.spawn() {
            Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) => {
                std::thread::sleep(std::time::Duration::from_millis(10))
            }
            r => return r.unwrap(),
        }
    }
    panic!("{cmd:?} stayed busy")
}

#[test]
fn replaces_a_binary_that_is_executing() {
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("sleeper");
    install_file(Path::new("/bin/sleep"), &bin, 0o755).unwrap();
    let mut running = spawn(std::process::Command::new(&bin).arg("30"));
    // A plain write over it fails: the file is busy.
    let busy = OpenOptions::new().write(true).open(&bin);
    assert_eq!(busy.unwrap_err().raw_os_error(), Some(libc::ETXTBSY));
    assert_eq!(
        install_file(Path::new("/bin/true"), &bin, 0o755).unwrap(),
        Outcome::Written
    );
    assert_eq!(fs::read(&bin).unwrap(), fs::read("/bin/true").unwrap());
    assert!(spawn(&mut std::process::Command::new(&bin))
        .wait()
        .unwrap()
        .success());
    running.kill().unwrap();
    running.wait().unwrap();
}

#[test]
fn a_conflist_template_must_name_ipool_on_the_daemons_socket() {
    let sock = Path::new("/run/ipool/ipool.sock");
    let good = r#"{"cniVersion":"1.0.0","name":"k8s-pod-network","plugins":[
        {"type":"bridge","ipam":{"type":"ipool","socket":"/run/ipool/ipool.sock"}},
        {"type":"portmap","capabilities":{"portMappings":true}}]}"#;
    let out = render_conflist(good, sock).unwrap();
    assert!(out.contains("\"ipool\"") && out.ends_with("}\n"));
    for (t, needle) in [
        ("not json", "not JSON"),
        (r#"{"name":"n"}"#, "no \"plugins\""),
        (r#"{"plugins":[]}"#, "no \"name\""),
        (
            r#"{"name":"n","plugins":[{"type":"bridge","ipam":{"type":"host-local"}}]}"#,
            "\"type\": \"ipool\"",
        ),
        (
            r#"{"name":"n","plugins":[{"type":"bridge","ipam":{"type":"ipool","socket":"/x.sock"}}]}"#,
            "/x.sock",
        ),
    ] {
        let e = render_conflist(t, sock).unwrap_err();
        assert!(e.0.contains(needle), "{t}: {e}");
    }
}
