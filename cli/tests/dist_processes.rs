//! Work distribution with members as separate OS processes (`redquorum dist watch --record`)
//! beside in-process members, on real nodes: a process killed with -9, a process frozen with
//! SIGSTOP past its lease, a process restarted with the same ID, a graceful SIGTERM, an
//! in-process crash, units added and removed, a Redis node killed and another wiped. Every
//! member's ownership intervals (the processes' `CLOCK_MONOTONIC` records, the in-process
//! histories) go to one checker: no unit with two owners at any instant; once stable every
//! unit owned exactly once and loads within one unit of the weighted share; each crash
//! active within the bound. The same run with the hand-over barrier switched off in every
//! member shows a double owner.

#![cfg(feature = "test-util")]
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use redquorum::{Assignment, Client, Config, PoolMember, PoolOptions, Units, ViewState};
use redquorum_testkit::checker::{self, OwnerViolation, OwnershipInterval};
use redquorum_testkit::record::{self, MonotonicOrigin};
use redquorum_testkit::Cluster;
use tokio::process::Child;
use tokio::time::Instant;

const BIN: &str = env!("CARGO_BIN_EXE_redquorum");
const POOL: &str = "mailboxes";
const INTERVAL: Duration = Duration::from_millis(400);
/// A crash is judged after the member's lease plus drift, then prepare and activation: about
/// 1-2 intervals measured (see tests/distribution.rs); asserted with slack for a process
/// start and a loaded 2-core machine.
const CRASH_BOUND: Duration = Duration::from_millis(4 * 400);
const SETTLE: Duration = Duration::from_secs(20);

fn unit(i: usize) -> String {
    format!("box-{i:03}")
}

async fn client(urls: &[String]) -> Client {
    let config = Config::from_urls(urls).expect("test URLs are valid");
    // The operator's one `cluster init` (a no-op once the cluster is set up).
    Client::init_cluster(config.clone())
        .await
        .expect("cluster init");
    Client::connect(config).await.expect("client")
}

/// An in-process member's recorded assignments.
type History = Vec<(Instant, Option<Assignment>)>;
/// A member's ID, weight and current assignment (token, active, units).
type Current = (String, u32, Option<(u64, bool, Vec<String>)>);

/// One member process and the records it wrote (one file per incarnation).
struct Proc {
    id: String,
    weight: u32,
    child: Option<Child>,
    records: Vec<PathBuf>,
}

struct Members {
    dir: tempfile::TempDir,
    nodes: String,
    barrier: bool,
    origin: MonotonicOrigin,
    procs: Vec<Proc>,
    /// Processes stopped with SIGSTOP: not counted as running members meanwhile.
    frozen: BTreeSet<String>,
    inproc: Vec<(PoolMember, u32)>,
    /// Histories of in-process members that left or crashed.
    gone: Vec<(String, History)>,
}

impl Members {
    fn spawn(&mut self, id: &str, weight: u32) {
        let n = self
            .procs
            .iter()
            .find(|p| p.id == id)
            .map_or(0, |p| p.records.len());
        let path = self.dir.path().join(format!("{id}.{n}.rec"));
        let mut cmd = tokio::process::Command::new(BIN);
        cmd.args([
            "--nodes",
            &self.nodes,
            "dist",
            "watch",
            POOL,
            "--id",
            id,
            "--weight",
            &weight.to_string(),
            "--interval",
            &format!("{}ms", INTERVAL.as_millis()),
            "--record",
        ])
        .arg(&path)
        .env_remove("REDQUORUM_NODES")
        .env_remove("REDQUORUM_CLUSTER")
        .stdout(std::process::Stdio::null())
        .kill_on_drop(true);
        if !self.barrier {
            cmd.arg("--no-barrier-for-tests");
        }
        let child = cmd.spawn().expect("dist watch starts");
        match self.procs.iter_mut().find(|p| p.id == id) {
            Some(p) => {
                p.child = Some(child);
                p.weight = weight;
                p.records.push(path);
            }
            None => self.procs.push(Proc {
                id: id.to_string(),
                weight,
                child: Some(child),
                records: vec![path],
            }),
        }
    }

    fn pid(&self, id: &str) -> Pid {
        let p = self.procs.iter().find(|p| p.id == id).expect("process");
        Pid::from_raw(
            p.child
                .as_ref()
                .and_then(|c| c.id())
                .expect("running process") as i32,
        )
    }

    async fn kill9(&mut self, id: &str) {
        let p = self.procs.iter_mut().find(|p| p.id == id).expect("process");
        let mut child = p.child.take().expect("running");
        child.start_kill().expect("SIGKILL");
        let _ = child.wait().await;
    }

    async fn terminate(&mut self, id: &str) {
        let pid = self.pid(id);
        kill(pid, Signal::SIGTERM).expect("SIGTERM");
        let p = self.procs.iter_mut().find(|p| p.id == id).expect("process");
        let mut child = p.child.take().expect("running");
        let status = tokio::time::timeout(Duration::from_secs(10), child.wait())
            .await
            .expect("dist watch leaves on SIGTERM within 10 s")
            .expect("status");
        assert!(status.success(), "{id} exited with {status} on SIGTERM");
    }

    fn read(path: &Path) -> String {
        std::fs::read_to_string(path).unwrap_or_default()
    }

    /// Every running member's current units, token and state (processes: their latest record
    /// while its lease lasts).
    fn current(&self) -> Vec<Current> {
        let now = Instant::now();
        let mut out = Vec::new();
        for p in self
            .procs
            .iter()
            .filter(|p| p.child.is_some() && !self.frozen.contains(&p.id))
        {
            let text = Self::read(p.records.last().expect("a record"));
            let latest = record::latest(&text, self.origin)
                .unwrap_or_else(|e| panic!("{}: {e}", p.id))
                .filter(|l| l.valid_until > now)
                .map(|l| (l.token, l.active, l.units));
            out.push((p.id.clone(), p.weight, latest));
        }
        for (m, w) in &self.inproc {
            let a = m.assignment().map(|a| {
                (
                    a.token.get(),
                    a.state == ViewState::Active,
                    a.units().into_iter().flatten().cloned().collect(),
                )
            });
            out.push((m.id().to_string(), *w, a));
        }
        out
    }

    /// Wait until every running member holds an active assignment of one version and together
    /// they own `units` exactly once; returns how long it took and the owners.
    async fn settled(&self, units: &BTreeSet<String>) -> (Duration, BTreeMap<String, String>) {
        let start = Instant::now();
        loop {
            let cur = self.current();
            let tokens: BTreeSet<Option<(u64, bool)>> = cur
                .iter()
                .map(|(_, _, a)| a.as_ref().map(|(t, act, _)| (*t, *act)))
                .collect();
            let mut owners = BTreeMap::new();
            let mut twice = false;
            for (id, _, a) in &cur {
                for u in a.iter().flat_map(|(_, _, us)| us) {
                    twice |= owners.insert(u.clone(), id.clone()).is_some();
                }
            }
            let owned: BTreeSet<String> = owners.keys().cloned().collect();
            if tokens.len() == 1
                && tokens.iter().all(|t| t.is_some_and(|(_, act)| act))
                && !twice
                && owned == *units
            {
                return (start.elapsed(), owners);
            }
            assert!(
                start.elapsed() < SETTLE,
                "not settled after {SETTLE:?}: versions {tokens:?}, {} units owned of {}, per \
                 member {:?}",
                owned.len(),
                units.len(),
                cur.iter()
                    .map(|(id, _, a)| (
                        id.clone(),
                        a.as_ref().map(|(t, act, us)| (*t, *act, us.len()))
                    ))
                    .collect::<Vec<_>>()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Loads within one unit of each running member's weighted share.
    fn assert_balanced(&self, owners: &BTreeMap<String, String>) {
        let cur = self.current();
        let total: u32 = cur.iter().map(|(_, w, _)| *w).sum();
        for (id, w, _) in &cur {
            let share = owners.len() as f64 * f64::from(*w) / f64::from(total);
            let load = owners.values().filter(|m| *m == id).count() as f64;
            assert!(
                (load - share).abs() < 1.0 + 1e-9,
                "member {id} (weight {w}) holds {load} units, its share is {share:.2}"
            );
        }
    }

    /// Every ownership interval recorded so far (processes and in-process members).
    fn intervals(&self, index: &BTreeMap<String, u64>) -> Vec<OwnershipInterval> {
        let end = Instant::now();
        let mut out = Vec::new();
        for p in &self.procs {
            for (n, path) in p.records.iter().enumerate() {
                let owner = format!("process {} (incarnation {n})", p.id);
                out.extend(
                    record::ownership(&owner, &Self::read(path), index, self.origin)
                        .unwrap_or_else(|e| panic!("{owner}: {e}")),
                );
            }
        }
        let mut histories: Vec<(String, History)> = self
            .inproc
            .iter()
            .map(|(m, _)| (format!("in-process {}", m.id()), m.history_for_tests()))
            .collect();
        histories.extend(self.gone.iter().cloned());
        for (owner, history) in &histories {
            for (i, (at, a)) in history.iter().enumerate() {
                let Some(a) = a else { continue };
                let next = history.get(i + 1).map(|(t, _)| *t).unwrap_or(end);
                let until = next.min(a.valid_until());
                for u in a.units().into_iter().flatten() {
                    if *at < until {
                        out.push(OwnershipInterval {
                            owner: owner.clone(),
                            unit: index.get(u).copied().unwrap_or(u64::MAX),
                            detail: format!("{u}, token {} {:?}", a.token.get(), a.state),
                            start: *at,
                            end: until,
                        });
                    }
                }
            }
        }
        out
    }
}

struct Run {
    verdict: Result<(), OwnerViolation>,
    notes: Vec<String>,
}

async fn scenario(barrier: bool) -> Run {
    let cluster = Cluster::start(3).await;
    let urls = cluster.urls();
    let units = Units::new(&client(&urls).await, POOL).expect("pool name");
    let mut expected: BTreeSet<String> = (0..60).map(unit).collect();
    units
        .add(&expected.iter().cloned().collect::<Vec<_>>())
        .await
        .expect("units added");
    let index: BTreeMap<String, u64> = (0..100).map(|i| (unit(i), i as u64)).collect();
    let mut m = Members {
        dir: tempfile::tempdir().expect("tempdir"),
        nodes: urls.join(","),
        barrier,
        origin: MonotonicOrigin::now(),
        procs: Vec::new(),
        frozen: BTreeSet::new(),
        inproc: Vec::new(),
        gone: Vec::new(),
    };
    let opts = |weight: u32| {
        let o = PoolOptions::default()
            .with_interval(INTERVAL)
            .with_weight(weight)
            .record_history_for_tests();
        if barrier {
            o
        } else {
            o.without_barrier_for_tests()
        }
    };
    let mut notes = Vec::new();
    for (id, w) in [("i0", 2), ("i1", 1)] {
        let member = PoolMember::join(&client(&urls).await, POOL, id, opts(w))
            .await
            .expect("join");
        m.inproc.push((member, w));
    }
    for id in ["p0", "p1", "p2"] {
        m.spawn(id, 1);
    }
    let (t, owners) = m.settled(&expected).await;
    notes.push(format!(
        "2 in-process and 3 process members active after {t:?}"
    ));
    if barrier {
        m.assert_balanced(&owners);
    }

    // kill -9 a member process: its lease expires, its units move.
    let t0 = Instant::now();
    m.kill9("p0").await;
    let (_, owners) = m.settled(&expected).await;
    let crash = t0.elapsed();
    notes.push(format!(
        "process killed with -9: active after {crash:?} ({:.2} intervals)",
        crash.as_secs_f64() / INTERVAL.as_secs_f64()
    ));
    if barrier {
        m.assert_balanced(&owners);
        assert!(
            crash <= CRASH_BOUND,
            "after kill -9 of a member process the new table must be active within {CRASH_BOUND:?}: {crash:?}"
        );
    }

    // SIGSTOP a member process past its lease: its units move while it is frozen (measured
    // like a crash); after SIGCONT it rejoins and gets its share back.
    let pid = m.pid("p1");
    let t0 = Instant::now();
    kill(pid, Signal::SIGSTOP).expect("SIGSTOP");
    m.frozen.insert("p1".into());
    let (_, owners) = m.settled(&expected).await;
    let freeze = t0.elapsed();
    notes.push(format!(
        "process frozen with SIGSTOP: its units moved after {freeze:?} ({:.2} intervals)",
        freeze.as_secs_f64() / INTERVAL.as_secs_f64()
    ));
    if barrier {
        m.assert_balanced(&owners);
        assert!(
            freeze <= CRASH_BOUND,
            "a member process frozen past its lease must lose its units within {CRASH_BOUND:?}: {freeze:?}"
        );
    }
    tokio::time::sleep(INTERVAL).await;
    kill(pid, Signal::SIGCONT).expect("SIGCONT");
    m.frozen.remove("p1");
    let (t, owners) = m.settled(&expected).await;
    notes.push(format!(
        "frozen process resumed: back in the table after {t:?}"
    ));
    if barrier {
        m.assert_balanced(&owners);
    }

    // A Redis node dies; the killed process restarts with the same ID; units change.
    cluster.node(2).kill().await;
    m.spawn("p0", 1);
    let added: Vec<String> = (60..70).map(unit).collect();
    let removed: Vec<String> = (0..5).map(unit).collect();
    units.add(&added).await.expect("added");
    units.remove(&removed).await.expect("removed");
    expected.extend(added);
    for r in &removed {
        expected.remove(r);
    }
    let (t, owners) = m.settled(&expected).await;
    notes.push(format!(
        "restart with the same ID, 10 units added, 5 removed, a node down: settled after {t:?}"
    ));
    if barrier {
        m.assert_balanced(&owners);
    }

    // An in-process member crashes; a node comes back; another loses its data.
    let (crashed, _) = m.inproc.remove(1);
    m.gone.push((
        format!("in-process {} (crashed)", crashed.id()),
        crashed.history_for_tests(),
    ));
    crashed.crash_for_tests();
    cluster.node(2).restart().await;
    let (t, _) = m.settled(&expected).await;
    notes.push(format!("in-process crash: settled after {t:?}"));
    cluster.node(1).wipe_and_restart().await;

    // A graceful leave on SIGTERM, a new process joins with weight 2; then stable.
    m.terminate("p2").await;
    m.spawn("p3", 2);
    let (t, owners) = m.settled(&expected).await;
    notes.push(format!(
        "SIGTERM to a process and a new process with weight 2: settled after {t:?}"
    ));
    tokio::time::sleep(INTERVAL * 2).await;
    let (_, again) = m.settled(&expected).await;
    let moved: Vec<(&String, &String, &String)> = again
        .iter()
        .filter_map(|(u, o)| owners.get(u).filter(|b| *b != o).map(|b| (u, b, o)))
        .collect();
    // Reported, not asserted: once in CI a settled pool swapped two units between two members
    // within the next two intervals (cause not found yet; no unit had two owners, see the
    // checker below). The README lists it under Known gaps.
    notes.push(format!(
        "units moved in a stable pool over two intervals: {moved:?}"
    ));
    if barrier {
        m.assert_balanced(&again);
    }

    let verdict = checker::check_single_owner(&m.intervals(&index));
    for p in &mut m.procs {
        if let Some(c) = p.child.as_mut() {
            let _ = c.start_kill();
        }
    }
    for (member, _) in m.inproc.drain(..) {
        member.leave().await;
    }
    Run { verdict, notes }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn member_processes_killed_frozen_and_restarted_never_give_a_unit_two_owners() {
    let run = scenario(true).await;
    for n in &run.notes {
        println!("{n}");
    }
    run.verdict.unwrap_or_else(|e| {
        panic!("checker over every process's recorded intervals (one owner per unit): {e}")
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_barrier_member_processes_show_a_double_owner() {
    let run = scenario(false).await;
    for n in &run.notes {
        println!("{n}");
    }
    match run.verdict {
        Err(v @ OwnerViolation::TwoOwners { .. }) => println!("found, as expected: {v}"),
        Ok(()) => panic!(
            "with the barrier off in every member the checker must find a unit with two owners \
             over the processes' records; it found none"
        ),
    }
}
