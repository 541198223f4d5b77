//! `--output text|json`: the machine-readable forms of the commands that print results.
//!
//! The field names below are part of the CLI's interface (documented in `--help` and in the
//! README, "CLI output formats"); add fields, never rename or remove one.

use std::io::Write;
use std::process::ExitCode;

use redquorum::{Client, Holder, LeaderInfo, Severity};
use serde_json::{json, Value};

/// How results are printed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Format {
    /// Human-readable lines (the default).
    #[default]
    Text,
    /// One JSON document (`check`, `id next`, `lock holder`) or JSON Lines, one object per
    /// line (`index watch`, `dist watch`, `election observe`, `election campaign`).
    Json,
}

/// Every JSON shape, shown at the end of `redquorum --help` (and in the README).
macro_rules! json_fields {
    () => {
        "\
JSON output (--output json): one document for check, id next and lock holder; JSON Lines
(one object per line, flushed) for index watch, dist watch, election observe and election
campaign. Fields are only ever added, never renamed or removed. Streaming commands stop (exit 0) when
stdout is closed.
  check:             {\"nodes\":[{\"node\",\"url\",\"status\":\"ok|unsafe|down\",\"votes\",\
\"version\",\"server\",\"server_version\",\"latency_ms\",\"run_id\",\"clock_skew_ms\",\"findings\":[{\"severity\":\
\"unsafe|warning|info\",\"finding\"}],\"missing_permissions\":[{\"permission\",\"features\"}],\"permission_error\"}],\
\"voting\",\"total\",\"needed\",\"all_safe\",\"all_permitted\"} \
(null where unknown)
  id next:           {\"sequence\",\"ids\":[<u64>,...]}
  lock holder:       {\"lock\",\"held\",\"holder\",\"token\",\"version\",\"ttl_ms\",\"unchanged_ms\",\"abandoned\"} \
(null when not held; unchanged_ms null without --watch)
  election observe:  {\"election\",\"leader\",\"term\",\"abandoned\"} per change (null: no leader)
  election campaign: {\"election\",\"leader\",\"term\",\"abandoned\"} once elected
  index watch:       {\"group\",\"version\",\"index\",\"replicas\",\"state\":\"prepare|active\"}
  dist watch:        {\"pool\",\"version\",\"state\":\"prepare|active\",\"units\":[...]}
lock run and election run print nothing of their own; the other commands refuse --output json."
    };
}

/// Print one line and flush, for streaming commands (a reader sees each change at once).
/// False when stdout is gone (a closed pipe): a streaming command then stops, as if signalled.
#[must_use = "a streaming command stops when its reader is gone"]
pub(crate) fn line(text: &str) -> bool {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{text}").and_then(|()| out.flush()).is_ok()
}

/// Print one JSON value on one line; false when stdout is gone.
pub(crate) fn json_line(value: &Value) -> bool {
    line(&value.to_string())
}

/// Whole milliseconds, saturated.
fn millis(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// `lock holder` in either format; exit 0 when held, 1 when not. Text:
/// `holder=<h> token=<t> version=<v> ttl=<ms>ms`, then ` unchanged=<ms>ms` when the lease was
/// watched and ` abandoned` when it looks abandoned.
pub(crate) fn holder(format: Format, lock: &str, holder: Option<&Holder>) -> ExitCode {
    let _ = match format {
        Format::Json => json_line(&match holder {
            Some(h) => json!({
                "lock": lock,
                "held": true,
                "holder": h.holder,
                "token": h.token.get(),
                "version": h.version,
                "ttl_ms": millis(h.ttl),
                "unchanged_ms": h.unchanged_for.map(millis),
                "abandoned": h.looks_abandoned(),
            }),
            None => json!({
                "lock": lock, "held": false, "holder": null, "token": null,
                "version": null, "ttl_ms": null, "unchanged_ms": null, "abandoned": null,
            }),
        }),
        Format::Text => line(&match holder {
            Some(h) => {
                let mut text = format!(
                    "holder={} token={} version={} ttl={}ms",
                    h.holder,
                    h.token.get(),
                    h.version,
                    h.ttl.as_millis()
                );
                if let Some(u) = h.unchanged_for {
                    text.push_str(&format!(" unchanged={}ms", u.as_millis()));
                }
                if h.looks_abandoned() {
                    text.push_str(" abandoned");
                }
                text
            }
            None => "no holder".to_string(),
        }),
    };
    if holder.is_some() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

/// One leadership state: `leader=<candidate> term=<t>` (then ` abandoned` when the leader
/// looks abandoned) / `no leader`, or its JSON object; false when stdout is gone.
pub(crate) fn leader(format: Format, election: &str, leader: Option<&LeaderInfo>) -> bool {
    match format {
        Format::Json => json_line(&json!({
            "election": election,
            "leader": leader.map(|l| l.candidate.as_str()),
            "term": leader.map(|l| l.term.get()),
            "abandoned": leader.map(LeaderInfo::looks_abandoned),
        })),
        Format::Text => line(&match leader {
            Some(l) if l.looks_abandoned() => {
                format!("leader={} term={} abandoned", l.candidate, l.term.get())
            }
            Some(l) => format!("leader={} term={}", l.candidate, l.term.get()),
            None => "no leader".to_string(),
        }),
    }
}

/// `id next --output json`: `{"sequence":..,"ids":[..]}`.
pub(crate) fn ids(sequence: &str, ids: &[u64]) {
    let _ = json_line(&json!({ "sequence": sequence, "ids": ids }));
}

/// `check --output json`: the same verdict and exit code as the table.
pub(crate) async fn check_json(client: &Client, features: &[redquorum::acl::Feature]) -> ExitCode {
    let (reports, permissions) = tokio::join!(client.check(), client.check_permissions(features));
    let mut permitted = true;
    let skews =
        redquorum::clock_skews(&reports.iter().map(|r| r.probe.as_ref()).collect::<Vec<_>>());
    let mut all_safe = true;
    let mut nodes = Vec::with_capacity(reports.len());
    for (r, skew) in reports.iter().zip(skews) {
        let safe = r.is_safe();
        all_safe &= safe;
        let status = if safe {
            "ok"
        } else if r.probe.is_none() {
            "down"
        } else {
            "unsafe"
        };
        let findings: Vec<Value> = r
            .findings
            .iter()
            .map(|f| json!({ "severity": severity(f.severity()), "finding": f.to_string() }))
            .collect();
        let probe = r.probe.as_ref();
        let (missing, permission_error) =
            permission_fields(permissions.iter().find(|p| p.node == r.node));
        permitted &= permission_error.is_none() && missing.is_empty();
        nodes.push(json!({
            "missing_permissions": missing,
            "permission_error": permission_error,
            "node": r.node.to_string(),
            "url": r.url,
            "status": status,
            "votes": r.votes,
            "version": probe.and_then(|p| p.version.clone()),
            "server": probe.and_then(|p| p.server.clone()),
            "server_version": probe.and_then(|p| p.server_version.clone()),
            "latency_ms": probe.map(|p| p.latency.as_secs_f64() * 1e3),
            "run_id": probe.and_then(|p| p.run_id.clone()),
            "clock_skew_ms": skew,
            "findings": findings,
        }));
    }
    let _ = json_line(&json!({
        "nodes": nodes,
        "voting": reports.iter().filter(|r| r.votes).count(),
        "total": reports.len(),
        "needed": client.majority().needed(),
        "all_safe": all_safe,
        "all_permitted": permitted,
    }));
    if all_safe && permitted {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

/// A node's `missing_permissions` and `permission_error` (`not checked` without a report).
fn permission_fields(
    checked: Option<&redquorum::acl::PermissionReport>,
) -> (Vec<Value>, Option<String>) {
    let permission_error = match checked.map(|p| &p.missing) {
        Some(Ok(_)) => None,
        Some(Err(why)) => Some(why.clone()),
        None => Some("not checked".to_string()),
    };
    let missing: Vec<Value> = checked
        .and_then(|p| p.missing.as_ref().ok())
        .map(|m| {
            m.iter()
                .map(|m| {
                    json!({
                        "permission": m.permission,
                        "features": m.features.iter().map(|f| f.name()).collect::<Vec<_>>(),
                    })
                })
                .collect()
        })
        .unwrap_or_default();
    (missing, permission_error)
}

fn severity(s: Severity) -> &'static str {
    match s {
        Severity::Unsafe => "unsafe",
        Severity::Warning => "warning",
        Severity::Info => "info",
    }
}
