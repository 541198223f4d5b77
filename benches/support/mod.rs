//! Shared by the benchmarks: a timed concurrent loop. (The local redis-server nodes they run
//! against are the test kit's second node backend, `redquorum_testkit::LocalNodes`.)
#![allow(dead_code, clippy::expect_used, unreachable_pub)]

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[derive(Clone, Copy, Debug)]
pub struct Figures {
    pub ids_per_s: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub failures: u64,
}

/// Run `callers` concurrent loops of `call` for `dur`; each call returns how many IDs it got.
pub async fn measure<F, Fut>(callers: usize, dur: Duration, call: F) -> Figures
where
    F: Fn() -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = Result<u64, String>> + Send,
{
    let stop = Arc::new(AtomicBool::new(false));
    let ids = Arc::new(AtomicU64::new(0));
    let failures = Arc::new(AtomicU64::new(0));
    let lat = Arc::new(Mutex::new(Vec::new()));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..callers {
        let (stop, ids, failures, lat, call) = (
            stop.clone(),
            ids.clone(),
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
                        ids.fetch_add(n, Ordering::Relaxed);
                        mine.push(t0.elapsed());
                    }
                    Err(_) => {
                        failures.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            lat.lock().expect("latencies").extend(mine);
        }));
    }
    tokio::time::sleep(dur).await;
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        let _ = t.await;
    }
    let elapsed = start.elapsed().as_secs_f64();
    let mut l = lat.lock().expect("latencies").clone();
    l.sort();
    let pct = |p: f64| {
        l.get(((l.len().saturating_sub(1)) as f64 * p) as usize)
            .map(|d| d.as_secs_f64() * 1e3)
            .unwrap_or(f64::NAN)
    };
    Figures {
        ids_per_s: ids.load(Ordering::Relaxed) as f64 / elapsed,
        p50_ms: pct(0.5),
        p99_ms: pct(0.99),
        failures: failures.load(Ordering::Relaxed),
    }
}
