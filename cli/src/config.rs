//! The nodes' configuration from the global options: the node list (`--nodes`, or
//! `REDQUORUM_NODES`), TLS (`--cacert`, `--cert`, `--key`, `--sni`), the timeouts, the safety
//! mode (`--permissive`), the fsync attestation and the pinned cluster (`--cluster`).
//!
//! Everything is checked here, before any node is contacted, and an error names the option
//! (or the variable) it comes from. `--node-timeout` sets both the per-node and the connect
//! deadline, and raises the operation deadline to at least one request's.

use std::time::Duration;

use redquorum::{Config, ConfigError, SafetyMode};

use crate::args::Cli;
use crate::failure::{setting_error, Failure};
use crate::tls::{with_tls, TlsFiles};

/// The TLS options of the command line.
pub(crate) fn tls_files(cli: &Cli) -> TlsFiles {
    TlsFiles {
        cacert: cli.cacert.clone(),
        cert: cli.cert.clone(),
        key: cli.key.clone(),
        sni: cli.sni.clone(),
    }
}

/// The configuration the global options describe, checked.
pub(crate) fn from_options(cli: &Cli, nodes_from_env: bool) -> Result<Config, Failure> {
    let mut config = node_list(cli.nodes.as_deref(), nodes_from_env)?;
    config = with_tls(&tls_files(cli), config)?;
    config = with_timeouts(config, cli.node_timeout, cli.operation_timeout);
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
    #[cfg(feature = "test-util")]
    {
        config = with_test_switches(cli, config);
    }
    validate(&config)?;
    Ok(config)
}

/// TEST ONLY: the hidden `--record-pause-for-tests` and `--unfenced-records-for-tests`.
#[cfg(feature = "test-util")]
fn with_test_switches(cli: &Cli, mut config: Config) -> Config {
    if cli.unfenced_records_for_tests {
        config = config.with_unfenced_records_for_tests();
    }
    if let Some(file) = cli.record_pause_for_tests.clone() {
        config = config.with_record_hook_for_tests(move || {
            let file = file.clone();
            Box::pin(async move {
                let mut paused = file.clone().into_os_string();
                paused.push(".paused");
                let _ = std::fs::write(paused, b"");
                while !file.exists() {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            })
        });
    }
    config
}

/// The node list of `--nodes` (`list`, which clap may have read from `REDQUORUM_NODES`:
/// `from_env`), or else of `REDQUORUM_NODES`; an error names where the list came from.
fn node_list(list: Option<&str>, from_env: bool) -> Result<Config, Failure> {
    let source = if from_env {
        redquorum::NODES_ENV
    } else {
        "--nodes"
    };
    Ok(match list {
        Some(list) => Config::from_list(list).map_err(|e| setting_error(source, e))?,
        // Not Config::from_env: the TLS variables are the options' (clap reads them).
        None => match std::env::var(redquorum::NODES_ENV) {
            Ok(list) => {
                Config::from_list(&list).map_err(|e| setting_error(redquorum::NODES_ENV, e))?
            }
            Err(std::env::VarError::NotPresent) => Err(ConfigError::EnvMissing)?,
            Err(std::env::VarError::NotUnicode(_)) => Err(ConfigError::EnvNotUnicode)?,
        },
    })
}

/// `--node-timeout` and `--operation-timeout` applied to `config`.
fn with_timeouts(
    mut config: Config,
    node_timeout: Option<Duration>,
    operation_timeout: Option<Duration>,
) -> Config {
    if let Some(t) = node_timeout {
        config = config.with_node_timeout(t).with_connect_timeout(t);
        // The operation deadline has no option: it must not be shorter than one request.
        let operation = config.operation_timeout().max(t);
        config = config.with_operation_timeout(operation);
    }
    if let Some(t) = operation_timeout {
        config = config.with_operation_timeout(t);
    }
    config
}

/// The settings are checked before any node is contacted; --node-timeout sets both the
/// per-node and the connect deadline, so a range error names the option.
fn validate(config: &Config) -> Result<(), Failure> {
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
    })
}
