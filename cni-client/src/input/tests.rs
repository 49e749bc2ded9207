use super::*;
use std::time::{Duration, Instant};

fn err(path: &str) -> CniError {
    read_resolv_conf(path).expect_err("should be refused")
}

#[test]
fn stdin_is_read_up_to_its_limit() {
    let at_limit = vec![b' '; STDIN_LIMIT];
    assert_eq!(
        read_config(&at_limit[..]).expect("at the limit").len(),
        STDIN_LIMIT
    );
    // An endless stdin (here: /dev/zero's worth) is cut one byte past the limit.
    let e = read_config(io::repeat(0)).expect_err("endless stdin");
    assert_eq!(e.kind(), io::ErrorKind::FileTooLarge);
    assert!(e.to_string().contains("1 MiB (1048576 bytes)"), "{e}");
}

#[test]
fn a_resolv_conf_at_the_limit_is_read_one_past_it_is_not() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("resolv.conf");
    let line = "nameserver 10.96.0.10\n";
    let mut text = line.repeat(RESOLV_CONF_LIMIT / line.len());
    text.push_str(&"#".repeat(RESOLV_CONF_LIMIT - text.len()));
    std::fs::write(&path, &text).expect("write");
    let p = path.to_str().expect("utf8");
    assert_eq!(read_resolv_conf(p).expect("at the limit"), text);
    text.push('#');
    std::fs::write(&path, &text).expect("write");
    let e = err(p);
    assert_eq!(e.code(), 7);
    assert!(
        e.details().contains(p) && e.details().contains("64 KiB"),
        "{e:?}"
    );
}

#[test]
fn devices_fifos_and_directories_are_refused_at_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fifo = dir.path().join("fifo");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .expect("run mkfifo");
    assert!(made.success());
    let fifo = fifo.to_str().expect("utf8").to_string();
    let d = dir.path().to_str().expect("utf8").to_string();
    let started = Instant::now();
    for (path, kind) in [
        ("/dev/zero", "a character device"),
        (fifo.as_str(), "a FIFO"),
        (d.as_str(), "a directory"),
    ] {
        let e = err(path);
        assert_eq!(e.code(), 7, "{path}");
        assert!(
            e.details().contains(path) && e.details().contains(kind),
            "{e:?}"
        );
    }
    // Opening the FIFO did not wait for a writer.
    assert!(started.elapsed() < Duration::from_secs(2));
    let e = err("/nonexistent/resolv.conf");
    assert_eq!(e.code(), 7);
    assert!(e.details().contains("/nonexistent/resolv.conf"), "{e:?}");
}
