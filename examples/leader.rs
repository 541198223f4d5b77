//! Leader election: two candidates, an observer, a resignation and an instant hand-over.
//!
//! Run against the docker-compose nodes with `scripts/demo.sh`, or with `REDQUORUM_NODES` set
//! (after the one `redquorum cluster init` that sets the cluster up):
//! `cargo run --example leader`.

use std::time::Duration;

use futures::StreamExt;
use redquorum::{Client, Config, Election, LeaderInfo};

/// What the observer's stream said, as a person reads it.
fn seen(change: Option<Option<LeaderInfo>>) -> String {
    match change {
        None => "the stream ended".to_string(),
        Some(None) => "no leader".to_string(),
        Some(Some(leader)) => format!("{} leads in term {}", leader.candidate, leader.term),
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let config = Config::from_env()?;
    let name = format!("example:leader-{}", std::process::id());
    let ttl = Duration::from_secs(5);
    let a = Election::new(
        &Client::connect(config.clone()).await?,
        &name,
        ttl,
        "candidate-a",
    )?;
    let b = Election::new(
        &Client::connect(config.clone()).await?,
        &name,
        ttl,
        "candidate-b",
    )?;
    let watcher = Election::new(&Client::connect(config).await?, &name, ttl, "watcher")?;
    let mut changes = Box::pin(watcher.observe(Duration::from_millis(500)));
    println!("observer: {}", seen(changes.next().await));

    let lead = a.campaign().await?;
    println!("candidate-a leads with term {}", lead.term());
    println!("observer: {}", seen(changes.next().await));

    let waiting = tokio::spawn(async move { b.campaign().await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let resigned = std::time::Instant::now();
    lead.resign().await?;
    let lead_b = waiting.await??;
    println!(
        "candidate-b leads with term {} ({:.1} ms after the resignation)",
        lead_b.term(),
        resigned.elapsed().as_secs_f64() * 1e3
    );
    lead_b.resign().await?;
    Ok(())
}
