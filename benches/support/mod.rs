//! Shared by the benchmarks: local redis-server processes and a timed concurrent loop.
#![allow(dead_code, clippy::expect_used, unreachable_pub)]

use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Local redis-server processes, removed on drop.
pub struct LocalNodes {
    children: Vec<Child>,
    pub ports: Vec<u16>,
    _dirs: Vec<tempfile::TempDir>,
}

impl LocalNodes {
    pub fn start(n: usize) -> LocalNodes {
        let mut children = Vec::new();
        let mut ports = Vec::new();
        let mut dirs = Vec::new();
        for _ in 0..n {
            let port = std::net::TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .map(|a| a.port())
                .expect("a free port");
            let dir = tempfile::tempdir().expect("temp dir");
            let child = Command::new("redis-server")
                .args([
                    "--port",
                    &port.to_string(),
                    "--bind",
                    "127.0.0.1",
                    "--appendonly",
                    "yes",
                    "--appendfsync",
                    "always",
                ])
                .args(["--maxmemory-policy", "noeviction", "--save", "", "--dir"])
                .arg(dir.path())
                .stdout(Stdio::null())
                .spawn()
                .expect("redis-server is installed (scripts/bench.sh installs it)");
            children.push(child);
            ports.push(port);
            dirs.push(dir);
        }
        for port in &ports {
            let deadline = Instant::now() + Duration::from_secs(10);
            while std::net::TcpStream::connect(("127.0.0.1", *port)).is_err() {
                assert!(
                    Instant::now() < deadline,
                    "redis-server on {port} did not start"
                );
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        LocalNodes {
            children,
            ports,
            _dirs: dirs,
        }
    }

    pub fn urls(&self) -> Vec<String> {
        self.ports
            .iter()
            .map(|p| format!("redis://127.0.0.1:{p}"))
            .collect()
    }
}

impl Drop for LocalNodes {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

#[derive(Clone, Copy, Debug)]
pub struct Figures {
    pub ids_per_s: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub failures: u64,
}

/// Run `callers` concurrent loops of `call` for `dur`; each call returns how many IDs it got.
pub async fn measure<F, Fut>(callers: usize, dur: Duration, call: F) -> Figures
where
    F: Fn() -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = Result<u64, String>> + Send,
{
    let stop = Arc::new(AtomicBool::new(false));
    let ids = Arc::new(AtomicU64::new(0));
    let failures = Arc::new(AtomicU64::new(0));
    let lat = Arc::new(Mutex::new(Vec::new()));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..callers {
        let (stop, ids, failures, lat, call) = (
            stop.clone(),
            ids.clone(),
            failures.clone(),
            lat.clone(),
            call.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let mut mine = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let t0 = Instant::now();
                match call().await {
                    Ok(n) => {
                        ids.fetch_add(n, Ordering::Relaxed);
                        mine.push(t0.elapsed());
                    }
                    Err(_) => {
                        failures.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            lat.lock().expect("latencies").extend(mine);
        }));
    }
    tokio::time::sleep(dur).await;
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        let _ = t.await;
    }
    let elapsed = start.elapsed().as_secs_f64();
    let mut l = lat.lock().expect("latencies").clone();
    l.sort();
    let pct = |p: f64| {
        l.get(((l.len().saturating_sub(1)) as f64 * p) as usize)
            .map(|d| d.as_secs_f64() * 1e3)
            .unwrap_or(f64::NAN)
    };
    Figures {
        ids_per_s: ids.load(Ordering::Relaxed) as f64 / elapsed,
        p50_ms: pct(0.5),
        p99_ms: pct(0.99),
        failures: failures.load(Ordering::Relaxed),
    }
}

impl LocalNodes {
    /// Freeze (SIGSTOP) or thaw (SIGCONT) node `i`.
    pub fn signal(&self, i: usize, sig: &str) {
        let pid = self.children[i].id().to_string();
        let _ = Command::new("kill").args([sig, &pid]).status();
    }
}
