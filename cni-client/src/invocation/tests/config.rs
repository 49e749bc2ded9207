//! stdin and the network config: read errors, JSON, cniVersion, name, ipam and its keys
//! (static IPs, timeout, socket, DNS), GC and STATUS.

use super::*;

#[test]
fn stdin_read_error_is_code_5() {
    for cmd in ["ADD", "DEL", "CHECK"] {
        let e = parse_err(&full_env(cmd), Err(std::io::Error::other("x")));
        assert_err(&e, 5, &["stdin"]);
        assert_eq!(e.version, FALLBACK_VERSION);
    }
}

/// stdin as the binary reads it (`input::read_config`): a config of 1 MiB and a space more is
/// refused, with the limit named, for every verb (VERSION too: nothing is read past it).
#[test]
fn an_oversized_stdin_is_code_7_naming_the_limit() {
    let mut big = serde_json::to_vec(&conf("1.0.0")).expect("json");
    big.resize(crate::input::STDIN_LIMIT, b' ');
    assert!(parse(&full_env("ADD"), crate::input::read_config(&big[..])).is_ok());
    big.push(b' ');
    for cmd in ["ADD", "DEL", "CHECK", "VERSION", "GC", "STATUS"] {
        let e = parse_err(&full_env(cmd), crate::input::read_config(&big[..]));
        assert_err(&e, 7, &["stdin", "1 MiB", "1048576 bytes"]);
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
