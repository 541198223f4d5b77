//! The timed concurrent loop, copied from the workspace's `benches/support/mod.rs` (`measure`)
//! so both systems are measured by the same code as the other benchmarks; plus the lock-slot
//! pool of `benches/locks.rs` and a real-time order check of IDs.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What one measurement gave: operations per second, latency percentiles, failed calls.
#[derive(Clone, Copy, Debug)]
pub struct Figures {
    pub ops_per_s: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub failures: u64,
}

/// Run `callers` concurrent loops of `call` for `dur`; each call returns how many operations
/// it completed (a failed call counts as a failure, and its latency is not recorded).
pub async fn measure<F, Fut>(callers: usize, dur: Duration, call: F) -> Figures
where
    F: Fn() -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = Result<u64, String>> + Send,
{
    let stop = Arc::new(AtomicBool::new(false));
    let ops = Arc::new(AtomicU64::new(0));
    let failures = Arc::new(AtomicU64::new(0));
    let lat = Arc::new(Mutex::new(Vec::new()));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..callers {
        let (stop, ops, failures, lat, call) = (
            stop.clone(),
            ops.clone(),
            failures.clone(),
            lat.clone(),
            call.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let mut mine = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let t0 = Instant::now();
                match call().await {
                    Ok(n) => {
                        ops.fetch_add(n, Ordering::Relaxed);
                        mine.push(t0.elapsed());
                    }
                    Err(e) => {
                        report_failure(&e);
                        failures.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            lat.lock().expect("latency list poisoned").extend(mine);
        }));
    }
    tokio::time::sleep(dur).await;
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        let _ = t.await;
    }
    let elapsed = start.elapsed().as_secs_f64();
    let mut l = lat.lock().expect("latency list poisoned").clone();
    l.sort();
    let pct = |p: f64| {
        l.get(((l.len().saturating_sub(1)) as f64 * p) as usize)
            .map(|d| d.as_secs_f64() * 1e3)
            .unwrap_or(f64::NAN)
    };
    Figures {
        ops_per_s: ops.load(Ordering::Relaxed) as f64 / elapsed,
        p50_ms: pct(0.5),
        p99_ms: pct(0.99),
        failures: failures.load(Ordering::Relaxed),
    }
}

/// Print the first few failed calls of the whole run (to stderr), so a failure count in the
/// table has a reason beside it.
fn report_failure(e: &str) {
    static SHOWN: AtomicU64 = AtomicU64::new(0);
    if SHOWN.fetch_add(1, Ordering::Relaxed) < 20 {
        eprintln!("  (failed call: {e})");
    }
}

/// Lock indexes free to take (from `benches/locks.rs`): a cycle takes one and puts it back, so
/// no two concurrent cycles ever use one lock; with as many slots as callers, every caller
/// always finds one, and each lock is uncontended (the cost of the protocol itself).
#[derive(Clone)]
pub struct Slots(Arc<Mutex<Vec<usize>>>);

impl Slots {
    pub fn new(n: usize) -> Slots {
        Slots(Arc::new(Mutex::new((0..n).collect())))
    }

    pub fn take(&self) -> usize {
        self.0
            .lock()
            .expect("slot list poisoned")
            .pop()
            .expect("one lock slot per caller")
    }

    pub fn put(&self, i: usize) {
        self.0.lock().expect("slot list poisoned").push(i);
    }
}

/// A spot check of real-time order: a call's ID must exceed every ID returned (and recorded
/// here) before the call started. Never a false alarm: a call records its ID only after it
/// returned, so the floor a later call reads holds only IDs of calls that ended before it.
#[derive(Clone, Default)]
pub struct Monotonic(Arc<AtomicU64>);

impl Monotonic {
    /// The floor to read when a call starts.
    pub fn floor(&self) -> u64 {
        self.0.load(Ordering::Acquire)
    }

    /// Check the call's ID against the floor it read at its start, and record it.
    pub fn check(&self, floor: u64, id: u64) -> Result<u64, String> {
        if id <= floor {
            return Err(format!(
                "ID {id} is not above {floor}, returned before the call started"
            ));
        }
        self.0.fetch_max(id, Ordering::AcqRel);
        Ok(1)
    }
}
