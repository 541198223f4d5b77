//! Pure decisions of the ID generator: which block a round proposes, what the replies teach,
//! what to do after a round that failed, how long to back off. Randomness and time are
//! parameters; no I/O, no clock.

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
        let range = total
            .saturating_mul(1u64 << contended.min(40))
            .saturating_add(64)
            .min(max_jump);
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
}
