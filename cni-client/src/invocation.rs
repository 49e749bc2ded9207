//! Parsing and validating one CNI invocation: the `CNI_*` environment and the stdin JSON.
//! Pure (no I/O): every input, however malformed, ends in a `Call` or a CNI error.

use std::collections::HashMap;
use std::time::Duration;

use serde_json::Value;

use crate::error::{CniError, VersionedError};
use crate::result::FALLBACK_VERSION;
use crate::{DEFAULT_SOCKET, DEFAULT_TIMEOUT_MS, SUPPORTED_VERSIONS};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Command {
    Add,
    Del,
    Check,
    Version,
    Gc,
    Status,
}

/// The pod identity from CNI_ARGS.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodArgs {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

/// A validated invocation, ready to execute.
#[derive(Clone, Debug, PartialEq)]
pub struct Call {
    pub command: Command,
    /// The cniVersion to answer in.
    pub version: String,
    /// The network name (`name`); empty for VERSION.
    pub network: String,
    pub container_id: String,
    pub ifname: String,
    pub netns: String,
    pub pod: PodArgs,
    /// The `ipam` object, re-serialized, for the daemon.
    pub ipam_json: String,
    /// Addresses named by `prevResult` (CHECK).
    pub prev_addresses: Vec<String>,
    /// Static addresses asked for (ADD), without prefix length.
    pub requested_ips: Vec<String>,
    /// `cni.dev/valid-attachments` as (container ID, ifname) (GC).
    pub valid_attachments: Vec<(String, String)>,
    /// `ipam.resolvConf`: a resolv.conf file whose contents become the result's `dns`.
    pub resolv_conf: Option<String>,
    /// `ipam.dns`, passed through to the result when there is no `resolvConf`.
    pub dns: Option<Value>,
    pub socket: String,
    pub timeout: Duration,
}

fn env_get<'a>(env: &'a HashMap<String, String>, k: &str) -> Option<&'a str> {
    env.get(k).map(String::as_str).filter(|v| !v.is_empty())
}

pub use ipool_proto::names::check_name;

/// Checks CNI_IFNAME (the CNI spec's interface-name rules).
pub fn check_ifname(s: &str) -> Result<(), String> {
    ipool_proto::names::check_ifname("CNI_IFNAME", s)
}

/// Parses `K=V;K=V` into the pod identity and the `IP=` addresses (comma-separated).
/// Unknown keys are an error unless `IgnoreUnknown` is 1 or true.
fn parse_cni_args(raw: &str) -> Result<(PodArgs, Vec<String>), String> {
    let mut pairs = Vec::new();
    for part in raw.split(';').filter(|p| !p.is_empty()) {
        let (k, v) = part
            .split_once('=')
            .ok_or_else(|| format!("CNI_ARGS: {part:?} is not KEY=VALUE"))?;
        pairs.push((k, v));
    }
    let ignore_unknown = pairs
        .iter()
        .any(|(k, v)| *k == "IgnoreUnknown" && (v.eq_ignore_ascii_case("true") || *v == "1"));
    let mut pod = PodArgs::default();
    let mut ips = Vec::new();
    for (k, v) in pairs {
        match k {
            "K8S_POD_NAMESPACE" => pod.namespace = v.to_string(),
            "K8S_POD_NAME" => pod.name = v.to_string(),
            "K8S_POD_UID" => pod.uid = v.to_string(),
            "K8S_POD_INFRA_CONTAINER_ID" | "IgnoreUnknown" => {}
            "IP" => {
                ips = v
                    .split(',')
                    .map(|a| bare_ip(a).map_err(|e| format!("CNI_ARGS IP={v}: {e}")))
                    .collect::<Result<_, _>>()?;
            }
            _ if ignore_unknown => {}
            _ => {
                return Err(format!(
                    "CNI_ARGS: unknown key {} (add IgnoreUnknown=1 to ignore unknown keys)",
                    ipool_proto::names::shown(k)
                ))
            }
        }
    }
    ipool_proto::names::check_pod(&pod.namespace, &pod.name, &pod.uid)
        .map_err(|e| format!("CNI_ARGS: {e}"))?;
    Ok((pod, ips))
}

/// An address as `args.cni.ips`, `runtimeConfig.ips` or `IP=` give it ("10.1.0.5" or
/// "10.1.0.5/24"), without its prefix length.
fn bare_ip(s: &str) -> Result<String, String> {
    let addr = s.trim().split('/').next().unwrap_or_default();
    addr.parse::<std::net::IpAddr>()
        .map(|ip| ip.to_string())
        .map_err(|_| format!("{s:?} is not an IP address"))
}

/// Picks from a `cniVersions` list the newest version ipool speaks.
fn newest_supported(list: &[Value]) -> Option<String> {
    SUPPORTED_VERSIONS
        .iter()
        .rev()
        .find(|v| list.iter().any(|x| x.as_str() == Some(**v)))
        .map(|v| v.to_string())
}

/// True for the versions that define GC and STATUS.
fn at_least_1_1(version: &str) -> bool {
    !version.starts_with("0.") && version != "1.0.0"
}

fn version_of(conf: &Value) -> Result<String, CniError> {
    match conf.get("cniVersion") {
        Some(Value::String(v)) if SUPPORTED_VERSIONS.contains(&v.as_str()) => Ok(v.clone()),
        Some(Value::String(v)) => Err(CniError::IncompatibleVersion(format!(
            "cniVersion {v:?} is not supported; ipool speaks {}",
            SUPPORTED_VERSIONS.join(", ")
        ))),
        Some(other) => Err(CniError::InvalidConfig(format!(
            "cniVersion must be a string, not {other}"
        ))),
        None => match conf.get("cniVersions") {
            Some(Value::Array(list)) => newest_supported(list).ok_or_else(|| {
                CniError::IncompatibleVersion(format!(
                    "none of cniVersions {} is supported; ipool speaks {}",
                    Value::Array(list.clone()),
                    SUPPORTED_VERSIONS.join(", ")
                ))
            }),
            Some(other) => Err(CniError::InvalidConfig(format!(
                "cniVersions must be a list of strings, not {other}"
            ))),
            None => Err(CniError::IncompatibleVersion(format!(
                "the network config has no cniVersion; ipool speaks {}",
                SUPPORTED_VERSIONS.join(", ")
            ))),
        },
    }
}

/// Parses and validates an invocation.
pub fn parse(
    env: &HashMap<String, String>,
    stdin: std::io::Result<Vec<u8>>,
) -> Result<Call, VersionedError> {
    let command = match env_get(env, "CNI_COMMAND") {
        None => return Err(CniError::InvalidEnv("CNI_COMMAND is not set".into()).into()),
        Some("ADD") => Command::Add,
        Some("DEL") => Command::Del,
        Some("CHECK") => Command::Check,
                Some("VERSION") => Command::Version,
        Some("GC") => Command::Gc,
        Some("STATUS") => Command::Status,
        Some(other) => {
            return Err(CniError::InvalidEnv(format!(
                "CNI_COMMAND {other:?} is not a CNI command; ipool handles ADD, DEL, CHECK, VERSION, GC and STATUS"
            ))
            .into())
        }
    };
    let bytes = stdin.map_err(|e| match e.kind() {
        // `input::read_config` stopped at its limit: what was sent is not a config ipool takes.
        std::io::ErrorKind::FileTooLarge => CniError::InvalidConfig(e.to_string()),
        _ => CniError::Io(format!("reading the network config from stdin: {e}")),
    })?;

    if command == Command::Version {
        // VERSION answers in the version it was asked in, or the newest when stdin has none.
        let asked = serde_json::from_slice::<Value>(&bytes)
            .ok()
            .and_then(|v| v.get("cniVersion")?.as_str().map(String::from))
            .unwrap_or_else(|| FALLBACK_VERSION.to_string());
        return Ok(Call {
            command,
            version: asked,
            network: String::new(),
            container_id: String::new(),
            ifname: String::new(),
            netns: String::new(),
            pod: PodArgs::default(),
            ipam_json: String::new(),
            prev_addresses: Vec::new(),
            requested_ips: Vec::new(),
            valid_attachments: Vec::new(),
            resolv_conf: None,
            dns: None,
            socket: String::new(),
            timeout: Duration::from_millis(DEFAULT_TIMEOUT_MS),
        });
    }

    let conf: Value = serde_json::from_slice(&bytes).map_err(|e| {
        CniError::Decode(format!(
            "the network config on stdin is not valid JSON: {e}"
        ))
    })?;
    if !conf.is_object() {
        return Err(
            CniError::Decode("the network config on stdin is not a JSON object".into()).into(),
        );
    }
    let version = version_of(&conf)?;
    let fail = |e: CniError| e.with_version(&version);
    if command == Command::Check && version.starts_with("0.3.") {
        return Err(fail(CniError::IncompatibleVersion(format!(
            "CHECK is defined from cniVersion 0.4.0 on; this config says {version}"
        ))));
    }
    if matches!(command, Command::Gc | Command::Status) && !at_least_1_1(&version) {
        return Err(fail(CniError::IncompatibleVersion(format!(
            "{} is defined from cniVersion 1.1.0 on; this config says {version}",
            if command == Command::Gc {
                "GC"
            } else {
                "STATUS"
            }
        ))));
    }

    // Environment: name every missing variable at once.
    let needs: &[&str] = match command {
        Command::Add | Command::Check => &["CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME"],
        Command::Del => &["CNI_CONTAINERID", "CNI_IFNAME"],
        Command::Gc | Command::Status | Command::Version => &[],
    };
    let per_container = !needs.is_empty();
    let missing: Vec<&str> = needs
        .iter()
        .copied()
        .filter(|k| env_get(env, k).is_none())
        .collect();
    if !missing.is_empty() {
        return Err(fail(CniError::InvalidEnv(format!(
            "{} not set",
            match missing.len() {
                1 => format!("{} is", missing[0]),
                _ => format!("{} are", missing.join(", ")),
            }
        ))));
    }
    let container_id = env_get(env, "CNI_CONTAINERID")
        .unwrap_or_default()
        .to_string();
    let ifname = env_get(env, "CNI_IFNAME").unwrap_or_default().to_string();
    let netns = env_get(env, "CNI_NETNS").unwrap_or_default().to_string();
    if per_container {
        check_name("CNI_CONTAINERID", &container_id).map_err(|m| fail(CniError::InvalidEnv(m)))?;
        check_ifname(&ifname).map_err(|m| fail(CniError::InvalidEnv(m)))?;
    }
    let (pod, arg_ips) = parse_cni_args(env_get(env, "CNI_ARGS").unwrap_or_default())
        .map_err(|m| fail(CniError::InvalidEnv(m)))?;

    // Network config.
    let network = match conf.get("name") {
        Some(Value::String(n)) => n.clone(),
        Some(other) => {
            return Err(fail(CniError::InvalidConfig(format!(
                "name must be a string, not {other}"
            ))))
        }
        None => {
            return Err(fail(CniError::InvalidConfig(
                "the network config has no name".into(),
            )))
        }
    };
    check_name("network name", &network).map_err(|m| fail(CniError::InvalidConfig(m)))?;
    let ipam = match conf.get("ipam") {
        Some(v @ Value::Object(_)) => v,
        Some(other) => {
            return Err(fail(CniError::InvalidConfig(format!(
                "ipam must be an object, not {other}"
            ))))
        }
        None => {
            return Err(fail(CniError::InvalidConfig(
                "the network config has no ipam section".into(),
            )))
        }
    };
    // Static addresses: runtimeConfig.ips (the runtime's `ips` capability) wins over
    // args.cni.ips, which wins over CNI_ARGS IP=; the first source that names any is used.
    let mut requested_ips = Vec::new();
    for (path, v) in [
        ("runtimeConfig.ips", conf.pointer("/runtimeConfig/ips")),
        ("args.cni.ips", conf.pointer("/args/cni/ips")),
    ] {
        let list = match v {
            None | Some(Value::Null) => continue,
            Some(Value::Array(a)) => a,
            Some(other) => {
                return Err(fail(CniError::InvalidConfig(format!(
                    "{path} must be a list of addresses, not {other}"
                ))))
            }
        };
        if !requested_ips.is_empty() {
            continue;
        }
        for (i, item) in list.iter().enumerate() {
            let ip = item
                .as_str()
                .ok_or_else(|| format!("{path}[{i}] must be a string, not {item}"))
                .and_then(|a| bare_ip(a).map_err(|e| format!("{path}[{i}]: {e}")))
                .map_err(|m| fail(CniError::InvalidConfig(m)))?;
            requested_ips.push(ip);
        }
    }
    if requested_ips.is_empty() {
        requested_ips = arg_ips;
    }
    if command != Command::Add {
        requested_ips.clear();
    }
    let resolv_conf = match ipam.get("resolvConf") {
        None | Some(Value::Null) => None,
        Some(Value::String(p)) if !p.is_empty() => Some(p.clone()),
        Some(other) => {
            return Err(fail(CniError::InvalidConfig(format!(
                "ipam.resolvConf must be a file path, not {other}"
            ))))
        }
    };
    let dns = match ipam.get("dns") {
        None | Some(Value::Null) => None,
        Some(v @ Value::Object(_)) => Some(v.clone()),
        Some(other) => {
            return Err(fail(CniError::InvalidConfig(format!(
                "ipam.dns must be an object, not {other}"
            ))))
        }
    };
    let valid_attachments = if command == Command::Gc {
        valid_attachments(&conf).map_err(|m| fail(CniError::InvalidConfig(m)))?
    } else {
        Vec::new()
    };
    let socket = match ipam.get("socket") {
        None => DEFAULT_SOCKET.to_string(),
        Some(Value::String(s)) if !s.is_empty() => s.clone(),
        Some(other) => {
            return Err(fail(CniError::InvalidConfig(format!(
                "ipam.socket must be a non-empty path, not {other}"
            ))))
        }
    };
    let timeout_ms = match ipam.get("timeoutMs") {
        None => DEFAULT_TIMEOUT_MS,
        Some(v) => match v.as_u64() {
            Some(ms) if (1..=600_000).contains(&ms) => ms,
            _ => {
                return Err(fail(CniError::InvalidConfig(format!(
                "ipam.timeoutMs must be a whole number of milliseconds from 1 to 600000, not {v}"
            ))))
            }
        },
    };
    let prev_addresses = if command == Command::Check {
        prev_result_addresses(&conf).map_err(|m| fail(CniError::InvalidConfig(m)))?
    } else {
        Vec::new()
    };
    Ok(Call {
        command,
        version: version.clone(),
        network,
        container_id,
        ifname,
        netns,
        pod,
        ipam_json: raw_ipam(&bytes).unwrap_or_else(|| ipam.to_string()),
        prev_addresses,
        requested_ips,
        valid_attachments,
        resolv_conf,
        dns,
        socket,
        timeout: Duration::from_millis(timeout_ms),
    })
}

/// The `ipam` object exactly as it came on stdin (numbers untouched), for the daemon.
fn raw_ipam(bytes: &[u8]) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Raw<'a> {
        #[serde(borrow)]
        ipam: &'a serde_json::value::RawValue,
    }
    serde_json::from_slice::<Raw>(bytes)
        .ok()
        .map(|r| r.ipam.get().to_string())
}

/// `cni.dev/valid-attachments` (GC): the attachments the runtime still uses. Required: without
/// it GC would release everything.
fn valid_attachments(conf: &Value) -> Result<Vec<(String, String)>, String> {
    const KEY: &str = "cni.dev/valid-attachments";
    let list = match conf.get(KEY) {
        Some(Value::Array(a)) => a,
        Some(other) => return Err(format!("{KEY} must be a list, not {other}")),
        None => return Err(format!("GC needs {KEY} in the network config")),
    };
    list.iter()
        .enumerate()
        .map(|(i, a)| {
            let field = |f: &str| {
                a.get(f)
                    .and_then(Value::as_str)
                    .map(String::from)
                    .ok_or_else(|| format!("{KEY}[{i}].{f} is missing or not a string"))
            };
            Ok((field("containerID")?, field("ifname")?))
        })
        .collect()
}

/// The addresses of `prevResult.ips[].address` (CIDR form), for CHECK.
fn prev_result_addresses(conf: &Value) -> Result<Vec<String>, String> {
    let prev = conf
        .get("prevResult")
        .ok_or("CHECK needs prevResult in the network config")?;
    if !prev.is_object() {
        return Err(format!("prevResult must be an object, not {prev}"));
    }
    let ips = match prev.get("ips") {
        Some(Value::Array(a)) => a,
        None => return Ok(Vec::new()),
        Some(other) => return Err(format!("prevResult.ips must be a list, not {other}")),
    };
    ips.iter()
        .enumerate()
        .map(|(i, ip)| {
            ip.get("address")
                .and_then(Value::as_str)
                .map(String::from)
                .ok_or_else(|| format!("prevResult.ips[{i}].address is missing or not a string"))
        })
        .collect()
}

#[cfg(test)]
mod tests;
