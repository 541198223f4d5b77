//! `cluster init | show | change`: the cluster's identity, its node list stored on every node.
//!
//! `cluster init` sets the cluster up on blank nodes, once, before any other command (which
//! refuse blank nodes); every node must answer. If every node lost its data, it is how the
//! operator decides that IDs and fencing tokens start again from 1.
//!
//! `cluster change --to LIST` seals the old cluster, copies every value to the new nodes and
//! marks them. It does not go through `Client::connect`: while a change is under way the old
//! list is refused, and running the same change again is how an interrupted one (killed, a
//! node down) is finished; once done, running it again changes nothing. An interrupted change
//! leaves a claim that the next run takes over after watching it for 8 operation timeouts plus
//! 4 node timeouts.

use std::process::ExitCode;

use clap::Subcommand;
use redquorum::{Client, Config};

#[cfg(feature = "test-util")]
use crate::failure::setting_error;
use crate::failure::Failure;
use crate::tls::{with_tls, TlsFiles};

#[derive(Subcommand, Debug)]
pub(crate) enum ClusterCommand {
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
    /// A client still configured with the old list follows the new cluster, when it connects
    /// or while it runs (once the change is done); update its list at leisure.
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

/// `cluster init`, `cluster show` or `cluster change`; `tls` and `attest_fsync_always` (the
/// global options) apply to `change`'s new nodes too.
pub(crate) async fn run(
    command: ClusterCommand,
    config: Config,
    tls: &TlsFiles,
    attest_fsync_always: bool,
) -> Result<ExitCode, Failure> {
    match command {
        ClusterCommand::Init => init(config).await,
        ClusterCommand::Show => show(config).await,
        ClusterCommand::Change {
            to,
            #[cfg(feature = "test-util")]
            abort_at_for_tests,
        } => {
            let target = target(&config, &to, tls, attest_fsync_always)?;
            #[cfg(feature = "test-util")]
            let config = match &abort_at_for_tests {
                Some(phase) => abort_change_at(config, phase)?,
                None => config,
            };
            change(config, target).await
        }
    }
}

/// `cluster init`: set the cluster up, or confirm it (raising its node timeout).
async fn init(config: Config) -> Result<ExitCode, Failure> {
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

/// `cluster show`: the cluster's id and node list as the nodes hold them; exit 1 when no
/// descriptor is readable yet.
async fn show(config: Config) -> Result<ExitCode, Failure> {
    let client = Client::connect(config).await?;
    match client.cluster() {
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
    }
}

/// The new node list's configuration: `to`, with the TLS options and the current deadlines.
fn target(
    config: &Config,
    to: &str,
    tls: &TlsFiles,
    attest_fsync_always: bool,
) -> Result<Config, Failure> {
    let target = with_tls(tls, Config::from_list(to)?)?
        .with_node_timeout(config.node_timeout())
        .with_connect_timeout(config.connect_timeout())
        .with_operation_timeout(config.operation_timeout());
    Ok(target.with_fsync_always_attested(attest_fsync_always))
}

/// `cluster change`: replace the cluster of `config` by one on `target`'s nodes (or finish an
/// interrupted change).
async fn change(config: Config, target: Config) -> Result<ExitCode, Failure> {
    // Not through `connect`: while a change is under way the old list is refused, and
    // running the change again is how it is finished.
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
