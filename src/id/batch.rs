//! A client's ID node calls, shared by all its sequences: proposals (and, separately, spare
//! reads) of different generators that are due together go to each node in one call.
//!
//! Each kind of call has a lane with at most [`MAX_CALLS_IN_FLIGHT`] fan-outs in flight. A
//! proposal or read that finds a free slot is sent at once (alone, when nothing else waits);
//! one that finds every slot busy waits and leaves with everything queued when a slot frees
//! (group commit across sequences, at most [`MAX_ITEMS`] per call). The reply of each item is
//! judged on its own: [`Tally::item`] gives each item the tally it would have had alone (the
//! same nodes, and a node without a reply is unknown for every item).

use super::*;

/// Fan-outs of one kind in flight at once per client.
pub(super) const MAX_CALLS_IN_FLIGHT: usize = 8;

/// Most items (proposals or reads) in one call.
pub(super) const MAX_ITEMS: usize = 256;

/// One item of a call: a proposal of a block, or the read of a sequence's register.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Item {
    /// `id_propose.lua` for `base..=last` of `key`.
    Propose { key: String, base: u64, last: u64 },
    /// `GET key` behind the marker: does the node hold nothing above `end`?
    Read {
        key: String,
        end: u64,
        /// Test-only: count every answering node.
        unvalidated: bool,
    },
}

/// One node's answer for one item.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Answer {
    Proposal(Reply),
    /// The register's value.
    Read(u64),
}

/// A client's two lanes (proposals, reads); one per client ([`Client::shared`]).
#[derive(Default)]
pub(super) struct Batcher {
    proposals: Lane,
    reads: Lane,
}

#[derive(Default)]
struct Lane {
    state: Mutex<LaneState>,
}

#[derive(Default)]
struct LaneState {
    waiting: Vec<(Item, oneshot::Sender<Tally<Answer>>)>,
    in_flight: usize,
}

impl Batcher {
    fn lane(&self, proposal: bool) -> &Lane {
        if proposal {
            &self.proposals
        } else {
            &self.reads
        }
    }

    /// `id_propose.lua` for `base..=last` of `key`, in a call shared with other sequences'
    /// proposals due now; the tally is the one it would have had alone.
    pub(super) async fn propose(
        self: Arc<Self>,
        client: &Client,
        key: &str,
        base: u64,
        last: u64,
    ) -> Tally<Reply> {
        let item = Item::Propose {
            key: key.to_string(),
            base,
            last,
        };
        self.send(client, item).await.map(|a| match a {
            Answer::Proposal(r) => r,
            Answer::Read(current) => Reply::Behind { current },
        })
    }

    /// The validating read of `key` for a spare ending at `end`, in a call shared with other
    /// sequences' reads due now: a node applies when it holds nothing above `end`; the
    /// replies are the registers' values.
    pub(super) async fn read(
        self: Arc<Self>,
        client: &Client,
        key: &str,
        end: u64,
        unvalidated: bool,
    ) -> Tally<u64> {
        let item = Item::Read {
            key: key.to_string(),
            end,
            unvalidated,
        };
        self.send(client, item).await.map(|a| match a {
            Answer::Read(v) => v,
            Answer::Proposal(r) => r.value(),
        })
    }

    /// Send `item` (in a call shared with other sequences' items due now) and return its
    /// tally, as if it had been sent alone.
    async fn send(self: Arc<Self>, client: &Client, item: Item) -> Tally<Answer> {
        let (tx, rx) = oneshot::channel();
        let proposal = matches!(item, Item::Propose { .. });
        let lane = self.lane(proposal);
        let start = {
            let mut st = lane.state.lock().unwrap_or_else(|p| p.into_inner());
            st.waiting.push((item, tx));
            let free = st.in_flight < MAX_CALLS_IN_FLIGHT;
            if free {
                st.in_flight += 1;
            }
            free
        };
        if start {
            // The guard exists before the task: a task dropped unpolled gives the slot back.
            let slot = SlotGuard(self.clone(), proposal, false);
            tokio::spawn(self.clone().drain(client.clone(), slot));
        }
        match rx.await {
            Ok(tally) => tally,
            // Only when the runtime shuts down: no node answered.
            Err(_) => Tally::new(client.majority(), Vec::new(), Duration::ZERO),
        }
    }

    /// One slot of a lane: send what waits, call after call, until nothing does. The slot is
    /// given back however this task ends (also a panic or a runtime shutting down: the items
    /// it took then fail, their senders dropped).
    async fn drain(self: Arc<Self>, client: Client, mut slot: SlotGuard) {
        let proposal = slot.1;
        let lane = self.lane(proposal);
        loop {
            let batch: Vec<_> = {
                let mut st = lane.state.lock().unwrap_or_else(|p| p.into_inner());
                st.waiting.retain(|(_, tx)| !tx.is_closed());
                if st.waiting.is_empty() {
                    // Given back under the lock: an item queued after this sees the free slot.
                    st.in_flight -= 1;
                    slot.2 = true;
                    return;
                }
                let n = st.waiting.len().min(MAX_ITEMS);
                st.waiting.drain(..n).collect()
            };
            let (items, txs): (Vec<Item>, Vec<_>) = batch.into_iter().unzip();
            let name = if proposal { "id.next" } else { "id.read" };
            let judged = items.clone();
            let tally = client
                .send_items(
                    Request::vote(name),
                    step(&items, &fixed_key(KeyKind::Marker)),
                    items.len(),
                    move |answers: &Vec<Answer>, i| judge(&judged[i], answers.get(i)).map(|_| ()),
                )
                .await;
            for (i, (item, tx)) in items.iter().zip(txs).enumerate() {
                let _ = tx.send(tally.item(|answers: &Vec<Answer>| judge(item, answers.get(i))));
            }
        }
    }
}

/// A lane's slot (the batcher, whether the proposals' lane), given back when its drain ends
/// abnormally (a panic, the runtime shutting down, a task dropped unpolled); the flag is
/// whether the drain gave it back itself.
struct SlotGuard(Arc<Batcher>, bool, bool);

impl Drop for SlotGuard {
    fn drop(&mut self) {
        if !self.2 {
            let mut st = self
                .0
                .lane(self.1)
                .state
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            st.in_flight = st.in_flight.saturating_sub(1);
        }
    }
}

/// The node step for `items` (all proposals, or all reads).
fn step(items: &[Item], marker_key: &str) -> Step<Vec<Answer>> {
    let n = items.len();
    if let Some(Item::Propose { .. }) = items.first() {
        let mut call = script_call(&ID_PROPOSE, Guard::Marker).key(marker_key);
        for it in items {
            if let Item::Propose { key, .. } = it {
                call = call.key(key);
            }
        }
        call = call.marker();
        for it in items {
            if let Item::Propose { base, last, .. } = it {
                call = call.arg(*base).arg(*last);
            }
        }
        return call.decode(move |_, v| decode_proposals(v, n));
    }
    let gets = items
        .iter()
        .filter_map(|it| match it {
            Item::Read { key, .. } => {
                let mut get = redis::cmd("GET");
                get.arg(key);
                Some(get)
            }
            Item::Propose { .. } => None,
        })
        .collect();
    Step::read(gets, move |_, v| decode_reads(v, n))
}

/// `id_propose.lua`'s answer for `n` proposals: two integers each. A node's outcome is
/// applied when it answered, whatever each proposal's status: every item is judged on its own
/// ([`judge`]), and the fan-out waits until every item is decided.
fn decode_proposals(v: redis::Value, n: usize) -> redis::RedisResult<NodeOutcome<Vec<Answer>>> {
    let flat: Vec<i64> = redis::from_redis_value(v)?;
    if flat.len() != 2 * n {
        return Err(count_mismatch(flat.len() / 2, n));
    }
    let mut answers = Vec::with_capacity(n);
    for pair in flat.chunks_exact(2) {
        let value = u64::try_from(pair[1]).map_err(|_| {
            redis::RedisError::from((redis::ErrorKind::Parse, "a negative ID register"))
        })?;
        answers.push(Answer::Proposal(match pair[0] {
            1 => Reply::Accepted { previous: value },
            0 => Reply::Behind { current: value },
            _ => Reply::Refused { current: value },
        }));
    }
    Ok(NodeOutcome::Applied(answers))
}

/// The registers `GET` returned for `n` reads (one value, or an array of them).
fn decode_reads(v: redis::Value, n: usize) -> redis::RedisResult<NodeOutcome<Vec<Answer>>> {
    let values = match v {
        redis::Value::Array(vs) if n > 1 => vs,
        one => vec![one],
    };
    if values.len() != n {
        return Err(count_mismatch(values.len(), n));
    }
    let answers = values
        .into_iter()
        .map(|v| decode_register(v).map(Answer::Read))
        .collect::<redis::RedisResult<Vec<_>>>()?;
    Ok(NodeOutcome::Applied(answers))
}

fn count_mismatch(got: usize, n: usize) -> redis::RedisError {
    redis::RedisError::from((
        redis::ErrorKind::Parse,
        "a node answered for another number of ID items",
        format!("{got} answers for {n} items"),
    ))
}

/// One item's outcome on a node, from that node's answer for it.
pub(super) fn judge(item: &Item, answer: Option<&Answer>) -> NodeOutcome<Answer> {
    match (item, answer) {
        (Item::Propose { .. }, Some(a @ Answer::Proposal(r))) => match r {
            Reply::Accepted { .. } => NodeOutcome::Applied(*a),
            _ => NodeOutcome::Rejected(*a),
        },
        (
            Item::Read {
                end, unvalidated, ..
            },
            Some(a @ Answer::Read(value)),
        ) => {
            if *unvalidated || decide::read_counts(*value, *end) {
                NodeOutcome::Applied(*a)
            } else {
                NodeOutcome::Rejected(*a)
            }
        }
        _ => NodeOutcome::Unknown(UnknownCause::ServerError(
            "the node's answer lacks this item".into(),
        )),
    }
}

/// A register as `GET` returns it: absent is 0; anything but a decimal integer below 2^53 is
/// an error (a corrupted register never validates anything).
pub(super) fn decode_register(v: redis::Value) -> redis::RedisResult<u64> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::NodeCtx;
    use redis::Value;

    fn ctx() -> NodeCtx {
        NodeCtx {
            node: 0,
            marker: "r/c".into(),
            run_id: "r".into(),
        }
    }

    fn propose(key: &str, base: u64, last: u64) -> Item {
        Item::Propose {
            key: key.into(),
            base,
            last,
        }
    }

    fn read(key: &str, end: u64) -> Item {
        Item::Read {
            key: key.into(),
            end,
            unvalidated: false,
        }
    }

    #[test]
    fn proposals_of_several_sequences_share_one_guarded_call() {
        let s = step(
            &[propose("rq:id:a", 5, 9), propose("rq:id:b", 1, 1)],
            "rq:marker",
        );
        assert!(s.is_guarded());
        assert_eq!(s.args_for_tests("r/c"), vec!["r/c", "5", "9", "1", "1"]);
        let ints = |v: &[i64]| Value::Array(v.iter().map(|i| Value::Int(*i)).collect());
        let accepted = s
            .decode_for_tests(&ctx(), ints(&[1, 4, 0, 7]))
            .expect("decodes");
        let NodeOutcome::Applied(answers) = accepted else {
            panic!("the node answered: each proposal is judged on its own: {accepted:?}")
        };
        assert_eq!(
            answers,
            vec![
                Answer::Proposal(Reply::Accepted { previous: 4 }),
                Answer::Proposal(Reply::Behind { current: 7 })
            ]
        );
        assert!(
            s.decode_for_tests(&ctx(), ints(&[1, 4])).is_err(),
            "an answer for another number of proposals is an error"
        );
        let refused = s
            .decode_for_tests(&ctx(), ints(&[-1, 4, -1, 7]))
            .expect("decodes");
        assert!(matches!(refused, NodeOutcome::Applied(_)));
    }

    #[test]
    fn reads_of_several_sequences_are_gets_behind_the_marker() {
        let s = step(&[read("rq:id:a", 10), read("rq:id:b", 3)], "rq:marker");
        assert!(s.is_guarded());
        let bulk = |t: &str| Value::BulkString(t.as_bytes().to_vec());
        let answer = s
            .decode_for_tests(&ctx(), Value::Array(vec![bulk("10"), Value::Nil]))
            .expect("decodes");
        assert_eq!(
            answer,
            NodeOutcome::Applied(vec![Answer::Read(10), Answer::Read(0)])
        );
        assert!(
            s.decode_for_tests(&ctx(), Value::Array(vec![bulk("x1"), Value::Nil]))
                .is_err(),
            "a corrupted register is an error"
        );
    }

    #[test]
    fn each_item_is_judged_on_its_own_answer() {
        let accepted = Answer::Proposal(Reply::Accepted { previous: 1 });
        let behind = Answer::Proposal(Reply::Behind { current: 9 });
        let refused = Answer::Proposal(Reply::Refused { current: 9 });
        let p = propose("k", 5, 6);
        assert_eq!(judge(&p, Some(&accepted)), NodeOutcome::Applied(accepted));
        assert_eq!(judge(&p, Some(&behind)), NodeOutcome::Rejected(behind));
        assert_eq!(judge(&p, Some(&refused)), NodeOutcome::Rejected(refused));
        let r = read("k", 10);
        assert_eq!(
            judge(&r, Some(&Answer::Read(10))),
            NodeOutcome::Applied(Answer::Read(10))
        );
        assert_eq!(
            judge(&r, Some(&Answer::Read(11))),
            NodeOutcome::Rejected(Answer::Read(11)),
            "a block above the spare was accepted here"
        );
        assert!(matches!(
            judge(&r, None),
            NodeOutcome::Unknown(UnknownCause::ServerError(_))
        ));
        assert!(matches!(
            judge(&p, Some(&Answer::Read(1))),
            NodeOutcome::Unknown(_)
        ));
    }

    #[test]
    fn registers_decode_strictly() {
        let bulk = |t: &str| Value::BulkString(t.as_bytes().to_vec());
        assert_eq!(decode_register(Value::Nil).ok(), Some(0));
        assert_eq!(decode_register(bulk("42")).ok(), Some(42));
        for bad in ["", "-1", "042", "1e3", "9007199254740992"] {
            assert!(decode_register(bulk(bad)).is_err(), "{bad:?}");
        }
    }
}
