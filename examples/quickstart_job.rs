//! The README's quickstart, as a runnable example (a test keeps the two the same text).
//! `REDQUORUM_NODES=... cargo run --example quickstart_job`; `scripts/demo.sh` runs it.

use redquorum::{Client, Config, FencingToken, JobOutcome, PeriodicJob};
use std::time::Duration;

#[tokio::main]
async fn main() -> Result<(), redquorum::Error> {
    let client = Client::connect(Config::from_env()?).await?;
    let job = PeriodicJob::new(&client, "nightly-report", Duration::from_secs(30))?;
    let outcome = job
        .run_period("2026-11-27", Duration::from_secs(60), |token, _lost| {
            write_report(token)
        })
        .await?;
    match outcome {
        JobOutcome::Ran {
            output: Ok(path), ..
        } => println!("report written to {path}"),
        JobOutcome::Ran { output: Err(e), .. } => println!("failed, not recorded: {e}"),
        JobOutcome::AlreadyDone { token } => println!("done already, by token {token}"),
        JobOutcome::NotLeader => println!("another instance is running it"),
    }
    Ok(())
}

/// The day's work. Only its `Ok` records the period; an `Err` leaves it to the next call.
async fn write_report(token: FencingToken) -> std::io::Result<String> {
    let path = std::env::temp_dir().join(format!("nightly-report-{token}.txt"));
    std::fs::write(&path, format!("written with fencing token {token}\n"))?;
    Ok(path.display().to_string())
}
