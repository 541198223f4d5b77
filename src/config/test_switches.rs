//! The test-only switches that weaken a protection (`*_for_tests`, feature `test-util`), so a
//! test can show that its checker catches what the protection prevents, and the copy hook
//! that pauses a copy at a chosen point. The default build has none of them: it cannot weaken
//! a quorum.

#[cfg(feature = "test-util")]
use super::Config;

/// TEST ONLY: where a copy (of a repair or a node-list change) calls the hook of
/// [`Config::with_copy_hook_for_tests`](super::Config::with_copy_hook_for_tests).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
#[cfg_attr(not(feature = "test-util"), allow(unreachable_pub))]
pub enum CopyEvent {
    /// The sources and targets are fixed (after the census, the seal and the claims), before
    /// the first page is read.
    Started,
    /// A page was read from every source and merged, before it is written.
    PageRead,
    /// A node-list change sealed the old nodes it reached (before it settles and counts them).
    Sealed,
    /// A node-list change marked one more node of the new list for the new cluster.
    Marked,
    /// `cluster init` decided to mark blank nodes (under its claims), before it marks them.
    InitDecided,
}

/// The test-only copy hook (see [`Config::with_copy_hook_for_tests`]).
#[cfg(feature = "test-util")]
#[derive(Clone)]
pub(crate) struct CopyHook(pub(crate) std::sync::Arc<CopyHookFn>);

/// The function a [`CopyHook`] calls.
#[cfg(feature = "test-util")]
type CopyHookFn = dyn Fn(CopyEvent) -> futures::future::BoxFuture<'static, ()> + Send + Sync;

/// The test-only record hook (see [`Config::with_record_hook_for_tests`]).
#[cfg(feature = "test-util")]
#[derive(Clone)]
pub(crate) struct RecordHook(pub(crate) std::sync::Arc<RecordHookFn>);

/// The function a [`RecordHook`] calls.
#[cfg(feature = "test-util")]
type RecordHookFn = dyn Fn() -> futures::future::BoxFuture<'static, ()> + Send + Sync;

#[cfg(feature = "test-util")]
impl std::fmt::Debug for RecordHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RecordHook")
    }
}

#[cfg(feature = "test-util")]
impl std::fmt::Debug for CopyHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CopyHook")
    }
}

#[cfg(feature = "test-util")]
impl Config {
    /// TEST ONLY: switch off node-amnesia protection (marker check, quarantine, repair and
    /// the per-process high-water mark), so a test can show that its checker catches the
    /// violations this protection prevents. Never use it in production.
    pub fn with_amnesia_protection_disabled_for_tests(mut self) -> Self {
        self.amnesia_protection = false;
        self
    }

    /// TEST ONLY: count `needed` nodes as a quorum instead of a majority (for example N/2),
    /// so a test can show that its checker catches split-brain. Never use it in production.
    pub fn with_unsafe_quorum_for_tests(mut self, needed: usize) -> Self {
        self.quorum_override = Some(needed);
        self
    }

    /// TEST ONLY: a lock attempt dropped by its caller mid-round does not release that round,
    /// so a test can show the copies it leaves behind (a free lock then looks held for its TTL
    /// plus drift). Never use it in production.
    pub fn with_dropped_rounds_left_for_tests(mut self) -> Self {
        self.undo_dropped_rounds = false;
        self
    }

    /// TEST ONLY: undo a lock round that was not granted by folding its token into the fence
    /// floor on every node (the rule before issue 43), never rolling back a grant that is
    /// still untouched, so a test can show the copy a holder then never regains on a node that
    /// missed its grant. Never use it in production.
    pub fn with_undone_rounds_folded_for_tests(mut self) -> Self {
        self.rollback_undone_rounds = false;
        self
    }

    /// TEST ONLY: let lease keys expire on the nodes' wall clocks again (Redis `PEXPIRE`), never
    /// re-create a missing copy on extension, and do not restore lease keys in repair: the
    /// classic Redlock behaviour, so a test can show the double holders that a node's clock
    /// step or a lost copy causes with it. A repair's claim on a node then also expires on
    /// that node's wall clock (a dead repairer's claim outlives a backward step). Never use it
    /// in production.
    pub fn with_server_clock_leases_for_tests(mut self) -> Self {
        self.server_clock_leases = true;
        self
    }

    /// TEST ONLY: a repair restores the newest copy of a lease (highest token) even where its
    /// sources hold different holders' copies, the rule before 2026-11-24, so a test can show
    /// the two holders it admits when a contender that never held the lease releases the
    /// restored copy. Never use it in production.
    pub fn with_newest_lease_restore_for_tests(mut self) -> Self {
        self.newest_lease_restore = true;
        self
    }

    /// TEST ONLY: an ID generator returns IDs from its spare block without the majority read
    /// that shows no higher ID was returned before the call, so a test can show the
    /// real-time order it breaks when another process wrote above the spare. Never use it in
    /// production.
    pub fn with_unvalidated_spares_for_tests(mut self) -> Self {
        self.unvalidated_spares = true;
        self
    }

    /// TEST ONLY: a lock contender takes over a held lease as soon as it sees it, without
    /// watching it unchanged for its TTL plus drift, so a test can show the two holders that
    /// the wait prevents. Never use it in production.
    pub fn without_takeover_wait_for_tests(mut self) -> Self {
        self.takeover_wait = false;
        self
    }

    /// TEST ONLY: the tally of every operation's fan-out counts a lost reply (a timeout, or a
    /// connection that broke after the request may have been sent) as applied, so a test can
    /// show what counting only real replies prevents. The fan-out's own early stop and the
    /// client's node probes still count real replies only. Never use it in production.
    pub fn with_lost_replies_counted_for_tests(mut self) -> Self {
        self.lost_replies_counted = true;
        self
    }

    /// TEST ONLY: a vote that may change a node is sent with the per-node deadline its
    /// operation asked for, or the operation timeout when it asked for none (as unit and list
    /// writes once were), instead of at most the node timeout, so a test can show a write
    /// counted from a reply later than the wait of a repair. Never use it in production.
    pub fn with_unbounded_vote_deadlines_for_tests(mut self) -> Self {
        self.unbounded_vote_deadlines = true;
        self
    }

    /// TEST ONLY: a holder's release ([`LockGuard::release`](crate::LockGuard::release))
    /// counts a node that answered "not your copy" (another holder's copy, or none) as one
    /// where it deleted its own, so a test can show the deposed holder it then tells that a
    /// majority still held its lease. What the nodes hold is unchanged: only the answer lies.
    /// Never use it in production.
    pub fn with_foreign_copies_counted_on_release_for_tests(mut self) -> Self {
        self.release_counts_foreign_copies = true;
        self
    }

    /// TEST ONLY: a repair (or a change of the node list) does not re-read the fence floors
    /// after its scans, so a test can show the token that a lock release during the copy
    /// makes it miss. Never use it in production.
    pub fn without_floor_recheck_for_tests(mut self) -> Self {
        self.floor_recheck = false;
        self
    }

    /// TEST ONLY: a repair's (or a node-list change's) copy reads its sources blind, without
    /// checking in the same transaction that each is still the incarnation (run_id, marker,
    /// last repair) its census found, so a test can show the accepted values that a source
    /// emptied by FLUSHALL during the copy makes it lose. Never use it in production.
    pub fn with_blind_copy_reads_for_tests(mut self) -> Self {
        self.copy_checks = false;
        self
    }

    /// TEST ONLY: a copy's page writes do not check that the target still carries the
    /// repairer's claim, so a test can show what a repairer that lost its claim brings back
    /// (a unit removed and collected meanwhile). Never use it in production.
    pub fn with_unclaimed_copy_writes_for_tests(mut self) -> Self {
        self.copy_claimed = false;
        self
    }

    /// TEST ONLY: a repair that finds blank nodes (every node answering, none marked, none
    /// holding data) sets a cluster up on them, as every client did before issue 28: after
    /// every node lost its data, a running client's IDs then start again from 1 without the
    /// operator's `cluster init`, which a test can show.
    pub fn with_implicit_set_up_for_tests(mut self) -> Self {
        self.implicit_set_up = true;
        self
    }

    /// TEST ONLY: a repair (and a set-up) writes the node's marker without an epoch, and
    /// restores a beat only where the node lacks it, from the first source holding it: the
    /// rules before issue 27. A node FLUSHALLed (run_id kept) and repaired then shows the very
    /// marker it had, so a leader's watch counts straight through the loss, and a beat can go
    /// back to a value the leader saw earlier: a test can show the double owner this gives.
    pub fn with_repeatable_beats_for_tests(mut self) -> Self {
        self.repair_epochs = false;
        self
    }

    /// TEST ONLY: re-running an interrupted node-list change does not resume it (the old
    /// list's client takes whatever cluster its nodes show for the one to replace), so a
    /// test can show the trap the resumption removes: a change stopped after marking fewer
    /// than a majority of the new list is refused, or seals for a bogus second successor; and
    /// a completed change stamps no old node done, so a stale re-run after the new nodes were
    /// wiped copies the old cluster's frozen state onto them again.
    pub fn with_unresumable_changes_for_tests(mut self) -> Self {
        self.change_resumes = false;
        self
    }

    /// TEST ONLY: a running client never follows a change of its node list (as before issue
    /// 43): once the old nodes are sealed it works only where the old list still gives it a
    /// majority, until a new [`Client::connect`](crate::Client::connect) follows. A test can
    /// show the holder that then loses its lease. Never use it in production.
    pub fn without_live_follow_for_tests(mut self) -> Self {
        self.live_follow = false;
        self
    }

    /// TEST ONLY: call `hook` at a copy's pause points ([`CopyEvent`]) and wait for the future
    /// it returns, so a test can fault a node at exactly that moment (a FLUSHALL of a source
    /// after the census; a repairer paused between a page's read and its write).
    pub fn with_copy_hook_for_tests(
        mut self,
        hook: impl Fn(CopyEvent) -> futures::future::BoxFuture<'static, ()> + Send + Sync + 'static,
    ) -> Self {
        self.copy_hook = Some(CopyHook(std::sync::Arc::new(hook)));
        self
    }

    /// TEST ONLY: adopt whatever cluster descriptor the nodes hold even when it lists another
    /// number of nodes, and repair nodes the descriptor does not list: a client with another
    /// node list then counts majorities over another set of servers, so a test can show the
    /// broken order this protection prevents. It also lets two URLs to one server both vote
    /// in a fan-out that starts before their probes are compared. Never use it in production.
    pub fn without_cluster_identity_for_tests(mut self) -> Self {
        self.cluster_identity = false;
        self
    }

    /// TEST ONLY: a job's completion record is neither checked against the job's lease on the
    /// nodes (`record.lua` skips the fence, floor and begin-mark check) nor judged against the
    /// lease's validity by the client, and a run neither marks its period begun nor ignores a
    /// record below a begin mark: the rules before issue 43, so a test can show a deposed
    /// holder's late record making the period look done after its successor began it and
    /// failed. Never use it in production.
    pub fn with_unfenced_records_for_tests(mut self) -> Self {
        self.fenced_records = false;
        self.begun_marks = false;
        self
    }

    /// TEST ONLY: a job's run does not mark its period begun on a majority, and a reader does
    /// not ignore a record below the highest begin mark (the lease check on each node stays),
    /// so a test can show a late record that landed on a node outside its successor's majority
    /// making the period look done. Never use it in production.
    pub fn without_begun_marks_for_tests(mut self) -> Self {
        self.begun_marks = false;
        self
    }

    /// TEST ONLY: call `hook` after a job's run has checked that its lease holds and just
    /// before its completion record is sent, and wait for the future it returns, so a test
    /// can stage a holder paused at exactly that moment (its lease lapses, another instance
    /// takes the job over).
    pub fn with_record_hook_for_tests(
        mut self,
        hook: impl Fn() -> futures::future::BoxFuture<'static, ()> + Send + Sync + 'static,
    ) -> Self {
        self.record_hook = Some(RecordHook(std::sync::Arc::new(hook)));
        self
    }
}
