use super::*;

#[test]
fn host_locals_files_are_read_by_container_and_interface() {
    let d = tempfile::tempdir().unwrap();
    let w = |name: &str, body: &str| std::fs::write(d.path().join(name), body).unwrap();
    w("10.1.0.2", "abc\r\neth0");
    w("fd00::2", "abc\r\neth0");
    w("10.1.0.3", "abc\r\nnet1");
    w("10.1.0.4", "old");
    w("10.1.0.5", "");
    w("10.1.0.6", "before\r\neth0");
    w("lock", "");
    w("last_reserved_ip.0", "10.1.0.4");
    let boot = SystemTime::now() - std::time::Duration::from_secs(3600);
    std::fs::File::options()
        .write(true)
        .open(d.path().join("10.1.0.6"))
        .unwrap()
        .set_modified(boot - std::time::Duration::from_secs(60))
        .unwrap();
    let got = read_allocations(d.path(), Some(boot)).unwrap();
    let ip = |s: &str| s.parse::<IpAddr>().unwrap();
    assert_eq!(
        got.allocations,
        vec![
            Allocation {
                container_id: "abc".into(),
                ifname: "eth0".into(),
                ips: vec![ip("10.1.0.2"), ip("fd00::2")],
            },
            Allocation {
                container_id: "abc".into(),
                ifname: "net1".into(),
                ips: vec![ip("10.1.0.3")],
            },
            Allocation {
                container_id: "old".into(),
                ifname: "eth0".into(),
                ips: vec![ip("10.1.0.4")],
            },
        ]
    );
    assert_eq!(got.stale, vec![ip("10.1.0.6")], "written before the boot");
    let none = read_allocations(&d.path().join("none"), None).unwrap();
    assert_eq!(none, Found::default());
}

#[test]
fn this_machine_booted_in_the_past() {
    let at = booted_at().expect("/proc/stat's btime");
    assert!(at < SystemTime::now());
}
