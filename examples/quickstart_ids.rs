//! The README's quickstart, as a runnable example (a test keeps the two the same text).
//! `REDQUORUM_NODES=... cargo run --example quickstart_ids`; `scripts/demo.sh` runs it.

use redquorum::{Client, Config, IdGenerator};

#[tokio::main]
async fn main() -> Result<(), redquorum::Error> {
    let client = Client::connect(Config::from_env()?).await?;
    let invoices = IdGenerator::new(&client, "invoices")?;
    let id = invoices.next_id().await?;
    println!("invoice number {id}");
    Ok(())
}
