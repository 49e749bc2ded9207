//! Property tests: arbitrary env and stdin never panic and fail cleanly, structured fuzzing of
//! a valid config, generated valid names accepted and bad ones rejected.
//!
//! The committed regression seeds are in
//! cni-client/proptest-regressions/invocation/tests/properties.txt (proptest's default:
//! `proptest-regressions/` beside `src/`, at this file's path).

use super::*;
use proptest::prelude::*;

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

    /// The pod identity in CNI_ARGS comes through unchanged, in any order of pairs. (Within
    /// the byte limits: 15 characters of up to 4 bytes fit the namespace's 63, 30 the others'.)
    #[test]
    fn pod_args_round_trip(
        ns in "[^;]{0,15}",
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
