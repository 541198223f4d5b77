//! Monotonic fencing IDs: antirez's majority "set if less than", one round trip when
//! uncontended, with concurrent callers sharing one round.
//!
//! # Guarantees
//! Assuming every voting node persists before replying (`appendfsync always` on an honest
//! disk), never evicts (`noeviction`), and at most a minority of nodes is faulty at a time
//! (down, slow, partitioned, restarted or wiped):
//! - every returned ID was accepted by a majority of the configured nodes;
//! - IDs of one sequence are unique, across every process and host;
//! - if one call returns before another starts (any process, any host), the later call's
//!   IDs are larger (real-time order, i.e. linearizable);
//! - the IDs of one [`IdGenerator::next_ids`] call are consecutive.
//!
//! # Not guaranteed
//! - No gap-freedom: failed rounds, cancelled callers and contention leave gaps.
//! - No order between calls that overlap in time.
//! - No progress without a majority of voting nodes; under heavy contention a call can fail
//!   with [`Error::Contended`] after its attempt limit or deadline.
//! - If more than a minority of nodes lose their data at once, IDs can repeat; the
//!   per-process high-water mark still keeps this process's IDs in real-time order: no call
//!   returns an ID at or below one this process returned before the call started.
//!
//! # How
//! Each node stores, per sequence, the highest ID it accepted. A round proposes a block
//! `base..=last`; a node accepts (and stores `last`) only if its value is below `base`, and
//! otherwise replies with its value. Two majorities share a node, and "strictly less than"
//! rejects equal values, so a block accepted by a majority lies above every block accepted
//! by a majority before it started. The proposal is only a guess: it starts from the largest
//! value this process has seen, so an uncontended round takes one round trip; a rejected
//! round retries from the largest value the rejections reported (bounded by the jump limit),
//! after a randomized exponential backoff when another client is competing.
//!
//! Concurrent callers in one process join the next round: every caller in a round was
//! waiting when it started, so handing them consecutive parts of its block keeps real-time
//! order. Rounds of one generator run one at a time. A reply that never arrived is never
//! counted as an acceptance.

use std::collections::{HashMap, VecDeque};
use std::ops::RangeInclusive;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use futures::stream::{FuturesUnordered, StreamExt};
use rand::Rng;
use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::client::{script_call, Client, Guard, Request, Step};
use crate::error::{Error, NoQuorum};
use crate::keys::{fixed_key, KeyKind, Name};
use crate::quorum::{bounded_learn, NodeOutcome, Tally};
use crate::scripts::{ID_PROPOSE, VALUE_LIMIT};

/// Most IDs one call may ask for.
pub const MAX_IDS_PER_CALL: u64 = 1 << 20;

/// Default bound on how far a proposal may jump above the value a majority holds.
pub const DEFAULT_MAX_JUMP: u64 = 1 << 32;

/// Default bound on contended rounds per call.
pub const DEFAULT_MAX_ATTEMPTS: u32 = 1000;

/// Rounds of one generator in flight at once.
const MAX_ROUNDS_IN_FLIGHT: usize = 8;

/// Rounds in a row without a majority of voting nodes before a call gives up.
const NO_QUORUM_ROUNDS: u32 = 3;

/// What one node answered to a proposal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Reply {
    /// Stored the block; `previous` was its value.
    Accepted { previous: u64 },
    /// Already at `current >= base`.
    Behind { current: u64 },
    /// Refused to vote: its marker is missing or stale.
    Refused { current: u64 },
}

impl Reply {
    fn value(self) -> u64 {
        match self {
            Reply::Accepted { previous } => previous,
            Reply::Behind { current } | Reply::Refused { current } => current,
        }
    }
}

/// A generator of monotonic IDs for one named sequence. Cheap to clone; clones share rounds.
///
/// ```no_run
/// # async fn demo(client: redquorum::Client) -> Result<(), redquorum::Error> {
/// let orders = redquorum::IdGenerator::new(&client, "orders")?;
/// let id = orders.next_id().await?;
/// let block = orders.next_ids(100).await?; // 100 consecutive IDs, all above `id`
/// assert!(*block.start() > id);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct IdGenerator {
    inner: Arc<Generator>,
}

struct Generator {
    client: Client,
    name: Name,
    key: String,
    marker_key: String,
    high_water_key: String,
    max_jump: u64,
    max_attempts: u32,
    state: Mutex<State>,
    /// Wakes the round runner when a caller queues while rounds are in flight.
    wakeup: tokio::sync::Notify,
}

#[derive(Default)]
struct State {
    queue: VecDeque<Waiter>,
    running: bool,
    /// Largest value this generator has learned any node holds (a guess for the next base).
    known_max: u64,
}

struct Waiter {
    count: u64,
    tx: oneshot::Sender<Result<RangeInclusive<u64>, Error>>,
}

impl std::fmt::Debug for IdGenerator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdGenerator")
            .field("sequence", &self.inner.name)
            .finish()
    }
}

impl IdGenerator {
    /// A generator for `sequence` over `client`'s nodes.
    ///
    /// # Errors
    /// [`Error::Name`] if the name is empty, longer than [`crate::MAX_NAME_BYTES`] or holds a
    /// control character.
    pub fn new(client: &Client, sequence: &str) -> Result<IdGenerator, Error> {
        let name = Name::new("sequence", sequence)?;
        let key = name.key(KeyKind::Id);
        let high_water_key = format!("{}\u{0}{}", client.node_urls().join(","), key);
        Ok(IdGenerator {
            inner: Arc::new(Generator {
                client: client.clone(),
                key,
                name,
                marker_key: fixed_key(KeyKind::Marker),
                high_water_key,
                max_jump: DEFAULT_MAX_JUMP,
                max_attempts: DEFAULT_MAX_ATTEMPTS,
                state: Mutex::new(State::default()),
                wakeup: tokio::sync::Notify::new(),
            }),
        })
    }

    /// Bound on how far above the value held by a majority a proposal may jump, so that one
    /// node reporting a huge value cannot exhaust the sequence. Default [`DEFAULT_MAX_JUMP`].
    /// Values below 1 are raised to 1.
    pub fn with_max_jump(self, max_jump: u64) -> Self {
        self.reconfigure(|g| g.max_jump = max_jump.max(1))
    }

    /// Bound on contended rounds per call. Default [`DEFAULT_MAX_ATTEMPTS`]; at least 1.
    pub fn with_max_attempts(self, attempts: u32) -> Self {
        self.reconfigure(|g| g.max_attempts = attempts.max(1))
    }

    fn reconfigure(self, f: impl FnOnce(&mut Generator)) -> Self {
        match Arc::try_unwrap(self.inner) {
            Ok(mut g) => {
                f(&mut g);
                IdGenerator { inner: Arc::new(g) }
            }
            Err(shared) => IdGenerator { inner: shared },
        }
    }

    /// The sequence name.
    pub fn sequence(&self) -> &str {
        self.inner.name.as_str()
    }

    /// One new ID. See the module docs for the guarantees.
    ///
    /// # Errors
    /// [`Error::NoQuorum`] without a majority of voting nodes; [`Error::Contended`] after the
    /// attempt limit or the client's operation timeout; [`Error::Exhausted`] at 2^53.
    ///
    /// # Cancel safety
    /// Cancel-safe: a cancelled call returns nothing and its IDs, if its round succeeded,
    /// become a gap.
    pub async fn next_id(&self) -> Result<u64, Error> {
        Ok(*self.next_ids(1).await?.start())
    }

    /// `count` consecutive new IDs (1 ..= [`MAX_IDS_PER_CALL`]). Same guarantees as
    /// [`next_id`](Self::next_id).
    ///
    /// # Errors
    /// As [`next_id`](Self::next_id); [`Error::InvalidArgument`] for a count out of range.
    ///
    /// # Cancel safety
    /// Cancel-safe: a cancelled call returns nothing and its IDs become a gap.
    pub async fn next_ids(&self, count: u64) -> Result<RangeInclusive<u64>, Error> {
        if count == 0 || count > MAX_IDS_PER_CALL {
            return Err(Error::InvalidArgument(format!(
                "count must be between 1 and {MAX_IDS_PER_CALL}, got {count}"
            )));
        }
        let (tx, rx) = oneshot::channel();
        let start_runner = {
            let mut st = self.inner.state();
            st.queue.push_back(Waiter { count, tx });
            !std::mem::replace(&mut st.running, true)
        };
        if start_runner {
            tokio::spawn(self.inner.clone().run());
        } else {
            self.inner.wakeup.notify_one();
        }
        rx.await.unwrap_or_else(|_| {
            Err(Error::Internal(
                "the ID round was dropped (runtime shutting down)".into(),
            ))
        })
    }
}

impl Generator {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Serve queued callers until the queue is empty, with up to [`MAX_ROUNDS_IN_FLIGHT`]
    /// rounds at once. Every caller in a round was waiting when the round was sent, and each
    /// round proposes above every block reserved before it, so real-time order holds.
    async fn run(self: Arc<Self>) {
        let mut rounds = FuturesUnordered::new();
        loop {
            while rounds.len() < MAX_ROUNDS_IN_FLIGHT {
                match self.take_batch() {
                    Some(batch) => rounds.push(self.clone().serve(batch)),
                    None => break,
                }
            }
            if rounds.is_empty() {
                let mut st = self.state();
                if st.queue.is_empty() {
                    st.running = false;
                    return;
                }
                continue;
            }
            tokio::select! {
                _ = rounds.next() => {}
                _ = self.wakeup.notified() => {}
            }
        }
    }

    /// The callers for the next round: everyone queued, up to [`MAX_IDS_PER_CALL`] IDs.
    fn take_batch(&self) -> Option<Vec<Waiter>> {
        let mut st = self.state();
        // Callers that gave up before their round started need no IDs.
        st.queue.retain(|w| !w.tx.is_closed());
        let mut total = 0u64;
        let mut batch = Vec::new();
        while let Some(w) = st.queue.front() {
            if !batch.is_empty() && total + w.count > MAX_IDS_PER_CALL {
                break;
            }
            total += w.count;
            if let Some(w) = st.queue.pop_front() {
                batch.push(w);
            }
        }
        (!batch.is_empty()).then_some(batch)
    }

    /// Run one round (with its retries) for `batch` and hand out the block in queue order.
    async fn serve(self: Arc<Self>, batch: Vec<Waiter>) {
        let total: u64 = batch.iter().map(|w| w.count).sum();
        match self.allocate(total).await {
            Ok(block) => {
                let mut next = *block.start();
                for w in batch {
                    let _ = w.tx.send(Ok(next..=next + w.count - 1));
                    next += w.count;
                }
                debug_assert_eq!(next - 1, *block.end(), "the block is handed out exactly");
            }
            Err(e) => {
                for w in batch {
                    let _ = w.tx.send(Err(e.clone()));
                }
            }
        }
    }

    /// One or more quorum rounds until a block of `total` IDs is accepted by a majority.
    async fn allocate(&self, total: u64) -> Result<RangeInclusive<u64>, Error> {
        let config = self.client.config();
        let started = Instant::now();
        let mut contended = 0u32;
        let mut no_quorum = 0u32;
        let mut backoff = Duration::ZERO;
        // Whether any round so far may have been applied somewhere (a lost reply): then the
        // call's outcome is unknown even if its last round never reached those nodes.
        let mut maybe_applied = false;
        loop {
            let round_started = Instant::now();
            // Reserve the block under the lock: a round sent concurrently proposes above it.
            let (base, last) = {
                let mut st = self.state();
                let floor = st
                    .known_max
                    .max(high_water(&self.high_water_key, self.protected()));
                // After losing a contended round, skip a random distance ahead, doubling the range
                // with every loss (bounded by the jump limit). Competitors that learned the same
                // maximum would otherwise propose the same block again and split the votes, and a
                // sequence that others advance quickly would outrun a proposal made from a value
                // learned one round trip ago. A higher block is accepted even by nodes that took a
                // lower one, so the highest of distinct proposals always wins.
                let spread = if contended > 0 {
                    let range = total
                        .saturating_mul(1u64 << contended.min(40))
                        .saturating_add(64)
                        .min(self.max_jump);
                    rand::rng().random_range(0..=range)
                } else {
                    0
                };
                let base = floor.saturating_add(1).saturating_add(spread);
                let last = base
                    .checked_add(total - 1)
                    .filter(|l| *l < VALUE_LIMIT)
                    .ok_or_else(|| Error::Exhausted {
                        sequence: self.name.as_str().to_string(),
                        limit: VALUE_LIMIT,
                    })?;
                st.known_max = last;
                (base, last)
            };
            let tally = self.propose(base, last).await;
            maybe_applied |= tally.applied() > 0
                || tally
                    .results()
                    .iter()
                    .any(|r| matches!(&r.outcome, NodeOutcome::Unknown(c) if c.may_have_applied()));
            for (node, reply) in tally.replies() {
                if matches!(reply, Reply::Refused { .. }) {
                    self.client.suspect(node.0);
                }
            }
            let learned = self.learn(&tally, last);
            if tally.reached() {
                raise_high_water(&self.high_water_key, last, self.protected());
                return Ok(base..=last);
            }
            let needed = tally.majority().needed();
            let contending = tally
                .replies()
                .filter(|(_, r)| !matches!(r, Reply::Refused { .. }))
                .count();
            let timed_out = started.elapsed() >= config.operation_timeout;
            if contending < needed {
                // Not a competition we lost: a majority of voting nodes did not answer. When
                // the cause is definite (refused, excluded) three rounds settle it; when nodes
                // are merely slow, keep trying until the operation deadline.
                no_quorum += 1;
                let only_slow = tally
                    .results()
                    .iter()
                    .any(|r| matches!(&r.outcome, NodeOutcome::Unknown(c) if c.may_have_applied()));
                if timed_out || (no_quorum >= NO_QUORUM_ROUNDS && !only_slow) {
                    let mut q =
                        NoQuorum::from_tally("id.next", &tally, self.client.node_urls(), describe);
                    q.maybe_applied_somewhere |= maybe_applied;
                    return Err(q.into());
                }
            } else {
                contended += 1;
                if contended >= self.max_attempts || timed_out {
                    return Err(Error::Contended {
                        op: "id.next",
                        attempts: contended,
                        elapsed: started.elapsed(),
                    });
                }
                // The first retry after learning a higher value is immediate: we were merely
                // behind. Later ones back off, randomized, so competitors spread out.
                if contended == 1 && learned {
                    continue;
                }
            }
            // Randomized exponential backoff, scaled to how long a round takes here, so that
            // competing generators stop colliding instead of splitting the votes again.
            let round = round_started.elapsed().max(Duration::from_micros(500));
            backoff = (backoff * 2).max(round).min(Duration::from_millis(10));
            let pause =
                Duration::from_micros(rand::rng().random_range(0..=backoff.as_micros() as u64));
            tokio::time::sleep(pause).await;
        }
    }

    fn protected(&self) -> bool {
        self.client.config().amnesia_protection
    }

    async fn propose(&self, base: u64, last: u64) -> Tally<Reply> {
        let step = propose_step(&self.key, &self.marker_key, base, last);
        self.client.send(Request::vote("id.next"), step).await
    }

    /// Update the guess for the next base from a round's replies. Returns whether it rose.
    ///
    /// The guess is the largest value any node reported, unless that is more than
    /// `max_jump` above the value a majority holds (the `needed`-th smallest reply), in
    /// which case the majority's value is used: one node with a huge value cannot make the
    /// sequence jump.
    fn learn(&self, tally: &Tally<Reply>, last: u64) -> bool {
        let values: Vec<u64> = tally.replies().map(|(_, r)| r.value()).collect();
        let known = self.state().known_max;
        let (mut guess, set_aside) =
            bounded_learn(&values, tally.majority().needed(), known, self.max_jump);
        if set_aside {
            tracing::warn!(sequence = %self.name, reported = ?values, learned = guess, "a node reports a value far above the majority; not jumping to it");
        }
        if tally.applied() > 0 {
            // Nodes that accepted this block now hold `last`: the next base must pass it.
            guess = guess.max(last);
        }
        let mut st = self.state();
        let rose = guess > st.known_max;
        st.known_max = st.known_max.max(guess);
        rose
    }
}

fn describe(r: &Reply) -> String {
    match r {
        Reply::Accepted { previous } => format!("accepted (was {previous})"),
        Reply::Behind { current } => format!("already at {current}"),
        Reply::Refused { current } => format!("refused: marker missing or stale (at {current})"),
    }
}

/// The per-process high-water mark of each sequence (keyed by node list and sequence): the
/// largest ID this process has returned. Every round proposes above the mark as it stood when
/// the round was sent, so no call returns an ID at or below one returned before it started,
/// even if nodes lose their data beyond the fault model. (Rounds in flight together may
/// complete in either order; their callers overlap in time, so that is allowed.)
fn high_waters() -> &'static Mutex<HashMap<String, u64>> {
    static MARKS: OnceLock<Mutex<HashMap<String, u64>>> = OnceLock::new();
    MARKS.get_or_init(|| Mutex::new(HashMap::new()))
}

fn high_water(key: &str, enabled: bool) -> u64 {
    if !enabled {
        return 0;
    }
    let marks = high_waters().lock().unwrap_or_else(|p| p.into_inner());
    marks.get(key).copied().unwrap_or(0)
}

fn raise_high_water(key: &str, value: u64, enabled: bool) {
    if !enabled {
        return;
    }
    let mut marks = high_waters().lock().unwrap_or_else(|p| p.into_inner());
    let e = marks.entry(key.to_string()).or_insert(0);
    *e = (*e).max(value);
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
