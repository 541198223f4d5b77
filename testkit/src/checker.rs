//! History checkers: they take what clients observed and say exactly what broke.

use std::fmt;
use std::time::Instant;

/// One completed call that returned IDs, timed on one monotonic clock at both ends.
#[derive(Clone, Debug)]
pub struct IdCall {
    /// Who made it (generator, process), for the failure message.
    pub who: String,
    /// Just before the call was made.
    pub start: Instant,
    /// Just after it returned.
    pub end: Instant,
    /// The IDs it returned (one or more).
    pub ids: Vec<u64>,
}

/// What a checker found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum IdViolation {
    /// The same ID was returned twice.
    Duplicate {
        /// The ID.
        id: u64,
        /// The two calls (descriptions).
        first: String,
        /// The second.
        second: String,
    },
    /// A call that started after another returned got a smaller or equal ID.
    Inversion {
        /// The call that returned first, with its largest ID.
        earlier: String,
        /// The later call, with its smallest ID.
        later: String,
    },
}

impl fmt::Display for IdViolation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IdViolation::Duplicate { id, first, second } => {
                write!(f, "ID {id} returned twice: by {first} and by {second}")
            }
            IdViolation::Inversion { earlier, later } => write!(
                f,
                "real-time order broken: {later} started after {earlier} returned, yet got a smaller or equal ID"
            ),
        }
    }
}

fn describe(c: &IdCall, origin: Instant) -> String {
    let (lo, hi) = (c.ids.iter().min(), c.ids.iter().max());
    format!(
        "{} [{:.3}s..{:.3}s] ids {:?}..={:?}",
        c.who,
        c.start.saturating_duration_since(origin).as_secs_f64(),
        c.end.saturating_duration_since(origin).as_secs_f64(),
        lo.unwrap_or(&0),
        hi.unwrap_or(&0)
    )
}

/// Check a history of ID calls: no ID twice, and for every pair of calls where one returned
/// before the other started, the later one's IDs are all larger. O(n log n).
pub fn check_ids(calls: &[IdCall]) -> Result<(), IdViolation> {
    let Some(origin) = calls.iter().map(|c| c.start).min() else {
        return Ok(());
    };
    // Uniqueness.
    let mut all: Vec<(u64, usize)> = calls
        .iter()
        .enumerate()
        .flat_map(|(i, c)| c.ids.iter().map(move |id| (*id, i)))
        .collect();
    all.sort_unstable();
    for w in all.windows(2) {
        if w[0].0 == w[1].0 {
            return Err(IdViolation::Duplicate {
                id: w[0].0,
                first: describe(&calls[w[0].1], origin),
                second: describe(&calls[w[1].1], origin),
            });
        }
    }
    // Real-time order: sweep calls by start time, folding in every call that ended before.
    let mut by_end: Vec<usize> = (0..calls.len()).collect();
    by_end.sort_by_key(|i| calls[*i].end);
    let mut by_start: Vec<usize> = (0..calls.len()).collect();
    by_start.sort_by_key(|i| calls[*i].start);
    let mut ended = 0usize;
    let mut max_before: Option<(u64, usize)> = None;
    for b in by_start {
        while ended < by_end.len() && calls[by_end[ended]].end < calls[b].start {
            let a = by_end[ended];
            if let Some(hi) = calls[a].ids.iter().max() {
                if max_before.is_none_or(|(m, _)| *hi > m) {
                    max_before = Some((*hi, a));
                }
            }
            ended += 1;
        }
        if let (Some((hi, a)), Some(lo)) = (max_before, calls[b].ids.iter().min()) {
            if *lo <= hi {
                return Err(IdViolation::Inversion {
                    earlier: describe(&calls[a], origin),
                    later: describe(&calls[b], origin),
                });
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn call(t0: Instant, start_ms: u64, end_ms: u64, ids: &[u64]) -> IdCall {
        IdCall {
            who: format!("call@{start_ms}"),
            start: t0 + Duration::from_millis(start_ms),
            end: t0 + Duration::from_millis(end_ms),
            ids: ids.to_vec(),
        }
    }

    #[test]
    fn overlapping_calls_may_return_in_any_order() {
        let t0 = Instant::now();
        let h = [
            call(t0, 0, 10, &[5]),
            call(t0, 5, 15, &[3]),
            call(t0, 20, 30, &[6]),
        ];
        assert_eq!(check_ids(&h), Ok(()));
    }

    #[test]
    fn the_checker_catches_a_duplicate() {
        let t0 = Instant::now();
        let h = [call(t0, 0, 10, &[5, 6]), call(t0, 5, 15, &[6])];
        assert!(matches!(
            check_ids(&h),
            Err(IdViolation::Duplicate { id: 6, .. })
        ));
    }

    #[test]
    fn the_checker_catches_an_inversion() {
        let t0 = Instant::now();
        let h = [call(t0, 0, 10, &[7]), call(t0, 11, 12, &[6])];
        let err = check_ids(&h).expect_err("6 after 7 returned is an inversion");
        assert!(err.to_string().contains("real-time order broken"), "{err}");
    }
}
