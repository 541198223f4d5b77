//! `redquorum`: the command-line tool.
//!
//! ```text
//! redquorum --nodes redis://127.0.0.1:7001,redis://127.0.0.1:7002,redis://127.0.0.1:7003 check
//! ```
//! Without `--nodes` the list comes from `REDQUORUM_NODES`.
//!
//! This file is the entry point: it parses the command line (the options and the list of
//! commands are in `args.rs`), checks the command's own arguments before any node is contacted
//! (`precheck.rs`), builds the configuration from the global options (`config.rs`) and hands
//! over to the command's own module: `check.rs`, `acl.rs`, `ping.rs`, `id.rs`, `lock.rs`,
//! `index.rs`, `units.rs`, `dist.rs`, `cluster.rs`, `election.rs`, `job.rs`, `serve/`,
//! `completions.rs`. Shared by several: `child.rs` (a command run under a lease; `tether.rs` starts it so that
//! it dies with us), `output.rs`
//! (`--output json`), `metrics.rs` (`--metrics-addr`), `record.rs` (`--record`) and
//! `failure.rs` (the error printed with exit code 2).

use std::process::ExitCode;

use clap::parser::ValueSource;
use clap::{CommandFactory, FromArgMatches};
use redquorum::{Client, Config};

#[macro_use]
mod output;
mod acl;
mod args;
mod check;
mod checks;
mod child;
mod cluster;
mod completions;
mod config;
mod dist;
mod election;
mod failure;
mod id;
mod index;
mod job;
mod lock;
mod metrics;
mod ping;
mod precheck;
mod record;
mod serve;
#[cfg(feature = "test-util")]
mod test_clock;
mod tether;
mod tls;
mod units;

use args::{Cli, Command};
use failure::Failure;
use output::Format;

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("REDQUORUM_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    #[cfg(feature = "test-util")]
    test_clock::start();
    let matches = Cli::command().get_matches();
    let nodes_from_env = matches.value_source("nodes") == Some(ValueSource::EnvVariable);
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    if let Command::Completions { shell } = cli.command {
        return completions::print(shell);
    }
    match run(cli, nodes_from_env).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("redquorum: {e}");
            ExitCode::from(2)
        }
    }
}

/// Check the command's input and the global options before any node is contacted, then run
/// the command.
async fn run(mut cli: Cli, nodes_from_env: bool) -> Result<ExitCode, Failure> {
    // Units from a file are read (and checked) before any node is contacted.
    if let Command::Units(command) = &mut cli.command {
        units::read_from_file(command)?;
    }
    precheck::precheck(&cli.command)?;
    if let Command::Acl {
        user,
        feature,
        allow_config_get,
    } = &cli.command
    {
        return acl::run(user, feature, *allow_config_get);
    }
    if cli.output == Format::Json && !cli.command.json_supported() {
        return Err(redquorum::Error::InvalidArgument(
            "--output json is not supported by this command (supported: check, id next, lock \
             holder, index watch, dist watch, election observe, election campaign)"
                .into(),
        )
        .into());
    }
    if let Some((args, name)) = cli.command.metrics() {
        metrics::install(args, name)?;
    }
    let config = config::from_options(&cli, nodes_from_env)?;
    dispatch(cli, config).await
}

/// Run the command on `config`: `cluster` and `check` make their own clients (`cluster init`
/// and `cluster change` need none, `check` one that only reads); the others share one
/// connected client.
async fn dispatch(cli: Cli, config: Config) -> Result<ExitCode, Failure> {
    let tls = config::tls_files(&cli);
    let format = cli.output;
    match cli.command {
        Command::Cluster(command) => {
            cluster::run(command, config, &tls, cli.attest_fsync_always).await
        }
        Command::Check { feature, wait } => check::run(config, &feature, wait, format).await,
        command => {
            let client = Client::connect(config).await?;
            run_connected(&client, command, format).await
        }
    }
}

/// Run a command that uses the connected `client`.
async fn run_connected(
    client: &Client,
    command: Command,
    format: Format,
) -> Result<ExitCode, Failure> {
    match command {
        Command::Ping => Ok(ping::run(client).await?),
        Command::Id(command) => Ok(id::run(client, command, format).await?),
        Command::Lock(command) => Ok(lock::run(client, command, format).await?),
        Command::Index(command) => Ok(index::run(client, command, format).await?),
        Command::Units(command) => Ok(units::run(client, command).await?),
        Command::Dist(command) => Ok(dist::run(client, command, format).await?),
        Command::Election(command) => Ok(election::run(client, command, format).await?),
        Command::Job(command) => job::run(client, command).await,
        Command::Serve(args) => serve::run(client.clone(), args).await.map_err(Failure),
        // Handled before connecting (`main`, `run` and `dispatch`).
        Command::Check { .. }
        | Command::Cluster(_)
        | Command::Acl { .. }
        | Command::Completions { .. } => Ok(ExitCode::SUCCESS),
    }
}
