//! The clock that keeps counting while the host is suspended.
//!
//! `tokio::time::Instant` reads `CLOCK_MONOTONIC`, which on Linux stops while the host is
//! suspended (laptop sleep, a VM paused by its hypervisor): a lease holder that was suspended
//! past its validity would resume believing it still held its lease, while the other clients'
//! clocks ran on. Validity is therefore also checked against `CLOCK_BOOTTIME` (Linux), which
//! counts suspended time. Timers still run on tokio's clock; after a resume the loss signal
//! fires within one watchdog slice, and [`crate::LockGuard::is_held`] is right at once.

use std::time::Duration;

/// The monotonic instant every time-taking decision is given: tokio's, so that tests under
/// `tokio::time::pause` move it. The pure decision cores import it from here (they take
/// instants as parameters and never read a clock; only I/O layers call `Instant::now`).
pub(crate) use tokio::time::Instant;

/// Time since boot, suspended time included (`CLOCK_BOOTTIME`). On systems without it, time
/// since the first call on the monotonic clock.
pub(crate) fn boot_now() -> Duration {
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
        Instant::now() >= self.mono || boot_now() >= self.boot
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
}
