//! The plugin chain a conflist names, against the CNI bin dir: every plugin `type` (and IPAM
//! `type`) must be there, and the conflist's `cniVersion` is the highest version every one of
//! them reports (the CNI `VERSION` command), so that a runtime calls STATUS and GC (CNI 1.1.0)
//! where the whole chain supports them, and never asks a plugin for a version it lacks.
//!
//! A plugin that cannot be run here at all (exec fails: a dynamically linked plugin, as
//! distributions package them, seen from ipoold's image, which has no loader) is taken to
//! support the template's own `cniVersion`, and the caller says so: the runtime, on the host,
//! runs it fine.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

/// How long one plugin's VERSION may take.
const VERSION_TIMEOUT: Duration = Duration::from_secs(5);

/// Why the conflist cannot be written now.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ChainError {
    #[error("plugin(s) {} missing from the CNI bin dir {dir} (the conflist names them)", missing.join(", "))]
    Missing { missing: Vec<String>, dir: String },
    #[error("plugin {plugin} (in {dir}) does not answer the CNI VERSION command: {why}")]
    NoVersion {
        plugin: String,
        dir: String,
        why: String,
    },
    #[error("the plugins of the conflist share no CNI version ({0})")]
    NoCommonVersion(String),
}

/// Every plugin type the conflist names, in order, each once: each plugin's `type`, and its
/// `ipam.type`.
pub fn plugin_types(conflist: &serde_json::Value) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for p in conflist
        .get("plugins")
        .and_then(|p| p.as_array())
        .into_iter()
        .flatten()
    {
        for t in [p.get("type"), p.get("ipam").and_then(|i| i.get("type"))]
            .into_iter()
            .flatten()
            .filter_map(|t| t.as_str())
        {
            if !out.iter().any(|o| o == t) {
                out.push(t.to_string());
            }
        }
    }
    out
}

/// `1.0.0` as (1, 0, 0); None for what is no version.
fn parse_version(v: &str) -> Option<(u32, u32, u32)> {
    let mut parts = v.split('.').map(|p| p.parse::<u32>().ok());
    let (a, b, c) = (
        parts.next()??,
        parts.next()??,
        parts.next().unwrap_or(Some(0))?,
    );
    parts.next().is_none().then_some((a, b, c))
}

/// The conflist's version and how it was found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Chain {
    /// The highest CNI version every plugin supports.
    pub version: String,
    /// Plugins that could not be run here, each with why: taken to support the template's
    /// `cniVersion`.
    pub assumed: Vec<String>,
}

/// What asking a plugin for its versions gave.
enum Answer {
    Versions(Vec<String>),
    /// It could not be started here (why).
    CannotRun(String),
}

/// A plugin that ran and gave no answer to `VERSION` (why).
struct Silent(String);

/// What `plugin` answers to `VERSION`: its supported versions; Err when it runs but gives no
/// answer.
fn versions_of(plugin: &Path) -> Result<Answer, Silent> {
    let spawned = Command::new(plugin)
        .env_clear()
        .env("CNI_COMMAND", "VERSION")
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn();
    let mut child = match spawned {
        Ok(c) => c,
        Err(e) => return Ok(Answer::CannotRun(e.to_string())),
    };
    if let Some(mut stdin) = child.stdin.take() {
        use std::io::Write;
        let _ = stdin.write_all(br#"{"cniVersion":"0.4.0"}"#);
    }
    let started = std::time::Instant::now();
    loop {
        match child.try_wait().map_err(|e| Silent(e.to_string()))? {
            Some(_) => break,
            None if started.elapsed() > VERSION_TIMEOUT => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(Silent(format!("no answer within {VERSION_TIMEOUT:?}")));
            }
            None => std::thread::sleep(Duration::from_millis(10)),
        }
    }
    let out = child
        .wait_with_output()
        .map_err(|e| Silent(e.to_string()))?;
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).map_err(|_| {
        Silent(format!(
            "not JSON: {}",
            String::from_utf8_lossy(&out.stdout).trim()
        ))
    })?;
    let list = v
        .get("supportedVersions")
        .and_then(|s| s.as_array())
        .ok_or_else(|| Silent(format!("no supportedVersions in {v}")))?;
    Ok(Answer::Versions(
        list.iter()
            .filter_map(|s| s.as_str().map(str::to_string))
            .collect(),
    ))
}

/// Checks the conflist's plugins in `bin_dir` and returns the highest CNI version all of
/// them support.
pub fn common_version(conflist: &serde_json::Value, bin_dir: &Path) -> Result<Chain, ChainError> {
    let dir = bin_dir.display().to_string();
    let types = plugin_types(conflist);
    let missing: Vec<String> = types
        .iter()
        .filter(|t| !is_executable(&bin_dir.join(t)))
        .cloned()
        .collect();
    if !missing.is_empty() {
        return Err(ChainError::Missing { missing, dir });
    }
    let declared = conflist
        .get("cniVersion")
        .and_then(|v| v.as_str())
        .unwrap_or_default()
        .to_string();
    let mut common: Option<Vec<String>> = None;
    let mut each = Vec::new();
    let mut assumed = Vec::new();
    for t in &types {
        let no_version = |why: String| ChainError::NoVersion {
            plugin: t.clone(),
            dir: dir.clone(),
            why,
        };
        let versions = match versions_of(&bin_dir.join(t)).map_err(|s| no_version(s.0))? {
            Answer::Versions(v) => v,
            Answer::CannotRun(why) if parse_version(&declared).is_some() => {
                assumed.push(format!("{t} (cannot be run here: {why})"));
                each.push(format!("{t}: {declared}, assumed"));
                vec![declared.clone()]
            }
            Answer::CannotRun(why) => {
                return Err(no_version(format!(
                    "it cannot be run here ({why}), and the template's cniVersion {declared:?} is no version to assume"
                )))
            }
        };
        each.push(format!(
            "{t}: up to {}",
            versions
                .iter()
                .filter_map(|v| parse_version(v).map(|p| (p, v)))
                .max()
                .map_or("none", |(_, v)| v.as_str())
        ));
        common = Some(match common {
            None => versions,
            Some(c) => c.into_iter().filter(|v| versions.contains(v)).collect(),
        });
    }
    common
        .unwrap_or_default()
        .into_iter()
        .filter_map(|v| parse_version(&v).map(|p| (p, v)))
        .max()
        .map(|(_, version)| Chain { version, assumed })
        .ok_or_else(|| ChainError::NoCommonVersion(each.join("; ")))
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

#[cfg(test)]
mod tests;
