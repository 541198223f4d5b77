//! History checkers: they take what clients observed and say exactly what broke.
//!
//! - [`check_ids`]: unique IDs, increasing in real-time order ([`IdCall`], [`IdViolation`]).
//! - [`check_tenures`]: at most one lease holder at a time, tokens increasing with tenures
//!   ([`Tenure`], [`TenureViolation`]).
//! - [`check_single_owner`]: no unit of work owned by two owners at once
//!   ([`OwnershipInterval`], [`OwnerViolation`]).
//!
//! Lease and ownership histories are timed on [`tokio::time::Instant`], the clock the library's
//! guards and assignments report their validity on; ID calls on [`std::time::Instant`].

use std::fmt;
use std::time::{Duration, Instant};

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

// ---------------------------------------------------------------- lease tenures

/// One holder's tenure of a lease as the holder saw it: from when it knew it held the lease
/// (just after acquiring) to when it stopped relying on it (just before releasing, or the end of
/// the validity it was promised). The interval is half-open, `[start, end)`: a tenure that
/// starts exactly when another ends does not overlap it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tenure {
    /// Who held it (client, process), for the failure message.
    pub holder: String,
    /// The fencing token the holder got with the lease.
    pub token: u64,
    /// When the tenure began.
    pub start: tokio::time::Instant,
    /// When it ended.
    pub end: tokio::time::Instant,
}

/// What [`check_tenures`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TenureViolation {
    /// Two tenures overlap: two holders at once.
    Overlap {
        /// The tenure that started first (description: holder, token, interval).
        first: String,
        /// The tenure that started while the first had not ended.
        second: String,
        /// How long both held the lease.
        overlap: Duration,
    },
    /// A tenure that started after another one ended carries a smaller or equal token.
    TokenNotIncreasing {
        /// The earlier tenure (description).
        earlier: String,
        /// The later tenure, whose token is not above the earlier one's.
        later: String,
    },
}

impl fmt::Display for TenureViolation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TenureViolation::Overlap {
                first,
                second,
                overlap,
            } => write!(
                f,
                "two holders at once for {overlap:?}: {first} and {second}"
            ),
            TenureViolation::TokenNotIncreasing { earlier, later } => write!(
                f,
                "tokens must increase with tenures: {later} came after {earlier}, yet its token \
                 is not larger"
            ),
        }
    }
}

/// Seconds since `origin`, for failure messages.
fn secs_since(t: tokio::time::Instant, origin: tokio::time::Instant) -> f64 {
    t.saturating_duration_since(origin).as_secs_f64()
}

fn describe_tenure(t: &Tenure, origin: tokio::time::Instant) -> String {
    format!(
        "{} (token {}) [{:.3}s..{:.3}s]",
        t.holder,
        t.token,
        secs_since(t.start, origin),
        secs_since(t.end, origin)
    )
}

/// Check a lease's tenures: at most one holder at any time, and fencing tokens increasing with
/// the tenures. Sorted by start, every tenure must start no earlier than the previous one ended
/// (touching is fine; this finds an overlap between any two tenures, adjacent or not) and carry
/// a larger token than the previous one. Reports the first violation in start order; an overlap
/// before a token out of order between the same two tenures. O(n log n).
pub fn check_tenures(tenures: &[Tenure]) -> Result<(), TenureViolation> {
    let Some(origin) = tenures.iter().map(|t| t.start).min() else {
        return Ok(());
    };
    let mut by_start: Vec<&Tenure> = tenures.iter().collect();
    by_start.sort_by_key(|t| t.start);
    for w in by_start.windows(2) {
        let (a, b) = (w[0], w[1]);
        if b.start < a.end {
            return Err(TenureViolation::Overlap {
                first: describe_tenure(a, origin),
                second: describe_tenure(b, origin),
                overlap: a.end.min(b.end).saturating_duration_since(b.start),
            });
        }
        if b.token <= a.token {
            return Err(TenureViolation::TokenNotIncreasing {
                earlier: describe_tenure(a, origin),
                later: describe_tenure(b, origin),
            });
        }
    }
    Ok(())
}

// ---------------------------------------------------------------- single owner

/// One owner's ownership of one unit of work (a task, a partition) over a half-open interval
/// `[start, end)`. An interval with `end <= start` owns nothing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OwnershipInterval {
    /// Who owned it (member, process). Intervals of one owner may overlap each other.
    pub owner: String,
    /// The unit owned.
    pub unit: u64,
    /// What gave the ownership (e.g. the view and its state), for the failure message.
    pub detail: String,
    /// When the ownership began.
    pub start: tokio::time::Instant,
    /// When it ended.
    pub end: tokio::time::Instant,
}

/// What [`check_single_owner`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OwnerViolation {
    /// Two different owners owned one unit at the same time.
    TwoOwners {
        /// The unit.
        unit: u64,
        /// The ownership that started first (description: owner, detail, interval).
        first: String,
        /// The other owner's, which started while the first had not ended.
        second: String,
        /// How long both owned the unit.
        overlap: Duration,
    },
}

impl fmt::Display for OwnerViolation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OwnerViolation::TwoOwners {
                unit,
                first,
                second,
                overlap,
            } => write!(
                f,
                "unit {unit} owned by two owners at once for {overlap:?}: {first} and {second}"
            ),
        }
    }
}

fn describe_ownership(o: &OwnershipInterval, origin: tokio::time::Instant) -> String {
    let detail = if o.detail.is_empty() {
        String::new()
    } else {
        format!(" ({})", o.detail)
    };
    format!(
        "{}{detail} [{:.3}s..{:.3}s]",
        o.owner,
        secs_since(o.start, origin),
        secs_since(o.end, origin)
    )
}

/// Check ownership intervals: no unit is owned by two different owners at the same instant
/// (intervals are half-open, so one owner's ending exactly when another's begins is fine;
/// empty intervals own nothing). Reports the lowest unit with a violation, and within it the
/// earliest-starting interval that overlaps another owner's (the first such one in input order
/// among equal starts). O(n log n) plus the overlapping pairs of one owner.
pub fn check_single_owner(intervals: &[OwnershipInterval]) -> Result<(), OwnerViolation> {
    let Some(origin) = intervals.iter().map(|o| o.start).min() else {
        return Ok(());
    };
    let mut order: Vec<&OwnershipInterval> = intervals.iter().filter(|o| o.start < o.end).collect();
    // Stable: equal starts keep their input order.
    order.sort_by_key(|o| (o.unit, o.start));
    for (i, x) in order.iter().enumerate() {
        for y in &order[i + 1..] {
            if y.unit != x.unit || y.start >= x.end {
                break;
            }
            if y.owner != x.owner {
                return Err(OwnerViolation::TwoOwners {
                    unit: x.unit,
                    first: describe_ownership(x, origin),
                    second: describe_ownership(y, origin),
                    overlap: x.end.min(y.end).saturating_duration_since(y.start),
                });
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

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

    // ------------------------------------------------------------ tenures

    fn tenure(
        t0: tokio::time::Instant,
        who: &str,
        token: u64,
        start_ms: u64,
        end_ms: u64,
    ) -> Tenure {
        Tenure {
            holder: who.to_string(),
            token,
            start: t0 + Duration::from_millis(start_ms),
            end: t0 + Duration::from_millis(end_ms),
        }
    }

    #[test]
    fn tenures_that_touch_with_increasing_tokens_pass_in_any_input_order() {
        let t0 = tokio::time::Instant::now();
        let h = [
            tenure(t0, "c", 9, 20, 30),
            tenure(t0, "a", 3, 0, 10),
            tenure(t0, "b", 4, 10, 20), // starts exactly when a ends
        ];
        assert_eq!(check_tenures(&h), Ok(()));
        assert_eq!(check_tenures(&[]), Ok(()));
        assert_eq!(check_tenures(&h[..1]), Ok(()));
    }

    #[test]
    fn the_tenure_checker_catches_two_holders_and_says_for_how_long() {
        let t0 = tokio::time::Instant::now();
        let h = [tenure(t0, "A", 1, 0, 100), tenure(t0, "B", 2, 60, 200)];
        let err = check_tenures(&h).expect_err("B started before A ended");
        assert_eq!(
            err,
            TenureViolation::Overlap {
                first: "A (token 1) [0.000s..0.100s]".into(),
                second: "B (token 2) [0.060s..0.200s]".into(),
                overlap: Duration::from_millis(40),
            }
        );
        let text = err.to_string();
        assert!(text.contains("two holders at once for 40ms"), "{text}");
        assert!(
            text.contains("A (token 1)") && text.contains("B (token 2)"),
            "{text}"
        );
    }

    #[test]
    fn a_long_tenure_overlapping_a_later_one_is_found_past_the_tenures_between() {
        let t0 = tokio::time::Instant::now();
        // A holds throughout; B and C come later, one after the other, both inside A's tenure.
        let h = [
            tenure(t0, "C", 3, 50, 60),
            tenure(t0, "B", 2, 20, 30),
            tenure(t0, "A", 1, 0, 100),
        ];
        match check_tenures(&h) {
            Err(TenureViolation::Overlap {
                first,
                second,
                overlap,
            }) => {
                assert!(first.starts_with("A "), "{first}");
                assert!(second.starts_with("B "), "{second}");
                assert_eq!(overlap, Duration::from_millis(10), "B lies inside A");
            }
            other => panic!("expected an overlap of A and B, got {other:?}"),
        }
    }

    #[test]
    fn the_tenure_checker_catches_a_token_that_does_not_increase() {
        let t0 = tokio::time::Instant::now();
        for later_token in [5, 4] {
            let h = [
                tenure(t0, "A", 5, 0, 10),
                tenure(t0, "B", later_token, 10, 20),
            ];
            let err = check_tenures(&h).expect_err("B's token is not above A's");
            assert!(
                matches!(&err, TenureViolation::TokenNotIncreasing { earlier, later }
                    if earlier.starts_with("A (token 5)")
                        && later.starts_with(&format!("B (token {later_token})"))),
                "{err:?}"
            );
            assert!(
                err.to_string()
                    .contains("tokens must increase with tenures"),
                "{err}"
            );
        }
    }

    #[test]
    fn an_overlap_is_reported_before_the_same_pairs_token_order() {
        let t0 = tokio::time::Instant::now();
        let h = [tenure(t0, "A", 7, 0, 10), tenure(t0, "B", 6, 5, 20)];
        assert!(matches!(
            check_tenures(&h),
            Err(TenureViolation::Overlap { overlap, .. }) if overlap == Duration::from_millis(5)
        ));
    }

    #[test]
    fn the_first_violation_in_start_order_is_reported() {
        let t0 = tokio::time::Instant::now();
        let h = [
            tenure(t0, "A", 1, 0, 10),
            tenure(t0, "B", 1, 10, 20), // token not increasing at 10 ms
            tenure(t0, "C", 3, 25, 40),
            tenure(t0, "D", 4, 30, 50), // overlap at 30 ms
        ];
        assert!(matches!(
            check_tenures(&h),
            Err(TenureViolation::TokenNotIncreasing { .. })
        ));
        assert!(matches!(
            check_tenures(&h[2..]),
            Err(TenureViolation::Overlap { .. })
        ));
    }

    // ------------------------------------------------------------ single owner

    fn owned(
        t0: tokio::time::Instant,
        owner: &str,
        unit: u64,
        start_ms: u64,
        end_ms: u64,
    ) -> OwnershipInterval {
        OwnershipInterval {
            owner: owner.to_string(),
            unit,
            detail: format!("view {start_ms}"),
            start: t0 + Duration::from_millis(start_ms),
            end: t0 + Duration::from_millis(end_ms),
        }
    }

    #[test]
    fn handovers_other_units_and_one_owners_own_overlaps_pass() {
        let t0 = tokio::time::Instant::now();
        let h = [
            owned(t0, "m0", 1, 0, 100),
            owned(t0, "m1", 1, 100, 200), // takes over exactly when m0's ends
            owned(t0, "m1", 2, 0, 300),   // another unit: overlapping m0's unit 1 is fine
            owned(t0, "m0", 3, 0, 100),
            owned(t0, "m0", 3, 50, 150),  // one owner overlapping itself
            owned(t0, "m1", 1, 150, 150), // empty: owns nothing, even inside m1's own
            owned(t0, "m0", 1, 150, 150), // empty: owns nothing inside m1's interval
        ];
        assert_eq!(check_single_owner(&h), Ok(()));
        assert_eq!(check_single_owner(&[]), Ok(()));
    }

    #[test]
    fn the_owner_checker_catches_two_owners_and_says_for_how_long() {
        let t0 = tokio::time::Instant::now();
        let h = [
            owned(t0, "m1", 7, 60, 200),
            owned(t0, "m0", 7, 0, 100),
            owned(t0, "m2", 8, 0, 300),
        ];
        let err = check_single_owner(&h).expect_err("m1 took unit 7 before m0's ended");
        assert_eq!(
            err,
            OwnerViolation::TwoOwners {
                unit: 7,
                first: "m0 (view 0) [0.000s..0.100s]".into(),
                second: "m1 (view 60) [0.060s..0.200s]".into(),
                overlap: Duration::from_millis(40),
            }
        );
        let text = err.to_string();
        assert!(
            text.contains("unit 7 owned by two owners at once for 40ms"),
            "{text}"
        );
    }

    #[test]
    fn the_owner_checker_looks_past_the_same_owners_intervals() {
        let t0 = tokio::time::Instant::now();
        let h = [
            owned(t0, "m0", 4, 0, 100),
            owned(t0, "m0", 4, 10, 20),
            owned(t0, "m0", 4, 30, 40),
            owned(t0, "m1", 4, 90, 95), // inside m0's long interval
        ];
        assert!(matches!(
            check_single_owner(&h),
            Err(OwnerViolation::TwoOwners { unit: 4, overlap, .. })
                if overlap == Duration::from_millis(5)
        ));
        // One nanosecond of overlap is caught; a touching handover is not.
        let touch = t0 + Duration::from_millis(100);
        let mut late = owned(t0, "m1", 4, 100, 110);
        assert_eq!(check_single_owner(&[h[0].clone(), late.clone()]), Ok(()));
        late.start = touch - Duration::from_nanos(1);
        assert!(matches!(
            check_single_owner(&[h[0].clone(), late]),
            Err(OwnerViolation::TwoOwners { overlap, .. }) if overlap == Duration::from_nanos(1)
        ));
    }

    #[test]
    fn the_lowest_unit_with_two_owners_is_reported() {
        let t0 = tokio::time::Instant::now();
        let h = [
            owned(t0, "a", 9, 0, 100),
            owned(t0, "b", 9, 50, 100),
            owned(t0, "a", 3, 0, 100),
            owned(t0, "c", 3, 80, 100),
        ];
        match check_single_owner(&h) {
            Err(OwnerViolation::TwoOwners {
                unit,
                first,
                second,
                ..
            }) => {
                assert_eq!(unit, 3);
                assert!(first.starts_with("a (view 0)"), "{first}");
                assert!(second.starts_with("c (view 80)"), "{second}");
            }
            other => panic!("expected two owners of unit 3, got {other:?}"),
        }
    }
}
