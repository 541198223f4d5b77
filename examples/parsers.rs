//! Work distribution, the seed's website-parser case: websites to parse are the units of a
//! pool; parser services join with weights, each parses only the sites it owns (with the
//! table's version as its fencing token), and the sites move with a fenced hand-over when a
//! parser leaves or a site is added.
//!
//! Run against the docker-compose nodes with `scripts/demo.sh`, or with `REDQUORUM_NODES` set
//! (after the one `redquorum cluster init` that sets the cluster up):
//! `cargo run --example parsers`.

use std::sync::Arc;
use std::time::Duration;

use redquorum::{pool_table, Client, Config, Drain, DrainHook, PoolMember, PoolOptions, Units};

/// A parser service: a pool member whose drain hook stops the sites it gives up.
async fn parser(
    config: &Config,
    pool: &str,
    id: &str,
    weight: u32,
) -> Result<PoolMember, Box<dyn std::error::Error>> {
    let name = id.to_string();
    let stop: DrainHook = Arc::new(move |d: Drain| {
        let sites = d.units_given_up();
        if !sites.is_empty() {
            println!("  {name}: stops parsing {}", sites.join(", "));
        }
        Box::pin(async {})
    });
    let opts = PoolOptions::default()
        .with_interval(Duration::from_millis(500))
        .with_weight(weight)
        .with_drain(Duration::from_secs(1), stop);
    Ok(PoolMember::join(&Client::connect(config.clone()).await?, pool, id, opts).await?)
}

/// Wait until the parsers own every site between them under one active table.
async fn settled(parsers: &[&PoolMember], sites: usize) {
    for _ in 0..200 {
        let owned: usize = parsers.iter().map(|p| p.units().len()).sum();
        let versions: std::collections::BTreeSet<_> = parsers
            .iter()
            .map(|p| {
                p.assignment()
                    .map(|a| (a.token, a.state == redquorum::ViewState::Active))
            })
            .collect();
        if owned == sites && versions.len() == 1 && versions.iter().all(|v| v.is_some_and(|v| v.1))
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn show(parsers: &[&PoolMember]) {
    for p in parsers {
        let token = p.assignment().map(|a| a.token.get()).unwrap_or(0);
        let sites: Vec<String> = p.units().into_iter().collect();
        println!("  {} (token {token}): {}", p.id(), sites.join(", "));
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let config = Config::from_env()?;
    let client = Client::connect(config.clone()).await?;
    let pool = format!("example:parsers-{}", std::process::id());
    let units = Units::new(&client, &pool)?;
    let mut sites: Vec<String> = [
        "news", "shop", "blog", "docs", "wiki", "forum", "maps", "mail",
    ]
    .iter()
    .map(|s| format!("{s}.example.com"))
    .collect();
    units.add(&sites).await?;

    let a = parser(&config, &pool, "parser-a", 1).await?;
    let b = parser(&config, &pool, "parser-b", 1).await?;
    let c = parser(&config, &pool, "parser-c", 2).await?;
    settled(&[&a, &b, &c], sites.len()).await;
    println!(
        "three parsers (weights 1, 1, 2) share {} sites:",
        sites.len()
    );
    show(&[&a, &b, &c]);

    println!("a site is added (no other site moves):");
    sites.push("video.example.com".into());
    units.add(&sites[sites.len() - 1..]).await?;
    settled(&[&a, &b, &c], sites.len()).await;
    show(&[&a, &b, &c]);

    println!("parser-b leaves: only its sites move, after it stopped them:");
    b.leave().await;
    settled(&[&a, &c], sites.len()).await;
    show(&[&a, &c]);

    let table = pool_table(&client, &pool).await?;
    println!("the table as `redquorum dist table` prints it:");
    for (member, units) in &table.members {
        let units: Vec<&str> = units.iter().map(String::as_str).collect();
        println!("  {member}:{}", units.join(","));
    }
    a.leave().await;
    c.leave().await;
    units.remove(&sites).await?;
    Ok(())
}
