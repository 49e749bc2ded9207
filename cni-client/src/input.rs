//! The plugin's two inputs besides the environment, read with a bound: the network config on
//! stdin, and the `ipam.resolvConf` file. Neither may make the plugin read or wait without
//! end: `"resolvConf": "/dev/zero"` once read 5.9 GB in 6 s, far past `ipam.timeoutMs`.

use std::io::{self, Read};

use crate::error::CniError;

/// The most bytes of network config read from stdin. A config is a few hundred bytes; a GC's
/// `cni.dev/valid-attachments` for 1 000 pods is ~100 KiB.
pub const STDIN_LIMIT: usize = 1 << 20;

/// The most bytes read from `ipam.resolvConf` (glibc's resolver reads at most 3 nameservers,
/// 6 search domains and a few options from its file).
pub const RESOLV_CONF_LIMIT: usize = 64 << 10;

/// A network config is a few hundred bytes: one read takes it (std would probe with 32).
const STDIN_CAPACITY: usize = 64 << 10;

/// Reads the network config, up to [`STDIN_LIMIT`]: past it, an error of kind `FileTooLarge`
/// (which [`crate::invocation::parse`] reports as an invalid network config).
pub fn read_config(stdin: impl Read) -> io::Result<Vec<u8>> {
    let mut input = Vec::with_capacity(STDIN_CAPACITY);
    stdin.take(STDIN_LIMIT as u64 + 1).read_to_end(&mut input)?;
    if input.len() > STDIN_LIMIT {
        return Err(io::Error::new(
            io::ErrorKind::FileTooLarge,
            format!(
                "the network config on stdin is over {} MiB ({STDIN_LIMIT} bytes), the most ipool reads",
                STDIN_LIMIT >> 20
            ),
        ));
    }
    Ok(input)
}

/// Reads `ipam.resolvConf`. Only a regular file of at most [`RESOLV_CONF_LIMIT`] bytes is
/// read: a FIFO, a device (`/dev/zero`), a socket or a directory is refused before anything is
/// read from it, so nothing here can wait past the call's deadline. The open does not block
/// either (`O_NONBLOCK`: opening a FIFO for reading would otherwise wait for a writer).
///
/// Errors: 7 (invalid network config) for a file that cannot be opened, is not a regular file
/// or is too large; 5 (I/O failure) for a read that fails once the file is open.
pub fn read_resolv_conf(path: &str) -> Result<String, CniError> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| {
            CniError::InvalidConfig(format!("ipam.resolvConf {path:?} cannot be read: {e}"))
        })?;
    let meta = file
        .metadata()
        .map_err(|e| CniError::Io(format!("ipam.resolvConf {path:?}: {e}")))?;
    if !meta.is_file() {
        return Err(CniError::InvalidConfig(format!(
            "ipam.resolvConf {path:?} is not a regular file ({}); ipool reads only a regular file of at most {} KiB",
            kind_of(&meta.file_type()),
            RESOLV_CONF_LIMIT >> 10
        )));
    }
    let too_large = || {
        CniError::InvalidConfig(format!(
            "ipam.resolvConf {path:?} is over {} KiB ({RESOLV_CONF_LIMIT} bytes), the most ipool reads",
            RESOLV_CONF_LIMIT >> 10
        ))
    };
    // The size is known: a file that says it is too large is not read at all (a file whose
    // size says nothing, as in /proc, is still cut at the limit below).
    if meta.len() > RESOLV_CONF_LIMIT as u64 {
        return Err(too_large());
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize + 1);
    file.take(RESOLV_CONF_LIMIT as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| CniError::Io(format!("reading ipam.resolvConf {path:?}: {e}")))?;
    if bytes.len() > RESOLV_CONF_LIMIT {
        return Err(too_large());
    }
    String::from_utf8(bytes)
        .map_err(|e| CniError::InvalidConfig(format!("ipam.resolvConf {path:?} is not UTF-8: {e}")))
}

fn kind_of(t: &std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if t.is_dir() {
        "a directory"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_socket() {
        "a socket"
    } else {
        "not a file"
    }
}

#[cfg(test)]
mod tests;
