//! The campaign's orchestrator: local `redis-server` nodes (each client reaches them through
//! its own fault proxies), the workload processes, two `redquorum serve` processes (clients of
//! the nodes like the others) and the workload processes that call them over HTTP, the nemesis
//! playing the seeded schedule, then the checkers and the summary.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use redquorum_testkit::record::{monotonic_ns, MonotonicOrigin};
use redquorum_testkit::{portmap, FaultMode, FaultProxy, LocalNodes};
use tokio::process::Child;
use tokio::time::Instant;

use crate::history::{self, Call};
use crate::plant::Plant;
use crate::schedule::{self, Fault, Planned, Settings};

/// What to run.
#[derive(Clone, Debug)]
pub struct Options {
    /// The seed of the schedule and of the workloads.
    pub seed: u64,
    /// How long the workloads run under faults.
    pub duration: Duration,
    /// Nodes.
    pub nodes: usize,
    /// ID workload processes.
    pub id_workers: usize,
    /// Lease holder processes.
    pub lock_workers: usize,
    /// Locks the holders share out (holder i takes lock i mod this).
    pub locks: usize,
    /// Work-distribution member processes (`redquorum dist watch --record`).
    pub dist_members: usize,
    /// Peer-indexing member processes (`redquorum index watch --record`).
    pub index_members: usize,
    /// Periodic-job runner processes.
    pub job_workers: usize,
    /// ID workload processes calling a `serve` process.
    pub http_id_workers: usize,
    /// Lease holder processes acquiring through a `serve` process.
    pub http_lock_workers: usize,
    /// The `redquorum` binary (for the CLI client).
    pub redquorum: PathBuf,
    /// A planted bug, if any.
    pub plant: Option<Plant>,
    /// Allow more than a minority faulty.
    pub beyond_minority: bool,
}

/// What a campaign found.
#[derive(Debug)]
pub struct Outcome {
    /// Operations by kind: (ok, failed).
    pub operations: BTreeMap<&'static str, (u64, u64)>,
    /// Faults by kind.
    pub faults: BTreeMap<&'static str, u64>,
    /// Violations by guarantee, each with its description.
    pub violations: Vec<(&'static str, String)>,
    /// Share of operations (ID calls, lease tries) that succeeded while some fault was active,
    /// and while none was.
    pub availability: (f64, f64),
    /// p99 latency of the workload processes' ID calls while some fault was active, and while
    /// none was.
    pub id_p99: (Duration, Duration),
    /// IDs returned (every ID of every successful call).
    pub ids_returned: u64,
    /// Lease holder processes frozen (SIGSTOP) for their TTL or longer, measured, and of
    /// those, the ones frozen while they held the lease.
    pub holder_freezes: (u64, u64),
    /// Faults that started beyond the model (a majority faulty for some client), and how long
    /// the schedule stayed beyond it.
    pub beyond: (usize, Duration),
    /// `serve` processes frozen together with an HTTP lease holder for the TTL or longer, and
    /// of those, the ones whose holder was seen holding when frozen.
    pub serve_holder_freezes: (u64, u64),
    /// What the fenced-mutex check checked, and how long it took.
    pub mutex_check: (redquorum_testkit::mutex::MutexStats, Duration),
}

/// What a client runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Ids,
    Locks,
    Dist,
    Index,
    Jobs,
    /// Calls a `serve` process for IDs.
    HttpIds,
    /// Holds leases through a `serve` process.
    HttpLocks,
    Cli,
    /// A `redquorum serve` process.
    Serve,
}

/// The `serve` processes started when any HTTP workload process runs.
const SERVES: usize = 2;

/// The peer-indexing group and the tasks its members' records cover.
const GROUP: &str = "campaign-group";
const GROUP_TASKS: u64 = 64;

/// The work-distribution pool and its units.
const POOL: &str = "campaign-pool";
const POOL_UNITS: usize = 40;

fn pool_unit(i: usize) -> String {
    format!("unit-{i:02}")
}

/// One client: its proxies to every node, and (for a workload process) the process.
struct ClientSlot {
    kind: Kind,
    name: String,
    /// A lease holder's lock.
    lock: String,
    /// The `serve` process an HTTP workload process calls (a `serve` process's own index).
    serve: usize,
    /// To every node (none for an HTTP workload process: it reaches no node).
    proxies: Vec<FaultProxy>,
    child: Option<Child>,
    records: Vec<PathBuf>,
    incarnations: usize,
}

impl ClientSlot {
    /// The process environment that routes its connections to the nodes' ports through this
    /// client's proxies (every client lists the same node URLs).
    fn envs(&self, nodes: &LocalNodes) -> Vec<(String, String)> {
        if self.proxies.is_empty() {
            return Vec::new();
        }
        let map: Vec<(u16, u16)> = self
            .proxies
            .iter()
            .enumerate()
            .map(|(n, p)| (nodes.port(n), p.addr().port()))
            .collect();
        portmap::envs(&map).to_vec()
    }
}

/// Where a `serve` process listens.
struct ServeAt {
    /// Its client slot (its proxies, its process).
    slot: usize,
    /// Its 127.0.0.1 port (restarted on it).
    port: u16,
    /// The file its callers read its base URL from.
    url_file: PathBuf,
    /// Its restart under way (after a kill): the process and its port, once it listens.
    restarting: Option<tokio::task::JoinHandle<Result<(Child, u16), String>>>,
}

/// How to start a `serve` process: its command line, environment and log.
struct ServeSpawn {
    program: PathBuf,
    nodes: String,
    envs: Vec<(String, String)>,
    name: String,
    log: PathBuf,
}

impl ServeSpawn {
    /// Start it on 127.0.0.1:`port` (through its proxies), and wait (up to 20 s) for its
    /// `listening on` line: the process and its base URL. Its stderr goes to its log (each
    /// try appended).
    async fn spawn(&self, port: u16) -> Result<(Child, String), String> {
        use tokio::io::AsyncBufReadExt;

        let log_file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .map_err(|e| format!("{}: {e}", self.log.display()))?;
        let mut child = tokio::process::Command::new(&self.program)
            .arg("--nodes")
            .arg(&self.nodes)
            .args(["serve", "--listen"])
            .arg(format!("127.0.0.1:{port}"))
            .env_remove("REDQUORUM_NODES")
            .env_remove("REDQUORUM_CLUSTER")
            .envs(self.envs.iter().cloned())
            .stdout(std::process::Stdio::piped())
            .stderr(log_file)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("{}: {e}", self.program.display()))?;
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| "serve: no stdout".to_string())?;
        let mut lines = tokio::io::BufReader::new(stdout).lines();
        let first = tokio::time::timeout(Duration::from_secs(20), lines.next_line()).await;
        let url = match first {
            Ok(Ok(Some(line))) => line.strip_prefix("listening on ").map(String::from),
            _ => None,
        };
        let Some(url) = url else {
            let _ = child.start_kill();
            let _ = child.wait().await;
            let why = std::fs::read_to_string(&self.log).unwrap_or_default();
            return Err(format!(
                "{} on port {port}: {}",
                self.name,
                crate::worker::one_line(why.lines().last().unwrap_or("no `listening on` line"))
            ));
        };
        // Whatever else it prints is read and dropped.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Ok((child, url))
    }
}

struct Campaign {
    opts: Options,
    nodes: Arc<LocalNodes>,
    /// The fenced resource: a Redis node outside the quorum, never faulted.
    resource: LocalNodes,
    dir: PathBuf,
    clients: Vec<ClientSlot>,
    /// Lease holders frozen now: since when, and whether the freeze landed while it held.
    frozen: BTreeMap<usize, (Instant, bool)>,
    /// Holder freezes that lasted the lease TTL or more, and of those, the ones that landed
    /// while the holder held the lease.
    holder_freezes: (u64, u64),
    /// Aimed faults cancelled for want of an acquisition to aim at.
    aimed_cancelled: u64,
    /// Aimed FLUSHALLs that found no moment to aim at (no repair claim or no beat seen in
    /// time) and flushed anyway, by kind.
    aims_missed: BTreeMap<&'static str, u64>,
    /// The `serve` processes.
    serves: Vec<ServeAt>,
    /// HTTP lease holders frozen now with their server: since when, and whether the freeze
    /// landed while it held.
    serve_frozen: BTreeMap<usize, (Instant, bool)>,
    /// See [`Outcome::serve_holder_freezes`].
    serve_holder_freezes: (u64, u64),
}

/// Run a campaign (see the module docs).
pub async fn run(opts: Options, dir: &Path) -> Result<Outcome, String> {
    let nodes = Arc::new(
        tokio::task::spawn_blocking({
            let n = opts.nodes;
            move || LocalNodes::start_with_clocks(n)
        })
        .await
        .map_err(|e| e.to_string())?,
    );
    let resource = tokio::task::spawn_blocking(|| LocalNodes::start(1))
        .await
        .map_err(|e| e.to_string())?;
    // Workload processes first (the client faults hit them; the HTTP callers last of them),
    // then the CLI client (its proxies only; it runs short processes), then the `serve`
    // processes (their proxies; the `serve` faults hit them).
    let serves = if opts.http_id_workers + opts.http_lock_workers > 0 {
        SERVES
    } else {
        0
    };
    let mut kinds = vec![Kind::Ids; opts.id_workers];
    kinds.extend(vec![Kind::Locks; opts.lock_workers]);
    kinds.extend(vec![Kind::Dist; opts.dist_members]);
    kinds.extend(vec![Kind::Index; opts.index_members]);
    kinds.extend(vec![Kind::Jobs; opts.job_workers]);
    let http_callers = kinds.len();
    kinds.extend(vec![Kind::HttpIds; opts.http_id_workers]);
    let http_holders = kinds.len();
    kinds.extend(vec![Kind::HttpLocks; opts.http_lock_workers]);
    kinds.push(Kind::Cli);
    let first_serve = kinds.len();
    kinds.extend(vec![Kind::Serve; serves]);
    let mut clients = Vec::new();
    for (c, kind) in kinds.iter().enumerate() {
        let mut proxies = Vec::new();
        if !matches!(kind, Kind::HttpIds | Kind::HttpLocks) {
            for n in 0..opts.nodes {
                proxies
                    .push(FaultProxy::start(nodes.addr(n), &format!("client {c} node {n}")).await);
            }
        }
        let name = match kind {
            Kind::Ids => format!("ids-{c}"),
            Kind::Locks => format!("holder-{c}"),
            Kind::Dist => format!("member-{c}"),
            Kind::Index => format!("instance-{c}"),
            Kind::Jobs => format!("runner-{c}"),
            Kind::HttpIds => format!("http-ids-{c}"),
            Kind::HttpLocks => format!("http-holder-{c}"),
            Kind::Cli => "cli".to_string(),
            Kind::Serve => format!("serve-{}", c - first_serve),
        };
        // Holder i of each kind takes lock i mod the locks; an HTTP caller j of each kind calls
        // server j mod the servers (as `Settings::serve_of`).
        let nth = match kind {
            Kind::HttpIds => c - http_callers,
            Kind::HttpLocks => c - http_holders,
            Kind::Serve => c - first_serve,
            _ => c.saturating_sub(opts.id_workers),
        };
        clients.push(ClientSlot {
            kind: *kind,
            name,
            lock: format!("campaign-{}", nth % opts.locks.max(1)),
            serve: nth % serves.max(1),
            proxies,
            child: None,
            records: Vec::new(),
            incarnations: 0,
        });
    }
    let processes = kinds.len() - 1 - serves;
    let mut campaign = Campaign {
        opts: opts.clone(),
        nodes,
        resource,
        dir: dir.to_path_buf(),
        clients,
        frozen: BTreeMap::new(),
        holder_freezes: (0, 0),
        aimed_cancelled: 0,
        aims_missed: BTreeMap::new(),
        serves: Vec::new(),
        serve_frozen: BTreeMap::new(),
        serve_holder_freezes: (0, 0),
    };
    // The operator's one `cluster init`, before any client.
    redquorum::Client::init_cluster(
        redquorum::Config::from_urls(campaign.nodes.urls()).map_err(|e| e.to_string())?,
    )
    .await
    .map_err(|e| format!("cluster init: {e}"))?;
    if opts.dist_members > 0 {
        let client = redquorum::Client::connect(
            redquorum::Config::from_urls(campaign.nodes.urls()).map_err(|e| e.to_string())?,
        )
        .await
        .map_err(|e| e.to_string())?;
        redquorum::Units::new(&client, POOL)
            .map_err(|e| e.to_string())?
            .add(&(0..POOL_UNITS).map(pool_unit).collect::<Vec<_>>())
            .await
            .map_err(|e| format!("the pool's units: {e}"))?;
    }
    // The `serve` processes, once the cluster is set up, before their callers.
    for v in 0..serves {
        campaign.start_serve(v, first_serve + v).await?;
    }
    for c in 0..processes {
        campaign.spawn_worker(c)?;
    }
    let origin = MonotonicOrigin::now();
    let settings = Settings {
        nodes: opts.nodes,
        clients: campaign.clients.len(),
        processes,
        duration: opts.duration,
        gap: Duration::from_millis(600),
        beyond_minority: opts.beyond_minority,
        holders: (opts.id_workers, opts.id_workers + opts.lock_workers),
        serves,
        http_callers: (http_callers, processes),
        http_holders: (http_holders, processes),
    };
    let plan = schedule::draw(opts.seed, &settings);
    let cli = tokio::spawn(cli_loop(
        opts.redquorum.clone(),
        campaign.nodes.urls(),
        campaign.clients[processes].envs(&campaign.nodes),
        opts.seed,
        Instant::now() + opts.duration,
    ));
    let windows = campaign.play(&plan).await?;
    // Healed: let the workloads run a little, then stop them.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut calls: Vec<Call> = cli.await.map_err(|e| e.to_string())?;
    let mut leases: BTreeMap<String, history::LeaseHistory> = BTreeMap::new();
    let index: std::collections::BTreeMap<String, u64> =
        (0..POOL_UNITS).map(|i| (pool_unit(i), i as u64)).collect();
    let mut ownership = Vec::new();
    let tasks: std::collections::BTreeMap<String, u64> =
        (0..GROUP_TASKS).map(|t| (t.to_string(), t)).collect();
    let mut indexing = Vec::new();
    let mut jobs = history::JobHistory::default();
    // Lease counts of the holder processes, and of the HTTP holders: (acquired, failed,
    // writes accepted, writes rejected).
    let mut lease_counts = [(0u64, 0u64, 0u64, 0u64); 2];
    for c in 0..processes {
        campaign.stop_worker(c).await?;
    }
    campaign.settle_serves(true, None).await;
    for v in 0..serves {
        let slot = campaign.serves[v].slot;
        campaign.stop_worker(slot).await?;
    }
    for c in 0..processes {
        let slot = &campaign.clients[c];
        for (k, path) in slot.records.iter().enumerate() {
            // A process killed before it created its record (a CLI member still connecting)
            // recorded nothing.
            let text = match std::fs::read_to_string(path) {
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
                other => other.map_err(|e| format!("{path:?}: {e}"))?,
            };
            let who = format!("{} (incarnation {k})", slot.name);
            match slot.kind {
                Kind::Ids | Kind::HttpIds => calls.extend(history::parse_ids(&who, &text)?),
                Kind::Locks | Kind::HttpLocks => {
                    let mut h = history::LeaseHistory::default();
                    history::parse_leases(&who, &text, &mut h)?;
                    let counts = &mut lease_counts[usize::from(slot.kind == Kind::HttpLocks)];
                    let accepted = h.writes.iter().filter(|w| w.4).count() as u64;
                    counts.0 += h.acquired;
                    counts.1 += h.failed;
                    counts.2 += accepted;
                    counts.3 += h.writes.len() as u64 - accepted;
                    // One history per lock: the HTTP holders contend with the others.
                    leases.entry(slot.lock.clone()).or_default().merge(h);
                }
                Kind::Dist => ownership.extend(
                    redquorum_testkit::record::ownership(&who, &text, &index, origin)
                        .map_err(|e| format!("{who}: {e}"))?,
                ),
                Kind::Index => indexing.extend(
                    redquorum_testkit::record::ownership(&who, &text, &tasks, origin)
                        .map_err(|e| format!("{who}: {e}"))?,
                ),
                Kind::Jobs => history::parse_jobs(&who, &text, &mut jobs)?,
                Kind::Cli | Kind::Serve => {}
            }
        }
    }
    let mut outcome = Outcome {
        operations: BTreeMap::new(),
        faults: BTreeMap::new(),
        violations: Vec::new(),
        availability: (0.0, 0.0),
        id_p99: (Duration::ZERO, Duration::ZERO),
        ids_returned: 0,
        holder_freezes: campaign.holder_freezes,
        beyond: schedule::beyond_the_model(&plan, &settings),
        serve_holder_freezes: campaign.serve_holder_freezes,
        mutex_check: Default::default(),
    };
    for p in &plan {
        *outcome.faults.entry(p.fault.kind()).or_default() += 1;
    }
    if campaign.aimed_cancelled > 0 {
        if let Some(n) = outcome.faults.get_mut("wipe after a missed grant") {
            *n = n.saturating_sub(campaign.aimed_cancelled);
        }
        outcome.faults.insert(
            "wipe after a missed grant, cancelled (no acquisition within 5 s)",
            campaign.aimed_cancelled,
        );
    }
    for (kind, missed) in &campaign.aims_missed {
        outcome.faults.insert(kind, *missed);
    }
    outcome.ids_returned = calls
        .iter()
        .filter_map(|c| c.ids)
        .map(|(a, b)| b - a + 1)
        .sum();
    let (mut faulty, mut healthy) = ((0u64, 0u64), (0u64, 0u64));
    let (mut lat_faulty, mut lat_healthy) = (Vec::new(), Vec::new());
    for c in &calls {
        let (cli, http) = (c.who.starts_with("cli"), c.who.starts_with("http"));
        let kind = if cli {
            "id (cli process)"
        } else if http {
            "id (http caller through serve)"
        } else {
            "id (workload process)"
        };
        let e = outcome.operations.entry(kind).or_default();
        if c.ids.is_some() {
            e.0 += 1;
        } else {
            e.1 += 1;
        }
        let during = windows.iter().any(|(a, b)| c.start < *b && *a < c.end);
        let slot = if during { &mut faulty } else { &mut healthy };
        slot.0 += 1;
        slot.1 += u64::from(c.ids.is_some());
        if c.ids.is_some() && !cli && !http {
            let lat = c.end.saturating_sub(c.start);
            if during {
                lat_faulty.push(lat);
            } else {
                lat_healthy.push(lat);
            }
        }
    }
    for (start, end, ok) in leases.values().flat_map(|h| &h.attempts) {
        let during = windows.iter().any(|(a, b)| *start < *b && *a < *end);
        let slot = if during { &mut faulty } else { &mut healthy };
        slot.0 += 1;
        slot.1 += u64::from(*ok);
    }
    let share = |(n, ok): (u64, u64)| if n == 0 { 1.0 } else { ok as f64 / n as f64 };
    outcome.availability = (share(faulty), share(healthy));
    let p99 = |mut v: Vec<u64>| -> Duration {
        v.sort_unstable();
        let i = (v.len() * 99 / 100).min(v.len().saturating_sub(1));
        Duration::from_nanos(v.get(i).copied().unwrap_or(0))
    };
    outcome.id_p99 = (p99(lat_faulty), p99(lat_healthy));
    let [own, http] = lease_counts;
    outcome
        .operations
        .insert("lease acquisition (holder process)", (own.0, own.1));
    outcome.operations.insert(
        "fenced write by a holder process (accepted, rejected)",
        (own.2, own.3),
    );
    if opts.http_lock_workers > 0 {
        outcome.operations.insert(
            "lease acquisition (http caller through serve)",
            (http.0, http.1),
        );
        outcome.operations.insert(
            "fenced write by an http caller (accepted, rejected)",
            (http.2, http.3),
        );
    }
    for (members, intervals, kind, guarantee) in [
        (
            opts.dist_members,
            &ownership,
            "unit ownership interval (member process)",
            "one owner per unit",
        ),
        (
            opts.index_members,
            &indexing,
            "task ownership interval (group member process)",
            "one owner per task",
        ),
    ] {
        if members == 0 {
            continue;
        }
        outcome.operations.insert(kind, (intervals.len() as u64, 0));
        if let Err(v) = redquorum_testkit::checker::check_single_owner(intervals) {
            outcome.violations.push((guarantee, v.to_string()));
        }
    }
    if opts.job_workers > 0 {
        outcome.operations.insert(
            "periodic job work (begun, completions recorded)",
            (jobs.begun.len() as u64, jobs.ran.len() as u64),
        );
        if let Err(v) = history::check_jobs(&jobs) {
            outcome.violations.push(("periodic jobs", v));
        }
    }
    if let Err(v) = history::check(&calls, origin) {
        outcome.violations.push(("ids", v));
    }
    outcome.mutex_check = history::check_leases(&leases, origin, &mut outcome.violations);
    Ok(outcome)
}

impl Campaign {
    fn spawn_worker(&mut self, c: usize) -> Result<(), String> {
        let exe = std::env::current_exe().map_err(|e| e.to_string())?;
        let envs = self.clients[c].envs(&self.nodes);
        let urls = self.nodes.urls().join(",");
        let slot = &mut self.clients[c];
        let path = self
            .dir
            .join(format!("{}.{}.rec", slot.name, slot.incarnations));
        let seed = (self.opts.seed ^ ((c as u64) << 32) ^ slot.incarnations as u64).to_string();
        let mut cmd = match slot.kind {
            Kind::Ids | Kind::Locks | Kind::Jobs => {
                let mut cmd = tokio::process::Command::new(exe);
                cmd.arg("worker");
                match slot.kind {
                    Kind::Ids => cmd.arg("ids"),
                    Kind::Jobs => cmd.arg("jobs"),
                    _ => cmd
                        .arg("locks")
                        .arg("--resource")
                        .arg(self.resource.url(0))
                        .arg("--lock")
                        .arg(&slot.lock),
                };
                cmd.arg("--nodes")
                    .arg(urls)
                    .arg("--out")
                    .arg(&path)
                    .arg("--seed")
                    .arg(seed);
                if let Some(p) = self.opts.plant {
                    cmd.arg("--plant").arg(p.to_string());
                }
                cmd
            }
            Kind::HttpIds | Kind::HttpLocks => {
                let mut cmd = tokio::process::Command::new(exe);
                cmd.arg("worker");
                if slot.kind == Kind::HttpIds {
                    cmd.arg("http-ids");
                } else {
                    cmd.arg("http-locks")
                        .arg("--resource")
                        .arg(self.resource.url(0))
                        .arg("--lock")
                        .arg(&slot.lock)
                        .arg("--holder")
                        .arg(&slot.name);
                    if let Some(p) = self.opts.plant {
                        cmd.arg("--plant").arg(p.to_string());
                    }
                }
                let server = self
                    .serves
                    .get(slot.serve)
                    .ok_or_else(|| format!("worker {c}: no serve process {}", slot.serve))?;
                cmd.arg("--server")
                    .arg(&server.url_file)
                    .arg("--out")
                    .arg(&path)
                    .arg("--seed")
                    .arg(seed);
                cmd
            }
            Kind::Dist => {
                let mut cmd = tokio::process::Command::new(&self.opts.redquorum);
                cmd.arg("--nodes")
                    .arg(urls)
                    .args(["dist", "watch", POOL, "--interval", "500ms", "--id"])
                    .arg(&slot.name)
                    .arg("--record")
                    .arg(&path)
                    .env_remove("REDQUORUM_NODES")
                    .env_remove("REDQUORUM_CLUSTER")
                    .stdout(std::process::Stdio::null());
                if self.opts.plant == Some(Plant::BarrierOff) {
                    cmd.arg("--no-barrier-for-tests");
                }
                cmd
            }
            Kind::Index => {
                let mut cmd = tokio::process::Command::new(&self.opts.redquorum);
                cmd.arg("--nodes")
                    .arg(urls)
                    .args(["index", "watch", GROUP, "--interval", "500ms", "--id"])
                    .arg(&slot.name)
                    .arg("--record")
                    .arg(&path)
                    .arg("--tasks")
                    .arg(GROUP_TASKS.to_string())
                    .env_remove("REDQUORUM_NODES")
                    .env_remove("REDQUORUM_CLUSTER")
                    .stdout(std::process::Stdio::null());
                if self.opts.plant == Some(Plant::BarrierOff) {
                    cmd.arg("--no-barrier-for-tests");
                }
                cmd
            }
            Kind::Cli | Kind::Serve => return Ok(()),
        };
        // Each process's stderr goes to a log beside its record: the campaign's own output
        // stays the summary (its last line is read by scripts).
        let log = std::fs::File::create(path.with_extension("log"))
            .map_err(|e| format!("{}: {e}", path.display()))?;
        cmd.envs(envs).stderr(log).kill_on_drop(true);
        slot.child = Some(cmd.spawn().map_err(|e| format!("worker {c}: {e}"))?);
        slot.records.push(path);
        slot.incarnations += 1;
        Ok(())
    }

    /// Stop process `c` (kill -9). A killed HTTP lease holder's record gets the `rel` line it
    /// could not write: its server releases the lease as soon as its connection closes, so
    /// the instant just before the kill ends its tenure (see `worker.rs`).
    async fn stop_worker(&mut self, c: usize) -> Result<(), String> {
        if let Some(mut child) = self.clients[c].child.take() {
            if let Some(pid) = child.id() {
                let _ = kill(Pid::from_raw(pid as i32), Signal::SIGCONT);
            }
            let killed_at = monotonic_ns();
            let _ = child.start_kill();
            let _ = child.wait().await;
            if self.clients[c].kind == Kind::HttpLocks {
                if let Some(path) = self.clients[c].records.last() {
                    end_open_tenure(path, killed_at)?;
                }
            }
        }
        Ok(())
    }

    /// How to start `serve` process `v` (its next incarnation).
    fn serve_spawn(&mut self, v: usize) -> ServeSpawn {
        let slot = self.serves.get(v).map_or(v, |s| s.slot);
        let envs = self.clients[slot].envs(&self.nodes);
        let s = &mut self.clients[slot];
        let log = self.dir.join(format!("{}.{}.log", s.name, s.incarnations));
        s.incarnations += 1;
        ServeSpawn {
            program: self.opts.redquorum.clone(),
            nodes: self.nodes.urls().join(","),
            envs,
            name: s.name.clone(),
            log,
        }
    }

    /// Start `serve` process `v` (client slot `slot`) on a free port, wait until it listens,
    /// and write its URL file.
    async fn start_serve(&mut self, v: usize, slot: usize) -> Result<(), String> {
        let url_file = self.dir.join(format!("serve-{v}.url"));
        self.serves.push(ServeAt {
            slot,
            port: 0,
            url_file: url_file.clone(),
            restarting: None,
        });
        let mut last = String::new();
        for _ in 0..5 {
            let port = free_port()?;
            match self.serve_spawn(v).spawn(port).await {
                Ok((child, url)) => {
                    write_url_file(&url_file, &url)?;
                    self.serves[v].port = port;
                    self.clients[slot].child = Some(child);
                    return Ok(());
                }
                Err(e) => last = e,
            }
        }
        Err(format!("serve process {v} did not start: {last}"))
    }

    /// Start killed `serve` process `v` again, in the background (its start waits for a
    /// majority of nodes to answer, which the nemesis must not wait for): on its port, tried
    /// again while it fails (the port not free yet, or no cluster readable: a majority of
    /// nodes wiped and not yet repaired) for 5 s, then on another port (whose URL its callers
    /// read from the URL file), for up to a minute. [`Campaign::settle_serves`] takes the
    /// process over.
    fn restart_serve(&mut self, v: usize) {
        let spawn = self.serve_spawn(v);
        let (port, url_file) = (self.serves[v].port, self.serves[v].url_file.clone());
        self.serves[v].restarting = Some(tokio::spawn(async move {
            let begun = Instant::now();
            let mut last = String::new();
            while begun.elapsed() < Duration::from_secs(60) {
                let on = if begun.elapsed() < Duration::from_secs(5) {
                    port
                } else {
                    free_port()?
                };
                match spawn.spawn(on).await {
                    Ok((child, url)) => {
                        write_url_file(&url_file, &url)?;
                        return Ok((child, on));
                    }
                    Err(e) => last = e,
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(last)
        }));
    }

    /// Take over the `serve` processes restarted in the background: those whose start ended
    /// (all of them, waiting, with `wait`; only `v` with `only`).
    async fn settle_serves(&mut self, wait: bool, only: Option<usize>) {
        for v in 0..self.serves.len() {
            if only.is_some_and(|o| o != v) {
                continue;
            }
            let Some(handle) = self.serves[v].restarting.take() else {
                continue;
            };
            if !wait && !handle.is_finished() {
                self.serves[v].restarting = Some(handle);
                continue;
            }
            match handle.await {
                Ok(Ok((child, port))) => {
                    if port != self.serves[v].port {
                        *self
                            .aims_missed
                            .entry("serve kill -9 + restart, of which restarted on another port")
                            .or_default() += 1;
                        self.serves[v].port = port;
                    }
                    let slot = self.serves[v].slot;
                    self.clients[slot].child = Some(child);
                }
                Ok(Err(e)) => {
                    tracing::warn!("campaign: serve process {v} did not restart: {e}");
                    *self
                        .aims_missed
                        .entry("serve kill -9 + restart, of which not restarted within a minute")
                        .or_default() += 1;
                }
                Err(e) if e.is_cancelled() => {}
                Err(e) => tracing::warn!("campaign: serve process {v}'s restart: {e}"),
            }
        }
    }

    fn signal_worker(&self, c: usize, signal: Signal) {
        if let Some(pid) = self.clients[c].child.as_ref().and_then(Child::id) {
            let _ = kill(Pid::from_raw(pid as i32), signal);
        }
    }

    async fn node_op(&self, f: impl FnOnce(&LocalNodes) + Send + 'static) {
        let nodes = self.nodes.clone();
        let _ = tokio::task::spawn_blocking(move || f(&nodes)).await;
    }

    /// Play the schedule; returns the windows (CLOCK_MONOTONIC ns) during which some fault
    /// was active.
    async fn play(&mut self, plan: &[Planned]) -> Result<Vec<(u64, u64)>, String> {
        let mut t0 = Instant::now();
        // Events: (when, starts?, index in plan).
        let mut events: Vec<(Duration, bool, usize)> = Vec::new();
        for (i, p) in plan.iter().enumerate() {
            events.push((p.at, true, i));
            events.push((p.at + p.lasts, false, i));
        }
        events.sort_by_key(|(t, start, i)| (*t, *start, *i));
        let mut windows = Vec::new();
        let mut active = 0usize;
        let mut since = 0u64;
        for (t, start, i) in events {
            tokio::time::sleep_until(t0 + t).await;
            self.settle_serves(false, None).await;
            let fault = plan[i].fault;
            tracing::info!(at = ?t, %fault, start, "nemesis");
            if start {
                if active == 0 {
                    since = monotonic_ns();
                }
                active += 1;
                // An aimed fault waits for its moment (and a node operation takes time): every
                // later event moves by that much, so the plan's order of events, which the
                // minority rule was checked on, is the order played, and each fault lasts its
                // planned time from the moment it lands.
                let began = Instant::now();
                self.begin(fault).await?;
                t0 += began.elapsed();
            } else {
                self.end(fault).await?;
                active -= 1;
                if active == 0 {
                    windows.push((since, monotonic_ns()));
                }
            }
        }
        Ok(windows)
    }

    async fn begin(&mut self, fault: Fault) -> Result<(), String> {
        match fault {
            Fault::Kill(n) => self.node_op(move |x| x.kill(n)).await,
            Fault::Freeze(n) => self.node_op(move |x| x.freeze(n)).await,
            Fault::Wipe(n) => self.node_op(move |x| x.wipe_and_restart(n)).await,
            Fault::Flush(n) => self.flush(n).await,
            Fault::FlushMidRepair(n) => {
                self.node_op(move |x| x.restart(n)).await;
                if !self.until_repairing(n).await {
                    *self
                        .aims_missed
                        .entry("node FLUSHALL mid-repair (aimed), of which no claim seen in 5 s (flushed anyway)")
                        .or_default() += 1;
                }
                self.flush(n).await;
            }
            Fault::FlushAfterBeat(n) => {
                if !self.until_beat(n).await {
                    *self
                        .aims_missed
                        .entry("node FLUSHALL after a beat (aimed), of which no beat seen in 3 s (flushed anyway)")
                        .or_default() += 1;
                }
                self.flush(n).await;
            }
            Fault::ClockStep(n, ms) => self.nodes.step_clock_ms(n, ms),
            Fault::Partition(c, n) => self.clients[c].proxies[n].set_mode(FaultMode::CutOff),
            Fault::DropReplies(c, n) => self.clients[c].proxies[n].set_mode(FaultMode::DropReplies),
            Fault::Latency(c, n, ms) => {
                self.clients[c].proxies[n].set_latency(Duration::from_millis(ms))
            }
            Fault::ClientKill(c) => self.stop_worker(c).await?,
            Fault::ServeKill(v) => {
                // A restart still under way is killed with it.
                if let Some(restarting) = &self.serves[v].restarting {
                    restarting.abort();
                }
                self.settle_serves(true, Some(v)).await;
                let slot = self.serves[v].slot;
                self.stop_worker(slot).await?;
            }
            Fault::ServeFreeze(v) => {
                self.settle_serves(true, Some(v)).await;
                self.signal_worker(self.serves[v].slot, Signal::SIGSTOP)
            }
            Fault::ServeFreezeHolding(v, c) => {
                self.settle_serves(true, Some(v)).await;
                // Longer than a holder process's aim: an HTTP holder holds less often (an
                // acquisition that had to wait arrives with its validity spent: see `worker.rs`).
                let holding = self.until_holding(c, Duration::from_secs(5)).await;
                if !holding {
                    *self
                        .aims_missed
                        .entry("serve SIGSTOP with its lease holder (aimed), of which the holder not seen holding in 5 s (frozen anyway)")
                        .or_default() += 1;
                }
                self.signal_worker(c, Signal::SIGSTOP);
                self.signal_worker(self.serves[v].slot, Signal::SIGSTOP);
                self.serve_frozen.insert(c, (Instant::now(), holding));
            }
            Fault::ClientFreeze(c) => {
                let holder = self.clients[c].kind == Kind::Locks;
                let holding = holder && self.until_holding(c, Duration::from_secs(2)).await;
                self.signal_worker(c, Signal::SIGSTOP);
                if holder {
                    self.frozen.insert(c, (Instant::now(), holding));
                }
            }
            Fault::WipeAfterMissedGrant(c, missed, wiped) => {
                let cut = monotonic_ns();
                self.clients[c].proxies[missed].set_mode(FaultMode::CutOff);
                let acquired = self.until_acquired(c, cut).await;
                if acquired {
                    self.signal_worker(c, Signal::SIGSTOP);
                    self.frozen.insert(c, (Instant::now(), true));
                }
                self.clients[c].proxies[missed].set_mode(FaultMode::Normal);
                if acquired {
                    self.node_op(move |x| x.wipe_and_restart(wiped)).await;
                } else {
                    // No acquisition to aim at: the fault is cancelled (reconnected, nothing
                    // frozen or wiped), and counted as such.
                    self.aimed_cancelled += 1;
                }
            }
        }
        Ok(())
    }

    /// FLUSHALL node `n` (no restart: every key gone, the run_id kept).
    async fn flush(&self, n: usize) {
        self.node_op(move |x| {
            if !x.flushall(n) {
                tracing::warn!(
                    node = n,
                    "campaign: FLUSHALL not taken (node down or frozen)"
                );
            }
        })
        .await;
    }

    /// A direct connection to node `n`, bypassing every proxy (the nemesis's own).
    async fn direct(&self, n: usize) -> Option<redis::aio::MultiplexedConnection> {
        let client = redis::Client::open(self.nodes.url(n)).ok()?;
        tokio::time::timeout(
            Duration::from_secs(1),
            client.get_multiplexed_async_connection(),
        )
        .await
        .ok()?
        .ok()
    }

    /// Wait (up to 5 s) until a repair's claim (`rq:repairing`) shows on node `n`: a repair
    /// is copying onto it. False if none was seen.
    async fn until_repairing(&self, n: usize) -> bool {
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Some(mut con) = self.direct(n).await {
                while Instant::now() < deadline {
                    let claimed: Result<bool, _> = redis::cmd("EXISTS")
                        .arg("rq:repairing")
                        .query_async(&mut con)
                        .await;
                    match claimed {
                        Ok(true) => return true,
                        Ok(false) => tokio::time::sleep(Duration::from_millis(1)).await,
                        Err(_) => break,
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        false
    }

    /// Wait (up to 3 s) until a member's beat on node `n` changes (a beat of the indexing
    /// group or of the pool just landed). False if none changed.
    async fn until_beat(&self, n: usize) -> bool {
        let Some(mut con) = self.direct(n).await else {
            return false;
        };
        let keys = [format!("rq:members:{GROUP}"), format!("rq:pmembers:{POOL}")];
        let read = |con: &mut redis::aio::MultiplexedConnection| {
            let mut pipe = redis::pipe();
            for k in &keys {
                pipe.cmd("HGETALL").arg(k);
            }
            let mut con = con.clone();
            async move {
                pipe.query_async::<Vec<BTreeMap<String, String>>>(&mut con)
                    .await
                    .ok()
            }
        };
        let Some(first) = read(&mut con).await else {
            return false;
        };
        let deadline = Instant::now() + Duration::from_secs(3);
        while Instant::now() < deadline {
            match read(&mut con).await {
                Some(now) if now != first => return true,
                Some(_) => tokio::time::sleep(Duration::from_millis(1)).await,
                None => return false,
            }
        }
        false
    }

    /// A targeted freeze: wait (up to `within`) until lease holder `c` holds the lease (its
    /// record ends with an acquisition or a write), so the freeze lands between its check and
    /// its next write, where a late write needs the fencing.
    async fn until_holding(&self, c: usize, within: Duration) -> bool {
        let Some(path) = self.clients[c].records.last() else {
            return false;
        };
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            let len = file_len(path);
            let text = read_from(path, len.saturating_sub(512));
            let last = text
                .trim_end_matches('\n')
                .rsplit('\n')
                .next()
                .unwrap_or("");
            if last.starts_with("acq\t") || last.starts_with("w\t") {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        false
    }

    /// Wait (up to 5 s) until lease holder `c` records an acquisition whose attempt began at
    /// or after `cut` (CLOCK_MONOTONIC ns): one that the cut-off node missed. False if none.
    async fn until_acquired(&self, c: usize, cut: u64) -> bool {
        let Some(path) = self.clients[c].records.last() else {
            return false;
        };
        let from = file_len(path);
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            let text = read_from(path, from);
            // Whole lines only: a line is written in one call; `acq <start> <end> ...`.
            let whole = &text[..text.rfind('\n').map_or(0, |i| i + 1)];
            let found = whole.lines().any(|l| {
                let mut f = l.split('\t');
                f.next() == Some("acq")
                    && f.next()
                        .and_then(|t| t.parse::<u64>().ok())
                        .is_some_and(|t| t >= cut)
            });
            if found {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        false
    }

    async fn end(&mut self, fault: Fault) -> Result<(), String> {
        match fault {
            Fault::Kill(n) => self.node_op(move |x| x.restart(n)).await,
            Fault::Freeze(n) => self.node_op(move |x| x.thaw(n)).await,
            Fault::Wipe(_)
            | Fault::Flush(_)
            | Fault::FlushMidRepair(_)
            | Fault::FlushAfterBeat(_) => {}
            Fault::ClockStep(n, ms) => self.nodes.step_clock_ms(n, -ms),
            Fault::Partition(c, n) | Fault::DropReplies(c, n) => {
                self.clients[c].proxies[n].set_mode(FaultMode::Normal)
            }
            Fault::Latency(c, n, _) => self.clients[c].proxies[n].set_latency(Duration::ZERO),
            Fault::ClientKill(c) => self.spawn_worker(c)?,
            Fault::ServeKill(v) => self.restart_serve(v),
            Fault::ServeFreeze(v) => self.signal_worker(self.serves[v].slot, Signal::SIGCONT),
            Fault::ServeFreezeHolding(v, c) => {
                self.signal_worker(c, Signal::SIGCONT);
                self.signal_worker(self.serves[v].slot, Signal::SIGCONT);
                if let Some((at, holding)) = self.serve_frozen.remove(&c) {
                    if at.elapsed() >= crate::worker::LEASE_TTL {
                        self.serve_holder_freezes.0 += 1;
                        self.serve_holder_freezes.1 += u64::from(holding);
                    }
                }
            }
            Fault::ClientFreeze(c) | Fault::WipeAfterMissedGrant(c, ..) => {
                self.signal_worker(c, Signal::SIGCONT);
                if let Some((at, holding)) = self.frozen.remove(&c) {
                    if at.elapsed() >= crate::worker::LEASE_TTL {
                        self.holder_freezes.0 += 1;
                        self.holder_freezes.1 += u64::from(holding);
                    }
                }
            }
        }
        Ok(())
    }
}

/// A free 127.0.0.1 port below Linux's ephemeral range (32768-60999, as the test kit's node
/// ports), so the port of a killed `serve` process is not taken by some outgoing connection
/// before it restarts on it.
fn free_port() -> Result<u16, String> {
    use rand::Rng;
    let mut rng = rand::rng();
    for _ in 0..1000 {
        let port = rng.random_range(20_000..32_000);
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return Ok(port);
        }
    }
    Err("no free port in 20000..32000 on 127.0.0.1".into())
}

/// Write a `serve` process's base URL to its URL file, whole (written aside, then renamed).
fn write_url_file(path: &Path, url: &str) -> Result<(), String> {
    let aside = path.with_extension("url.new");
    std::fs::write(&aside, format!("{url}\n"))
        .and_then(|()| std::fs::rename(&aside, path))
        .map_err(|e| format!("{}: {e}", path.display()))
}

/// End the open tenure of a killed HTTP lease holder's record (its last `acq` without a `rel`
/// after it) with a `rel` line at `at`; a partial last line (killed mid-write) is dropped
/// first, as the parser would.
fn end_open_tenure(path: &Path, at: u64) -> Result<(), String> {
    use std::io::Write;
    let fail = |e: std::io::Error| format!("{}: {e}", path.display());
    let text = std::fs::read_to_string(path).map_err(fail)?;
    let whole = text.rfind('\n').map_or(0, |i| i + 1);
    let mut open = None;
    for line in text[..whole].lines() {
        let mut fields = line.split('\t');
        match fields.next() {
            Some("acq") => open = fields.nth(2).map(String::from),
            Some("rel") => open = None,
            _ => {}
        }
    }
    let Some(token) = open else {
        return Ok(());
    };
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .map_err(fail)?;
    file.set_len(whole as u64).map_err(fail)?;
    use std::io::Seek;
    file.seek(std::io::SeekFrom::End(0)).map_err(fail)?;
    file.write_all(format!("rel\t{at}\t{token}\n").as_bytes())
        .map_err(fail)
}

/// The length of a record file (0 if unreadable).
fn file_len(path: &Path) -> u64 {
    std::fs::metadata(path).map(|m| m.len()).unwrap_or(0)
}

/// A record file's text from byte `from` on (empty if unreadable).
fn read_from(path: &Path, from: u64) -> String {
    use std::io::{Read, Seek, SeekFrom};
    let mut text = String::new();
    if let Ok(mut f) = std::fs::File::open(path) {
        let mut bytes = Vec::new();
        if f.seek(SeekFrom::Start(from)).is_ok() && f.read_to_end(&mut bytes).is_ok() {
            text = String::from_utf8_lossy(&bytes).into_owned();
        }
    }
    text
}

/// The CLI client: `redquorum id next` processes one after another until `until`, each timed
/// at both ends by this process on `CLOCK_MONOTONIC`.
async fn cli_loop(
    redquorum: PathBuf,
    urls: Vec<String>,
    envs: Vec<(String, String)>,
    seed: u64,
    until: Instant,
) -> Vec<Call> {
    let mut out = Vec::new();
    let nodes = urls.join(",");
    let mut n = 0u64;
    while Instant::now() < until {
        n += 1;
        let count = 1 + (seed.wrapping_add(n) % 3);
        let start = monotonic_ns();
        let result = tokio::process::Command::new(&redquorum)
            .args(["--nodes", &nodes, "id", "next", "campaign", "--count"])
            .arg(count.to_string())
            .env_remove("REDQUORUM_NODES")
            .env_remove("REDQUORUM_CLUSTER")
            .envs(envs.clone())
            .output()
            .await;
        let end = monotonic_ns();
        let ids = result.ok().filter(|o| o.status.success()).and_then(|o| {
            let ids: Vec<u64> = String::from_utf8_lossy(&o.stdout)
                .lines()
                .filter_map(|l| l.trim().parse().ok())
                .collect();
            Some((*ids.first()?, *ids.last()?)).filter(|(a, b)| b - a + 1 == ids.len() as u64)
        });
        out.push(Call {
            who: format!("cli (process {n})"),
            start,
            end,
            ids,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_killed_http_holders_open_tenure_is_ended_at_the_kill() {
        let dir = std::env::temp_dir().join(format!("rq-campaign-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a directory");
        let path = dir.join("h.rec");
        // Released, then acquired again and killed mid-write.
        let text =
            "acq\t10\t20\t7\t900\nrel\t30\t7\nacq\t40\t50\t8\t950\nw\t60\t70\t8\t1\t950\nw\t8";
        std::fs::write(&path, text).expect("written");
        end_open_tenure(&path, 80).expect("ended");
        let mut h = history::LeaseHistory::default();
        let ended = std::fs::read_to_string(&path).expect("read");
        history::parse_leases("h", &ended, &mut h).expect("parses");
        assert_eq!(
            h.tenures,
            vec![("h".into(), 7, 20, 30), ("h".into(), 8, 50, 80)],
            "{ended:?}"
        );
        // Nothing open: nothing added.
        end_open_tenure(&path, 90).expect("ended");
        assert_eq!(std::fs::read_to_string(&path).expect("read"), ended);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
