//! The seed's daily job, done right: several instances of a service all try to run today's
//! report; exactly one runs it, records completion with its fencing token on a majority, and
//! the others (and any later fail-over) see it as done.
//!
//! Run against the docker-compose nodes with `scripts/demo.sh`, or
//! `REDQUORUM_NODES=redis://h1:6379,redis://h2:6379,redis://h3:6379 cargo run --example daily_job`.
//! (Set the cluster up once first: `redquorum --nodes ... cluster init`.)

use std::time::Duration;

use redquorum::{Client, Config, JobOutcome, PeriodicJob};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let config = Config::from_env()?;
    // A period unique to this run, so the demo can be run again; a real service would use the
    // date, e.g. "2026-11-22".
    let period = format!(
        "demo-{}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_millis()
    );

    let mut instances = Vec::new();
    for instance in 0..3 {
        let client = Client::connect(config.clone()).await?;
        let period = period.clone();
        instances.push(tokio::spawn(async move {
            let job = PeriodicJob::new(&client, "example:daily-report", Duration::from_secs(5))?;
            // Every instance tries; the one holding the job's lease runs it if not done yet.
            let outcome = job
                .run_period_infallible(
                    &period,
                    Duration::from_secs(2),
                    |token, _cancel| async move {
                        // Real work would write with `token` to a fenced resource.
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        format!("report built by instance {instance} with token {token}")
                    },
                )
                .await?;
            Ok::<_, redquorum::Error>((instance, outcome))
        }));
    }
    let mut ran = 0;
    for i in instances {
        let (instance, outcome) = i.await??;
        match &outcome {
            JobOutcome::Ran { output, .. } => {
                ran += 1;
                println!("instance {instance}: ran it: {output}");
            }
            JobOutcome::AlreadyDone { token } => {
                println!("instance {instance}: already done (token {token})")
            }
            JobOutcome::NotLeader => {
                println!("instance {instance}: another instance holds the job")
            }
        }
    }
    assert_eq!(ran, 1, "exactly one instance runs the period");
    println!("period {period}: run exactly once across 3 instances");
    Ok(())
}
