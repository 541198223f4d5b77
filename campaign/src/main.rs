//! `rq-campaign`: the fault campaign (`scripts/campaign.sh`).
//!
//! `rq-campaign run [--seed S] [--quick|--long]` starts local `redis-server` nodes (or the
//! server env `REDQUORUM_TEST_SERVER` names, e.g. `valkey-server`), workload
//! processes (`rq-campaign worker ...`), `redquorum` CLI processes and two `redquorum serve`
//! processes with workload processes calling them over HTTP, plays a seeded fault
//! schedule (the nemesis), checks the recorded histories and prints a summary whose last line
//! is exactly `campaign: seed=<s> operations=<n> faults=<n> violations=<n>`. It exits 1 when a
//! violation was found. The same seed replays the same schedule of faults and operations
//! (timing aside).

mod history;
mod http;
mod plant;
mod run;
mod schedule;
mod worker;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(name = "rq-campaign", about = "redquorum's fault campaign")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run a campaign and print its summary.
    Run {
        /// The seed (default: random, printed).
        #[arg(long)]
        seed: Option<u64>,
        /// The CI campaign: about a minute of faults.
        #[arg(long, conflicts_with = "long")]
        quick: bool,
        /// The README's campaign: twenty minutes of faults.
        #[arg(long)]
        long: bool,
        /// How long the workloads run under faults (overrides --quick/--long).
        #[arg(long, value_parser = parse_duration)]
        duration: Option<Duration>,
        /// Nodes (3 or 5).
        #[arg(long, default_value_t = 3)]
        nodes: usize,
        /// ID workload processes.
        #[arg(long, default_value_t = 3)]
        id_workers: usize,
        /// Lease holder processes, writing to a fenced resource (default 3; 8 with --long).
        #[arg(long)]
        lock_workers: Option<usize>,
        /// Locks the holders share out (holder i takes lock i mod this; each lock has its own
        /// fenced resource key; default 1; 4 with --long).
        #[arg(long)]
        locks: Option<usize>,
        /// Work-distribution member processes (`redquorum dist watch --record`).
        #[arg(long, default_value_t = 3)]
        dist_members: usize,
        /// Peer-indexing member processes (`redquorum index watch --record`).
        #[arg(long, default_value_t = 3)]
        index_members: usize,
        /// Periodic-job runner processes (one job, a period of 2 s).
        #[arg(long, default_value_t = 2)]
        job_workers: usize,
        /// ID workload processes calling a `redquorum serve` process over HTTP (half of them
        /// each of the two servers; the servers run when any HTTP worker does).
        #[arg(long, default_value_t = 2)]
        http_id_workers: usize,
        /// Lease holder processes acquiring through a `redquorum serve` process over HTTP and
        /// writing to the fenced resource themselves (half through each server; holder j takes
        /// lock j mod --locks).
        #[arg(long, default_value_t = 2)]
        http_lock_workers: usize,
        /// The redquorum binary (default: next to this one).
        #[arg(long)]
        redquorum: Option<PathBuf>,
        /// Plant a bug (switch a protection off) in every workload process.
        #[arg(long)]
        plant: Option<plant::Plant>,
        /// Allow more than a minority of nodes faulty at once (reports what breaks).
        #[arg(long)]
        beyond_minority: bool,
        /// Where the records go (default: a temporary directory, kept when a violation is
        /// found).
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// A workload process (started by `run`).
    #[command(subcommand, hide = true)]
    Worker(WorkerCommand),
}

#[derive(Subcommand, Debug)]
enum WorkerCommand {
    /// IDs in a loop.
    Ids {
        #[arg(long)]
        nodes: String,
        #[arg(long)]
        out: PathBuf,
        #[arg(long)]
        seed: u64,
        #[arg(long, default_value = "campaign")]
        sequence: String,
        #[arg(long)]
        plant: Option<plant::Plant>,
    },
    /// A periodic-job runner in a loop.
    Jobs {
        #[arg(long)]
        nodes: String,
        #[arg(long)]
        out: PathBuf,
        #[arg(long)]
        seed: u64,
        #[arg(long)]
        plant: Option<plant::Plant>,
    },
    /// IDs in a loop, through a `redquorum serve` process.
    HttpIds {
        /// A file holding the server's base URL (`http://127.0.0.1:PORT`), read again at every
        /// new connection.
        #[arg(long)]
        server: PathBuf,
        #[arg(long)]
        out: PathBuf,
        #[arg(long)]
        seed: u64,
        #[arg(long, default_value = "campaign")]
        sequence: String,
    },
    /// A lease holder in a loop, acquiring through a `redquorum serve` process and writing to
    /// the fenced resource.
    HttpLocks {
        /// A file holding the server's base URL, as for http-ids.
        #[arg(long)]
        server: PathBuf,
        #[arg(long)]
        resource: String,
        #[arg(long, default_value = "campaign")]
        lock: String,
        /// The holder label the server records.
        #[arg(long, default_value = "campaign")]
        holder: String,
        #[arg(long)]
        out: PathBuf,
        #[arg(long)]
        seed: u64,
        #[arg(long)]
        plant: Option<plant::Plant>,
    },
    /// A lease holder in a loop, writing to the fenced resource.
    Locks {
        #[arg(long)]
        nodes: String,
        #[arg(long)]
        resource: String,
        #[arg(long, default_value = "campaign")]
        lock: String,
        #[arg(long)]
        out: PathBuf,
        #[arg(long)]
        seed: u64,
        #[arg(long)]
        plant: Option<plant::Plant>,
    },
}

/// A workload process's exit: it runs until killed, so it only returns on an error.
fn worker_exit(result: Result<(), String>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rq-campaign worker: {e}");
            ExitCode::from(2)
        }
    }
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| format!("{e} (use e.g. 90s, 20m)"))
}

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("CAMPAIGN_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("error")),
        )
        .with_writer(std::io::stderr)
        .init();
    match Cli::parse().command {
        Command::Worker(WorkerCommand::Ids {
            nodes,
            out,
            seed,
            sequence,
            plant,
        }) => {
            let urls: Vec<String> = nodes.split(',').map(String::from).collect();
            worker_exit(worker::ids(&urls, &sequence, &out, seed, plant).await)
        }
        Command::Worker(WorkerCommand::Jobs {
            nodes,
            out,
            seed,
            plant,
        }) => {
            let urls: Vec<String> = nodes.split(',').map(String::from).collect();
            worker_exit(worker::jobs(&urls, &out, seed, plant).await)
        }
        Command::Worker(WorkerCommand::Locks {
            nodes,
            resource,
            lock,
            out,
            seed,
            plant,
        }) => {
            let urls: Vec<String> = nodes.split(',').map(String::from).collect();
            worker_exit(worker::locks(&urls, &resource, &lock, &out, seed, plant).await)
        }
        Command::Worker(WorkerCommand::HttpIds {
            server,
            out,
            seed,
            sequence,
        }) => worker_exit(worker::http_ids(&server, &sequence, &out, seed).await),
        Command::Worker(WorkerCommand::HttpLocks {
            server,
            resource,
            lock,
            holder,
            out,
            seed,
            plant,
        }) => worker_exit(
            worker::http_locks(&server, &resource, &lock, &holder, &out, seed, plant).await,
        ),
        Command::Run {
            seed,
            quick,
            long,
            duration,
            nodes,
            id_workers,
            lock_workers,
            locks,
            dist_members,
            index_members,
            job_workers,
            http_id_workers,
            http_lock_workers,
            redquorum,
            plant,
            beyond_minority,
            dir,
        } => {
            let lock_workers = lock_workers.unwrap_or(if long { 8 } else { 3 });
            let locks = locks.unwrap_or(if long { 4 } else { 1 }).max(1);
            let holders = lock_workers + http_lock_workers;
            if holders > 0 && holders < 2 * locks {
                eprintln!(
                    "rq-campaign: {holders} lease holders over {locks} locks: every lock needs at least two holders, or nothing can contend"
                );
                return ExitCode::from(2);
            }
            let seed = seed.unwrap_or_else(rand::random);
            let duration = duration.unwrap_or(if long {
                Duration::from_secs(20 * 60)
            } else if quick {
                Duration::from_secs(60)
            } else {
                Duration::from_secs(180)
            });
            let redquorum = redquorum.unwrap_or_else(|| {
                std::env::current_exe()
                    .ok()
                    .and_then(|p| p.parent().map(|d| d.join("redquorum")))
                    .unwrap_or_else(|| PathBuf::from("redquorum"))
            });
            println!(
                "campaign: seed {seed} (replay with --seed {seed}), {nodes} nodes ({}), {} of faults{}",
                redquorum_testkit::server_program(),
                humantime::format_duration(duration),
                plant
                    .map(|p| format!(", planted bug: {p}"))
                    .unwrap_or_default()
            );
            let temp = match &dir {
                Some(_) => None,
                None => match tempfile_dir() {
                    Ok(t) => Some(t),
                    Err(e) => {
                        eprintln!("rq-campaign: {e}");
                        return ExitCode::from(2);
                    }
                },
            };
            let dir = dir.unwrap_or_else(|| temp.clone().unwrap_or_default());
            let opts = run::Options {
                seed,
                duration,
                nodes,
                id_workers,
                lock_workers,
                locks,
                dist_members,
                index_members,
                job_workers,
                http_id_workers,
                http_lock_workers,
                redquorum,
                plant,
                beyond_minority,
            };
            match run::run(opts, &dir).await {
                Ok(outcome) => {
                    let violations = outcome.violations.len();
                    print_summary(seed, &outcome);
                    if let Some(p) = plant {
                        let caught = outcome
                            .violations
                            .iter()
                            .any(|(g, _)| p.breaks().contains(g));
                        println!(
                            "planted bug {p} (breaks {}): {}",
                            p.breaks().join(" or "),
                            if caught { "caught" } else { "NOT caught" }
                        );
                    }
                    if violations > 0 {
                        println!("records kept in {}", dir.display());
                    } else if let Some(t) = temp {
                        let _ = std::fs::remove_dir_all(t);
                    }
                    let operations: u64 =
                        outcome.operations.values().map(|(ok, err)| ok + err).sum();
                    // Rows "..., of which ..." count part of the row above them.
                    let faults: u64 = outcome
                        .faults
                        .iter()
                        .filter(|(kind, _)| !kind.contains(", of which"))
                        .map(|(_, n)| n)
                        .sum();
                    println!(
                        "campaign: seed={seed} operations={operations} faults={faults} violations={violations}"
                    );
                    if violations > 0 {
                        ExitCode::from(1)
                    } else {
                        ExitCode::SUCCESS
                    }
                }
                Err(e) => {
                    eprintln!("rq-campaign: {e}");
                    ExitCode::from(2)
                }
            }
        }
    }
}

/// A fresh directory for the records.
fn tempfile_dir() -> Result<PathBuf, String> {
    let dir = std::env::temp_dir().join(format!(
        "rq-campaign-{}-{}",
        std::process::id(),
        redquorum_testkit::record::monotonic_ns()
    ));
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    Ok(dir)
}

fn print_summary(seed: u64, o: &run::Outcome) {
    println!();
    println!("| operations | ok | failed |");
    println!("|---|---|---|");
    for (kind, (ok, err)) in &o.operations {
        println!("| {kind} | {ok} | {err} |");
    }
    println!();
    println!(
        "IDs returned: {}; lease holder processes frozen for the TTL or longer: {} ({} of them while holding the lease)",
        o.ids_returned, o.holder_freezes.0, o.holder_freezes.1
    );
    if o.serve_holder_freezes.0 > 0 {
        println!(
            "serve processes frozen together with a caller holding a lease through them: {} ({} of them with the caller seen holding)",
            o.serve_holder_freezes.0, o.serve_holder_freezes.1
        );
    }
    if o.beyond.0 > 0 {
        println!(
            "beyond the fault model: {} faults started while a majority of nodes was faulty for some client; {:.1} s in all",
            o.beyond.0,
            o.beyond.1.as_secs_f64()
        );
    }
    println!();
    println!("| faults | count |");
    println!("|---|---|");
    for (kind, n) in &o.faults {
        println!("| {kind} | {n} |");
    }
    println!();
    print_guarantees(o);
    for (g, v) in &o.violations {
        println!("violation ({g}): {v}");
    }
    println!();
    println!(
        "availability: {:.1}% of operations (ID calls, lease tries) succeeded while a fault was active, {:.1}% while none was (seed {seed})",
        o.availability.0 * 100.0,
        o.availability.1 * 100.0
    );
    println!(
        "ID call p99 (workload processes): {:.1} ms while a fault was active, {:.1} ms while none was",
        o.id_p99.0.as_secs_f64() * 1000.0,
        o.id_p99.1.as_secs_f64() * 1000.0
    );
}

/// The summary's table of guarantees, and what the fenced-mutex check checked.
fn print_guarantees(o: &run::Outcome) {
    println!("| guarantee | violations |");
    println!("|---|---|");
    let count = |g: &str| o.violations.iter().filter(|(x, _)| *x == g).count();
    for (row, g) in [
        ("ids: unique, in real-time order", "ids"),
        ("leases: one holder at a time, tokens increasing", "leases"),
        (
            "leases: linearizable as a fenced mutex (acquire when free with a higher token, release by the holder)",
            "fenced mutex",
        ),
        ("fenced writes: no stale write accepted", "fenced writes"),
        ("work distribution: one owner per unit", "one owner per unit"),
        ("peer indexing: one owner per task", "one owner per task"),
        (
            "periodic jobs: no run after a recorded completion",
            "periodic jobs",
        ),
    ] {
        println!("| {row} | {} |", count(g));
    }
    let (m, took) = o.mutex_check;
    println!(
        "fenced-mutex check: {} lock operations in {} windows (the largest {}), {} acquisitions of unknown outcome, checked in {:.0} ms",
        m.operations,
        m.windows,
        m.largest_window,
        m.unknown_acquires,
        took.as_secs_f64() * 1000.0
    );
}
