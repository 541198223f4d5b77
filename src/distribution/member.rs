//! [`PoolMember`]: a member of a pool's work distribution, [`PoolOptions`], and
//! [`pool_table`], the active table as a reader sees it.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use super::pool::PoolTables;
use crate::client::Client;
use crate::error::Error;
use crate::keys::{KeyKind, Name};
use crate::membership::group::{GroupKinds, JoinAs};
use crate::membership::register::ViewRegister;
use crate::membership::{Assignment, DrainHook, GroupOptions, Member, ViewState, ViewVersion};

/// Largest member weight.
pub const MAX_WEIGHT: u32 = 10_000;

/// Options of a pool member.
#[derive(Clone, Debug)]
pub struct PoolOptions {
    group: GroupOptions,
    weight: u32,
    grace: Duration,
    stateless: bool,
}

impl Default for PoolOptions {
    fn default() -> Self {
        PoolOptions {
            group: GroupOptions::default(),
            weight: 1,
            grace: Duration::ZERO,
            stateless: false,
        }
    }
}

impl PoolOptions {
    /// The heartbeat interval (default 2 s, 100 ms ..= 1 h). Membership leases last 1.25
    /// intervals; a change becomes active within about 2 intervals.
    pub fn with_interval(mut self, d: Duration) -> Self {
        self.group = self.group.with_interval(d);
        self
    }

    /// This member's weight (default 1, at most [`MAX_WEIGHT`]): its share of the units is
    /// proportional to it. Weight 0 joins **drained**: a member that owns no unit (its units
    /// are handed off through the barrier) but stays a member.
    pub fn with_weight(mut self, weight: u32) -> Self {
        self.weight = weight;
        self
    }

    /// The restart grace (default 0, at most 1 h): when this member's process goes away (a
    /// crash or a leave), its units stay assigned to its ID, worked by nobody, for this long;
    /// a process that joins with the same ID within it gets the same units back (a rolling
    /// restart moves nothing). After it, they are redistributed.
    pub fn with_restart_grace(mut self, grace: Duration) -> Self {
        self.grace = grace;
        self
    }

    /// The seed's stateless mode: the table is a function of the member and unit lists alone
    /// (the same lists always give the same division), not of the previous table. Moves more
    /// units on a change than the default sticky mode.
    pub fn stateless(mut self) -> Self {
        self.stateless = true;
        self
    }

    /// The drain hook and its timeout (default: none, 1 s): called when this member must stop
    /// units it gives up ([`crate::Drain::units_given_up`]), before it acknowledges; the new
    /// owners start only after that (or after this member's lease expired).
    pub fn with_drain(mut self, timeout: Duration, hook: DrainHook) -> Self {
        self.group = self.group.with_drain(timeout, hook);
        self
    }

    /// TEST ONLY: activate new tables at once, skipping the hand-over barrier, so a test can
    /// show the double owners it prevents. Never use it in production.
    #[cfg(feature = "test-util")]
    pub fn without_barrier_for_tests(mut self) -> Self {
        self.group = self.group.without_barrier_for_tests();
        self
    }

    /// TEST ONLY: record every published assignment (see [`PoolMember::history_for_tests`]).
    #[cfg(feature = "test-util")]
    pub fn record_history_for_tests(mut self) -> Self {
        self.group = self.group.record_history_for_tests();
        self
    }

    /// TEST ONLY: this phase offset instead of the random constant skew.
    #[cfg(feature = "test-util")]
    pub fn with_skew_for_tests(mut self, skew: Duration) -> Self {
        self.group = self.group.with_skew_for_tests(skew);
        self
    }
}

/// A member of a pool's work distribution: it learns which named units of the pool
/// ([`crate::Units`]) it owns, with a fenced, barrier-protected hand-over.
///
/// The pool's leader (a member holding the pool's leader lease) computes the table
/// `unit -> member` with [`crate::distribution_table`] from the previous table, the live
/// members with their weights and the units, and seals it as a versioned view. Each member's
/// units are stored as its own list on the nodes (a snapshot and deltas, each field written
/// once and named by its digest): a new table writes only the units that moved, and a member
/// reads only its own list, never the whole table.
///
/// # Guarantees
/// - **No unit has two owners at any instant.** A unit that moves from A to B is first
///   dropped by A (A's drain hook runs, bounded by its timeout, then A acknowledges) or A's
///   membership lease expires on the leader's monotonic clock; only then does the table
///   become active and B own it. Under a prepared table a member owns only the units both the
///   last active table and the new one give it. This is the barrier of [`Member`], with units
///   as tasks; its argument (no node clock, beats judged on the leader's monotonic clock) is
///   documented there.
/// - **Fencing.** Every assignment carries the table's version as a fencing token
///   ([`Assignment::token`]); a unit's next owner has a higher token than every earlier one,
///   so a stale owner's writes are refused by the resource guards ([`crate::fenced_set`]).
/// - **Balance and movement.** Every member owns its weighted share of the units, within one
///   unit; a change (join, leave, crash, unit added or removed) moves only the units that
///   balance needs (see [`crate::distribution_table`]); a member that comes back with the same
///   ID within its restart grace keeps its units.
/// - A unit removed before the leader computes a table is never assigned by it; a unit added
///   before is.
///
/// # Not guaranteed
/// Progress without a majority of nodes; ownership while this member's lease is not refreshed
/// (it ends at [`Assignment::valid_until`]); units that no member can take (no member with a
/// weight) are owned by nobody.
#[must_use = "the member leaves the pool when this is dropped"]
pub struct PoolMember {
    member: Member,
}

impl std::fmt::Debug for PoolMember {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PoolMember")
            .field("id", &self.member.id())
            .field("key", &self.member.key())
            .finish()
    }
}

impl PoolMember {
    /// Join `pool` as `id` and start heartbeating. Returns at once; watch
    /// [`changes`](Self::changes) for the first assignment.
    ///
    /// # Errors
    /// [`Error::Name`] for an invalid pool or ID; [`Error::InvalidArgument`] for an interval
    /// outside 100 ms ..= 1 h, a weight above [`MAX_WEIGHT`] or a grace above 1 h.
    ///
    /// # Cancel safety
    /// Cancel-safe: nothing is sent before it returns (the member's tasks start then).
    pub async fn join(
        client: &Client,
        pool: &str,
        id: &str,
        opts: PoolOptions,
    ) -> Result<PoolMember, Error> {
        let name = Name::new("pool", pool)?;
        if opts.weight > MAX_WEIGHT {
            return Err(Error::InvalidArgument(format!(
                "pool member weight {} is above {MAX_WEIGHT}",
                opts.weight
            )));
        }
        if opts.grace > Duration::from_secs(3600) {
            return Err(Error::InvalidArgument(format!(
                "pool restart grace {:?} is above 1h",
                opts.grace
            )));
        }
        let tables = PoolTables::new(client, &name, opts.grace, opts.stateless);
        let as_ = JoinAs {
            kinds: GroupKinds::POOL,
            what: "pool",
            tables: Some(Arc::new(tables)),
            key_suffix: match opts.weight {
                1 => String::new(),
                w => format!("*{w}"),
            },
        };
        let member = Member::join_as(client, pool, id, opts.group, as_)?;
        Ok(PoolMember { member })
    }

    /// The current assignment, if this member owns anything now (its units:
    /// [`Assignment::units`]).
    pub fn assignment(&self) -> Option<Assignment> {
        self.member.assignment()
    }

    /// The units this member owns now (empty when none).
    pub fn units(&self) -> BTreeSet<String> {
        self.assignment()
            .and_then(|a| a.units().cloned())
            .unwrap_or_default()
    }

    /// Whether this member owns `unit` now.
    pub fn owns(&self, unit: &str) -> bool {
        self.assignment().is_some_and(|a| a.owns_unit(unit))
    }

    /// Every change of this member's assignment (`None`: owns nothing).
    pub fn changes(&self) -> watch::Receiver<Option<Assignment>> {
        self.member.changes()
    }

    /// This member's ID.
    pub fn id(&self) -> &str {
        self.member.id()
    }

    /// Whether this member leads the pool now (it computes and seals the tables). For
    /// observation only: leadership can end at any moment.
    pub fn is_leader(&self) -> bool {
        self.member.is_leader()
    }

    /// This process's member key, `<id>#<nonce>` (with `*<weight>` when the weight is not 1).
    pub fn key(&self) -> &str {
        self.member.key()
    }

    /// Leave gracefully: stop owning, drop the membership lease, step down as leader.
    ///
    /// # Cancel safety
    /// Ownership ends before anything is sent; a dropped call leaves the membership lease on
    /// the nodes, and the leader judges the member gone after the lease time.
    pub async fn leave(self) {
        self.member.leave().await
    }

    /// TEST ONLY: every published assignment with its instant.
    #[cfg(feature = "test-util")]
    pub fn history_for_tests(&self) -> Vec<(tokio::time::Instant, Option<Assignment>)> {
        self.member.history_for_tests()
    }

    /// TEST ONLY: freeze this member for `d`, as if its process were stopped.
    #[cfg(feature = "test-util")]
    pub fn freeze_for_tests(&self, d: Duration) {
        self.member.freeze_for_tests(d)
    }

    /// TEST ONLY: stop as if the process crashed (no leave).
    #[cfg(feature = "test-util")]
    pub fn crash_for_tests(self) {
        self.member.crash_for_tests()
    }

    /// TEST ONLY: [`leave`](Self::leave), then return the complete history.
    ///
    /// # Cancel safety
    /// As [`leave`](Self::leave).
    #[cfg(feature = "test-util")]
    pub async fn leave_with_history_for_tests(
        self,
    ) -> Vec<(tokio::time::Instant, Option<Assignment>)> {
        self.member.leave_with_history_for_tests().await
    }
}

/// The active table of a pool, as [`pool_table`] read it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PoolTable {
    /// The version of the view read.
    pub version: ViewVersion,
    /// Its state: under a prepared view, the table shown is the last active one.
    pub state: Option<ViewState>,
    /// Member ID -> its units (members without units are not listed).
    pub members: BTreeMap<String, BTreeSet<String>>,
    /// Member IDs away within their restart grace (their units are worked by nobody).
    pub away: BTreeSet<String>,
}

/// The pool's active table (under a prepared table: the last active one), read from a
/// majority.
///
/// # Errors
/// [`Error::Name`] for an invalid pool name; [`Error::NoQuorum`] without a majority;
/// [`Error::Internal`] for a list that does not match its view.
///
/// # Cancel safety
/// Cancel-safe: it only reads (and writes back the newest view, which is idempotent).
pub async fn pool_table(client: &Client, pool: &str) -> Result<PoolTable, Error> {
    let name = Name::new("pool", pool)?;
    let register = ViewRegister::new(
        client,
        name.key(KeyKind::PoolView).into(),
        name.key(KeyKind::PoolMembers).into(),
        false,
    );
    let (view, _) = register
        .read_adopted(&crate::membership::register::Extras::default(), |_| {})
        .await?;
    let lists = match view.state {
        ViewState::Active => view.lists.clone(),
        ViewState::Prepare => view.previous_lists.clone(),
    };
    let tables = PoolTables::new(client, &name, Duration::ZERO, false);
    let resolved = tables.resolve_lists(&lists).await?;
    Ok(PoolTable {
        version: view.version,
        state: Some(view.state),
        away: lists
            .iter()
            .filter(|(_, r)| r.key.is_none())
            .map(|(id, _)| id.clone())
            .collect(),
        members: resolved,
    })
}

/// TEST ONLY: a pool leader's reader of the units, to test its change-log reads.
#[cfg(feature = "test-util")]
pub struct LeaderUnitsForTests(PoolTables);

#[cfg(feature = "test-util")]
impl std::fmt::Debug for LeaderUnitsForTests {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LeaderUnitsForTests")
    }
}

#[cfg(feature = "test-util")]
impl LeaderUnitsForTests {
    /// A reader of `pool`'s units as its leader reads them.
    ///
    /// # Errors
    /// [`Error::Name`] for an invalid pool name.
    pub fn new(client: &Client, pool: &str) -> Result<Self, Error> {
        let name = Name::new("pool", pool)?;
        Ok(LeaderUnitsForTests(PoolTables::new(
            client,
            &name,
            Duration::ZERO,
            false,
        )))
    }

    /// Read: the units present and, per node that answered, whether it sent its whole register
    /// (`true`) or only the fields raised since this reader's last read of it, and how many.
    ///
    /// # Errors
    /// [`Error::NoQuorum`] without a majority.
    ///
    /// # Cancel safety
    /// Cancel-safe (a dropped read only makes the next one read whole registers).
    pub async fn read(&self) -> Result<(BTreeSet<String>, Vec<(bool, usize)>), Error> {
        self.0.units_for_tests().await
    }
}
