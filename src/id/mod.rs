//! Monotonic fencing IDs: antirez's majority "set if less than", one round trip when
//! uncontended, with concurrent callers sharing one round.
//!
//! # How it works
//! Each node stores, per sequence, the highest ID it accepted (`rq:id:<name>`).
//! 1. A round reserves a block `base..=last` above the largest value this process knows (after
//!    a lost round, with a growing random jump: `decide.rs`).
//! 2. It proposes the block to every node (`id_propose.lua`): a node accepts, and stores `last`,
//!    only if its value is below `base`, atomically with the marker check; otherwise it replies
//!    with its value.
//! 3. A majority accepting ends the round: its callers get consecutive parts of the block.
//!    Otherwise the round learns the highest value a majority vouches for (bounded by the jump
//!    limit), backs off with randomized exponential delay when contended, and retries.
//! 4. The fast path (`round.rs`, [`IdOptions::with_lookahead`]): a write round also reserves
//!    spare IDs; a later call takes IDs from the spare after a majority *read* (a `GET` behind
//!    the marker, one MULTI/EXEC, no write) shows no node of a majority holding a value above
//!    the spare.
//!
//! Concurrent callers of one generator join the next round (group commit, up to 8 rounds in
//! flight, each above every block reserved before it in this process); a client's sequences
//! due together share one call per node (`batch.rs`), each item judged as if alone.
//!
//! # Guarantees
//! Under the crate's assumptions (details on [`IdGenerator`]): every returned ID was accepted by
//! a majority of the configured nodes; IDs of one sequence are unique across processes and
//! hosts; if one call returns before another starts, the later call's IDs are larger
//! (real-time order); the IDs of one `next_ids` call are consecutive; IDs stay below 2^53.
//! Not guaranteed: no gaps (failed rounds, cancelled callers, contention and unused spare IDs
//! leave gaps); order between overlapping calls; progress without a majority. If more than a
//! minority of nodes lose their data at once, IDs can repeat (the per-process high-water mark
//! still keeps this process's own IDs in order).
//!
//! # Invariants
//! - A block accepted by a majority lies above every block a majority accepted before it was
//!   sent: two majorities share a node, and "strictly less than" refuses equal values.
//! - A reply that never arrived is never counted as an acceptance.
//! - A batched call judges each proposal exactly as if sent alone (`Tally::item`), and its
//!   fan-out ends only when every item is decided.
//! - Spare IDs are handed out only after the validating majority read.
//!
//! # What it relies on outside this folder
//! - Keys (`src/keys.rs`): `KeyKind::Id` (`rq:id:<name>`), and `rq:marker` for the guard.
//! - Scripts: `src/scripts/id_propose.lua` (after `src/scripts/prelude.lua`: strict integers),
//!   through `crate::scripts::ID_PROPOSE`.
//! - Repair rule (`src/repair/plan.rs`): an `id` register is raised to the highest value any
//!   source holds; a wiped node votes again only after that.
//! - ACL (`src/acl.rs`): `Feature::Ids` (`GET`, `SET`, beside the base).
//! - Model: `model/src/ids.rs` (`rq-model ids`, with `--spare` for the fast path), checked in
//!   `model/tests/models.rs`; `model/tests/conformance.rs` runs the model's step and the real
//!   script side by side.
//! - Tests: `tests/ids.rs` (uniqueness and real-time order under concurrency, faults and amnesia,
//!   with teeth), `tests/hostile_values.rs` (a corrupted register), `tests/repair.rs`,
//!   `tests/cluster.rs` (IDs across a change of the node list); `benches/ids.rs`.
//!
//! # Files
//! - `mod.rs`: [`IdGenerator`], [`IdOptions`], the per-process high-water and reserved marks.
//! - `round.rs`: one call's rounds (the fast path, write rounds).
//! - `batch.rs`: a client's ID calls shared by its sequences (proposals and spare reads).
//! - `decide.rs`: the pure decisions (the block a round reserves, learning, backoff); table-tested.

use std::collections::{HashMap, VecDeque};
use std::ops::RangeInclusive;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use futures::stream::{FuturesUnordered, StreamExt};
use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::client::{script_call, Client, Guard, Request, Step};
use crate::error::{Error, NoQuorum};
use crate::keys::{fixed_key, KeyKind, Name};
use crate::quorum::UnknownCause;
use crate::quorum::{NodeOutcome, Tally};
use crate::scripts::{ID_PROPOSE, VALUE_LIMIT};

/// Most IDs one call may ask for.
pub const MAX_IDS_PER_CALL: u64 = 1 << 20;

/// Default bound on how far a proposal may jump above the value a majority holds.
pub const DEFAULT_MAX_JUMP: u64 = 1 << 32;

/// Default bound on contended rounds per call.
pub const DEFAULT_MAX_ATTEMPTS: u32 = 1000;

/// Default number of spare IDs a write round reserves beyond its callers' (see
/// [`IdOptions::with_lookahead`]).
pub const DEFAULT_LOOKAHEAD: u64 = 1024;

/// Most spare IDs a write round may reserve.
pub const MAX_LOOKAHEAD: u64 = 1 << 20;

mod batch;
mod decide;
mod round;

/// Rounds of one generator in flight at once.
const MAX_ROUNDS_IN_FLIGHT: usize = 8;

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

/// Monotonic fencing IDs: antirez's majority "set if less than", one round trip when
/// uncontended, with concurrent callers sharing one round.
///
/// # Guarantees
/// Assuming every voting node persists before replying (`appendfsync always` on an honest
/// disk), never evicts (`noeviction`), and at most a minority of nodes is faulty at a time
/// (down, slow, partitioned, restarted or wiped):
/// - every returned ID was accepted by a majority of the configured nodes;
/// - IDs of one sequence are unique, across every process and host;
/// - if one call returns before another starts (any process, any host), the later call's
///   IDs are larger (real-time order, i.e. linearizable);
/// - the IDs of one [`IdGenerator::next_ids`] call are consecutive.
///
/// # Not guaranteed
/// - No gap-freedom: failed rounds, cancelled callers and contention leave gaps.
/// - No order between calls that overlap in time.
/// - No progress without a majority of voting nodes; under heavy contention a call can fail
///   with [`Error::Contended`] after its attempt limit or deadline.
/// - If more than a minority of nodes lose their data at once, IDs can repeat; the
///   per-process high-water mark still keeps this process's IDs in real-time order: no call
///   returns an ID at or below one this process returned before the call started.
///
/// # How
/// Each node stores, per sequence, the highest ID it accepted. A round proposes a block
/// `base..=last`; a node accepts (and stores `last`) only if its value is below `base`, and
/// otherwise replies with its value. Two majorities share a node, and "strictly less than"
/// rejects equal values, so a block accepted by a majority lies above every block accepted
/// by a majority before it started. The proposal is only a guess: it starts from the largest
/// value this process has seen, so an uncontended round takes one round trip; a rejected
/// round retries from the largest value the rejections reported (bounded by the jump limit),
/// after a randomized exponential backoff when another client is competing.
///
/// A write round also reserves spare IDs beyond its callers' (the lookahead,
/// [`IdOptions::with_lookahead`]). A later call takes its IDs from the bottom of the spare
/// after a majority *read*: a `GET` of the register behind the node's marker, in one
/// transaction, with no write and so no fsync. Every ID returned before the call started lies
/// in a block a majority accepted; if a majority now holds nothing above the spare's end, no
/// such block lies above the spare, and accepted blocks are disjoint, so every earlier ID is
/// below the call's. A read that sees a higher value drops the spare (its IDs become a gap)
/// and the call writes above what it learned.
///
/// Concurrent callers in one process join the next round: every caller in a round was
/// waiting when it started, so handing them consecutive parts of its block keeps real-time
/// order. Up to 8 rounds of one generator are in flight at once, each reserving its block
/// above every block reserved before it in this process; callers of rounds in flight together
/// overlap in time, so either order of their IDs is allowed. A reply that never arrived is
/// never counted as an acceptance.
///
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
    high_water_key: String,
    /// The key of the highest block end this process's generators of the sequence had
    /// accepted (a guess for the next base: spare IDs lie between it and the high-water mark).
    reserved_key: String,
    max_jump: u64,
    max_attempts: u32,
    lookahead: u64,
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
    /// IDs reserved by an accepted write round beyond its callers'.
    spare: Option<decide::Spare>,
    /// Whether the next write round reserves spare IDs.
    spare_policy: decide::SparePolicy,
    /// Write calls that reserve spare IDs in flight: while any is, no other round starts (its
    /// block would land above the current spare and fail the spare's reads; the callers
    /// waiting meanwhile are served from the new spare, after at most that call's retries).
    spare_writing: usize,
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

/// How an [`IdGenerator`] behaves, given at construction ([`IdGenerator::with_options`]).
#[derive(Clone, Debug)]
pub struct IdOptions {
    max_jump: u64,
    max_attempts: u32,
    lookahead: u64,
}

impl Default for IdOptions {
    fn default() -> Self {
        IdOptions {
            max_jump: DEFAULT_MAX_JUMP,
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            lookahead: DEFAULT_LOOKAHEAD,
        }
    }
}

impl IdOptions {
    /// Bound on how far above the value held by a majority a proposal may jump, so that one
    /// node reporting a huge value cannot exhaust the sequence. Default [`DEFAULT_MAX_JUMP`].
    /// Values below 1 are raised to 1.
    pub fn with_max_jump(mut self, max_jump: u64) -> Self {
        self.max_jump = max_jump.max(1);
        self
    }

    /// Bound on contended rounds per call. Default [`DEFAULT_MAX_ATTEMPTS`]; at least 1.
    pub fn with_max_attempts(mut self, attempts: u32) -> Self {
        self.max_attempts = attempts.max(1);
        self
    }

    /// Spare IDs a write round reserves beyond its callers' (default [`DEFAULT_LOOKAHEAD`],
    /// at most [`MAX_LOOKAHEAD`]; 0 turns the fast path off). Later calls of this generator
    /// take their IDs from the spare after a majority *read* (no write, so no fsync on the
    /// nodes): a majority holding no value above the spare shows that no ID above it was
    /// returned before the call started. The guarantees are unchanged. The cost: spare IDs
    /// that are never handed out (the process exits, or another process wrote above them and
    /// the read failed) become gaps, and the sequence advances by up to the lookahead per
    /// write round. After a failed read, write rounds reserve no spare for a while (2, 4, ...
    /// up to 256 rounds), so contention between processes costs few extra reads.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] above [`MAX_LOOKAHEAD`].
    pub fn with_lookahead(mut self, lookahead: u64) -> Result<Self, Error> {
        if lookahead > MAX_LOOKAHEAD {
            return Err(Error::InvalidArgument(format!(
                "the ID lookahead must be at most {MAX_LOOKAHEAD}, got {lookahead}"
            )));
        }
        self.lookahead = lookahead;
        Ok(self)
    }
}

impl IdGenerator {
    /// A generator for `sequence` over `client`'s nodes.
    ///
    /// # Errors
    /// [`Error::Name`] if the name is empty, longer than [`crate::MAX_NAME_BYTES`] or holds a
    /// control character.
    pub fn new(client: &Client, sequence: &str) -> Result<IdGenerator, Error> {
        IdGenerator::with_options(client, sequence, IdOptions::default())
    }

    /// A generator with the given options.
    ///
    /// # Errors
    /// As [`IdGenerator::new`].
    pub fn with_options(
        client: &Client,
        sequence: &str,
        options: IdOptions,
    ) -> Result<IdGenerator, Error> {
        IdGenerator::build(client, sequence, options, KeyKind::Id)
    }

    /// A generator whose register lives under another key kind (a pool's unit versions).
    pub(crate) fn with_kind(
        client: &Client,
        sequence: &str,
        kind: KeyKind,
    ) -> Result<IdGenerator, Error> {
        let options = IdOptions {
            lookahead: 0,
            ..IdOptions::default()
        };
        IdGenerator::build(client, sequence, options, kind)
    }

    fn build(
        client: &Client,
        sequence: &str,
        options: IdOptions,
        kind: KeyKind,
    ) -> Result<IdGenerator, Error> {
        let name = Name::new("sequence", sequence)?;
        let key = name.key(kind);
        let high_water_key = format!("{}\u{0}{}", client.node_urls().join(","), key);
        Ok(IdGenerator {
            inner: Arc::new(Generator {
                client: client.clone(),
                key,
                name,
                reserved_key: format!("{high_water_key}\u{0}reserved"),
                high_water_key,
                max_jump: options.max_jump,
                max_attempts: options.max_attempts,
                lookahead: options.lookahead,
                state: Mutex::new(State::default()),
                wakeup: tokio::sync::Notify::new(),
            }),
        })
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
            // The guard exists before the task: a task dropped unpolled clears the flag too.
            let guard = RunningGuard(self.inner.clone(), false);
            tokio::spawn(self.inner.clone().run(guard));
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
    /// If this task dies (a panic, its runtime shutting down), `running` clears the flag, so
    /// the next caller starts a new runner instead of queueing behind a flag nobody clears.
    async fn run(self: Arc<Self>, mut running: RunningGuard) {
        let mut rounds = FuturesUnordered::new();
        loop {
            while rounds.len() < MAX_ROUNDS_IN_FLIGHT {
                match self.take_batch() {
                    Some(batch) => rounds.push(self.clone().serve(batch)),
                    None => break,
                }
            }
            if rounds.is_empty() {
                let done = {
                    let mut st = self.state();
                    if st.queue.is_empty() {
                        st.running = false;
                    }
                    !st.running
                };
                if done {
                    running.1 = true;
                    return;
                }
                // Nothing could start (a spare-making write of another runner is in flight):
                // wait for it to end rather than spin.
                self.wakeup.notified().await;
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
        if st.spare_writing > 0 {
            return None;
        }
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
}

/// Clears a generator's `running` flag when its runner ends abnormally, and fails the callers
/// still queued (their senders drop); the flag is whether it ended normally (having cleared
/// it under the lock itself).
struct RunningGuard(Arc<Generator>, bool);

impl Drop for RunningGuard {
    fn drop(&mut self) {
        if !self.1 {
            let mut st = self.0.state();
            st.running = false;
            st.queue.clear();
        }
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
