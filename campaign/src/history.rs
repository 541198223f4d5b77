//! Recorded histories, read back and checked: ID calls from the workload processes and the
//! CLI, on `CLOCK_MONOTONIC`.

use std::time::Instant;

use redquorum_testkit::checker::{check_ids, check_tenures, IdCall, Tenure};
use redquorum_testkit::mutex::{check_fenced_mutex, Grant, LeaseEnd, MutexStats, UnknownAcquire};
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

/// One whole line of a record: tab-separated fields, the first naming the event.
struct RecordLine<'a> {
    who: &'a str,
    number: usize,
    text: &'a str,
    fields: Vec<&'a str>,
}

impl RecordLine<'_> {
    fn kind(&self) -> &str {
        self.fields.first().copied().unwrap_or("")
    }

    /// Field `k` as a number, or the error naming the line.
    fn num(&self, k: usize) -> Result<u64, String> {
        self.fields
            .get(k)
            .and_then(|x| x.parse().ok())
            .ok_or_else(|| self.bad())
    }

    fn bad(&self) -> String {
        format!("{} line {}: {:?}", self.who, self.number, self.text)
    }
}

/// The whole lines of a record; a partial last line (a process killed mid-write) and empty
/// lines are left out.
fn record_lines<'a>(who: &'a str, text: &'a str) -> Vec<RecordLine<'a>> {
    let lines: Vec<&str> = text.split('\n').collect();
    let whole = lines.len().saturating_sub(1);
    lines[..whole]
        .iter()
        .enumerate()
        .filter(|(_, l)| !l.is_empty())
        .map(|(i, l)| RecordLine {
            who,
            number: i + 1,
            text: l,
            fields: l.split('\t').collect(),
        })
        .collect()
}

/// Parse a worker's ID record (see `worker.rs`); a partial last line (a process killed
/// mid-write) is ignored.
pub fn parse_ids(who: &str, text: &str) -> Result<Vec<Call>, String> {
    let mut out = Vec::new();
    for line in record_lines(who, text) {
        let num = |k: usize| line.num(k);
        let ids = match line.kind() {
            "ok" => Some((num(3)?, num(4)?)),
            "err" => None,
            _ => return Err(line.bad()),
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

/// What a lease holder process recorded: its tenures, its fenced writes, its failed tries.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LeaseHistory {
    /// (holder, token, start, end) on `CLOCK_MONOTONIC`.
    pub tenures: Vec<(String, u64, u64, u64)>,
    /// (holder, token, start, end, accepted).
    pub writes: Vec<(String, u64, u64, u64, bool)>,
    /// Acquisitions that succeeded, and tries that failed.
    pub acquired: u64,
    /// Tries that failed (held by another, no majority, ...).
    pub failed: u64,
    /// Every try: (start, end, acquired).
    pub attempts: Vec<(u64, u64, bool)>,
    /// Every grant, for the fenced-mutex check (also an HTTP caller's late one, which gave no
    /// tenure).
    pub grants: Vec<GrantRecord>,
    /// Acquisitions of unknown outcome: (who, no later than their start).
    pub unknown: Vec<(String, u64)>,
}

/// One grant as its holder recorded it, on `CLOCK_MONOTONIC`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GrantRecord {
    /// Who.
    pub holder: String,
    /// Its token.
    pub token: u64,
    /// The acquire call.
    pub start: u64,
    /// Its end.
    pub end: u64,
    /// The end of its tenure (when the holder stopped relying on it).
    pub tenure_end: u64,
    /// Its release call, when it answered that a majority still held the lease.
    pub released: Option<(u64, u64)>,
}

impl LeaseHistory {
    /// Add another holder's history of the same lock.
    pub fn merge(&mut self, h: LeaseHistory) {
        self.tenures.extend(h.tenures);
        self.writes.extend(h.writes);
        self.acquired += h.acquired;
        self.failed += h.failed;
        self.attempts.extend(h.attempts);
        self.grants.extend(h.grants);
        self.unknown.extend(h.unknown);
    }
}

/// Parse a lease holder's record (see `worker.rs`) into `into`. The record's end is the
/// process's crash (every workload process is killed): a tenure still open ends at its last
/// validity, and the call it may have been making is an acquisition of unknown outcome from
/// its last line on.
pub fn parse_leases(who: &str, text: &str, into: &mut LeaseHistory) -> Result<(), String> {
    // The open tenure: token, start, last valid_until.
    let mut open: Option<(u64, u64, u64)> = None;
    let close = |open: &mut Option<(u64, u64, u64)>, at: Option<u64>, into: &mut LeaseHistory| {
        if let Some((token, start, until)) = open.take() {
            let end = at.map_or(until, |a| a.min(until));
            into.tenures.push((who.to_string(), token, start, end));
            if let Some(g) = into.grants.last_mut().filter(|g| g.token == token) {
                g.tenure_end = end;
            }
        }
    };
    let mut last_at = None;
    for line in record_lines(who, text) {
        let num = |k: usize| line.num(k);
        // When the line was written: a `rel` line's instant, any other's end.
        last_at = Some(if line.kind() == "rel" {
            num(1)?
        } else {
            num(2)?
        });
        match line.kind() {
            "err" | "unk" | "late" => failed_try(&line, into)?,
            "acq" => {
                close(&mut open, None, into);
                into.acquired += 1;
                into.attempts.push((num(1)?, num(2)?, true));
                open = Some((num(3)?, num(2)?, num(4)?));
                into.grants.push(GrantRecord {
                    holder: who.to_string(),
                    token: num(3)?,
                    start: num(1)?,
                    end: num(2)?,
                    tenure_end: num(4)?,
                    released: None,
                });
            }
            "released" => {
                let token = num(3)?;
                if let Some(g) = into.grants.last_mut().filter(|g| g.token == token) {
                    if num(4)? == 1 {
                        g.released = Some((num(1)?, num(2)?));
                    }
                }
            }
            "w" => {
                let token = num(3)?;
                into.writes
                    .push((who.to_string(), token, num(1)?, num(2)?, num(4)? == 1));
                if let Some((t, _, until)) = open.as_mut() {
                    if *t == token {
                        *until = (*until).max(num(5)?);
                    }
                }
            }
            "rel" => close(&mut open, Some(num(1)?), into),
            _ => return Err(line.bad()),
        }
    }
    if open.is_none() {
        if let Some(at) = last_at {
            into.unknown.push((who.to_string(), at));
        }
    }
    close(&mut open, None, into);
    Ok(())
}

/// At most one holder at a time (by the holders' own intervals), tokens increasing with real
/// time.
pub fn check_tenures_of(h: &LeaseHistory, origin: MonotonicOrigin) -> Result<(), String> {
    let tenures: Vec<Tenure> = h
        .tenures
        .iter()
        .map(|(who, token, start, end)| Tenure {
            holder: who.clone(),
            token: *token,
            start: origin.instant(*start),
            end: origin.instant(*end),
        })
        .collect();
    check_tenures(&tenures).map_err(|v| v.to_string())
}

/// A try that gave no tenure: refused (`err`), of unknown outcome (`unk`), or granted after
/// its validity had passed (`late`: a grant for the fenced-mutex check).
fn failed_try(line: &RecordLine<'_>, into: &mut LeaseHistory) -> Result<(), String> {
    let (start, end) = (line.num(1)?, line.num(2)?);
    into.failed += 1;
    into.attempts.push((start, end, false));
    match line.kind() {
        "unk" => into.unknown.push((line.who.to_string(), start)),
        "late" => into.grants.push(GrantRecord {
            holder: line.who.to_string(),
            token: line.num(3)?,
            start,
            end,
            tenure_end: end,
            released: None,
        }),
        _ => {}
    }
    Ok(())
}

/// Every lock's history against a fenced mutex (`redquorum_testkit::mutex`): what it
/// checked, or the violation.
pub fn check_fenced_mutex_of(
    h: &LeaseHistory,
    origin: MonotonicOrigin,
) -> Result<MutexStats, String> {
    let grants: Vec<Grant> = h
        .grants
        .iter()
        .map(|g| Grant {
            holder: g.holder.clone(),
            token: g.token,
            start: origin.instant(g.start),
            end: origin.instant(g.end),
            lease_end: match g.released {
                Some((start, end)) => LeaseEnd::Released {
                    start: origin.instant(start),
                    end: origin.instant(end),
                },
                None => LeaseEnd::After(origin.instant(g.tenure_end)),
            },
        })
        .collect();
    let unknown: Vec<UnknownAcquire> = h
        .unknown
        .iter()
        .map(|(who, at)| UnknownAcquire {
            holder: who.clone(),
            start: origin.instant(*at),
        })
        .collect();
    check_fenced_mutex(&grants, &unknown).map_err(|v| v.to_string())
}

/// Check every lock's history (one holder at a time, the fenced mutex, no stale write),
/// adding what broke to `violations`: what the fenced-mutex check checked, and how long it
/// took.
pub fn check_leases(
    leases: &std::collections::BTreeMap<String, LeaseHistory>,
    origin: MonotonicOrigin,
    violations: &mut Vec<(&'static str, String)>,
) -> (MutexStats, std::time::Duration) {
    let began = Instant::now();
    let mut checked = MutexStats::default();
    for (lock, h) in leases {
        if let Err(v) = check_tenures_of(h, origin) {
            violations.push(("leases", format!("lock {lock}: {v}")));
        }
        match check_fenced_mutex_of(h, origin) {
            Ok(s) => {
                checked.operations += s.operations;
                checked.unknown_acquires += s.unknown_acquires;
                checked.windows += s.windows;
                checked.largest_window = checked.largest_window.max(s.largest_window);
            }
            Err(v) => {
                // Checked up to its first violation: a grant and its release each.
                checked.operations += 2 * h.grants.len();
                checked.unknown_acquires += h.unknown.len();
                violations.push(("fenced mutex", format!("lock {lock}: {v}")));
            }
        }
        if let Err(v) = check_fenced_writes(h) {
            violations.push(("fenced writes", format!("lock {lock}: {v}")));
        }
    }
    (checked, began.elapsed())
}

/// No stale write accepted: no accepted write carries a smaller token than a write the resource
/// accepted before it was sent (by real time: the earlier one returned before it started).
pub fn check_fenced_writes(h: &LeaseHistory) -> Result<(), String> {
    let mut accepted: Vec<&(String, u64, u64, u64, bool)> =
        h.writes.iter().filter(|w| w.4).collect();
    let mut by_end = accepted.clone();
    by_end.sort_by_key(|w| w.3);
    accepted.sort_by_key(|w| w.2);
    let mut done = 0;
    let mut highest: Option<&(String, u64, u64, u64, bool)> = None;
    for w in accepted {
        while done < by_end.len() && by_end[done].3 < w.2 {
            if highest.is_none_or(|h| by_end[done].1 > h.1) {
                highest = Some(by_end[done]);
            }
            done += 1;
        }
        if let Some(h) = highest {
            if w.1 < h.1 {
                return Err(format!(
                    "stale write accepted: {} wrote with token {} (sent {} ns after {} with token {} had been accepted)",
                    w.0,
                    w.1,
                    w.2 - h.3,
                    h.0,
                    h.1
                ));
            }
        }
    }
    Ok(())
}

/// What the job processes recorded: (who, at, period) of every work begun and every
/// completion recorded.
#[derive(Clone, Debug, Default)]
pub struct JobHistory {
    /// Works begun: (who, at, period, token).
    pub begun: Vec<(String, u64, u64, u64)>,
    /// Completions recorded (run_period returned Ran): (who, at, period, token).
    pub ran: Vec<(String, u64, u64, u64)>,
}

/// Parse a job process's record into `into`.
pub fn parse_jobs(who: &str, text: &str, into: &mut JobHistory) -> Result<(), String> {
    for line in record_lines(who, text) {
        let num = |k: usize| line.num(k);
        let entry = (who.to_string(), num(1)?, num(2)?, num(3)?);
        match line.kind() {
            "begin" => into.begun.push(entry),
            "ran" => into.ran.push(entry),
            _ => return Err(line.bad()),
        }
    }
    Ok(())
}

/// A period's work runs again only if no completion of that period was recorded before it
/// began (a runner that died mid-work allows another run; a recorded completion does not).
pub fn check_jobs(h: &JobHistory) -> Result<(), String> {
    for b in &h.begun {
        if let Some(r) = h.ran.iter().find(|r| r.2 == b.2 && r.1 < b.1) {
            return Err(format!(
                "period {} ran again: {} began it (token {}) {} ns after {} recorded its completion (token {})",
                b.2,
                b.0,
                b.3,
                b.1 - r.1,
                r.0,
                r.3
            ));
        }
    }
    Ok(())
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

    #[test]
    fn a_holders_tenure_ends_at_its_release_or_its_last_validity() {
        let mut h = LeaseHistory::default();
        let text = "acq\t0\t10\t7\t100\nw\t20\t30\t7\t1\t150\nrel\t40\t7\nacq\t50\t60\t9\t200\nw\t70\t80\t9\t1\t300\n";
        parse_leases("p", text, &mut h).expect("parses");
        assert_eq!(
            h.tenures,
            vec![("p".into(), 7, 10, 40), ("p".into(), 9, 60, 300)],
            "released at 40; the second never released: its last validity, 300"
        );
        assert_eq!(h.acquired, 2);
        assert!(check_fenced_writes(&h).is_ok());
    }

    #[test]
    fn grants_keep_their_confirmed_releases_and_a_killed_holders_last_call_is_unknown() {
        let mut h = LeaseHistory::default();
        let text = "acq\t0\t10\t7\t100\nrel\t40\t7\nreleased\t41\t45\t7\t1\n\
                    unk\t50\t55\tno majority\nlate\t60\t70\t9\nreleased\t71\t72\t9\t0\n\
                    acq\t80\t90\t10\t200\nrel\t95\t10\n";
        parse_leases("p", text, &mut h).expect("parses");
        let g = |token, start, end, tenure_end, released| GrantRecord {
            holder: "p".into(),
            token,
            start,
            end,
            tenure_end,
            released,
        };
        assert_eq!(
            h.grants,
            vec![
                g(7, 0, 10, 40, Some((41, 45))),
                g(9, 60, 70, 70, None),
                g(10, 80, 90, 95, None)
            ],
            "the late grant (9) has no tenure; 10's release never answered"
        );
        assert_eq!(
            h.unknown,
            vec![("p".to_string(), 50), ("p".to_string(), 95)],
            "the acquisition that failed with an unknown outcome, and the one under way at the kill"
        );
        assert_eq!(h.tenures.len(), 2, "the late grant gives no tenure");
        assert_eq!((h.acquired, h.failed), (2, 2));
        let origin = MonotonicOrigin::now();
        assert!(check_fenced_mutex_of(&h, origin).is_ok());
    }

    #[test]
    fn a_stale_accepted_write_is_found_and_a_rejected_one_is_fine() {
        let w = |who: &str, token, s, e, ok| (who.to_string(), token, s, e, ok);
        let mut h = LeaseHistory {
            writes: vec![w("new", 9, 10, 20, true), w("old", 7, 30, 40, false)],
            ..LeaseHistory::default()
        };
        assert!(check_fenced_writes(&h).is_ok());
        h.writes[1].4 = true;
        let err = check_fenced_writes(&h).expect_err("stale");
        assert!(err.contains("token 7") && err.contains("token 9"), "{err}");
    }

    #[test]
    fn a_period_begun_after_its_recorded_completion_is_a_violation() {
        let mut h = JobHistory::default();
        parse_jobs("a", "begin\t10\t5\t1\nran\t20\t5\t1\n", &mut h).expect("parses");
        parse_jobs("b", "begin\t15\t5\t2\n", &mut h).expect("parses");
        assert!(
            check_jobs(&h).is_ok(),
            "b began before a's completion was recorded"
        );
        parse_jobs("c", "begin\t30\t5\t3\n", &mut h).expect("parses");
        let err = check_jobs(&h).expect_err("c ran a completed period");
        assert!(err.contains("period 5 ran again"), "{err}");
    }
}
