//! Helpers shared by the integration tests: logging, waiting on conditions, percentiles.
#![allow(dead_code, unreachable_pub)]

use std::future::Future;
use std::time::Duration;

use redquorum::{Client, Config};
use tokio::time::Instant;

/// Log to the test's output (shown on failure) at the level in RUST_LOG, default warn.
pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_test_writer()
        .try_init();
}

/// A client over `urls` with the test defaults (strict mode, 250 ms per node).
pub async fn client(urls: &[String]) -> Client {
    connect(config_from_urls(urls).expect("test URLs are valid"))
        .await
        .expect("test config is valid")
}

/// `Client::connect`, after `Client::init_cluster` the first time this process meets the
/// node list, as an operator runs `redquorum cluster init` once before the first client (its
/// refusals are left to `connect` to report). A
/// later connect (after a wipe of every node, say) is a plain `Client::connect`: it refuses
/// blank nodes. Tests of set-up itself call `Client::connect` and `Client::init_cluster`.
pub async fn connect(config: Config) -> Result<Client, redquorum::Error> {
    static SET_UP: std::sync::Mutex<Vec<Vec<String>>> = std::sync::Mutex::new(Vec::new());
    let mut list = config.node_names();
    list.sort();
    let first = {
        let mut set_up = SET_UP.lock().unwrap_or_else(|p| p.into_inner());
        let first = !set_up.contains(&list);
        if first {
            set_up.push(list);
        }
        first
    };
    if first {
        // Where it cannot set up (a node down, another cluster's nodes), `connect` says why.
        // A node of a just-started container may miss the first deadline on a loaded machine
        // (init needs every node): a few tries.
        for attempt in 1..=3 {
            match Client::init_cluster(config.clone()).await {
                Ok(_) => break,
                Err(e) => {
                    tracing::info!("cluster init before the first connect (try {attempt}): {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
                }
            }
        }
    }
    Client::connect(config).await
}

/// `Config::from_urls`, with the test PKI's CA and client certificate in secure mode
/// (`redquorum_testkit::secure`: the nodes serve TLS only, to the least-privilege user).
pub fn config_from_urls<I, S>(urls: I) -> Result<Config, redquorum::ConfigError>
where
    I: IntoIterator<Item = S>,
    S: AsRef<str>,
{
    let secure = redquorum_testkit::secure::secure();
    // In secure mode every node is TLS, the placeholders for nodes that never answer
    // (`redis://127.0.0.1:1`) too: TLS settings beside a plain node are refused.
    let urls: Vec<String> = urls
        .into_iter()
        .map(|u| match (secure, u.as_ref().strip_prefix("redis://")) {
            (Some(_), Some(rest)) => format!("rediss://{rest}"),
            _ => u.as_ref().to_string(),
        })
        .collect();
    let config = Config::from_urls(urls)?;
    match secure {
        // The printed ACL grants no CONFIG GET (it would read the admin password): the
        // operator attests the fsync policy, as the README says.
        Some(s) => Ok(config
            .with_ca_file(&s.pki.ca)?
            .with_client_cert(&s.pki.client.cert, &s.pki.client.key)?
            .with_fsync_always_attested(true)),
        None => Ok(config),
    }
}

/// Poll `check` every 50 ms until it returns true, or panic with `what` after `limit`.
pub async fn eventually<F, Fut>(limit: Duration, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let start = Instant::now();
    while start.elapsed() < limit {
        if check().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{what}: still not true after {limit:?}");
}

/// The `p`-th percentile (0..=100) of `samples` (sorted in place).
pub fn percentile(samples: &mut [Duration], p: f64) -> Duration {
    assert!(!samples.is_empty(), "no samples to take a percentile of");
    samples.sort();
    let rank = ((p / 100.0) * (samples.len() - 1) as f64).round() as usize;
    samples[rank]
}

/// Milliseconds with two decimals, for printing.
pub fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

/// A history recorder for ID workloads: many callers on many generators, each call timed on
/// one monotonic clock.
pub mod workload {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use redquorum::IdGenerator;
    use redquorum_testkit::checker::IdCall;

    /// What a workload observed.
    #[derive(Debug, Default)]
    pub struct Observed {
        pub calls: Vec<IdCall>,
        pub ids: u64,
        pub errors: u64,
        pub first_error: Option<String>,
    }

    /// Run `callers` concurrent callers on each generator until `target_ids` IDs were returned
    /// or `limit` passed. Callers alternate between `next_id` and `next_ids(3)`.
    pub async fn run(
        gens: &[IdGenerator],
        callers: usize,
        target_ids: u64,
        limit: Duration,
    ) -> Observed {
        let calls = Arc::new(Mutex::new(Vec::new()));
        let ids = Arc::new(AtomicU64::new(0));
        let errors = Arc::new(AtomicU64::new(0));
        let first_error = Arc::new(Mutex::new(None));
        let stop = Arc::new(AtomicBool::new(false));
        let started = std::time::Instant::now();
        let mut tasks = Vec::new();
        for (g, gen) in gens.iter().enumerate() {
            for c in 0..callers {
                let (gen, calls, ids, errors, first_error, stop) = (
                    gen.clone(),
                    calls.clone(),
                    ids.clone(),
                    errors.clone(),
                    first_error.clone(),
                    stop.clone(),
                );
                tasks.push(tokio::spawn(async move {
                    let mut n = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        n += 1;
                        let start = std::time::Instant::now();
                        let result = if n.is_multiple_of(2) {
                            gen.next_ids(3).await.map(|r| r.collect::<Vec<_>>())
                        } else {
                            gen.next_id().await.map(|i| vec![i])
                        };
                        let end = std::time::Instant::now();
                        match result {
                            Ok(got) => {
                                let total = ids.fetch_add(got.len() as u64, Ordering::Relaxed)
                                    + got.len() as u64;
                                calls.lock().expect("history").push(IdCall {
                                    who: format!("gen{g}/caller{c}"),
                                    start,
                                    end,
                                    ids: got,
                                });
                                if total >= target_ids || started.elapsed() > limit {
                                    stop.store(true, Ordering::Relaxed);
                                }
                            }
                            Err(e) => {
                                errors.fetch_add(1, Ordering::Relaxed);
                                first_error
                                    .lock()
                                    .expect("error")
                                    .get_or_insert_with(|| e.to_string());
                                if started.elapsed() > limit {
                                    stop.store(true, Ordering::Relaxed);
                                }
                                tokio::time::sleep(Duration::from_millis(20)).await;
                            }
                        }
                    }
                }));
            }
        }
        for t in tasks {
            t.await.expect("a caller task panicked");
        }
        let calls = std::mem::take(&mut *calls.lock().expect("history"));
        let first_error = first_error.lock().expect("error").clone();
        Observed {
            calls,
            ids: ids.load(Ordering::Relaxed),
            errors: errors.load(Ordering::Relaxed),
            first_error,
        }
    }
}

/// The node's run_id, read directly.
pub async fn run_id(node: &redquorum_testkit::TestNode) -> String {
    let mut con = node.direct_connection().await;
    let info: String = redis::cmd("INFO")
        .arg("server")
        .query_async(&mut con)
        .await
        .expect("INFO server");
    info.lines()
        .find_map(|l| l.strip_prefix("run_id:"))
        .map(|s| s.trim().to_string())
        .expect("INFO server has a run_id")
}

/// Wait until some client has repaired the node (its marker names its current run_id).
pub async fn wait_repaired(node: &redquorum_testkit::TestNode, trigger: &Client) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        // Any voting operation notices a quarantined node and repairs it.
        let _ = trigger.ping().await;
        let id = run_id(node).await;
        let mut con = node.direct_connection().await;
        let marker: Option<String> = redis::cmd("GET")
            .arg("rq:marker")
            .query_async(&mut con)
            .await
            .expect("GET marker");
        // The marker is "<run_id>.<epoch>/<cluster id>".
        let run = |m: &str| m.split(['/', '.']).next().map(str::to_string);
        if marker.is_some_and(|m| run(&m).as_deref() == Some(id.as_str())) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "node {} was not repaired within 20 s",
            node.index()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// One of the library's Lua scripts as the client sends it (the prelude first), for tests
/// that play another process's client by hand: `script(include_str!("../src/scripts/x.lua"))`.
pub fn script(body: &str) -> redis::Script {
    redis::Script::new(&format!(
        "{}{}",
        include_str!("../../src/scripts/prelude.lua"),
        body
    ))
}

/// Script calls a node has run (`EVALSHA`), from `INFO commandstats`.
pub async fn evalsha_calls(node: &redquorum_testkit::TestNode) -> u64 {
    let mut con = node.direct_connection().await;
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut con)
        .await
        .expect("INFO");
    info.lines()
        .find_map(|l| l.strip_prefix("cmdstat_evalsha:calls="))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// The keys matching `pattern` on one node (one SCAN pass: the test nodes hold few keys).
pub async fn keys_matching(
    con: &mut redis::aio::MultiplexedConnection,
    pattern: &str,
) -> Vec<String> {
    let (_, keys): (u64, Vec<String>) = redis::cmd("SCAN")
        .arg(0)
        .arg("MATCH")
        .arg(pattern)
        .arg("COUNT")
        .arg(10_000)
        .query_async(con)
        .await
        .expect("SCAN");
    keys
}
