//! Tests of `parse`: unit tests per rule of the CNI spec, then property tests (no panics,
//! clean errors, structured fuzzing of a valid config, generated valid names accepted).
//!
//! The helpers are here; the tests by theme: `valid`, `env` (the environment and CNI_ARGS),
//! `config` (stdin and the network config), `check_version` (CHECK, VERSION, error JSON),
//! `properties` (property tests).

use super::*;
use serde_json::json;

mod check_version;
mod config;
mod env;
mod properties;
mod valid;

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
