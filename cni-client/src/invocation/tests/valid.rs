//! Valid invocations: what `parse` makes of a correct env and config for each verb (fields,
//! versions, netns rules, CNI_ARGS forms).

use super::*;

#[test]
fn add_with_full_env_gives_every_call_field() {
    let c = conf("1.0.0");
    let call = parse_ok(&full_env("ADD"), stdin_of(&c));
    assert_eq!(call.command, Command::Add);
    assert_eq!(call.version, "1.0.0");
    assert_eq!(call.network, "k8s-pod-network");
    assert_eq!(call.container_id, CID);
    assert_eq!(call.ifname, "eth0");
    assert_eq!(call.netns, NETNS);
    assert_eq!(
        call.pod,
        PodArgs {
            namespace: "kube-system".into(),
            name: "coredns-abc".into(),
            uid: "6f1c1a9e-1c2d-4e5f-8a9b-0c1d2e3f4a5b".into(),
        }
    );
    assert_eq!(call.socket, "/run/ipool/ipool.sock");
    assert_eq!(call.socket, DEFAULT_SOCKET);
    assert_eq!(call.timeout, Duration::from_millis(10_000));
    assert_eq!(call.timeout, Duration::from_millis(DEFAULT_TIMEOUT_MS));
    assert!(call.prev_addresses.is_empty());
    let ipam: Value = serde_json::from_str(&call.ipam_json).expect("ipam_json is JSON");
    assert_eq!(ipam, c["ipam"]);
}

#[test]
fn ipam_json_is_only_the_ipam_object() {
    let mut c = conf("1.0.0");
    c["ipam"]["nested"] = json!({"a": [1, 2.5, null, true, "é\u{1F600}"], "b": {}});
    let call = parse_ok(&full_env("ADD"), stdin_of(&c));
    let ipam: Value = serde_json::from_str(&call.ipam_json).expect("ipam_json is JSON");
    assert_eq!(ipam, c["ipam"]);
    assert!(ipam.get("name").is_none() && ipam.get("cniVersion").is_none());
}

/// Known issue: `ipam_json` is `Value::to_string()` of the parsed config, and serde_json is
/// built without `float_roundtrip`, so a float with 16-17 significant digits can come out
/// 1 ULP off (and an integer above u64::MAX turns into a float). The daemon then sees another
/// number than the operator wrote. Un-ignore once the ipam object is passed through exactly
/// (serde_json `float_roundtrip`, or `raw_value` with `Box<RawValue>`).
#[test]
fn ipam_json_keeps_floats_exactly() {
    let text =
        r#"{"cniVersion":"1.0.0","name":"n","ipam":{"type":"ipool","x":1.0715660391465826e-75}}"#;
    let call = parse_ok(&full_env("ADD"), raw(text));
    assert!(
        call.ipam_json.contains("1.0715660391465826e-75"),
        "ipam_json is {}",
        call.ipam_json
    );
}

#[test]
fn ipam_socket_and_timeout_override_the_defaults() {
    let mut c = conf("1.0.0");
    c["ipam"]["socket"] = json!("/tmp/other/ipool.sock");
    c["ipam"]["timeoutMs"] = json!(2500);
    let call = parse_ok(&full_env("ADD"), stdin_of(&c));
    assert_eq!(call.socket, "/tmp/other/ipool.sock");
    assert_eq!(call.timeout, Duration::from_millis(2500));
    // The re-serialized ipam still carries them (the daemon may ignore them).
    let ipam: Value = serde_json::from_str(&call.ipam_json).expect("ipam_json is JSON");
    assert_eq!(ipam, c["ipam"]);
}

#[test]
fn timeout_bounds_are_inclusive() {
    for ms in [1u64, 600_000] {
        let mut c = conf("1.0.0");
        c["ipam"]["timeoutMs"] = json!(ms);
        let call = parse_ok(&full_env("ADD"), stdin_of(&c));
        assert_eq!(call.timeout, Duration::from_millis(ms));
    }
}

#[test]
fn every_supported_version_is_accepted_and_answered_in() {
    for v in SUPPORTED_VERSIONS {
        for cmd in ["ADD", "DEL"] {
            let call = parse_ok(&full_env(cmd), stdin_of(&conf(v)));
            assert_eq!(call.version, *v, "{cmd} {v}");
        }
    }
}

#[test]
fn del_needs_no_netns() {
    let env = without(full_env("DEL"), "CNI_NETNS");
    let call = parse_ok(&env, stdin_of(&conf("1.0.0")));
    assert_eq!(call.command, Command::Del);
    assert_eq!(call.netns, "");
    assert_eq!(call.container_id, CID);
    assert_eq!(call.ifname, "eth0");
    // An empty CNI_NETNS is as good as none.
    let env = with(full_env("DEL"), "CNI_NETNS", "");
    assert_eq!(parse_ok(&env, stdin_of(&conf("1.0.0"))).netns, "");
}

#[test]
fn del_with_netns_keeps_it() {
    let call = parse_ok(&full_env("DEL"), stdin_of(&conf("0.4.0")));
    assert_eq!(call.netns, NETNS);
}

#[test]
fn del_still_needs_container_id_and_ifname() {
    for k in ["CNI_CONTAINERID", "CNI_IFNAME"] {
        let env = without(full_env("DEL"), k);
        let e = parse_err(&env, stdin_of(&conf("0.4.0")));
        assert_err(&e, 4, &[k]);
        assert_eq!(e.version, "0.4.0");
    }
}

#[test]
fn add_and_check_need_netns() {
    let e = parse_err(
        &without(full_env("ADD"), "CNI_NETNS"),
        stdin_of(&conf("1.0.0")),
    );
    assert_err(&e, 4, &["CNI_NETNS"]);
    let e = parse_err(
        &without(full_env("CHECK"), "CNI_NETNS"),
        stdin_of(&check_conf("0.4.0")),
    );
    assert_err(&e, 4, &["CNI_NETNS"]);
    assert_eq!(e.version, "0.4.0");
}

#[test]
fn add_ignores_prev_result() {
    let call = parse_ok(&full_env("ADD"), stdin_of(&check_conf("1.0.0")));
    assert!(call.prev_addresses.is_empty());
}

#[test]
fn missing_cni_args_gives_an_empty_pod() {
    let call = parse_ok(
        &without(full_env("ADD"), "CNI_ARGS"),
        stdin_of(&conf("1.0.0")),
    );
    assert_eq!(call.pod, PodArgs::default());
    let call = parse_ok(
        &with(full_env("ADD"), "CNI_ARGS", ""),
        stdin_of(&conf("1.0.0")),
    );
    assert_eq!(call.pod, PodArgs::default());
}

#[test]
fn cni_args_without_ignore_unknown_and_empty_segments() {
    let env = with(
        full_env("ADD"),
        "CNI_ARGS",
        ";K8S_POD_NAMESPACE=ns;;K8S_POD_NAME=p;K8S_POD_UID=u;K8S_POD_INFRA_CONTAINER_ID=x;",
    );
    let call = parse_ok(&env, stdin_of(&conf("1.0.0")));
    assert_eq!(
        call.pod,
        PodArgs {
            namespace: "ns".into(),
            name: "p".into(),
            uid: "u".into()
        }
    );
}
