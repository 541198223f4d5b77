//! One call's rounds: reserve a block, propose it to the nodes, learn from the replies, and
//! decide (in [`super::decide`]) what comes next.

use super::*;
use crate::metrics::IdPath;

impl Generator {
    /// Reserve a block for `total` IDs and propose it until a majority accepts it (see
    /// [`decide`] for every choice made between rounds).
    pub(super) async fn allocate(&self, total: u64) -> Result<RangeInclusive<u64>, Error> {
        crate::metrics::id_batch(total);
        if let Some((ids, end)) = self.take_spare(total) {
            if self.validate(end).await {
                crate::metrics::id_round(IdPath::Spare);
                raise_high_water(&self.high_water_key, *ids.end(), self.protected());
                return Ok(ids);
            }
            crate::metrics::id_round(IdPath::SpareInvalid);
            // The spare's IDs become a gap; what the read learned guides the write round.
        }
        self.write(total).await
    }

    /// IDs for `total` from the spare, and the spare's end, or `None` (no usable spare).
    fn take_spare(&self, total: u64) -> Option<(RangeInclusive<u64>, u64)> {
        let mut st = self.state();
        let spare = st.spare?;
        let high_water = high_water(&self.high_water_key, self.protected());
        match decide::take(Some(spare), total, high_water) {
            Some((ids, rest)) => {
                st.spare = rest;
                Some((ids, spare.end))
            }
            None => {
                st.spare = None;
                None
            }
        }
    }

    /// The validating read of IDs from a spare ending at `end` (see [`decide::read_counts`]):
    /// whether a majority of voting nodes holds no value above `end`. Learns what it read.
    async fn validate(&self, end: u64) -> bool {
        let unvalidated = self.client.config().unvalidated_spares;
        let tally = self
            .client
            .shared::<batch::Batcher>()
            .read(&self.client, &self.key, end, unvalidated)
            .await;
        let valid = tally.reached();
        // Whether another process wrote above the spare (not only this generator's own later
        // block, sent before the read reached the nodes): only then are spares a poor bet.
        let mut contended = false;
        if !valid {
            let values: Vec<u64> = tally.replies().map(|(_, v)| *v).collect();
            let known = self.state().known_max;
            contended = values.iter().any(|v| *v > known);
            let (guess, _) = decide::learn(
                &values,
                tally.majority().needed(),
                known,
                self.max_jump,
                None,
            );
            let mut st = self.state();
            st.known_max = st.known_max.max(guess);
            // Drop this spare, not a newer one a write round installed meanwhile.
            if st.spare.is_some_and(|s| s.end == end) {
                st.spare = None;
            }
        }
        if valid || contended {
            self.state().spare_policy.read(valid);
        }
        valid
    }

    /// Write rounds: reserve a block for `total` IDs (and the lookahead) and propose it until
    /// a majority accepts it; the IDs beyond `total` become the spare.
    async fn write(&self, total: u64) -> Result<RangeInclusive<u64>, Error> {
        let lookahead = {
            let mut st = self.state();
            let lookahead = st.spare_policy.lookahead(self.lookahead);
            if lookahead > 0 {
                st.spare_writing += 1;
            }
            lookahead
        };
        // Counted back however the call ends (also if its future is dropped).
        let _writing = (lookahead > 0).then_some(SpareWriting(self));
        self.write_rounds(total, lookahead).await
    }

    /// The write rounds of one call, each reserving `lookahead` spare IDs.
    async fn write_rounds(&self, total: u64, lookahead: u64) -> Result<RangeInclusive<u64>, Error> {
        let started = Instant::now();
        let mut rounds = decide::Rounds::default();
        let mut backoff = Duration::ZERO;
        // Whether any round so far may have been applied somewhere (a lost reply): then the
        // call's outcome is unknown even if its last round never reached those nodes.
        let mut maybe_applied = false;
        loop {
            let round_started = Instant::now();
            let (base, handed, last) = self.reserve(total, lookahead, rounds.contended)?;
            let tally = self.propose(base, last).await;
            crate::metrics::id_round(IdPath::Write);
            maybe_applied |= tally.results().iter().any(|r| r.outcome.may_have_applied());
            for (node, reply) in tally.replies() {
                if matches!(reply, Reply::Refused { .. }) {
                    self.client.suspect(node.0);
                }
            }
            let learned = self.learn(&tally, last);
            if tally.reached() {
                raise_high_water(&self.high_water_key, handed, self.protected());
                raise_high_water(&self.reserved_key, last, self.protected());
                if handed < last {
                    let mut st = self.state();
                    let spare = decide::Spare {
                        next: handed + 1,
                        end: last,
                    };
                    st.spare = decide::keep_higher(st.spare, spare);
                }
                return Ok(base..=handed);
            }
            let failed = decide::Failed {
                contending: tally
                    .replies()
                    .filter(|(_, r)| !matches!(r, Reply::Refused { .. }))
                    .count(),
                needed: tally.majority().needed(),
                slow_nodes: tally
                    .results()
                    .iter()
                    .any(|r| matches!(&r.outcome, NodeOutcome::Unknown(c) if c.may_have_applied())),
                timed_out: started.elapsed() >= self.client.config().operation_timeout,
                learned,
            };
            match decide::after_failure(&mut rounds, failed, self.max_attempts) {
                decide::Next::Again => continue,
                decide::Next::BackOff => {}
                decide::Next::NoQuorum => {
                    let urls = self.client.node_urls();
                    let mut q = NoQuorum::from_tally("id.next", &tally, &urls, describe);
                    q.maybe_applied_somewhere |= maybe_applied;
                    return Err(q.into());
                }
                decide::Next::Contended => {
                    return Err(Error::Contended {
                        op: "id.next",
                        attempts: rounds.contended,
                        elapsed: started.elapsed(),
                    })
                }
            }
            let pause;
            (backoff, pause) = decide::backoff(backoff, round_started.elapsed(), &mut rand::rng());
            tokio::time::sleep(pause).await;
        }
    }

    /// Reserve the next block under the state lock (`total` IDs for the callers, then up to
    /// `lookahead` spare ones): a round sent concurrently proposes above it. Starts above what
    /// this generator knows, what this process returned, and what this process's generators of
    /// the sequence reserved. Returns the base, the callers' last ID and the block's last.
    fn reserve(
        &self,
        total: u64,
        lookahead: u64,
        contended: u32,
    ) -> Result<(u64, u64, u64), Error> {
        let mut st = self.state();
        let protected = self.protected();
        let floor = st
            .known_max
            .max(high_water(&self.high_water_key, protected))
            .max(high_water(&self.reserved_key, protected));
        let (base, handed) =
            decide::reserve(floor, total, contended, self.max_jump, &mut rand::rng()).ok_or_else(
                || Error::Exhausted {
                    sequence: self.name.as_str().to_string(),
                    limit: VALUE_LIMIT,
                },
            )?;
        let last = handed + decide::room_for_spare(handed, lookahead);
        st.known_max = last;
        Ok((base, handed, last))
    }

    fn protected(&self) -> bool {
        self.client.config().amnesia_protection
    }

    async fn propose(&self, base: u64, last: u64) -> Tally<Reply> {
        self.client
            .shared::<batch::Batcher>()
            .propose(&self.client, &self.key, base, last)
            .await
    }

    /// Update the guess for the next base from a round's replies (see [`decide::learn`]).
    /// Returns whether it rose.
    fn learn(&self, tally: &Tally<Reply>, last: u64) -> bool {
        let values: Vec<u64> = tally.replies().map(|(_, r)| r.value()).collect();
        let known = self.state().known_max;
        let accepted = (tally.applied() > 0).then_some(last);
        let needed = tally.majority().needed();
        let (guess, set_aside) = decide::learn(&values, needed, known, self.max_jump, accepted);
        if set_aside {
            tracing::warn!(sequence = %self.name, reported = ?values, learned = guess, "a node reports a value far above the majority; not jumping to it");
        }
        let mut st = self.state();
        let rose = guess > st.known_max;
        st.known_max = st.known_max.max(guess);
        rose
    }
}

/// One spare-making write call in flight (`State::spare_writing`); dropping it counts it back
/// and wakes the runner, whose next rounds may now start.
struct SpareWriting<'a>(&'a Generator);

impl Drop for SpareWriting<'_> {
    fn drop(&mut self) {
        let mut st = self.0.state();
        st.spare_writing = st.spare_writing.saturating_sub(1);
        drop(st);
        self.0.wakeup.notify_one();
    }
}

fn describe(r: &Reply) -> String {
    match r {
        Reply::Accepted { previous } => format!("accepted (was {previous})"),
        Reply::Behind { current } => format!("already at {current}"),
        Reply::Refused { current } => format!("refused: marker missing or stale (at {current})"),
    }
}
