//! The leader loop as a service writes it (`Election::lead`): two instances run it; the
//! leader's work runs for its term until it is told to stop; when the leader shuts down it
//! resigns, and the other instance leads at once in a higher term.
//!
//! Run against the docker-compose nodes with `scripts/demo.sh`, or with `REDQUORUM_NODES` set
//! (after the one `redquorum cluster init` that sets the cluster up):
//! `cargo run --example leader_loop`.

use std::time::Duration;

use redquorum::{Client, Config, Election, FencingToken};
use tokio_util::sync::CancellationToken;

/// The leader's work: a tick per 200 ms, with the term (a real service would write to a
/// fenced resource with it), until its token is cancelled (shutdown or loss of leadership).
async fn schedule(instance: &'static str, term: FencingToken, stop: CancellationToken) {
    println!("{instance}: leading in term {term}");
    let mut ticks = 0u32;
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tokio::time::sleep(Duration::from_millis(200)) => ticks += 1,
        }
    }
    println!("{instance}: term {term} ends after {ticks} ticks");
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let config = Config::from_env()?;
    let name = format!("example:leader-loop-{}", std::process::id());
    let ttl = Duration::from_secs(5);
    let mut instances = Vec::new();
    for instance in ["instance-a", "instance-b"] {
        let client = Client::connect(config.clone()).await?;
        let election = Election::new(&client, &name, ttl, instance)?;
        // A service cancels this on SIGTERM.
        let shutdown = CancellationToken::new();
        let task = tokio::spawn({
            let shutdown = shutdown.clone();
            async move {
                election
                    .lead(shutdown, |term, stop| schedule(instance, term, stop))
                    .await
            }
        });
        instances.push((instance, shutdown, task));
        // The first instance leads; the second waits as a candidate.
        tokio::time::sleep(Duration::from_millis(700)).await;
    }

    // The leader shuts down: its work ends, it resigns, and the other instance leads at once.
    let (first, shutdown, task) = instances.remove(0);
    let stopped = std::time::Instant::now();
    shutdown.cancel();
    let summary = task.await??;
    println!(
        "{first}: shut down after {} term(s), resigned in {:.1} ms",
        summary.terms,
        stopped.elapsed().as_secs_f64() * 1e3
    );
    tokio::time::sleep(Duration::from_millis(700)).await;
    let (second, shutdown, task) = instances.remove(0);
    shutdown.cancel();
    let summary = task.await??;
    println!("{second}: shut down after {} term(s)", summary.terms);
    Ok(())
}
