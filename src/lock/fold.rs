//! Folding a lock's fence into its floor bucket, deferred while the lock is acquired again and
//! again.
//!
//! A release used to fold the lock's fence key into its floor bucket every time (three writes:
//! the lease's `DEL`, the floor's `SET`, the fence's `DEL`), so that a node keeps one floor per
//! bucket rather than one fence key per lock name forever. A lock acquired again at once
//! rewrites its fence key on its next grant anyway, so those two extra writes per cycle bought
//! nothing but memory that the next cycle would take back. Now:
//!
//! - a guard's release whose handle released less than [`HOT_WINDOW`] before runs in mode
//!   `"keep"` (`lock_release.lua`): it deletes the holder's copy only; the fence key stays;
//! - the first release of a handle, or one after a pause, folds as before (`"fold"`): a one-shot
//!   caller (`lock run`, `job run`, a cron job) leaves exactly what it always did;
//! - a round's undo (a round not granted, or dropped by its caller) never keeps: it rolls the
//!   grant back where it is untouched (`undo.rs`) and folds anywhere else, since a losing
//!   token's fence left on a node would, copied by a repair to a wiped node, block the real
//!   holder's copy there (its restore writes a blocker under a higher fence);
//! - a handle that kept a fence owes a fold: one task per handle waits until the handle has
//!   released nothing for [`HOT_WINDOW`], then sends `"collect"` to every voting node, which
//!   folds the fence only where the node holds its marker and no copy of the lock.
//!
//! Architecture invariant: keeping a fence key never lowers what a grant counts from (every
//! grant counts from `max(fence, floor)`), and a fold or collect always raises the floor before
//! it deletes the fence. A collect is marker-checked and sent to voting nodes only: a node under
//! repair may have been given a fence that its restore of a lease copy must still read
//! (`restore.lua` reads the fence key, not the floor).
//!
//! Not guaranteed: the collect is sent once and not retried. A fence key stays behind when the
//! process or its runtime ends within [`HOT_WINDOW`] of a kept release, when a node does not
//! answer the collect (down, slow, quarantined, over `maxmemory`), or when the node holds a key
//! at the lock's name at that instant (another holder's copy, a repair's blocker). It stays
//! until the lock's next fold (a first release, or a later collect): one fence key per node for
//! each such lock name, where a lock never used again keeps it.

use std::time::Duration;

use tokio::time::Instant;

/// How long after a release the next one counts as the same run of cycles.
pub(super) const HOT_WINDOW: Duration = Duration::from_secs(1);

/// What a release sends to the nodes (`lock_release.lua`'s mode).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Mode {
    /// Delete the copy and fold the fence into the floor.
    Fold,
    /// Delete the copy only; `start_collector` when no collect is owed yet (the caller starts
    /// the one task that will collect it).
    Keep { start_collector: bool },
}

impl Mode {
    pub(super) fn script_arg(self) -> &'static str {
        match self {
            Mode::Fold => "fold",
            Mode::Keep { .. } => "keep",
        }
    }
}

/// A handle's releases, for choosing each one's mode (pure: the caller reads the clock).
#[derive(Debug, Default)]
pub(super) struct Folds {
    last_release: Option<Instant>,
    /// A kept fence is waiting for its collect (its task runs or is about to).
    owed: bool,
}

impl Folds {
    /// The mode of a release at `now`, recorded as the handle's latest.
    pub(super) fn on_release(&mut self, now: Instant) -> Mode {
        let hot = self
            .last_release
            .is_some_and(|at| now.saturating_duration_since(at) < HOT_WINDOW);
        self.last_release = Some(now);
        if !hot {
            return Mode::Fold;
        }
        let start_collector = !self.owed;
        self.owed = true;
        Mode::Keep { start_collector }
    }

    /// For the collector at `now`: `Ok` when the handle has released nothing for
    /// [`HOT_WINDOW`] (the collect is sent now, and no longer owed), else the instant to look
    /// again.
    pub(super) fn collect_due(&mut self, now: Instant) -> Result<(), Instant> {
        match self.last_release {
            Some(at) if now.saturating_duration_since(at) < HOT_WINDOW => Err(at + HOT_WINDOW),
            _ => {
                self.owed = false;
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_first_release_and_one_after_a_pause_fold_as_before() {
        let mut f = Folds::default();
        let t0 = Instant::now();
        assert_eq!(
            f.on_release(t0),
            Mode::Fold,
            "a handle's first release folds"
        );
        let later = t0 + HOT_WINDOW;
        assert_eq!(
            f.on_release(later),
            Mode::Fold,
            "a release after a pause folds"
        );
    }

    #[test]
    fn releases_in_quick_succession_keep_the_fence_and_start_one_collector() {
        let mut f = Folds::default();
        let t0 = Instant::now();
        f.on_release(t0);
        let ms = Duration::from_millis;
        let keep = |start_collector| Mode::Keep { start_collector };
        assert_eq!(f.on_release(t0 + ms(10)), keep(true));
        assert_eq!(
            f.on_release(t0 + ms(20)),
            keep(false),
            "one collector per handle"
        );
        assert_eq!(
            f.collect_due(t0 + ms(500)),
            Err(t0 + ms(20) + HOT_WINDOW),
            "the collector waits until the handle has been idle for the window"
        );
        let idle = t0 + ms(20) + HOT_WINDOW;
        assert_eq!(f.collect_due(idle), Ok(()));
        assert_eq!(f.on_release(idle), Mode::Fold, "after the pause: a fold");
        assert_eq!(
            f.on_release(idle + ms(10)),
            keep(true),
            "a fence kept after the collect owes a new one"
        );
    }
}
