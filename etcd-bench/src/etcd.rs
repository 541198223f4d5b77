//! A static three-member etcd cluster on loopback: Debian's `etcd` binary (package
//! `etcd-server`, 3.4), one process per member, each with its data directory in one temporary
//! directory, and default durability (the WAL is fsynced before a write is acknowledged).
//! Dropping [`EtcdCluster`] kills every member (also when the benchmark panics) and deletes
//! the directory.

use std::fs::File;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use etcd_client::{Client, ConnectOptions};

/// The server program, looked up on `PATH` (`scripts/bench.sh etcd` installs it).
const PROGRAM: &str = "etcd";
/// How long the members may take to elect a leader and answer.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// One member process and where it listens.
struct Member {
    name: String,
    client_port: u16,
    child: Option<Child>,
    log: PathBuf,
}

/// The running members and their directory; see the module docs.
pub struct EtcdCluster {
    // Dropped first (see `Drop`): the processes die before their directory is deleted.
    members: Vec<Member>,
    dir: tempfile::TempDir,
}

impl EtcdCluster {
    /// Start `n` members as one static cluster (`--initial-cluster`), each on its own free
    /// client and peer port of 127.0.0.1. Returns at once; see [`wait_healthy`](Self::wait_healthy).
    pub fn start(n: usize) -> EtcdCluster {
        let dir = tempfile::Builder::new()
            .prefix("redquorum-etcd-bench")
            .tempdir()
            .expect("create the etcd cluster's temporary directory");
        let ports = free_ports(2 * n);
        let peer_url = |i: usize| format!("http://127.0.0.1:{}", ports[2 * i + 1]);
        let initial_cluster = (0..n)
            .map(|i| format!("m{i}={}", peer_url(i)))
            .collect::<Vec<_>>()
            .join(",");
        // Built member by member: a member that fails to spawn leaves the others in `members`,
        // and dropping the half-built cluster kills them.
        let mut cluster = EtcdCluster {
            members: Vec::new(),
            dir,
        };
        let token = format!("redquorum-bench-{}", std::process::id());
        for i in 0..n {
            let name = format!("m{i}");
            let client_url = format!("http://127.0.0.1:{}", ports[2 * i]);
            let log = cluster.dir.path().join(format!("{name}.log"));
            let log_file = File::create(&log).expect("create an etcd member's log file");
            let child = Command::new(PROGRAM)
                .arg("--name")
                .arg(&name)
                .arg("--data-dir")
                .arg(cluster.dir.path().join(&name))
                .args(["--listen-client-urls", &client_url])
                .args(["--advertise-client-urls", &client_url])
                .args(["--listen-peer-urls", &peer_url(i)])
                .args(["--initial-advertise-peer-urls", &peer_url(i)])
                .args(["--initial-cluster", &initial_cluster])
                .args(["--initial-cluster-state", "new"])
                .args(["--initial-cluster-token", &token])
                .args(["--logger", "zap", "--log-outputs", "stderr"])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(log_file)
                .spawn()
                .unwrap_or_else(|e| {
                    panic!(
                        "cannot start `{PROGRAM}` ({e}): install Debian's etcd-server \
                         (scripts/bench.sh etcd does)"
                    )
                });
            cluster.members.push(Member {
                name,
                client_port: ports[2 * i],
                child: Some(child),
                log,
            });
        }
        cluster
    }

    /// "http://127.0.0.1:PORT" of every member's client URL.
    pub fn endpoints(&self) -> Vec<String> {
        self.members
            .iter()
            .map(|m| format!("http://127.0.0.1:{}", m.client_port))
            .collect()
    }

    /// The temporary directory holding every member's data directory.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Wait until every member answers a status request naming a leader, and a put through
    /// the whole cluster succeeds. Panics (with the members' last log lines) after
    /// [`READY_TIMEOUT`] or when a member exits.
    pub async fn wait_healthy(&mut self) {
        let deadline = Instant::now() + READY_TIMEOUT;
        let options = ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(1))
            .with_timeout(Duration::from_secs(2));
        loop {
            self.check_running();
            let mut ready = true;
            for ep in self.endpoints() {
                let status = async {
                    let mut c = Client::connect([ep.as_str()], Some(options.clone())).await?;
                    c.status().await
                }
                .await;
                ready &= matches!(status, Ok(s) if s.leader() != 0);
            }
            if ready {
                let put = async {
                    let mut c = Client::connect(self.endpoints(), Some(options.clone())).await?;
                    c.put("redquorum-bench/ready", "1", None).await
                }
                .await;
                if put.is_ok() {
                    return;
                }
            }
            if Instant::now() > deadline {
                panic!(
                    "the etcd cluster did not become healthy within {READY_TIMEOUT:?}\n{}",
                    self.log_tails()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Panic with the logs when a member's process has exited.
    fn check_running(&mut self) {
        let mut exited = Vec::new();
        for m in &mut self.members {
            if let Some(child) = m.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    exited.push(format!("{} ({status})", m.name));
                }
            }
        }
        if !exited.is_empty() {
            panic!(
                "etcd member(s) exited: {}\n{}",
                exited.join(", "),
                self.log_tails()
            );
        }
    }

    /// The last lines of every member's log.
    fn log_tails(&self) -> String {
        self.members
            .iter()
            .map(|m| {
                let log = std::fs::read_to_string(&m.log).unwrap_or_default();
                let lines: Vec<&str> = log.lines().collect();
                let tail = lines[lines.len().saturating_sub(15)..].join("\n");
                format!("--- {} ({}) ---\n{tail}", m.name, m.log.display())
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for m in &mut self.members {
            if let Some(mut c) = m.child.take() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
}

/// The first line of `etcd --version` ("etcd Version: 3.4.23" gives "3.4.23").
pub fn version() -> String {
    let out = Command::new(PROGRAM)
        .arg("--version")
        .output()
        .unwrap_or_else(|e| panic!("cannot run `{PROGRAM} --version` ({e})"));
    let text = String::from_utf8_lossy(&out.stdout);
    let first = text.lines().next().unwrap_or("").trim();
    first
        .strip_prefix("etcd Version:")
        .unwrap_or(first)
        .trim()
        .to_string()
}

/// `count` distinct free ports of 127.0.0.1 (all bound at once, then released).
fn free_ports(count: usize) -> Vec<u16> {
    let listeners: Vec<TcpListener> = (0..count)
        .map(|_| TcpListener::bind("127.0.0.1:0").expect("bind a free port on 127.0.0.1"))
        .collect();
    listeners
        .iter()
        .map(|l| l.local_addr().expect("a bound listener's address").port())
        .collect()
}
