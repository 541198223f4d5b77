//! Monotonic fencing IDs from a majority of the nodes: several concurrent callers, and a
//! check that IDs taken one after another only grow.
//!
//! Run against the docker-compose nodes with `scripts/demo.sh`, or
//! `REDQUORUM_NODES=redis://h1:6379,redis://h2:6379,redis://h3:6379 cargo run --example fencing_ids`.
//! (Set the cluster up once first: `redquorum --nodes ... cluster init`.)

use redquorum::{Client, Config, IdGenerator};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let client = Client::connect(Config::from_env()?).await?;
    let invoices = IdGenerator::new(&client, "example:invoices")?;

    let first = invoices.next_id().await?;
    let block = invoices.next_ids(5).await?;
    println!("one ID: {first}; then five consecutive: {block:?}");
    assert!(*block.start() > first, "a later call gets larger IDs");

    // 100 concurrent callers share rounds (group commit): far fewer quorum rounds than IDs.
    let started = std::time::Instant::now();
    let calls = (0..100).map(|_| {
        let g = invoices.clone();
        tokio::spawn(async move { g.next_id().await })
    });
    let mut ids = Vec::new();
    for c in calls {
        ids.push(c.await??);
    }
    ids.sort_unstable();
    ids.dedup();
    println!(
        "100 concurrent callers got {} distinct IDs in {:.1} ms, all above {}",
        ids.len(),
        started.elapsed().as_secs_f64() * 1e3,
        block.end()
    );
    assert!(ids[0] > *block.end());
    Ok(())
}
