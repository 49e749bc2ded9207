//! `ipool-sim`: the deterministic simulation of cluster mode from the command line (build it
//! with `--release`: the simulation is CPU-bound).
//!
//! - `search`: runs seeds for a while; a failure is shrunk and its trace printed, with the
//!   command that replays it;
//! - `replay SEED`: one run, traced (`--picks FILE`: a kept run's picks on its seed);
//! - `hunt`: each closed path to a duplicate put back in turn (server::bugs), searched from
//!   seed 0 until found: the table of docs/simulation.md;
//! - `walk`: every schedule of the smallest cluster to a depth;
//! - `keep`: `hunt`, then each failing run shrunk and written to sim/tests/found/ (the
//!   regression traces `cargo test` replays);
//! - `bench`: the row of docs/performance.md, as JSON (`ipool-bench` runs it);
//! - `conditions`: the conditions of the stores' writes a search meets;
//! - `races`: each of them dropped in turn, and the seeds searched until a run fails: the
//!   table of docs/simulation.md (issue 54, item 4).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use ipool_sim::search::{self, Budget};
use ipool_sim::{Bug, Choices, StoreKind};

#[derive(Parser)]
#[command(about = "ipool's cluster mode under deterministic simulation")]
struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Runs seeds from FIRST for SECS seconds; a failure is shrunk and traced.
    Search {
        #[arg(long, default_value_t = 0)]
        first: u64,
        #[arg(long, default_value_t = 60)]
        secs: u64,
        /// Steps per run.
        #[arg(long, default_value_t = 5000)]
        steps: u64,
        /// A closed path to put back (server::bugs), by name; may be repeated.
        #[arg(long = "bug", value_parser = bug)]
        bugs: Vec<Bug>,
        /// Only the seeds whose runs have the pod GC and the runtime's part.
        #[arg(long)]
        pod_gc: bool,
        /// Only the seeds whose runs are about restores that lose a moved pod's pin.
        #[arg(long)]
        moved_restores: bool,
    },
    /// Runs SEED, printing its trace.
    Replay {
        seed: u64,
        #[arg(long, default_value_t = 5000)]
        steps: u64,
        #[arg(long = "bug", value_parser = bug)]
        bugs: Vec<Bug>,
        /// Only the last lines of the trace.
        #[arg(long, default_value_t = 200)]
        tail: usize,
        /// A kept run's file (sim/tests/found/NAME.picks): its picks replayed on its seed
        /// (SEED is then taken from the file and may be 0).
        #[arg(long)]
        picks: Option<PathBuf>,
        /// A condition of the stores' writes dropped (as `conditions` names it).
        #[arg(long)]
        condition: Option<String>,
    },
    /// Puts back each closed path in turn and searches from seed 0 until it is found.
    Hunt {
        #[arg(long = "bug", value_parser = bug)]
        bugs: Vec<Bug>,
        #[arg(long, default_value_t = 5000)]
        steps: u64,
        /// Steps over all runs before a path counts as not found.
        #[arg(long, default_value_t = 20_000_000)]
        max_steps: u64,
    },
    /// Walks every schedule of the smallest cluster to DEPTH.
    Walk {
        #[arg(long, default_value_t = 3)]
        depth: usize,
        #[arg(long, default_value_t = 60)]
        secs: u64,
        #[arg(long, value_parser = store, default_value = "etcd")]
        store: StoreKind,
        #[arg(long = "bug", value_parser = bug)]
        bugs: Vec<Bug>,
    },
    /// The simulation's row of the benchmark, as JSON on stdout: SECS seconds of seeds, then
    /// every schedule of the smallest cluster to DEPTH on both stores.
    Bench {
        #[arg(long, default_value_t = 30)]
        secs: u64,
        #[arg(long, default_value_t = 4)]
        depth: usize,
    },
    /// Lists the conditions of the stores' writes that SECS seconds of seeds from FIRST meet,
    /// with how many runs met each.
    Conditions {
        #[arg(long, default_value_t = 0)]
        first: u64,
        #[arg(long, default_value_t = 30)]
        secs: u64,
        #[arg(long, default_value_t = 5000)]
        steps: u64,
    },
    /// Drops each condition in turn (those met in CONDITIONS_SECS of seeds, or each
    /// --condition) and runs seeds from FIRST for up to SECS seconds until one fails.
    Races {
        #[arg(long, default_value_t = 0)]
        first: u64,
        #[arg(long, default_value_t = 60)]
        secs: u64,
        #[arg(long, default_value_t = 30)]
        conditions_secs: u64,
        #[arg(long, default_value_t = 5000)]
        steps: u64,
        /// A condition by its name (as `conditions` prints it); may be repeated.
        #[arg(long = "condition")]
        conditions: Vec<String>,
        /// Only the seeds whose runs may provoke rivals (the race groups 4, 6, 7 and 15).
        #[arg(long)]
        provoked: bool,
        /// With --provoked: the same seeds, their rivals waited for, not provoked.
        #[arg(long, requires = "provoked")]
        waited: bool,
    },
    /// Hunts each closed path, shrinks the failing run, writes it to DIR.
    Keep {
        #[arg(long, default_value = "sim/tests/found")]
        dir: PathBuf,
        /// Runs a shrink may make.
        #[arg(long, default_value_t = 400)]
        runs: usize,
        /// The seed that fails with the switch (found by a search, not a hunt): kept as it
        /// is, with one `--bug`.
        #[arg(long)]
        seed: Option<u64>,
        #[arg(long = "bug", value_parser = bug)]
        bugs: Vec<Bug>,
    },
}

fn bug(s: &str) -> Result<Bug, String> {
    Bug::named(s).ok_or_else(|| {
        let names: Vec<&str> = Bug::ALL.iter().map(|b| b.name()).collect();
        format!(
            "no closed path named {s:?}; there are: {}",
            names.join(", ")
        )
    })
}

fn store(s: &str) -> Result<StoreKind, String> {
    match s {
        "etcd" => Ok(StoreKind::Etcd),
        "kubernetes" | "kube" => Ok(StoreKind::Kube),
        _ => Err(format!("{s:?} is no store: etcd or kubernetes")),
    }
}

fn all_or(bugs: Vec<Bug>) -> Vec<Bug> {
    match bugs.is_empty() {
        true => Bug::ALL.to_vec(),
        false => bugs,
    }
}

fn main() -> ExitCode {
    // The daemons' own log, with RUST_LOG set (warn, info, ...).
    if std::env::var_os("RUST_LOG").is_some() {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .init();
    }
    match Args::parse().command {
        Command::Bench { secs, depth } => {
            match ipool_sim::row::run(secs, depth, |p| eprintln!("[ipool-sim] {p}")) {
                Ok(row) => {
                    println!("{row}");
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("{e}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Conditions { first, secs, steps } => {
            let (met, runs) = ipool_sim::dropped::met(first, steps, Duration::from_secs(secs));
            println!(
                "{} conditions met in {runs} runs from seed {first}:",
                met.len()
            );
            for (c, n) in met {
                println!("{n:>6}  {c}");
            }
            ExitCode::SUCCESS
        }
        Command::Races {
            first,
            secs,
            conditions_secs,
            steps,
            conditions,
            provoked,
            waited,
        } => {
            let seeds = match (provoked, waited) {
                (false, _) => ipool_sim::dropped::Seeds::All,
                (true, false) => ipool_sim::dropped::Seeds::Provoking,
                (true, true) => ipool_sim::dropped::Seeds::ProvokingWaited,
            };
            let conditions = match conditions.is_empty() {
                false => conditions,
                true => ipool_sim::dropped::met(first, steps, Duration::from_secs(conditions_secs))
                    .0
                    .into_keys()
                    .collect(),
            };
            println!(
                "| condition dropped | found by seed | its step | runs | time | what failed |"
            );
            println!("|---|---|---|---|---|---|");
            let mut missed = 0;
            for c in &conditions {
                let h = ipool_sim::dropped::hunt(c, first, steps, Duration::from_secs(secs), seeds);
                let time = format!("{:.1} s", h.elapsed.as_secs_f64());
                match &h.found {
                    Some((seed, step, what)) => {
                        let what: String = what.chars().take(90).collect();
                        println!("| `{c}` | {seed} | {step} | {} | {time} | {what} |", h.runs)
                    }
                    None => {
                        missed += 1;
                        println!(
                            "| `{c}` | not found | | {} ({} with it dropped) | {time} | |",
                            h.runs, h.dropped_in
                        )
                    }
                }
            }
            println!("{missed} of {} not found", conditions.len());
            match missed {
                0 => ExitCode::SUCCESS,
                _ => ExitCode::FAILURE,
            }
        }
        Command::Search {
            first,
            secs,
            steps,
            bugs,
            pod_gc,
            moved_restores,
        } => {
            let budget = Budget {
                time: Duration::from_secs(secs),
                steps: u64::MAX,
            };
            let r = search::search_where(first, steps, &bugs, budget, |o| {
                (o.pod_gc || !pod_gc) && (o.moved_restores || !moved_restores)
            });
            println!("{}", search::summary(&r));
            match r.failure {
                None => ExitCode::SUCCESS,
                Some((seed, _)) => {
                    print!("{}", search::explain(seed, steps, &bugs, 300));
                    ExitCode::FAILURE
                }
            }
        }
        Command::Replay {
            seed,
            steps,
            bugs,
            tail,
            picks,
            condition,
        } => {
            let (seed, o, out) = match picks {
                None => {
                    let mut o = search::options(seed, steps, &bugs);
                    o.trace = true;
                    o.dropped = condition;
                    let out = ipool_sim::run(&o, Choices::seeded(seed));
                    (seed, o, out)
                }
                Some(path) => {
                    let kept = std::fs::read_to_string(&path)
                        .map_err(|e| e.to_string())
                        .and_then(|t| search::Kept::parse(&t));
                    let k = match kept {
                        Ok(k) => k,
                        Err(e) => {
                            eprintln!("{}: {e}", path.display());
                            return ExitCode::from(64);
                        }
                    };
                    let mut o = search::options(k.seed, steps, &bugs);
                    o.trace = true;
                    let out = ipool_sim::run(&o, Choices::replay(k.picks));
                    (k.seed, o, out)
                }
            };
            println!("seed {seed}: {:?}, dual-stack {}", o.store, o.dual_stack);
            for l in out.trace.iter().skip(out.trace.len().saturating_sub(tail)) {
                println!("{l}");
            }
            match out.failure {
                None => {
                    println!("no failure in {} steps", out.steps);
                    ExitCode::SUCCESS
                }
                Some(f) => {
                    println!("FAILED at step {} ({} ms): {}", f.step, f.at_ms, f.what);
                    ExitCode::FAILURE
                }
            }
        }
        Command::Hunt {
            bugs,
            steps,
            max_steps,
        } => {
            println!("| closed path | found by seed | its steps | steps searched | time |");
            println!("|---|---|---|---|---|");
            let mut missed = 0;
            for b in all_or(bugs) {
                let h = search::hunt(b, steps, max_steps);
                match &h.found {
                    Some((seed, step, _)) => println!(
                        "| `{}` | {seed} | {step} | {} | {:.1} s |",
                        b.name(),
                        h.steps,
                        h.elapsed.as_secs_f64()
                    ),
                    None => {
                        missed += 1;
                        println!(
                            "| `{}` | not found | | {} | {:.1} s |",
                            b.name(),
                            h.steps,
                            h.elapsed.as_secs_f64()
                        )
                    }
                }
            }
            match missed {
                0 => ExitCode::SUCCESS,
                _ => ExitCode::FAILURE,
            }
        }
        Command::Walk {
            depth,
            secs,
            store,
            bugs,
        } => {
            let w = search::exhaustive(store, depth, &bugs, Duration::from_secs(secs));
            println!(
                "{store:?}, depth {depth}: {} schedules in {:.1} s{}",
                w.schedules,
                w.elapsed.as_secs_f64(),
                if w.complete {
                    ", every one"
                } else {
                    " (not all: out of time)"
                }
            );
            match w.failure {
                None => ExitCode::SUCCESS,
                Some((picks, out)) => {
                    println!("picks {picks:?}: {:?}", out.failure);
                    ExitCode::FAILURE
                }
            }
        }
        Command::Keep {
            dir,
            runs,
            seed,
            bugs,
        } => {
            if let Err(e) = std::fs::create_dir_all(&dir) {
                eprintln!("{}: {e}", dir.display());
                return ExitCode::FAILURE;
            }
            if seed.is_some() && bugs.len() != 1 {
                eprintln!("--seed keeps one closed path: name it with one --bug");
                return ExitCode::FAILURE;
            }
            for b in all_or(bugs) {
                let found = match seed {
                    Some(seed) => {
                        let out = ipool_sim::run(
                            &search::options(seed, 5000, &[b]),
                            Choices::seeded(seed),
                        );
                        out.failure.is_some().then_some((seed, out.picks))
                    }
                    None => search::hunt(b, 5000, 20_000_000)
                        .found
                        .map(|(seed, _, picks)| (seed, picks)),
                };
                let Some((seed, picks)) = found else {
                    println!("{}: not found", b.name());
                    continue;
                };
                let opts = search::options(seed, 5000, &[b]);
                let small = search::shrink(&opts, picks, runs);
                let kept = search::Kept { seed, picks: small };
                let path = dir.join(format!("{}.picks", b.name()));
                match std::fs::write(&path, kept.to_text()) {
                    Ok(()) => println!(
                        "{}: seed {seed}, {} picks kept in {}",
                        b.name(),
                        kept.picks.len(),
                        path.display()
                    ),
                    Err(e) => {
                        eprintln!("{}: {e}", path.display());
                        return ExitCode::FAILURE;
                    }
                }
                // The kept run fails with its switch, and passes without.
                let with = ipool_sim::run(&opts, Choices::replay(kept.picks.clone()));
                let mut plain = opts.clone();
                plain.bugs.clear();
                let without = ipool_sim::run(&plain, Choices::replay(kept.picks.clone()));
                println!(
                    "  with the switch: {:?}; without: {:?}",
                    with.failure.map(|f| f.what),
                    without.failure.map(|f| f.what)
                );
            }
            ExitCode::SUCCESS
        }
    }
}
