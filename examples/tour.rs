//! A tour of the foundation: connect to the nodes, check their safety, run a quorum PING.
//!
//! Run against the docker-compose nodes: `scripts/demo.sh`, or with your own nodes:
//! `REDQUORUM_NODES=redis://h1:6379,redis://h2:6379,redis://h3:6379 cargo run --example tour`.
//! (Set the cluster up once first: `redquorum --nodes ... cluster init`.)

use redquorum::{Client, Config};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let config = Config::from_env()?;
    let client = Client::connect(config).await?;
    println!(
        "{} nodes configured; a majority is {}; {} may fail",
        client.majority().nodes(),
        client.majority().needed(),
        client.majority().tolerated_failures()
    );
    for report in client.check().await {
        println!(
            "  {} {:<24} votes={:<5} {}",
            report.node,
            report.url,
            report.votes,
            report.summary()
        );
    }
    let tally = client.ping().await?;
    println!(
        "quorum PING: {} of {} answered in {:.2} ms",
        tally.applied(),
        tally.majority().nodes(),
        tally.elapsed().as_secs_f64() * 1e3
    );
    for r in tally.results() {
        let latency = r
            .latency
            .map(|l| format!("{:.2} ms", l.as_secs_f64() * 1e3))
            .unwrap_or_else(|| "-".into());
        println!("  {} {} {}", r.node, r.outcome.label(), latency);
    }
    Ok(())
}
