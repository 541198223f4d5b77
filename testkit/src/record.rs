//! Ownership records written by member processes (`redquorum dist watch --record FILE`), read
//! back as [`OwnershipInterval`]s for [`check_single_owner`](crate::checker::check_single_owner).
//!
//! Every process on one machine shares `CLOCK_MONOTONIC`, so the intervals of different
//! processes compare with each other and with this process's [`Instant`]s. The format (one
//! event per line, tab-separated fields, times in nanoseconds of `CLOCK_MONOTONIC`; the
//! writer is `cli/src/record.rs`):
//!
//! ```text
//! assign <at> <valid_until> <token> <prepare|active> <unit>...
//! drain  <at> <unit>...
//! stop   <at>
//! ```
//!
//! An `assign` line's units are owned from `<at>` until the first of: the next `assign` or
//! `stop` line, `<valid_until>`, and a `drain` line naming the unit. A process killed or frozen
//! writes nothing more: its last lease bounds what it owned.

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::time::Instant;

use crate::checker::OwnershipInterval;

/// Nanoseconds of `CLOCK_MONOTONIC` now.
pub fn monotonic_ns() -> u64 {
    match nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC) {
        Ok(t) => (t.tv_sec() as u64)
            .saturating_mul(1_000_000_000)
            .saturating_add(t.tv_nsec() as u64),
        Err(_) => 0,
    }
}

/// Converts `CLOCK_MONOTONIC` nanoseconds to this process's [`Instant`]s.
#[derive(Clone, Copy, Debug)]
pub struct MonotonicOrigin {
    instant: Instant,
    ns: u64,
}

impl MonotonicOrigin {
    /// Take the pair now.
    pub fn now() -> Self {
        MonotonicOrigin {
            instant: Instant::now(),
            ns: monotonic_ns(),
        }
    }

    /// The instant `ns` names.
    pub fn instant(&self, ns: u64) -> Instant {
        if ns >= self.ns {
            self.instant + Duration::from_nanos(ns - self.ns)
        } else {
            self.instant
                .checked_sub(Duration::from_nanos(self.ns - ns))
                .unwrap_or(self.instant)
        }
    }
}

/// A line that does not parse.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BadRecord {
    /// 1-based line number.
    pub line: usize,
    /// The line.
    pub text: String,
}

impl std::fmt::Display for BadRecord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "record line {}: cannot parse {:?}", self.line, self.text)
    }
}

enum Event {
    Assign {
        at: u64,
        until: u64,
        token: u64,
        active: bool,
        detail: String,
        units: Vec<String>,
    },
    Drain {
        at: u64,
        units: Vec<String>,
    },
    Stop {
        at: u64,
    },
}

fn parse(text: &str) -> Result<Vec<Event>, BadRecord> {
    let mut out = Vec::new();
    let lines: Vec<&str> = text.split('\n').collect();
    for (i, line) in lines.iter().enumerate() {
        // A process killed mid-write leaves at most a partial last line: ignored.
        if line.is_empty() || (i + 1 == lines.len()) {
            continue;
        }
        let bad = || BadRecord {
            line: i + 1,
            text: line.to_string(),
        };
        let f: Vec<&str> = line.split('\t').collect();
        let num = |k: usize| -> Result<u64, BadRecord> {
            f.get(k).and_then(|x| x.parse().ok()).ok_or_else(bad)
        };
        let event = match f[0] {
            "assign" if f.len() >= 5 && (f[4] == "active" || f[4] == "prepare") => Event::Assign {
                at: num(1)?,
                until: num(2)?,
                token: num(3)?,
                active: f[4] == "active",
                detail: format!("token {} {}", f[3], f[4]),
                units: f[5..].iter().map(|u| u.to_string()).collect(),
            },
            "drain" if f.len() >= 2 => Event::Drain {
                at: num(1)?,
                units: f[2..].iter().map(|u| u.to_string()).collect(),
            },
            "stop" if f.len() == 2 => Event::Stop { at: num(1)? },
            _ => return Err(bad()),
        };
        out.push(event);
    }
    Ok(out)
}

/// The ownership intervals one member process recorded: `owner` names it in violations,
/// `index` numbers the units (a unit not in it gets `u64::MAX`), `origin` converts times.
///
/// # Errors
/// The first whole line that does not parse.
pub fn ownership(
    owner: &str,
    text: &str,
    index: &BTreeMap<String, u64>,
    origin: MonotonicOrigin,
) -> Result<Vec<OwnershipInterval>, BadRecord> {
    let events = parse(text)?;
    let mut out = Vec::new();
    for (i, e) in events.iter().enumerate() {
        let Event::Assign {
            at,
            until,
            detail,
            units,
            ..
        } = e
        else {
            continue;
        };
        // The next assignment or stop ends this one; drains in between end single units.
        let mut end = *until;
        let mut drained: BTreeMap<&str, u64> = BTreeMap::new();
        for later in &events[i + 1..] {
            match later {
                Event::Assign { at: t, .. } | Event::Stop { at: t } => {
                    end = end.min(*t);
                    break;
                }
                Event::Drain { at: t, units } => {
                    for u in units {
                        drained.entry(u.as_str()).or_insert(*t);
                    }
                }
            }
        }
        for unit in units {
            let unit_end = drained.get(unit.as_str()).map_or(end, |t| end.min(*t));
            if unit_end <= *at {
                continue;
            }
            out.push(OwnershipInterval {
                owner: owner.to_string(),
                unit: index.get(unit).copied().unwrap_or(u64::MAX),
                detail: format!("{unit}, {detail}"),
                start: origin.instant(*at),
                end: origin.instant(unit_end),
            });
        }
    }
    Ok(out)
}

/// A process's latest recorded assignment ([`latest`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Latest {
    /// Its units, as recorded (sorted by the writer).
    pub units: Vec<String>,
    /// Until when it may work them.
    pub valid_until: Instant,
    /// The table's version as a fencing token.
    pub token: u64,
    /// Whether the table is active (not prepared).
    pub active: bool,
}

/// The last `assign` line of a record (the process's latest assignment); `None` when the
/// record has none yet or ends with `stop`. A `drain` line after it removes its units.
///
/// # Errors
/// The first whole line that does not parse.
pub fn latest(text: &str, origin: MonotonicOrigin) -> Result<Option<Latest>, BadRecord> {
    let events = parse(text)?;
    let mut drained: Vec<&str> = Vec::new();
    for e in events.iter().rev() {
        match e {
            Event::Stop { .. } => return Ok(None),
            Event::Drain { units, .. } => drained.extend(units.iter().map(String::as_str)),
            Event::Assign {
                until,
                token,
                active,
                units,
                ..
            } => {
                return Ok(Some(Latest {
                    units: units
                        .iter()
                        .filter(|u| !drained.contains(&u.as_str()))
                        .cloned()
                        .collect(),
                    valid_until: origin.instant(*until),
                    token: *token,
                    active: *active,
                }))
            }
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn assignments_end_at_the_next_line_their_lease_or_a_drain_of_the_unit() {
        let origin = MonotonicOrigin::now();
        let b = monotonic_ns();
        let index: BTreeMap<String, u64> = [("a".to_string(), 1), ("b".to_string(), 2)]
            .into_iter()
            .collect();
        let t = |n: u64| (b + n).to_string();
        let text = format!(
            "assign\t{}\t{}\t7\tactive\ta\tb\ndrain\t{}\ta\nassign\t{}\t{}\t8\tprepare\tb\nstop\t{}\nassign\t9",
            t(100),
            t(500),
            t(150),
            t(200),
            t(260),
            t(300)
        );
        let got = ownership("m", &text, &index, origin).expect("parses");
        let at = |i: Instant| i.duration_since(origin.instant(b)).as_nanos() as u64;
        let spans: Vec<(u64, u64, u64)> = got
            .iter()
            .map(|o| (o.unit, at(o.start), at(o.end)))
            .collect();
        assert_eq!(
            spans,
            vec![(1, 100, 150), (2, 100, 200), (2, 200, 260)],
            "a drained unit ends at its drain, the rest at the next line or the lease; the \
             partial last line of a killed process is ignored"
        );
        assert!(ownership("m", "assign\tx\t1\t1\tactive\n", &index, origin).is_err());
    }
}
