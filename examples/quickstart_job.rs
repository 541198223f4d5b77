//! The README's quickstart, as a runnable example (a test keeps the two the same text).
//! `REDQUORUM_NODES=... cargo run --example quickstart_job`; `scripts/demo.sh` runs it.

use redquorum::{Client, Config, JobOutcome, PeriodicJob};
use std::time::Duration;

#[tokio::main]
async fn main() -> Result<(), redquorum::Error> {
    let client = Client::connect(Config::from_env()?).await?;
    let job = PeriodicJob::new(&client, "nightly-report", Duration::from_secs(30))?;
    let outcome = job
        .run_period(
            "2026-11-27",
            Duration::from_secs(60),
            |token, _lost| async move { format!("report written with token {token}") },
        )
        .await?;
    match outcome {
        JobOutcome::Ran { output, .. } => println!("{output}"),
        JobOutcome::AlreadyDone { token } => println!("done already, by token {token}"),
        JobOutcome::NotLeader => println!("another instance is running it"),
    }
    Ok(())
}
