//! The clock that keeps counting while the host is suspended.
//!
//! `tokio::time::Instant` reads `CLOCK_MONOTONIC`, which on Linux stops while the host is
//! suspended (laptop sleep, a VM paused by its hypervisor): a lease holder that was suspended
//! past its validity would resume believing it still held its lease, while the other clients'
//! clocks ran on. Validity is therefore also checked against `CLOCK_BOOTTIME` (Linux), which
//! counts suspended time. Every validity a caller is shown or acts on is the earlier of the
//! two ends ([`Stamp::end`]): `LockGuard::valid_until` and `is_held`, `Assignment::valid_until`
//! and `owns`, an extension judged late, the CLI's SIGKILL grace, `serve`'s `valid_for_ms`.
//! Timers still run on tokio's clock, which does not count the suspend either; a timer that
//! acts on validity therefore sleeps in slices and reads the clocks again when it fires: after
//! a resume the loss signal fires within one watchdog slice (at most a second), and
//! [`crate::LockGuard::is_held`] and `valid_until` are right at once.
//!
//! A real suspend cannot be staged in a test: with the `test-util` feature,
//! [`set_boot_clock_ahead_for_tests`] moves this process's boot clock ahead of its monotonic
//! one, as a suspend of that length just now would. Without the feature [`boot_now`] reads the
//! clock and nothing else.

use std::time::Duration;

/// The monotonic instant every time-taking decision is given: tokio's, so that tests under
/// `tokio::time::pause` move it. The pure decision cores import it from here (they take
/// instants as parameters and never read a clock; only I/O layers call `Instant::now`).
pub(crate) use tokio::time::Instant;

/// Time since boot, suspended time included (`CLOCK_BOOTTIME`). On systems without it, time
/// since the first call on the monotonic clock.
pub(crate) fn boot_now() -> Duration {
    let now = boot_clock();
    #[cfg(feature = "test-util")]
    let now = now + for_tests::ahead();
    now
}

/// The boot clock as the system reads it.
fn boot_clock() -> Duration {
    #[cfg(any(target_os = "linux", target_os = "android"))]
    {
        let ts = rustix::time::clock_gettime(rustix::time::ClockId::Boottime);
        Duration::new(
            u64::try_from(ts.tv_sec).unwrap_or(0),
            u32::try_from(ts.tv_nsec).unwrap_or(0),
        )
    }
    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    {
        static ORIGIN: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
        ORIGIN.get_or_init(std::time::Instant::now).elapsed()
    }
}

/// One instant on both clocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Stamp {
    /// On tokio's (monotonic) clock, for timers.
    pub(crate) mono: Instant,
    /// On the boot clock, which also counts suspended time.
    pub(crate) boot: Duration,
}

impl Stamp {
    pub(crate) fn now() -> Stamp {
        Stamp {
            mono: Instant::now(),
            boot: boot_now(),
        }
    }

    /// The same instant plus `d` on both clocks.
    pub(crate) fn after(self, d: Duration) -> Stamp {
        Stamp {
            mono: self.mono + d,
            boot: self.boot + d,
        }
    }

    /// Whether this instant has passed on either clock.
    pub(crate) fn passed(self) -> bool {
        self.end() <= Instant::now()
    }

    /// This instant on the monotonic clock, judged on both clocks: the earlier of `mono` and
    /// the boot clock's end carried onto the monotonic clock. Without a suspend since the stamp
    /// was taken the two agree; after a suspend of D it is D earlier than `mono` (in the past
    /// if D exceeded what was left). Reads both clocks; [`end_at`](Self::end_at) is its pure
    /// core.
    pub(crate) fn end(self) -> Instant {
        self.end_at(Instant::now(), boot_now())
    }

    /// [`end`](Self::end) given both clocks' readings at one moment: `now` (monotonic) and
    /// `boot_now`. Pure (with feature `test-util` it also reads the process-global switch
    /// [`judge_validity_on_monotonic_clock_only_for_tests`]).
    pub(crate) fn end_at(self, now: Instant, boot_now: Duration) -> Instant {
        #[cfg(feature = "test-util")]
        if for_tests::monotonic_only() {
            return self.mono;
        }
        let on_boot = if self.boot >= boot_now {
            now.checked_add(self.boot - boot_now)
        } else {
            // Past on the boot clock: as far before `now` as it is before `boot_now` (or, if
            // the monotonic clock cannot go back that far, `now`: past all the same).
            Some(now.checked_sub(boot_now - self.boot).unwrap_or(now))
        };
        on_boot.map_or(self.mono, |b| b.min(self.mono))
    }
}

/// TEST ONLY (feature `test-util`): move this process's boot clock `ahead` of its monotonic
/// clock, as a host suspend of that length would have (the value replaces the previous one;
/// zero undoes it). Every lease, assignment and validity of this process is then judged as
/// after a resume. Process-global: run a test that uses it in a process of its own (nextest
/// does), or it ends the leases of every test running beside it.
#[cfg(feature = "test-util")]
#[doc(hidden)]
pub fn set_boot_clock_ahead_for_tests(ahead: Duration) {
    for_tests::set_ahead(ahead);
}

/// TEST ONLY (feature `test-util`): judge validity on the monotonic clock alone, as before the
/// boot clock was read (a host suspend then goes unnoticed), so a test can show what reading
/// both clocks protects against. Process-global, as [`set_boot_clock_ahead_for_tests`].
#[cfg(feature = "test-util")]
#[doc(hidden)]
pub fn judge_validity_on_monotonic_clock_only_for_tests(on: bool) {
    for_tests::set_monotonic_only(on);
}

/// The process-global test switches (feature `test-util` only).
#[cfg(feature = "test-util")]
mod for_tests {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::time::Duration;

    static AHEAD_NS: AtomicU64 = AtomicU64::new(0);
    static MONOTONIC_ONLY: AtomicBool = AtomicBool::new(false);

    pub(super) fn ahead() -> Duration {
        Duration::from_nanos(AHEAD_NS.load(Ordering::SeqCst))
    }

    pub(super) fn set_ahead(ahead: Duration) {
        let ns = u64::try_from(ahead.as_nanos()).unwrap_or(u64::MAX);
        AHEAD_NS.store(ns, Ordering::SeqCst);
    }

    pub(super) fn monotonic_only() -> bool {
        MONOTONIC_ONLY.load(Ordering::SeqCst)
    }

    pub(super) fn set_monotonic_only(on: bool) {
        MONOTONIC_ONLY.store(on, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_clocks_advance_together_without_a_suspend() {
        let a = Stamp::now();
        std::thread::sleep(Duration::from_millis(20));
        let b = Stamp::now();
        let mono = b.mono - a.mono;
        let boot = b.boot - a.boot;
        assert!(mono >= Duration::from_millis(20) && boot >= Duration::from_millis(20));
        let diff = mono.abs_diff(boot);
        assert!(
            diff < Duration::from_millis(5),
            "mono {mono:?} vs boot {boot:?}"
        );
        assert!(!a.after(Duration::from_secs(60)).passed());
        assert!(a.passed());
    }

    #[test]
    fn the_end_on_both_clocks_is_the_earlier_one() {
        let t0 = Instant::now();
        let boot0 = Duration::from_secs(1000);
        let until = Stamp {
            mono: t0 + Duration::from_secs(10),
            boot: boot0 + Duration::from_secs(10),
        };
        let s = Duration::from_secs(1);
        // No suspend: both clocks moved alike, the end is `mono`.
        assert_eq!(until.end_at(t0 + 3 * s, boot0 + 3 * s), until.mono);
        // A suspend of 4 s: the boot clock ran 4 s further, the end is 4 s earlier.
        assert_eq!(until.end_at(t0 + 3 * s, boot0 + 7 * s), t0 + 6 * s);
        // A suspend of 12 s, beyond the validity: the end is in the past, by the overshoot
        // (5 s before now on the boot clock).
        assert_eq!(until.end_at(t0 + 3 * s, boot0 + 15 * s) + 5 * s, t0 + 3 * s);
        // A boot clock behind (never on Linux): the monotonic end still bounds it.
        assert_eq!(until.end_at(t0 + 3 * s, boot0), until.mono);
    }
}
