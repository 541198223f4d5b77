//! `election observe | campaign | run`: leader election from the command line.
//!
//! An election NAME is the lock NAME whose holder is the candidate ID and whose fencing token
//! is the term: `lock holder NAME` and `election observe NAME` read the same lease.

use std::process::ExitCode;
use std::time::Duration;

use clap::Subcommand;
use futures_util::StreamExt;
use redquorum::{Client, Election, Leadership};

use crate::checks::{default_id, parse_duration};
use crate::child;
use crate::failure;
use crate::metrics::MetricsArgs;
use crate::output::{self, Format};

#[derive(Subcommand, Debug)]
pub(crate) enum ElectionCommand {
    /// Print the leader of election NAME, then one line per change, until SIGINT/SIGTERM or
    /// until stdout is closed (exit 0): `leader=<candidate> term=<t>`, or `no leader`. Like `etcdctl elect --listen`. A
    /// crashed leader stays named until a campaigning candidate takes its lease over; once
    /// its lease stayed unchanged for its TTL plus drift, its line is printed again with
    /// ` abandoned` at the end.
    Observe {
        /// The election name.
        name: String,
        /// How often to read the leader (a resignation is seen at once).
        #[arg(long, default_value = "1s", value_parser = parse_duration)]
        interval: Duration,
        #[command(flatten)]
        metrics: MetricsArgs,
    },
    /// Campaign in election NAME, wait to be elected, print `leader=<candidate> term=<t>`,
    /// and stay leader until SIGINT/SIGTERM (resign; exit 0, also while still campaigning). Like `etcdctl elect NAME
    /// PROPOSAL`. Exit 4 if leadership is lost, 3 if --wait elapsed first, 5 if it elapsed
    /// before the takeover of a crashed leader's lease that looks abandoned (said with when it
    /// can be taken over).
    Campaign {
        /// The election name.
        name: String,
        #[command(flatten)]
        candidacy: Candidacy,
        #[command(flatten)]
        metrics: MetricsArgs,
    },
    /// Campaign in election NAME and run CMD once elected, for as long as it is leader.
    ///
    /// Unlike `lock run` (which tries once by default, --wait 0s, and names the holder
    /// `pid <pid>`), it waits to become leader for as long as it takes (or --wait), through
    /// outages, and names itself with --candidate (what `election observe` and `lock holder`
    /// show). The child gets REDQUORUM_FENCING_TOKEN (the term), REDQUORUM_LOCK_NAME (NAME) and
    /// REDQUORUM_CANDIDATE. If leadership is lost, the child's whole process group gets
    /// SIGTERM, then SIGKILL once the remaining validity is used up. Exit code: the child's
    /// (128+signal if it was killed by one); 3 if --wait elapsed before it was elected (5 if
    /// it elapsed before the takeover of a crashed leader's lease that looks abandoned); 4 if
    /// leadership was lost; 130/143 on SIGINT/SIGTERM; 2 on errors.
    Run {
        /// The election name.
        name: String,
        #[command(flatten)]
        candidacy: Candidacy,
        #[command(flatten)]
        metrics: MetricsArgs,
        /// The command and its arguments.
        #[arg(last = true, required = true, num_args = 1..)]
        command: Vec<String>,
    },
}

/// How a candidate campaigns.
#[derive(clap::Args, Debug)]
pub(crate) struct Candidacy {
    /// This candidate's ID, shown to observers (default: hostname-pid).
    #[arg(long)]
    candidate: Option<String>,
    /// The leader's lease time; extended automatically every TTL/3.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    ttl: Duration,
    /// Give up (exit 3, or 5 if the leader's lease looks abandoned but cannot be taken over
    /// yet) if not elected within this time (default: wait for as long as it takes).
    #[arg(long, value_parser = parse_duration)]
    wait: Option<Duration>,
}

impl ElectionCommand {
    /// The `--metrics-addr` option and the command's name for the metrics.
    pub(crate) fn metrics(&self) -> (&MetricsArgs, &'static str) {
        match self {
            ElectionCommand::Observe { metrics, .. } => (metrics, "election observe"),
            ElectionCommand::Campaign { metrics, .. } => (metrics, "election campaign"),
            ElectionCommand::Run { metrics, .. } => (metrics, "election run"),
        }
    }
}

/// The command's names and durations, checked before any node is contacted (the library
/// checks them again; these messages name the options). Returns the program of
/// `election run`, for the caller to look up.
pub(crate) fn precheck(command: &ElectionCommand) -> Result<Option<&str>, redquorum::Error> {
    let (name, candidacy, program) = match command {
        ElectionCommand::Observe { name, .. } => (name, None, None),
        ElectionCommand::Campaign {
            name, candidacy, ..
        } => (name, Some(candidacy), None),
        ElectionCommand::Run {
            name,
            candidacy,
            command,
            ..
        } => (name, Some(candidacy), command.first().map(String::as_str)),
    };
    redquorum::Name::new("election", name)?;
    if let Some(c) = candidacy {
        if let Some(id) = &c.candidate {
            redquorum::Name::new("candidate", id)?;
        }
        if !(redquorum::MIN_TTL..=redquorum::MAX_TTL).contains(&c.ttl) {
            return Err(redquorum::Error::InvalidArgument(format!(
                "--ttl {:?} is outside {:?}..={:?}",
                c.ttl,
                redquorum::MIN_TTL,
                redquorum::MAX_TTL
            )));
        }
    }
    Ok(program)
}

pub(crate) async fn run(
    client: &Client,
    command: ElectionCommand,
    format: Format,
) -> Result<ExitCode, redquorum::Error> {
    match command {
        ElectionCommand::Observe { name, interval, .. } => {
            observe(client, &name, interval, format).await
        }
        ElectionCommand::Campaign {
            name, candidacy, ..
        } => campaign(client, &name, &candidacy, format).await,
        ElectionCommand::Run {
            name,
            candidacy,
            command,
            ..
        } => run_elected(client, &name, &candidacy, &command).await,
    }
}

async fn observe(
    client: &Client,
    name: &str,
    interval: Duration,
    format: Format,
) -> Result<ExitCode, redquorum::Error> {
    if interval.is_zero() {
        return Err(redquorum::Error::InvalidArgument(
            "--interval must be greater than 0".into(),
        ));
    }
    // An observer never campaigns: its candidate ID is never written.
    let election = Election::new(client, name, Duration::from_secs(10), "observer")?;
    let changes = election.observe(interval);
    tokio::pin!(changes);
    let stop = child::stop_signal();
    tokio::pin!(stop);
    loop {
        tokio::select! {
            change = changes.next() => match change {
                Some(leader) => if !output::leader(format, name, leader.as_ref()) {
                    break; // nobody reads any more
                },
                None => break,
            },
            _ = &mut stop => break,
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// How a campaign ended.
enum Elected {
    Won(Election, Leadership),
    /// --wait elapsed first (said on stderr).
    NotInTime,
    /// --wait elapsed before the takeover of a leader's lease that looks abandoned (said on
    /// stderr, with when it can be taken over).
    LooksAbandoned,
    /// SIGINT or SIGTERM (130 or 143).
    Stopped(u8),
}

/// Campaign until elected, --wait elapses or a signal comes.
async fn elect(
    client: &Client,
    name: &str,
    candidacy: &Candidacy,
    stop: &mut child::Stop,
) -> Result<Elected, redquorum::Error> {
    let candidate = candidacy.candidate.clone().unwrap_or_else(default_id);
    let election = Election::new(client, name, candidacy.ttl, &candidate)?;
    let campaign = async {
        match candidacy.wait {
            Some(wait) => election.campaign_for(wait).await,
            None => election.campaign().await,
        }
    };
    tokio::select! {
        won = campaign => match won {
            Ok(leadership) => Ok(Elected::Won(election.clone(), leadership)),
            Err(redquorum::Error::Timeout { .. }) => {
                eprintln!("redquorum: not elected in {name:?} within the --wait time");
                Ok(Elected::NotInTime)
            }
            Err(e @ redquorum::Error::LockLooksAbandoned { .. }) => {
                eprintln!("redquorum: not elected in {name:?} within the --wait time: {e}");
                Ok(Elected::LooksAbandoned)
            }
            Err(e) => Err(e),
        },
        code = stop => Ok(Elected::Stopped(code)),
    }
}

async fn campaign(
    client: &Client,
    name: &str,
    candidacy: &Candidacy,
    format: Format,
) -> Result<ExitCode, redquorum::Error> {
    // One listener for the whole command: a signal right after the leader line is caught.
    let mut stop: child::Stop = Box::pin(child::stop_signal());
    let (election, leadership) = match elect(client, name, candidacy, &mut stop).await? {
        Elected::Won(e, l) => (e, l),
        Elected::NotInTime => return Ok(ExitCode::from(3)),
        Elected::LooksAbandoned => return Ok(ExitCode::from(failure::LOOKS_ABANDONED)),
        Elected::Stopped(_) => return Ok(ExitCode::SUCCESS),
    };
    let info = redquorum::LeaderInfo::new(election.candidate(), leadership.term(), candidacy.ttl);
    // Leadership is held even if nobody reads stdout: only a signal or a loss ends it.
    let _ = output::leader(format, name, Some(&info));
    tokio::select! {
        reason = leadership.lost() => {
            eprintln!("redquorum: leadership of {name:?} lost ({reason})");
            let _ = leadership.resign().await;
            Ok(ExitCode::from(4))
        }
        _ = stop => {
            let _ = leadership.resign().await;
            Ok(ExitCode::SUCCESS)
        }
    }
}

async fn run_elected(
    client: &Client,
    name: &str,
    candidacy: &Candidacy,
    command: &[String],
) -> Result<ExitCode, redquorum::Error> {
    let mut stop: child::Stop = Box::pin(child::stop_signal());
    let (election, leadership) = match elect(client, name, candidacy, &mut stop).await? {
        Elected::Won(e, l) => (e, l),
        Elected::NotInTime => return Ok(ExitCode::from(3)),
        Elected::LooksAbandoned => return Ok(ExitCode::from(failure::LOOKS_ABANDONED)),
        Elected::Stopped(code) => return Ok(ExitCode::from(code)),
    };

    let env = [
        (
            "REDQUORUM_FENCING_TOKEN",
            leadership.term().get().to_string(),
        ),
        ("REDQUORUM_LOCK_NAME", name.to_string()),
        ("REDQUORUM_CANDIDATE", election.candidate().to_string()),
    ];
    let code = child::run_while_held(leadership.guard(), name, command, &env, stop).await;
    let _ = leadership.resign().await;
    code
}
