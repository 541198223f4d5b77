//! The seed's email-processing case study, done right: instances of an email sender share the
//! emails by peer index, scale up and down, and never send one email twice at the same time.
//! Each send is fenced with the assignment's token, so a stale instance's late send is refused
//! by the outbox.
//!
//! Run against the docker-compose nodes with `scripts/demo.sh`, or with `REDQUORUM_NODES` set
//! (after the one `redquorum cluster init` that sets the cluster up):
//! `cargo run --example email_processor`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redquorum::{Client, Config};
use redquorum::{GroupOptions, Member, Ownership};

const EMAILS: u64 = 60;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let config = Config::from_env()?;
    let group = format!("example:email-processor-{}", std::process::id());
    let opts = GroupOptions::default()
        .with_interval(Duration::from_millis(500))
        .with_ownership(Ownership::Buckets { count: 64 });
    // The "outbox": who sent each email, with which fencing token. A real outbox would be a
    // table with `WHERE fence <= $token` (see redquorum::fencing).
    let outbox: Arc<Mutex<HashMap<u64, (String, u64)>>> = Arc::default();

    let mut instances = Vec::new();
    for i in 0..3 {
        let client = Client::connect(config.clone()).await?;
        instances.push(Member::join(&client, &group, &format!("sender-{i}"), opts.clone()).await?);
    }
    wait_for_replicas(&instances, 3).await;
    send_round(&instances, &outbox, 0..EMAILS / 2);
    print_assignments("three senders", &instances);

    // Scale up: a fourth instance joins; the transition drains and hands over ~1/4 of the buckets.
    let client = Client::connect(config.clone()).await?;
    instances.push(Member::join(&client, &group, "sender-3", opts.clone()).await?);
    wait_for_replicas(&instances, 4).await;
    send_round(&instances, &outbox, EMAILS / 2..EMAILS);
    print_assignments("after scaling to four", &instances);

    let sent = outbox.lock().map_err(|_| "outbox poisoned")?.clone();
    assert_eq!(sent.len() as u64, EMAILS, "every email sent exactly once");
    let mut per_sender: HashMap<&str, usize> = HashMap::new();
    for (sender, _) in sent.values() {
        *per_sender.entry(sender.as_str()).or_default() += 1;
    }
    println!(
        "{} emails sent exactly once; per sender: {per_sender:?}",
        sent.len()
    );
    for m in instances {
        m.leave().await;
    }
    Ok(())
}

/// Each instance sends the emails it owns now, fenced by its assignment's token.
fn send_round(
    instances: &[Member],
    outbox: &Mutex<HashMap<u64, (String, u64)>>,
    emails: std::ops::Range<u64>,
) {
    for email in emails {
        for m in instances {
            if let Some(a) = m.assignment().filter(|a| a.owns(email)) {
                let mut sent = outbox.lock().unwrap_or_else(|p| p.into_inner());
                match sent.get(&email) {
                    Some((_, token)) if *token > a.token.get() => {
                        println!("email {email}: stale sender {} refused", m.id())
                    }
                    Some(_) => {}
                    None => {
                        sent.insert(email, (m.id().to_string(), a.token.get()));
                    }
                }
            }
        }
    }
}

async fn wait_for_replicas(instances: &[Member], n: u32) {
    for _ in 0..200 {
        if instances
            .iter()
            .all(|m| m.assignment().is_some_and(|a| a.replicas == n))
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    println!("warning: the group did not settle on {n} members in 5 s");
}

fn print_assignments(label: &str, instances: &[Member]) {
    println!("{label}:");
    for m in instances {
        match m.assignment() {
            Some(a) => println!(
                "  {} index={} replicas={} token={}",
                m.id(),
                a.index,
                a.replicas,
                a.token
            ),
            None => println!("  {} (no assignment)", m.id()),
        }
    }
}
