//! Tests of `parse`: unit tests per rule of the CNI spec, then property tests (no panics,
//! clean errors, structured fuzzing of a valid config, generated valid names accepted).

use super::*;
use proptest::prelude::*;
use serde_json::json;

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

const CID: &str = "0123456789abcdef0123456789abcdef";
const NETNS: &str = "/var/run/netns/cni-1234";

fn env_of(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Every variable an ADD or CHECK needs, plus a Kubernetes CNI_ARGS.
fn full_env(command: &str) -> HashMap<String, String> {
    env_of(&[
        ("CNI_COMMAND", command),
        ("CNI_CONTAINERID", CID),
        ("CNI_NETNS", NETNS),
        ("CNI_IFNAME", "eth0"),
        (
            "CNI_ARGS",
            "IgnoreUnknown=1;K8S_POD_NAMESPACE=kube-system;K8S_POD_NAME=coredns-abc;\
             K8S_POD_INFRA_CONTAINER_ID=0123456789abcdef0123456789abcdef;\
             K8S_POD_UID=6f1c1a9e-1c2d-4e5f-8a9b-0c1d2e3f4a5b",
        ),
        ("CNI_PATH", "/opt/cni/bin:/usr/lib/cni"),
    ])
}

fn with(mut env: HashMap<String, String>, k: &str, v: &str) -> HashMap<String, String> {
    env.insert(k.to_string(), v.to_string());
    env
}

fn without(mut env: HashMap<String, String>, k: &str) -> HashMap<String, String> {
    env.remove(k);
    env
}

/// A valid network config as a runtime hands it to an IPAM plugin.
fn conf(version: &str) -> Value {
    json!({
        "cniVersion": version,
        "name": "k8s-pod-network",
        "type": "bridge",
        "bridge": "cni0",
        "ipam": {
            "type": "ipool",
            "pool": "default",
            "ranges": [[{"subnet": "10.1.0.0/16", "gateway": "10.1.0.1"}]],
            "routes": [{"dst": "0.0.0.0/0"}]
        }
    })
}

/// A valid CHECK config: `conf` plus a prevResult in the version's format.
fn check_conf(version: &str) -> Value {
    let mut c = conf(version);
    c["prevResult"] = json!({
        "cniVersion": version,
        "ips": [
            {"version": "4", "address": "10.1.0.5/16", "gateway": "10.1.0.1"},
            {"version": "6", "address": "fd00::5/64"}
        ],
        "routes": [{"dst": "0.0.0.0/0"}]
    });
    c
}

fn stdin_of(v: &Value) -> std::io::Result<Vec<u8>> {
    Ok(serde_json::to_vec(v).expect("serializing a test config"))
}

fn raw(s: &str) -> std::io::Result<Vec<u8>> {
    Ok(s.as_bytes().to_vec())
}

fn parse_ok(env: &HashMap<String, String>, stdin: std::io::Result<Vec<u8>>) -> Call {
    parse(env, stdin).expect("parse should accept this invocation")
}

fn parse_err(env: &HashMap<String, String>, stdin: std::io::Result<Vec<u8>>) -> VersionedError {
    parse(env, stdin).expect_err("parse should reject this invocation")
}

/// Asserts the error's code and that its details mention every one of `words`.
fn assert_err(e: &VersionedError, code: u32, words: &[&str]) {
    assert_eq!(e.error.code(), code, "wrong code for {e:?}");
    for w in words {
        assert!(
            e.error.details().contains(w),
            "details {:?} should mention {w:?}",
            e.error.details()
        );
    }
}

/// The properties every error must have: a code `parse` may return, and a well-formed JSON.
fn assert_clean_err(e: &VersionedError) {
    let code = e.error.code();
    assert!((1..=7).contains(&code), "unexpected code {code} in {e:?}");
    assert!(
        SUPPORTED_VERSIONS.contains(&e.version.as_str()),
        "error version {:?} is not one ipool speaks",
        e.version
    );
    assert!(!e.error.details().is_empty(), "empty details in {e:?}");
    let v: Value = serde_json::from_str(&e.to_json()).expect("error JSON must parse");
    assert_eq!(v["cniVersion"].as_str(), Some(e.version.as_str()));
    assert_eq!(v["code"].as_u64(), Some(u64::from(code)));
    assert!(
        v["msg"].as_str().is_some_and(|m| !m.is_empty()),
        "msg missing in {v}"
    );
    assert_eq!(v["details"].as_str(), Some(e.error.details()));
    let keys: Vec<&String> = v
        .as_object()
        .expect("error JSON is an object")
        .keys()
        .collect();
    assert_eq!(keys.len(), 4, "unexpected keys in {v}");
}

// ---------------------------------------------------------------------------------------------
// Valid invocations
// ---------------------------------------------------------------------------------------------

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

// ---------------------------------------------------------------------------------------------
// CNI_COMMAND and the environment
// ---------------------------------------------------------------------------------------------

#[test]
fn missing_command_is_code_4() {
    for env in [
        without(full_env("ADD"), "CNI_COMMAND"),
        with(full_env("ADD"), "CNI_COMMAND", ""),
        HashMap::new(),
    ] {
        let e = parse_err(&env, stdin_of(&conf("0.4.0")));
        assert_err(&e, 4, &["CNI_COMMAND"]);
        // The config has not been read yet: the fallback version.
        assert_eq!(e.version, FALLBACK_VERSION);
    }
}

#[test]
fn unknown_command_is_code_4_and_named() {
    for cmd in [
        "FOO", "add", "Add", "gc", "Status", " ADD", "ADD ", "DELETE",
    ] {
        let e = parse_err(&full_env(cmd), stdin_of(&conf("1.0.0")));
        assert_err(&e, 4, &["CNI_COMMAND", cmd]);
    }
}

#[test]
fn several_missing_vars_are_named_in_one_message() {
    let env = env_of(&[("CNI_COMMAND", "ADD")]);
    let e = parse_err(&env, stdin_of(&conf("0.3.1")));
    assert_err(&e, 4, &["CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME"]);
    assert_eq!(e.version, "0.3.1");

    let env = env_of(&[("CNI_COMMAND", "ADD"), ("CNI_NETNS", NETNS)]);
    let e = parse_err(&env, stdin_of(&conf("1.0.0")));
    assert_err(&e, 4, &["CNI_CONTAINERID", "CNI_IFNAME"]);
    assert!(!e.error.details().contains("CNI_NETNS"), "{e:?}");

    let env = env_of(&[("CNI_COMMAND", "DEL")]);
    let e = parse_err(&env, stdin_of(&conf("1.0.0")));
    assert_err(&e, 4, &["CNI_CONTAINERID", "CNI_IFNAME"]);
    assert!(!e.error.details().contains("CNI_NETNS"), "{e:?}");
}

#[test]
fn empty_vars_count_as_missing() {
    let env = with(
        with(full_env("ADD"), "CNI_IFNAME", ""),
        "CNI_CONTAINERID",
        "",
    );
    let e = parse_err(&env, stdin_of(&conf("1.0.0")));
    assert_err(&e, 4, &["CNI_CONTAINERID", "CNI_IFNAME"]);
}

#[test]
fn invalid_container_ids_are_code_4() {
    for id in [
        "-abc", "a/b", "_abc", ".abc", "ab c", "ab:c", "abc\n", "é", "aé", "a;b", "a=b", "a\0b",
        " abc",
    ] {
        let env = with(full_env("ADD"), "CNI_CONTAINERID", id);
        let e = parse_err(&env, stdin_of(&conf("0.4.0")));
        assert_err(&e, 4, &["CNI_CONTAINERID"]);
        assert_eq!(e.version, "0.4.0", "{id:?}");
    }
    // An empty ID is reported as unset.
    let e = parse_err(
        &with(full_env("ADD"), "CNI_CONTAINERID", ""),
        stdin_of(&conf("0.4.0")),
    );
    assert_err(&e, 4, &["CNI_CONTAINERID"]);
}

#[test]
fn valid_container_ids_are_kept() {
    for id in ["a", "0", "Z9", "abc_def.ghi-1", "a-", "a.", "a__..--", CID] {
        let env = with(full_env("ADD"), "CNI_CONTAINERID", id);
        assert_eq!(parse_ok(&env, stdin_of(&conf("1.0.0"))).container_id, id);
    }
}

#[test]
fn invalid_ifnames_are_code_4() {
    for ifname in [
        ".",
        "..",
        "abcdefghijklmnop",      // 16 chars
        "abcdefghijklmnopqrstu", // 21 chars
        "a/b",
        "/",
        "eth0:1",
        ":",
        "a b",
        " eth0",
        "eth0 ",
        "a\tb",
        "a\nb",
        "a\u{a0}b",  // no-break space
        "ééééééééé", // 9 chars but 18 bytes: the kernel limit (IFNAMSIZ) is in bytes
    ] {
        let env = with(full_env("ADD"), "CNI_IFNAME", ifname);
        let e = parse_err(&env, stdin_of(&conf("1.0.0")));
        assert_err(&e, 4, &["CNI_IFNAME"]);
    }
    let e = parse_err(
        &with(full_env("ADD"), "CNI_IFNAME", ""),
        stdin_of(&conf("1.0.0")),
    );
    assert_err(&e, 4, &["CNI_IFNAME"]);
}

#[test]
fn valid_ifnames_are_kept() {
    for ifname in [
        "eth0",
        "e",
        "abcdefghijklmno", // 15 chars, the limit
        "net1.100",
        "eth-0_x",
        "...",
        ".a",
        "veth@x",
    ] {
        let env = with(full_env("ADD"), "CNI_IFNAME", ifname);
        assert_eq!(parse_ok(&env, stdin_of(&conf("1.0.0"))).ifname, ifname);
    }
}

#[test]
fn check_name_and_check_ifname_directly() {
    assert!(check_name("network name", "net-1").is_ok());
    let m = check_name("network name", "").expect_err("empty name");
    assert!(m.contains("network name"), "{m}");
    let m = check_name("X", "-a").expect_err("leading dash");
    assert!(m.contains("\"-a\""), "{m}");
    let m = check_name("X", "a/b").expect_err("slash");
    assert!(m.contains("'/'"), "{m}");
    assert!(check_ifname("abcdefghijklmno").is_ok());
    let m = check_ifname("abcdefghijklmnop").expect_err("16 bytes");
    assert!(m.contains("15"), "{m}");
}

// ---------------------------------------------------------------------------------------------
// CNI_ARGS
// ---------------------------------------------------------------------------------------------

#[test]
fn cni_args_pair_without_equals_is_code_4() {
    for args in [
        "K8S_POD_NAME",
        "K8S_POD_NAME=a;garbage",
        "IgnoreUnknown=1;x",
    ] {
        let env = with(full_env("ADD"), "CNI_ARGS", args);
        let e = parse_err(&env, stdin_of(&conf("0.4.0")));
        assert_err(&e, 4, &["CNI_ARGS", "KEY=VALUE"]);
        assert_eq!(e.version, "0.4.0");
    }
}

#[test]
fn unknown_cni_args_key_needs_ignore_unknown() {
    for args in [
        "FOO=bar",
        "K8S_POD_NAME=a;FOO=bar",
        "FOO=bar;IgnoreUnknown=0",
        "FOO=bar;IgnoreUnknown=false",
        "FOO=bar;IgnoreUnknown=yes",
        "FOO=bar;IgnoreUnknown=",
        "FOO=bar;ignoreunknown=1",
    ] {
        let env = with(full_env("ADD"), "CNI_ARGS", args);
        let e = parse_err(&env, stdin_of(&conf("1.0.0")));
        assert_err(&e, 4, &["CNI_ARGS", "FOO"]);
    }
    for args in [
        "FOO=bar;IgnoreUnknown=1",
        "IgnoreUnknown=1;FOO=bar",
        "FOO=bar;IgnoreUnknown=true",
        "FOO=bar;IgnoreUnknown=TRUE",
        "FOO=bar;IgnoreUnknown=True",
        "IgnoreUnknown=true;K8S_POD_NAME=p;FOO=;BAR=x=y",
    ] {
        let env = with(full_env("ADD"), "CNI_ARGS", args);
        let call = parse_ok(&env, stdin_of(&conf("1.0.0")));
        if args.contains("K8S_POD_NAME=p") {
            assert_eq!(call.pod.name, "p");
        }
    }
}

#[test]
fn cni_args_ip_requests_static_addresses() {
    for (args, want) in [
        ("IP=10.1.0.9", vec!["10.1.0.9"]),
        (
            "IgnoreUnknown=1;IP=10.1.0.9,fd00::9",
            vec!["10.1.0.9", "fd00::9"],
        ),
        ("IP=10.1.0.9/16", vec!["10.1.0.9"]),
    ] {
        let env = with(full_env("ADD"), "CNI_ARGS", args);
        let call = parse_ok(&env, stdin_of(&conf("1.0.0")));
        assert_eq!(call.requested_ips, want, "{args}");
    }
    for args in ["IP=", "IP=10.1.0.300", "IP=10.1.0.9,,fd00::1", "IP=host"] {
        let env = with(full_env("ADD"), "CNI_ARGS", args);
        let e = parse_err(&env, stdin_of(&conf("1.0.0")));
        assert_err(&e, 4, &["CNI_ARGS", "IP"]);
    }
    // Only ADD asks for addresses.
    let env = with(full_env("DEL"), "CNI_ARGS", "IP=10.1.0.9");
    assert!(parse_ok(&env, stdin_of(&conf("1.0.0")))
        .requested_ips
        .is_empty());
}

#[test]
fn cni_args_last_value_wins_and_values_may_be_empty() {
    let env = with(
        full_env("ADD"),
        "CNI_ARGS",
        "K8S_POD_NAME=a;K8S_POD_NAME=b;K8S_POD_NAMESPACE=",
    );
    let call = parse_ok(&env, stdin_of(&conf("1.0.0")));
    assert_eq!(call.pod.name, "b");
    assert_eq!(call.pod.namespace, "");
}

// ---------------------------------------------------------------------------------------------
// stdin and the network config
// ---------------------------------------------------------------------------------------------

#[test]
fn stdin_read_error_is_code_5() {
    for cmd in ["ADD", "DEL", "CHECK"] {
        let e = parse_err(&full_env(cmd), Err(std::io::Error::other("x")));
        assert_err(&e, 5, &["stdin"]);
        assert_eq!(e.version, FALLBACK_VERSION);
    }
}

#[test]
fn bad_json_is_code_6() {
    let bad: [&[u8]; 8] = [
        b"",
        b"{",
        b"not json",
        b"{\"cniVersion\": \"1.0.0\",}",
        b"{\"cniVersion\": \"1.0.0\"} trailing",
        b"\xff\xfe{}",
        b"{\"name\": \"\xff\"}",
        b"   ",
    ];
    for b in bad {
        let e = parse_err(&full_env("ADD"), Ok(b.to_vec()));
        assert_err(&e, 6, &["JSON"]);
        assert_eq!(e.version, FALLBACK_VERSION);
    }
}

#[test]
fn json_that_is_not_an_object_is_code_6() {
    for s in [
        "[]",
        "[{\"cniVersion\":\"1.0.0\"}]",
        "1",
        "\"x\"",
        "null",
        "true",
    ] {
        let e = parse_err(&full_env("ADD"), raw(s));
        assert_err(&e, 6, &["object"]);
    }
}

#[test]
fn missing_cni_version_is_code_1() {
    let mut c = conf("1.0.0");
    c.as_object_mut()
        .expect("conf is an object")
        .remove("cniVersion");
    let e = parse_err(&full_env("ADD"), stdin_of(&c));
    assert_err(&e, 1, &["cniVersion"]);
    assert_eq!(e.version, FALLBACK_VERSION);
}

#[test]
fn unsupported_cni_version_is_code_1_and_named() {
    for v in [
        "0.1.0", "0.2.0", "1.2.0", "2.0.0", "1.0", "", "v1.0.0", "1.0.0 ",
    ] {
        let e = parse_err(&full_env("ADD"), stdin_of(&conf(v)));
        assert_err(&e, 1, &["cniVersion", &format!("{v:?}")]);
        // The version is not one ipool speaks, so it answers in its own.
        assert_eq!(e.version, FALLBACK_VERSION);
    }
}

#[test]
fn non_string_cni_version_is_code_7() {
    for v in [
        json!(1),
        json!(1.0),
        json!(null),
        json!([]),
        json!({}),
        json!(true),
    ] {
        let mut c = conf("1.0.0");
        c["cniVersion"] = v;
        let e = parse_err(&full_env("ADD"), stdin_of(&c));
        assert_err(&e, 7, &["cniVersion"]);
    }
}

#[test]
fn missing_or_invalid_name_is_code_7() {
    let mut c = conf("0.4.0");
    c.as_object_mut().expect("conf is an object").remove("name");
    let e = parse_err(&full_env("ADD"), stdin_of(&c));
    assert_err(&e, 7, &["name"]);
    assert_eq!(e.version, "0.4.0");

    for name in [
        json!(""),
        json!("-net"),
        json!("a b"),
        json!("a/b"),
        json!("né"),
        json!(5),
        json!(null),
        json!(["net"]),
        json!({"n": "net"}),
    ] {
        let mut c = conf("0.4.0");
        c["name"] = name.clone();
        let e = parse_err(&full_env("ADD"), stdin_of(&c));
        assert_err(&e, 7, &["name"]);
        assert_eq!(e.version, "0.4.0", "{name}");
    }
}

#[test]
fn missing_or_non_object_ipam_is_code_7() {
    let mut c = conf("0.3.1");
    c.as_object_mut().expect("conf is an object").remove("ipam");
    let e = parse_err(&full_env("ADD"), stdin_of(&c));
    assert_err(&e, 7, &["ipam"]);
    assert_eq!(e.version, "0.3.1");

    for ipam in [
        json!("ipool"),
        json!(1),
        json!([]),
        json!(null),
        json!(false),
    ] {
        let mut c = conf("0.3.1");
        c["ipam"] = ipam.clone();
        let e = parse_err(&full_env("ADD"), stdin_of(&c));
        assert_err(&e, 7, &["ipam"]);
        assert_eq!(e.version, "0.3.1", "{ipam}");
    }
}

#[test]
fn static_ips_precedence_runtime_config_then_args_then_cni_args() {
    let env = with(full_env("ADD"), "CNI_ARGS", "IgnoreUnknown=1;IP=10.1.0.7");
    let mut c = conf("1.0.0");
    assert_eq!(parse_ok(&env, stdin_of(&c)).requested_ips, vec!["10.1.0.7"]);
    c["args"] = json!({"cni": {"ips": ["10.1.0.8/16"]}});
    assert_eq!(parse_ok(&env, stdin_of(&c)).requested_ips, vec!["10.1.0.8"]);
    c["runtimeConfig"] = json!({"ips": ["10.1.0.9/16", "fd00::9/64"]});
    assert_eq!(
        parse_ok(&env, stdin_of(&c)).requested_ips,
        vec!["10.1.0.9", "fd00::9"]
    );
    // An empty list names nothing and does not win.
    c["runtimeConfig"] = json!({"ips": []});
    assert_eq!(parse_ok(&env, stdin_of(&c)).requested_ips, vec!["10.1.0.8"]);
}

#[test]
fn bad_static_ips_are_code_7_naming_the_key() {
    for (key, v) in [
        (
            "args.cni.ips[0]",
            json!({"args": {"cni": {"ips": ["nope"]}}}),
        ),
        (
            "args.cni.ips[1]",
            json!({"args": {"cni": {"ips": ["10.1.0.1", 5]}}}),
        ),
        (
            "runtimeConfig.ips[0]",
            json!({"runtimeConfig": {"ips": ["10.1.0.300/16"]}}),
        ),
    ] {
        let mut c = conf("1.0.0");
        for (k, x) in v.as_object().expect("object") {
            c[k] = x.clone();
        }
        let e = parse_err(&full_env("ADD"), stdin_of(&c));
        assert_err(&e, 7, &[key]);
    }
}

#[test]
fn gc_and_status_need_1_1_0_and_no_container() {
    let env = env_of(&[("CNI_COMMAND", "GC"), ("CNI_PATH", "/opt/cni/bin")]);
    let mut c = conf("1.1.0");
    c["cni.dev/valid-attachments"] =
        json!([{"containerID": "abc", "ifname": "eth0"}, {"containerID": "def", "ifname": "net1"}]);
    let call = parse_ok(&env, stdin_of(&c));
    assert_eq!(call.command, Command::Gc);
    assert_eq!(
        call.valid_attachments,
        vec![
            ("abc".to_string(), "eth0".to_string()),
            ("def".to_string(), "net1".to_string())
        ]
    );
    // Without the list GC would release everything: refused.
    let e = parse_err(&env, stdin_of(&conf("1.1.0")));
    assert_err(&e, 7, &["cni.dev/valid-attachments"]);
    c["cni.dev/valid-attachments"] = json!([{"containerID": "abc"}]);
    let e = parse_err(&env, stdin_of(&c));
    assert_err(&e, 7, &["[0].ifname"]);
    // Defined from 1.1.0 on.
    let e = parse_err(&env, stdin_of(&conf("1.0.0")));
    assert_err(&e, 1, &["GC", "1.1.0"]);

    let env = env_of(&[("CNI_COMMAND", "STATUS")]);
    assert_eq!(
        parse_ok(&env, stdin_of(&conf("1.1.0"))).command,
        Command::Status
    );
    let e = parse_err(&env, stdin_of(&conf("0.4.0")));
    assert_err(&e, 1, &["STATUS"]);
}

#[test]
fn cni_versions_list_picks_the_newest_supported() {
    let mut c = conf("1.0.0");
    let o = c.as_object_mut().expect("object");
    o.remove("cniVersion");
    o.insert("cniVersions".into(), json!(["0.4.0", "1.0.0", "9.9.9"]));
    let call = parse_ok(&full_env("ADD"), stdin_of(&c));
    assert_eq!(call.version, "1.0.0");
    c["cniVersions"] = json!(["0.1.0", "9.9.9"]);
    assert_err(
        &parse_err(&full_env("ADD"), stdin_of(&c)),
        1,
        &["cniVersions"],
    );
    c["cniVersions"] = json!("1.0.0");
    assert_err(
        &parse_err(&full_env("ADD"), stdin_of(&c)),
        7,
        &["cniVersions"],
    );
}

#[test]
fn resolv_conf_and_dns_keys() {
    let mut c = conf("1.0.0");
    c["ipam"]["resolvConf"] = json!("/etc/resolv.conf");
    c["ipam"]["dns"] = json!({"nameservers": ["10.0.0.10"]});
    let call = parse_ok(&full_env("ADD"), stdin_of(&c));
    assert_eq!(call.resolv_conf.as_deref(), Some("/etc/resolv.conf"));
    assert_eq!(call.dns, Some(json!({"nameservers": ["10.0.0.10"]})));
    c["ipam"]["resolvConf"] = json!(5);
    assert_err(
        &parse_err(&full_env("ADD"), stdin_of(&c)),
        7,
        &["ipam.resolvConf"],
    );
    c["ipam"]["resolvConf"] = json!(null);
    c["ipam"]["dns"] = json!(["x"]);
    assert_err(&parse_err(&full_env("ADD"), stdin_of(&c)), 7, &["ipam.dns"]);
}

#[test]
fn static_ips_that_are_not_a_list_are_rejected() {
    for (key, c) in [
        (
            "args.cni.ips",
            json!({"args": {"cni": {"ips": "10.1.0.9/16"}}}),
        ),
        (
            "runtimeConfig.ips",
            json!({"runtimeConfig": {"ips": {"a": "10.1.0.9/16"}}}),
        ),
    ] {
        let mut full = conf("1.0.0");
        for (k, v) in c.as_object().expect("object") {
            full[k] = v.clone();
        }
        let e = parse(&full_env("ADD"), stdin_of(&full)).expect_err(key);
        assert!(matches!(e.error.code(), 2 | 7), "{e:?}");
        assert!(e.error.details().contains(key), "{e:?}");
    }
}

#[test]
fn empty_static_ips_and_other_args_are_fine() {
    let mut c = conf("1.0.0");
    c["args"] = json!({"cni": {"ips": [], "other": 1}, "k8s": {"x": "y"}});
    c["runtimeConfig"] = json!({"ips": [], "portMappings": []});
    parse_ok(&full_env("ADD"), stdin_of(&c));
}

#[test]
fn bad_timeout_is_code_7() {
    for t in [
        json!(0),
        json!(-1),
        json!(-10_000),
        json!("1000"),
        json!(600_001),
        json!(u64::MAX),
        json!(1.5),
        json!(null),
        json!(true),
        json!([1000]),
    ] {
        let mut c = conf("0.4.0");
        c["ipam"]["timeoutMs"] = t.clone();
        let e = parse_err(&full_env("ADD"), stdin_of(&c));
        assert_err(&e, 7, &["timeoutMs"]);
        assert_eq!(e.version, "0.4.0", "{t}");
    }
}

#[test]
fn bad_socket_is_code_7() {
    for s in [json!(""), json!(1), json!(null), json!(["/run/x.sock"])] {
        let mut c = conf("1.0.0");
        c["ipam"]["socket"] = s.clone();
        let e = parse_err(&full_env("ADD"), stdin_of(&c));
        assert_err(&e, 7, &["ipam.socket"]);
    }
}

// ---------------------------------------------------------------------------------------------
// CHECK
// ---------------------------------------------------------------------------------------------

#[test]
fn check_before_0_4_0_is_code_1() {
    for v in ["0.3.0", "0.3.1"] {
        let e = parse_err(&full_env("CHECK"), stdin_of(&check_conf(v)));
        assert_err(&e, 1, &["CHECK", v]);
        assert_eq!(e.version, v);
    }
}

#[test]
fn check_without_prev_result_is_code_7() {
    for v in ["0.4.0", "1.0.0"] {
        let e = parse_err(&full_env("CHECK"), stdin_of(&conf(v)));
        assert_err(&e, 7, &["prevResult"]);
        assert_eq!(e.version, v);
    }
}

#[test]
fn check_collects_prev_result_addresses_in_order() {
    for v in ["0.4.0", "1.0.0"] {
        let call = parse_ok(&full_env("CHECK"), stdin_of(&check_conf(v)));
        assert_eq!(call.command, Command::Check);
        assert_eq!(call.version, v);
        assert_eq!(call.prev_addresses, vec!["10.1.0.5/16", "fd00::5/64"]);
        assert_eq!(call.netns, NETNS);
    }
}

#[test]
fn check_with_prev_result_without_ips_has_no_addresses() {
    let mut c = conf("1.0.0");
    c["prevResult"] = json!({"cniVersion": "1.0.0"});
    let call = parse_ok(&full_env("CHECK"), stdin_of(&c));
    assert!(call.prev_addresses.is_empty());
}

#[test]
fn check_with_malformed_prev_result_ips_is_code_7() {
    let mut c = check_conf("1.0.0");
    c["prevResult"]["ips"] = json!("10.1.0.5/16");
    let e = parse_err(&full_env("CHECK"), stdin_of(&c));
    assert_err(&e, 7, &["prevResult.ips"]);

    let mut c = check_conf("1.0.0");
    c["prevResult"]["ips"][1] = json!({"gateway": "10.1.0.1"});
    let e = parse_err(&full_env("CHECK"), stdin_of(&c));
    assert_err(&e, 7, &["prevResult.ips[1].address"]);

    let mut c = check_conf("1.0.0");
    c["prevResult"]["ips"][0]["address"] = json!(42);
    let e = parse_err(&full_env("CHECK"), stdin_of(&c));
    assert_err(&e, 7, &["prevResult.ips[0].address"]);
}

/// Known issue: a `prevResult` that is not an object (null, a string, a list) is taken as a
/// result with no IPs, so CHECK goes on to ask the daemon about an empty address list instead
/// of failing with code 7.
#[test]
fn check_with_non_object_prev_result_is_code_7() {
    for prev in [json!(null), json!("10.1.0.5/16"), json!([]), json!(1)] {
        let mut c = conf("1.0.0");
        c["prevResult"] = prev.clone();
        let r = parse(&full_env("CHECK"), stdin_of(&c));
        let e = r.expect_err(&format!("prevResult {prev} should be rejected"));
        assert_err(&e, 7, &["prevResult"]);
    }
}

// ---------------------------------------------------------------------------------------------
// VERSION
// ---------------------------------------------------------------------------------------------

#[test]
fn version_with_empty_stdin_answers_1_0_0() {
    let env = env_of(&[("CNI_COMMAND", "VERSION")]);
    let call = parse_ok(&env, Ok(Vec::new()));
    assert_eq!(call.command, Command::Version);
    assert_eq!(call.version, "1.0.0");
    assert_eq!(call.version, FALLBACK_VERSION);
}

#[test]
fn version_answers_in_the_asked_version() {
    let env = env_of(&[("CNI_COMMAND", "VERSION")]);
    for v in ["0.4.0", "0.3.1", "1.0.0"] {
        let call = parse_ok(&env, raw(&format!("{{\"cniVersion\":\"{v}\"}}")));
        assert_eq!(call.version, v);
    }
}

#[test]
fn version_needs_no_other_env_and_tolerates_junk_stdin() {
    let env = env_of(&[("CNI_COMMAND", "VERSION")]);
    for s in ["not json", "[]", "{\"cniVersion\": 4}", "{}"] {
        let call = parse_ok(&env, raw(s));
        assert_eq!(call.version, FALLBACK_VERSION, "{s}");
        assert_eq!(call.command, Command::Version);
    }
    // Bad other variables do not matter either.
    let env = env_of(&[
        ("CNI_COMMAND", "VERSION"),
        ("CNI_CONTAINERID", "-bad"),
        ("CNI_IFNAME", "a/b"),
        ("CNI_ARGS", "garbage"),
    ]);
    parse_ok(&env, raw("{\"cniVersion\":\"0.4.0\"}"));
}

// ---------------------------------------------------------------------------------------------
// Error JSON
// ---------------------------------------------------------------------------------------------

#[test]
fn error_json_carries_the_config_version() {
    let e = parse_err(
        &without(full_env("ADD"), "CNI_IFNAME"),
        stdin_of(&conf("0.3.0")),
    );
    assert_clean_err(&e);
    let v: Value = serde_json::from_str(&e.to_json()).expect("error JSON");
    assert_eq!(v["cniVersion"], "0.3.0");
    assert_eq!(v["code"], 4);
    assert!(v["details"]
        .as_str()
        .expect("details is a string")
        .contains("CNI_IFNAME"));
}

// ---------------------------------------------------------------------------------------------
// Property tests
// ---------------------------------------------------------------------------------------------

const CNI_KEYS: &[&str] = &[
    "CNI_COMMAND",
    "CNI_CONTAINERID",
    "CNI_NETNS",
    "CNI_IFNAME",
    "CNI_ARGS",
    "CNI_PATH",
];

fn arb_key() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => prop::sample::select(CNI_KEYS).prop_map(String::from),
        1 => "CNI_[A-Z]{0,12}",
        1 => ".{0,12}",
    ]
}

fn arb_env_value() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        prop::sample::select(vec![
            "ADD", "DEL", "CHECK", "VERSION", "GC", "STATUS", "add"
        ])
        .prop_map(String::from),
        "[A-Za-z0-9][A-Za-z0-9_.-]{0,20}",
        "[a-z0-9/:. \t]{0,18}",
        "((K8S_POD_NAME|K8S_POD_NAMESPACE|K8S_POD_UID|IgnoreUnknown|IP|FOO)=[a-z0-9]{0,4};?){0,4}",
        "\\PC{0,40}",
        any::<String>(),
        "[a-zA-Z0-9é\u{1F600}]{1000,4000}",
    ]
}

fn arb_env() -> impl Strategy<Value = HashMap<String, String>> {
    let random = prop::collection::hash_map(arb_key(), arb_env_value(), 0..8);
    let mostly_valid = (
        prop::sample::select(vec!["ADD", "DEL", "CHECK", "VERSION"]),
        prop::collection::hash_map(
            prop::sample::select(CNI_KEYS).prop_map(String::from),
            arb_env_value(),
            0..3,
        ),
        prop::collection::vec(prop::sample::select(CNI_KEYS), 0..2),
    )
        .prop_map(|(cmd, overrides, removed)| {
            let mut env = full_env(cmd);
            env.extend(overrides);
            for k in removed {
                env.remove(k);
            }
            env
        });
    prop_oneof![random, mostly_valid]
}

fn arb_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        (-1_000_000i64..1_000_000).prop_map(Value::from),
        any::<f64>().prop_map(Value::from),
        prop::sample::select(vec![
            "1.0.0",
            "0.4.0",
            "0.3.1",
            "0.3.0",
            "1.1.0",
            "",
            "eth0",
            "net1",
            "-x",
            "10.1.0.5/16",
            "/run/x.sock",
        ])
        .prop_map(Value::from),
        "\\PC{0,20}".prop_map(Value::from),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map(
                prop_oneof![
                    "[a-zA-Z]{0,8}",
                    prop::sample::select(vec!["ips", "address", "cni", "cniVersion"])
                        .prop_map(String::from),
                ],
                inner,
                0..4
            )
            .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// `Some(error)` makes stdin fail to read.
fn arb_stdin() -> impl Strategy<Value = Result<Vec<u8>, String>> {
    prop_oneof![
        prop::collection::vec(any::<u8>(), 0..256).prop_map(Ok),
        arb_json().prop_map(|v| Ok(serde_json::to_vec(&v).expect("json"))),
        (
            prop::sample::select(SUPPORTED_VERSIONS),
            any::<bool>(),
            any::<prop::sample::Index>()
        )
            .prop_map(|(v, check, cut)| {
                let c = if check { check_conf(v) } else { conf(v) };
                let b = serde_json::to_vec(&c).expect("json");
                // Either the whole valid config, or a prefix of it.
                let n = if cut.index(4) == 0 {
                    cut.index(b.len())
                } else {
                    b.len()
                };
                Ok(b[..n].to_vec())
            }),
        "\\PC{0,20}".prop_map(Err),
    ]
}

fn to_io(stdin: Result<Vec<u8>, String>) -> std::io::Result<Vec<u8>> {
    stdin.map_err(std::io::Error::other)
}

/// Structural equality, with floats equal to within a few ULPs.
fn json_close(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) if x.is_f64() || y.is_f64() => {
            match (x.as_f64(), y.as_f64()) {
                // Same sign and at most 4 ULPs apart (subnormals included).
                (Some(x), Some(y)) => {
                    x == y
                        || (x.is_sign_positive() == y.is_sign_positive()
                            && x.to_bits().abs_diff(y.to_bits()) <= 4)
                }
                _ => false,
            }
        }
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(x, y)| json_close(x, y))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, v)| y.get(k).is_some_and(|w| json_close(v, w)))
        }
        _ => a == b,
    }
}

/// What must hold of any `Ok`.
fn assert_sane_call(env: &HashMap<String, String>, call: &Call) {
    let cmd = env.get("CNI_COMMAND").map(String::as_str);
    let expected = match cmd {
        Some("ADD") => Command::Add,
        Some("DEL") => Command::Del,
        Some("CHECK") => Command::Check,
        Some("VERSION") => Command::Version,
        Some("GC") => Command::Gc,
        Some("STATUS") => Command::Status,
        other => panic!("parse accepted CNI_COMMAND {other:?}"),
    };
    assert_eq!(call.command, expected);
    if call.command == Command::Version {
        return;
    }
    assert!(SUPPORTED_VERSIONS.contains(&call.version.as_str()));
    if matches!(call.command, Command::Gc | Command::Status) {
        // Network-wide: from cniVersion 1.1.0 on, no container, netns or ifname.
        let v: Vec<u32> = call
            .version
            .split('.')
            .map(|p| p.parse().expect("a supported version is numeric"))
            .collect();
        assert!(
            v >= vec![1, 1, 0],
            "{:?} accepted at {}",
            call.command,
            call.version
        );
        assert!(check_name("net", &call.network).is_ok());
        assert!(!call.socket.is_empty());
        return;
    }
    assert!(check_name("id", &call.container_id).is_ok());
    assert!(check_name("net", &call.network).is_ok());
    assert!(check_ifname(&call.ifname).is_ok());
    assert_eq!(Some(&call.container_id), env.get("CNI_CONTAINERID"));
    assert_eq!(Some(&call.ifname), env.get("CNI_IFNAME"));
    if call.command != Command::Del {
        assert!(!call.netns.is_empty());
    }
    assert!(!call.socket.is_empty());
    let ms = call.timeout.as_millis();
    assert!((1..=600_000).contains(&ms), "timeout {ms}");
    let ipam: Value = serde_json::from_str(&call.ipam_json).expect("ipam_json parses");
    assert!(ipam.is_object());
}

/// Where the structured fuzzer mutates a valid config: a JSON pointer to a parent and a key.
const MUTATION_POINTS: &[(&str, &str)] = &[
    ("", "cniVersion"),
    ("", "name"),
    ("", "type"),
    ("", "ipam"),
    ("", "args"),
    ("", "runtimeConfig"),
    ("", "prevResult"),
    ("", "dns"),
    ("/ipam", "type"),
    ("/ipam", "socket"),
    ("/ipam", "timeoutMs"),
    ("/ipam", "ranges"),
    ("/args", "cni"),
    ("/args/cni", "ips"),
    ("/runtimeConfig", "ips"),
    ("/prevResult", "ips"),
    ("/prevResult/ips", "0"),
    ("/prevResult/ips/0", "address"),
    ("/prevResult/ips/1", "address"),
];

/// A full valid config (with every mutation point present), for ADD, DEL or CHECK.
fn fuzz_base(version: &str) -> Value {
    let mut c = check_conf(version);
    c["args"] = json!({"cni": {"ips": []}});
    c["runtimeConfig"] = json!({"ips": []});
    c["ipam"]["socket"] = json!("/run/ipool/ipool.sock");
    c["ipam"]["timeoutMs"] = json!(5000);
    c["dns"] = json!({"nameservers": ["10.96.0.10"]});
    c
}

/// Sets (or removes, with `None`) one field under `parent`; returns false when the parent does
/// not exist.
fn mutate(conf: &mut Value, parent: &str, key: &str, value: Option<Value>) -> bool {
    match conf.pointer_mut(parent) {
        Some(Value::Object(m)) => {
            match value {
                Some(v) => m.insert(key.to_string(), v),
                None => m.remove(key),
            };
            true
        }
        Some(Value::Array(a)) => {
            let i: usize = key.parse().expect("array mutation points are indexes");
            match value {
                Some(v) if i < a.len() => a[i] = v,
                None if i < a.len() => {
                    a.remove(i);
                }
                _ => return false,
            }
            true
        }
        _ => false,
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// (1) Arbitrary env and stdin: no panic, and every error is clean.
    #[test]
    fn arbitrary_input_never_panics_and_errors_are_clean(
        env in arb_env(),
        stdin in arb_stdin(),
    ) {
        match parse(&env, to_io(stdin)) {
            Ok(call) => assert_sane_call(&env, &call),
            Err(e) => assert_clean_err(&e),
        }
    }

    /// (2) Structured fuzzing: a valid config with one field set to a random value or removed.
    #[test]
    fn one_mutated_field_gives_ok_or_a_clean_error(
        cmd in prop::sample::select(vec!["ADD", "DEL", "CHECK"]),
        version in prop::sample::select(vec!["0.4.0", "1.0.0", "0.3.1"]),
        point in prop::sample::select(MUTATION_POINTS),
        value in prop::option::weighted(0.9, arb_json()),
    ) {
        let mut c = fuzz_base(version);
        let mutated = mutate(&mut c, point.0, point.1, value.clone());
        prop_assert!(mutated, "mutation point {point:?} is missing from the base config");
        let env = full_env(cmd);
        // The version the config ends up with (the mutation may have changed it).
        let effective = c["cniVersion"].as_str().map(String::from);
        let check_too_old = cmd == "CHECK" && effective.as_deref().is_some_and(|v| v.starts_with("0.3."));
        match parse(&env, stdin_of(&c)) {
            Ok(call) => {
                assert_sane_call(&env, &call);
                prop_assert_eq!(Some(&call.version), effective.as_ref());
                prop_assert_eq!(call.network, c["name"].as_str().expect("name survived").to_string());
                let ipam: Value = serde_json::from_str(&call.ipam_json).expect("ipam_json parses");
                // Floats compared to a few ULPs: serde_json (without `float_roundtrip`) may read
                // one 1 ULP off; see `ipam_json_keeps_floats_exactly`.
                prop_assert!(json_close(&ipam, &c["ipam"]), "ipam_json {ipam} vs {}", c["ipam"]);
                prop_assert!(!check_too_old, "CHECK accepted in {effective:?}");
            }
            Err(e) => {
                assert_clean_err(&e);
                if point != ("", "cniVersion") {
                    // The version was read: errors answer in it.
                    prop_assert_eq!(&e.version, version);
                }
                // Fields parse ignores cannot cause an error.
                let ignored = matches!(
                    point,
                    ("", "type") | ("", "dns") | ("/ipam", "type") | ("/ipam", "ranges")
                ) || (cmd != "CHECK" && (point.0.starts_with("/prevResult") || point.1 == "prevResult"));
                prop_assert!(
                    !ignored || check_too_old,
                    "mutating ignored field {point:?} to {value:?} gave {e:?}"
                );
            }
        }
    }

    /// (3) Every container ID of the spec's charset is accepted and kept as is.
    #[test]
    fn valid_container_ids_are_always_accepted(
        id in "[A-Za-z0-9][A-Za-z0-9_.-]{0,200}",
        cmd in prop::sample::select(vec!["ADD", "DEL"]),
    ) {
        let env = with(full_env(cmd), "CNI_CONTAINERID", &id);
        let call = parse(&env, stdin_of(&conf("1.0.0"))).expect("a valid container ID");
        prop_assert_eq!(call.container_id, id);
    }

    /// A container ID with one character outside the charset (or a bad first one) is code 4.
    #[test]
    fn container_ids_with_a_bad_char_are_rejected(
        prefix in "[A-Za-z0-9][A-Za-z0-9_.-]{0,20}",
        bad in any::<char>().prop_filter("outside the charset", |c| {
            !(c.is_ascii_alphanumeric() || "_.-".contains(*c))
        }),
        suffix in "[A-Za-z0-9_.-]{0,20}",
        at_start in any::<bool>(),
    ) {
        let id = if at_start {
            format!("{bad}{prefix}")
        } else {
            format!("{prefix}{bad}{suffix}")
        };
        let env = with(full_env("ADD"), "CNI_CONTAINERID", &id);
        let e = parse(&env, stdin_of(&conf("1.0.0"))).expect_err("an invalid container ID");
        prop_assert_eq!(e.error.code(), 4);
        prop_assert!(e.error.details().contains("CNI_CONTAINERID"));
    }

    /// Valid network names are accepted and kept.
    #[test]
    fn valid_network_names_are_always_accepted(name in "[A-Za-z0-9][A-Za-z0-9_.-]{0,100}") {
        let mut c = conf("1.0.0");
        c["name"] = Value::from(name.as_str());
        let call = parse(&full_env("ADD"), stdin_of(&c)).expect("a valid network name");
        prop_assert_eq!(call.network, name);
    }

    /// Interface names of 1 to 15 bytes without `/`, `:` or whitespace are accepted, except
    /// `.` and `..`; one byte more is rejected.
    #[test]
    fn ifname_rules_hold(name in "[A-Za-z0-9_.@#%+-]{1,15}") {
        let env = with(full_env("ADD"), "CNI_IFNAME", &name);
        let r = parse(&env, stdin_of(&conf("1.0.0")));
        if name == "." || name == ".." {
            prop_assert_eq!(r.expect_err("dot names").error.code(), 4);
        } else {
            prop_assert_eq!(r.expect("a valid ifname").ifname, name.clone());
        }
        let long = format!("{name}{}", "x".repeat(16 - name.len()));
        let env = with(full_env("ADD"), "CNI_IFNAME", &long);
        let e = parse(&env, stdin_of(&conf("1.0.0"))).expect_err("16 bytes is too long");
        prop_assert_eq!(e.error.code(), 4);
    }

    /// The pod identity in CNI_ARGS comes through unchanged, in any order of pairs.
    #[test]
    fn pod_args_round_trip(
        ns in "[^;]{0,30}",
        name in "[^;]{0,30}",
        uid in "[^;]{0,30}",
        order in Just(vec![0usize, 1, 2]).prop_shuffle(),
    ) {
        let pairs = [
            format!("K8S_POD_NAMESPACE={ns}"),
            format!("K8S_POD_NAME={name}"),
            format!("K8S_POD_UID={uid}"),
        ];
        let args: Vec<&str> = order.iter().map(|i| pairs[*i].as_str()).collect();
        let env = with(full_env("ADD"), "CNI_ARGS", &args.join(";"));
        let call = parse(&env, stdin_of(&conf("1.0.0"))).expect("valid CNI_ARGS");
        prop_assert_eq!(call.pod, PodArgs { namespace: ns, name, uid });
    }

    /// VERSION answers in whatever string version it was asked in.
    #[test]
    fn version_echoes_the_asked_version(v in "\\PC{1,20}") {
        let env = env_of(&[("CNI_COMMAND", "VERSION")]);
        let call = parse(&env, stdin_of(&json!({"cniVersion": v}))).expect("VERSION");
        prop_assert_eq!(call.version, v);
    }
}
