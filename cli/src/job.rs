//! `job run`: a command run once per period across hosts, on the library's `PeriodicJob`.
//!
//! Cron on every host runs `redquorum job run NAME --period "$(date +%F)" -- CMD`; the first
//! run to hold the job's lease (the lock NAME) and find no completion record of the period on
//! a majority runs CMD under the lease, as `lock run` does (`child::supervise`), and records
//! the period with its token only if CMD exited 0. A run that finds the period recorded exits
//! 0 and says by which token; a failed, killed or stopped CMD records nothing, so the next
//! run (on any host) runs it again. Mutual exclusion alone (`lock run`) would run the period
//! again on every host whose cron fires after the previous run ended.

use std::process::ExitCode;
use std::time::Duration;

use clap::Subcommand;
use redquorum::{Client, JobOptions, LockOptions, PeriodRun, PeriodStart, PeriodicJob};

use crate::checks::{default_id, parse_duration};
use crate::child::{self, Ended};
use crate::failure::Failure;

#[derive(Subcommand, Debug)]
pub(crate) enum JobCommand {
    /// Run CMD for period P of job NAME unless it was done already: from cron on every host,
    /// with `--period "$(date +%F)"`, the day's CMD runs once across them.
    ///
    /// The run takes the job's lease (the lock NAME: `lock holder NAME` shows who runs it)
    /// and reads P's completion record on a majority. If P is not recorded, CMD runs under the
    /// lease as with `lock run`: it gets REDQUORUM_FENCING_TOKEN, REDQUORUM_LOCK_NAME (NAME)
    /// and REDQUORUM_JOB_PERIOD (P); if the lease is lost, its whole process group gets
    /// SIGTERM, then SIGKILL once the remaining validity is used up. Only CMD's exit 0
    /// records P (with the run's token, on a majority); a non-zero exit, a signal, a lost lease
    /// or our own SIGINT/SIGTERM record nothing, and the next `job run` for P, on any host,
    /// runs CMD again. A run that crashed (kill -9, a host down) leaves the lease to the next
    /// one-shot run after its TTL plus drift (whatever that run's own --ttl). Not guaranteed: a run whose lease was lost may
    /// still be finishing when another host starts P (write with the token, or make CMD
    /// idempotent).
    ///
    /// Exit code: CMD's own (128+N if signal N ended it); 0 with `already done: period P of
    /// job NAME by token T` on stdout when P was recorded already (by the run with token T);
    /// 3 when another host holds the job's lease (CMD not run); 5 when the wait ended before
    /// the takeover of a lease that looks abandoned (CMD not run; the message says when it can
    /// be taken over); 4 if the lease was lost (also after CMD exited 0, when the lease was lost
    /// before the record counted: a record counts only while the lease holds);
    /// 130/143 on SIGINT/SIGTERM; 2 on errors, also when CMD exited 0 but the record did not
    /// reach a majority (P may run again), and when the nodes granted the lease too late to
    /// leave half its TTL (nobody holds it: CMD not run, the next run retries).
    Run {
        /// The job name.
        name: String,
        /// The period's name, e.g. "$(date +%F)" for a daily job, "$(date +%Y-%m-%dT%H)" for
        /// an hourly one (1 to 512 bytes, no control characters). The newest 1024 recorded
        /// periods of a job are remembered; an older one asked for again runs again.
        #[arg(long, value_name = "P")]
        period: String,
        /// Lease time; extended automatically every TTL/3. A crashed run's period is run by
        /// the next one-shot run after this long plus drift.
        #[arg(long, default_value = "10s", value_parser = parse_duration)]
        ttl: Duration,
        /// How long to wait for the job's lease while another host holds it (0: try once,
        /// exit 3 if held). From cron on every host, a wait longer than CMD takes lets the
        /// other hosts' runs find the period done (exit 0), or run CMD if that host's run
        /// failed.
        #[arg(long, default_value = "0s", value_parser = parse_duration)]
        wait: Duration,
        /// The command and its arguments.
        #[arg(last = true, required = true, num_args = 1..)]
        command: Vec<String>,
    },
}

/// The job's and the period's names, the TTL and the program, checked before any node is
/// contacted (the library checks them again; these messages name the options).
pub(crate) fn precheck(command: &JobCommand) -> Result<(), Failure> {
    let JobCommand::Run {
        name,
        period,
        ttl,
        command,
        ..
    } = command;
    redquorum::Name::new("job", name.as_str()).map_err(redquorum::Error::from)?;
    redquorum::Name::new("period", period.as_str()).map_err(redquorum::Error::from)?;
    let ttls = redquorum::MIN_TTL..=redquorum::MAX_TTL;
    if !ttls.contains(ttl) {
        let message = format!("--ttl {ttl:?} is outside {ttls:?}");
        return Err(redquorum::Error::InvalidArgument(message).into());
    }
    match command.first() {
        Some(program) => crate::checks::find_program(program),
        None => Ok(()), // clap requires one
    }
}

/// `job run`: run the period's command unless it is done or another host holds the job.
pub(crate) async fn run(client: &Client, command: JobCommand) -> Result<ExitCode, Failure> {
    let JobCommand::Run {
        name,
        period,
        ttl,
        wait,
        command,
    } = command;
    let options =
        JobOptions::default().with_lock(LockOptions::default().with_holder(&default_id()));
    let job = PeriodicJob::with_options(client, &name, ttl, options)?;
    // One listener from before the wait for the lease to the command's end.
    let mut stop: child::Stop = Box::pin(child::stop_signal());
    let run = match begin(client, &job, &name, &period, wait, &mut stop).await? {
        Ok(run) => run,
        Err(code) => return Ok(code),
    };
    let env = [
        ("REDQUORUM_FENCING_TOKEN", run.token().to_string()),
        ("REDQUORUM_LOCK_NAME", name.clone()),
        ("REDQUORUM_JOB_PERIOD", period.clone()),
    ];
    let ended = match child::supervise(run.guard(), &name, &command, &env, stop).await {
        Ok(ended) => ended,
        Err(e) => {
            run.abandon().await;
            return Err(e.into());
        }
    };
    if ended != Ended::Exited(0) {
        let why = match ended {
            Ended::Exited(code) => format!("the command exited {code}"),
            Ended::LeaseLost => "the lease was lost".to_string(),
            Ended::Stopped(_) => "stopped by a signal".to_string(),
        };
        eprintln!(
            "redquorum: job {name:?}, period {period:?}: {why}; nothing recorded (the next run \
             for this period runs the command again)"
        );
        run.abandon().await;
        return Ok(ended.code());
    }
    // `complete` checks the lease before recording (a loss ready together with the command's
    // exit wins), and the record counts only while the lease holds.
    match run.complete().await {
        Ok(_) => Ok(ExitCode::SUCCESS),
        Err(e @ redquorum::Error::LeaseLost { .. }) => {
            eprintln!(
                "redquorum: job {name:?}, period {period:?}: the command succeeded but the \
                 job's lease was lost before its record counted ({e}); the period may or may \
                 not count as done (a record that reached a majority late still counts; one \
                 refused by a later holder does not, and that host runs it)"
            );
            Ok(Ended::LeaseLost.code())
        }
        Err(e) => Err(Failure(format!(
            "job {name:?}, period {period:?}: the command succeeded but the period was not \
             recorded on a majority ({e}); a later run may run it again"
        ))),
    }
}

/// Take the job's lease for `period` (waiting up to `wait`, unless `stop` fires first): the
/// due run, or the exit code that ends the command (done already, another host holds it,
/// stopped by a signal), each said on stdout or stderr.
async fn begin(
    client: &Client,
    job: &PeriodicJob,
    name: &str,
    period: &str,
    wait: Duration,
    stop: &mut child::Stop,
) -> Result<Result<PeriodRun, ExitCode>, Failure> {
    let settle = client.config().node_timeout();
    let started = match child::unless_stopped(job.begin_period(period, wait), stop, settle).await {
        Ok(Err(e @ redquorum::Error::LockLooksAbandoned { .. })) => {
            eprintln!("redquorum: job {name:?}, period {period:?}: not run: {e}");
            return Ok(Err(ExitCode::from(crate::failure::LOOKS_ABANDONED)));
        }
        // The lease lost while the period was being marked begun: nothing run, exit 4 as for
        // any lost lease.
        Ok(Err(e @ redquorum::Error::LeaseLost { .. })) => {
            eprintln!("redquorum: job {name:?}, period {period:?}: not run: {e}");
            return Ok(Err(Ended::LeaseLost.code()));
        }
        Ok(started) => started?,
        Err(code) => {
            eprintln!(
                "redquorum: job {name:?}, period {period:?}: stopped by a signal while waiting \
                 for the job's lease; nothing run"
            );
            return Ok(Err(ExitCode::from(code)));
        }
    };
    Ok(match started {
        PeriodStart::Due(run) => Ok(run),
        PeriodStart::AlreadyDone { token } => {
            println!("already done: period {period} of job {name} by token {token}");
            Err(ExitCode::SUCCESS)
        }
        PeriodStart::NotLeader => {
            eprintln!(
                "redquorum: job {name:?}, period {period:?}: not run: another host holds the \
                 job's lease (lock {name:?})"
            );
            Err(ExitCode::from(3))
        }
    })
}
