//! Recorded histories, read back and checked: ID calls from the workload processes and the
//! CLI, on `CLOCK_MONOTONIC`.

use std::time::Instant;

use redquorum_testkit::checker::{check_ids, IdCall};
use redquorum_testkit::record::MonotonicOrigin;

/// One recorded call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Call {
    /// Who made it.
    pub who: String,
    /// Start and end, `CLOCK_MONOTONIC` nanoseconds.
    pub start: u64,
    /// End.
    pub end: u64,
    /// The IDs it returned (`None`: it failed).
    pub ids: Option<(u64, u64)>,
}

/// Parse a worker's ID record (see `worker.rs`); a partial last line (a process killed
/// mid-write) is ignored.
pub fn parse_ids(who: &str, text: &str) -> Result<Vec<Call>, String> {
    let mut out = Vec::new();
    let lines: Vec<&str> = text.split('\n').collect();
    for (i, line) in lines.iter().enumerate() {
        if line.is_empty() || i + 1 == lines.len() {
            continue;
        }
        let f: Vec<&str> = line.split('\t').collect();
        let num = |k: usize| -> Result<u64, String> {
            f.get(k)
                .and_then(|x| x.parse().ok())
                .ok_or_else(|| format!("{who} line {}: {line:?}", i + 1))
        };
        let ids = match f[0] {
            "ok" => Some((num(3)?, num(4)?)),
            "err" => None,
            _ => return Err(format!("{who} line {}: {line:?}", i + 1)),
        };
        out.push(Call {
            who: who.to_string(),
            start: num(1)?,
            end: num(2)?,
            ids,
        });
    }
    Ok(out)
}

/// The ID checker over every successful call: unique IDs, real-time order. The violation's
/// text names both calls (the shortest excerpt of history that shows it).
pub fn check(calls: &[Call], origin: MonotonicOrigin) -> Result<(), String> {
    let to_std = |ns: u64| -> Instant { origin.instant(ns).into_std() };
    let history: Vec<IdCall> = calls
        .iter()
        .filter_map(|c| {
            let (lo, hi) = c.ids?;
            Some(IdCall {
                who: c.who.clone(),
                start: to_std(c.start),
                end: to_std(c.end),
                ids: (lo..=hi).collect(),
            })
        })
        .collect();
    check_ids(&history).map_err(|v| v.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_parse_and_a_killed_writers_partial_line_is_ignored() {
        let calls =
            parse_ids("w", "ok\t1\t2\t5\t6\nerr\t3\t4\tno majority\nok\t9").expect("parses");
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[0].ids, Some((5, 6)));
        assert_eq!(calls[1].ids, None);
        assert!(parse_ids("w", "what\t1\n").is_err());
    }

    #[test]
    fn the_checker_sees_a_repeated_id_across_processes() {
        let origin = MonotonicOrigin::now();
        let b = redquorum_testkit::record::monotonic_ns();
        let call = |who: &str, s: u64, e: u64, id: u64| Call {
            who: who.into(),
            start: b + s,
            end: b + e,
            ids: Some((id, id)),
        };
        assert!(check(&[call("a", 0, 10, 1), call("b", 20, 30, 2)], origin).is_ok());
        let err =
            check(&[call("a", 0, 10, 1), call("b", 20, 30, 1)], origin).expect_err("a duplicate");
        assert!(err.contains("returned twice"), "{err}");
    }
}
