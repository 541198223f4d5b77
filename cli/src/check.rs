//! `check`: every node's safety (AOF, fsync policy, eviction policy, duplicates) and the
//! Redis user's permissions for the features named; exit 0 only if every node is reachable
//! and safe and no permission is missing (1 otherwise).
//!
//! Without `--wait` it only reads (a read-only client: no repair, no set-up). With `--wait` it
//! repairs quarantined nodes as every client does, polling until every node votes or the time
//! is up. Each node's wall clock is shown against the median for operators; it is never used
//! to decide anything. A permission that could not be checked counts as missing.

use std::process::ExitCode;
use std::time::Duration;

use redquorum::acl::{Feature, PermissionReport};
use redquorum::{Client, Config, NodeReport};

use crate::acl::features;
use crate::failure::Failure;
use crate::output::{self, Format};

/// `check [--feature F,...] [--wait DURATION]`.
pub(crate) async fn run(
    config: Config,
    feature: &[String],
    wait: Option<Duration>,
    format: Format,
) -> Result<ExitCode, Failure> {
    let features = features(feature)?;
    Ok(check_command(config, &features, wait, format).await?)
}

/// `check`: only reads; with `wait`, a client that repairs, polled until every node votes.
async fn check_command(
    config: Config,
    features: &[Feature],
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

/// `check`'s table, its permission problems and its verdict.
async fn check(client: &Client, features: &[Feature]) -> ExitCode {
    let (reports, permissions) = tokio::join!(client.check(), client.check_permissions(features));
    let mut all_safe = print_table(&reports);
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

/// `check`'s table, one row per node; true when every node is safe.
fn print_table(reports: &[NodeReport]) -> bool {
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
    all_safe
}

/// One node's version, latency, run_id and clock cells in `check`'s table: the version is the
/// server and its own version (`valkey 8.0.1`; Redis's compatibility `redis_version` when the
/// node named no server), `-` for a node that did not answer.
fn check_cells((r, skew): (&NodeReport, Option<i64>)) -> [String; 4] {
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
fn print_permission_problems(permissions: &[PermissionReport]) -> bool {
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
