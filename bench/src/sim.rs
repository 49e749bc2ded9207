//! The deterministic simulation's row (`ipool-sim bench`): how fast it runs cluster mode's real
//! code on one core (simulated store requests a minute; the goal is at least 1 000 000), and
//! how far its exhaustive walk of the smallest cluster gets. Run as the program built next to
//! this one: the simulation turns on `ipool-server`'s switches (feature `sim`), which no binary
//! this benchmark measures may carry, so ipool-bench does not link it.

use std::fmt::Write;
use std::process::Command;

use anyhow::{bail, ensure, Context, Result};
use serde_json::Value;

pub struct Sim(Value);

impl Sim {
    pub fn markdown(&self, o: &mut String) {
        let v = &self.0;
        let _ = writeln!(
            o,
            "\n## Deterministic simulation of cluster mode (ipool-sim, one core)\n"
        );
        let _ = writeln!(
            o,
            "| runs | steps | simulated store requests | ADDs acknowledged | time | store requests a minute |\n|---|---|---|---|---|---|"
        );
        let _ = writeln!(
            o,
            "| {} | {} | {} | {} | {:.1} s | {:.0} |",
            v["runs"],
            v["steps"],
            v["requests"],
            v["adds"],
            v["seconds"].as_f64().unwrap_or(0.0),
            v["requests_per_minute"].as_f64().unwrap_or(0.0)
        );
        let _ = writeln!(
            o,
            "\n| exhaustive walk | depth | schedules | time | every one |\n|---|---|---|---|---|"
        );
        for w in self.0["walks"].as_array().into_iter().flatten() {
            let _ = writeln!(
                o,
                "| {} | {} | {} | {:.1} s | {} |",
                w["store"].as_str().unwrap_or("?"),
                w["depth"],
                w["schedules"],
                w["seconds"].as_f64().unwrap_or(0.0),
                match w["complete"].as_bool() {
                    Some(true) => "yes",
                    _ => "no (out of time)",
                }
            );
        }
    }

    pub fn json(&self) -> Value {
        self.0.clone()
    }
}

/// Runs `ipool-sim bench` (next to this executable) for `secs` seconds of seeds and walks to
/// `depth`. A failure is an error: the simulation found an address on two pods.
pub fn run(secs: u64, depth: usize) -> Result<Sim> {
    let exe = std::env::current_exe().context("cannot find this executable's path")?;
    let sim = exe.with_file_name("ipool-sim");
    ensure!(
        sim.is_file(),
        "{} is missing (ipool-bench runs the simulation's row with the ipool-sim built next to it): build it with `cargo build --release -p ipool-sim`",
        sim.display()
    );
    progress!(
        "the simulation ({}): {secs} s of seeds, walks to depth {depth}",
        sim.display()
    );
    let out = Command::new(&sim)
        .args([
            "bench",
            "--secs",
            &secs.to_string(),
            "--depth",
            &depth.to_string(),
        ])
        .stderr(std::process::Stdio::inherit())
        .output()
        .with_context(|| format!("running {}", sim.display()))?;
    if !out.status.success() {
        bail!("{} bench failed ({})", sim.display(), out.status);
    }
    let row: Value = serde_json::from_slice(&out.stdout)
        .with_context(|| format!("{} bench printed no JSON", sim.display()))?;
    Ok(Sim(row))
}
