//! Metrics against real nodes, through a global `DebuggingRecorder` (this test binary is its own
//! process): quorum operations by kind and outcome, per-node outcomes, ID rounds and batch
//! sizes, a lease's acquisition, extension and loss with its reason, leadership won and
//! resigned, view changes and a drain, a wiped node's quarantine and repair.

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

mod common;

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use common::{eventually, init_tracing};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use redquorum::{Client, Config, Election, GroupOptions, IdGenerator, Lock, LossReason, Member};
use redquorum_testkit::Cluster;

/// The recorder's view, accumulated: a snapshot drains what it reads (counters and gauges are
/// swapped to zero, histograms cleared), so counters and gauges are the sums of the snapshots
/// (this library's gauge only moves by increments and decrements) and histograms keep every
/// sample.
struct Seen {
    snapshotter: Snapshotter,
    /// Rendered key (`name{k=v,...}`, labels sorted) to counter / gauge value so far.
    values: Mutex<HashMap<String, f64>>,
    /// Rendered key to the histogram samples seen so far.
    samples: Mutex<HashMap<String, Vec<f64>>>,
}

fn seen() -> &'static Seen {
    static SEEN: OnceLock<Seen> = OnceLock::new();
    SEEN.get_or_init(|| {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        recorder
            .install()
            .expect("the only recorder of this process");
        redquorum::describe_metrics();
        Seen {
            snapshotter,
            values: Mutex::default(),
            samples: Mutex::default(),
        }
    })
}

impl Seen {
    fn refresh(&self) {
        let mut values = self.values.lock().unwrap();
        let mut samples = self.samples.lock().unwrap();
        for (key, _, _, value) in self.snapshotter.snapshot().into_vec() {
            let key = key.key();
            let mut labels: Vec<String> = key
                .labels()
                .map(|l| format!("{}={}", l.key(), l.value()))
                .collect();
            labels.sort();
            let rendered = format!("{}{{{}}}", key.name(), labels.join(","));
            match value {
                DebugValue::Counter(c) => *values.entry(rendered).or_default() += c as f64,
                DebugValue::Gauge(g) => *values.entry(rendered).or_default() += g.into_inner(),
                DebugValue::Histogram(h) => samples
                    .entry(rendered)
                    .or_default()
                    .extend(h.into_iter().map(|f| f.into_inner())),
            }
        }
    }

    /// The sum of every counter (or gauge) `name` whose labels include `labels`.
    fn value(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.refresh();
        let values = self.values.lock().unwrap();
        values
            .iter()
            .filter(|(k, _)| matches(k, name, labels))
            .map(|(_, v)| *v)
            .sum()
    }

    /// How many samples histograms `name` with `labels` recorded.
    fn samples(&self, name: &str, labels: &[(&str, &str)]) -> usize {
        self.refresh();
        let samples = self.samples.lock().unwrap();
        samples
            .iter()
            .filter(|(k, _)| matches(k, name, labels))
            .map(|(_, v)| v.len())
            .sum()
    }

    /// Every rendered key seen.
    fn keys(&self) -> Vec<String> {
        self.refresh();
        let mut keys: Vec<String> = self.values.lock().unwrap().keys().cloned().collect();
        keys.extend(self.samples.lock().unwrap().keys().cloned());
        keys.sort();
        keys
    }
}

fn matches(rendered: &str, name: &str, labels: &[(&str, &str)]) -> bool {
    let Some(rest) = rendered.strip_prefix(name) else {
        return false;
    };
    let Some(inner) = rest.strip_prefix('{').and_then(|r| r.strip_suffix('}')) else {
        return false;
    };
    let have: Vec<&str> = inner.split(',').collect();
    labels
        .iter()
        .all(|(k, v)| have.contains(&format!("{k}={v}").as_str()))
}

async fn client(urls: Vec<String>) -> Client {
    common::connect(Config::from_urls(urls).expect("valid"))
        .await
        .expect("valid")
}

/// Wait until the counter `name` with `labels` reaches `at_least`.
async fn until_counted(name: &str, labels: &[(&str, &str)], at_least: f64) {
    let what = format!("{name} {labels:?} >= {at_least}");
    eventually(Duration::from_secs(10), &what, || async {
        seen().value(name, labels) >= at_least
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_library_emits_its_metrics_catalogue() {
    init_tracing();
    let m = seen();
    let cluster = Cluster::start(3).await;
    let c = client(cluster.urls()).await;

    // IDs: a write round first, then IDs from the spare (validated by a read).
    let ids = IdGenerator::new(&c, "metrics-seq").unwrap();
    for _ in 0..5 {
        ids.next_id().await.expect("an ID");
    }
    ids.next_ids(7).await.expect("IDs");
    assert!(m.value("redquorum_id_rounds_total", &[("path", "write")]) >= 1.0);
    assert!(
        m.value("redquorum_id_rounds_total", &[("path", "spare")]) >= 1.0,
        "{:?}",
        m.keys()
    );
    assert!(m.samples("redquorum_id_batch_size", &[]) >= 6);
    assert!(
        m.value(
            "redquorum_quorum_operations_total",
            &[("kind", "id.next"), ("outcome", "ok")]
        ) >= 1.0
    );

    // A lease: granted, refused to a second holder, extended, then taken from under it (its
    // copies overwritten on every node): lost with reason `conflict`.
    let ttl = Duration::from_millis(900);
    let lock = Lock::new(&c, "metrics-lock", ttl).unwrap();
    let guard = lock.try_acquire().await.expect("a free lock");
    assert_eq!(
        m.value(
            "redquorum_lease_acquisitions_total",
            &[("outcome", "granted")]
        ),
        1.0
    );
    let other = client(cluster.urls()).await;
    let err = Lock::new(&other, "metrics-lock", ttl)
        .unwrap()
        .try_acquire()
        .await
        .expect_err("held");
    assert!(matches!(err, redquorum::Error::LockHeld { .. }), "{err}");
    assert_eq!(
        m.value("redquorum_lease_acquisitions_total", &[("outcome", "held")]),
        1.0
    );
    assert!(
        m.value(
            "redquorum_quorum_operations_total",
            &[("kind", "lock.acquire"), ("outcome", "conflict")]
        ) >= 1.0,
        "a held lock's acquisition round is refused by the nodes: {:?}",
        m.keys()
    );
    until_counted(
        "redquorum_lease_extensions_total",
        &[("outcome", "ok")],
        1.0,
    )
    .await;
    for node in cluster.nodes() {
        let mut con = node.direct_connection().await;
        let _: () = redis::cmd("HSET")
            .arg("rq:lock:metrics-lock")
            .arg("v")
            .arg("someone-else")
            .query_async(&mut con)
            .await
            .expect("HSET");
    }
    let reason = tokio::time::timeout(ttl, guard.lost())
        .await
        .expect("the overwritten lease signals its loss within its TTL");
    assert_eq!(reason, LossReason::Conflict);
    // Counted just after the loss is published (the recorder never runs before the holder
    // is told).
    until_counted(
        "redquorum_lease_losses_total",
        &[("reason", "conflict")],
        1.0,
    )
    .await;
    assert_eq!(
        m.value("redquorum_lease_losses_total", &[("reason", "conflict")]),
        1.0
    );
    assert!(
        m.value(
            "redquorum_lease_extensions_total",
            &[("outcome", "conflict")]
        ) >= 1.0
    );
    drop(guard);
    assert_eq!(
        m.value("redquorum_lease_losses_total", &[]),
        1.0,
        "a release after the loss is not a second loss"
    );

    // Per node: every node applied something, and each answering node's latency is recorded.
    for node in ["0", "1", "2"] {
        assert!(
            m.value(
                "redquorum_node_requests_total",
                &[("node", node), ("outcome", "applied")]
            ) >= 1.0,
            "node {node}: {:?}",
            m.keys()
        );
        assert!(m.samples("redquorum_node_request_seconds", &[("node", node)]) >= 1);
    }
    assert!(
        m.samples(
            "redquorum_quorum_operation_seconds",
            &[("kind", "lock.acquire")]
        ) >= 1
    );

    // Leadership: won, then resigned; the gauge back to zero.
    let election = Election::new(&c, "metrics-election", ttl, "candidate-a").unwrap();
    let leadership = election.try_campaign().await.expect("no leader yet");
    assert_eq!(
        m.value("redquorum_leadership_changes_total", &[("event", "won")]),
        1.0
    );
    assert_eq!(m.value("redquorum_leaderships", &[]), 1.0);
    leadership.resign().await.expect("resign");
    until_counted(
        "redquorum_leadership_changes_total",
        &[("event", "resigned")],
        1.0,
    )
    .await;
    assert_eq!(m.value("redquorum_leaderships", &[]), 0.0);

    // Views: one member seals and adopts a view; a second one's join makes the first drain
    // and acknowledge a prepared view, then the leader activates it.
    let opts = || GroupOptions::default().with_interval(Duration::from_millis(200));
    let first = Member::join(&c, "metrics-group", "m1", opts())
        .await
        .unwrap();
    until_counted("redquorum_view_changes_total", &[("kind", "adopted")], 1.0).await;
    eventually(Duration::from_secs(10), "m1 is assigned", || async {
        first.assignment().is_some()
    })
    .await;
    let second = Member::join(&other, "metrics-group", "m2", opts())
        .await
        .unwrap();
    until_counted(
        "redquorum_view_changes_total",
        &[("kind", "sealed_prepare")],
        1.0,
    )
    .await;
    until_counted(
        "redquorum_view_changes_total",
        &[("kind", "sealed_active")],
        2.0,
    )
    .await;
    eventually(Duration::from_secs(10), "a drain is timed", || async {
        m.samples("redquorum_view_drain_seconds", &[]) >= 1
    })
    .await;
    assert!(
        m.value("redquorum_leadership_changes_total", &[("event", "won")]) >= 2.0,
        "the group's leader counts as a leadership"
    );
    second.leave().await;
    first.leave().await;

    // A wiped node: quarantined, then repaired (IDs keep asking the nodes meanwhile).
    let quarantined = m.value("redquorum_node_quarantines_total", &[("node", "2")]);
    let refused = || {
        m.value(
            "redquorum_node_requests_total",
            &[("node", "2"), ("outcome", "excluded")],
        ) + m.value(
            "redquorum_node_requests_total",
            &[("node", "2"), ("outcome", "rejected")],
        )
    };
    let refused_before = refused();
    cluster.node(2).wipe_and_restart().await;
    eventually(Duration::from_secs(15), "node 2 repaired", || async {
        let _ = ids.next_id().await;
        m.value("redquorum_repairs_total", &[("outcome", "repaired")]) >= 1.0
    })
    .await;
    assert!(
        m.value("redquorum_node_quarantines_total", &[("node", "2")]) > quarantined,
        "{:?}",
        m.keys()
    );
    assert!(
        refused() > refused_before,
        "the wiped node is excluded or refuses before its repair: {:?}",
        m.keys()
    );

    // No label value is a URL or a user-supplied name.
    for key in m.keys() {
        for bad in [
            "redis://",
            "127.0.0.1",
            "metrics-lock",
            "metrics-seq",
            "metrics-group",
            "m1",
        ] {
            assert!(!key.contains(bad), "{key} carries {bad}");
        }
    }
    println!("{:#?}", m.keys());
}
