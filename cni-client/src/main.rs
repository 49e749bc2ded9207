//! `ipool`: the CNI IPAM plugin binary. Everything is in the library; this only does I/O.
use std::io::{Read, Write};
use std::process::ExitCode;

fn main() -> ExitCode {
    let env: std::collections::HashMap<String, String> = std::env::vars_os()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
        .collect();
    let mut input = Vec::new();
    let stdin = std::io::stdin().read_to_end(&mut input).map(|_| input);
    let (out, ok) = ipool_cni::run(&env, stdin);
    let mut stdout = std::io::stdout().lock();
    // If stdout is gone there is nobody left to tell; the exit code still says it.
    if !out.is_empty() {
        let _ = writeln!(stdout, "{out}").and_then(|_| stdout.flush());
    }
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
