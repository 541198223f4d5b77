//! Helpers shared by the integration tests: logging, waiting on conditions, percentiles.
#![allow(dead_code, unreachable_pub)]

use std::future::Future;
use std::time::Duration;

use redquorum::{Client, Config};
use tokio::time::Instant;

/// Log to the test's output (shown on failure) at the level in RUST_LOG, default warn.
pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_test_writer()
        .try_init();
}

/// A client over `urls` with the test defaults (strict mode, 250 ms per node).
pub async fn client(urls: &[String]) -> Client {
    Client::connect(Config::from_urls(urls).expect("test URLs are valid"))
        .await
        .expect("test config is valid")
}

/// Poll `check` every 50 ms until it returns true, or panic with `what` after `limit`.
pub async fn eventually<F, Fut>(limit: Duration, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let start = Instant::now();
    while start.elapsed() < limit {
        if check().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{what}: still not true after {limit:?}");
}

/// The `p`-th percentile (0..=100) of `samples` (sorted in place).
pub fn percentile(samples: &mut [Duration], p: f64) -> Duration {
    assert!(!samples.is_empty(), "no samples to take a percentile of");
    samples.sort();
    let rank = ((p / 100.0) * (samples.len() - 1) as f64).round() as usize;
    samples[rank]
}

/// Milliseconds with two decimals, for printing.
pub fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}
