//! `lock run | holder`: fenced leases from the command line.
//!
//! `lock run NAME -- CMD` runs CMD only while holding lock NAME. The child gets
//! REDQUORUM_FENCING_TOKEN and REDQUORUM_LOCK_NAME; if the lease is lost, the child's whole
//! process group gets SIGTERM, then SIGKILL once the remaining validity is used up
//! (`child.rs`): the child is stopped before anyone else can hold the lock. The holder is
//! named `pid <pid>`; `--wait 0s` (the default) tries once, for cron on every host.
//!
//! `lock holder NAME` reads who holds the lock according to a majority. A crashed holder stays
//! named until another client takes the lease over; `--watch` tells a live holder (which
//! extends every TTL/3) from an abandoned one.

use std::process::ExitCode;
use std::time::Duration;

use clap::Subcommand;
use redquorum::Client;

use crate::checks::parse_duration;
use crate::checks::{find_program, invalid, name};
use crate::child;
use crate::failure::Failure;
use crate::metrics::MetricsArgs;
use crate::output::{self, Format};

#[derive(Subcommand, Debug)]
pub(crate) enum LockCommand {
    /// Run CMD only while holding lock NAME. The child gets REDQUORUM_FENCING_TOKEN and
    /// REDQUORUM_LOCK_NAME; if the lease is lost, the child's whole process group gets SIGTERM,
    /// then SIGKILL once the remaining validity is used up. Exit code: the child's (128+signal if
    /// it was killed by one); 3 if the lock was not acquired (held, or the wait ended while it
    /// was); 5 if the wait ended before the takeover of a lease that looks abandoned (its
    /// holder is probably gone: the message says when it can be taken over); 4 if the lease was
    /// lost; 2 on errors, also when the nodes granted it too late to leave half the TTL (nobody
    /// holds it: retry). A one-shot try (--wait 0) takes a crashed holder's lease over after
    /// the holder's TTL plus drift, whatever this run's --ttl.
    Run {
        /// The lock name.
        name: String,
        /// Lease time; extended automatically every TTL/3.
        #[arg(long, default_value = "10s", value_parser = parse_duration)]
        ttl: Duration,
        /// How long to wait for the lock; 0 tries once (for cron on every host).
        #[arg(long, default_value = "0s", value_parser = parse_duration)]
        wait: Duration,
        #[command(flatten)]
        metrics: MetricsArgs,
        /// The command and its arguments.
        #[arg(last = true, required = true, num_args = 1..)]
        command: Vec<String>,
    },
    /// Print who holds lock NAME according to a majority: `holder=<h> token=<t> version=<v>
    /// ttl=<ms>ms`, or `no holder`. Exit 0 when held, 1 when not. A crashed holder stays
    /// named until another client takes the lease over; with --watch the line goes on with
    /// ` unchanged=<ms>ms` (how long the lease stayed unchanged) and ` abandoned` when it
    /// stayed unchanged for its TTL plus drift (a live holder extends every TTL/3).
    Holder {
        /// The lock name.
        name: String,
        /// Watch the lease for up to this long to tell a live holder from an abandoned one;
        /// returns as soon as it can tell (a watch of the TTL plus 1 % plus 2 ms always can).
        /// 0 reads once (one read cannot tell).
        #[arg(long, default_value = "0s", value_parser = parse_duration)]
        watch: Duration,
    },
}

/// The lock's name, the TTL and the program, checked before any node is contacted.
pub(crate) fn precheck(command: &LockCommand) -> Result<(), Failure> {
    match command {
        LockCommand::Run {
            name: lock,
            ttl,
            command,
            ..
        } => {
            name("lock", lock)?;
            if !(redquorum::MIN_TTL..=redquorum::MAX_TTL).contains(ttl) {
                return Err(invalid(format!(
                    "--ttl {ttl:?} is outside {:?}..={:?}",
                    redquorum::MIN_TTL,
                    redquorum::MAX_TTL
                )));
            }
            if let Some(program) = command.first() {
                find_program(program)?;
            }
        }
        LockCommand::Holder { name: lock, .. } => name("lock", lock)?,
    }
    Ok(())
}

/// `lock run` or `lock holder`.
pub(crate) async fn run(
    client: &Client,
    command: LockCommand,
    format: Format,
) -> Result<ExitCode, redquorum::Error> {
    match command {
        LockCommand::Holder { name, watch } => {
            let holder = redquorum::Lock::new(client, &name, Duration::from_secs(10))?
                .holder_watching(watch)
                .await?;
            Ok(output::holder(format, &name, holder.as_ref()))
        }
        LockCommand::Run {
            name,
            ttl,
            wait,
            command,
            ..
        } => lock_run(client, &name, ttl, wait, &command).await,
    }
}

/// `lock run`: hold the lock while the child runs; kill the child's process group on loss.
async fn lock_run(
    client: &Client,
    name: &str,
    ttl: Duration,
    wait: Duration,
    command: &[String],
) -> Result<ExitCode, redquorum::Error> {
    let options =
        redquorum::LockOptions::default().with_holder(&format!("pid {}", std::process::id()));
    let lock = redquorum::Lock::with_options(client, name, ttl, options)?;
    // One listener from before the wait to the child's end.
    let mut stop: child::Stop = Box::pin(child::stop_signal());
    let settle = client.config().node_timeout();
    let acquired = match child::unless_stopped(lock.acquire(wait), &mut stop, settle).await {
        Ok(acquired) => acquired,
        Err(code) => {
            eprintln!(
                "redquorum: lock {name:?}: stopped by a signal while waiting for it; nothing run"
            );
            return Ok(ExitCode::from(code));
        }
    };
    let guard = match acquired {
        Ok(g) => g,
        Err(
            // Held, or the wait ended while it was: exit 3. Nodes too slow, or grants of
            // other locks kept its token behind (nobody seen holding it): an error, exit 2.
            e @ (redquorum::Error::LockHeld { .. } | redquorum::Error::Timeout { .. }),
        ) => {
            eprintln!("redquorum: lock {name:?} not acquired: {e}");
            return Ok(ExitCode::from(3));
        }
        // The wait ended before the takeover of a lease whose holder looks gone: exit 5
        // (nobody was seen alive holding it), saying when it can be taken.
        Err(e @ redquorum::Error::LockLooksAbandoned { .. }) => {
            eprintln!("redquorum: lock {name:?} not acquired: {e}");
            return Ok(ExitCode::from(crate::failure::LOOKS_ABANDONED));
        }
        Err(e) => return Err(e),
    };
    let env = [
        ("REDQUORUM_FENCING_TOKEN", guard.token().to_string()),
        ("REDQUORUM_LOCK_NAME", name.to_string()),
    ];
    let code = child::run_while_held(&guard, name, command, &env, stop).await;
    let _ = guard.release().await;
    code
}
