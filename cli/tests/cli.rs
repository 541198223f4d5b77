//! The `redquorum` binary against real nodes: `check` exit codes, `id next`, bad input, and
//! IDs from separate processes checked together with in-process generators.

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use std::process::Output;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redquorum::{Client, Config, IdGenerator};
use redquorum_testkit::checker::{check_ids, IdCall};
use redquorum_testkit::{Cluster, NodeSpec};

const BIN: &str = env!("CARGO_BIN_EXE_redquorum");

async fn redquorum(args: &[&str]) -> Output {
    tokio::process::Command::new(BIN)
        .args(args)
        .env_remove("REDQUORUM_NODES")
        .env_remove("REDQUORUM_CLUSTER")
        .output()
        .await
        .expect("the redquorum binary runs")
}

/// The operator's one `redquorum cluster init` on new nodes; returns the `--nodes` list.
async fn set_up(cluster: &Cluster) -> String {
    init_list(&cluster.urls().join(",")).await
}

/// `redquorum --nodes LIST cluster init`, which must succeed; returns LIST.
async fn init_list(nodes: &str) -> String {
    let out = redquorum(&["--nodes", nodes, "cluster", "init"]).await;
    assert!(
        out.status.success(),
        "cluster init failed: {:?}",
        text(&out)
    );
    nodes.to_string()
}

fn text(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_exits_zero_only_when_every_node_is_safe_and_reachable() {
    let safe = Cluster::start(3).await;
    let nodes = set_up(&safe).await;
    let out = redquorum(&["--nodes", &nodes, "check"]).await;
    let (stdout, stderr) = text(&out);
    println!("{stdout}{stderr}");
    assert_eq!(
        out.status.code(),
        Some(0),
        "three safe nodes: exit 0\n{stdout}{stderr}"
    );
    assert_eq!(
        stdout
            .lines()
            .filter(|l| l.starts_with("node") && l.contains(" OK "))
            .count(),
        3,
        "{stdout}"
    );

    let mixed = Cluster::start_with(vec![
        NodeSpec::safe(),
        NodeSpec::safe(),
        NodeSpec::with_args(&["--appendfsync", "everysec"]),
    ])
    .await;
    let mut urls = mixed.urls();
    urls.push("redis://127.0.0.1:1".into()); // nothing listens there
    let out = redquorum(&["--nodes", &urls.join(","), "check"]).await;
    let (stdout, _) = text(&out);
    println!("{stdout}");
    assert_eq!(
        out.status.code(),
        Some(1),
        "an unsafe and a down node: exit 1\n{stdout}"
    );
    let row = |i: usize| {
        stdout
            .lines()
            .find(|l| l.starts_with(&format!("node{i} ")))
            .unwrap_or_default()
            .to_string()
    };
    assert!(
        row(2).contains("UNSAFE") && row(2).contains("appendfsync everysec"),
        "{}",
        row(2)
    );
    assert!(
        row(3).contains("DOWN") && row(3).contains("refused"),
        "{}",
        row(3)
    );
}

/// `check` names the server and its own version in the table and in JSON: `redis 7.0.15` on
/// Redis; on Valkey (`REDQUORUM_TEST_SERVER=valkey-server`, scripts/valkey-tests.sh) `valkey
/// 8.0.1`, not the `redis_version:7.2.4` it reports for compatibility (still JSON's `version`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_names_the_server_and_its_own_version() {
    let cluster = Cluster::start(3).await;
    // What the node itself says, read raw: its name, and the version field of that name.
    let name = if redquorum_testkit::server_is_valkey() {
        "valkey"
    } else {
        "redis"
    };
    let info: String = redis::cmd("INFO")
        .arg("server")
        .query_async(&mut cluster.node(0).direct_connection().await)
        .await
        .expect("INFO server");
    let field = |f: &str| {
        info.lines()
            .find_map(|l| l.trim_end().strip_prefix(&format!("{f}:")))
            .map(str::to_string)
    };
    let version = field(&format!("{name}_version"))
        .unwrap_or_else(|| panic!("a {name} node reports {name}_version:\n{info}"));
    let compatible = field("redis_version").expect("every server reports redis_version");
    assert_eq!(
        field("server_name").as_deref(),
        (name == "valkey").then_some("valkey"),
        "the node runs {name}:\n{info}"
    );

    let nodes = set_up(&cluster).await;
    let out = redquorum(&["--nodes", &nodes, "check"]).await;
    let (stdout, stderr) = text(&out);
    println!("{stdout}{stderr}");
    assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
    let label = format!(" {name} {version} ");
    let rows: Vec<&str> = stdout.lines().filter(|l| l.starts_with("node")).collect();
    assert!(
        rows.len() == 4 && rows[1..].iter().all(|r| r.contains(&label)),
        "every node's row names{label}: {stdout}"
    );

    let out = redquorum(&["--nodes", &nodes, "--output", "json", "check"]).await;
    let v = json(text(&out).0.trim_end());
    for n in v["nodes"].as_array().expect("nodes") {
        assert_eq!(
            (&n["server"], &n["server_version"], &n["version"]),
            (
                &serde_json::json!(name),
                &serde_json::json!(version),
                &serde_json::json!(compatible)
            ),
            "{n}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn id_next_prints_increasing_ids_and_says_why_without_a_quorum() {
    let cluster = Cluster::start(3).await;
    let nodes = set_up(&cluster).await;
    let out = redquorum(&["--nodes", &nodes, "id", "next", "jobs", "--count", "5"]).await;
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stderr}");
    let ids: Vec<u64> = stdout
        .lines()
        .map(|l| l.parse().expect("one ID per line"))
        .collect();
    assert_eq!(ids.len(), 5);
    assert!(
        ids.windows(2).all(|w| w[1] == w[0] + 1),
        "consecutive and increasing: {ids:?}"
    );

    let out = redquorum(&["--nodes", &nodes, "id", "next", "jobs"]).await;
    let next: u64 = text(&out).0.trim().parse().expect("one ID");
    assert!(
        next > ids[4],
        "a later call gets a larger ID ({next} after {ids:?})"
    );

    cluster.node(0).kill().await;
    cluster.node(1).kill().await;
    let out = redquorum(&[
        "--nodes",
        &nodes,
        "--node-timeout",
        "200ms",
        "id",
        "next",
        "jobs",
    ])
    .await;
    let (stdout, stderr) = text(&out);
    assert!(!out.status.success(), "two of three nodes down must fail");
    assert!(
        stdout.is_empty(),
        "no ID may be printed without a quorum: {stdout}"
    );
    assert!(
        stderr.contains("no majority") && stderr.contains("node0") && stderr.contains("node1"),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_a_clear_error_and_a_nonzero_exit() {
    let cases: &[(&[&str], &str)] = &[
        (&["--nodes", "", "check"], "no nodes configured"),
        (&["--nodes", "redis://h:1,redis://h:1", "check"], "same URL"),
        (&["--nodes", "http://h:1", "check"], "unsupported scheme"),
        (
            &["--nodes", "redis://u:hunter2-pw@h:notaport", "check"],
            "malformed URL",
        ),
        (
            &["--nodes", "redis://h:1", "--node-timeout", "0s", "check"],
            "node_timeout",
        ),
        (
            &["--nodes", "redis://h:1", "--node-timeout", "soon", "check"],
            "500ms",
        ),
        (
            &["--nodes", "redis://h:1", "id", "next", ""],
            "sequence name is empty",
        ),
        (&["check"], "REDQUORUM_NODES is not set"),
    ];
    for (args, expected) in cases {
        let out = redquorum(args).await;
        let (_, stderr) = text(&out);
        assert!(!out.status.success(), "{args:?} must fail");
        assert!(
            stderr.contains(expected),
            "{args:?}: expected {expected:?} in: {stderr}"
        );
        assert!(
            !stderr.contains("hunter2-pw"),
            "a password leaked: {stderr}"
        );
        assert!(
            !stderr.contains("panicked"),
            "no panics on bad input: {stderr}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ids_from_separate_processes_and_clients_are_unique_and_ordered() {
    let cluster = Cluster::start(5).await;
    let urls = cluster.urls();
    init_list(&urls.join(",")).await;
    let calls: Arc<Mutex<Vec<IdCall>>> = Arc::default();
    let limit = Duration::from_secs(15);
    let start = Instant::now();

    // Six generators in this process, each with its own client and eight callers...
    let mut tasks = Vec::new();
    for g in 0..6 {
        let client = Client::connect(Config::from_urls(&urls).expect("valid"))
            .await
            .expect("valid");
        let gen = IdGenerator::new(&client, "mixed").expect("valid");
        for c in 0..8 {
            let (gen, calls) = (gen.clone(), calls.clone());
            tasks.push(tokio::spawn(async move {
                for _ in 0..150 {
                    let t0 = Instant::now();
                    let ids = gen.next_ids(1).await.expect("healthy cluster");
                    calls.lock().unwrap().push(IdCall {
                        who: format!("client{g}/caller{c}"),
                        start: t0,
                        end: Instant::now(),
                        ids: ids.collect(),
                    });
                }
            }));
        }
    }
    // ...and two more generators, each a loop of separate `redquorum id next` processes.
    let nodes = urls.join(",");
    for p in 0..2 {
        let (nodes, calls) = (nodes.clone(), calls.clone());
        tasks.push(tokio::spawn(async move {
            let mut n = 0;
            while n < 12 && start.elapsed() < limit {
                n += 1;
                let t0 = Instant::now();
                let out =
                    redquorum(&["--nodes", &nodes, "id", "next", "mixed", "--count", "50"]).await;
                let end = Instant::now();
                assert!(out.status.success(), "process {p}: {}", text(&out).1);
                let ids = text(&out)
                    .0
                    .lines()
                    .map(|l| l.parse().expect("an ID"))
                    .collect();
                calls.lock().unwrap().push(IdCall {
                    who: format!("process{p}/call{n}"),
                    start: t0,
                    end,
                    ids,
                });
            }
        }));
    }
    for t in tasks {
        t.await.expect("a caller failed");
    }
    let calls = calls.lock().unwrap().clone();
    let total: usize = calls.iter().map(|c| c.ids.len()).sum();
    println!(
        "{total} IDs from {} calls (6 clients x 8 callers + 2 process loops) in {:?}",
        calls.len(),
        start.elapsed()
    );
    assert!(total >= 7_200, "at least 7,200 IDs (got {total})");
    if let Err(v) = check_ids(&calls) {
        panic!("checker: {v}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_run_passes_the_token_and_propagates_the_exit_code() {
    let cluster = Cluster::start(3).await;
    let nodes = set_up(&cluster).await;
    let out = redquorum(&[
        "--nodes",
        &nodes,
        "lock",
        "run",
        "nightly",
        "--ttl",
        "2s",
        "--",
        "sh",
        "-c",
        "echo token=$REDQUORUM_FENCING_TOKEN name=$REDQUORUM_LOCK_NAME; exit 7",
    ])
    .await;
    let (stdout, stderr) = text(&out);
    assert_eq!(
        out.status.code(),
        Some(7),
        "the child's exit code is propagated: {stderr}"
    );
    assert!(stdout.contains("name=nightly"), "{stdout}");
    let token: u64 = stdout
        .split("token=")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|t| t.parse().ok())
        .expect("a numeric token");
    assert!(token >= 1);

    // The next run gets a larger token; the lock was released when the child ended.
    let out = redquorum(&[
        "--nodes",
        &nodes,
        "lock",
        "run",
        "nightly",
        "--",
        "sh",
        "-c",
        "echo $REDQUORUM_FENCING_TOKEN",
    ])
    .await;
    assert!(out.status.success(), "{}", text(&out).1);
    let next: u64 = text(&out).0.trim().parse().expect("token");
    assert!(
        next > token,
        "tokens increase across runs ({token} then {next})"
    );

    // --wait 0 while someone else holds it: exit 3 with a clear message, the command never runs.
    let client = Client::connect(Config::from_urls(cluster.urls()).unwrap())
        .await
        .unwrap();
    let held = redquorum::Lock::new(&client, "nightly", Duration::from_secs(10))
        .unwrap()
        .try_acquire()
        .await
        .unwrap();
    let out = redquorum(&[
        "--nodes", &nodes, "lock", "run", "nightly", "--wait", "0", "--", "sh", "-c", "echo RAN",
    ])
    .await;
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    assert!(
        !stdout.contains("RAN"),
        "the command must not run without the lock"
    );
    assert!(
        stderr.contains("not acquired") && stderr.contains("held"),
        "{stderr}"
    );
    held.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_run_kills_the_whole_process_group_when_the_lease_is_lost() {
    let cluster = Cluster::start(3).await;
    let nodes = set_up(&cluster).await;
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("grandchild.pid");
    // The child starts a grandchild (sleep) and waits for it.
    let script = format!("sleep 60 & echo $! > {}; wait", pidfile.display());
    let started = Instant::now();
    let run = tokio::process::Command::new(BIN)
        .args([
            "--nodes", &nodes, "lock", "run", "cut", "--ttl", "1s", "--", "sh", "-c", &script,
        ])
        .env_remove("REDQUORUM_NODES")
        .env_remove("REDQUORUM_CLUSTER")
        .output();
    let cut = async {
        // Wait until the grandchild exists, then cut the holder off from a majority.
        while !pidfile.exists() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        cluster.node(0).cut_off();
        cluster.node(1).cut_off();
    };
    let (out, ()) = tokio::join!(run, cut);
    let out = out.unwrap();
    let took = started.elapsed();
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(4), "a lost lease exits 4: {stderr}");
    assert!(stderr.contains("lost"), "{stderr}");
    assert!(
        took < Duration::from_secs(10),
        "the child must be stopped promptly, took {took:?}"
    );
    let pid: i32 = std::fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let alive = std::path::Path::new(&format!("/proc/{pid}")).exists()
        && !std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .unwrap_or_default()
            .contains(") Z ");
    assert!(
        !alive,
        "the grandchild (pid {pid}) must have been killed with the process group"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_sigterm_lock_run_kills_a_child_that_ignores_it_by_the_lease_deadline() {
    let cluster = Cluster::start(3).await;
    let nodes = set_up(&cluster).await;
    let dir = tempfile::tempdir().unwrap();
    let ready = dir.path().join("ready");
    // The child ignores SIGTERM (and so does the sleep it execs): only SIGKILL stops it.
    let script = format!("trap '' TERM; touch {}; exec sleep 60", ready.display());
    let mut run = tokio::process::Command::new(BIN)
        .args([
            "--nodes", &nodes, "lock", "run", "term", "--ttl", "1s", "--", "sh", "-c", &script,
        ])
        .env_remove("REDQUORUM_NODES")
        .env_remove("REDQUORUM_CLUSTER")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    while !ready.exists() {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    // We are asked to stop, and the lease is lost right after (a majority is cut off): the
    // child must not outlive the lease by the 5 s grace a clean shutdown would give it.
    let sent = Instant::now();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(run.id().unwrap() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    cluster.node(0).cut_off();
    cluster.node(1).cut_off();
    let status = tokio::time::timeout(Duration::from_secs(15), run.wait())
        .await
        .expect("lock run must exit")
        .unwrap();
    let took = sent.elapsed();
    assert_eq!(status.code(), Some(143), "a SIGTERM'd lock run exits 143");
    assert!(
        took < Duration::from_millis(2500),
        "the child ignoring SIGTERM must be killed by the lease deadline (1 s TTL), not after \
         the 5 s grace: took {took:?}"
    );
}

/// A host suspended during the SIGKILL grace: the lease was lost (a conflict) with most of its
/// validity left, the command ignores SIGTERM, and the host then sleeps for a minute (staged:
/// the process's boot clock is moved ahead, test-util only). The validity ended during the
/// suspend, so the command must get SIGKILL at once after the resume, not after the grace's
/// remainder on the monotonic clock (which did not count the suspend).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_suspend_during_the_grace_gets_a_command_ignoring_sigterm_killed_at_once() {
    use tokio::io::AsyncBufReadExt;
    let cluster = Cluster::start(3).await;
    let nodes = set_up(&cluster).await;
    let dir = tempfile::tempdir().unwrap();
    let (ready, ahead) = (dir.path().join("ready"), dir.path().join("ahead-ms"));
    // The child ignores SIGTERM (and so does the sleep it execs): only SIGKILL stops it.
    let script = format!("trap '' TERM; touch {}; exec sleep 120", ready.display());
    let mut run = tokio::process::Command::new(BIN)
        .args([
            "--nodes", &nodes, "lock", "run", "grace", "--ttl", "12s", "--", "sh", "-c", &script,
        ])
        .env_remove("REDQUORUM_NODES")
        .env_remove("REDQUORUM_CLUSTER")
        .env("REDQUORUM_BOOT_CLOCK_AHEAD_FILE_FOR_TESTS", &ahead)
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    while !ready.exists() {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Another value takes every copy: the next extension (a third of the 12 s TTL after the
    // grant) meets a conflict, and the lease is lost with about 8 s of validity left.
    for i in 0..3 {
        let mut con = cluster.node(i).direct_connection().await;
        let _: i64 = redis::cmd("HSET")
            .arg("rq:lock:grace")
            .arg("v")
            .arg("intruder:1:elsewhere")
            .query_async(&mut con)
            .await
            .unwrap();
    }
    let mut stderr = tokio::io::BufReader::new(run.stderr.take().unwrap()).lines();
    loop {
        let line = tokio::time::timeout(Duration::from_secs(15), stderr.next_line())
            .await
            .expect("lock run reports the lost lease within 15 s")
            .unwrap()
            .expect("lock run's stderr goes on until it reports the loss");
        if line.contains("lost") {
            break;
        }
    }
    // The host sleeps for a minute in the middle of the grace.
    std::fs::write(&ahead, "60000").unwrap();
    let staged = Instant::now();
    let status = tokio::time::timeout(Duration::from_secs(20), run.wait())
        .await
        .expect("lock run must exit")
        .unwrap();
    let took = staged.elapsed();
    println!("the command was killed {took:?} after the staged suspend");
    assert_eq!(status.code(), Some(4), "a lost lease exits 4");
    assert!(
        took < Duration::from_millis(2500),
        "after a suspend past the lease's validity the command ignoring SIGTERM must be killed \
         at once, not after the grace left on the monotonic clock (about 8 s): took {took:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn index_watch_prints_assignment_changes_and_leaves_on_sigterm() {
    use tokio::io::{AsyncBufReadExt, BufReader};
    let cluster = Cluster::start(3).await;
    let nodes = set_up(&cluster).await;
    let spawn = |id: &str| {
        tokio::process::Command::new(BIN)
            .args([
                "--nodes",
                &nodes,
                "index",
                "watch",
                "workers",
                "--interval",
                "300ms",
                "--id",
                id,
            ])
            .env_remove("REDQUORUM_NODES")
            .env_remove("REDQUORUM_CLUSTER")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap()
    };
    let mut a = spawn("a");
    let mut lines_a = BufReader::new(a.stdout.take().unwrap()).lines();
    // b starts while a sets the new cluster up: b found the nodes blank when it connected, and
    // its repairs' census (after their settle time) meets a's bootstrap.
    tokio::time::sleep(Duration::from_millis(150)).await;
    let mut b = spawn("b");
    let mut lines_b = BufReader::new(b.stdout.take().unwrap()).lines();
    let pattern = |l: &str| {
        let parts: Vec<&str> = l.split(' ').collect();
        parts.len() == 4
            && parts[0]
                .strip_prefix("version=")
                .is_some_and(|v| v.parse::<u64>().is_ok())
            && parts[1]
                .strip_prefix("index=")
                .is_some_and(|v| v.parse::<u32>().is_ok())
            && parts[2]
                .strip_prefix("replicas=")
                .is_some_and(|v| v.parse::<u32>().is_ok())
            && (parts[3] == "state=prepare" || parts[3] == "state=active")
    };
    async fn until(
        lines: &mut tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
        want: &str,
        ok: impl Fn(&str) -> bool,
    ) -> String {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let line = tokio::time::timeout(
                deadline.saturating_duration_since(Instant::now()),
                lines.next_line(),
            )
            .await
            .unwrap_or_else(|_| panic!("no line with {want} within 10 s"))
            .unwrap()
            .unwrap_or_else(|| panic!("stream ended before {want}"));
            assert!(ok(&line), "malformed line: {line:?}");
            if line.contains(want) {
                return line;
            }
        }
    }
    let la = until(&mut lines_a, "replicas=2 state=active", pattern).await;
    let lb = until(&mut lines_b, "replicas=2 state=active", pattern).await;
    assert_ne!(
        la.split(' ').nth(1),
        lb.split(' ').nth(1),
        "two members get different indexes: {la} / {lb}"
    );

    // b leaves on SIGTERM; a sees the group shrink to one.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(b.id().unwrap() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let status = tokio::time::timeout(Duration::from_secs(10), b.wait())
        .await
        .expect("b exits on SIGTERM")
        .unwrap();
    assert!(status.success(), "b leaves cleanly: {status:?}");
    let la = until(&mut lines_a, "replicas=1 state=active", pattern).await;
    assert!(la.contains("index=0"), "{la}");
    // a, the last member, leaves on SIGTERM too. The cluster stayed healthy throughout: neither
    // process may have warned (b once said its three nodes were "quarantined" and "cannot be
    // repaired yet": its repairs met a's set-up of the new cluster). Only the loss of the
    // 300 ms group-leader lease is excused: a loaded machine can delay its extensions, and it
    // says so itself.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(a.id().unwrap() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let status = tokio::time::timeout(Duration::from_secs(10), a.wait())
        .await
        .expect("a exits on SIGTERM")
        .unwrap();
    assert!(status.success(), "a leaves cleanly: {status:?}");
    for (id, child) in [("a", &mut a), ("b", &mut b)] {
        let mut stderr = String::new();
        tokio::io::AsyncReadExt::read_to_string(child.stderr.as_mut().unwrap(), &mut stderr)
            .await
            .unwrap();
        println!("{id}'s stderr:\n{stderr}");
        let warned = stderr
            .lines()
            .filter(|l| l.contains("WARN") || l.contains("ERROR"))
            .any(|l| !l.contains("lease lost"));
        assert!(!warned, "{id} warned on a healthy cluster:\n{stderr}");
    }
}

/// The fencing scenario with a REAL paused holder: `redquorum lock run` holds the lock and its
/// command writes to a resource after a delay; the holder process is frozen (SIGSTOP) past its
/// TTL, another client takes the lock and writes with a larger token; the frozen holder's
/// command then writes with its old token. Returns the resource's final value.
async fn frozen_process_scenario(fenced: bool) -> (String, u64, u64) {
    use nix::sys::signal::{kill, Signal};
    use nix::unistd::Pid;
    let cluster = Cluster::start(3).await;
    let resource = Cluster::start(1).await;
    let port = resource.node(0).host_port();
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("fenced_set.lua");
    std::fs::write(&script, redquorum::FENCED_SET_LUA).unwrap();
    let token_file = dir.path().join("token");
    let write = if fenced {
        format!("redis-cli -p {port} --eval {} balance balance:fence , $REDQUORUM_FENCING_TOKEN 'written by A'", script.display())
    } else {
        format!("redis-cli -p {port} SET balance 'written by A'")
    };
    let cmd = format!(
        "echo $REDQUORUM_FENCING_TOKEN > {}; sleep 2.5; {write}",
        token_file.display()
    );
    let nodes = set_up(&cluster).await;
    let mut holder = tokio::process::Command::new(BIN)
        .args([
            "--nodes", &nodes, "lock", "run", "account", "--ttl", "1s", "--", "sh", "-c", &cmd,
        ])
        .env_remove("REDQUORUM_NODES")
        .env_remove("REDQUORUM_CLUSTER")
        .spawn()
        .unwrap();
    while !token_file.exists() {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let token_a: u64 = loop {
        if let Ok(t) = std::fs::read_to_string(&token_file)
            .unwrap_or_default()
            .trim()
            .parse()
        {
            break t;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    // Freeze the holder process (not its command): it can neither extend nor stop the command.
    let pid = Pid::from_raw(holder.id().unwrap() as i32);
    kill(pid, Signal::SIGSTOP).unwrap();

    // Another client takes the lock once A's lease expired, and writes with its token.
    let client = Client::connect(Config::from_urls(cluster.urls()).unwrap())
        .await
        .unwrap();
    let b = redquorum::Lock::new(&client, "account", Duration::from_secs(10))
        .unwrap()
        .acquire(Duration::from_secs(5))
        .await
        .expect("B acquires after A's TTL");
    let token_b = b.token().get();
    let mut res = resource.node(0).direct_connection().await;
    let applied = redquorum::fenced_set(
        &mut res,
        "balance",
        "balance:fence",
        b.token(),
        b"written by B",
    )
    .await
    .unwrap();
    assert_eq!(applied, redquorum::FencedWrite::Applied);

    // A's command wakes up and writes with its old token while A is still frozen.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    kill(pid, Signal::SIGCONT).unwrap();
    let _ = tokio::time::timeout(Duration::from_secs(10), holder.wait()).await;
    let value: String = redis::cmd("GET")
        .arg("balance")
        .query_async(&mut res)
        .await
        .unwrap();
    b.release().await.unwrap();
    (value, token_a, token_b)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_really_frozen_holders_late_write_is_rejected_by_its_token() {
    let (value, a, b) = frozen_process_scenario(true).await;
    println!("A token {a}, B token {b}, final value {value:?}");
    assert!(b > a, "the new holder's token is larger");
    assert_eq!(
        value, "written by B",
        "the frozen holder's stale write must be rejected"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_fencing_a_really_frozen_holders_late_write_lands() {
    let (value, _, _) = frozen_process_scenario(false).await;
    assert_eq!(
        value, "written by A",
        "without fencing the stale write is accepted: the checker would fail"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_change_moves_to_a_new_node_list_and_the_old_list_follows_it() {
    let cluster = Cluster::start(5).await;
    let all = cluster.urls();
    let three = init_list(&all[..3].join(",")).await;
    let five = all.join(",");
    let out = redquorum(&["--nodes", &three, "id", "next", "seq", "--count", "3"]).await;
    assert!(out.status.success(), "{}", text(&out).1);
    let last: u64 = text(&out)
        .0
        .lines()
        .last()
        .and_then(|l| l.parse().ok())
        .expect("IDs");

    let out = redquorum(&["--nodes", &five, "id", "next", "seq"]).await;
    let (_, stderr) = text(&out);
    assert!(
        !out.status.success(),
        "five URLs on a three-node cluster must be refused"
    );
    assert!(
        stderr.contains("5 nodes") && stderr.contains("3 nodes"),
        "the refusal names both lists: {stderr}"
    );

    let out = redquorum(&["--nodes", &three, "cluster", "change", "--to", &five]).await;
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stderr}");
    assert!(stdout.contains("5 new nodes marked"), "{stdout}");

    let out = redquorum(&["--nodes", &five, "cluster", "show"]).await;
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stdout.contains("(5 nodes)") && stdout.contains("replaced cluster"),
        "{stdout}"
    );

    let out = redquorum(&["--nodes", &five, "id", "next", "seq"]).await;
    let next: u64 = text(&out)
        .0
        .trim()
        .parse()
        .expect("an ID through the new list");
    assert!(next > last, "{next} must follow {last}");
    // A command still given the old list follows the change: its ID follows the new list's.
    let out = redquorum(&["--nodes", &three, "id", "next", "seq"]).await;
    let (stdout, stderr) = text(&out);
    assert!(
        out.status.success(),
        "the old list follows the change: {stderr}"
    );
    let followed: u64 = stdout.trim().parse().expect("an ID through the old list");
    assert!(followed > next, "{followed} must follow {next}");
    assert!(
        stderr.contains("follows the new cluster"),
        "the follow is logged: {stderr}"
    );
}

/// The README's cron recipe after an OOM kill: `lock run --wait 0` is killed with -9 while it
/// holds the lease; the next host's `lock run --wait 0` must take the abandoned lease over
/// (after the TTL plus drift), not exit 3 ("held") for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cron_one_shot_runs_after_the_previous_holder_was_killed() {
    let cluster = Cluster::start(3).await;
    let nodes = set_up(&cluster).await;
    let mut holder = tokio::process::Command::new(BIN)
        .args([
            "--nodes", &nodes, "lock", "run", "nightly", "--ttl", "2s", "--wait", "0",
        ])
        .args(["--", "sleep", "30"])
        .env_remove("REDQUORUM_NODES")
        .env_remove("REDQUORUM_CLUSTER")
        .kill_on_drop(true)
        .spawn()
        .expect("the first cron run");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    holder.kill().await.expect("kill -9 the holder");
    let started = Instant::now();
    let out = redquorum(&[
        "--nodes", &nodes, "lock", "run", "nightly", "--ttl", "2s", "--wait", "0", "--", "true",
    ])
    .await;
    let took = started.elapsed();
    println!(
        "the next cron run exited {:?} after {took:?}",
        out.status.code()
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "the next one-shot run takes the abandoned lease over and runs: {}",
        text(&out).1
    );
    assert!(
        took < Duration::from_secs(8),
        "within the TTL plus drift: {took:?}"
    );
}

/// An operator's `cluster change` killed at each point of its procedure (the process aborts,
/// as `kill -9` would: no claim released) is finished by running the same command again; the
/// new cluster then follows the old one's IDs, the old list is refused, and a third run says
/// there is nothing to do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_cluster_change_is_finished_by_running_it_again() {
    for phase in ["sealed", "started", "page", "marked"] {
        let cluster = Cluster::start(4).await;
        let all = cluster.urls();
        let old = init_list(&all[..3].join(",")).await;
        // Node 2 is swapped for node 3.
        let new = [all[0].as_str(), all[1].as_str(), all[3].as_str()].join(",");
        let fast = ["--operation-timeout", "600ms"];
        let mut args = vec!["--nodes", old.as_str()];
        args.extend(["id", "next", "orders", "--count", "20"]);
        let out = redquorum(&args).await;
        assert!(out.status.success(), "{}", text(&out).1);
        let last: u64 = text(&out)
            .0
            .lines()
            .last()
            .and_then(|l| l.parse().ok())
            .expect("IDs");

        let mut args = vec!["--nodes", old.as_str()];
        args.extend(fast);
        args.extend(["cluster", "change", "--to", new.as_str()]);
        let mut killed = args.clone();
        killed.extend(["--abort-at-for-tests", phase]);
        let out = redquorum(&killed).await;
        assert!(
            !out.status.success(),
            "{phase}: the change was to be killed there: {}",
            text(&out).0
        );
        let out = redquorum(&args).await;
        let (stdout, stderr) = text(&out);
        assert!(
            out.status.success(),
            "{phase}: running the killed change again must finish it: {stderr}"
        );
        assert!(stdout.contains("replaced by cluster"), "{phase}: {stdout}");
        let out = redquorum(&args).await;
        let (stdout, stderr) = text(&out);
        assert!(
            out.status.success() && stdout.contains("nothing to do"),
            "{phase}: a third run finds the change done: {stdout} {stderr}"
        );

        let out = redquorum(&["--nodes", &new, "id", "next", "orders"]).await;
        let (stdout, stderr) = text(&out);
        let next: u64 = stdout
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{phase}: an ID through the new list: {stderr}"));
        assert!(next > last, "{phase}: {next} must follow {last}");
        // With as many nodes in both lists, a client of the old list works in the new
        // cluster through the nodes both list (its majority is one of the new list): if it
        // gets an ID, the ID follows too.
        let out = redquorum(&["--nodes", &old, "id", "next", "orders"]).await;
        if let Ok(late) = text(&out).0.trim().parse::<u64>() {
            assert!(
                late > next,
                "{phase}: the old list's {late} must follow {next}"
            );
        }
        println!("{phase}: killed, finished by a re-run; {next} follows {last}");
    }
}

/// `units add / remove / list / replace / gc`, with units from arguments and from a file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn units_add_remove_and_list_print_the_pool_sorted() {
    let cluster = Cluster::start(3).await;
    let nodes = set_up(&cluster).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("sites.txt");
    std::fs::write(&file, "site-c\n\nsite-d\r\nsite-e\n").expect("write");
    let file = file.to_str().expect("utf-8 path");
    for args in [
        vec!["units", "add", "parsers", "site-b", "site-a"],
        vec!["units", "add", "parsers", "--from-file", file],
        vec!["units", "remove", "parsers", "site-d"],
    ] {
        let mut all = vec!["--nodes", nodes.as_str()];
        all.extend(args.iter().copied());
        let out = redquorum(&all).await;
        assert!(out.status.success(), "{args:?}: {}", text(&out).1);
    }
    let out = redquorum(&["--nodes", &nodes, "units", "list", "parsers"]).await;
    assert!(out.status.success(), "{}", text(&out).1);
    assert_eq!(text(&out).0, "site-a\nsite-b\nsite-c\nsite-e\n");
    let out = redquorum(&["--nodes", &nodes, "units", "add", "parsers", ""]).await;
    assert!(!out.status.success(), "an empty unit is refused");
    assert!(text(&out).1.contains("unit"), "says why: {}", text(&out).1);
    // `units replace` leaves exactly the units given; `units gc` collects the removals.
    run_ok(&nodes, &["units", "replace", "parsers", "site-e", "site-f"]).await;
    assert_eq!(
        run_ok(&nodes, &["units", "list", "parsers"]).await,
        "site-e\nsite-f\n"
    );
    let gc = run_ok(&nodes, &["units", "gc", "parsers"]).await;
    assert_eq!(gc, "collected 4\n", "site-a..d were removed everywhere");
}

/// Run the CLI with `--nodes nodes` and `args`; it must succeed. Its stdout.
async fn run_ok(nodes: &str, args: &[&str]) -> String {
    let mut all = vec!["--nodes", nodes];
    all.extend(args);
    let out = redquorum(&all).await;
    assert!(out.status.success(), "{all:?}: {}", text(&out).1);
    text(&out).0
}

/// `dist watch` and `dist table`: two member processes share a pool's units; one is killed
/// with SIGKILL (no leave) and the survivor gets every unit once the crashed one's lease has
/// expired; every printed line has the documented form.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dist_watch_and_table_share_units_and_a_killed_member_hands_over() {
    use tokio::io::{AsyncBufReadExt, BufReader};
    let cluster = Cluster::start(3).await;
    let nodes = set_up(&cluster).await;
    let sites: Vec<String> = (0..9).map(|i| format!("site-{i}")).collect();
    let mut add = vec!["--nodes", nodes.as_str(), "units", "add", "parsers"];
    add.extend(sites.iter().map(String::as_str));
    assert!(redquorum(&add).await.status.success());
    let spawn = |id: &str, weight: &str| {
        tokio::process::Command::new(BIN)
            .args([
                "--nodes",
                &nodes,
                "dist",
                "watch",
                "parsers",
                "--interval",
                "300ms",
                "--id",
                id,
                "--weight",
                weight,
            ])
            .env_remove("REDQUORUM_NODES")
            .env_remove("REDQUORUM_CLUSTER")
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap()
    };
    // `version=<v> state=<prepare|active> count=<k> units=<u1,u2,...>`, units sorted.
    let parse = |l: &str| -> Option<(String, Vec<String>)> {
        let p: Vec<&str> = l.split(' ').collect();
        if p.len() != 4 || p[0].strip_prefix("version=")?.parse::<u64>().is_err() {
            return None;
        }
        let state = p[1].strip_prefix("state=")?.to_string();
        let count: usize = p[2].strip_prefix("count=")?.parse().ok()?;
        let units: Vec<String> = match p[3].strip_prefix("units=")? {
            "" => Vec::new(),
            u => u.split(',').map(String::from).collect(),
        };
        let mut sorted = units.clone();
        sorted.sort();
        (count == units.len() && sorted == units && (state == "active" || state == "prepare"))
            .then_some((state, units))
    };
    let mut a = spawn("a", "2");
    let mut lines_a = BufReader::new(a.stdout.take().unwrap()).lines();
    let mut b = spawn("b", "1");
    let mut lines_b = BufReader::new(b.stdout.take().unwrap()).lines();
    // Wait for the table: a holds 6 units (weight 2), b holds 3.
    let table = || async {
        let out = redquorum(&["--nodes", &nodes, "dist", "table", "parsers"]).await;
        assert!(out.status.success(), "dist table: {}", text(&out).1);
        text(&out).0
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    let mut shown = String::new();
    while tokio::time::Instant::now() < deadline {
        shown = table().await;
        let lines: Vec<&str> = shown.lines().collect();
        if lines.len() == 2
            && lines[0].starts_with("a:")
            && lines[0].split(',').count() == 6
            && lines[1].starts_with("b:")
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let lines: Vec<&str> = shown.lines().collect();
    assert_eq!(lines.len(), 2, "two members in the table: {shown:?}");
    assert_eq!(lines[0].split(',').count(), 6, "a has weight 2: {shown:?}");
    assert_eq!(lines[1].split(',').count(), 3, "b has weight 1: {shown:?}");
    // Each process printed lines of the documented form, ending active with its table row.
    for (name, lines, row) in [("a", &mut lines_a, lines[0]), ("b", &mut lines_b, lines[1])] {
        let want: Vec<String> = row[2..].split(',').map(String::from).collect();
        loop {
            let l = tokio::time::timeout(Duration::from_secs(10), lines.next_line())
                .await
                .expect("a line in time")
                .expect("stdout")
                .expect("a line");
            let (state, units) = parse(&l).unwrap_or_else(|| panic!("{name}: bad line {l:?}"));
            if state == "active" && units == want {
                break;
            }
        }
    }
    // An operator pins site-0 to a and drains a: a stays a member with its pin only, b takes
    // the rest; the settings list shows both. Ending the drain gives a its share back.
    run_ok(&nodes, &["units", "pin", "parsers", "site-0", "a"]).await;
    run_ok(&nodes, &["dist", "drain", "parsers", "a"]).await;
    assert_eq!(
        run_ok(&nodes, &["units", "settings", "parsers"]).await,
        "pin site-0 a\ndrained a\n"
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    let drained = "a:site-0\nb:site-1,site-2,site-3,site-4,site-5,site-6,site-7,site-8\n";
    loop {
        let shown = table().await;
        if shown == drained {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the drained table never showed: {shown:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    run_ok(&nodes, &["dist", "drain", "parsers", "a", "--undo"]).await;
    run_ok(&nodes, &["units", "unpin", "parsers", "site-0"]).await;
    assert_eq!(run_ok(&nodes, &["units", "settings", "parsers"]).await, "");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        let shown = table().await;
        let counts: Vec<usize> = shown.lines().map(|l| l.split(',').count()).collect();
        if counts == [6, 3] {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "after the drain ended a never got its share back: {shown:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // SIGKILL b: no leave; its lease expires and a gets every unit.
    b.start_kill().unwrap();
    let _ = b.wait().await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        let l = tokio::time::timeout_at(deadline, lines_a.next_line())
            .await
            .expect("a takes over b's units in time")
            .expect("stdout")
            .expect("a line");
        let (state, units) = parse(&l).unwrap_or_else(|| panic!("a: bad line {l:?}"));
        if state == "active" && units.len() == 9 {
            break;
        }
    }
    assert_eq!(table().await, format!("a:{}\n", sites.join(",")));
    a.start_kill().unwrap();
}

/// Spawn the binary with `--nodes nodes` and `args`, stdout piped, killed on drop.
fn spawn_piped(nodes: &str, args: &[&str]) -> tokio::process::Child {
    tokio::process::Command::new(BIN)
        .args(["--nodes", nodes])
        .args(args)
        .env_remove("REDQUORUM_NODES")
        .env_remove("REDQUORUM_CLUSTER")
        // Its log goes to this test's output (shown when the test fails).
        .env("REDQUORUM_LOG", "redquorum=debug,redquorum_cli=debug")
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

type Lines = tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>;

fn lines_of(child: &mut tokio::process::Child) -> Lines {
    use tokio::io::AsyncBufReadExt;
    tokio::io::BufReader::new(child.stdout.take().unwrap()).lines()
}

/// The next line within 10 s.
async fn next_line(lines: &mut Lines) -> String {
    tokio::time::timeout(Duration::from_secs(10), lines.next_line())
        .await
        .expect("a line within 10 s")
        .expect("stdout")
        .expect("the stream goes on")
}

fn signal(child: &tokio::process::Child, sig: nix::sys::signal::Signal) {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id().unwrap() as i32), sig).unwrap();
}

async fn exit_code(child: &mut tokio::process::Child) -> Option<i32> {
    // A watcher leaves its group before it exits (quorum writes, each bounded by the 250 ms node
    // timeout): on a loaded 2-core CI machine that once took over 10 s, and once over 20 s
    // (not reproduced: its threads' states are printed when it happens again, and its debug
    // log, from `spawn_piped`, is in the test's output).
    let pid = child.id();
    match tokio::time::timeout(Duration::from_secs(20), child.wait()).await {
        Ok(status) => status.unwrap().code(),
        Err(_) => panic!(
            "did not exit within 20 s of the signal; its threads (name, state, kernel wait):\n{}",
            pid.map(threads_of).unwrap_or_default()
        ),
    }
}

/// Each thread of process `pid`: its name, its state and where in the kernel it waits (a
/// runtime's shutdown waiting on a blocked thread shows as futex waits, an async wait as epoll).
fn threads_of(pid: u32) -> String {
    let dir = format!("/proc/{pid}/task");
    let Ok(tasks) = std::fs::read_dir(&dir) else {
        return format!("({dir} unreadable)");
    };
    let read = |path: std::path::PathBuf| std::fs::read_to_string(path).unwrap_or_default();
    tasks
        .flatten()
        .map(|t| {
            let stat = read(t.path().join("stat"));
            let state = stat.rsplit_once(')').map_or("?", |(_, r)| r.trim());
            let state = state.split_whitespace().next().unwrap_or("?");
            format!(
                "  {} {state} {}",
                read(t.path().join("comm")).trim(),
                read(t.path().join("wchan")).trim()
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn json(line: &str) -> serde_json::Value {
    serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line:?}"))
}

/// Every field of `want` is in `value` (an object), and no other.
fn assert_fields(value: &serde_json::Value, want: &[&str]) {
    let mut keys: Vec<&str> = value
        .as_object()
        .unwrap_or_else(|| panic!("an object: {value}"))
        .keys()
        .map(String::as_str)
        .collect();
    keys.sort_unstable();
    let mut want = want.to_vec();
    want.sort_unstable();
    assert_eq!(keys, want, "the documented fields: {value}");
}

/// `lock holder`: the holder and its token when held (exit 0), `no holder` when not (exit 1),
/// in text and in JSON.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_holder_names_the_holder_and_token_and_exits_one_when_free() {
    let cluster = Cluster::start(3).await;
    let nodes = set_up(&cluster).await;
    let holder_fields = [
        "lock",
        "held",
        "holder",
        "token",
        "version",
        "ttl_ms",
        "unchanged_ms",
        "abandoned",
    ];
    let out = redquorum(&["--nodes", &nodes, "lock", "holder", "reports"]).await;
    assert_eq!(out.status.code(), Some(1), "no holder: exit 1");
    assert_eq!(text(&out).0, "no holder\n");
    let out = redquorum(&[
        "--nodes", &nodes, "--output", "json", "lock", "holder", "reports",
    ])
    .await;
    assert_eq!(out.status.code(), Some(1), "no holder: exit 1");
    let v = json(text(&out).0.trim_end());
    assert_fields(&v, &holder_fields);
    assert_eq!(v["held"], false);
    assert!(v["holder"].is_null() && v["token"].is_null(), "{v}");

    let client = Client::connect(Config::from_urls(cluster.urls()).unwrap())
        .await
        .unwrap();
    let options = redquorum::LockOptions::default().with_holder("host-a worker");
    let guard = redquorum::Lock::with_options(&client, "reports", Duration::from_secs(3), options)
        .unwrap()
        .try_acquire()
        .await
        .unwrap();
    let token = guard.token().get();
    let out = redquorum(&["--nodes", &nodes, "lock", "holder", "reports"]).await;
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "held: exit 0 {stderr}");
    let line = stdout.trim_end();
    assert!(
        line.starts_with(&format!("holder=host-a worker token={token} version="))
            && line.ends_with(" ttl=3000ms"),
        "{line:?}"
    );
    let out = redquorum(&[
        "lock", "holder", "reports", "--nodes", &nodes, "--output", "json",
    ])
    .await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out).1);
    let v = json(text(&out).0.trim_end());
    assert_fields(&v, &holder_fields);
    assert_eq!(v["lock"], "reports");
    assert_eq!(v["held"], true);
    assert_eq!(v["holder"], "host-a worker");
    assert_eq!(v["token"], token);
    assert_eq!(v["ttl_ms"], 3000);
    assert!(v["version"].is_u64(), "{v}");
    assert!(
        v["unchanged_ms"].is_null() && v["abandoned"] == false,
        "one read cannot tell: {v}"
    );
    guard.release().await.unwrap();
}

/// `lock holder --watch`: a live holder is told alive (its line without ` abandoned`) within
/// about its extension interval; a crashed holder's line ends with ` abandoned` after about its
/// TTL; a single read says neither. Held: exit 0 either way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_holder_watch_tells_a_live_holder_from_an_abandoned_one() {
    let cluster = Cluster::start(3).await;
    let nodes = set_up(&cluster).await;
    let client = Client::connect(Config::from_urls(cluster.urls()).unwrap())
        .await
        .unwrap();
    let ttl = Duration::from_secs(1);
    let live = redquorum::Lock::new(&client, "live", ttl)
        .unwrap()
        .try_acquire()
        .await
        .unwrap();
    let watch = ["--watch", "5s"];
    let started = Instant::now();
    let out =
        redquorum(&[&["--nodes", &nodes, "lock", "holder", "live"][..], &watch].concat()).await;
    let took = started.elapsed();
    let (stdout, stderr) = text(&out);
    println!("live: {stdout} after {took:?}");
    assert_eq!(out.status.code(), Some(0), "held: exit 0 {stderr}");
    let line = stdout.trim_end();
    assert!(
        line.contains(" ttl=1000ms unchanged=") && !line.ends_with(" abandoned"),
        "{line:?}"
    );
    assert!(
        took < Duration::from_secs(4),
        "told before the watch ended: {took:?}"
    );

    // The holder's process dies: no release, no extension.
    let manual = redquorum::LockOptions::default().with_auto_extend(false);
    let guard = redquorum::Lock::with_options(&client, "crashed", ttl, manual)
        .unwrap()
        .try_acquire()
        .await
        .unwrap();
    std::mem::forget(guard);
    let out = redquorum(&["--nodes", &nodes, "lock", "holder", "crashed"]).await;
    let line = text(&out).0;
    assert!(
        !line.contains("unchanged=") && !line.contains("abandoned"),
        "one read cannot tell: {line:?}"
    );
    let started = Instant::now();
    let out = redquorum(
        &[
            &["--nodes", &nodes, "lock", "holder", "crashed"][..],
            &watch,
        ]
        .concat(),
    )
    .await;
    let (stdout, stderr) = text(&out);
    println!("crashed: {stdout} after {:?}", started.elapsed());
    assert_eq!(out.status.code(), Some(0), "still held: exit 0 {stderr}");
    assert!(stdout.trim_end().ends_with(" abandoned"), "{stdout:?}");
    let out = redquorum(
        &[
            &[
                "--nodes", &nodes, "--output", "json", "lock", "holder", "crashed",
            ][..],
            &watch,
        ]
        .concat(),
    )
    .await;
    let v = json(text(&out).0.trim_end());
    assert_eq!(v["abandoned"], true, "{v}");
    assert!(v["unchanged_ms"].as_u64().is_some_and(|u| u >= 1000), "{v}");
    live.release().await.unwrap();
}

/// `election observe` prints the leader, `no leader` after a resignation, and the next
/// leader (an `election campaign` process, which resigns on SIGTERM and exits 0); its JSON
/// Lines carry the documented fields.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn election_observe_prints_each_leader_and_no_leader_between() {
    let cluster = Cluster::start(3).await;
    let nodes = set_up(&cluster).await;
    let observe = ["election", "observe", "boss", "--interval", "200ms"];
    let mut text_obs = spawn_piped(&nodes, &observe);
    let mut json_args = vec!["--output", "json"];
    json_args.extend(observe);
    let mut json_obs = spawn_piped(&nodes, &json_args);
    let (mut t, mut j) = (lines_of(&mut text_obs), lines_of(&mut json_obs));
    assert_eq!(next_line(&mut t).await, "no leader");
    let first = json(&next_line(&mut j).await);
    assert_fields(&first, &["election", "leader", "term", "abandoned"]);
    assert!(
        first["leader"].is_null() && first["term"].is_null(),
        "{first}"
    );
    assert_eq!(first["election"], "boss");
    // An observer whose reader goes away stops at its next line.
    let mut gone = spawn_piped(&nodes, &observe);
    let mut g = lines_of(&mut gone);
    assert_eq!(next_line(&mut g).await, "no leader");
    drop(g);

    let client = Client::connect(Config::from_urls(cluster.urls()).unwrap())
        .await
        .unwrap();
    let alpha = redquorum::Election::new(&client, "boss", Duration::from_secs(5), "alpha")
        .unwrap()
        .campaign()
        .await
        .unwrap();
    let t1 = alpha.term().get();
    assert_eq!(next_line(&mut t).await, format!("leader=alpha term={t1}"));
    assert_eq!(
        exit_code(&mut gone).await,
        Some(0),
        "stdout closed: the observer stops"
    );
    let v = json(&next_line(&mut j).await);
    assert_eq!(
        (v["leader"].as_str(), v["term"].as_u64()),
        (Some("alpha"), Some(t1))
    );
    alpha.resign().await.unwrap();
    assert_eq!(next_line(&mut t).await, "no leader");
    assert!(json(&next_line(&mut j).await)["leader"].is_null());

    // Another candidate takes over, from the CLI.
    let mut beta = spawn_piped(
        &nodes,
        &[
            "election",
            "campaign",
            "boss",
            "--candidate",
            "beta",
            "--ttl",
            "2s",
        ],
    );
    let mut b = lines_of(&mut beta);
    let elected = next_line(&mut b).await;
    let t2: u64 = elected
        .strip_prefix("leader=beta term=")
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("campaign prints its leadership: {elected:?}"));
    assert!(t2 > t1, "terms increase: {t1} then {t2}");
    assert_eq!(next_line(&mut t).await, format!("leader=beta term={t2}"));
    let v = json(&next_line(&mut j).await);
    assert_eq!(
        (v["leader"].as_str(), v["term"].as_u64()),
        (Some("beta"), Some(t2))
    );
    signal(&beta, nix::sys::signal::Signal::SIGTERM);
    assert_eq!(
        exit_code(&mut beta).await,
        Some(0),
        "campaign resigns, exit 0"
    );
    assert_eq!(next_line(&mut t).await, "no leader");
    assert!(json(&next_line(&mut j).await)["leader"].is_null());

    signal(&text_obs, nix::sys::signal::Signal::SIGINT);
    signal(&json_obs, nix::sys::signal::Signal::SIGTERM);
    assert_eq!(exit_code(&mut text_obs).await, Some(0));
    assert_eq!(exit_code(&mut json_obs).await, Some(0));
}

/// `election run` waits (beyond `lock run`'s default of one try) until it is elected, runs the
/// command with the term, the name and its candidate ID, and exits with the command's code;
/// with --wait it gives up with 3.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn election_run_waits_to_lead_then_runs_the_command_with_its_term() {
    let cluster = Cluster::start(3).await;
    let nodes = set_up(&cluster).await;
    let client = Client::connect(Config::from_urls(cluster.urls()).unwrap())
        .await
        .unwrap();
    let alpha = redquorum::Election::new(&client, "boss", Duration::from_secs(5), "alpha")
        .unwrap()
        .campaign()
        .await
        .unwrap();

    let out = redquorum(&[
        "--nodes", &nodes, "election", "run", "boss", "--wait", "300ms", "--", "sh", "-c",
        "echo RAN",
    ])
    .await;
    assert_eq!(
        out.status.code(),
        Some(3),
        "not elected within --wait: exit 3"
    );
    assert!(!text(&out).0.contains("RAN"), "the command must not run");
    assert!(text(&out).1.contains("not elected"), "{}", text(&out).1);

    let mut run = spawn_piped(
        &nodes,
        &[
            "election",
            "run",
            "boss",
            "--candidate",
            "beta",
            "--ttl",
            "2s",
            "--",
            "sh",
            "-c",
            "echo term=$REDQUORUM_FENCING_TOKEN name=$REDQUORUM_LOCK_NAME \
             candidate=$REDQUORUM_CANDIDATE; exit 6",
        ],
    );
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(
        run.try_wait().unwrap().is_none(),
        "election run keeps campaigning while another leads"
    );
    let t1 = alpha.term().get();
    alpha.resign().await.unwrap();
    let mut lines = lines_of(&mut run);
    let line = next_line(&mut lines).await;
    let t2: u64 = line
        .strip_prefix("term=")
        .and_then(|r| r.split(' ').next())
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("{line:?}"));
    assert!(t2 > t1, "the new leader's term is larger ({t1} then {t2})");
    assert!(line.ends_with(" name=boss candidate=beta"), "{line:?}");
    assert_eq!(
        exit_code(&mut run).await,
        Some(6),
        "the command's exit code"
    );
    let out = redquorum(&["--nodes", &nodes, "lock", "holder", "boss"]).await;
    assert_eq!(
        out.status.code(),
        Some(1),
        "resigned when the command ended"
    );
}

/// `--output json` of `check`, `id next` and `index watch`: one document / JSON Lines with
/// the documented fields; commands without a JSON form refuse it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_output_of_check_id_next_and_index_watch_has_the_documented_fields() {
    let cluster = Cluster::start(3).await;
    let nodes = set_up(&cluster).await;
    let out = redquorum(&["--nodes", &nodes, "--output", "json", "check"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out).1);
    let (stdout, _) = text(&out);
    assert_eq!(
        stdout.lines().count(),
        1,
        "one document on one line: {stdout}"
    );
    let v = json(stdout.trim_end());
    assert_fields(
        &v,
        &[
            "nodes",
            "voting",
            "total",
            "needed",
            "all_safe",
            "all_permitted",
        ],
    );
    assert_eq!(
        (v["total"].as_u64(), v["needed"].as_u64()),
        (Some(3), Some(2))
    );
    assert_eq!(v["all_safe"], true);
    let node_fields = [
        "node",
        "url",
        "status",
        "votes",
        "version",
        "server",
        "server_version",
        "latency_ms",
        "run_id",
        "clock_skew_ms",
        "findings",
        "missing_permissions",
        "permission_error",
    ];
    assert_eq!(v["all_permitted"], true);
    for n in v["nodes"].as_array().unwrap() {
        assert_fields(n, &node_fields);
        assert_eq!(n["status"], "ok");
        assert_eq!(n["missing_permissions"], serde_json::json!([]), "{n}");
        assert!(n["latency_ms"].is_f64() && n["findings"].is_array(), "{n}");
    }
    // A down node (beside two fresh ones): status "down", a finding with its severity, exit 1.
    let two = Cluster::start(2).await;
    let mut urls = two.urls();
    urls.push("redis://127.0.0.1:1".into());
    let out = redquorum(&[
        "--nodes",
        &urls.join(","),
        "--node-timeout",
        "300ms",
        "--output",
        "json",
        "check",
    ])
    .await;
    assert_eq!(out.status.code(), Some(1));
    let v = json(text(&out).0.trim_end());
    let down = &v["nodes"][2];
    assert_eq!(down["status"], "down", "{v}");
    assert!(down["version"].is_null(), "{down}");
    assert_eq!(down["findings"][0]["severity"], "unsafe", "{down}");
    assert_fields(&down["findings"][0], &["severity", "finding"]);

    let out = redquorum(&[
        "--nodes", &nodes, "--output", "json", "id", "next", "jobs", "-n", "3",
    ])
    .await;
    assert!(out.status.success(), "{}", text(&out).1);
    let v = json(text(&out).0.trim_end());
    assert_fields(&v, &["sequence", "ids"]);
    assert_eq!(v["sequence"], "jobs");
    let ids: Vec<u64> = v["ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i.as_u64().unwrap())
        .collect();
    assert!(
        ids.len() == 3 && ids[1] == ids[0] + 1 && ids[2] == ids[1] + 1,
        "{ids:?}"
    );

    let mut watch = spawn_piped(
        &nodes,
        &[
            "--output",
            "json",
            "index",
            "watch",
            "workers",
            "--interval",
            "300ms",
            "--id",
            "a",
        ],
    );
    let mut lines = lines_of(&mut watch);
    loop {
        let v = json(&next_line(&mut lines).await);
        assert_fields(&v, &["group", "version", "index", "replicas", "state"]);
        assert_eq!(v["group"], "workers");
        assert!(v["version"].is_u64(), "{v}");
        if v["state"] == "active" {
            assert_eq!(
                (v["index"].as_u64(), v["replicas"].as_u64()),
                (Some(0), Some(1))
            );
            break;
        }
        assert_eq!(v["state"], "prepare", "{v}");
    }
    signal(&watch, nix::sys::signal::Signal::SIGTERM);
    assert_eq!(exit_code(&mut watch).await, Some(0));

    run_ok(&nodes, &["units", "add", "parsers", "site-b", "site-a"]).await;
    let mut dist = spawn_piped(
        &nodes,
        &[
            "--output",
            "json",
            "dist",
            "watch",
            "parsers",
            "--interval",
            "300ms",
            "--id",
            "m",
        ],
    );
    let mut lines = lines_of(&mut dist);
    loop {
        let v = json(&next_line(&mut lines).await);
        assert_fields(&v, &["pool", "version", "state", "units"]);
        assert!(v["version"].is_u64() && v["pool"] == "parsers", "{v}");
        if v["state"] == "active" && v["units"].as_array().is_some_and(|u| !u.is_empty()) {
            assert_eq!(v["units"], serde_json::json!(["site-a", "site-b"]));
            break;
        }
    }
    signal(&dist, nix::sys::signal::Signal::SIGTERM);
    assert_eq!(exit_code(&mut dist).await, Some(0));

    let mut campaign = spawn_piped(
        &nodes,
        &[
            "--output",
            "json",
            "election",
            "campaign",
            "boss",
            "--candidate",
            "c1",
        ],
    );
    let v = json(&next_line(&mut lines_of(&mut campaign)).await);
    assert_fields(&v, &["election", "leader", "term", "abandoned"]);
    assert_eq!(
        (v["election"].as_str(), v["leader"].as_str()),
        (Some("boss"), Some("c1"))
    );
    assert!(v["term"].is_u64(), "{v}");
    signal(&campaign, nix::sys::signal::Signal::SIGINT);
    assert_eq!(exit_code(&mut campaign).await, Some(0));

    let out = redquorum(&["--nodes", &nodes, "--output", "json", "ping"]).await;
    assert_eq!(out.status.code(), Some(2), "no JSON form: refused");
    assert!(
        text(&out).1.contains("--output json is not supported"),
        "{}",
        text(&out).1
    );
}

/// Completion scripts for every shell, and the exit codes in `--help` and `-h`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completions_and_the_exit_codes_in_help() {
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let out = redquorum(&["completions", shell]).await;
        assert!(out.status.success(), "{shell}: {}", text(&out).1);
        let script = text(&out).0;
        assert!(
            script.len() > 1000 && script.contains("redquorum") && script.contains("election"),
            "{shell}: {script}"
        );
    }
    let out = redquorum(&["completions", "tcsh"]).await;
    assert_eq!(
        out.status.code(),
        Some(2),
        "an unknown shell is a usage error"
    );
    // One table of environment variables for the library and the CLI.
    let out = redquorum(&["--help"]).await;
    for (var, option) in redquorum::ENV_VARS {
        assert!(
            text(&out).0.contains(&format!("[env: {var}")) && text(&out).0.contains(option),
            "`--help` names {option} and {var}"
        );
    }
    for flag in ["--help", "-h"] {
        let out = redquorum(&[flag]).await;
        assert!(out.status.success());
        let help = text(&out).0;
        let codes = help
            .split("Exit codes:")
            .nth(1)
            .unwrap_or_else(|| panic!("{flag} lists the exit codes: {help}"));
        for code in ["0", "1", "2", "3", "4", "5", "130/143", "other"] {
            assert!(
                codes
                    .lines()
                    .any(|l| l.trim_start().starts_with(&format!("{code} "))),
                "{flag}: exit code {code} documented: {codes}"
            );
        }
    }
    let help = text(&redquorum(&["--help"]).await).0;
    for shape in [
        "{\"sequence\",\"ids\"",
        "{\"election\",\"leader\",\"term\",\"abandoned\"}",
        "\"ttl_ms\"",
    ] {
        assert!(
            help.contains(shape),
            "--help documents the JSON fields: {shape}"
        );
    }
}

/// `--metrics-addr`: Prometheus text over HTTP while a long-running command runs; a bad or
/// busy address is a clear error naming the option.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_addr_serves_prometheus_text_and_bad_addresses_are_named() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let cluster = Cluster::start(3).await;
    let nodes = set_up(&cluster).await;
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");
    let mut observe = spawn_piped(
        &nodes,
        &["election", "observe", "boss", "--metrics-addr", &addr],
    );
    let mut lines = lines_of(&mut observe);
    assert_eq!(next_line(&mut lines).await, "no leader");
    let mut stream = tokio::net::TcpStream::connect(&addr)
        .await
        .expect("listening");
    stream
        .write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")
        .await
        .unwrap();
    let mut response = String::new();
    tokio::time::timeout(Duration::from_secs(5), stream.read_to_string(&mut response))
        .await
        .expect("a response in time")
        .unwrap();
    let (head, body) = response.split_once("\r\n\r\n").expect("an HTTP response");
    assert!(
        head.starts_with("HTTP/1.0 200") || head.starts_with("HTTP/1.1 200"),
        "{head}"
    );
    assert!(
        head.to_lowercase().contains("content-type: text/plain"),
        "{head}"
    );
    assert!(body.contains("# TYPE redquorum_cli_info gauge"), "{body}");
    // The library's own metrics, through the facade: the observer's reads are quorum
    // operations, each node answered them.
    assert!(
        body.lines()
            .any(|l| l.starts_with("redquorum_quorum_operations_total{")
                && l.contains("kind=\"lock.holder\"")),
        "the library's quorum operations are exported: {body}"
    );
    assert!(
        body.lines()
            .any(|l| l.starts_with("redquorum_node_requests_total{") && l.contains("node=\"2\"")),
        "per-node outcomes are exported: {body}"
    );
    let info = body
        .lines()
        .find(|l| l.starts_with("redquorum_cli_info{"))
        .unwrap_or_else(|| panic!("{body}"));
    assert!(
        info.contains("command=\"election observe\"")
            && info.contains(&format!("version=\"{}\"", env!("CARGO_PKG_VERSION")))
            && info.ends_with("} 1"),
        "{info}"
    );
    // Prometheus text: every line a comment or `name{labels} value`.
    for l in body
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
    {
        let value = l.rsplit(' ').next().unwrap();
        assert!(value.parse::<f64>().is_ok(), "not a sample line: {l:?}");
    }

    // The same address again, while the first process listens: busy.
    let out = redquorum(&[
        "--nodes",
        &nodes,
        "lock",
        "run",
        "x",
        "--metrics-addr",
        &addr,
        "--",
        "true",
    ])
    .await;
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(2), "{stdout}{stderr}");
    assert!(
        stderr.contains("--metrics-addr") && stderr.contains(&addr),
        "{stderr}"
    );
    signal(&observe, nix::sys::signal::Signal::SIGTERM);
    assert_eq!(exit_code(&mut observe).await, Some(0));
    for bad in ["nonsense", "127.0.0.1", "127.0.0.1:99999"] {
        let out = redquorum(&[
            "--nodes",
            &nodes,
            "index",
            "watch",
            "g",
            "--metrics-addr",
            bad,
        ])
        .await;
        let stderr = text(&out).1;
        assert_eq!(out.status.code(), Some(2), "{bad}: {stderr}");
        assert!(stderr.contains("--metrics-addr"), "{bad}: {stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
}

/// `election run` shares `lock run`'s child handling: when leadership is lost (a majority cut
/// off) the command is stopped and the exit code is 4.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn election_run_stops_the_command_when_leadership_is_lost() {
    let cluster = Cluster::start(3).await;
    let nodes = set_up(&cluster).await;
    let dir = tempfile::tempdir().unwrap();
    let ready = dir.path().join("ready");
    let script = format!("touch {}; exec sleep 60", ready.display());
    let mut run = tokio::process::Command::new(BIN)
        .args([
            "--nodes", &nodes, "election", "run", "cut", "--ttl", "1s", "--", "sh", "-c", &script,
        ])
        .env_remove("REDQUORUM_NODES")
        .env_remove("REDQUORUM_CLUSTER")
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    while !ready.exists() {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let cut = Instant::now();
    cluster.node(0).cut_off();
    cluster.node(1).cut_off();
    let code = exit_code(&mut run).await;
    let mut stderr = String::new();
    tokio::io::AsyncReadExt::read_to_string(run.stderr.as_mut().unwrap(), &mut stderr)
        .await
        .unwrap();
    assert_eq!(code, Some(4), "leadership lost: exit 4 ({stderr})");
    assert!(stderr.contains("lost"), "{stderr}");
    assert!(
        cut.elapsed() < Duration::from_secs(5),
        "stopped within the lease: {:?}",
        cut.elapsed()
    );
}

/// The operator's path: blank nodes refused by every command until `cluster init`; `check`
/// only reads; a node restarted in a rolling restart is waited for by `check --wait`; the
/// node timeout is the cluster's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_init_sets_blank_nodes_up_once_and_check_waits_for_a_restarted_node() {
    let cluster = Cluster::start(3).await;
    let nodes = cluster.urls().join(",");
    let run = |args: &'static [&'static str]| {
        let nodes = nodes.clone();
        async move {
            let mut all = vec!["--nodes", nodes.as_str()];
            all.extend_from_slice(args);
            let out = redquorum(&all).await;
            let (stdout, stderr) = text(&out);
            (out.status.code(), stdout, stderr)
        }
    };

    let (code, _, stderr) = run(&["id", "next", "s"]).await;
    assert_eq!(code, Some(2), "id next on blank nodes must fail: {stderr}");
    assert!(
        stderr.contains("cluster init"),
        "the error names cluster init: {stderr}"
    );
    let (code, stdout, _) = run(&["check"]).await;
    assert_eq!(code, Some(1), "check on blank nodes: exit 1\n{stdout}");
    assert!(
        stdout.contains("cluster init"),
        "check says to run cluster init:\n{stdout}"
    );
    assert_eq!(
        cluster.key_counts().await,
        vec![0, 0, 0],
        "a command or check on blank nodes wrote something"
    );

    let (code, stdout, stderr) = run(&["cluster", "init"]).await;
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stdout.contains("set up on 3 nodes"), "{stdout}");
    let (code, stdout, _) = run(&["cluster", "init"]).await;
    assert_eq!(code, Some(0));
    assert!(stdout.contains("was set up already"), "{stdout}");
    let (code, _, stderr) = run(&["id", "next", "s"]).await;
    assert_eq!(code, Some(0), "{stderr}");

    // The node timeout is the cluster's (250 ms at init).
    let (code, _, stderr) = run(&["--node-timeout", "1s", "id", "next", "s"]).await;
    assert_eq!(
        code,
        Some(2),
        "a longer node timeout must be refused: {stderr}"
    );
    assert!(
        stderr.contains("1s") && stderr.contains("250ms"),
        "the refusal names both node timeouts: {stderr}"
    );

    // A rolling restart: node 2 comes back quarantined; check only reports it, and
    // `check --wait` waits until it votes again.
    cluster.node(2).kill_and_restart().await;
    let (code, stdout, _) = run(&["check"]).await;
    assert_eq!(
        code,
        Some(1),
        "a restarted node is quarantined until repaired:\n{stdout}"
    );
    let (code, stdout, stderr) = run(&["check", "--wait", "30s"]).await;
    assert_eq!(
        code,
        Some(0),
        "check --wait must exit 0 once node 2 votes again:\n{stdout}{stderr}"
    );
    assert!(stdout.contains("3 of 3 nodes vote"), "{stdout}");
}
