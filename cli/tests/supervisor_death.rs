//! A supervised command never outlives its supervisor: `lock run`, `job run` and `election
//! run` are killed with `kill -9` (as the OOM killer would), and their command, its own
//! children included, is gone within a fraction of a second; with `election run` the old
//! leader's command is gone before the new leader's starts.
//!
//! The command writes its pid (and a child's) to files once it runs; a process counts as gone
//! when `/proc/<pid>` is missing or shows a zombie (state Z: killed, waiting to be reaped by
//! init or a subreaper, which the test does not control).
//!
//! With the `test-util` feature, `REDQUORUM_NO_PARENT_DEATH_SIGNAL_FOR_TESTS=1` and
//! `REDQUORUM_NO_GROUP_GUARD_FOR_TESTS=1` switch the two protections off (the supervisor
//! inherits the test's environment, so setting both when running these tests shows them fail).

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use redquorum_testkit::Cluster;
use tokio::process::Child;

const BIN: &str = env!("CARGO_BIN_EXE_redquorum");

/// How long a killed supervisor's command may outlive it: a fraction of a second (the kernel
/// sends the parent-death signal at once; the guard needs one `read` to return).
const GONE_WITHIN: Duration = Duration::from_millis(500);

/// Three set-up nodes and a directory for the commands' pid files.
struct Hosts {
    _cluster: Cluster,
    nodes: String,
    dir: tempfile::TempDir,
    /// Pids to SIGKILL when the test ends, whatever it found (a failing run must not leave
    /// `sleep 300` behind).
    leftovers: Leftovers,
}

impl Hosts {
    async fn start() -> Hosts {
        let cluster = Cluster::start(3).await;
        let nodes = cluster.urls().join(",");
        let init = tokio::process::Command::new(BIN)
            .args(["--nodes", &nodes, "cluster", "init"])
            .env_remove("REDQUORUM_NODES")
            .output()
            .await
            .expect("the redquorum binary runs");
        assert!(init.status.success(), "cluster init: {init:?}");
        Hosts {
            _cluster: cluster,
            nodes,
            dir: tempfile::tempdir().unwrap(),
            leftovers: Leftovers::default(),
        }
    }

    fn file(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// A command that starts a child (`sleep 300 &`), writes the child's pid to
    /// `<tag>.grandchild` and its own to `<tag>.child`, then waits.
    fn command_with_a_child(&self, tag: &str) -> String {
        let grandchild = self.file(&format!("{tag}.grandchild"));
        let child = self.file(&format!("{tag}.child"));
        format!(
            "sleep 300 & echo $! > {g}.tmp && mv {g}.tmp {g}; echo $$ > {c}.tmp && mv {c}.tmp {c}; \
             wait",
            g = grandchild.display(),
            c = child.display()
        )
    }

    /// `redquorum --nodes ... ARGS -- sh -c SCRIPT` with `env` added, killed if dropped.
    fn supervisor(&self, args: &[&str], script: &str, env: &[(&str, &str)]) -> Child {
        tokio::process::Command::new(BIN)
            .args(["--nodes", &self.nodes])
            .args(args)
            .args(["--", "sh", "-c", script])
            .envs(env.iter().copied())
            .env_remove("REDQUORUM_NODES")
            .env_remove("REDQUORUM_CLUSTER")
            .stdout(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("the redquorum binary starts")
    }

    /// The pid in `<name>`, once the command wrote it (within 20 s: the lease comes first).
    async fn pid_in(&self, name: &str) -> i32 {
        let path = self.file(name);
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(pid) = read_pid(&path) {
                self.leftovers.add(pid);
                return pid;
            }
            assert!(
                Instant::now() < deadline,
                "the command never wrote {name}: did it start?"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

fn read_pid(path: &Path) -> Option<i32> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// Whether `pid` runs: it exists and is not a zombie.
fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the command name in parentheses (which may hold spaces).
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

/// How long `pid` took to be gone, polled every 5 ms; `None` if still alive after `limit`.
async fn gone_within(pid: i32, limit: Duration) -> Option<Duration> {
    let start = Instant::now();
    while start.elapsed() < limit {
        if !alive(pid) {
            return Some(start.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    (!alive(pid)).then(|| start.elapsed())
}

/// `kill -9` the supervisor and reap it (reaping it does not reap its command: that one is
/// its child, adopted by init or a subreaper once it is orphaned).
async fn kill_9(supervisor: &mut Child) {
    supervisor.start_kill().expect("SIGKILL the supervisor");
    supervisor.wait().await.expect("reap the supervisor");
}

/// Pids SIGKILLed on drop.
#[derive(Default)]
struct Leftovers(std::sync::Mutex<Vec<i32>>);

impl Leftovers {
    fn add(&self, pid: i32) {
        self.0.lock().unwrap().push(pid);
    }
}

impl Drop for Leftovers {
    fn drop(&mut self) {
        for pid in self.0.lock().unwrap().iter() {
            if alive(*pid) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(*pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
    }
}

/// The story shared by `lock run` and `job run`: the supervisor runs a command with a child;
/// `kill -9` of the supervisor leaves neither running.
async fn a_killed_supervisor_leaves_nothing(what: &str, args: &[&str]) {
    let hosts = Hosts::start().await;
    let mut supervisor = hosts.supervisor(args, &hosts.command_with_a_child("run"), &[]);
    let grandchild = hosts.pid_in("run.grandchild").await;
    let child = hosts.pid_in("run.child").await;
    assert!(
        alive(child) && alive(grandchild),
        "{what}: the command runs"
    );

    kill_9(&mut supervisor).await;

    let child_gone = gone_within(child, GONE_WITHIN).await;
    let grandchild_gone = gone_within(grandchild, GONE_WITHIN).await;
    println!("{what}: command gone after {child_gone:?}, its child after {grandchild_gone:?}");
    assert!(
        child_gone.is_some(),
        "{what}: the command (pid {child}) still runs {GONE_WITHIN:?} after its supervisor was \
         killed with -9: the next holder would run its own beside it"
    );
    assert!(
        grandchild_gone.is_some(),
        "{what}: the command's own child (pid {grandchild}) still runs {GONE_WITHIN:?} after \
         the supervisor was killed with -9"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_lock_run_leaves_no_command_running() {
    a_killed_supervisor_leaves_nothing("lock run", &["lock", "run", "tethered", "--ttl", "5s"])
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_job_run_leaves_no_command_running() {
    a_killed_supervisor_leaves_nothing(
        "job run",
        &[
            "job",
            "run",
            "nightly",
            "--period",
            "2026-12-03",
            "--ttl",
            "5s",
        ],
    )
    .await;
}

/// Two `election run` supervisors on one election; the leader's is killed with -9. The
/// follower takes over once the lease runs out (2 s), and by the time its command starts the
/// old leader's command (and that command's child) is gone: never two leaders' commands at
/// once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_election_run_never_leaves_two_leaders_commands_running() {
    let hosts = Hosts::start().await;
    let run = |candidate: &str| {
        let script = hosts.command_with_a_child(candidate);
        let args = [
            "election",
            "run",
            "scheduler",
            "--candidate",
            candidate,
            "--ttl",
            "2s",
        ];
        hosts.supervisor(&args, &script, &[])
    };
    // Phase 1: alpha leads and runs its command; beta campaigns behind it.
    let mut alpha = run("alpha");
    let alpha_child = hosts.pid_in("alpha.child").await;
    let alpha_grandchild = hosts.pid_in("alpha.grandchild").await;
    let _beta = run("beta");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        read_pid(&hosts.file("beta.child")).is_none(),
        "beta must not run its command while alpha leads"
    );

    // Phase 2: alpha's supervisor is killed with -9. Watch both until beta's command starts.
    kill_9(&mut alpha).await;
    let killed = Instant::now();
    let mut alpha_gone = None;
    let beta_child = loop {
        if alpha_gone.is_none() && !alive(alpha_child) && !alive(alpha_grandchild) {
            alpha_gone = Some(killed.elapsed());
        }
        if let Some(pid) = read_pid(&hosts.file("beta.child")) {
            hosts.leftovers.add(pid);
            break pid;
        }
        assert!(
            killed.elapsed() < Duration::from_secs(20),
            "beta never took over from the killed leader"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    let beta_started = killed.elapsed();
    if let Some(pid) = read_pid(&hosts.file("beta.grandchild")) {
        hosts.leftovers.add(pid);
    }
    println!("alpha's command gone after {alpha_gone:?}; beta's started after {beta_started:?}");
    assert!(
        !alive(alpha_child) && !alive(alpha_grandchild),
        "two leaders' commands run at once: the killed leader's command (pid {alpha_child}) or \
         its child (pid {alpha_grandchild}) still runs while the new leader's (pid {beta_child}) \
         started {beta_started:?} after the kill"
    );
    let alpha_gone = alpha_gone.expect("alpha's command was seen gone before beta's started");
    assert!(
        alpha_gone < GONE_WITHIN,
        "the killed leader's command must be gone within {GONE_WITHIN:?}, took {alpha_gone:?}"
    );
}

/// Each protection on its own, with the other switched off: the parent-death signal alone
/// kills the command but not the command's own child (what the group guard is for).
#[cfg(feature = "test-util")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_parent_death_signal_alone_kills_the_command_but_not_its_children() {
    let hosts = Hosts::start().await;
    let mut supervisor = hosts.supervisor(
        &["lock", "run", "tethered", "--ttl", "5s"],
        &hosts.command_with_a_child("run"),
        &[
            ("REDQUORUM_NO_GROUP_GUARD_FOR_TESTS", "1"),
            ("REDQUORUM_NO_PARENT_DEATH_SIGNAL_FOR_TESTS", "0"),
        ],
    );
    let grandchild = hosts.pid_in("run.grandchild").await;
    let child = hosts.pid_in("run.child").await;
    kill_9(&mut supervisor).await;
    assert!(
        gone_within(child, GONE_WITHIN).await.is_some(),
        "the parent-death signal must kill the command (pid {child}) on its own"
    );
    assert!(
        alive(grandchild),
        "the command's child (pid {grandchild}) is out of the parent-death signal's reach: \
         without the group guard it runs on"
    );
}

/// The group guard alone (no parent-death signal) kills the command and its children: the
/// protection macOS and the BSDs get.
#[cfg(feature = "test-util")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_group_guard_alone_kills_the_command_and_its_children() {
    let hosts = Hosts::start().await;
    let mut supervisor = hosts.supervisor(
        &["lock", "run", "tethered", "--ttl", "5s"],
        &hosts.command_with_a_child("run"),
        &[
            ("REDQUORUM_NO_PARENT_DEATH_SIGNAL_FOR_TESTS", "1"),
            ("REDQUORUM_NO_GROUP_GUARD_FOR_TESTS", "0"),
        ],
    );
    let grandchild = hosts.pid_in("run.grandchild").await;
    let child = hosts.pid_in("run.child").await;
    kill_9(&mut supervisor).await;
    assert!(
        gone_within(child, GONE_WITHIN).await.is_some(),
        "the group guard must kill the command (pid {child}) on its own"
    );
    assert!(
        gone_within(grandchild, GONE_WITHIN).await.is_some(),
        "the group guard must kill the command's child (pid {grandchild}) too"
    );
}
