//! The local-process node backend: plain server processes on this machine (`redis-server`, or
//! the program env `REDQUORUM_TEST_SERVER` names, see [`server_program`](crate::server_program)),
//! started with the same [`SAFE_ARGS`](crate::SAFE_ARGS) as the container nodes.

use std::fs::File;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::clock::ClockDir;
use crate::ports::pick_host_port;
use crate::SAFE_ARGS;

/// How long a process may take to answer PING after it was spawned.
const READY_TIMEOUT: Duration = Duration::from_secs(10);
/// Poll interval while waiting for readiness.
const READY_POLL: Duration = Duration::from_millis(20);
/// Attempts at starting one node when its process exits at start-up (its port was taken).
const START_ATTEMPTS: usize = 5;
/// The server's log (its stdout) inside the node's directory (same name under Valkey).
const LOG_NAME: &str = "redis-server.log";

/// N local server processes ([`server_program`](crate::server_program): Debian's
/// `redis-server`, looked up on `PATH`, unless env `REDQUORUM_TEST_SERVER` names another, e.g.
/// `valkey-server`; or the program [`start_with`](Self::start_with) is given), each started
/// with [`SAFE_ARGS`](crate::SAFE_ARGS), its own temporary directory (`--dir`, the AOF
/// directory inside) and its own 127.0.0.1 port. There is
/// no fault proxy: clients reach the processes directly. Faults: [`freeze`](Self::freeze) and
/// [`thaw`](Self::thaw) (SIGSTOP, SIGCONT), [`kill`](Self::kill) (SIGKILL) and
/// [`restart`](Self::restart) (same port, same data), [`wipe_and_restart`](Self::wipe_and_restart)
/// (data lost), and with [`start_with_clocks`](Self::start_with_clocks) wall-clock steps
/// ([`step_clock_ms`](Self::step_clock_ms), the `LD_PRELOAD` shim of [`clock`](crate::clock)).
///
/// Dropping it kills every process (SIGKILL, a frozen one too), reaps it and deletes its
/// directory.
///
/// ```no_run
/// use redquorum_testkit::LocalNodes;
///
/// let nodes = LocalNodes::start(3);
/// let urls = nodes.urls(); // "redis://127.0.0.1:PORT", straight to each process
/// nodes.freeze(2); // SIGSTOP
/// nodes.thaw(2); // SIGCONT
/// nodes.kill(1); // SIGKILL, data kept
/// nodes.restart(1); // same port, same AOF
/// ```
#[derive(Debug)]
pub struct LocalNodes {
    nodes: Vec<LocalNode>,
}

/// One process and its directory.
#[derive(Debug)]
struct LocalNode {
    index: usize,
    // Drop kills the child first (see `Drop`), then the directory is deleted.
    child: Mutex<Option<Child>>,
    port: u16,
    dir: tempfile::TempDir,
    clock: Option<ClockDir>,
    /// The server program it runs (a restart runs the same).
    program: String,
}

impl Drop for LocalNode {
    fn drop(&mut self) {
        let child = self.child.get_mut().unwrap_or_else(|p| p.into_inner());
        if let Some(mut c) = child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl LocalNode {
    fn child(&self) -> MutexGuard<'_, Option<Child>> {
        self.child.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl LocalNodes {
    /// Starts `n` nodes and waits until each answers PING. Blocks the calling thread (at most
    /// [`READY_TIMEOUT`] per node). Panics with the reason (and the server's last log lines)
    /// when the server program is not found or a node does not come up.
    pub fn start(n: usize) -> LocalNodes {
        LocalNodes::start_with(n, &crate::server_program())
    }

    /// As [`start`](Self::start), running `program` (a name looked up on `PATH` or a path,
    /// e.g. `valkey-server`) whatever env [`SERVER_ENV`](crate::SERVER_ENV) says: for a run
    /// against two servers side by side, without changing the environment of a process whose
    /// other threads may read it.
    pub fn start_with(n: usize, program: &str) -> LocalNodes {
        LocalNodes {
            nodes: (0..n).map(|i| start_node(i, None, program)).collect(),
        }
    }

    /// As [`start`](Self::start), each process under its own wall clock (the `LD_PRELOAD`
    /// shim; needs `cc` once to build it), so [`step_clock_ms`](Self::step_clock_ms) works.
    pub fn start_with_clocks(n: usize) -> LocalNodes {
        let program = crate::server_program();
        LocalNodes {
            nodes: (0..n)
                .map(|i| start_node(i, Some(ClockDir::new()), &program))
                .collect(),
        }
    }

    /// The server program the nodes run.
    pub fn program(&self) -> &str {
        self.nodes.first().map_or("", |n| n.program.as_str())
    }

    /// "redis://127.0.0.1:PORT" of every node, in index order.
    pub fn urls(&self) -> Vec<String> {
        (0..self.len()).map(|i| self.url(i)).collect()
    }

    /// "redis://127.0.0.1:PORT" of node `i`.
    pub fn url(&self, i: usize) -> String {
        format!("redis://{}", self.addr(i))
    }

    /// "127.0.0.1:PORT" of node `i`.
    pub fn addr(&self, i: usize) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port(i)))
    }

    /// The 127.0.0.1 port of every node, in index order.
    pub fn ports(&self) -> Vec<u16> {
        self.nodes.iter().map(|n| n.port).collect()
    }

    /// The 127.0.0.1 port of node `i`.
    pub fn port(&self, i: usize) -> u16 {
        self.node(i).port
    }

    /// The process id of node `i`. Panics when it is killed.
    pub fn pid(&self, i: usize) -> u32 {
        self.node(i)
            .child()
            .as_ref()
            .map(Child::id)
            .unwrap_or_else(|| panic!("local node {i} is not running (killed)"))
    }

    /// Whether node `i`'s process runs (it may be frozen).
    pub fn is_running(&self, i: usize) -> bool {
        self.node(i).child().is_some()
    }

    /// Kill node `i` (SIGKILL, a frozen one too) and reap it; its data stays. No-op when it is
    /// not running.
    pub fn kill(&self, i: usize) {
        if let Some(mut c) = self.node(i).child().take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Start node `i` again on its port with its data (its AOF), and wait until it answers.
    /// Kills it first when it runs. Panics when it does not come up (its port taken meanwhile).
    pub fn restart(&self, i: usize) {
        self.kill(i);
        let node = self.node(i);
        let child = spawn(node, node.port)
            .unwrap_or_else(|e| panic!("local node {i}: restart failed: {e}"));
        *node.child() = Some(child);
    }

    /// FLUSHALL on node `i` without a restart: every key is gone (marker included), the run_id
    /// stays. Returns false when the node did not take it (not running, or frozen past 2 s).
    pub fn flushall(&self, i: usize) -> bool {
        let Ok(client) = redis::Client::open(self.url(i)) else {
            return false;
        };
        let Ok(mut con) = client.get_connection_with_timeout(std::time::Duration::from_secs(2))
        else {
            return false;
        };
        let _ = con.set_read_timeout(Some(std::time::Duration::from_secs(2)));
        redis::cmd("FLUSHALL").query::<()>(&mut con).is_ok()
    }

    /// Kill node `i`, delete its data (AOF and snapshot) and start it again empty on its port.
    pub fn wipe_and_restart(&self, i: usize) {
        self.kill(i);
        let dir = self.node(i).dir.path();
        for entry in std::fs::read_dir(dir)
            .unwrap_or_else(|e| panic!("local node {i}: cannot list {dir:?}: {e}"))
            .flatten()
        {
            let path = entry.path();
            if path.file_name().is_some_and(|n| n == LOG_NAME) {
                continue;
            }
            let removed = if path.is_dir() {
                std::fs::remove_dir_all(&path)
            } else {
                std::fs::remove_file(&path)
            };
            removed.unwrap_or_else(|e| panic!("local node {i}: cannot delete {path:?}: {e}"));
        }
        self.restart(i);
    }

    /// Step node `i`'s wall clock by `delta_ms` (monotonic clocks untouched). Panics unless the
    /// nodes were started with [`start_with_clocks`](Self::start_with_clocks).
    pub fn step_clock_ms(&self, i: usize, delta_ms: i64) {
        self.node(i)
            .clock
            .as_ref()
            .unwrap_or_else(|| panic!("local node {i} has no clock shim: use start_with_clocks"))
            .step_ms(delta_ms);
    }

    /// Node `i`'s directory (`--dir`: the AOF directory is inside, and the server's log).
    pub fn data_dir(&self, i: usize) -> &Path {
        self.node(i).dir.path()
    }

    /// Everything node `i`'s server logged so far (useful in failure messages).
    pub fn logs(&self, i: usize) -> String {
        read_log(&self.data_dir(i).join(LOG_NAME))
    }

    /// Number of nodes.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// True for zero nodes.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Freeze node `i` (SIGSTOP): it keeps its connections but answers nothing.
    pub fn freeze(&self, i: usize) {
        self.signal(i, "-STOP");
    }

    /// Thaw node `i` (SIGCONT).
    pub fn thaw(&self, i: usize) {
        self.signal(i, "-CONT");
    }

    fn signal(&self, i: usize, signal: &str) {
        let pid = self.pid(i).to_string();
        let status = Command::new("kill")
            .args([signal, &pid])
            .status()
            .unwrap_or_else(|e| panic!("local node {i}: cannot run `kill {signal} {pid}`: {e}"));
        assert!(
            status.success(),
            "local node {i}: `kill {signal} {pid}` failed ({status})"
        );
    }

    fn node(&self, i: usize) -> &LocalNode {
        self.nodes.get(i).unwrap_or_else(|| {
            panic!(
                "LocalNodes: node {i} out of range: there are only {} nodes",
                self.nodes.len()
            )
        })
    }
}

/// The full redis-server command line (without the program name) of a node on `port` keeping
/// its data in `dir`: [`SAFE_ARGS`], then where it listens and keeps its data.
fn args(port: u16, dir: &Path) -> Vec<std::ffi::OsString> {
    SAFE_ARGS
        .iter()
        .map(Into::into)
        .chain([
            "--port".into(),
            port.to_string().into(),
            "--bind".into(),
            "127.0.0.1".into(),
            "--dir".into(),
            dir.as_os_str().to_owned(),
        ])
        .collect()
}

fn start_node(index: usize, clock: Option<ClockDir>, program: &str) -> LocalNode {
    let dir = tempfile::Builder::new()
        .prefix(&format!("redquorum-local{index}-"))
        .tempdir()
        .unwrap_or_else(|e| panic!("local node {index}: cannot create a directory: {e}"));
    let mut node = LocalNode {
        index,
        child: Mutex::new(None),
        port: 0,
        dir,
        clock,
        program: program.to_string(),
    };
    let mut last_error = String::new();
    for _ in 0..START_ATTEMPTS {
        let port = pick_host_port();
        match spawn(&node, port) {
            Ok(child) => {
                node.port = port;
                *node.child.get_mut().unwrap_or_else(|p| p.into_inner()) = Some(child);
                return node;
            }
            Err(e) => {
                last_error = e;
                tracing::debug!(node = index, port, error = %last_error, "local node failed to start, retrying");
            }
        }
    }
    panic!(
        "local node {index}: {program} did not start after {START_ATTEMPTS} attempts: {last_error}"
    );
}

/// Spawn `node`'s process on `port` with its data in its directory (and its wall clock), and
/// wait until it answers; the reason and its last log lines when it does not.
fn spawn(node: &LocalNode, port: u16) -> Result<Child, String> {
    let (index, dir, program) = (node.index, node.dir.path(), &node.program);
    let log_path = dir.join(LOG_NAME);
    let log = File::options()
        .create(true)
        .append(true)
        .open(&log_path)
        .map_err(|e| format!("local node {index}: cannot open {log_path:?}: {e}"))?;
    let mut command = Command::new(program);
    command
        .args(args(port, dir))
        .stdin(Stdio::null())
        .stdout(log);
    if let Some(clock) = &node.clock {
        command.envs(clock.envs());
    }
    let mut child = command.spawn().map_err(|e| {
        format!(
            "local node {index}: cannot spawn {program} ({e}): it must be on PATH or a path \
             (scripts/bench.sh installs Debian's redis-server, scripts/install-valkey.sh \
             valkey-server; env {} chooses)",
            crate::SERVER_ENV
        )
    })?;
    match wait_ready(&mut child, port) {
        Ok(()) => Ok(child),
        Err(e) => {
            let _ = child.kill();
            let _ = child.wait();
            Err(format!(
                "{e}; last log lines:\n{}",
                tail(&read_log(&log_path))
            ))
        }
    }
}

/// Polls PING until the process answers PONG; an error when it exits or after [`READY_TIMEOUT`].
fn wait_ready(child: &mut Child, port: u16) -> Result<(), String> {
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        let last = match ping(port) {
            Ok(()) => return Ok(()),
            Err(e) => e,
        };
        match child.try_wait() {
            Ok(Some(status)) => return Err(format!("it exited at start-up ({status})")),
            Ok(None) => {}
            Err(e) => return Err(format!("cannot check on it: {e}")),
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "no PONG on 127.0.0.1:{port} within {}s (last PING: {last})",
                READY_TIMEOUT.as_secs()
            ));
        }
        std::thread::sleep(READY_POLL);
    }
}

/// One PING over a fresh connection.
fn ping(port: u16) -> Result<(), String> {
    let timeout = Duration::from_secs(1);
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let mut con = TcpStream::connect_timeout(&addr, timeout).map_err(|e| e.to_string())?;
    con.set_read_timeout(Some(timeout))
        .and_then(|()| con.set_write_timeout(Some(timeout)))
        .and_then(|()| con.write_all(b"PING\r\n"))
        .map_err(|e| e.to_string())?;
    let mut reply = [0u8; 64];
    let n = con.read(&mut reply).map_err(|e| e.to_string())?;
    let reply = String::from_utf8_lossy(&reply[..n]);
    if reply.starts_with("+PONG") {
        Ok(())
    } else {
        Err(format!("PING answered {:?}", reply.trim_end()))
    }
}

fn read_log(path: &Path) -> String {
    match std::fs::read(path) {
        Ok(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
        Err(e) => format!("<cannot read {path:?}: {e}>"),
    }
}

/// The last 20 lines.
fn tail(log: &str) -> String {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    #[test]
    fn local_nodes_start_with_the_safe_flags_then_their_own_address_and_directory() {
        let a = args(21_000, Path::new("/tmp/x"));
        assert_eq!(&a[..SAFE_ARGS.len()], SAFE_ARGS);
        assert_eq!(
            &a[SAFE_ARGS.len()..],
            ["--port", "21000", "--bind", "127.0.0.1", "--dir", "/tmp/x"]
        );
    }

    /// Sends one command (inline) and returns the raw reply.
    fn command(port: u16, line: &str) -> String {
        let mut con = TcpStream::connect(("127.0.0.1", port)).expect("connects");
        con.set_read_timeout(Some(Duration::from_secs(2)))
            .expect("timeout");
        con.write_all(format!("{line}\r\n").as_bytes())
            .expect("writes");
        let mut reply = [0u8; 256];
        let n = con.read(&mut reply).unwrap_or(0);
        String::from_utf8_lossy(&reply[..n]).into_owned()
    }

    #[test]
    fn local_nodes_run_safe_answer_and_freeze_and_are_gone_after_drop() {
        let nodes = LocalNodes::start(2);
        assert_eq!(nodes.len(), 2);
        assert_ne!(nodes.port(0), nodes.port(1));
        assert_eq!(
            nodes.urls(),
            nodes
                .ports()
                .iter()
                .map(|p| format!("redis://127.0.0.1:{p}"))
                .collect::<Vec<_>>()
        );
        let port = nodes.port(0);
        assert!(
            command(port, "CONFIG GET appendfsync").contains("always"),
            "the local node runs with appendfsync always"
        );
        assert!(command(port, "CONFIG GET maxmemory-policy").contains("noeviction"));
        assert!(command(port, "SET k v").starts_with("+OK"));
        assert!(
            nodes.data_dir(0).join("appendonlydir").is_dir(),
            "the AOF lives in the node's directory"
        );
        assert!(nodes.logs(0).contains("Ready to accept connections"));

        nodes.freeze(1);
        assert!(
            ping(nodes.port(1)).is_err(),
            "a frozen node answers nothing"
        );
        nodes.thaw(1);
        ping(nodes.port(1)).expect("a thawed node answers again");

        let dirs: Vec<PathBuf> = (0..2).map(|i| nodes.data_dir(i).to_path_buf()).collect();
        nodes.freeze(0);
        drop(nodes);
        for dir in dirs {
            assert!(!dir.exists(), "{dir:?} outlived its node");
        }
        assert!(
            ping(port).is_err(),
            "the (frozen) process is gone after drop"
        );
    }

    #[test]
    fn start_with_runs_the_program_it_is_given_and_a_restart_runs_it_again() {
        let nodes = LocalNodes::start_with(1, crate::DEFAULT_SERVER);
        assert_eq!(nodes.program(), crate::DEFAULT_SERVER);
        nodes.restart(0);
        assert!(command(nodes.port(0), "PING").starts_with("+PONG"));
        let missing = "/nonexistent/redquorum-test-server";
        let failed = std::panic::catch_unwind(|| LocalNodes::start_with(1, missing))
            .expect_err("no such program");
        let why = failed.downcast_ref::<String>().cloned().unwrap_or_default();
        assert!(why.contains(missing), "the program it ran is named: {why}");
    }

    #[test]
    fn a_killed_node_restarts_with_its_data_a_wiped_one_without_and_clocks_step_per_node() {
        let nodes = LocalNodes::start_with_clocks(2);
        let port = nodes.port(0);
        assert!(command(port, "SET k v").starts_with("+OK"));
        nodes.kill(0);
        assert!(!nodes.is_running(0) && ping(port).is_err(), "killed");
        nodes.restart(0);
        assert_eq!(nodes.port(0), port, "same port");
        assert!(
            command(port, "GET k").contains("v"),
            "a restart keeps the AOF's data"
        );
        nodes.wipe_and_restart(0);
        assert!(
            command(port, "GET k").starts_with("$-1"),
            "a wiped node comes back empty"
        );
        let seconds = |i: usize| -> i64 {
            let reply = command(nodes.port(i), "TIME");
            reply
                .lines()
                .nth(2)
                .and_then(|l| l.trim().parse().ok())
                .unwrap_or_else(|| panic!("TIME reply {reply:?}"))
        };
        nodes.step_clock_ms(1, 3_600_000);
        let skew = seconds(1) - seconds(0);
        assert!(
            (3_590..=3_610).contains(&skew),
            "node 1's wall clock is an hour ahead of node 0's: {skew} s"
        );
    }
}
