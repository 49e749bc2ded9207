//! The README's worked example, run as written (no command shown goes
//! stale): its shell block, with the daemon of the quick start's step 1 (the real ipoold on a
//! socket of the test's own), the real plugin and ipoolctl; each command's output compared
//! with the comment lines the README shows under it. The other pages' commands are checked
//! against the binaries by `.ci/docs_check.py`.

use crate::common::*;

/// The fenced block after `heading` in the README, and the first ```json block after it.
fn worked_example() -> (String, String) {
    let readme = include_str!("../../../README.md");
    let at = readme
        .find("## Worked example")
        .expect("the README has its worked example");
    let rest = &readme[at..];
    let sh = rest.split("```sh\n").nth(1).expect("a shell block");
    let sh = sh.split("\n```").next().expect("its end");
    let json = rest.split("```json\n").nth(1).expect("a json block");
    let json = json.split("\n```").next().expect("its end");
    (sh.to_string(), json.to_string())
}

/// Runs `script` with bash, its paths those of this test; stdout.
fn run(script: &str, d: &Daemon, dir: &std::path::Path) -> String {
    let script = script
        .replace("cargo build --release\n", "")
        .replace("/tmp/ipool/ipool.sock", &d.socket.display().to_string())
        .replace(
            "/tmp/demo.json",
            &dir.join("demo.json").display().to_string(),
        )
        .replace(
            "./target/release/ipoolctl",
            &ipoolctl_bin().display().to_string(),
        )
        .replace(
            "./target/release/ipool",
            &plugin_bin().display().to_string(),
        );
    let out = std::process::Command::new("bash")
        .args(["-c", &script])
        .output()
        .expect("bash");
    String::from_utf8_lossy(&out.stdout).to_string()
}

fn words(s: &str) -> Vec<&str> {
    s.split_whitespace().collect()
}

#[test]
fn the_readmes_worked_example_runs_as_written() {
    let (sh, error) = worked_example();
    let d = Daemon::start();
    let dir = tempfile::tempdir().unwrap();
    let out = run(&sh, &d, dir.path());
    // What the README shows: the comment lines after each command (the first of each run of
    // them describes the step when it ends with no output shape; the rest are the output).
    let shown: Vec<&str> = sh
        .lines()
        .filter_map(|l| l.strip_prefix("# "))
        .filter(|l| l.starts_with('{') || l.contains("  "))
        .collect();
    let got: Vec<&str> = out.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(
        got.len(),
        shown.len(),
        "the README shows {shown:#?}\nthe commands printed {got:#?}"
    );
    for (g, s) in got.iter().zip(&shown) {
        assert_eq!(
            words(g),
            words(s),
            "the README shows {s:?}, the command printed {g:?}"
        );
    }
    // With the daemon stopped, the ADD answers the error the README shows.
    drop(d);
    let gone = Daemon::prepare(&[]);
    let add = sh
        .lines()
        .skip_while(|l| !l.starts_with("CNI_COMMAND=ADD"))
        .take(2)
        .collect::<Vec<_>>()
        .join("\n");
    let json = sh
        .split("# ADD")
        .next()
        .unwrap_or_default()
        .lines()
        .skip_while(|l| !l.starts_with("cat >"))
        .collect::<Vec<_>>()
        .join("\n");
    let out = run(&format!("{json}\n{add}\n"), &gone, dir.path());
    let socket = gone.socket.display().to_string();
    let want = error.replace("/tmp/ipool/ipool.sock", &socket);
    assert_eq!(out.trim(), want.trim());
}

/// Whether `cargo tree` at the workspace's root, with `args`, builds `ipool-server` with the
/// simulation's switches (its feature `sim`).
fn builds_with_sim(args: &[&str]) -> bool {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace's root");
    let o = std::process::Command::new(env!("CARGO"))
        .current_dir(root)
        .args(["tree", "--offline", "-e", "features", "-i", "ipool-server"])
        .args(["--prefix", "none"])
        .args(args)
        .output()
        .expect("run cargo tree");
    assert!(o.status.success(), "cargo tree {args:?}: {}", stderr(&o));
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .any(|l| l.trim() == "ipool-server feature \"sim\"")
}

/// The binaries the README and docs/ build (`cargo build --release`, `cargo run -p
/// ipool-server`, the benchmark's `cargo build --release --bins`) are the ones that ship: none
/// carries the simulation's switches. A build of the whole workspace does (the check can see
/// them).
#[test]
fn the_binaries_the_manual_builds_carry_no_simulation_switches() {
    assert!(!builds_with_sim(&[]), "a plain build at the root");
    assert!(!builds_with_sim(&["-p", "ipool-server"]));
    assert!(!builds_with_sim(&["-p", "ipool-bench"]));
    assert!(
        builds_with_sim(&["--workspace"]),
        "the check sees the feature"
    );
}
