//! `dist watch | table | drain`: work distribution from the command line (the pool's units
//! themselves are managed by `units`, in `units.rs`).
//!
//! `dist watch POOL` joins POOL as a member and prints one line per change of its own
//! assignment: `version=<v> state=<prepare|active> count=<k> units=<u1,u2,...>`; it leaves on
//! SIGINT/SIGTERM, or when stdout is closed. A new table is first `prepare`, then `active` once
//! every member gave up what it hands over (the hand-over barrier): start work on a unit only
//! while it is active, and fence writes with the version. `dist drain` hands a member's units
//! over through the same barrier.
//!
//! `--record FILE` (hidden, a testing aid) appends this member's ownership intervals to FILE
//! for a checker in another process (`record.rs`).

use std::process::ExitCode;
use std::time::Duration;

use clap::Subcommand;
use redquorum::{Assignment, Client, PoolMember, PoolOptions, ViewState};

use crate::checks::{default_id, parse_duration};
use crate::checks::{interval, invalid, name};
use crate::child;
use crate::failure::Failure;
use crate::metrics::MetricsArgs;
use crate::output::{self, Format};
use crate::record::Recorder;

#[derive(Subcommand, Debug)]
pub(crate) enum DistCommand {
    /// Join POOL as a member and print one line per change of its own assignment:
    /// `version=<v> state=<prepare|active> count=<k> units=<u1,u2,...>` (units sorted). Leaves on
    /// SIGINT/SIGTERM.
    Watch {
        /// The pool name.
        pool: String,
        /// This member's ID (default: hostname-pid).
        #[arg(long)]
        id: Option<String>,
        /// This member's weight: its share of the units is proportional to it (0: drained).
        #[arg(long, default_value_t = 1, allow_negative_numbers = true)]
        weight: u32,
        /// Heartbeat interval.
        #[arg(long, default_value = "2s", value_parser = parse_duration)]
        interval: Duration,
        /// Restart grace: a member that comes back with the same ID within it keeps its units.
        #[arg(long, default_value = "0s", value_parser = parse_duration)]
        grace: Duration,
        #[command(flatten)]
        metrics: MetricsArgs,
        /// Testing aid: append this member's ownership intervals to FILE (CLOCK_MONOTONIC
        /// times; see cli/src/record.rs) for a checker in another process.
        #[arg(long, hide = true, value_name = "FILE")]
        record: Option<std::path::PathBuf>,
        /// TEST ONLY (builds with the test-util feature): activate new tables at once, without
        /// the hand-over barrier, so a test can show the double owners it prevents.
        #[cfg(feature = "test-util")]
        #[arg(long, hide = true)]
        no_barrier_for_tests: bool,
    },
    /// Print POOL's active table, one line per member: `<member>:<unit>,<unit>,...` (sorted).
    Table {
        /// The pool name.
        pool: String,
    },
    /// Drain the member ID of POOL: it stays a member (and keeps its pins) but hands its other
    /// units over, through the barrier. `--undo` ends the drain.
    Drain {
        /// The pool name.
        pool: String,
        /// The member ID.
        id: String,
        /// End the drain instead.
        #[arg(long)]
        undo: bool,
    },
}

/// The pool's and the member's names, the weight, the interval and the grace, checked before
/// any node is contacted.
pub(crate) fn precheck(command: &DistCommand) -> Result<(), Failure> {
    match command {
        DistCommand::Watch {
            pool,
            id,
            weight,
            interval: every,
            grace,
            ..
        } => {
            name("pool", pool)?;
            if let Some(id) = id {
                name("member", id)?;
            }
            if *weight > redquorum::MAX_WEIGHT {
                return Err(invalid(format!(
                    "--weight {weight} is above {}",
                    redquorum::MAX_WEIGHT
                )));
            }
            interval(every)?;
            // The restart grace limit of the library (`PoolOptions::with_restart_grace`).
            let max_grace = Duration::from_secs(3600);
            if *grace > max_grace {
                return Err(invalid(format!(
                    "--grace {} is above 1h",
                    humantime::format_duration(*grace)
                )));
            }
        }
        DistCommand::Table { pool } => name("pool", pool)?,
        DistCommand::Drain { pool, id, .. } => {
            name("pool", pool)?;
            name("member", id)?;
        }
    }
    Ok(())
}

/// `dist watch`, `dist table` or `dist drain`.
pub(crate) async fn run(
    client: &Client,
    command: DistCommand,
    format: Format,
) -> Result<ExitCode, redquorum::Error> {
    match command {
        DistCommand::Table { pool } => {
            let table = redquorum::pool_table(client, &pool).await?;
            let mut out = String::new();
            for (member, units) in &table.members {
                out.push_str(member);
                out.push(':');
                out.push_str(&units.iter().cloned().collect::<Vec<_>>().join(","));
                out.push('\n');
            }
            print!("{out}");
            Ok(ExitCode::SUCCESS)
        }
        DistCommand::Drain { pool, id, undo } => {
            redquorum::Units::new(client, &pool)?
                .drain(&id, !undo)
                .await?;
            Ok(ExitCode::SUCCESS)
        }
        DistCommand::Watch {
            pool,
            id,
            weight,
            interval,
            grace,
            record,
            #[cfg(feature = "test-util")]
            no_barrier_for_tests,
            ..
        } => {
            let mut opts = PoolOptions::default()
                .with_interval(interval)
                .with_weight(weight)
                .with_restart_grace(grace);
            #[cfg(feature = "test-util")]
            if no_barrier_for_tests {
                opts = opts.without_barrier_for_tests();
            }
            let recorder = match Recorder::open_option(record, None) {
                Ok(Some((r, hook))) => {
                    opts = opts.with_drain(interval, hook);
                    Some(r)
                }
                Ok(None) => None,
                Err(code) => return Ok(code),
            };
            watch(client, &pool, id, opts, recorder, format).await
        }
    }
}

/// `dist watch`: join the pool, print every change of this member's own assignment, leave on
/// SIGINT/SIGTERM.
async fn watch(
    client: &Client,
    pool: &str,
    id: Option<String>,
    opts: PoolOptions,
    recorder: Option<Recorder>,
    format: Format,
) -> Result<ExitCode, redquorum::Error> {
    let id = id.unwrap_or_else(default_id);
    let member = PoolMember::join(client, pool, &id, opts).await?;
    let mut changes = member.changes();
    let mut last: Option<String> = None;
    let stop = child::stop_signal();
    tokio::pin!(stop);
    loop {
        let current = changes.borrow_and_update().clone();
        if let Some(r) = &recorder {
            r.assign(current.as_ref());
        }
        let line = current
            .as_ref()
            .and_then(|a| assignment_line(a, pool, format));
        if let Some(line) = line {
            if last.as_deref() != Some(line.as_str()) {
                if !output::line(&line) {
                    break; // nobody reads any more
                }
                last = Some(line);
            }
        }
        tokio::select! {
            changed = changes.changed() => if changed.is_err() { break },
            _ = &mut stop => break,
        }
    }
    if let Some(r) = &recorder {
        r.stop();
    }
    member.leave().await;
    Ok(ExitCode::SUCCESS)
}

/// This member's line of assignment `a` in `format`; `None` when it carries no units.
fn assignment_line(a: &Assignment, pool: &str, format: Format) -> Option<String> {
    let state = match a.state {
        ViewState::Prepare => "prepare",
        ViewState::Active => "active",
    };
    let units: Vec<String> = a.units()?.iter().cloned().collect();
    Some(match format {
        Format::Text => format!(
            "version={} state={state} count={} units={}",
            a.token.get(),
            units.len(),
            units.join(",")
        ),
        Format::Json => serde_json::json!({
            "pool": pool, "version": a.token.get(), "state": state, "units": units,
        })
        .to_string(),
    })
}
