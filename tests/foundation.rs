//! The foundation against real Redis nodes: majorities under node loss, a frozen node's
//! cost, safety findings and strict-mode exclusion, duplicate servers, password redaction.

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

mod common;

use std::time::Duration;

use common::{client, eventually, init_tracing, ms, percentile};
use redquorum::Finding;
use redquorum::{Client, Config, Error, NodeId, NodeOutcome, SafetyMode, UnknownCause};
use redquorum_testkit::{Cluster, NodeSpec};
use tokio::time::Instant;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_nodes_work_with_two_killed_and_name_each_problem_with_three() {
    init_tracing();
    let cluster = Cluster::start(5).await;
    let client = client(&cluster.urls()).await;
    client
        .ping()
        .await
        .expect("all five nodes up: ping must reach a majority");

    // Two of five down: a majority of three is still there.
    cluster.node(0).kill().await;
    cluster.node(1).kill().await;
    let tally = client
        .ping()
        .await
        .expect("two of five killed: three still form a majority");
    assert_eq!(tally.applied(), 3, "the three live nodes answer");

    // A third down: no majority, and the error names every node that did not count.
    cluster.node(2).kill().await;
    let err = client
        .ping()
        .await
        .expect_err("three of five killed: no majority is possible");
    let Error::NoQuorum(q) = &err else {
        panic!("expected NoQuorum, got {err}")
    };
    assert_eq!((q.needed, q.nodes), (3, 5), "{err}");
    assert!(q.applied <= 2, "only two nodes are alive: {err}");
    let named: Vec<NodeId> = q.problems.iter().map(|p| p.node).collect();
    for dead in [NodeId(0), NodeId(1), NodeId(2)] {
        assert!(named.contains(&dead), "the error must name {dead}: {err}");
    }
    for p in q.problems.iter().filter(|p| p.node.0 < 3) {
        assert!(
            p.problem.contains("unreachable")
                || p.problem.contains("connection")
                || p.problem.contains("refused"),
            "{} should say why it did not answer, says: {}",
            p.node,
            p.problem
        );
    }
    println!("error with three nodes down: {err}");

    // They come back: the same client recovers without being rebuilt.
    for i in 0..3 {
        cluster.node(i).restart().await;
    }
    eventually(
        Duration::from_secs(10),
        "ping succeeds again after the nodes restart",
        || async { client.ping().await.is_ok() },
    )
    .await;
    eventually(
        Duration::from_secs(10),
        "all five nodes vote again",
        || async { client.check().await.iter().all(|r| r.votes) },
    )
    .await;
}

async fn ping_latencies(client: &Client, rounds: usize) -> Vec<Duration> {
    let mut samples = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let start = Instant::now();
        client.ping().await.expect("a majority is up");
        samples.push(start.elapsed());
    }
    samples
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_node_does_not_slow_a_majority_operation() {
    init_tracing();
    let cluster = Cluster::start(5).await;
    let node_timeout = Duration::from_millis(250);
    let config = Config::from_urls(cluster.urls())
        .expect("valid")
        .with_node_timeout(node_timeout);
    let client = common::connect(config).await.expect("valid config");
    ping_latencies(&client, 20).await; // warm up

    let mut healthy = ping_latencies(&client, 200).await;
    cluster.node(4).freeze().await;
    let mut frozen = ping_latencies(&client, 200).await;
    cluster.node(4).thaw().await;

    let (h50, h99) = (
        percentile(&mut healthy, 50.0),
        percentile(&mut healthy, 99.0),
    );
    let (f50, f99) = (percentile(&mut frozen, 50.0), percentile(&mut frozen, 99.0));
    println!(
        "quorum PING, 5 nodes: healthy p50 {} p99 {}; one node frozen p50 {} p99 {}",
        ms(h50),
        ms(h99),
        ms(f50),
        ms(f99)
    );
    assert!(
        f50 < h50 + Duration::from_millis(5),
        "with one node frozen the median must stay near the healthy {} (got {}): the fan-out must not wait for it",
        ms(h50),
        ms(f50)
    );
    assert!(
        f99 < node_timeout,
        "no operation may wait out the frozen node's deadline (p99 {})",
        ms(f99)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_majority_that_needs_the_frozen_node_costs_exactly_its_deadline() {
    init_tracing();
    let cluster = Cluster::start(3).await;
    let node_timeout = Duration::from_millis(200);
    let config = Config::from_urls(cluster.urls())
        .expect("valid")
        .with_node_timeout(node_timeout)
        .with_connect_timeout(node_timeout);
    let client = common::connect(config).await.expect("valid config");
    client.ping().await.expect("healthy");

    cluster.node(1).kill().await;
    cluster.node(2).freeze().await;
    let start = Instant::now();
    let err = client
        .ping()
        .await
        .expect_err("one killed and one frozen of three: no majority");
    let took = start.elapsed();
    cluster.node(2).thaw().await;
    println!("failed quorum with a frozen node took {}: {err}", ms(took));
    assert!(
        took >= node_timeout - Duration::from_millis(5),
        "it must wait for the frozen node's deadline ({})",
        ms(took)
    );
    assert!(
        took < node_timeout + Duration::from_millis(100),
        "but not much longer ({})",
        ms(took)
    );
    let Error::NoQuorum(q) = err else {
        panic!("expected NoQuorum")
    };
    let frozen = q
        .problems
        .iter()
        .find(|p| p.node == NodeId(2))
        .expect("node2 is named");
    assert!(
        frozen.problem.contains("deadline") || frozen.problem.contains("timed out"),
        "{}",
        frozen.problem
    );
    assert!(
        q.maybe_applied_somewhere,
        "a timeout is 'unknown', never 'not applied'"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unsafe_nodes_are_reported_and_do_not_vote_in_strict_mode() {
    init_tracing();
    let cluster = Cluster::start_with(vec![
        NodeSpec::safe(),
        NodeSpec::safe(),
        NodeSpec::with_args(&["--appendfsync", "everysec"]),
        NodeSpec::with_args(&["--appendonly", "no"]),
        NodeSpec::with_args(&["--maxmemory-policy", "volatile-lru"]),
    ])
    .await;
    let client = client(&cluster.urls()).await;
    let reports = client.check().await;
    for r in &reports {
        println!("{} {} votes={} {}", r.node, r.url, r.votes, r.summary());
    }
    assert!(
        reports[0].is_safe() && reports[0].votes && reports[1].votes,
        "the two safe nodes vote"
    );
    assert!(
        reports[2]
            .findings
            .contains(&Finding::FsyncNotAlways("everysec".into())),
        "{}",
        reports[2].summary()
    );
    assert!(
        reports[3].findings.contains(&Finding::AofDisabled),
        "{}",
        reports[3].summary()
    );
    assert!(
        reports[4]
            .findings
            .contains(&Finding::EvictionPolicy("volatile-lru".into())),
        "{}",
        reports[4].summary()
    );
    for r in &reports[2..] {
        assert!(
            !r.is_safe() && !r.votes,
            "{} is unsafe and must not vote: {}",
            r.node,
            r.summary()
        );
    }

    // Two voters of five: strict mode refuses a majority and says why for each node.
    let err = client
        .ping()
        .await
        .expect_err("only two of five nodes may vote");
    let text = err.to_string();
    assert!(
        text.contains("excluded from quorums: appendfsync everysec"),
        "{text}"
    );
    assert!(text.contains("AOF disabled"), "{text}");
    assert!(text.contains("volatile-lru"), "{text}");
    let Error::NoQuorum(q) = err else {
        panic!("expected NoQuorum")
    };
    for p in q.problems.iter().filter(|p| p.node.0 >= 2) {
        assert!(
            p.problem.starts_with("excluded from quorums"),
            "{} must be excluded, not asked: {}",
            p.node,
            p.problem
        );
    }

    // The development opt-out lets them vote (and says it is unsafe).
    let permissive = Config::from_urls(cluster.urls())
        .expect("valid")
        .with_safety(SafetyMode::Permissive);
    assert!(permissive
        .warnings()
        .iter()
        .any(|w| w.contains("no guarantee")));
    let loose = common::connect(permissive).await.expect("valid");
    loose
        .ping()
        .await
        .expect("permissive mode counts every reachable node");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_urls_reaching_one_server_are_counted_once() {
    init_tracing();
    let cluster = Cluster::start(3).await;
    // node0 twice: once through its proxy, once straight to its container port.
    let urls = vec![
        cluster.node(0).url(),
        cluster.node(1).url(),
        cluster.node(0).direct_url(),
    ];
    let client = client(&urls).await;
    let reports = client.check().await;
    assert!(
        reports[0].votes && reports[1].votes,
        "{} / {}",
        reports[0].summary(),
        reports[1].summary()
    );
    assert!(
        reports[2]
            .findings
            .contains(&Finding::SameServerAs(NodeId(0))),
        "the second URL to node0 must be detected: {}",
        reports[2].summary()
    );
    assert!(!reports[2].votes, "a server may not vote twice");
    let tally = client
        .ping()
        .await
        .expect("two distinct servers of three are a majority");
    assert_eq!(tally.applied(), 2, "the duplicate does not count");
    assert!(matches!(
        tally.results()[2].outcome,
        NodeOutcome::Unknown(UnknownCause::Excluded(_))
            | NodeOutcome::Unknown(UnknownCause::Abandoned)
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_is_noticed_by_run_id() {
    init_tracing();
    let cluster = Cluster::start(3).await;
    let client = client(&cluster.urls()).await;
    let before = client.check().await;
    cluster.node(1).kill_and_restart().await;
    eventually(
        Duration::from_secs(10),
        "the restart of node1 shows in the check",
        || async {
            client.check().await[1]
                .findings
                .iter()
                .any(|f| matches!(f, Finding::Restarted { .. }))
        },
    )
    .await;
    let after = client.check().await;
    let run_id = |r: &redquorum::NodeReport| r.probe.as_ref().and_then(|p| p.run_id.clone());
    assert_ne!(
        run_id(&before[1]),
        run_id(&after[1]),
        "run_id changes on restart"
    );
    assert_eq!(
        run_id(&before[0]),
        run_id(&after[0]),
        "node0 did not restart"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unverifiable_fsync_policy_is_never_reported_ok() {
    init_tracing();
    let cluster = Cluster::start(3).await;
    for node in cluster.nodes() {
        let mut con = node.direct_connection().await;
        redis::cmd("ACL")
            .arg(&[
                "SETUSER",
                "app",
                "on",
                ">app-pw-123",
                "~*",
                "+@all",
                "-config",
            ])
            .query_async::<()>(&mut con)
            .await
            .expect("create a user without CONFIG");
    }
    let urls: Vec<String> = cluster
        .nodes()
        .iter()
        .map(|n| n.url().replace("redis://", "redis://app:app-pw-123@"))
        .collect();
    let client = client(&urls).await;
    let reports = client.check().await;
    for r in &reports {
        assert!(
            matches!(r.findings.as_slice(), [Finding::FsyncUnverified(_)]),
            "{}: {}",
            r.node,
            r.summary()
        );
        assert!(!r.votes, "unverified is not OK in strict mode");
    }
    let attested = Config::from_urls(&urls)
        .expect("valid")
        .with_fsync_always_attested(true);
    let client = common::connect(attested).await.expect("valid");
    for r in client.check().await {
        assert!(
            r.votes,
            "an operator attestation lets the node vote: {}",
            r.summary()
        );
        assert_eq!(r.findings, vec![Finding::FsyncAttested]);
    }
    client.ping().await.expect("attested nodes vote");
}

/// Collects everything logged at TRACE level on this thread.
#[derive(Clone, Default)]
struct LogCapture(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for LogCapture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("log buffer").extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

// Single-threaded so that every task logs into this test's capturing subscriber.
#[tokio::test(flavor = "current_thread")]
async fn passwords_never_appear_in_display_debug_logs_or_errors() {
    let logs = LogCapture::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_writer(move || writer.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    const PW: &str = "Sup3r-Secret-Pw";
    let cluster = Cluster::start_with(vec![
        NodeSpec::with_args(&["--requirepass", PW]),
        NodeSpec::with_args(&["--requirepass", PW]),
        NodeSpec::with_args(&["--requirepass", PW]),
    ])
    .await;
    let with_pw = |u: String| u.replace("redis://", &format!("redis://default:{PW}@"));
    let mut urls: Vec<String> = cluster.nodes().iter().map(|n| with_pw(n.url())).collect();
    let config = Config::from_urls(&urls).expect("valid");
    let client = common::connect(config.clone()).await.expect("valid");
    client.ping().await.expect("the right password works");
    let reports = client.check().await;

    // A wrong password on one node and an unreachable node with a password in its URL.
    urls[1] = cluster
        .node(1)
        .url()
        .replace("redis://", "redis://default:Wr0ng-Passw0rd@");
    urls[2] = with_pw("redis://127.0.0.1:1".into());
    let bad = common::connect(Config::from_urls(&urls).expect("valid"))
        .await
        .expect("valid");
    let err = bad.ping().await.expect_err("one good node of three");
    let bad_reports = bad.check().await;
    let malformed =
        Config::from_urls([format!("redis://default:{PW}@host:notaport")]).expect_err("bad port");

    let logged = String::from_utf8_lossy(&logs.0.lock().expect("log buffer")).into_owned();
    assert!(
        logged.contains("quorum"),
        "the capture saw the quorum spans: {logged}"
    );
    let everything = format!(
        "{logged} {config:?} {client:?} {reports:?} {err} {err:?} {bad_reports:?} {malformed} {malformed:?} {}",
        reports.iter().map(|r| r.summary()).collect::<Vec<_>>().join(" ")
    );
    for secret in [PW, "Wr0ng-Passw0rd"] {
        assert!(
            !everything.contains(secret),
            "a password leaked: {everything}"
        );
    }
    assert!(
        everything.contains("default:***@"),
        "URLs are shown redacted: {everything}"
    );
}
