//! The environment: CNI_COMMAND, missing and empty variables, container IDs and interface
//! names, and CNI_ARGS.

use super::*;

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
