//! Installing ipool on the host for the container runtime (the DaemonSet's init container and
//! ipoold itself): the plugin into the CNI bin dir, the conflist into the CNI conf dir.
//!
//! Every file is written the same careful way (Calico's and the AWS VPC CNI's installers, and
//! the issues of those that were not careful): a temp file in the destination's directory,
//! named so no runtime reads it (`.<name>.ipool-tmp`: never `.conf`, `.conflist` or `.json`),
//! fsync'd, renamed over the destination, and the directory fsync'd. A rename replaces a
//! binary that is executing (a plain copy over it fails with "text file busy"), and a runtime
//! sees either the old file or the new one, never half of one. Identical content is left as
//! it is.
//!
//! # Layout
//! - [`chain`]: the plugin chain a conflist names, against the CNI bin dir.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

/// What an install did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The destination already had this content (its mode is brought to the one asked for).
    Unchanged,
    Written,
}

/// Writes `content` to `dest` with `mode`, atomically (see the module docs).
pub fn install_bytes(dest: &Path, content: &[u8], mode: u32) -> io::Result<Outcome> {
    let dir = dest
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = dest
        .file_name()
        .ok_or_else(|| io::Error::other(format!("{} names no file", dest.display())))?;
    if let Ok(meta) = fs::metadata(dest) {
        if meta.is_file() && meta.len() == content.len() as u64 && fs::read(dest)? == content {
            if meta.permissions().mode() & 0o7777 != mode {
                fs::set_permissions(dest, fs::Permissions::from_mode(mode))?;
            }
            return Ok(Outcome::Unchanged);
        }
    }
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(name);
    tmp_name.push(".ipool-tmp");
    let tmp = dir.join(tmp_name);
    let written = (|| {
        let mut f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(mode)
            .open(&tmp)?;
        f.write_all(content)?;
        // The mode asked for, whatever the umask made of it.
        f.set_permissions(fs::Permissions::from_mode(mode))?;
        f.sync_all()?;
        fs::rename(&tmp, dest)?;
        File::open(dir)?.sync_all()
    })();
    if written.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    written.map(|()| Outcome::Written)
}

/// Copies the file `src` to `dest` with `mode` (see [`install_bytes`]).
pub fn install_file(src: &Path, dest: &Path, mode: u32) -> io::Result<Outcome> {
    let content = fs::read(src)
        .map_err(|e| io::Error::new(e.kind(), format!("reading {}: {e}", src.display())))?;
    install_bytes(dest, &content, mode)
        .map_err(|e| io::Error::new(e.kind(), format!("writing {}: {e}", dest.display())))
}

/// Why a conflist template cannot be used (not JSON, not a conflist, no `ipool` IPAM, a
/// socket other than ipoold's).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct BadTemplate(pub String);

/// The conflist ipoold writes from `template`: it must be a JSON object, a conflist (`name`,
/// `plugins`) with an `ipool` IPAM; every `ipool` IPAM's `socket` (when it names one) must be
/// `socket`, the one ipoold serves. Returned as written (pretty JSON).
pub fn render_conflist(template: &str, socket: &Path) -> Result<String, BadTemplate> {
    let v: serde_json::Value = serde_json::from_str(template)
        .map_err(|e| BadTemplate(format!("the conflist template is not JSON: {e}")))?;
    let plugins = v
        .get("plugins")
        .and_then(|p| p.as_array())
        .ok_or_else(|| BadTemplate("the conflist template has no \"plugins\" list".into()))?;
    if v.get("name").and_then(|n| n.as_str()).is_none() {
        return Err(BadTemplate("the conflist template has no \"name\"".into()));
    }
    let ipams: Vec<&serde_json::Value> = plugins
        .iter()
        .filter_map(|p| p.get("ipam"))
        .filter(|i| i.get("type").and_then(|t| t.as_str()) == Some("ipool"))
        .collect();
    if ipams.is_empty() {
        return Err(BadTemplate(
            "no plugin of the conflist template has \"ipam\": {\"type\": \"ipool\"}".into(),
        ));
    }
    for i in ipams {
        if let Some(s) = i.get("socket").and_then(|s| s.as_str()) {
            if Path::new(s) != socket {
                return Err(BadTemplate(format!(
                    "the conflist template's ipam socket is {s}, but ipoold serves {}",
                    socket.display()
                )));
            }
        }
    }
    serde_json::to_string_pretty(&v)
        .map(|s| s + "\n")
        .map_err(|e| BadTemplate(e.to_string()))
}

pub mod chain;

#[cfg(test)]
mod tests;
