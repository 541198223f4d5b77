//! `index watch GROUP`: fenced peer indexing from the command line.
//!
//! The process joins GROUP as a member and prints one line per change of its own place in the
//! adopted view: `version=<v> index=<i> replicas=<n> state=<prepare|active>`; it leaves on
//! SIGINT/SIGTERM, or when stdout is closed. A new view is first `prepare`, then `active` once
//! every old member stopped what it gives up (the transition barrier): act on an index only
//! while it is active, and fence writes with the view's version.
//!
//! `--record FILE --tasks N` (hidden, a testing aid) appends this member's ownership of tasks
//! `0..N` to FILE for a checker in another process (`record.rs`).

use std::process::ExitCode;
use std::time::Duration;

use clap::Subcommand;
use redquorum::{Client, GroupOptions, Member, ViewState};

use crate::checks::{default_id, parse_duration};
use crate::checks::{interval, name};
use crate::child;
use crate::failure::Failure;
use crate::metrics::MetricsArgs;
use crate::output::{self, Format};
use crate::record::Recorder;

#[derive(Subcommand, Debug)]
pub(crate) enum IndexCommand {
    /// Join GROUP and print one line per assignment change:
    /// `version=<v> index=<i> replicas=<n> state=<prepare|active>`. Leaves on SIGINT/SIGTERM.
    Watch {
        /// The group name.
        group: String,
        /// Heartbeat interval.
        #[arg(long, default_value = "2s", value_parser = parse_duration)]
        interval: Duration,
        /// This instance's ID (default: hostname-pid).
        #[arg(long)]
        id: Option<String>,
        #[command(flatten)]
        metrics: MetricsArgs,
        /// Testing aid: append this member's ownership of tasks 0..--tasks to FILE
        /// (CLOCK_MONOTONIC times; see cli/src/record.rs) for a checker in another process.
        #[arg(long, hide = true, value_name = "FILE")]
        record: Option<std::path::PathBuf>,
        /// The tasks recorded (0..N).
        #[arg(long, hide = true, default_value_t = 64)]
        tasks: u64,
        /// TEST ONLY (builds with the test-util feature): activate new views at once, without
        /// the transition barrier.
        #[cfg(feature = "test-util")]
        #[arg(long, hide = true)]
        no_barrier_for_tests: bool,
    },
}

/// The group's and the member's names and the interval, checked before any node is contacted.
pub(crate) fn precheck(command: &IndexCommand) -> Result<(), Failure> {
    let IndexCommand::Watch {
        group,
        interval: every,
        id,
        ..
    } = command;
    name("group", group)?;
    if let Some(id) = id {
        name("member", id)?;
    }
    interval(every)
}

/// `index watch`: the group's options (and the recorder's drain hook), then the watch.
pub(crate) async fn run(
    client: &Client,
    command: IndexCommand,
    format: Format,
) -> Result<ExitCode, redquorum::Error> {
    let IndexCommand::Watch {
        group,
        interval,
        id,
        record,
        tasks,
        #[cfg(feature = "test-util")]
        no_barrier_for_tests,
        ..
    } = command;
    let mut opts = GroupOptions::default().with_interval(interval);
    #[cfg(feature = "test-util")]
    if no_barrier_for_tests {
        opts = opts.without_barrier_for_tests();
    }
    let recorder = match Recorder::open_option(record, Some(tasks)) {
        Ok(Some((r, hook))) => {
            opts = opts.with_drain(interval, hook);
            Some(r)
        }
        Ok(None) => None,
        Err(code) => return Ok(code),
    };
    watch(client, &group, id, opts, recorder, format).await
}

/// `index watch`: join the group, print every adopted view this instance belongs to, leave on
/// SIGINT/SIGTERM.
async fn watch(
    client: &Client,
    group: &str,
    id: Option<String>,
    opts: GroupOptions,
    recorder: Option<Recorder>,
    format: Format,
) -> Result<ExitCode, redquorum::Error> {
    let id = id.unwrap_or_else(default_id);
    let member = Member::join(client, group, &id, opts).await?;
    let mut changes = member.changes();
    let mut views = member.views();
    let mut last: Option<String> = None;
    let stop = child::stop_signal();
    tokio::pin!(stop);
    loop {
        if let Some(r) = &recorder {
            r.assign(changes.borrow_and_update().as_ref());
        }
        let line = views
            .borrow_and_update()
            .as_ref()
            .and_then(|v| view_line(&member, v, group, format));
        if let Some(line) = line {
            if last.as_deref() != Some(line.as_str()) {
                if !output::line(&line) {
                    break; // nobody reads any more
                }
                last = Some(line);
            }
        }
        tokio::select! {
            changed = views.changed() => if changed.is_err() { break },
            changed = changes.changed(), if recorder.is_some() => if changed.is_err() { break },
            _ = &mut stop => break,
        }
    }
    if let Some(r) = &recorder {
        r.stop();
    }
    member.leave().await;
    Ok(ExitCode::SUCCESS)
}

/// This member's line of view `v` in `format`; `None` when the view does not include it or
/// is not adopted (no token).
fn view_line(member: &Member, v: &redquorum::View, group: &str, format: Format) -> Option<String> {
    let index = v.index_of(member.key())?;
    let token = v.version.token()?;
    let state = match v.state {
        ViewState::Prepare => "prepare",
        ViewState::Active => "active",
    };
    Some(match format {
        Format::Text => format!(
            "version={token} index={index} replicas={} state={state}",
            v.replicas()
        ),
        Format::Json => serde_json::json!({
            "group": group, "version": token.get(), "index": index,
            "replicas": v.replicas(), "state": state,
        })
        .to_string(),
    })
}
