//! The command line: the global options ([`Cli`]), the list of commands ([`Command`]; each
//! command's own subcommands and options are in its module), the exit codes and the JSON
//! fields shown at the end of `--help`, and what the options' parsers share.
//!
//! The help text and the exit codes are part of the CLI's interface (the tests in cli/tests
//! check them, the README lists them): change them only on purpose.

use std::time::Duration;

use clap::{Parser, Subcommand};

use crate::checks::parse_duration;
use crate::cluster::ClusterCommand;
use crate::dist::DistCommand;
use crate::election::ElectionCommand;
use crate::id::IdCommand;
use crate::index::IndexCommand;
use crate::job::JobCommand;
use crate::lock::LockCommand;
use crate::metrics::MetricsArgs;
use crate::output::Format;
use crate::serve;
use crate::units::UnitsCommand;

/// The exit codes, shown at the end of `-h` and `--help` (and in the README, "CLI exit
/// codes").
macro_rules! exit_codes {
    () => {
        "\
Exit codes:
  0        success; lock holder: the lock is held; the watchers (index watch, dist watch,
           election observe) and election campaign: stopped by SIGINT/SIGTERM; job run: the
           command exited 0 (the period is recorded), or the period was done already
  1        check: not every node is reachable and safe, or the Redis user lacks a permission
           the checked features need; lock holder: no holder;
           cluster show: no cluster descriptor readable yet
  2        error: bad input or option (usage errors too), no majority, nodes too slow to
           grant a lease in time (nobody holds it: retry), I/O
  3        lock run: lock not acquired (held, or --wait elapsed); election run/campaign: not
           elected within --wait; job run: another host holds the job (command not run)
  4        lock run, election run/campaign, job run: the lease (leadership) was lost; the
           command's process group was stopped
  5        lock run, election run/campaign, job run: --wait ended before the takeover of a
           lease that looks abandoned (its holder is probably gone); the message says when
           it can be taken over (command not run)
  130/143  lock run, election run, job run: stopped by SIGINT/SIGTERM (the command's group too)
  other    lock run, election run, job run: the command's own exit code, 128+N if signal N
           ended it (a command's own 1-5 cannot be told from the codes above; job run records
           the period only on 0)"
    };
}

#[derive(Parser, Debug)]
#[command(
    name = "redquorum",
    version,
    about = "Coordination over N independent Redis nodes with majority quorums",
    after_help = exit_codes!(),
    after_long_help = concat!(exit_codes!(), "\n\n", json_fields!())
)]
pub(crate) struct Cli {
    /// Comma-separated node URLs (redis:// or rediss://). Defaults to $REDQUORUM_NODES.
    #[arg(long, global = true, env = "REDQUORUM_NODES", hide_env_values = true)]
    pub(crate) nodes: Option<String>,

    /// Per-node deadline for one request, like 250ms or 1s.
    #[arg(long, global = true, value_parser = parse_duration)]
    pub(crate) node_timeout: Option<Duration>,

    /// Deadline for one whole operation, retries included, like 5s (the default; at least
    /// --node-timeout). An interrupted `cluster change` or repair leaves a claim that the next
    /// run takes over after watching it for 8 operation timeouts plus 4 node timeouts.
    #[arg(long, global = true, value_parser = parse_duration)]
    pub(crate) operation_timeout: Option<Duration>,

    /// Development only: let nodes that fail safety checks vote.
    #[arg(long, global = true)]
    pub(crate) permissive: bool,

    /// Pin the cluster (its id, from `cluster show`): refuse any other cluster and never set
    /// up a new one on blank nodes unless the node list yields this id.
    #[arg(long, global = true, env = "REDQUORUM_CLUSTER")]
    pub(crate) cluster: Option<String>,

    /// State that every node runs `appendfsync always` (for a Redis user without CONFIG GET,
    /// as `redquorum acl` makes it by default).
    #[arg(long, global = true, env = "REDQUORUM_ATTEST_FSYNC_ALWAYS")]
    pub(crate) attest_fsync_always: bool,

    /// TLS: trust only the CA certificates in this PEM file for rediss:// nodes.
    #[arg(long, global = true, env = "REDQUORUM_CACERT", value_name = "FILE")]
    pub(crate) cacert: Option<std::path::PathBuf>,

    /// TLS: present this client certificate (PEM) to the nodes (mutual TLS); needs --key.
    #[arg(long, global = true, env = "REDQUORUM_CERT", value_name = "FILE")]
    pub(crate) cert: Option<std::path::PathBuf>,

    /// TLS: the private key (PEM) of --cert.
    #[arg(long, global = true, env = "REDQUORUM_KEY", value_name = "FILE")]
    pub(crate) key: Option<std::path::PathBuf>,

    /// TLS: the name the nodes' certificates must carry, when the URLs' hosts are not it.
    #[arg(long, global = true, env = "REDQUORUM_SNI", value_name = "NAME")]
    pub(crate) sni: Option<String>,

    /// Output format: text, or JSON for scripts (check, id next, lock holder, index watch,
    /// dist watch, election observe/campaign; the fields are listed at the end of
    /// `redquorum --help`).
    #[arg(long, global = true, value_enum, default_value_t = Format::Text)]
    pub(crate) output: Format,

    /// TEST ONLY (builds with the test-util feature): after a job's run checked that its
    /// lease holds and just before it sends its completion record, create FILE.paused and
    /// wait until FILE exists, so a test can stop the process at exactly that moment.
    #[cfg(feature = "test-util")]
    #[arg(long, global = true, hide = true, value_name = "FILE")]
    pub(crate) record_pause_for_tests: Option<std::path::PathBuf>,

    /// TEST ONLY (builds with the test-util feature): a job's completion record is not
    /// checked against the job's lease and no period is marked begun
    /// (`Config::with_unfenced_records_for_tests`), so a test can show the late record it
    /// lets count.
    #[cfg(feature = "test-util")]
    #[arg(long, global = true, hide = true)]
    pub(crate) unfenced_records_for_tests: bool,

    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Subcommand, Debug)]
pub(crate) enum Command {
    /// Check every node's safety (AOF, fsync policy, eviction policy, duplicates) and that the
    /// Redis user has every permission the features need. Exit 0 only if every node is
    /// reachable and safe and no permission is missing.
    Check {
        /// The features whose permissions to check (comma-separated: ids, locks, election,
        /// indexing, distribution); default all.
        #[arg(long, value_delimiter = ',')]
        feature: Vec<String>,
        /// Wait up to DURATION for every node to vote (reachable, safe, repaired: after a
        /// node's restart in a rolling restart, say), then report; exit 0 once they all do.
        /// With --wait, check repairs quarantined nodes as every client does (without it,
        /// check only reads).
        #[arg(long, value_parser = parse_duration, value_name = "DURATION")]
        wait: Option<Duration>,
    },
    /// Print the least-privilege Redis ACL for redquorum's user as `ACL SETUSER` commands,
    /// one per line, for `redis-cli` to run as they are (needs no nodes). The first line
    /// resets the user and grants what every client needs; each further line adds one
    /// feature's commands. No line holds a password: add one with
    /// `ACL SETUSER NAME >PASSWORD`.
    Acl {
        /// The Redis user name.
        #[arg(long)]
        user: String,
        /// Only these features (comma-separated: ids, locks, election, indexing,
        /// distribution); default all.
        #[arg(long, value_delimiter = ',')]
        feature: Vec<String>,
        /// Also grant CONFIG GET, so clients can verify the nodes' fsync policy themselves.
        /// Off by default: CONFIG GET cannot be limited to one parameter and reads the admin
        /// password (requirepass, masterauth); without it, run clients with
        /// --attest-fsync-always.
        #[arg(long)]
        allow_config_get: bool,
    },
    /// PING every node; exit 0 if a majority of voting nodes answered.
    Ping,
    /// Monotonic fencing IDs.
    #[command(subcommand)]
    Id(IdCommand),
    /// Fenced leases.
    #[command(subcommand)]
    Lock(LockCommand),
    /// Fenced peer indexing.
    #[command(subcommand)]
    Index(IndexCommand),
    /// The cluster's identity: its node list, stored on every node.
    #[command(subcommand)]
    Cluster(ClusterCommand),
    /// The work units of a pool (work distribution).
    #[command(subcommand)]
    Units(UnitsCommand),
    /// Work distribution: join a pool, or show its table.
    #[command(subcommand)]
    Dist(DistCommand),
    /// Leader election: observe the leader, campaign, or run a command while leader.
    #[command(subcommand)]
    Election(ElectionCommand),
    /// Periodic jobs: run a command once per period across hosts (cron on every host).
    #[command(subcommand)]
    Job(JobCommand),
    /// Serve the API over HTTP (JSON, NDJSON streams) for services in any language: IDs,
    /// leases, elections, periodic jobs, peer indexing and pools, health and metrics. Prints
    /// `listening on URL` once it listens; stops on SIGINT/SIGTERM, ending every session.
    Serve(serve::ServeArgs),
    /// Print a shell completion script, e.g. `redquorum completions bash >
    /// /etc/bash_completion.d/redquorum`.
    Completions {
        /// The shell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
}

impl Command {
    /// Whether the command has a JSON form (or prints nothing of its own: `lock run`,
    /// `election run`).
    pub(crate) fn json_supported(&self) -> bool {
        matches!(
            self,
            Command::Check { .. }
                | Command::Id(IdCommand::Next { .. })
                | Command::Lock(_)
                | Command::Index(IndexCommand::Watch { .. })
                | Command::Dist(DistCommand::Watch { .. })
                | Command::Election(_)
        )
    }

    /// The `--metrics-addr` option of a long-running command, and the command's name.
    pub(crate) fn metrics(&self) -> Option<(&MetricsArgs, &'static str)> {
        match self {
            Command::Lock(LockCommand::Run { metrics, .. }) => Some((metrics, "lock run")),
            Command::Index(IndexCommand::Watch { metrics, .. }) => Some((metrics, "index watch")),
            Command::Dist(DistCommand::Watch { metrics, .. }) => Some((metrics, "dist watch")),
            Command::Election(e) => Some(e.metrics()),
            _ => None,
        }
    }
}
