//! CHECK (prevResult), VERSION, and the error JSON's version.

use super::*;

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
