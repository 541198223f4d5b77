//! How a member behaves: [`GroupOptions`], and the drain hook.

use super::*;

/// A user hook run when this member must drain: it must stop the work on the tasks it gives
/// up before it returns (bounded by the drain timeout). See [`Drain`].
pub type DrainHook = Arc<dyn Fn(Drain) -> BoxFuture<'static, ()> + Send + Sync>;

/// What a draining member gives up: tasks that [`from`](Drain::from) owns and
/// [`keeps`](Drain::keeps) does not ([`Drain::gives_up`]).
#[derive(Clone, Debug)]
pub struct Drain {
    /// The assignment this member worked under (the last active view).
    pub from: Assignment,
    /// The narrowed assignment it keeps while the new view is prepared (`None` if it keeps
    /// nothing, e.g. it is not in the new view).
    pub keeps: Option<Assignment>,
}

impl Drain {
    /// Whether task `task_id` moves away from this member (so its work must stop now).
    pub fn gives_up(&self, task_id: u64) -> bool {
        self.from.covers(task_id) && !self.keeps.as_ref().is_some_and(|k| k.covers(task_id))
    }

    /// Work distribution: the units this member gives up (it must stop their work before the
    /// hook returns), sorted.
    pub fn units_given_up(&self) -> Vec<String> {
        self.from
            .units()
            .into_iter()
            .flatten()
            .filter(|u| !self.keeps.as_ref().is_some_and(|k| k.covers_unit(u)))
            .cloned()
            .collect()
    }
}

/// Options of a group member.
#[derive(Clone)]
pub struct GroupOptions {
    pub(super) interval: Duration,
    pub(super) ownership: Ownership,
    pub(super) drain_timeout: Duration,
    pub(super) drain: Option<DrainHook>,
    pub(super) barrier: bool,
    pub(super) record_history: bool,
    pub(super) skew: Option<Duration>,
    pub(super) forkable_views: bool,
}

impl std::fmt::Debug for GroupOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GroupOptions")
            .field("interval", &self.interval)
            .field("ownership", &self.ownership)
            .field("drain_timeout", &self.drain_timeout)
            .finish()
    }
}

impl Default for GroupOptions {
    fn default() -> Self {
        GroupOptions {
            interval: Duration::from_secs(2),
            ownership: Ownership::Modulo,
            drain_timeout: Duration::from_secs(1),
            drain: None,
            barrier: true,
            record_history: false,
            skew: None,
            forkable_views: false,
        }
    }
}

impl GroupOptions {
    /// The heartbeat interval (default 2 s, between 100 ms and 1 h). Membership leases last
    /// 1.25 intervals; a change becomes active within 2 intervals.
    pub fn with_interval(mut self, d: Duration) -> Self {
        self.interval = d;
        self
    }

    /// The ownership mode (default [`Ownership::Modulo`], the seed's rule).
    pub fn with_ownership(mut self, mode: Ownership) -> Self {
        self.ownership = mode;
        self
    }

    /// The drain hook and its timeout (default: none, 1 s).
    pub fn with_drain(mut self, timeout: Duration, hook: DrainHook) -> Self {
        self.drain = Some(hook);
        self.drain_timeout = timeout;
        self
    }

    /// TEST ONLY: the forkable view register (set-if-greater; an equal version counts as held
    /// whatever its content; a version is reused after a seal that reached only some nodes),
    /// so a test can show the fork the compare-and-set prevents. Never use it in production.
    #[cfg(feature = "test-util")]
    pub fn with_forkable_views_for_tests(mut self) -> Self {
        self.forkable_views = true;
        self
    }

    /// TEST ONLY: use this phase offset instead of the random constant skew (to run members
    /// up to a quarter interval out of phase, as client clock skew would put them).
    #[cfg(feature = "test-util")]
    pub fn with_skew_for_tests(mut self, skew: Duration) -> Self {
        self.skew = Some(skew);
        self
    }

    /// TEST ONLY: record every published assignment with its time (see
    /// [`Member::history_for_tests`]).
    #[cfg(feature = "test-util")]
    pub fn record_history_for_tests(mut self) -> Self {
        self.record_history = true;
        self
    }

    /// TEST ONLY: activate new views at once, skipping the drain barrier, so a test can show
    /// the double owners the barrier prevents. Never use it in production.
    #[cfg(feature = "test-util")]
    pub fn without_barrier_for_tests(mut self) -> Self {
        self.barrier = false;
        self
    }
}
