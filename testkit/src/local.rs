//! The local-process node backend: plain `redis-server` processes on this machine, started with
//! the same [`SAFE_ARGS`](crate::SAFE_ARGS) as the container nodes.

use std::fs::File;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::node::pick_host_port;
use crate::SAFE_ARGS;

/// The server program, looked up on `PATH` (Debian's `redis-server`; `scripts/bench.sh` and
/// `scripts/test.sh` install it).
const PROGRAM: &str = "redis-server";
/// How long a process may take to answer PING after it was spawned.
const READY_TIMEOUT: Duration = Duration::from_secs(10);
/// Poll interval while waiting for readiness.
const READY_POLL: Duration = Duration::from_millis(20);
/// Attempts at starting one node when its process exits at start-up (its port was taken).
const START_ATTEMPTS: usize = 5;
/// The server's log (its stdout) inside the node's directory.
const LOG_NAME: &str = "redis-server.log";

/// N local `redis-server` processes, each started with [`SAFE_ARGS`](crate::SAFE_ARGS), its own
/// temporary directory (`--dir`, the AOF directory inside) and its own 127.0.0.1 port. There is
/// no fault proxy: clients reach the processes directly. Faults: [`freeze`](Self::freeze) and
/// [`thaw`](Self::thaw) (SIGSTOP, SIGCONT).
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
/// ```
#[derive(Debug)]
pub struct LocalNodes {
    nodes: Vec<LocalNode>,
}

/// One process and its directory.
#[derive(Debug)]
struct LocalNode {
    // Drop kills the child first (see `Drop`), then the directory is deleted.
    child: Child,
    port: u16,
    dir: tempfile::TempDir,
}

impl Drop for LocalNode {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl LocalNodes {
    /// Starts `n` nodes and waits until each answers PING. Blocks the calling thread (at most
    /// [`READY_TIMEOUT`] per node). Panics with the reason (and the server's last log lines)
    /// when `redis-server` is not on `PATH` or a node does not come up.
    pub fn start(n: usize) -> LocalNodes {
        LocalNodes {
            nodes: (0..n).map(start_node).collect(),
        }
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

    /// The process id of node `i`.
    pub fn pid(&self, i: usize) -> u32 {
        self.node(i).child.id()
    }

    /// Node `i`'s directory (`--dir`: the AOF directory is inside, and the server's log).
    pub fn data_dir(&self, i: usize) -> &Path {
        self.node(i).dir.path()
    }

    /// Everything node `i`'s redis-server logged so far (useful in failure messages).
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

fn start_node(index: usize) -> LocalNode {
    let dir = tempfile::Builder::new()
        .prefix(&format!("redquorum-local{index}-"))
        .tempdir()
        .unwrap_or_else(|e| panic!("local node {index}: cannot create a directory: {e}"));
    let log_path = dir.path().join(LOG_NAME);
    let mut last_error = String::new();
    for _ in 0..START_ATTEMPTS {
        let port = pick_host_port();
        let log = File::create(&log_path)
            .unwrap_or_else(|e| panic!("local node {index}: cannot create {log_path:?}: {e}"));
        let mut child = Command::new(PROGRAM)
            .args(args(port, dir.path()))
            .stdin(Stdio::null())
            .stdout(log)
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "local node {index}: cannot spawn {PROGRAM} ({e}): it must be on PATH \
                     (scripts/bench.sh installs Debian's redis-server)"
                )
            });
        match wait_ready(&mut child, port) {
            Ok(()) => return LocalNode { child, port, dir },
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                last_error = format!("{e}; last log lines:\n{}", tail(&read_log(&log_path)));
                tracing::debug!(node = index, port, error = %last_error, "local node failed to start, retrying");
            }
        }
    }
    panic!(
        "local node {index}: {PROGRAM} did not start after {START_ATTEMPTS} attempts: {last_error}"
    );
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
}
