//! `ipool`: the CNI IPAM plugin binary. Everything is in the library; this only does I/O.
//!
//! The entry point is C's `main`, not Rust's: the runtime execs this binary for every pod,
//! and std's start-up (the main thread's stack guard, found by reading /proc/self/maps; an
//! alternate signal stack mapped for it; SIGPIPE ignored; fds 0-2 polled) costs ~45 us of an
//! exec that is ~480 us in all. What it would give here: a message instead of a bare SIGSEGV
//! on a stack overflow (nothing here recurses without a bound: serde_json stops at depth
//! 128), and writes to a closed stdout failing instead of ending the process by SIGPIPE, as
//! Go plugins such as host-local end too (the socket is written with MSG_NOSIGNAL).
#![no_main]

use std::ffi::{c_char, c_int};
use std::io::Write;

// SAFETY: the one symbol named `main` in the binary (std's is not generated under
// `no_main`), with the signature C's start-up code calls it with. It reads neither argument.
#[allow(unsafe_code)]
#[unsafe(no_mangle)]
extern "C" fn main(_argc: c_int, _argv: *const *const c_char) -> c_int {
    let env: std::collections::HashMap<String, String> = std::env::vars_os()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
        .collect();
    // At most 1 MiB (`input::STDIN_LIMIT`): an endless stdin is refused, not read to the end.
    let stdin = ipool_cni::input::read_config(std::io::stdin().lock());
    let (out, ok) = ipool_cni::run(&env, stdin);
    let mut stdout = std::io::stdout().lock();
    // If stdout is gone there is nobody left to tell; the exit code still says it.
    if !out.is_empty() {
        let _ = writeln!(stdout, "{out}").and_then(|_| stdout.flush());
    }
    if ok {
        0
    } else {
        1
    }
}
