//! The README's quickstart, as a runnable example (a test keeps the two the same text).
//! `REDQUORUM_NODES=... cargo run --example quickstart_lock`; `scripts/demo.sh` runs it.

use redquorum::{fenced_set, Client, Config, FencedWrite, Lock};
use std::time::Duration;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let client = Client::connect(Config::from_env()?).await?;
    let resource = redis::Client::open("redis://127.0.0.1:7004")?; // the data you protect
    let mut conn = resource.get_multiplexed_async_connection().await?;

    let lock = Lock::new(&client, "account-42", Duration::from_secs(10))?;
    // Waits up to 5 s for the lease, runs the closure while it holds (extended every TTL/3),
    // cancels the closure if the lease is lost, then releases.
    let verdict = lock
        .run(Duration::from_secs(5), |token, _lost| async move {
            fenced_set(&mut conn, "balance:42", "balance:42:fence", token, b"100").await
        })
        .await??;
    match verdict {
        FencedWrite::Applied => println!("written"),
        FencedWrite::Stale { highest } => println!("refused: token {highest} wrote since"),
    }
    Ok(())
}
