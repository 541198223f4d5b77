//! Pure decisions of one lease: what an acquisition round's outcome means, and the watchdog's
//! schedule (when to extend, when to signal loss). Time comes in as parameters; no I/O, no
//! clock. The drift margins themselves live in [`crate::lease`].

use std::time::Duration;

use std::sync::Arc;

use crate::clock::{Instant, Stamp};
use crate::lease::{KeyState, Seen};
use crate::quorum::{NodeOutcome, UnknownCause};

/// What one acquisition round's tally says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Round {
    /// A majority granted.
    pub(super) reached: bool,
    /// Validity left when the grant was decided.
    pub(super) validity_left: Duration,
    /// The least validity a grant must leave (half the TTL).
    pub(super) min_validity: Duration,
    /// Some node refused only because the proposed token was not above its fence.
    pub(super) token_low: bool,
    /// The round only read the nodes (nothing could be asked yet).
    pub(super) only_reads: bool,
    /// After this round's readings, a round could be attempted now.
    pub(super) ready_now: bool,
    /// Some node holds a lease (of anyone).
    pub(super) held_seen: bool,
    /// Nodes that replied, and the majority.
    pub(super) replies: usize,
    pub(super) needed: usize,
}

/// What to do after a round.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum AfterRound {
    /// The lease is ours.
    Granted,
    /// Granted, but too late to leave enough validity: release it, report a timeout.
    TooSlow,
    /// Go again at once (the token guess was behind, or the fresh reading allows a round).
    Again,
    /// Someone holds it: contention, not an outage.
    Held,
    /// Too few nodes answered.
    NoQuorum,
}

/// The decision after an acquisition round (a failed one was already released everywhere).
pub(super) fn after_round(r: Round) -> AfterRound {
    if r.reached {
        return if r.validity_left < r.min_validity {
            AfterRound::TooSlow
        } else {
            AfterRound::Granted
        };
    }
    if r.token_low || (r.only_reads && r.ready_now) {
        return AfterRound::Again;
    }
    if r.held_seen || r.replies >= r.needed {
        AfterRound::Held
    } else {
        AfterRound::NoQuorum
    }
}

/// The token a round proposes: just above the highest fence known, or, in a retry (the guess
/// fell behind grants of other locks sharing the fence floor bucket), a random distance
/// further, doubling with every retry (at most 2^10), so that two locks racing in one
/// bucket stop colliding. Tokens need only grow; gaps are fine.
pub(super) fn next_token(known: u64, round: u32, rng: &mut impl rand::Rng) -> u64 {
    let spread = if round == 0 {
        0
    } else {
        rng.random_range(0..=(1u64 << round.min(10)))
    };
    known.saturating_add(1).saturating_add(spread)
}

/// How long before the validity deadline the watchdog signals loss, so that timer and
/// scheduling delays cannot push the signal past it: 2 % of the TTL plus 1 ms.
pub(super) fn signal_margin(ttl: Duration) -> Duration {
    ttl / 50 + Duration::from_millis(1)
}

/// When the next extension is due: a third of the TTL after a success, soon (a tenth of the
/// TTL, at least 5 ms) after a failure, well before the deadline.
pub(super) fn next_extension(now: Instant, ttl: Duration, succeeded: bool) -> Instant {
    if succeeded {
        now + ttl / 3
    } else {
        now + (ttl / 10).max(Duration::from_millis(5))
    }
}

/// What the watchdog knows at one wake-up.
#[derive(Clone, Copy, Debug)]
pub(super) struct Watchdog {
    pub(super) now: Instant,
    /// The boot clock now (counts host suspend).
    pub(super) boot_now: Duration,
    /// End of validity on both clocks.
    pub(super) until: Stamp,
    pub(super) acquired_at: Instant,
    pub(super) margin: Duration,
    pub(super) extensions: u32,
    pub(super) max_hold: Option<Duration>,
    pub(super) max_extensions: Option<u32>,
}

/// The watchdog's decision at one wake-up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Tick {
    /// Validity is (nearly) over (on the boot clock, after a suspend): signal loss now.
    Expired,
    /// The hold-time or extension bound is reached: signal it now.
    BoundReached,
    /// Sleep until `check_at` (at most a second, to compare with the boot clock again); an
    /// extension still running at `signal_at` is abandoned and the loss signalled.
    Wait {
        check_at: Instant,
        signal_at: Instant,
    },
}

/// The watchdog's schedule at one wake-up (validity judged on both clocks: after a host
/// suspend the loss is signalled at the first wake-up after the resume).
pub(super) fn tick(w: Watchdog) -> Tick {
    let valid_until = w.until.end_at(w.now, w.boot_now);
    let signal_at = valid_until
        - w.margin
            .min(valid_until.saturating_duration_since(w.acquired_at));
    if valid_until <= w.now + w.margin {
        return Tick::Expired;
    }
    let bound = w
        .max_hold
        .is_some_and(|m| w.now.saturating_duration_since(w.acquired_at) >= m)
        || w.max_extensions.is_some_and(|m| w.extensions >= m);
    if bound {
        return Tick::BoundReached;
    }
    Tick::Wait {
        check_at: (w.now + Duration::from_secs(1)).min(signal_at),
        signal_at,
    }
}

/// Whether validity is (nearly) over on the monotonic clock at a check.
pub(super) fn expired_at_check(valid_until: Instant, now: Instant, margin: Duration) -> bool {
    valid_until <= now + margin
}

/// Whether a node's `lock_extend.lua` status for one lease is an extension: 1 (extended) or
/// 2 (the missing copy re-created).
pub(super) fn extension_applied(status: i64) -> bool {
    matches!(status, 1 | 2)
}

/// One lease's outcome on a node from its status in the node's answer to an extension call:
/// applied (extended or re-created), rejected (another value, or a fence above the token:
/// a conflict), or unknown when the answer lacks it.
pub(super) fn lease_outcome(status: Option<&i64>) -> NodeOutcome<()> {
    match status {
        Some(s) if extension_applied(*s) => NodeOutcome::Applied(()),
        Some(0 | -2) => NodeOutcome::Rejected(()),
        _ => NodeOutcome::Unknown(UnknownCause::ServerError(
            "the node's answer lacks this lease".into(),
        )),
    }
}

/// How long a lease's extension may wait for others to share its call: a thirtieth of the
/// TTL, at most 100 ms. The watchdog extends at TTL/3 and signals loss a margin before the
/// validity ends, so this delay is a small part of the slack.
pub(super) fn gather(ttl: Duration) -> Duration {
    (ttl / 30).min(Duration::from_millis(100))
}

/// Whether a watched lease's holder showed it is alive between two readings (`before`: each
/// node's last held state, `now`: the latest reading), other than through one of this
/// caller's own proposals (`own`: a round of its own that landed late):
/// - an extension: a node seen held by a holder, on the same incarnation, now holds that same
///   holder's copy at another version (it extended, or re-created a lost copy); or
/// - a new holder: one value holds at least `needed` nodes that were seen held by another
///   value, on the same incarnation (a lock handed from holder to holder faster than its
///   extensions).
///
/// Another value on fewer nodes is not yet a sign of life: it may be a contender's
/// compare-and-swap that failed elsewhere and is about to be released (one-shot callers that
/// reach a dead holder's takeover instant together split the nodes, each winning one, and all
/// release); the new state is remembered, and a live new holder shows itself by its first
/// extension, within a third of its TTL, if it was not seen on a majority first. A node seen
/// held for the first time (never seen, forgotten after a grant of its own, absent before, or
/// on a new incarnation) says nothing about liveness, and neither does a copy that went away
/// (a release). This rule only decides when a one-shot caller stops watching; a takeover
/// still needs the state it swaps watched unchanged for the TTL plus drift. (Earlier rules:
/// "the instant a majority would be ready moved later" fired when a dead holder's copies were
/// first seen one round apart; "another held state on one node" fired on a split
/// contender's copy: both made a one-shot caller refuse a lock whose holder was dead.)
pub(super) fn holder_alive(
    before: &[Option<Seen<KeyState>>],
    now: &[Option<Seen<KeyState>>],
    own: &[Arc<str>],
    needed: usize,
) -> bool {
    // Per node: the value held now where another was seen, and whether it is an extension.
    let changes: Vec<(&Arc<str>, bool)> = before
        .iter()
        .zip(now)
        .filter_map(|(b, n)| match (b, n) {
            (Some(b), Some(n)) if b.run_id == n.run_id => match (&b.state, &n.state) {
                (
                    KeyState::Held {
                        value: was,
                        version: v0,
                        ..
                    },
                    KeyState::Held {
                        value: is,
                        version: v1,
                        ..
                    },
                ) if !own.contains(is) && (was != is || v0 != v1) => Some((is, was == is)),
                _ => None,
            },
            _ => None,
        })
        .collect();
    changes.iter().any(|(_, extended)| *extended)
        || changes.iter().any(|(value, _)| {
            changes
                .iter()
                .filter(|(other, extended)| !extended && other == value)
                .count()
                >= needed
        })
}

/// The held states to compare the next reading with: each node's latest held state, kept
/// while a node reads absent or is unseen (a copy that comes back at another version of the
/// same holder shows that holder alive; see [`holder_alive`]).
pub(super) fn remember_held(held: &mut [Option<Seen<KeyState>>], now: &[Option<Seen<KeyState>>]) {
    for (h, n) in held.iter_mut().zip(now) {
        if let Some(seen) = n
            .as_ref()
            .filter(|s| matches!(s.state, KeyState::Held { .. }))
        {
            *h = Some(seen.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn round() -> Round {
        Round {
            reached: false,
            validity_left: 900 * MS,
            min_validity: 500 * MS,
            token_low: false,
            only_reads: false,
            ready_now: false,
            held_seen: false,
            replies: 3,
            needed: 2,
        }
    }

    #[test]
    fn after_a_round() {
        use AfterRound::*;
        let cases = [
            (
                "a majority granted in time",
                Round {
                    reached: true,
                    ..round()
                },
                Granted,
            ),
            (
                "granted but with less than half the TTL left",
                Round {
                    reached: true,
                    validity_left: 400 * MS,
                    ..round()
                },
                TooSlow,
            ),
            (
                "our token guess was behind",
                Round {
                    token_low: true,
                    ..round()
                },
                Again,
            ),
            (
                "a read-only round whose reading allows an attempt now",
                Round {
                    only_reads: true,
                    ready_now: true,
                    ..round()
                },
                Again,
            ),
            (
                "a read-only round that still has to wait",
                Round {
                    only_reads: true,
                    held_seen: true,
                    ..round()
                },
                Held,
            ),
            (
                "someone holds it",
                Round {
                    held_seen: true,
                    replies: 1,
                    ..round()
                },
                Held,
            ),
            ("a majority answered no", round(), Held),
            (
                "one node of three answered",
                Round {
                    replies: 1,
                    ..round()
                },
                NoQuorum,
            ),
        ];
        for (story, r, want) in cases {
            assert_eq!(after_round(r), want, "{story}");
        }
    }

    #[test]
    fn a_retry_proposes_a_token_a_random_distance_above_the_known_fence() {
        use rand::SeedableRng;
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        assert_eq!(next_token(41, 0, &mut rng), 42, "first round: just above");
        for round in 1..20 {
            let t = next_token(41, round, &mut rng);
            assert!(
                (42..=42 + (1 << round.min(10))).contains(&t),
                "round {round}: {t}"
            );
        }
        assert_eq!(
            next_token(u64::MAX, 0, &mut rng),
            u64::MAX,
            "saturates (then refused)"
        );
    }

    #[test]
    fn extensions_are_due_a_third_of_the_ttl_apart_and_retried_sooner() {
        let now = Instant::now();
        let ttl = 3000 * MS;
        assert_eq!(next_extension(now, ttl, true), now + 1000 * MS);
        assert_eq!(next_extension(now, ttl, false), now + 300 * MS);
        assert_eq!(
            next_extension(now, 20 * MS, false),
            now + 5 * MS,
            "at least 5 ms"
        );
        assert_eq!(signal_margin(ttl), 61 * MS);
    }

    fn watchdog(now: Instant, until: Stamp) -> Watchdog {
        Watchdog {
            now,
            boot_now: until.boot.saturating_sub(5000 * MS),
            until,
            acquired_at: now,
            margin: 61 * MS,
            extensions: 0,
            max_hold: None,
            max_extensions: None,
        }
    }

    #[test]
    fn the_watchdog_wakes_a_margin_before_the_deadline_and_at_least_every_second() {
        let now = Instant::now();
        let until = Stamp::now().after(2900 * MS);
        let until = Stamp {
            mono: now + 2900 * MS,
            ..until
        };
        match tick(watchdog(now, until)) {
            Tick::Wait {
                check_at,
                signal_at,
            } => {
                assert_eq!(signal_at, now + 2839 * MS, "a margin before the deadline");
                assert_eq!(check_at, now + 1000 * MS, "at most a second apart");
            }
            other => panic!("expected a wait, got {other:?}"),
        }
        let soon = Stamp {
            mono: now + 300 * MS,
            ..until
        };
        assert_eq!(
            tick(watchdog(now, soon)),
            Tick::Wait {
                check_at: now + 239 * MS,
                signal_at: now + 239 * MS
            }
        );
    }

    #[test]
    fn the_boot_clock_ends_a_lease_the_monotonic_clock_missed() {
        // The host was suspended: the monotonic clock did not advance, the boot clock did.
        let now = Instant::now();
        let until = Stamp::now().after(2900 * MS);
        let w = Watchdog {
            boot_now: until.boot - 10 * MS,
            ..watchdog(now, until)
        };
        assert_eq!(tick(w), Tick::Expired);
        assert!(expired_at_check(now + 50 * MS, now, 61 * MS));
        assert!(!expired_at_check(now + 100 * MS, now, 61 * MS));
    }

    #[test]
    fn a_suspend_shorter_than_the_validity_moves_the_loss_signal_earlier() {
        // 2.9 s left on the monotonic clock, 1 s on the boot clock (a suspend of 1.9 s): the
        // loss is signalled a margin before the boot clock's end, not the monotonic one's.
        let now = Instant::now();
        let until = Stamp {
            mono: now + 2900 * MS,
            boot: Duration::from_secs(100),
        };
        let w = Watchdog {
            boot_now: until.boot - 1000 * MS,
            ..watchdog(now, until)
        };
        assert_eq!(
            tick(w),
            Tick::Wait {
                check_at: now + 939 * MS,
                signal_at: now + 939 * MS
            }
        );
    }

    #[test]
    fn hold_bounds_end_a_lease() {
        let now = Instant::now();
        let until = Stamp::now().after(2900 * MS);
        // Held 10 s (extended, its validity still ahead): past a 9 s hold bound.
        let extended = Stamp {
            mono: now + 12_900 * MS,
            boot: until.boot + 10_000 * MS,
        };
        let held_long = Watchdog {
            now: now + 10_000 * MS,
            max_hold: Some(9_000 * MS),
            ..watchdog(now, extended)
        };
        assert_eq!(tick(held_long), Tick::BoundReached);
        let extended_often = Watchdog {
            extensions: 4,
            max_extensions: Some(4),
            ..watchdog(now, until)
        };
        assert_eq!(tick(extended_often), Tick::BoundReached);
        let not_yet = Watchdog {
            extensions: 3,
            max_extensions: Some(4),
            ..watchdog(now, until)
        };
        assert!(matches!(tick(not_yet), Tick::Wait { .. }));
    }

    #[test]
    fn each_lease_in_a_batch_is_judged_on_its_own_status() {
        assert_eq!(lease_outcome(Some(&1)), NodeOutcome::Applied(()));
        assert_eq!(
            lease_outcome(Some(&2)),
            NodeOutcome::Applied(()),
            "re-created"
        );
        assert_eq!(
            lease_outcome(Some(&0)),
            NodeOutcome::Rejected(()),
            "another value"
        );
        assert_eq!(
            lease_outcome(Some(&-2)),
            NodeOutcome::Rejected(()),
            "a higher fence is a conflict"
        );
        assert!(matches!(lease_outcome(None), NodeOutcome::Unknown(_)));
    }

    #[test]
    fn an_extension_waits_for_company_a_thirtieth_of_the_ttl_at_most_100_ms() {
        assert_eq!(gather(Duration::from_secs(10)), Duration::from_millis(100));
        assert_eq!(
            gather(Duration::from_millis(900)),
            Duration::from_millis(30)
        );
        assert_eq!(gather(Duration::ZERO), Duration::ZERO);
    }

    fn held(run_id: &str, value: &str, version: u64, ttl_ms: u64) -> Option<Seen<KeyState>> {
        Some(Seen {
            run_id: run_id.into(),
            state: KeyState::Held {
                value: value.into(),
                version,
                ttl: Duration::from_millis(ttl_ms),
            },
        })
    }

    fn absent(run_id: &str) -> Option<Seen<KeyState>> {
        Some(Seen {
            run_id: run_id.into(),
            state: KeyState::Absent,
        })
    }

    /// The CLI's `job run` after a cut-off run, as it failed now and then: the dead run's
    /// copies (a2 on nodes 0 and 1, an older dead run's a1 on node 2) are seen one round
    /// apart, because the first round's answers came from nodes 0 and 2. Nothing changed on
    /// any node, yet the old rule (the instant a majority would be ready moved later) read it
    /// as a live holder.
    #[test]
    fn a_dead_holders_copies_first_seen_one_round_apart_do_not_look_alive() {
        let first = vec![held("r0", "a2", 1, 1000), None, held("r2", "a1", 1, 2000)];
        let second = vec![
            held("r0", "a2", 1, 1000),
            held("r1", "a2", 1, 1000),
            held("r2", "a1", 1, 2000),
        ];
        let mut seen = vec![None; 3];
        assert!(!holder_alive(&seen, &first, &[], 2));
        remember_held(&mut seen, &first);
        assert!(
            !holder_alive(&seen, &second, &[], 2),
            "a node seen held for the first time says nothing about its holder"
        );

        // The old rule on the same readings: the instant two nodes would be ready moved later.
        let window = |ttl: Duration| ttl;
        let t1 = Instant::now();
        let t2 = t1 + Duration::from_millis(125);
        let mut watch = crate::lease::Watch::new(3);
        for (i, s) in first.iter().enumerate() {
            if let Some(s) = s {
                watch.observe(i, s.clone(), t1);
            }
        }
        let before = crate::lease::plan_with(&watch, 2, t1, window);
        for (i, s) in second.iter().enumerate() {
            if let Some(s) = s {
                watch.observe(i, s.clone(), t2);
            }
        }
        let after = crate::lease::plan_with(&watch, 2, t2, window);
        match (before, after) {
            (crate::lease::Plan::WaitUntil(a), crate::lease::Plan::WaitUntil(b)) => assert!(
                b > a,
                "the old rule's trigger fires on these readings (so it refused a dead lock)"
            ),
            other => panic!("both readings wait: {other:?}"),
        }
    }

    #[test]
    fn a_live_holder_shows_itself_by_a_change_on_a_node_already_seen_held() {
        let before = vec![held("r0", "v", 3, 1000), held("r1", "v", 3, 1000), None];
        let cases = [
            (
                vec![held("r0", "v", 4, 1000), None, None],
                true,
                "an extension bumped the version",
            ),
            (
                vec![held("r0", "w", 1, 1000), None, None],
                false,
                "another value took the node: maybe a split contender about to release",
            ),
            (
                vec![held("r0", "v", 3, 1000), held("r1", "v", 3, 1000), None],
                false,
                "unchanged",
            ),
            (
                vec![absent("r0"), None, None],
                false,
                "a release is not a sign of life",
            ),
            (
                vec![held("r0b", "w", 1, 1000), None, None],
                false,
                "a new incarnation starts over",
            ),
            (
                vec![None, None, held("r2", "w", 1, 1000)],
                false,
                "first seen",
            ),
            (
                vec![held("r0", "mine", 1, 1000), None, None],
                false,
                "this caller's own round",
            ),
        ];
        for (now, alive, why) in cases {
            assert_eq!(
                holder_alive(&before, &now, &["mine".into()], 2),
                alive,
                "{why}"
            );
        }
        // A copy that went away and came back at another version of the same holder (its
        // extension re-created it): that holder is alive.
        let mut seen = before.clone();
        remember_held(&mut seen, &[absent("r0"), None, None]);
        assert!(holder_alive(
            &seen,
            &[held("r0", "v", 4, 1000), None, None],
            &[],
            2
        ));
    }

    /// Three one-shot callers reach a dead holder's takeover instant together and split the
    /// nodes (one compare-and-swap wins each node), so none has a majority and each releases.
    /// A caller that sees another contender's value where the dead holder's was must not take
    /// it for a live holder: it watches on, sees the copy released, and tries again. A new
    /// holder that did win shows itself by its first extension.
    #[test]
    fn a_split_contenders_copy_is_not_a_live_holder_until_it_extends() {
        let dead = vec![
            held("r0", "d", 7, 1000),
            held("r1", "d", 7, 1000),
            held("r2", "d", 7, 1000),
        ];
        let split = vec![
            held("r0", "mine", 1, 1000),
            held("r1", "b", 1, 1000),
            held("r2", "c", 1, 1000),
        ];
        let mut seen = vec![None; 3];
        remember_held(&mut seen, &dead);
        assert!(
            !holder_alive(&seen, &split, &["mine".into()], 2),
            "contenders' copies in the dead holder's place are not signs of life"
        );
        remember_held(&mut seen, &split);
        let released = vec![absent("r0"), absent("r1"), absent("r2")];
        assert!(!holder_alive(&seen, &released, &["mine".into()], 2));
        // Had b won a majority, its first extension would show it.
        let b_extends = vec![absent("r0"), held("r1", "b", 2, 1000), None];
        assert!(holder_alive(&seen, &b_extends, &["mine".into()], 2));
        // And so would b seen on a majority where others were (split contenders never are).
        let mut seen = vec![None; 3];
        remember_held(&mut seen, &dead);
        let b_won = vec![
            held("r0", "b", 1, 1000),
            held("r1", "b", 1, 1000),
            held("r2", "c", 1, 1000),
        ];
        assert!(holder_alive(&seen, &b_won, &["mine".into()], 2));
    }

    /// A busy lock handed from holder to holder faster than a third of its TTL: no holder ever
    /// extends, but the next holder's copies on a majority show a live holder at once (a
    /// one-shot caller must not watch such a lock for its whole window).
    #[test]
    fn a_new_holder_on_a_majority_is_alive_without_extending() {
        let h1 = vec![
            held("r0", "h1", 1, 1000),
            held("r1", "h1", 1, 1000),
            held("r2", "h1", 1, 1000),
        ];
        let mut seen = vec![None; 3];
        remember_held(&mut seen, &h1);
        let h2_on_two = vec![held("r0", "h2", 1, 1000), held("r1", "h2", 1, 1000), None];
        assert!(holder_alive(&seen, &h2_on_two, &[], 2));
        let h2_on_one = vec![held("r0", "h2", 1, 1000), None, None];
        assert!(
            !holder_alive(&seen, &h2_on_one, &[], 2),
            "one node: maybe a split contender"
        );
        let mine_on_two = vec![
            held("r0", "mine", 1, 1000),
            held("r1", "mine", 1, 1000),
            None,
        ];
        assert!(
            !holder_alive(&seen, &mine_on_two, &["mine".into()], 2),
            "this caller's own round is no holder"
        );
    }
}
