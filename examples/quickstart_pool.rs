//! The README's quickstart, as a runnable example (a test keeps the two the same text).
//! `REDQUORUM_NODES=... cargo run --example quickstart_pool`; `scripts/demo.sh` runs it.

use redquorum::{Client, Config, PoolMember, PoolOptions, Units, ViewState};

#[tokio::main]
async fn main() -> Result<(), redquorum::Error> {
    let client = Client::connect(Config::from_env()?).await?;
    let sites = [
        "news.example.com".to_string(),
        "shop.example.com".to_string(),
    ];
    Units::new(&client, "parsers")?.add(&sites).await?;

    let me = PoolMember::join(&client, "parsers", "parser-a", PoolOptions::default()).await?;
    let mut changes = me.changes();
    let mut acted_on = None;
    loop {
        let table = changes.borrow_and_update().clone();
        if let Some(table) = table.filter(|t| t.state == ViewState::Active) {
            if acted_on != Some(table.token) {
                acted_on = Some(table.token); // a new table: start what is mine, stop the rest
                println!("token {}: I parse {:?}", table.token, me.units());
            }
        }
        if changes.changed().await.is_err() {
            return Ok(());
        }
    }
}
