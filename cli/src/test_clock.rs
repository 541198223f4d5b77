//! TEST ONLY (feature `test-util`): a simulated host suspend for a `redquorum` process, so a
//! process test can show that what it acts on (the SIGKILL grace of `lock run`, `serve`'s
//! `valid_for_ms`) is judged on the boot clock too. A real suspend cannot be staged in a test.
//!
//! - `REDQUORUM_BOOT_CLOCK_AHEAD_FILE_FOR_TESTS=<path>`: the process reads the file every
//!   20 ms; a number of milliseconds in it moves the process's boot clock that far ahead of
//!   its monotonic clock ([`redquorum::set_boot_clock_ahead_for_tests`]), as a suspend of that
//!   length would have. Write the file to stage the suspend; a missing file or other content
//!   changes nothing.
//! - `REDQUORUM_MONOTONIC_VALIDITY_FOR_TESTS=1`: validity is judged on the monotonic clock
//!   alone ([`redquorum::judge_validity_on_monotonic_clock_only_for_tests`]), as before the
//!   boot clock was read: the switch that shows a test's teeth.
//!
//! Neither variable is read without the feature.

use std::time::Duration;

/// Apply the variables above (from a Tokio runtime: the file is watched by a task).
pub(crate) fn start() {
    if std::env::var("REDQUORUM_MONOTONIC_VALIDITY_FOR_TESTS").as_deref() == Ok("1") {
        redquorum::judge_validity_on_monotonic_clock_only_for_tests(true);
    }
    let Some(path) = std::env::var_os("REDQUORUM_BOOT_CLOCK_AHEAD_FILE_FOR_TESTS") else {
        return;
    };
    tokio::spawn(async move {
        let mut every = tokio::time::interval(Duration::from_millis(20));
        loop {
            every.tick().await;
            let read = std::fs::read_to_string(&path).unwrap_or_default();
            if let Ok(ms) = read.trim().parse::<u64>() {
                redquorum::set_boot_clock_ahead_for_tests(Duration::from_millis(ms));
            }
        }
    });
}
