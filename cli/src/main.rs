//! `redquorum`: the command-line tool.
//!
//! ```text
//! redquorum --nodes redis://127.0.0.1:7001,redis://127.0.0.1:7002,redis://127.0.0.1:7003 check
//! ```
//! Without `--nodes` the list comes from `REDQUORUM_NODES`.

use std::process::ExitCode;
use std::time::Duration;

use clap::parser::ValueSource;
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use redquorum::{Client, Config, ConfigError, SafetyMode};

#[macro_use]
mod output;
mod child;
mod election;
mod job;
mod metrics;
mod record;
mod serve;

use election::ElectionCommand;
use metrics::MetricsArgs;
use output::Format;

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
  2        error: bad input or option (usage errors too), no majority, I/O
  3        lock run: lock not acquired (held, or --wait elapsed); election run/campaign: not
           elected within --wait; job run: another host holds the job (command not run)
  4        lock run, election run/campaign, job run: the lease (leadership) was lost; the
           command's process group was stopped
  130/143  lock run, election run, job run: stopped by SIGINT/SIGTERM (the command's group too)
  other    lock run, election run, job run: the command's own exit code, 128+N if signal N
           ended it (a command's own 1-4 cannot be told from the codes above; job run records
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
struct Cli {
    /// Comma-separated node URLs (redis:// or rediss://). Defaults to $REDQUORUM_NODES.
    #[arg(long, global = true, env = "REDQUORUM_NODES", hide_env_values = true)]
    nodes: Option<String>,

    /// Per-node deadline for one request, like 250ms or 1s.
    #[arg(long, global = true, value_parser = parse_duration)]
    node_timeout: Option<Duration>,

    /// Deadline for one whole operation, retries included, like 5s (the default; at least
    /// --node-timeout). An interrupted `cluster change` or repair leaves a claim that the next
    /// run takes over after watching it for 8 operation timeouts plus 4 node timeouts.
    #[arg(long, global = true, value_parser = parse_duration)]
    operation_timeout: Option<Duration>,

    /// Development only: let nodes that fail safety checks vote.
    #[arg(long, global = true)]
    permissive: bool,

    /// Pin the cluster (its id, from `cluster show`): refuse any other cluster and never set
    /// up a new one on blank nodes unless the node list yields this id.
    #[arg(long, global = true, env = "REDQUORUM_CLUSTER")]
    cluster: Option<String>,

    /// State that every node runs `appendfsync always` (for a Redis user without CONFIG GET,
    /// as `redquorum acl` makes it by default).
    #[arg(long, global = true, env = "REDQUORUM_ATTEST_FSYNC_ALWAYS")]
    attest_fsync_always: bool,

    /// TLS: trust only the CA certificates in this PEM file for rediss:// nodes.
    #[arg(long, global = true, env = "REDQUORUM_CACERT", value_name = "FILE")]
    cacert: Option<std::path::PathBuf>,

    /// TLS: present this client certificate (PEM) to the nodes (mutual TLS); needs --key.
    #[arg(long, global = true, env = "REDQUORUM_CERT", value_name = "FILE")]
    cert: Option<std::path::PathBuf>,

    /// TLS: the private key (PEM) of --cert.
    #[arg(long, global = true, env = "REDQUORUM_KEY", value_name = "FILE")]
    key: Option<std::path::PathBuf>,

    /// TLS: the name the nodes' certificates must carry, when the URLs' hosts are not it.
    #[arg(long, global = true, env = "REDQUORUM_SNI", value_name = "NAME")]
    sni: Option<String>,

    /// Output format: text, or JSON for scripts (check, id next, lock holder, index watch,
    /// dist watch, election observe/campaign; the fields are listed at the end of
    /// `redquorum --help`).
    #[arg(long, global = true, value_enum, default_value_t = Format::Text)]
    output: Format,

    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
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
    Job(job::JobCommand),
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

#[derive(Subcommand, Debug)]
enum DistCommand {
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

#[derive(Subcommand, Debug)]
enum UnitsCommand {
    /// Add units to POOL: the UNITs given, or one per line of --from-file (`-` for stdin).
    Add {
        /// The pool name.
        pool: String,
        /// The units.
        units: Vec<String>,
        /// A file with one unit per line (`-`: stdin); empty lines are skipped.
        #[arg(long)]
        from_file: Option<String>,
    },
    /// Remove units from POOL: no later table assigns them.
    Remove {
        /// The pool name.
        pool: String,
        /// The units.
        #[arg(required = true)]
        units: Vec<String>,
    },
    /// Replace POOL's units by the UNITs given (or one per line of --from-file, `-` for stdin):
    /// missing ones are added first, then the others removed.
    Replace {
        /// The pool name.
        pool: String,
        /// The units.
        units: Vec<String>,
        /// A file with one unit per line (`-`: stdin); empty lines are skipped.
        #[arg(long)]
        from_file: Option<String>,
    },
    /// Print the units of POOL, one per line, sorted.
    List {
        /// The pool name.
        pool: String,
    },
    /// Pin UNIT of POOL to the member ID: every later table gives it to that member while it
    /// is present (drained or not).
    Pin {
        /// The pool name.
        pool: String,
        /// The unit.
        unit: String,
        /// The member ID it is pinned to.
        id: String,
    },
    /// Unpin units of POOL: they are shared by weight again.
    Unpin {
        /// The pool name.
        pool: String,
        /// The units.
        #[arg(required = true)]
        units: Vec<String>,
    },
    /// Collect POOL's removed units (tombstones) held alike on every node; prints
    /// `collected <n>`. Needs every node up; a pool's leader also does it every 10 minutes.
    Gc {
        /// The pool name.
        pool: String,
    },
    /// Print POOL's pins (`pin <unit> <member>`) and drained members (`drained <member>`).
    Settings {
        /// The pool name.
        pool: String,
    },
}

#[derive(Subcommand, Debug)]
enum ClusterCommand {
    /// Set the cluster up on blank nodes, once, before any other command (which refuse blank
    /// nodes): every node must answer. Its descriptor records --node-timeout (default 250ms)
    /// as the cluster's node timeout, the longest any client may use. On a cluster set up
    /// already it changes nothing, except raising the node timeout to a longer --node-timeout
    /// (never lowering it). If every node lost its data, this is how the operator decides
    /// that IDs and fencing tokens start again from 1.
    Init,
    /// Print the cluster's id and node list as the nodes hold them.
    Show,
    /// Change the cluster's node list (add, remove or replace nodes) from the current list
    /// (--nodes) to TO: seals the old cluster, copies every value to the new nodes, marks them.
    /// A client still configured with the old list follows the new cluster when it connects
    /// (a running one fails once the old nodes are sealed: restart it); update its list.
    /// An interrupted change (killed, a node down) is finished by running the same command
    /// again; once done, running it again changes nothing.
    Change {
        /// The new comma-separated node list.
        #[arg(long)]
        to: String,
        /// TEST ONLY (builds with the test-util feature): abort the process (as a kill would)
        /// at this point of the change: sealed, started (the copy), page (one page read),
        /// marked (one new node marked).
        #[cfg(feature = "test-util")]
        #[arg(long, hide = true, value_name = "PHASE")]
        abort_at_for_tests: Option<String>,
    },
}

#[derive(Subcommand, Debug)]
enum IndexCommand {
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

#[derive(Subcommand, Debug)]
enum LockCommand {
    /// Run CMD only while holding lock NAME. The child gets REDQUORUM_FENCING_TOKEN and
    /// REDQUORUM_LOCK_NAME; if the lease is lost, the child's whole process group gets SIGTERM,
    /// then SIGKILL once the remaining validity is used up. Exit code: the child's (128+signal if
    /// it was killed by one); 3 if the lock was not acquired; 4 if the lease was lost; 2 on errors.
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

#[derive(Subcommand, Debug)]
enum IdCommand {
    /// Print COUNT new IDs of SEQUENCE, one per line, strictly increasing, each accepted by a
    /// majority; exit non-zero with the reason when there is no quorum.
    Next {
        /// The sequence name.
        sequence: String,
        /// How many IDs (consecutive).
        #[arg(long, short = 'n', default_value_t = 1, allow_negative_numbers = true)]
        count: u64,
    },
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| format!("{e} (use e.g. 500ms, 2s, 1m)"))
}

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("REDQUORUM_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let matches = Cli::command().get_matches();
    let nodes_from_env = matches.value_source("nodes") == Some(ValueSource::EnvVariable);
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    if let Command::Completions { shell } = cli.command {
        // Into a buffer: the generator panics on a write error (a closed pipe).
        let mut script = Vec::new();
        clap_complete::generate(shell, &mut Cli::command(), "redquorum", &mut script);
        let mut out = std::io::stdout().lock();
        return match std::io::Write::write_all(&mut out, &script)
            .and_then(|()| std::io::Write::flush(&mut out))
        {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("redquorum: cannot write the completion script: {e}");
                ExitCode::from(2)
            }
        };
    }
    match run(cli, nodes_from_env).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("redquorum: {e}");
            ExitCode::from(2)
        }
    }
}

/// Parse `--feature` values.
fn features(names: &[String]) -> Result<Vec<redquorum::acl::Feature>, redquorum::Error> {
    names
        .iter()
        .filter(|n| !n.trim().is_empty())
        .map(|n| redquorum::acl::Feature::parse(n))
        .collect()
}

/// The TLS options.
struct TlsFiles {
    cacert: Option<std::path::PathBuf>,
    cert: Option<std::path::PathBuf>,
    key: Option<std::path::PathBuf>,
    sni: Option<String>,
}

/// The TLS options applied to `config`.
fn with_tls(cli: &TlsFiles, mut config: Config) -> Result<Config, redquorum::Error> {
    if let Some(ca) = &cli.cacert {
        config = config.with_ca_file(ca)?;
    }
    match (&cli.cert, &cli.key) {
        (Some(cert), Some(key)) => config = config.with_client_cert(cert, key)?,
        (None, None) => {}
        (Some(_), None) => {
            return Err(redquorum::Error::InvalidArgument(
                "--cert (REDQUORUM_CERT) is given without --key (REDQUORUM_KEY): a client \
                 certificate needs its key"
                    .into(),
            ))
        }
        (None, Some(_)) => {
            return Err(redquorum::Error::InvalidArgument(
                "--key (REDQUORUM_KEY) is given without --cert (REDQUORUM_CERT): a client \
                 key needs its certificate"
                    .into(),
            ))
        }
    }
    if let Some(name) = &cli.sni {
        config = config.with_server_name(name)?;
    }
    Ok(config)
}

/// Whether `command` has a JSON form (or prints nothing of its own: `lock run`, `election
/// run`).
fn json_supported(command: &Command) -> bool {
    matches!(
        command,
        Command::Check { .. }
            | Command::Id(IdCommand::Next { .. })
            | Command::Lock(_)
            | Command::Index(IndexCommand::Watch { .. })
            | Command::Dist(DistCommand::Watch { .. })
            | Command::Election(_)
    )
}

/// The `--metrics-addr` option of a long-running command, and the command's name.
fn metrics_of(command: &Command) -> Option<(&MetricsArgs, &'static str)> {
    match command {
        Command::Lock(LockCommand::Run { metrics, .. }) => Some((metrics, "lock run")),
        Command::Index(IndexCommand::Watch { metrics, .. }) => Some((metrics, "index watch")),
        Command::Dist(DistCommand::Watch { metrics, .. }) => Some((metrics, "dist watch")),
        Command::Election(e) => Some(e.metrics()),
        _ => None,
    }
}

/// A failure of the command, as printed (`redquorum: ...`, exit 2).
#[derive(Debug)]
struct Failure(String);

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<redquorum::Error> for Failure {
    fn from(e: redquorum::Error) -> Self {
        Failure(e.to_string())
    }
}

impl From<ConfigError> for Failure {
    fn from(e: ConfigError) -> Self {
        redquorum::Error::from(e).into()
    }
}

/// A configuration error of the option (and variable) `setting`, named first.
fn setting_error(setting: &str, e: impl std::fmt::Display) -> Failure {
    Failure(format!("invalid configuration: {setting}: {e}"))
}

/// Check the command's own arguments (names, counts, durations, the program to run) before
/// any node is contacted: bad input fails with nothing sent, not even the set-up of a
/// cluster on blank nodes. The library checks them again; the messages here name the
/// options.
fn precheck(command: &Command) -> Result<(), Failure> {
    use redquorum::Name;
    fn name(what: &'static str, value: &str) -> Result<(), Failure> {
        Name::new(what, value).map_err(redquorum::Error::from)?;
        Ok(())
    }
    fn invalid(message: String) -> Failure {
        redquorum::Error::InvalidArgument(message).into()
    }
    // The membership interval and restart grace limits of the library
    // (`GroupOptions::with_interval`, `PoolOptions::with_restart_grace`).
    let interval_range = Duration::from_millis(100)..=Duration::from_secs(3600);
    let max_grace = Duration::from_secs(3600);
    let interval = |d: &Duration| {
        if interval_range.contains(d) {
            Ok(())
        } else {
            Err(invalid(format!(
                "--interval {} is outside 100ms..=1h",
                humantime::format_duration(*d)
            )))
        }
    };
    match command {
        Command::Check { feature, .. } | Command::Acl { feature, .. } => {
            features(feature)?;
        }
        Command::Id(IdCommand::Next { sequence, count }) => {
            name("sequence", sequence)?;
            if *count == 0 || *count > redquorum::MAX_IDS_PER_CALL {
                return Err(invalid(format!(
                    "--count (-n) must be between 1 and {}, got {count}",
                    redquorum::MAX_IDS_PER_CALL
                )));
            }
        }
        Command::Lock(LockCommand::Run {
            name: lock,
            ttl,
            command,
            ..
        }) => {
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
        Command::Index(IndexCommand::Watch {
            group,
            interval: every,
            id,
            ..
        }) => {
            name("group", group)?;
            if let Some(id) = id {
                name("member", id)?;
            }
            interval(every)?;
        }
        Command::Dist(DistCommand::Watch {
            pool,
            id,
            weight,
            interval: every,
            grace,
            ..
        }) => {
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
            if *grace > max_grace {
                return Err(invalid(format!(
                    "--grace {} is above 1h",
                    humantime::format_duration(*grace)
                )));
            }
        }
        Command::Dist(DistCommand::Table { pool }) => name("pool", pool)?,
        Command::Dist(DistCommand::Drain { pool, id, .. }) => {
            name("pool", pool)?;
            name("member", id)?;
        }
        Command::Units(units) => {
            let (pool, names): (&str, &[String]) = match units {
                UnitsCommand::Add { pool, units, .. }
                | UnitsCommand::Replace { pool, units, .. }
                | UnitsCommand::Remove { pool, units }
                | UnitsCommand::Unpin { pool, units } => (pool, units),
                UnitsCommand::Pin { pool, unit, id } => {
                    name("unit", unit)?;
                    name("member", id)?;
                    (pool, &[])
                }
                UnitsCommand::List { pool }
                | UnitsCommand::Gc { pool }
                | UnitsCommand::Settings { pool } => (pool, &[]),
            };
            name("pool", pool)?;
            for unit in names {
                name("unit", unit)?;
            }
        }
        Command::Lock(LockCommand::Holder { name: lock, .. }) => name("lock", lock)?,
        Command::Election(e) => {
            if let Some(program) = election::precheck(e)? {
                find_program(program)?;
            }
        }
        Command::Job(j) => job::precheck(j)?,
        Command::Serve(args) => serve::precheck(args).map_err(Failure)?,
        Command::Ping | Command::Cluster(_) | Command::Completions { .. } => {}
    }
    Ok(())
}

/// Whether `program` can be run: a path to an executable file, or one found on `PATH`.
fn find_program(program: &str) -> Result<(), Failure> {
    use std::os::unix::fs::PermissionsExt;
    let executable = |p: &std::path::Path| {
        p.metadata()
            .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
            .unwrap_or(false)
    };
    let found = if program.contains('/') {
        executable(std::path::Path::new(program))
    } else {
        !program.is_empty()
            && std::env::var_os("PATH").is_some_and(|paths| {
                std::env::split_paths(&paths).any(|dir| executable(&dir.join(program)))
            })
    };
    if found {
        Ok(())
    } else {
        Err(redquorum::Error::InvalidArgument(format!(
            "cannot run {program:?}: {}",
            if program.contains('/') {
                "no such executable file"
            } else {
                "no such executable on PATH"
            }
        ))
        .into())
    }
}

async fn run(mut cli: Cli, nodes_from_env: bool) -> Result<ExitCode, Failure> {
    // Units from a file are read (and checked) before any node is contacted.
    if let Command::Units(
        UnitsCommand::Add {
            units, from_file, ..
        }
        | UnitsCommand::Replace {
            units, from_file, ..
        },
    ) = &mut cli.command
    {
        if let Some(path) = from_file.take() {
            units.extend(read_lines(&path)?);
        }
    }
    precheck(&cli.command)?;
    if let Command::Acl {
        user,
        feature,
        allow_config_get,
    } = &cli.command
    {
        for line in redquorum::acl::setuser_lines(user, &features(feature)?, *allow_config_get)? {
            println!("{line}");
        }
        return Ok(ExitCode::SUCCESS);
    }
    let source = if nodes_from_env {
        redquorum::NODES_ENV
    } else {
        "--nodes"
    };
    if cli.output == Format::Json && !json_supported(&cli.command) {
        return Err(redquorum::Error::InvalidArgument(
            "--output json is not supported by this command (supported: check, id next, lock \
             holder, index watch, dist watch, election observe, election campaign)"
                .into(),
        )
        .into());
    }
    if let Some((args, name)) = metrics_of(&cli.command) {
        metrics::install(args, name)?;
    }
    let format = cli.output;
    let mut config = match &cli.nodes {
        Some(list) => Config::from_list(list).map_err(|e| setting_error(source, e))?,
        // Not Config::from_env: the TLS variables are the options' (clap reads them).
        None => match std::env::var(redquorum::NODES_ENV) {
            Ok(list) => {
                Config::from_list(&list).map_err(|e| setting_error(redquorum::NODES_ENV, e))?
            }
            Err(std::env::VarError::NotPresent) => Err(ConfigError::EnvMissing)?,
            Err(std::env::VarError::NotUnicode(_)) => Err(ConfigError::EnvNotUnicode)?,
        },
    };
    let tls = TlsFiles {
        cacert: cli.cacert.clone(),
        cert: cli.cert.clone(),
        key: cli.key.clone(),
        sni: cli.sni.clone(),
    };
    config = with_tls(&tls, config)?;
    if let Some(t) = cli.node_timeout {
        config = config.with_node_timeout(t).with_connect_timeout(t);
        // The operation deadline has no option: it must not be shorter than one request.
        let operation = config.operation_timeout().max(t);
        config = config.with_operation_timeout(operation);
    }
    if let Some(t) = cli.operation_timeout {
        config = config.with_operation_timeout(t);
    }
    if cli.permissive {
        config = config.with_safety(SafetyMode::Permissive);
    }
    config = config.with_fsync_always_attested(cli.attest_fsync_always);
    if let Some(id) = &cli.cluster {
        config = config.with_cluster_id(id).map_err(|e| match e {
            ConfigError::ClusterMismatch(why) => {
                setting_error("--cluster (REDQUORUM_CLUSTER)", why)
            }
            other => other.into(),
        })?;
    }
    // The settings are checked before any node is contacted; --node-timeout sets both the
    // per-node and the connect deadline, so a range error names the option.
    config.validate().map_err(|e| match e {
        ConfigError::DurationOutOfRange {
            name: name @ ("node_timeout" | "connect_timeout" | "operation_timeout"),
            value,
            min,
            max,
        } => setting_error(
            if name == "operation_timeout" {
                "--operation-timeout"
            } else {
                "--node-timeout"
            },
            format!(
                "{} is outside the allowed range {}..={} ({name})",
                humantime::format_duration(value),
                humantime::format_duration(min),
                humantime::format_duration(max)
            ),
        ),
        other => other.into(),
    })?;
    if let Command::Cluster(ClusterCommand::Change { to, .. }) = &cli.command {
        // Not through `connect`: while a change is under way the old list is refused, and
        // running the change again is how it is finished.
        let mut target = with_tls(&tls, Config::from_list(to)?)?
            .with_node_timeout(config.node_timeout())
            .with_connect_timeout(config.connect_timeout())
            .with_operation_timeout(config.operation_timeout());
        target = target.with_fsync_always_attested(cli.attest_fsync_always);
        #[cfg(feature = "test-util")]
        if let Command::Cluster(ClusterCommand::Change {
            abort_at_for_tests: Some(phase),
            ..
        }) = &cli.command
        {
            config = abort_change_at(config, phase)?;
        }
        let change = Client::change_node_list(config, target).await?;
        let (verb, outcome) = if change.done_before {
            (
                "was already replaced",
                format!("{} new nodes marked, nothing to do", change.marked),
            )
        } else {
            (
                "replaced",
                format!(
                    "{} old nodes sealed, {} new nodes marked",
                    change.sealed, change.marked
                ),
            )
        };
        println!(
            "cluster {} ({}) {verb} by cluster {} ({}): {outcome}",
            change.from.id,
            change.from.describe(),
            change.to.id,
            change.to.describe(),
        );
        return Ok(ExitCode::SUCCESS);
    }
    if let Command::Cluster(ClusterCommand::Init) = &cli.command {
        return cluster_init(config).await;
    }
    if let Command::Check { feature, wait } = &cli.command {
        let features = features(feature)?;
        return Ok(check_command(config, &features, *wait, format).await?);
    }
    let client = Client::connect(config.clone()).await?;
    match cli.command {
        Command::Cluster(ClusterCommand::Show) => match client.cluster() {
            Some(d) => {
                println!("cluster {} ({} nodes)", d.id, d.n());
                for n in &d.nodes {
                    println!("  {n}");
                }
                if let Some(p) = &d.prev {
                    println!("replaced cluster {p}");
                }
                Ok(ExitCode::SUCCESS)
            }
            None => {
                eprintln!("redquorum: no cluster descriptor readable on these nodes yet");
                Ok(ExitCode::from(1))
            }
        },
        // Handled before connecting, above.
        Command::Cluster(ClusterCommand::Change { .. }) => Ok(ExitCode::SUCCESS),
        // Handled before connecting, above.
        Command::Check { .. } | Command::Cluster(ClusterCommand::Init) => Ok(ExitCode::SUCCESS),
        Command::Acl { .. } => Ok(ExitCode::SUCCESS), // handled before connecting
        Command::Election(command) => Ok(election::run(&client, command, format).await?),
        Command::Job(command) => job::run(&client, command).await,
        Command::Serve(args) => serve::run(client.clone(), args).await.map_err(Failure),
        Command::Completions { .. } => Ok(ExitCode::SUCCESS), // handled before connecting
        Command::Lock(LockCommand::Holder { name, watch }) => {
            let holder = redquorum::Lock::new(&client, &name, Duration::from_secs(10))?
                .holder_watching(watch)
                .await?;
            Ok(output::holder(format, &name, holder.as_ref()))
        }
        Command::Ping => {
            let tally = client.ping().await?;
            println!(
                "{} of {} nodes answered ({} needed) in {:.1} ms",
                tally.applied(),
                tally.majority().nodes(),
                tally.majority().needed(),
                tally.elapsed().as_secs_f64() * 1e3
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::Index(IndexCommand::Watch {
            group,
            interval,
            id,
            record,
            tasks,
            #[cfg(feature = "test-util")]
            no_barrier_for_tests,
            ..
        }) => {
            let mut opts = redquorum::GroupOptions::default().with_interval(interval);
            #[cfg(feature = "test-util")]
            if no_barrier_for_tests {
                opts = opts.without_barrier_for_tests();
            }
            let recorder = match record::Recorder::open_option(record, Some(tasks)) {
                Ok(Some((r, hook))) => {
                    opts = opts.with_drain(interval, hook);
                    Some(r)
                }
                Ok(None) => None,
                Err(code) => return Ok(code),
            };
            Ok(index_watch(&client, &group, id, opts, recorder, format).await?)
        }
        Command::Lock(LockCommand::Run {
            name,
            ttl,
            wait,
            command,
            ..
        }) => Ok(lock_run(&client, &name, ttl, wait, &command).await?),
        Command::Units(command) => Ok(units(&client, command).await?),
        Command::Dist(DistCommand::Table { pool }) => {
            let table = redquorum::pool_table(&client, &pool).await?;
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
        Command::Dist(DistCommand::Drain { pool, id, undo }) => {
            redquorum::Units::new(&client, &pool)?
                .drain(&id, !undo)
                .await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Dist(DistCommand::Watch {
            pool,
            id,
            weight,
            interval,
            grace,
            record,
            #[cfg(feature = "test-util")]
            no_barrier_for_tests,
            ..
        }) => {
            let mut opts = redquorum::PoolOptions::default()
                .with_interval(interval)
                .with_weight(weight)
                .with_restart_grace(grace);
            #[cfg(feature = "test-util")]
            if no_barrier_for_tests {
                opts = opts.without_barrier_for_tests();
            }
            let recorder = match record::Recorder::open_option(record, None) {
                Ok(Some((r, hook))) => {
                    opts = opts.with_drain(interval, hook);
                    Some(r)
                }
                Ok(None) => None,
                Err(code) => return Ok(code),
            };
            Ok(dist_watch(&client, &pool, id, opts, recorder, format).await?)
        }
        Command::Id(IdCommand::Next { sequence, count }) => {
            // One call per process: spare IDs would only become a gap.
            let options = redquorum::IdOptions::default().with_lookahead(0)?;
            let ids = redquorum::IdGenerator::with_options(&client, &sequence, options)?
                .next_ids(count)
                .await?;
            if format == Format::Json {
                output::ids(&sequence, &ids.collect::<Vec<u64>>());
                return Ok(ExitCode::SUCCESS);
            }
            let mut out = String::with_capacity(ids.size_hint().0 * 12);
            for id in ids {
                out.push_str(&id.to_string());
                out.push('\n');
            }
            print!("{out}");
            Ok(ExitCode::SUCCESS)
        }
    }
}

async fn units(client: &Client, command: UnitsCommand) -> Result<ExitCode, redquorum::Error> {
    match command {
        // `run` has read --from-file into `units` already.
        UnitsCommand::Add { pool, units, .. } => {
            redquorum::Units::new(client, &pool)?.add(&units).await?;
        }
        UnitsCommand::Replace { pool, units, .. } => {
            redquorum::Units::new(client, &pool)?
                .replace_all(&units)
                .await?;
        }
        UnitsCommand::Remove { pool, units } => {
            redquorum::Units::new(client, &pool)?.remove(&units).await?;
        }
        UnitsCommand::List { pool } => {
            let mut out = String::new();
            for unit in redquorum::Units::new(client, &pool)?.list().await? {
                out.push_str(&unit);
                out.push('\n');
            }
            print!("{out}");
        }
        UnitsCommand::Pin { pool, unit, id } => {
            redquorum::Units::new(client, &pool)?
                .pin(&unit, &id)
                .await?;
        }
        UnitsCommand::Gc { pool } => {
            let n = redquorum::Units::new(client, &pool)?
                .collect_removed()
                .await?;
            println!("collected {n}");
        }
        UnitsCommand::Unpin { pool, units } => {
            redquorum::Units::new(client, &pool)?.unpin(&units).await?;
        }
        UnitsCommand::Settings { pool } => {
            let settings = redquorum::Units::new(client, &pool)?.settings().await?;
            let mut out = String::new();
            for (unit, id) in &settings.pins {
                out.push_str(&format!("pin {unit} {id}\n"));
            }
            for id in &settings.drained {
                out.push_str(&format!("drained {id}\n"));
            }
            print!("{out}");
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The non-empty lines of `path` (`-`: stdin), without their line endings.
fn read_lines(path: &str) -> Result<Vec<String>, redquorum::Error> {
    use std::io::Read;
    let mut text = String::new();
    let read = if path == "-" {
        std::io::stdin().read_to_string(&mut text)
    } else {
        std::fs::File::open(path).and_then(|mut f| f.read_to_string(&mut text))
    };
    read.map_err(|e| {
        redquorum::Error::InvalidArgument(format!("--from-file {path:?}: cannot read: {e}"))
    })?;
    Ok(text
        .lines()
        .map(|l| l.trim_end_matches('\r'))
        .filter(|l| !l.is_empty())
        .map(String::from)
        .collect())
}

/// `cluster init`: set the cluster up, or confirm it (raising its node timeout).
async fn cluster_init(config: Config) -> Result<ExitCode, Failure> {
    let init = Client::init_cluster(config).await?;
    let d = &init.cluster;
    let timeout = init.node_timeout.map_or_else(
        || "not recorded".into(),
        |t| humantime::format_duration(t).to_string(),
    );
    let raised = if init.raised > 0 {
        format!(" (raised on {} nodes)", init.raised)
    } else {
        String::new()
    };
    if init.created {
        println!(
            "cluster {} set up on {} nodes ({} marked); node timeout {timeout}{raised}",
            d.id,
            d.n(),
            init.marked
        );
    } else {
        println!(
            "cluster {} ({} nodes) was set up already; node timeout {timeout}{raised}",
            d.id,
            d.n()
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// `check`: only reads; with `wait`, a client that repairs, polled until every node votes.
async fn check_command(
    config: Config,
    features: &[redquorum::acl::Feature],
    wait: Option<Duration>,
    format: Format,
) -> Result<ExitCode, redquorum::Error> {
    let client = match wait {
        Some(_) => Client::connect(config).await?,
        None => Client::connect_read_only(config).await?,
    };
    if let Some(limit) = wait {
        let start = tokio::time::Instant::now();
        loop {
            let reports = client.check().await;
            if reports.iter().all(|r| r.votes && r.is_safe()) || start.elapsed() >= limit {
                break;
            }
            // Any request to a quarantined node starts its repair.
            let _ = client.ping().await;
            tokio::time::sleep(Duration::from_millis(250).min(limit)).await;
        }
    }
    Ok(match format {
        Format::Text => check(&client, features).await,
        Format::Json => output::check_json(&client, features).await,
    })
}

async fn check(client: &Client, features: &[redquorum::acl::Feature]) -> ExitCode {
    let (reports, permissions) = tokio::join!(client.check(), client.check_permissions(features));
    let url_width = reports
        .iter()
        .map(|r| r.url.len())
        .max()
        .unwrap_or(3)
        .max(3);
    // Each node's wall clock against the median: shown for operators, never used to decide.
    let skews =
        redquorum::clock_skews(&reports.iter().map(|r| r.probe.as_ref()).collect::<Vec<_>>());
    let rows: Vec<[String; 4]> = reports.iter().zip(skews).map(check_cells).collect();
    // The server and its own version ("redis 7.0.15", "valkey 8.0.1"), as wide as the widest.
    let version_width = rows.iter().map(|r| r[0].len()).max().unwrap_or(0).max(8);
    println!(
        "{:<6} {:<url_width$} {:<6} {:<5} {:<version_width$} {:>9} {:<8} {:>12} findings",
        "node", "url", "status", "votes", "version", "latency", "run_id", "clock"
    );
    let mut all_safe = true;
    for (r, [version, latency, run_id, clock]) in reports.iter().zip(rows) {
        let safe = r.is_safe();
        all_safe &= safe;
        println!(
            "{:<6} {:<url_width$} {:<6} {:<5} {:<version_width$} {:>9} {:<8} {:>12} {}",
            r.node.to_string(),
            r.url,
            if safe {
                "OK"
            } else if r.probe.is_none() {
                "DOWN"
            } else {
                "UNSAFE"
            },
            if r.votes { "yes" } else { "no" },
            version,
            latency,
            run_id,
            clock,
            r.summary()
        );
    }
    let permitted = print_permission_problems(&permissions);
    if let Some(why) = client.set_up_problem() {
        all_safe = false;
        println!("{why}");
    }
    let n = reports.len();
    let voting = reports.iter().filter(|r| r.votes).count();
    let needed = client.majority().needed();
    println!(
        "{voting} of {n} nodes vote; a majority needs {needed}; {}",
        if all_safe {
            "all nodes safe"
        } else {
            "NOT all nodes are safe and reachable"
        }
    );
    if all_safe && permitted {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

/// One node's version, latency, run_id and clock cells in `check`'s table: the version is the
/// server and its own version (`valkey 8.0.1`; Redis's compatibility `redis_version` when the
/// node named no server), `-` for a node that did not answer.
fn check_cells((r, skew): (&redquorum::NodeReport, Option<i64>)) -> [String; 4] {
    let clock = skew.map_or_else(|| "-".to_string(), |ms| format!("{ms:+}ms"));
    match &r.probe {
        Some(p) => [
            p.server_label()
                .or_else(|| p.version.clone())
                .unwrap_or_else(|| "?".into()),
            format!("{:.2}ms", p.latency.as_secs_f64() * 1e3),
            p.run_id
                .as_deref()
                .and_then(|id| id.get(..8))
                .unwrap_or("?")
                .to_string(),
            clock,
        ],
        None => ["-".into(), "-".into(), "-".into(), clock],
    }
}

/// `check`'s lines for permissions a node's user lacks or that could not be checked; false when
/// there was any.
fn print_permission_problems(permissions: &[redquorum::acl::PermissionReport]) -> bool {
    let mut permitted = true;
    for p in permissions {
        match &p.missing {
            Ok(missing) if missing.is_empty() => {}
            Ok(missing) => {
                permitted = false;
                for m in missing {
                    println!("{} {}: the Redis user lacks {m}", p.node, p.url);
                }
            }
            // Not checked is not permitted (a timeout, a node that is down, or older than
            // Redis 7).
            Err(why) => {
                permitted = false;
                println!(
                    "{} {}: the permissions could not be checked: {why}",
                    p.node, p.url
                );
            }
        }
    }
    if !permitted {
        println!("missing permissions: see `redquorum acl --user NAME`");
    }
    permitted
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
    let guard = match lock.acquire(wait).await {
        Ok(g) => g,
        Err(
            e @ (redquorum::Error::LockHeld { .. }
            | redquorum::Error::Timeout { .. }
            | redquorum::Error::Contended { .. }),
        ) => {
            eprintln!("redquorum: lock {name:?} not acquired: {e}");
            return Ok(ExitCode::from(3));
        }
        Err(e) => return Err(e),
    };
    let env = [
        ("REDQUORUM_FENCING_TOKEN", guard.token().to_string()),
        ("REDQUORUM_LOCK_NAME", name.to_string()),
    ];
    let code = child::run_while_held(&guard, name, command, &env).await;
    let _ = guard.release().await;
    code
}

/// This instance's default member ID: `<hostname>-<pid>`.
fn default_id() -> String {
    let host = std::fs::read_to_string("/etc/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "host".into());
    format!("{host}-{}", std::process::id())
}

/// `dist watch`: join the pool, print every change of this member's own assignment, leave on
/// SIGINT/SIGTERM.
async fn dist_watch(
    client: &Client,
    pool: &str,
    id: Option<String>,
    opts: redquorum::PoolOptions,
    recorder: Option<record::Recorder>,
    format: Format,
) -> Result<ExitCode, redquorum::Error> {
    use redquorum::ViewState;

    let id = id.unwrap_or_else(default_id);
    let member = redquorum::PoolMember::join(client, pool, &id, opts).await?;
    let mut changes = member.changes();
    let mut last: Option<String> = None;
    let stop = child::stop_signal();
    tokio::pin!(stop);
    loop {
        let current = changes.borrow_and_update().clone();
        if let Some(r) = &recorder {
            r.assign(current.as_ref());
        }
        let line = current.as_ref().and_then(|a| {
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
        });
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

/// `index watch`: join the group, print every adopted view this instance belongs to, leave on
/// SIGINT/SIGTERM.
async fn index_watch(
    client: &Client,
    group: &str,
    id: Option<String>,
    opts: redquorum::GroupOptions,
    recorder: Option<record::Recorder>,
    format: Format,
) -> Result<ExitCode, redquorum::Error> {
    use redquorum::{Member, ViewState};

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
        let line = views.borrow_and_update().as_ref().and_then(|v| {
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
        });
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

/// TEST ONLY: a copy hook that aborts the process at `phase` of a node-list change, as a kill
/// would (no cleanup, no claim released).
#[cfg(feature = "test-util")]
fn abort_change_at(config: Config, phase: &str) -> Result<Config, Failure> {
    use redquorum::CopyEvent;
    let at = match phase {
        "sealed" => CopyEvent::Sealed,
        "started" => CopyEvent::Started,
        "page" => CopyEvent::PageRead,
        "marked" => CopyEvent::Marked,
        other => {
            return Err(setting_error(
                "--abort-at-for-tests",
                format!("unknown phase {other:?}"),
            ))
        }
    };
    Ok(config.with_copy_hook_for_tests(move |event| {
        if event == at {
            eprintln!("redquorum: TEST: aborting at {event:?}");
            std::process::abort();
        }
        Box::pin(async {})
    }))
}
