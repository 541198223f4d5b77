//! A workload process (`rq-campaign worker ...`): calls redquorum in a loop and records every
//! call on `CLOCK_MONOTONIC` (shared by every process of the machine), one line per call,
//! written unbuffered so a process killed with -9 leaves whole lines behind:
//!
//! ```text
//! ok   <start_ns> <end_ns> <first id> <last id>     an ID call that returned a range
//! err  <start_ns> <end_ns> <error>                   a call that failed
//! ```

use std::fs::File;
use std::io::Write;
use std::path::Path;
use std::time::Duration;

use rand::{Rng, SeedableRng};
use redquorum::{Client, Config, IdGenerator};
use redquorum_testkit::record::monotonic_ns;

use crate::plant::Plant;

/// The ID workload: `next_ids(1..=batch)` in a loop on `sequence`, until killed.
pub async fn ids(
    urls: &[String],
    sequence: &str,
    out: &Path,
    seed: u64,
    plant: Option<Plant>,
) -> Result<(), String> {
    let mut file = File::create(out).map_err(|e| format!("{}: {e}", out.display()))?;
    let mut config = Config::from_urls(urls).map_err(|e| e.to_string())?;
    if let Some(p) = plant {
        config = p.apply(config, urls.len());
    }
    let client = Client::connect(config).await.map_err(|e| e.to_string())?;
    let ids = IdGenerator::new(&client, sequence).map_err(|e| e.to_string())?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    loop {
        let count = rng.random_range(1..=4u64);
        let start = monotonic_ns();
        let result = ids.next_ids(count).await;
        let end = monotonic_ns();
        let line = match result {
            Ok(r) => format!("ok\t{start}\t{end}\t{}\t{}\n", r.start(), r.end()),
            Err(e) => format!("err\t{start}\t{end}\t{}\n", one_line(&e.to_string())),
        };
        file.write_all(line.as_bytes())
            .map_err(|e| format!("{}: {e}", out.display()))?;
        tokio::time::sleep(Duration::from_millis(rng.random_range(0..10))).await;
    }
}

/// An error message on one line (no tabs either).
pub fn one_line(s: &str) -> String {
    s.replace(['\n', '\t'], " ")
}
