//! `--etcd`: a static three-member etcd cluster on loopback (Debian's `etcd`, 3.4, default
//! durability: the WAL is fsynced before a write is acknowledged), and the ID call through its
//! JSON gateway: `POST /v3/kv/put` on one key, the reply header's revision as the ID (what
//! `scripts/bench.sh etcd` measures through gRPC). Dropping [`Etcd`] kills the members.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The running members and their data directory.
pub struct Etcd {
    children: Vec<Child>,
    /// Every member's client URL.
    pub endpoints: Vec<String>,
    _dir: tempfile::TempDir,
}

impl Drop for Etcd {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Free loopback ports (bound, then released).
fn free_ports(n: usize) -> Vec<u16> {
    let held: Vec<TcpListener> = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0").expect("a free port"))
        .collect();
    held.iter()
        .map(|l| l.local_addr().expect("its address").port())
        .collect()
}

/// Start three members and wait (up to 30 s) until a put through the gateway succeeds.
pub async fn start(http: &reqwest::Client) -> Etcd {
    let dir = tempfile::tempdir().expect("a directory for etcd");
    let ports = free_ports(6);
    let peer = |i: usize| format!("http://127.0.0.1:{}", ports[2 * i + 1]);
    let cluster = (0..3)
        .map(|i| format!("m{i}={}", peer(i)))
        .collect::<Vec<_>>()
        .join(",");
    let mut etcd = Etcd {
        children: Vec::new(),
        endpoints: Vec::new(),
        _dir: dir,
    };
    for i in 0..3 {
        let client = format!("http://127.0.0.1:{}", ports[2 * i]);
        let child = Command::new("etcd")
            .args(["--name", &format!("m{i}")])
            .arg("--data-dir")
            .arg(etcd._dir.path().join(format!("m{i}")))
            .args(["--listen-client-urls", &client])
            .args(["--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer(i)])
            .args(["--initial-advertise-peer-urls", &peer(i)])
            .args(["--initial-cluster", &cluster])
            .args(["--initial-cluster-state", "new"])
            .args(["--logger", "zap", "--log-outputs", "stderr"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start etcd (scripts/bench.sh serve --etcd installs Debian's etcd-server)");
        etcd.children.push(child);
        etcd.endpoints.push(client);
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while put(http, &etcd.endpoints[0]).await.is_err() {
        assert!(
            Instant::now() < deadline,
            "etcd did not answer a put within 30 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    etcd
}

/// One put of the key `bench-id` through the JSON gateway at `endpoint`: its revision.
pub async fn put(http: &reqwest::Client, endpoint: &str) -> Result<u64, String> {
    // {"key": base64("bench-id"), "value": base64("x")}
    let body = r#"{"key":"YmVuY2gtaWQ=","value":"eA=="}"#;
    let r = http
        .post(format!("{endpoint}/v3/kv/put"))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .map_err(|e| e.to_string())?;
    if r.status() != 200 {
        return Err(format!("status {}", r.status()));
    }
    let v: serde_json::Value = r.json().await.map_err(|e| e.to_string())?;
    v["header"]["revision"]
        .as_str()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("no revision in {v}"))
}

/// The first line of `etcd --version`.
pub fn version() -> String {
    std::process::Command::new("etcd")
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.lines().next().map(str::to_string))
        .unwrap_or_else(|| "etcd (version unknown)".into())
}
