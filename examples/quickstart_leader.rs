//! The README's quickstart, as a runnable example (a test keeps the two the same text).
//! `REDQUORUM_NODES=... cargo run --example quickstart_leader`; `scripts/demo.sh` runs it.

use redquorum::{CancellationToken, Client, Config, Election};
use std::time::Duration;

#[tokio::main]
async fn main() -> Result<(), redquorum::Error> {
    let client = Client::connect(Config::from_env()?).await?;
    let election = Election::new(&client, "scheduler", Duration::from_secs(5), "host-a")?;
    let shutdown = CancellationToken::new();
    let on_signal = shutdown.clone();
    tokio::spawn(async move {
        let _ = tokio::signal::ctrl_c().await;
        on_signal.cancel();
    });
    election
        .lead(shutdown, |term, lost| async move {
            println!("leading in term {term}"); // the term is this leader's fencing token
            lost.cancelled().await;
        })
        .await?;
    Ok(())
}
