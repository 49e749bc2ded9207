use super::*;

#[test]
fn the_socket_asked_is_the_configs_or_a_well_known_one_and_empty_turns_it_off() {
    let t = Duration::from_secs(1);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    assert!(rt.block_on(Runtime::configured(Some(""), t)).is_none());
    let r = rt
        .block_on(Runtime::configured(Some("/x/cri.sock"), t))
        .expect("named, answering or not");
    assert_eq!(r.path(), Path::new("/x/cri.sock"));
    // Unset: a well-known socket only if it answers the CRI (this machine's, if any).
    if let Some(r) = rt.block_on(Runtime::configured(None, t)) {
        assert!(WELL_KNOWN.iter().any(|p| r.path() == Path::new(p)));
        assert!(rt.block_on(r.answers()).is_ok());
    }
}

#[test]
fn a_runtime_that_is_not_there_does_not_answer() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let r = Runtime::new(dir.path().join("none.sock"), Duration::from_millis(200));
    let e = rt.block_on(r.ready_sandboxes()).expect_err("no answer");
    assert!(e.0.contains("none.sock"), "{e}");
}

#[test]
fn a_pod_runs_by_its_uid_or_without_one_by_its_name() {
    let ready = [SandboxPod {
        namespace: "app".into(),
        name: "a".into(),
        uid: "u1".into(),
    }];
    let pod = |name: &str, uid: &str| crate::model::Pod {
        namespace: "app".into(),
        name: name.into(),
        uid: uid.into(),
    };
    assert!(runs(&ready, &pod("a", "u1")));
    // The same name, another pod: its sandbox is gone.
    assert!(!runs(&ready, &pod("a", "u2")));
    assert!(runs(&ready, &pod("a", "")));
    assert!(!runs(&ready, &pod("b", "")));
}
