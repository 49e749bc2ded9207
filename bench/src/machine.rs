//! What machine the numbers come from.

use std::path::Path;
use std::process::Command;

use crate::report::Machine;

pub fn probe(host_local: &Path, plugin: &Path) -> Machine {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let cpu = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, v)| v.trim().to_string())
        .unwrap_or_else(|| "unknown".to_string());
    let processors = cpuinfo
        .lines()
        .filter(|l| l.starts_with("processor"))
        .count();
    let cores = if processors > 0 {
        processors
    } else {
        std::thread::available_parallelism().map_or(0, |n| n.get())
    };
    Machine {
        cpu,
        cores,
        kernel: output("uname", &["-r"]).unwrap_or_else(|| "unknown".to_string()),
        host_local: host_local_version(host_local),
        plugin: plugin_build(plugin),
        temp_fs: temp_fs(),
        command: std::env::args()
            .map(|a| {
                if a.contains(char::is_whitespace) {
                    format!("'{a}'")
                } else {
                    a
                }
            })
            .collect::<Vec<_>>()
            .join(" "),
    }
}

/// stdout and stderr of a command, trimmed, lines joined with "; ".
fn output(cmd: impl AsRef<std::ffi::OsStr>, args: &[&str]) -> Option<String> {
    let out = Command::new(cmd).args(args).output().ok()?;
    let text = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    (!lines.is_empty()).then(|| lines.join("; "))
}

/// `host-local --version`, and the Debian package it comes from if dpkg knows.
fn host_local_version(path: &Path) -> String {
    let version = output(path, &["--version"]).unwrap_or_else(|| "version unknown".to_string());
    let package = output("dpkg-query", &["-S", &path.display().to_string()])
        .and_then(|s| s.split_once(':').map(|(p, _)| p.trim().to_string()))
        .filter(|p| !p.contains(' '))
        .and_then(|p| {
            let v = output("dpkg-query", &["-W", "-f=${Version}", &p])?;
            Some(format!("{p} {v}"))
        });
    match package {
        Some(p) => format!("{} ({version}; Debian package {p})", path.display()),
        None => format!("{} ({version})", path.display()),
    }
}

/// The file system the temp dir is on (fdatasync costs depend on it).
fn temp_fs() -> String {
    let tmp = std::env::temp_dir();
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
    let best = mounts
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() >= 3 && tmp.starts_with(f[1])).then(|| (f[1], f[2], f[0]))
        })
        .max_by_key(|(mount, _, _)| mount.len());
    match best {
        Some((mount, fs, dev)) => format!("{} on {fs} ({dev} at {mount})", tmp.display()),
        None => tmp.display().to_string(),
    }
}

/// The plugin's path, size and whether it is statically linked (no ELF interpreter): exec time
/// depends on both.
fn plugin_build(path: &Path) -> String {
    let Ok(bytes) = std::fs::read(path) else {
        return format!("{} (unreadable)", path.display());
    };
    let linking = match has_interpreter(&bytes) {
        Some(true) => "dynamically linked",
        Some(false) => "statically linked",
        None => "not a 64-bit ELF",
    };
    format!("{} ({} KiB, {linking})", path.display(), bytes.len() / 1024)
}

/// Whether a little-endian ELF64 file has a PT_INTERP program header (a dynamic loader).
fn has_interpreter(elf: &[u8]) -> Option<bool> {
    const PT_INTERP: u32 = 3;
    if elf.get(..5)? != b"\x7fELF\x02" {
        return None;
    }
    let u16_at = |o: usize| Some(u16::from_le_bytes(elf.get(o..o + 2)?.try_into().ok()?));
    let phoff = usize::try_from(u64::from_le_bytes(elf.get(0x20..0x28)?.try_into().ok()?)).ok()?;
    let (entsize, count) = (usize::from(u16_at(0x36)?), usize::from(u16_at(0x38)?));
    let mut found = false;
    for i in 0..count {
        let at = phoff + i * entsize;
        let kind = u32::from_le_bytes(elf.get(at..at + 4)?.try_into().ok()?);
        found |= kind == PT_INTERP;
    }
    Some(found)
}
