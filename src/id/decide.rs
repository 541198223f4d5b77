//! Pure decisions of the ID generator: which block a round proposes, what the replies teach,
//! what to do after a round that failed, how long to back off. Randomness and time are
//! parameters; no I/O, no clock.

use std::ops::RangeInclusive;
use std::time::Duration;

use rand::Rng;

use crate::quorum::bounded_learn;
use crate::scripts::VALUE_LIMIT;

/// Rounds in a row without a majority of voting nodes before a call gives up (when the
/// cause is definite: refused or excluded nodes).
pub(super) const NO_QUORUM_ROUNDS: u32 = 3;

/// The block a round proposes: just above `floor` (the highest value known, or this process's
/// high-water mark), or, after `contended` lost rounds, a random distance further, doubling
/// the range with every loss (bounded by `max_jump`). Competitors that learned the same
/// maximum would otherwise propose the same block again and split the votes; a higher block
/// is accepted even by nodes that took a lower one, so the highest of distinct proposals
/// always wins. `None` when the block would reach 2^53.
pub(super) fn reserve(
    floor: u64,
    total: u64,
    contended: u32,
    max_jump: u64,
    rng: &mut impl Rng,
) -> Option<(u64, u64)> {
    let spread = if contended > 0 {
        // Near 2^53 the jump shrinks so that the block still fits below it.
        let room = (VALUE_LIMIT - 1).saturating_sub(floor.saturating_add(total));
        let range = total
            .saturating_mul(1u64 << contended.min(40))
            .saturating_add(64)
            .min(max_jump)
            .min(room);
        rng.random_range(0..=range)
    } else {
        0
    };
    let base = floor.saturating_add(1).saturating_add(spread);
    let last = base
        .checked_add(total.max(1) - 1)
        .filter(|l| *l < VALUE_LIMIT)?;
    Some((base, last))
}

/// The next guess of the highest value from a round's `values` (one per node that replied):
/// bounded against the majority's value (one node with a huge value cannot make the sequence
/// jump), and past `last` when some node accepted the block. Returns the guess and whether a
/// value was set aside.
pub(super) fn learn(
    values: &[u64],
    needed: usize,
    known: u64,
    max_jump: u64,
    accepted_block_ending_at: Option<u64>,
) -> (u64, bool) {
    let (guess, set_aside) = bounded_learn(values, needed, known, max_jump);
    (guess.max(accepted_block_ending_at.unwrap_or(0)), set_aside)
}

/// What one failed round looked like.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Failed {
    /// Nodes that replied and did not refuse (they compete: they hold a value).
    pub(super) contending: usize,
    pub(super) needed: usize,
    /// Some node's outcome is unknown in a way that may still apply it (merely slow).
    pub(super) slow_nodes: bool,
    /// The call's operation timeout has passed.
    pub(super) timed_out: bool,
    /// The round raised what this generator knows.
    pub(super) learned: bool,
}

/// What a call does after a failed round.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Next {
    /// Propose again at once (we were merely behind).
    Again,
    /// Back off, then propose again.
    BackOff,
    /// Give up: no majority of voting nodes.
    NoQuorum,
    /// Give up: other callers kept winning.
    Contended,
}

/// Counters a call keeps across its rounds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Rounds {
    pub(super) contended: u32,
    pub(super) no_quorum: u32,
}

/// The decision after a failed round (and the counters updated). Without a majority of
/// voting nodes answering it is not a competition we lost: a definite cause (refused,
/// excluded) settles it in [`NO_QUORUM_ROUNDS`]; merely slow nodes are waited for until the
/// operation timeout. A lost competition is retried at once the first time we learned a
/// higher value, then after a backoff, up to `max_attempts`.
pub(super) fn after_failure(rounds: &mut Rounds, f: Failed, max_attempts: u32) -> Next {
    if f.contending < f.needed {
        rounds.no_quorum += 1;
        if f.timed_out || (rounds.no_quorum >= NO_QUORUM_ROUNDS && !f.slow_nodes) {
            return Next::NoQuorum;
        }
        return Next::BackOff;
    }
    rounds.contended += 1;
    if rounds.contended >= max_attempts || f.timed_out {
        Next::Contended
    } else if rounds.contended == 1 && f.learned {
        Next::Again
    } else {
        Next::BackOff
    }
}

/// Randomized exponential backoff, scaled to how long a round takes here (at least 0.5 ms,
/// at most 10 ms), so that competing generators stop colliding instead of splitting the votes
/// again. Returns the new backoff and the pause to take.
pub(super) fn backoff(
    previous: Duration,
    round: Duration,
    rng: &mut impl Rng,
) -> (Duration, Duration) {
    let round = round.max(Duration::from_micros(500));
    let next = (previous * 2).max(round).min(Duration::from_millis(10));
    let pause = Duration::from_micros(rng.random_range(0..=next.as_micros() as u64));
    (next, pause)
}

/// IDs set aside by a write round beyond its callers' (the lookahead): `next..=end`, inside a
/// block a majority accepted. A later call may take its IDs from here after a majority *read*
/// shows no register above `end` (see [`read_counts`]), with no write and so no fsync.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Spare {
    pub(super) next: u64,
    pub(super) end: u64,
}

/// The spare IDs a block whose callers' part ends at `handed` may add: up to `lookahead`, but
/// never reaching 2^53 (near the end the spare shrinks; the callers' IDs still fit).
pub(super) fn room_for_spare(handed: u64, lookahead: u64) -> u64 {
    lookahead.min((VALUE_LIMIT - 1).saturating_sub(handed))
}

/// The IDs a call of `total` takes from `spare`, and what is left of it: `None` when the
/// spare is too small, or when its IDs are not above `high_water` (this process returned
/// higher IDs from another generator of the sequence; a write round then goes above them).
/// IDs are taken in call order, so a later call's IDs are above an earlier call's.
pub(super) fn take(
    spare: Option<Spare>,
    total: u64,
    high_water: u64,
) -> Option<(RangeInclusive<u64>, Option<Spare>)> {
    let s = spare?;
    let last = s.next.checked_add(total.checked_sub(1)?)?;
    if last > s.end || s.next <= high_water {
        return None;
    }
    let rest = (last < s.end).then_some(Spare {
        next: last + 1,
        end: s.end,
    });
    Some((s.next..=last, rest))
}

/// Whether one node's register, read behind its marker, counts towards validating IDs from a
/// spare block ending at `end`: it holds no value above `end`. A majority of such nodes, read
/// after the call started, shows that no block above `end` had been accepted by a majority
/// when the call started (two majorities share a node, and registers only grow on a node that
/// keeps its marker). Every ID returned before the call started lies in such an accepted
/// block, and accepted blocks are disjoint, so all of them are below the spare.
pub(super) fn read_counts(value: u64, end: u64) -> bool {
    value <= end
}

/// Whether the spare that a write round leaves (`candidate`) replaces the current one: only
/// a spare ending higher does. Write rounds in flight together may finish in any order; an
/// older, lower spare installed after a newer one would fail its reads.
pub(super) fn keep_higher(current: Option<Spare>, candidate: Spare) -> Option<Spare> {
    match current {
        Some(c) if c.end >= candidate.end => Some(c),
        _ => Some(candidate),
    }
}

/// When to reserve spare IDs. A spare read fails when another process wrote above the spare
/// (contention): then the spare only costs a round trip, so after each failed read the next
/// write calls reserve none, twice as many calls after every failure in a row (up to
/// [`MAX_SPARE_SKIP`]); one read that succeeds resets it. Reads that fail only on this
/// generator's own later block do not count.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct SparePolicy {
    failures: u32,
    skip: u64,
}

/// Most write calls in a row that reserve no spare after failed reads.
pub(super) const MAX_SPARE_SKIP: u64 = 256;

impl SparePolicy {
    /// The spare IDs the next write round reserves, with `configured` the generator's
    /// lookahead.
    pub(super) fn lookahead(&mut self, configured: u64) -> u64 {
        if self.skip > 0 {
            self.skip -= 1;
            return 0;
        }
        configured
    }

    /// A validating read succeeded or failed.
    pub(super) fn read(&mut self, succeeded: bool) {
        if succeeded {
            *self = SparePolicy::default();
        } else {
            self.failures = (self.failures + 1).min(MAX_SPARE_SKIP.trailing_zeros());
            self.skip = 1 << self.failures;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    fn rng() -> rand::rngs::StdRng {
        rand::rngs::StdRng::seed_from_u64(7)
    }

    #[test]
    fn an_uncontended_block_starts_just_above_the_floor() {
        assert_eq!(reserve(41, 1, 0, 1 << 32, &mut rng()), Some((42, 42)));
        assert_eq!(reserve(0, 100, 0, 1 << 32, &mut rng()), Some((1, 100)));
    }

    #[test]
    fn a_lost_round_skips_a_random_distance_that_doubles_and_is_bounded() {
        let mut r = rng();
        for contended in 1..=50u32 {
            let (base, last) = reserve(1000, 10, contended, 5_000, &mut r).expect("room");
            let range = (10u64 << contended.min(40)).saturating_add(64).min(5_000);
            assert!(
                base > 1000 && base <= 1001 + range,
                "round {contended}: base {base}"
            );
            assert_eq!(last, base + 9);
        }
    }

    #[test]
    fn near_two_to_the_53_a_lost_round_jumps_only_as_far_as_the_block_fits() {
        let mut r = rng();
        for contended in 1..=20 {
            assert_eq!(
                reserve(VALUE_LIMIT - 3, 2, contended, 1 << 32, &mut r),
                Some((VALUE_LIMIT - 2, VALUE_LIMIT - 1)),
                "round {contended}"
            );
        }
    }

    #[test]
    fn no_block_reaches_two_to_the_53() {
        assert_eq!(reserve(VALUE_LIMIT - 1, 1, 0, 1, &mut rng()), None);
        assert_eq!(reserve(VALUE_LIMIT - 2, 2, 0, 1, &mut rng()), None);
        assert_eq!(
            reserve(VALUE_LIMIT - 2, 1, 0, 1, &mut rng()),
            Some((VALUE_LIMIT - 1, VALUE_LIMIT - 1)),
            "the last ID is 2^53 - 1"
        );
    }

    #[test]
    fn learning_passes_an_accepted_block_and_ignores_one_huge_value() {
        assert_eq!(learn(&[5, 9, 7], 2, 0, 1 << 32, None), (9, false));
        assert_eq!(learn(&[5, 9, 7], 2, 0, 1 << 32, Some(20)), (20, false));
        let (guess, set_aside) = learn(&[5, 7, 1 << 50], 2, 0, 1000, None);
        assert!(
            set_aside && guess < 1 << 40,
            "the huge value is set aside: {guess}"
        );
    }

    fn failed() -> Failed {
        Failed {
            contending: 3,
            needed: 2,
            slow_nodes: false,
            timed_out: false,
            learned: false,
        }
    }

    #[test]
    fn after_a_failed_round() {
        use Next::*;
        let cases: [(&str, Rounds, Failed, Next); 7] = [
            (
                "first loss after learning a higher value: at once",
                Rounds::default(),
                Failed {
                    learned: true,
                    ..failed()
                },
                Again,
            ),
            (
                "first loss, nothing learned: back off",
                Rounds::default(),
                failed(),
                BackOff,
            ),
            (
                "second loss: back off even if we learned",
                Rounds {
                    contended: 1,
                    no_quorum: 0,
                },
                Failed {
                    learned: true,
                    ..failed()
                },
                BackOff,
            ),
            (
                "the attempt limit",
                Rounds {
                    contended: 9,
                    no_quorum: 0,
                },
                failed(),
                Contended,
            ),
            (
                "a definite lack of majority, third round",
                Rounds {
                    contended: 0,
                    no_quorum: 2,
                },
                Failed {
                    contending: 1,
                    ..failed()
                },
                NoQuorum,
            ),
            (
                "slow nodes are waited for",
                Rounds {
                    contended: 0,
                    no_quorum: 5,
                },
                Failed {
                    contending: 1,
                    slow_nodes: true,
                    ..failed()
                },
                BackOff,
            ),
            (
                "until the operation timeout",
                Rounds {
                    contended: 0,
                    no_quorum: 5,
                },
                Failed {
                    contending: 1,
                    slow_nodes: true,
                    timed_out: true,
                    ..failed()
                },
                NoQuorum,
            ),
        ];
        for (story, mut rounds, f, want) in cases {
            assert_eq!(after_failure(&mut rounds, f, 10), want, "{story}");
        }
    }

    #[test]
    fn backoff_doubles_from_the_round_time_and_is_capped() {
        let mut r = rng();
        let ms = Duration::from_millis;
        let (b, pause) = backoff(Duration::ZERO, Duration::from_micros(100), &mut r);
        assert_eq!(b, Duration::from_micros(500), "at least half a millisecond");
        assert!(pause <= b);
        let (b, _) = backoff(ms(2), ms(1), &mut r);
        assert_eq!(b, ms(4));
        let (b, pause) = backoff(ms(8), ms(1), &mut r);
        assert_eq!(b, ms(10), "capped at 10 ms");
        assert!(pause <= ms(10));
    }

    #[test]
    fn the_spare_shrinks_near_the_end_of_the_sequence() {
        assert_eq!(room_for_spare(100, 1024), 1024);
        assert_eq!(room_for_spare(VALUE_LIMIT - 11, 1024), 10);
        assert_eq!(room_for_spare(VALUE_LIMIT - 1, 1024), 0);
    }

    #[test]
    fn a_call_takes_its_ids_from_the_bottom_of_the_spare() {
        let spare = Some(Spare { next: 10, end: 20 });
        assert_eq!(
            take(spare, 4, 0),
            Some((10..=13, Some(Spare { next: 14, end: 20 })))
        );
        assert_eq!(
            take(spare, 11, 0),
            Some((10..=20, None)),
            "the spare used up"
        );
        assert_eq!(take(spare, 12, 0), None, "too small: a write round");
        assert_eq!(take(None, 1, 0), None);
        assert_eq!(
            take(spare, 1, 10),
            None,
            "not above what this process returned: a write round"
        );
        assert_eq!(take(spare, 1, 9).map(|t| t.0), Some(10..=10));
        let top = Some(Spare {
            next: u64::MAX,
            end: u64::MAX,
        });
        assert_eq!(take(top, 2, 0), None, "no overflow");
    }

    #[test]
    fn a_read_counts_a_node_only_while_it_holds_nothing_above_the_spare() {
        assert!(read_counts(20, 20), "the block that made the spare");
        assert!(read_counts(3, 20), "a node behind");
        assert!(!read_counts(21, 20), "a block above was accepted here");
    }

    #[test]
    fn only_a_higher_spare_replaces_the_current_one() {
        let low = Spare { next: 5, end: 10 };
        let high = Spare { next: 15, end: 30 };
        assert_eq!(keep_higher(None, low), Some(low));
        assert_eq!(keep_higher(Some(low), high), Some(high));
        assert_eq!(
            keep_higher(Some(high), low),
            Some(high),
            "a late, older round"
        );
    }

    #[test]
    fn failed_reads_make_write_rounds_skip_the_spare_for_longer_each_time() {
        let mut p = SparePolicy::default();
        assert_eq!(p.lookahead(100), 100, "spares while reads succeed");
        for expected_skip in [2u64, 4, 8] {
            p.read(false);
            for _ in 0..expected_skip {
                assert_eq!(p.lookahead(100), 0);
            }
            assert_eq!(p.lookahead(100), 100, "tried again after {expected_skip}");
        }
        for _ in 0..20 {
            p.read(false);
        }
        let skipped = (0..1000).take_while(|_| p.lookahead(100) == 0).count() as u64;
        assert_eq!(skipped, MAX_SPARE_SKIP, "bounded");
        p.read(false);
        p.read(true);
        assert_eq!(p.lookahead(100), 100, "one success resets it");
    }
}
