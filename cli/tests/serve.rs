//! `redquorum serve` against real nodes, as callers in other languages use it: IDs through two
//! servers, leases as sessions that end with the caller's connection, a frozen or killed
//! server whose leases are taken over only after their TTL and whose callers' late writes the
//! fencing token rejects, periods run once, elections, groups, bad input, and the bearer token.

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use std::process::Stdio;
use std::time::{Duration, Instant};

use redquorum_testkit::LocalNodes;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

const BIN: &str = env!("CARGO_BIN_EXE_redquorum");

/// Three nodes with a cluster set up on them.
async fn cluster() -> (LocalNodes, String) {
    let nodes = tokio::task::spawn_blocking(|| LocalNodes::start(3))
        .await
        .unwrap();
    let list = nodes.urls().join(",");
    let init = Command::new(BIN)
        .args(["--nodes", &list, "cluster", "init"])
        .env_remove("REDQUORUM_NODES")
        .output()
        .await
        .unwrap();
    assert!(init.status.success(), "cluster init: {init:?}");
    (nodes, list)
}

/// A `redquorum serve` process and its base URL.
struct Server {
    child: Child,
    url: String,
}

impl Server {
    /// Start `serve` on a free loopback port with `extra` options; wait for its
    /// `listening on` line.
    async fn start(nodes: &str, extra: &[&str]) -> Server {
        Server::start_with_env(nodes, extra, &[]).await
    }

    /// [`start`](Server::start) with `env` added to the server's environment.
    async fn start_with_env(nodes: &str, extra: &[&str], env: &[(&str, &str)]) -> Server {
        let mut child = Command::new(BIN)
            .args(["--nodes", nodes, "serve", "--listen", "127.0.0.1:0"])
            .args(extra)
            .envs(env.iter().copied())
            .env_remove("REDQUORUM_NODES")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let line = tokio::time::timeout(Duration::from_secs(20), lines.next_line())
            .await
            .expect("serve prints `listening on` within 20 s")
            .unwrap()
            .expect("serve printed a line");
        let url = line
            .strip_prefix("listening on ")
            .unwrap_or_else(|| panic!("serve's first line is {line:?}"))
            .to_string();
        Server { child, url }
    }

    fn pid(&self) -> i32 {
        self.child.id().unwrap() as i32
    }

    fn signal(&self, signal: &str) {
        let ok = std::process::Command::new("kill")
            .args([&format!("-{signal}"), &self.pid().to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill -{signal} of the server");
    }
}

fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap()
}

async fn post_json(url: &str) -> (u16, Value) {
    let r = http().post(url).send().await.unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

async fn get_json(url: &str) -> (u16, Value) {
    let r = http().get(url).send().await.unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

/// An open NDJSON stream: its events one by one.
struct Events {
    response: reqwest::Response,
    buffer: Vec<u8>,
    /// The session the stream's first event named, once read.
    first_session: Option<String>,
}

impl Events {
    /// POST `url`, expecting a stream; panics with the error body otherwise.
    async fn open(url: &str) -> Events {
        let response = http().post(url).send().await.unwrap();
        if response.status() != 200 {
            let status = response.status();
            panic!(
                "{url}: {status} {}",
                response.text().await.unwrap_or_default()
            );
        }
        Events {
            response,
            buffer: Vec::new(),
            first_session: None,
        }
    }

    /// The next event, within `within`.
    async fn next(&mut self, within: Duration) -> Option<Value> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            if let Some(at) = self.buffer.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.buffer.drain(..=at).collect();
                let event: Value = serde_json::from_slice(&line).unwrap();
                if let (None, Some(s)) = (&self.first_session, event["session"].as_str()) {
                    self.first_session = Some(s.to_string());
                }
                return Some(event);
            }
            match tokio::time::timeout_at(deadline, self.response.chunk()).await {
                Ok(Ok(Some(chunk))) => self.buffer.extend_from_slice(&chunk),
                Ok(Ok(None)) | Ok(Err(_)) | Err(_) => return None,
            }
        }
    }

    /// Events until one named `event` (panics after `within`).
    async fn until(&mut self, event: &str, within: Duration) -> Value {
        let deadline = Instant::now() + within;
        while let Some(e) = self
            .next(deadline.saturating_duration_since(Instant::now()))
            .await
        {
            if e["event"] == event {
                return e;
            }
        }
        panic!("no {event:?} event within {within:?}");
    }
}

/// A resource node the callers write to with their fencing tokens (a plain Redis server).
struct Resource {
    nodes: LocalNodes,
}

impl Resource {
    async fn start() -> Resource {
        let nodes = tokio::task::spawn_blocking(|| LocalNodes::start(1))
            .await
            .unwrap();
        Resource { nodes }
    }

    async fn connection(&self) -> redis::aio::MultiplexedConnection {
        redis::Client::open(self.nodes.url(0))
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap()
    }

    /// `value` written with `token` through the fenced-set script: whether it was accepted.
    async fn fenced_write(&self, token: u64, value: &str) -> bool {
        let mut c = self.connection().await;
        let reply: Vec<i64> = redis::Script::new(redquorum::FENCED_SET_LUA)
            .key("resource")
            .key("resource:fence")
            .arg(token)
            .arg(value)
            .invoke_async(&mut c)
            .await
            .unwrap();
        reply[0] == 1
    }

    /// `value` written with a plain SET (no fencing): the protection switched off.
    async fn unfenced_write(&self, value: &str) {
        let mut c = self.connection().await;
        let _: () = redis::cmd("SET")
            .arg("resource")
            .arg(value)
            .query_async(&mut c)
            .await
            .unwrap();
    }

    async fn value(&self) -> Option<String> {
        let mut c = self.connection().await;
        redis::cmd("GET")
            .arg("resource")
            .query_async(&mut c)
            .await
            .unwrap()
    }
}

#[tokio::test]
async fn ids_through_two_servers_are_unique_and_in_real_time_order() {
    let (_nodes, list) = cluster().await;
    let (a, b) = (
        Server::start(&list, &[]).await,
        Server::start(&list, &[]).await,
    );

    // One caller alternating between the servers: every ID above the one before it.
    let mut last = 0;
    for i in 0..20 {
        let server = if i % 2 == 0 { &a } else { &b };
        let (status, body) = post_json(&format!("{}/v1/ids/orders", server.url)).await;
        assert_eq!(status, 200, "{body}");
        let id = body["ids"][0].as_u64().unwrap();
        assert!(
            id > last,
            "call {i}: ID {id} is not above the previous call's {last}"
        );
        last = id;
    }

    // 64 concurrent callers over both servers, blocks of 3: all distinct.
    let calls = (0..64).map(|i| {
        let url = format!(
            "{}/v1/ids/orders?count=3",
            if i % 2 == 0 { &a.url } else { &b.url }
        );
        async move { post_json(&url).await }
    });
    let mut seen = std::collections::BTreeSet::new();
    for (status, body) in futures_util::future::join_all(calls).await {
        assert_eq!(status, 200, "{body}");
        let ids: Vec<u64> = serde_json::from_value(body["ids"].clone()).unwrap();
        assert_eq!(ids.len(), 3);
        assert_eq!(body["first"].as_u64(), Some(ids[0]));
        for id in ids {
            assert!(
                id > last,
                "a concurrent call returned {id}, not above the earlier {last}"
            );
            assert!(seen.insert(id), "ID {id} was returned twice");
        }
    }
}

#[tokio::test]
async fn bad_input_gets_a_4xx_naming_the_field_and_writes_nothing() {
    let (nodes, list) = cluster().await;
    let server = Server::start(&list, &[]).await;
    let before = key_counts(&nodes).await;
    let cases: &[(&str, &str, u16, &str)] = &[
        ("POST", "/v1/ids/orders?count=0", 400, "count"),
        ("POST", "/v1/ids/orders?count=10001", 400, "count"),
        ("POST", "/v1/ids/orders?count=two", 400, "count"),
        ("POST", "/v1/ids/orders?cuont=2", 400, "query"),
        ("POST", "/v1/ids/bad%0Aname", 400, "sequence"),
        (
            "POST",
            &format!("/v1/ids/{}", "x".repeat(513)),
            400,
            "sequence",
        ),
        ("POST", "/v1/locks/nightly/acquire?ttl=0s", 400, "ttl"),
        ("POST", "/v1/locks/nightly/acquire?ttl=100d", 400, "ttl"),
        ("POST", "/v1/locks/nightly/acquire?wait=soon", 400, "wait"),
        (
            "POST",
            "/v1/locks/nightly/acquire?session=forever",
            400,
            "session",
        ),
        (
            "POST",
            "/v1/locks/nightly/acquire?keepalive=1ms",
            400,
            "keepalive",
        ),
        (
            "POST",
            "/v1/locks/nightly/acquire?holder=%1B%5B31m",
            400,
            "holder",
        ),
        ("POST", "/v1/locks/nightly/acquire?ttl=%ZZ", 400, "query"),
        ("POST", "/v1/elections/leader/campaign", 400, "candidate"),
        ("POST", "/v1/jobs/nightly/periods/%00/begin", 400, "period"),
        ("POST", "/v1/groups/workers/join", 400, "id"),
        (
            "POST",
            "/v1/groups/workers/join?id=a&interval=1ms",
            400,
            "interval",
        ),
        ("POST", "/v1/pools/p/join?id=a&weight=10001", 400, "weight"),
        ("POST", "/v1/sessions/nope/drained", 400, "drain"),
        ("POST", "/v1/sessions/nope/release", 404, "session"),
        ("GET", "/v1/ids/orders", 405, ""),
        ("GET", "/v2/nothing", 404, ""),
    ];
    for (method, path, status, field) in cases {
        let request = match *method {
            "GET" => http().get(format!("{}{path}", server.url)),
            _ => http().post(format!("{}{path}", server.url)),
        };
        let response = request.send().await.unwrap();
        let got = response.status().as_u16();
        let body: Value = response.json().await.unwrap_or(Value::Null);
        assert_eq!(got, *status, "{method} {path}: {body}");
        assert!(
            body["error"]["message"].is_string(),
            "{method} {path}: no error message in {body}"
        );
        if !field.is_empty() {
            assert_eq!(body["error"]["field"], *field, "{method} {path}: {body}");
        }
    }
    // A body over the limit is refused before any handler runs.
    let big = http()
        .post(format!("{}/v1/ids/orders", server.url))
        .body(vec![b'x'; 100_000])
        .send()
        .await
        .unwrap();
    assert!(
        big.status().is_client_error(),
        "a 100 kB body: {}",
        big.status()
    );
    assert_eq!(
        key_counts(&nodes).await,
        before,
        "bad input wrote to the nodes"
    );
}

async fn key_counts(nodes: &LocalNodes) -> Vec<u64> {
    let mut counts = Vec::new();
    for url in nodes.urls() {
        let mut c = redis::Client::open(url)
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        counts.push(redis::cmd("DBSIZE").query_async(&mut c).await.unwrap());
    }
    counts
}

#[tokio::test]
async fn a_lease_lives_with_its_stream_and_is_released_when_the_caller_disconnects() {
    let (_nodes, list) = cluster().await;
    let server = Server::start(&list, &[]).await;
    let acquire = format!("{}/v1/locks/report/acquire?ttl=2s", server.url);

    // The first caller holds the lease: its stream starts with the token, then `held`.
    let mut first = Events::open(&acquire).await;
    let acquired = first.next(Duration::from_secs(5)).await.unwrap();
    assert_eq!(acquired["event"], "acquired", "{acquired}");
    let token = acquired["token"].as_u64().unwrap();
    let held = first.until("held", Duration::from_secs(3)).await;
    assert!(held["valid_for_ms"].as_u64().unwrap() > 0, "{held}");

    // A one-shot caller sees the live holder (it extends) and gets 409.
    let (status, body) = post_json(&acquire).await;
    assert_eq!(status, 409, "a second caller got the held lease: {body}");
    assert_eq!(body["error"]["code"], "held");

    // The holder's `holder` reading names the server's holder and its token.
    let (_, holder) = get_json(&format!("{}/v1/locks/report/holder", server.url)).await;
    assert_eq!(holder["holder"]["token"].as_u64(), Some(token), "{holder}");

    // The first caller goes away (its connection closes): the lease is released at once, so
    // the next one-shot caller gets it well within the TTL.
    drop(first);
    let gone = Instant::now();
    let mut second = loop {
        let response = http().post(&acquire).send().await.unwrap();
        if response.status() == 200 {
            break Events {
                response,
                buffer: Vec::new(),
                first_session: None,
            };
        }
        assert!(
            gone.elapsed() < Duration::from_millis(1500),
            "the lease was not released when its caller disconnected"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let next = second.next(Duration::from_secs(5)).await.unwrap();
    assert!(next["token"].as_u64().unwrap() > token, "{next}");
    println!(
        "the next caller held the lease {:?} after the first disconnected",
        gone.elapsed()
    );

    // Release through the session: the stream says so and ends.
    let session = next["session"].as_str().unwrap();
    let (status, released) =
        post_json(&format!("{}/v1/sessions/{session}/release", server.url)).await;
    assert_eq!(
        (status, released["released"].as_bool()),
        (200, Some(true)),
        "{released}"
    );
    assert_eq!(
        second.until("released", Duration::from_secs(2)).await["released"],
        true
    );
    assert!(
        second.next(Duration::from_secs(2)).await.is_none(),
        "the stream did not end"
    );
}

#[tokio::test]
async fn a_keepalive_session_ends_when_its_keepalives_stop() {
    let (_nodes, list) = cluster().await;
    let server = Server::start(&list, &[]).await;
    let acquire = format!(
        "{}/v1/locks/kept/acquire?ttl=5s&session=keepalive&keepalive=600ms",
        server.url
    );
    let (status, acquired) = post_json(&acquire).await;
    assert_eq!(status, 200, "{acquired}");
    let session = acquired["session"].as_str().unwrap().to_string();
    // Kept alive every 300 ms, also while another caller tries the lock (a one-shot try
    // watches a held lease until its holder extends, up to a third of the 5 s TTL: the
    // keep-alives must not pause meanwhile).
    let keepalive = format!("{}/v1/sessions/{session}/keepalive", server.url);
    let keeping = tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_millis(300)).await;
            let (status, kept) = post_json(&keepalive).await;
            assert_eq!(status, 200, "{kept}");
        }
    });
    tokio::time::sleep(Duration::from_millis(1500)).await; // beyond its keep-alive interval
    let (status, _) = post_json(&acquire).await;
    keeping.abort();
    assert!(
        keeping.await.unwrap_err().is_cancelled(),
        "every keep-alive was answered 200"
    );
    assert_eq!(status, 409, "the lease of a kept-alive session was taken");
    // No keep-alive: within 600 ms the session ends and the lease is released (not after the
    // 5 s TTL).
    let stopped = Instant::now();
    loop {
        let (status, _) = post_json(&acquire).await;
        if status == 200 {
            break;
        }
        assert!(
            stopped.elapsed() < Duration::from_secs(3),
            "the lease outlived its session's keep-alive"
        );
    }
    // The ended session's final event stays readable for a while (for callers that retry).
    let (status, ended) = get_json(&format!("{}/v1/sessions/{session}", server.url)).await;
    assert_eq!(
        (status, &ended["ended"]),
        (200, &Value::from(true)),
        "{ended}"
    );
    assert_eq!(ended["state"]["event"], "released", "{ended}");
    let (status, again) = post_json(&format!("{}/v1/sessions/{session}/release", server.url)).await;
    assert_eq!(
        status, 200,
        "a retried release of an ended session: {again}"
    );
}

/// What a keep-alive session's caller reads from its keep-alive answers: the `valid_for_ms` of
/// five answers 100 ms apart, then the status and `valid_for_ms` of one answer right after the
/// server's host was suspended for a minute (staged: the server's boot clock is moved ahead,
/// test-util only). `monotonic_only`: the server judges validity as before the boot clock was
/// read.
async fn keepalives_across_a_suspend(monotonic_only: bool) -> (Vec<u64>, u16, Option<u64>) {
    let (_nodes, list) = cluster().await;
    let dir = tempfile::tempdir().unwrap();
    let ahead = dir.path().join("ahead-ms");
    let mut env = vec![(
        "REDQUORUM_BOOT_CLOCK_AHEAD_FILE_FOR_TESTS",
        ahead.to_str().unwrap(),
    )];
    if monotonic_only {
        env.push(("REDQUORUM_MONOTONIC_VALIDITY_FOR_TESTS", "1"));
    }
    let server = Server::start_with_env(&list, &[], &env).await;
    let acquire = format!(
        "{}/v1/locks/report/acquire?ttl=30s&session=keepalive&keepalive=1h",
        server.url
    );
    let (status, acquired) = post_json(&acquire).await;
    assert_eq!(status, 200, "{acquired}");
    let session = acquired["session"].as_str().unwrap().to_string();
    let keepalive = format!("{}/v1/sessions/{session}/keepalive", server.url);
    // Well inside the first extension (at 10 s); `held` events come every 2 s.
    let mut answers = Vec::new();
    for _ in 0..5 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let (status, kept) = post_json(&keepalive).await;
        assert_eq!(status, 200, "{kept}");
        answers.push(kept["state"]["valid_for_ms"].as_u64().unwrap());
    }
    std::fs::write(&ahead, "60000").unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await; // the server reads the file every 20 ms
    let (status, kept) = post_json(&keepalive).await;
    (answers, status, kept["valid_for_ms"].as_u64())
}

#[tokio::test]
async fn keepalive_answers_carry_the_validity_at_answer_time_also_after_a_host_suspend() {
    let (answers, status, after) = keepalives_across_a_suspend(false).await;
    println!("valid_for_ms of keep-alives 100 ms apart: {answers:?}; after the suspend: {status}, {after:?}");
    assert!(
        answers.windows(2).all(|w| w[1] < w[0]),
        "keep-alive answers 100 ms apart, without an extension between them, must show a \
         validity that decreases (computed at answer time, not the last event's): {answers:?}"
    );
    assert!(
        status == 404 || (status == 200 && after == Some(0)),
        "after a suspend past the lease's validity a keep-alive must answer valid_for_ms 0 \
         (or the session lost, 404): {status}, valid_for_ms {after:?}"
    );
}

/// The teeth: a server judging validity on the monotonic clock alone still tells its caller,
/// after a minute's suspend, that most of the 30 s lease is left.
#[tokio::test]
async fn without_the_boot_clock_a_keepalive_after_a_suspend_shows_the_lease_valid() {
    let (_, status, after) = keepalives_across_a_suspend(true).await;
    assert_eq!(status, 200);
    assert!(
        after.is_some_and(|ms| ms > 20_000),
        "the monotonic clock alone shows most of the validity left: {after:?}"
    );
}

#[tokio::test]
async fn a_stream_session_with_keepalives_ends_when_a_frozen_caller_stops_sending_them() {
    // A frozen caller's kernel keeps its connection (and so the stream) open: keep-alives on a
    // stream session end it anyway.
    let (_nodes, list) = cluster().await;
    let server = Server::start(&list, &[]).await;
    let acquire = format!(
        "{}/v1/locks/frozen-caller/acquire?ttl=10s&keepalive=500ms",
        server.url
    );
    let mut held = Events::open(&acquire).await;
    let first = held.next(Duration::from_secs(5)).await.unwrap();
    assert_eq!(first["event"], "acquired");
    let started = Instant::now();
    let end = held.until("released", Duration::from_secs(5)).await;
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "ended after {:?}",
        started.elapsed()
    );
    assert_eq!(end["released"], true, "{end}");
    let (status, _) = post_json(&format!("{acquire}&wait=1s")).await;
    assert_eq!(
        status, 200,
        "the lease outlived its stream session's keep-alives"
    );
}

#[tokio::test]
async fn a_period_whose_lease_was_lost_is_not_recorded_by_a_late_complete() {
    // The run's server freezes past the lease's TTL; after it resumes, the caller's complete
    // is refused and the period stays due (another caller may have run it meanwhile).
    let (_nodes, list) = cluster().await;
    let server = Server::start(&list, &[]).await;
    let begin = format!(
        "{}/v1/jobs/late/periods/p1/begin?ttl=1s&session=keepalive&keepalive=1h",
        server.url
    );
    let (status, begun) = post_json(&begin).await;
    assert_eq!(
        (status, &begun["event"]),
        (200, &Value::from("begun")),
        "{begun}"
    );
    let session = begun["session"].as_str().unwrap().to_string();
    server.signal("STOP");
    tokio::time::sleep(Duration::from_millis(2500)).await;
    server.signal("CONT");
    let (status, complete) =
        post_json(&format!("{}/v1/sessions/{session}/complete", server.url)).await;
    assert_eq!(
        status, 409,
        "a complete after the lease ran out was accepted: {complete}"
    );
    let (status, again) = post_json(&begin).await;
    assert_eq!(
        (status, &again["event"]),
        (200, &Value::from("begun")),
        "the period was recorded: {again}"
    );
}

/// A caller holds a lease through server A, which freezes (or dies) past the TTL; another
/// caller, through server B, gets the lease only after A's TTL, with a higher token, and
/// writes with it. A's caller, still believing it holds the lease, writes late: with fencing
/// the resource refuses the write; without, it overwrites the newer holder's value.
async fn frozen_server_story(kill: bool, fenced: bool) -> Option<String> {
    let (_nodes, list) = cluster().await;
    let resource = Resource::start().await;
    let (a, b) = (
        Server::start(&list, &[]).await,
        Server::start(&list, &[]).await,
    );
    let ttl = Duration::from_secs(2);
    let mut old = Events::open(&format!("{}/v1/locks/account/acquire?ttl=2s", a.url)).await;
    let old_token = old.next(Duration::from_secs(5)).await.unwrap()["token"]
        .as_u64()
        .unwrap();
    assert!(
        resource
            .fenced_write(old_token, "old holder, on time")
            .await
    );

    if kill {
        a.signal("KILL");
    } else {
        a.signal("STOP");
    }
    let cut = Instant::now();
    let (status, new) = {
        let mut events = Events::open(&format!(
            "{}/v1/locks/account/acquire?ttl=2s&wait=20s",
            b.url
        ))
        .await;
        (200, events.next(Duration::from_secs(5)).await.unwrap())
    };
    let waited = cut.elapsed();
    assert_eq!(status, 200);
    assert!(
        waited >= ttl,
        "the lease was taken over {waited:?} after its server stopped, before its TTL {ttl:?}"
    );
    let new_token = new["token"].as_u64().unwrap();
    // The other server kept serving meanwhile.
    let (status, ids) = post_json(&format!("{}/v1/ids/after-the-fault", b.url)).await;
    assert_eq!(status, 200, "the second server stopped serving: {ids}");
    assert!(new_token > old_token, "{new}");
    assert!(resource.fenced_write(new_token, "new holder").await);
    println!("taken over {waited:?} after the server stopped (TTL {ttl:?})");

    // The old caller, unaware, writes late with its token.
    if !kill {
        a.signal("CONT");
    }
    if fenced {
        let accepted = resource.fenced_write(old_token, "old holder, late").await;
        assert!(
            !accepted,
            "the resource accepted a write with the old token {old_token}"
        );
    } else {
        resource.unfenced_write("old holder, late").await;
    }
    resource.value().await
}

#[tokio::test]
async fn a_frozen_server_loses_its_lease_only_after_the_ttl_and_fencing_rejects_late_writes() {
    let value = frozen_server_story(false, true).await;
    assert_eq!(value.as_deref(), Some("new holder"));
}

#[tokio::test]
async fn a_killed_server_loses_its_lease_only_after_the_ttl_and_fencing_rejects_late_writes() {
    let value = frozen_server_story(true, true).await;
    assert_eq!(value.as_deref(), Some("new holder"));
}

#[tokio::test]
async fn without_fencing_the_frozen_servers_late_write_overwrites_the_new_holder() {
    // The checker's teeth: the same story with plain writes shows the stale overwrite that the
    // fencing token prevents.
    let value = frozen_server_story(false, false).await;
    assert_eq!(
        value.as_deref(),
        Some("old holder, late"),
        "the unfenced story did not show the stale write"
    );
}

#[tokio::test]
async fn a_period_runs_once_across_three_callers() {
    let (_nodes, list) = cluster().await;
    let server = Server::start(&list, &[]).await;
    let begin = format!(
        "{}/v1/jobs/nightly/periods/2026-11-27/begin?ttl=3s&wait=10s",
        server.url
    );
    let (callers, runs) = (3, std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0)));
    let tasks = (0..callers).map(|_| {
        let (begin, base, runs) = (begin.clone(), server.url.clone(), runs.clone());
        tokio::spawn(async move {
            let mut events = Events::open(&begin).await;
            let first = events.next(Duration::from_secs(15)).await.unwrap();
            match first["event"].as_str() {
                Some("begun") => {
                    runs.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(300)).await; // the work
                    let session = first["session"].as_str().unwrap();
                    let (status, done) =
                        post_json(&format!("{base}/v1/sessions/{session}/complete")).await;
                    assert_eq!(status, 200, "{done}");
                    assert_eq!(done["token"], first["token"]);
                    first["token"].as_u64().unwrap()
                }
                Some("done") => first["token"].as_u64().unwrap(),
                _ => panic!("unexpected first event {first}"),
            }
        })
    });
    let tokens: Vec<u64> = futures_util::future::join_all(tasks)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    assert_eq!(
        runs.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "the period ran more than once"
    );
    assert!(
        tokens.iter().all(|t| *t == tokens[0]),
        "callers saw different runs: {tokens:?}"
    );
    // A late caller finds it done too, without a stream to hold.
    let (status, done) = post_json(&format!("{begin}&session=keepalive")).await;
    assert_eq!(
        (status, &done["event"]),
        (200, &Value::from("done")),
        "{done}"
    );
}

#[tokio::test]
async fn an_election_streams_leadership_and_observers_see_it_change() {
    let (_nodes, list) = cluster().await;
    let server = Server::start(&list, &[]).await;
    let mut observer = {
        let response = http()
            .get(format!(
                "{}/v1/elections/primary/observe?interval=100ms",
                server.url
            ))
            .send()
            .await
            .unwrap();
        Events {
            response,
            buffer: Vec::new(),
            first_session: None,
        }
    };
    assert_eq!(
        observer.next(Duration::from_secs(5)).await.unwrap()["leader"],
        Value::Null
    );
    let mut alice = Events::open(&format!(
        "{}/v1/elections/primary/campaign?candidate=alice&ttl=2s",
        server.url
    ))
    .await;
    let elected = alice.next(Duration::from_secs(5)).await.unwrap();
    assert_eq!(elected["event"], "elected", "{elected}");
    let seen = observer.until("leader", Duration::from_secs(5)).await;
    assert_eq!(seen["leader"]["candidate"], "alice", "{seen}");
    assert_eq!(seen["leader"]["term"], elected["term"]);
    let (_, leader) = get_json(&format!("{}/v1/elections/primary/leader", server.url)).await;
    assert_eq!(leader["leader"]["candidate"], "alice", "{leader}");

    // Bob cannot campaign over a live leader; alice resigns by closing her stream; bob wins.
    let (status, _) = post_json(&format!(
        "{}/v1/elections/primary/campaign?candidate=bob&session=keepalive",
        server.url
    ))
    .await;
    assert_eq!(status, 409);
    drop(alice);
    let (status, bob) = post_json(&format!(
        "{}/v1/elections/primary/campaign?candidate=bob&wait=5s&session=keepalive",
        server.url
    ))
    .await;
    assert_eq!(status, 200, "{bob}");
    assert!(bob["term"].as_u64() > elected["term"].as_u64(), "{bob}");
    loop {
        let seen = observer.until("leader", Duration::from_secs(5)).await;
        if seen["leader"]["candidate"] == "bob" {
            break;
        }
    }
}

#[tokio::test]
async fn group_members_get_dense_indexes_and_a_leaver_hands_its_index_over() {
    let (_nodes, list) = cluster().await;
    let server = Server::start(&list, &[]).await;
    let join = |id: &str| {
        format!(
            "{}/v1/groups/workers/join?id={id}&interval=200ms",
            server.url
        )
    };
    let a = Events::open(&join("a")).await;
    let b = Events::open(&join("b")).await;
    let index_of = |e: &Value| {
        (
            e["assignment"]["index"].as_u64(),
            e["assignment"]["replicas"].as_u64(),
        )
    };
    // Both reach an active view of two replicas with distinct indexes.
    let (a, ea) = wait_active(a, 2).await;
    let (b, eb) = wait_active(b, 2).await;
    assert_ne!(
        index_of(&ea).0,
        index_of(&eb).0,
        "two members share an index: {ea} {eb}"
    );
    // b leaves (its stream closes): a becomes the only replica.
    drop(b);
    let (_a, alone) = wait_active(a, 1).await;
    assert_eq!(index_of(&alone), (Some(0), Some(1)), "{alone}");
}

/// Events until an active assignment with `replicas` members; a drain on the way is
/// acknowledged (the member stops nothing: it has no work).
async fn wait_active(mut events: Events, replicas: u64) -> (Events, Value) {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let e = events
            .next(left)
            .await
            .unwrap_or_else(|| panic!("no active view of {replicas} replicas"));
        if e["event"] == "assignment"
            && e["assignment"]["replicas"] == replicas
            && e["assignment"]["state"] == "active"
        {
            return (events, e);
        }
    }
}

#[tokio::test]
async fn health_metrics_and_the_openapi_document_are_served() {
    let (_nodes, list) = cluster().await;
    let server = Server::start(&list, &[]).await;
    let (status, health) = get_json(&format!("{}/v1/health", server.url)).await;
    assert_eq!(
        (status, &health["healthy"]),
        (200, &Value::from(true)),
        "{health}"
    );
    let _ = post_json(&format!("{}/v1/ids/x", server.url)).await;
    let metrics = http()
        .get(format!("{}/metrics", server.url))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("redquorum_serve_requests_total"),
        "{metrics}"
    );
    let (status, doc) = get_json(&format!("{}/v1/openapi.json", server.url)).await;
    assert_eq!(status, 200);
    assert!(doc["paths"]["/v1/ids/{sequence}"]["post"].is_object());
}

#[tokio::test]
async fn an_exposed_address_needs_a_token_and_requests_without_it_are_refused() {
    let (_nodes, list) = cluster().await;
    // 0.0.0.0 without --token-file: refused before any node is contacted.
    let refused = Command::new(BIN)
        .args(["--nodes", &list, "serve", "--listen", "0.0.0.0:0"])
        .env_remove("REDQUORUM_NODES")
        .output()
        .await
        .unwrap();
    assert_eq!(refused.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("--token-file"), "{stderr}");

    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, "s3cret-token-0123456789\n").unwrap();
    let server = Server::start(&list, &["--token-file", token_file.to_str().unwrap()]).await;
    let url = format!("{}/v1/ids/orders", server.url);
    let anonymous = http().post(&url).send().await.unwrap();
    assert_eq!(anonymous.status(), 401);
    let wrong = http()
        .post(&url)
        .bearer_auth("s3cret-token-0123456780")
        .send()
        .await
        .unwrap();
    assert_eq!(wrong.status(), 401);
    let right = http()
        .post(&url)
        .bearer_auth("s3cret-token-0123456789")
        .send()
        .await
        .unwrap();
    assert_eq!(right.status(), 200);
}

#[tokio::test]
async fn sigterm_ends_every_session_and_releases_its_lease() {
    let (_nodes, list) = cluster().await;
    let server = Server::start(&list, &[]).await;
    let other = Server::start(&list, &[]).await;
    let mut held = Events::open(&format!("{}/v1/locks/shutdown/acquire?ttl=10s", server.url)).await;
    held.next(Duration::from_secs(5)).await.unwrap();
    server.signal("TERM");
    // The stream ends with the release, and the lease is free at once (not after 10 s).
    let released = held.until("released", Duration::from_secs(5)).await;
    assert_eq!(released["released"], true, "{released}");
    let (status, body) = post_json(&format!(
        "{}/v1/locks/shutdown/acquire?session=keepalive",
        other.url
    ))
    .await;
    assert_eq!(status, 200, "{body}");
}

#[tokio::test]
async fn the_python_client_mints_ids_runs_a_period_once_and_fences_a_late_write() {
    let (_nodes, list) = cluster().await;
    let resource = Resource::start().await;
    let (a, b) = (
        Server::start(&list, &[]).await,
        Server::start(&list, &[]).await,
    );
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("fenced_set.lua");
    std::fs::write(&script, redquorum::FENCED_SET_LUA).unwrap();
    let clients = concat!(env!("CARGO_MANIFEST_DIR"), "/../clients/python");
    let out = Command::new("python3")
        .args(["-m", "unittest", "-v", "test_redquorum"])
        .current_dir(clients)
        .env("REDQUORUM_SERVE_URLS", format!("{},{}", a.url, b.url))
        .env("REDQUORUM_RESOURCE", resource.nodes.addr(0).to_string())
        .env("REDQUORUM_FENCED_SET_LUA", &script)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
        .await
        .expect("python3 runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "the Python client's tests failed:\n{stderr}"
    );
    assert!(stderr.contains("Ran 4 tests"), "{stderr}");
}

/// `python3 -c CODE` with the Python client importable; its stdout.
async fn python(code: &str) -> String {
    let clients = concat!(env!("CARGO_MANIFEST_DIR"), "/../clients/python");
    let out = Command::new("python3")
        .args(["-c", code])
        .current_dir(clients)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
        .await
        .expect("python3 runs");
    assert!(
        out.status.success(),
        "python3 -c {code:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

#[tokio::test]
async fn serve_speaks_tls_a_unix_socket_and_http2() {
    let (_nodes, list) = cluster().await;
    // HTTPS with the operator's certificate: a client trusting its CA mints IDs.
    let pki = tokio::task::spawn_blocking(redquorum_testkit::secure::Pki::generate)
        .await
        .unwrap();
    let tls = Server::start(
        &list,
        &[
            "--tls-cert",
            pki.server.cert.to_str().unwrap(),
            "--tls-key",
            pki.server.key.to_str().unwrap(),
        ],
    )
    .await;
    assert!(tls.url.starts_with("https://"), "{}", tls.url);
    let code = format!(
        "import redquorum; print(redquorum.Client({:?}, cafile={:?}).next_ids('tls', count=2))",
        tls.url,
        pki.ca.to_str().unwrap()
    );
    assert!(python(&code).await.starts_with('['));

    // A Unix socket: no port, the file's permissions decide who calls.
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("rq.sock");
    let mut unix = Command::new(BIN)
        .args([
            "--nodes",
            &list,
            "serve",
            "--listen",
            &format!("unix:{}", socket.display()),
        ])
        .env_remove("REDQUORUM_NODES")
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(unix.stdout.take().unwrap()).lines();
    let line = tokio::time::timeout(Duration::from_secs(20), lines.next_line())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(line, format!("listening on unix:{}", socket.display()));
    let code = format!(
        "import redquorum; print(redquorum.Client('unix:{}').next_id('unix'))",
        socket.display()
    );
    assert!(python(&code).await.parse::<u64>().is_ok());

    // HTTP/2 (cleartext, prior knowledge): 64 concurrent calls over one connection.
    let server = Server::start(&list, &[]).await;
    let h2 = reqwest::Client::builder()
        .http2_prior_knowledge()
        .build()
        .unwrap();
    let calls = (0..64).map(|_| {
        let (h2, url) = (h2.clone(), format!("{}/v1/ids/h2", server.url));
        async move {
            let r = h2.post(url).send().await.unwrap();
            assert_eq!(r.version(), reqwest::Version::HTTP_2);
            assert_eq!(r.status(), 200);
        }
    });
    futures_util::future::join_all(calls).await;
}

#[tokio::test]
async fn pool_members_split_the_units_and_a_drain_is_acknowledged_before_the_hand_over() {
    let (_nodes, list) = cluster().await;
    let added = Command::new(BIN)
        .args([
            "--nodes", &list, "units", "add", "parsers", "u1", "u2", "u3", "u4",
        ])
        .env_remove("REDQUORUM_NODES")
        .output()
        .await
        .unwrap();
    assert!(added.status.success(), "units add: {added:?}");
    let server = Server::start(&list, &[]).await;
    let join = |id: &str| {
        format!(
            "{}/v1/pools/parsers/join?id={id}&interval=500ms&drain_timeout=10s",
            server.url
        )
    };
    let units_of = |e: &Value| -> Vec<String> {
        serde_json::from_value(e["assignment"]["units"].clone()).unwrap_or_default()
    };

    // Alone, a owns every unit.
    let (a, alone) = wait_active(Events::open(&join("a")).await, 1).await;
    assert_eq!(units_of(&alone), ["u1", "u2", "u3", "u4"], "{alone}");
    let session_a = a_session(&a);

    // b joins: a is asked to drain the units it gives up, and the new view becomes active only
    // after a acknowledges (or its drain timeout passes).
    let mut b = Events::open(&join("b")).await;
    let mut a = a;
    let drain = a.until("drain", Duration::from_secs(10)).await;
    let given: Vec<String> = serde_json::from_value(drain["gives_up"].clone()).unwrap();
    assert_eq!(given.len(), 2, "a gives up half of the units: {drain}");
    let n = drain["drain"].as_u64().unwrap();
    // The caller takes its time to stop the work: meanwhile the new view is not active (b
    // owns nothing a gives up).
    let stalling = Instant::now() + Duration::from_secs(1);
    while let Some(e) = b
        .next(stalling.saturating_duration_since(Instant::now()))
        .await
    {
        let active_two = e["assignment"]["state"] == "active" && e["assignment"]["replicas"] == 2;
        assert!(
            !active_two,
            "the hand-over went ahead before the drain was acknowledged: {e}"
        );
    }
    let acked = Instant::now();
    let (status, ack) = post_json(&format!(
        "{}/v1/sessions/{session_a}/drained?drain={n}",
        server.url
    ))
    .await;
    assert_eq!(status, 200, "{ack}");
    let (status, again) = post_json(&format!(
        "{}/v1/sessions/{session_a}/drained?drain={n}",
        server.url
    ))
    .await;
    assert_eq!(status, 400, "a drain acknowledged twice: {again}");
    let (_a, ea) = wait_active(a, 2).await;
    let (_b, eb) = wait_active(b, 2).await;
    assert!(
        acked.elapsed() < Duration::from_secs(5),
        "the hand-over waited for the drain timeout, not the acknowledgement"
    );
    let (ua, ub) = (units_of(&ea), units_of(&eb));
    assert_eq!(ua.len() + ub.len(), 4, "{ea} {eb}");
    assert!(
        ua.iter().all(|u| !ub.contains(u)),
        "a unit has two owners: {ua:?} {ub:?}"
    );
    assert!(
        given.iter().all(|u| ub.contains(u)),
        "b did not get what a gave up: {given:?} {ub:?}"
    );
}

/// The session ID of a stream's first event (recorded by `wait_active`'s caller).
fn a_session(events: &Events) -> String {
    events
        .first_session
        .clone()
        .expect("the stream's first event named its session")
}

/// Issue 43's story through `serve`: a caller's `/complete` passes the loss check and its
/// server stops (SIGSTOP) just before the record; the lease lapses; a caller of another server
/// takes the job over, begins the period and gives it up; the first server resumes and sends
/// the record. Returns the late `/complete`'s answer and the next begin's.
#[cfg(feature = "test-util")]
async fn a_late_complete_through_a_stopped_server(unfenced: bool) -> ((u16, Value), (u16, Value)) {
    let (_nodes, list) = cluster().await;
    let dir = tempfile::tempdir().unwrap();
    let resume = dir.path().join("resume");
    let resume_arg = resume.display().to_string();
    let mut weakened: Vec<&str> = Vec::new();
    if unfenced {
        weakened.push("--unfenced-records-for-tests");
    }
    let mut a_args = weakened.clone();
    a_args.extend(["--record-pause-for-tests", resume_arg.as_str()]);
    let a = Server::start(&list, &a_args).await;
    let b = Server::start(&list, &weakened).await;
    let begin = |server: &Server, wait: &str| {
        format!(
            "{}/v1/jobs/late/periods/p1/begin?ttl=1s&wait={wait}&session=keepalive&keepalive=1h",
            server.url
        )
    };
    let (status, begun) = post_json(&begin(&a, "0s")).await;
    assert_eq!(
        (status, &begun["event"]),
        (200, &Value::from("begun")),
        "{begun}"
    );
    let session = begun["session"].as_str().unwrap().to_string();
    let complete_url = format!("{}/v1/sessions/{session}/complete", a.url);
    let complete = tokio::spawn(async move { post_json(&complete_url).await });
    let paused = dir.path().join("resume.paused");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !paused.exists() {
        assert!(
            Instant::now() < deadline,
            "the complete never reached its record"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    a.signal("STOP");

    let (status, taken) = post_json(&begin(&b, "10s")).await;
    assert_eq!(
        (status, &taken["event"]),
        (200, &Value::from("begun")),
        "{taken}"
    );
    let b_session = taken["session"].as_str().unwrap();
    let (status, _) = post_json(&format!("{}/v1/sessions/{b_session}/release", b.url)).await;
    assert_eq!(status, 200, "the second caller gives the period up");

    a.signal("CONT");
    std::fs::write(&resume, b"").unwrap();
    let late = complete.await.unwrap();
    let next = post_json(&begin(&b, "10s")).await;
    println!("late complete: {late:?}\nnext begin: {next:?}");
    (late, next)
}

#[cfg(feature = "test-util")]
#[tokio::test]
async fn a_complete_whose_record_goes_out_after_the_lease_was_lost_answers_409() {
    let ((status, late), (_, next)) = a_late_complete_through_a_stopped_server(false).await;
    assert_eq!(
        (status, &late["error"]["code"]),
        (409, &Value::from("lease_lost")),
        "a record sent after another caller took the job over must not be `recorded: true`: \
         {late}"
    );
    assert_eq!(
        next["event"], "begun",
        "the second caller began the period and gave it up: it must be due again: {next}"
    );
}

#[cfg(feature = "test-util")]
#[tokio::test]
async fn with_unfenced_records_a_late_complete_is_recorded_and_the_period_skipped() {
    let ((status, late), (_, next)) = a_late_complete_through_a_stopped_server(true).await;
    assert!(
        status == 200 && late["recorded"] == true && next["event"] == "done",
        "without the protection, the late record must count and the period look done (late \
         {status} {late}, next {next}); if not, this test has no teeth"
    );
}
