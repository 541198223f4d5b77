//! One call's rounds: reserve a block, propose it to the nodes, learn from the replies, and
//! decide (in [`super::decide`]) what comes next.

use super::*;

impl Generator {
    /// Reserve a block for `total` IDs and propose it until a majority accepts it (see
    /// [`decide`] for every choice made between rounds).
    pub(super) async fn allocate(&self, total: u64) -> Result<RangeInclusive<u64>, Error> {
        if let Some((ids, end)) = self.take_spare(total) {
            if self.validate(end).await {
                raise_high_water(&self.high_water_key, *ids.end(), self.protected());
                return Ok(ids);
            }
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
        let step = read_step(&self.key, end, self.client.config().unvalidated_spares);
        let tally = self.client.send(Request::vote("id.read"), step).await;
        let valid = tally.reached();
        if !valid {
            let values: Vec<u64> = tally.replies().map(|(_, v)| *v).collect();
            let known = self.state().known_max;
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
        self.state().spare_policy.read(valid);
        valid
    }

    /// Write rounds: reserve a block for `total` IDs (and the lookahead) and propose it until
    /// a majority accepts it; the IDs beyond `total` become the spare.
    async fn write(&self, total: u64) -> Result<RangeInclusive<u64>, Error> {
        let lookahead = {
            let mut st = self.state();
            let lookahead = st.spare_policy.lookahead(self.lookahead);
            st.spare_writing = lookahead > 0;
            lookahead
        };
        let result = self.write_rounds(total, lookahead).await;
        if lookahead > 0 {
            self.state().spare_writing = false;
            self.wakeup.notify_one();
        }
        result
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
            let (base, last) = self.reserve(total + lookahead, rounds.contended)?;
            let tally = self.propose(base, last).await;
            maybe_applied |= tally.results().iter().any(|r| r.outcome.may_have_applied());
            for (node, reply) in tally.replies() {
                if matches!(reply, Reply::Refused { .. }) {
                    self.client.suspect(node.0);
                }
            }
            let learned = self.learn(&tally, last);
            if tally.reached() {
                let handed = last - lookahead;
                raise_high_water(&self.high_water_key, handed, self.protected());
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
                    let mut q = NoQuorum::from_tally("id.next", &tally, urls, describe);
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

    /// Reserve the next block under the state lock: a round sent concurrently proposes above
    /// it.
    fn reserve(&self, total: u64, contended: u32) -> Result<(u64, u64), Error> {
        let mut st = self.state();
        let floor = st
            .known_max
            .max(high_water(&self.high_water_key, self.protected()));
        let (base, last) =
            decide::reserve(floor, total, contended, self.max_jump, &mut rand::rng()).ok_or_else(
                || Error::Exhausted {
                    sequence: self.name.as_str().to_string(),
                    limit: VALUE_LIMIT,
                },
            )?;
        st.known_max = last;
        Ok((base, last))
    }

    fn protected(&self) -> bool {
        self.client.config().amnesia_protection
    }

    async fn propose(&self, base: u64, last: u64) -> Tally<Reply> {
        let step = propose_step(&self.key, &self.marker_key, base, last);
        self.client.send(Request::vote("id.next"), step).await
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

/// The validating read: `GET` of the sequence's register behind the node's marker (one
/// atomic transaction). A node counts when it holds nothing above `end`; the value is what
/// the generator learns. `unvalidated` (test-only) counts every node that answers.
fn read_step(key: &str, end: u64, unvalidated: bool) -> Step<u64> {
    let mut get = redis::cmd("GET");
    get.arg(key);
    Step::read(vec![get], move |_, v| {
        let value = decode_register(v)?;
        Ok(if unvalidated || decide::read_counts(value, end) {
            NodeOutcome::Applied(value)
        } else {
            NodeOutcome::Rejected(value)
        })
    })
}

/// A register as `GET` returns it: absent is 0; anything but a decimal integer below 2^53 is
/// an error (a corrupted register never validates anything).
fn decode_register(v: redis::Value) -> redis::RedisResult<u64> {
    let raw: Option<String> = redis::from_redis_value(v)?;
    let Some(raw) = raw else { return Ok(0) };
    match raw.parse::<u64>() {
        Ok(n) if n < VALUE_LIMIT && n.to_string() == raw => Ok(n),
        _ => Err(redis::RedisError::from((
            redis::ErrorKind::Parse,
            "the ID register holds no valid integer",
            raw,
        ))),
    }
}

fn describe(r: &Reply) -> String {
    match r {
        Reply::Accepted { previous } => format!("accepted (was {previous})"),
        Reply::Behind { current } => format!("already at {current}"),
        Reply::Refused { current } => format!("refused: marker missing or stale (at {current})"),
    }
}

/// `id_propose.lua`: set-if-less-than for the block `base..=last`, marker-guarded.
fn propose_step(key: &str, marker_key: &str, base: u64, last: u64) -> Step<Reply> {
    script_call(&ID_PROPOSE, Guard::Marker)
        .key(key)
        .key(marker_key)
        .arg(base)
        .arg(last)
        .marker()
        .decode(|_, v| decode_proposal(v))
}

/// A node's answer to a proposal: `{1, previous}` accepted, `{0, current}` behind,
/// `{-1, current}` refused (marker).
fn decode_proposal(v: redis::Value) -> redis::RedisResult<NodeOutcome<Reply>> {
    let (status, value): (i64, u64) = redis::from_redis_value(v)?;
    Ok(match status {
        1 => NodeOutcome::Applied(Reply::Accepted { previous: value }),
        0 => NodeOutcome::Rejected(Reply::Behind { current: value }),
        _ => NodeOutcome::Rejected(Reply::Refused { current: value }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::NodeCtx;
    use redis::Value;

    #[test]
    fn a_proposal_compares_the_nodes_marker_and_decodes_every_status() {
        let step = propose_step("rq:id:x", "rq:marker", 5, 9);
        assert!(step.is_guarded());
        assert_eq!(step.args_for_tests("r/c"), vec!["5", "9", "r/c"]);
        let ctx = NodeCtx {
            node: 0,
            marker: "r/c".into(),
            run_id: "r".into(),
        };
        let reply = |s: i64, v: i64| Value::Array(vec![Value::Int(s), Value::Int(v)]);
        let cases = [
            (1, NodeOutcome::Applied(Reply::Accepted { previous: 4 })),
            (0, NodeOutcome::Rejected(Reply::Behind { current: 4 })),
            (-1, NodeOutcome::Rejected(Reply::Refused { current: 4 })),
        ];
        for (status, want) in cases {
            assert_eq!(
                step.decode_for_tests(&ctx, reply(status, 4)).ok(),
                Some(want),
                "status {status}"
            );
        }
        assert!(step.decode_for_tests(&ctx, Value::Nil).is_err());
    }
}
