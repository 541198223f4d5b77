//! Bad input through the real `redquorum` binary: one table of rejected command lines, each
//! checked for its exit code, for a message that names the setting at fault, and for
//! failing closed (no node's keyspace changes while the whole table runs).
//!
//! Every row runs even when an earlier one fails; the test then fails with the list of
//! failing rows, each with its command line, exit code and full output.

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use redquorum_testkit::secure::{Pki, TlsNode};
use redquorum_testkit::LocalNodes;
use tokio::io::AsyncWriteExt;

const BIN: &str = env!("CARGO_BIN_EXE_redquorum");

/// Every variable the binary reads; removed from each row's environment before its own are set.
const ENV_VARS: &[&str] = &[
    "REDQUORUM_NODES",
    "REDQUORUM_CLUSTER",
    "REDQUORUM_CACERT",
    "REDQUORUM_CERT",
    "REDQUORUM_KEY",
    "REDQUORUM_SNI",
    "REDQUORUM_LOG",
];

/// The longest a row's process may run (the slowest rows wait for unreachable nodes).
const ROW_TIMEOUT: Duration = Duration::from_secs(20);

/// The expected exit status.
#[derive(Clone, Copy, Debug)]
enum Exit {
    /// Exactly this code.
    Code(i32),
    /// Any code but 0 (the library decides: its error paths exit 2, `check` exits 1).
    Failure,
}

/// One bad input.
#[derive(Clone, Debug)]
struct Row {
    label: String,
    args: Vec<String>,
    env: Vec<(String, String)>,
    stdin: Option<Vec<u8>>,
    exit: Exit,
    /// Substrings the output (stdout and stderr) must hold.
    expect: Vec<String>,
    /// Substrings it must not hold (passwords).
    absent: Vec<String>,
    /// Pairs of substrings that must both be on one line of the output (a node and what is
    /// wrong with it).
    together: Vec<(String, String)>,
}

fn row(label: &str, exit: Exit, args: &[&str], expect: &[&str]) -> Row {
    Row {
        label: label.into(),
        args: args.iter().map(|a| a.to_string()).collect(),
        env: Vec::new(),
        stdin: None,
        exit,
        expect: expect.iter().map(|e| e.to_string()).collect(),
        absent: Vec::new(),
        together: Vec::new(),
    }
}

/// A usage or configuration error: exit 2.
fn usage(label: &str, args: &[&str], expect: &[&str]) -> Row {
    row(label, Exit::Code(2), args, expect)
}

impl Row {
    fn env(mut self, key: &str, value: impl AsRef<str>) -> Row {
        self.env.push((key.into(), value.as_ref().into()));
        self
    }

    fn absent(mut self, text: &str) -> Row {
        self.absent.push(text.into());
        self
    }

    fn on_one_line(mut self, a: impl Into<String>, b: impl Into<String>) -> Row {
        self.together.push((a.into(), b.into()));
        self
    }

    fn stdin(mut self, bytes: &[u8]) -> Row {
        self.stdin = Some(bytes.to_vec());
        self
    }

    /// The command line, long arguments shortened.
    fn command_line(&self) -> String {
        let mut line = String::new();
        for (k, v) in &self.env {
            line.push_str(&format!("{k}={} ", shorten(v)));
        }
        line.push_str("redquorum");
        for a in &self.args {
            line.push(' ');
            line.push_str(&shorten(a));
        }
        line
    }

    /// Run the row; `Err` with the reason and everything seen when it does not hold.
    async fn check(&self) -> Result<(), String> {
        let mut command = tokio::process::Command::new(BIN);
        command
            .args(&self.args)
            .stdin(if self.stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        for var in ENV_VARS {
            command.env_remove(var);
        }
        for (k, v) in &self.env {
            command.env(k, v);
        }
        let mut child = command.spawn().map_err(|e| format!("cannot spawn: {e}"))?;
        if let (Some(bytes), Some(mut stdin)) = (&self.stdin, child.stdin.take()) {
            stdin
                .write_all(bytes)
                .await
                .map_err(|e| format!("cannot write stdin: {e}"))?;
        }
        let out = tokio::time::timeout(ROW_TIMEOUT, child.wait_with_output())
            .await
            .map_err(|_| format!("still running after {ROW_TIMEOUT:?} (killed)"))?
            .map_err(|e| format!("cannot wait: {e}"))?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        let mut problems = Vec::new();
        let code = out.status.code();
        match (self.exit, code) {
            (_, None) => problems.push(format!("killed by a signal ({:?})", out.status)),
            (Exit::Code(want), Some(got)) if want != got => {
                problems.push(format!("exit code {got}, expected {want}"))
            }
            (Exit::Failure, Some(0)) => problems.push("exit code 0 on bad input".into()),
            _ => {}
        }
        let all = format!("{stdout}{stderr}");
        for e in &self.expect {
            if !all.contains(e.as_str()) {
                problems.push(format!("output lacks {e:?}"));
            }
        }
        for (a, b) in &self.together {
            if !all
                .lines()
                .any(|l| l.contains(a.as_str()) && l.contains(b.as_str()))
            {
                problems.push(format!("no line holds both {a:?} and {b:?}"));
            }
        }
        for a in &self.absent {
            if all.contains(a.as_str()) {
                problems.push(format!("output shows {a:?}, which must not appear"));
            }
        }
        if all.contains("panicked") {
            problems.push("the binary panicked".into());
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "[{}] {}\n  command: {}\n  exit code: {code:?}\n  stdout:\n{}\n  stderr:\n{}",
                self.label,
                problems.join("; "),
                self.command_line(),
                indent(&stdout),
                indent(&stderr),
            ))
        }
    }
}

fn shorten(s: &str) -> String {
    if s.len() > 120 {
        format!("<{} bytes: {:?}...>", s.len(), &s[..40])
    } else if s.is_empty() || s.contains([' ', '"', '\'', '\n', '\t', '\x1b']) {
        format!("{s:?}")
    } else {
        s.to_string()
    }
}

fn indent(s: &str) -> String {
    s.lines()
        .map(|l| format!("    | {l}"))
        .collect::<Vec<_>>()
        .join("\n")
}

fn path(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

/// A port that answers every connection with an HTTP error and closes it: a node that is
/// not Redis.
async fn http_node() -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = listener.local_addr().expect("addr").port();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            tokio::spawn(async move {
                let _ = socket.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n").await;
                let _ = socket.shutdown().await;
            });
        }
    });
    port
}

/// A port nothing listens on (bound, then closed).
fn closed_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}

/// A node's keyspace: its DBSIZE and every `rq:*` key with its serialized value.
type Keyspace = (u64, BTreeMap<String, Vec<u8>>);

async fn keyspace(conn: &mut redis::aio::MultiplexedConnection) -> Keyspace {
    let size: u64 = redis::cmd("DBSIZE")
        .query_async(conn)
        .await
        .expect("DBSIZE");
    let mut keys: Vec<String> = Vec::new();
    let mut cursor: u64 = 0;
    loop {
        let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg("rq:*")
            .arg("COUNT")
            .arg(1000)
            .query_async(conn)
            .await
            .expect("SCAN");
        keys.extend(batch);
        cursor = next;
        if cursor == 0 {
            break;
        }
    }
    let mut values = BTreeMap::new();
    for k in keys {
        let dump: Option<Vec<u8>> = redis::cmd("DUMP")
            .arg(&k)
            .query_async(conn)
            .await
            .expect("DUMP");
        values.insert(k, dump.unwrap_or_default());
    }
    (size, values)
}

/// A connection to every plain node, as its default user.
async fn admin_connections(nodes: &LocalNodes) -> Vec<redis::aio::MultiplexedConnection> {
    let mut out = Vec::new();
    for url in nodes.urls() {
        let client = redis::Client::open(url.as_str()).expect("admin client");
        out.push(
            client
                .get_multiplexed_async_connection()
                .await
                .expect("admin connection"),
        );
    }
    out
}

/// Every admin connection's keyspace, in order.
async fn keyspaces(conns: &mut [redis::aio::MultiplexedConnection]) -> Vec<Keyspace> {
    let mut out = Vec::new();
    for c in conns.iter_mut() {
        out.push(keyspace(c).await);
    }
    out
}

/// What differs between two snapshots of the same nodes.
fn keyspace_diff(what: &str, before: &[Keyspace], after: &[Keyspace]) -> Vec<String> {
    let mut out = Vec::new();
    for (i, (b, a)) in before.iter().zip(after).enumerate() {
        if b.0 != a.0 {
            out.push(format!("{what} node {i}: DBSIZE {} -> {}", b.0, a.0));
        }
        for (k, v) in &a.1 {
            match b.1.get(k) {
                None => out.push(format!("{what} node {i}: new key {k}")),
                Some(old) if old != v => out.push(format!("{what} node {i}: key {k} changed")),
                _ => {}
            }
        }
        for k in b.1.keys() {
            if !a.1.contains_key(k) {
                out.push(format!("{what} node {i}: key {k} deleted"));
            }
        }
    }
    out
}

/// Files and nodes the rows refer to.
struct Fixtures<'a> {
    /// Comma-separated URLs of three healthy plain nodes.
    live: String,
    /// The first of them.
    live0: String,
    pki: &'a Pki,
    /// An empty file.
    empty_file: String,
    /// A file that is not UTF-8.
    binary_file: String,
}

/// The table. Rows that name `fx.live` reach (or would reach) the healthy nodes, whose
/// keyspaces must stay as they were.
fn table(fx: &Fixtures<'_>) -> Vec<Row> {
    let live = fx.live.as_str();
    let live0 = fx.live0.as_str();
    let ca = path(&fx.pki.ca);
    let crt = path(&fx.pki.client.cert);
    let key = path(&fx.pki.client.key);
    let other_key = path(&fx.pki.other_client.key);
    let pki_dir = path(fx.pki.dir());
    let tls_nodes = "rediss://127.0.0.1:1,rediss://127.0.0.1:2,rediss://127.0.0.1:3";
    let too_many = (0..64)
        .map(|i| format!("redis://127.0.0.1:{}", 20_000 + i))
        .collect::<Vec<_>>()
        .join(",");
    let long_name = "a".repeat(10 * 1024);
    let live_then_secret = format!("{live0},redis://:s3cret-pw-2@127.0.0.1:99999");
    let live_then_tls = format!("{live0},rediss://127.0.0.1:1");
    let empty = fx.empty_file.as_str();
    let binary = fx.binary_file.as_str();

    vec![
        // --- Node URLs ---
        usage(
            "URL: empty --nodes",
            &["--nodes", "", "ping"],
            &["no nodes configured"],
        ),
        usage(
            "URL: only commas",
            &["--nodes", " , ,", "ping"],
            &["no nodes configured"],
        ),
        usage(
            "URL: http scheme",
            &["--nodes", "http://127.0.0.1:1", "ping"],
            &["node 0", "unsupported scheme \"http\""],
        ),
        usage(
            "URL: no host",
            &["--nodes", "redis://", "ping"],
            &["node 0", "malformed URL", "no host"],
        ),
        usage(
            "URL: database not a number",
            &["--nodes", "redis://127.0.0.1:1/abc", "ping"],
            &["node 0", "database must be a number", "\"abc\""],
        ),
        usage(
            "URL: database out of range",
            &["--nodes", "redis://127.0.0.1:1/16000", "ping"],
            &["node 0", "database must be a number", "\"16000\""],
        ),
        usage(
            "URL: duplicate node",
            &["--nodes", &format!("{live},{live0}"), "ping"],
            &["nodes 0 and 3 are the same URL"],
        ),
        usage(
            "URL: duplicate node, spelled differently",
            &[
                "--nodes",
                "redis://LOCALHOST:7001,redis://localhost:7001/0",
                "ping",
            ],
            &["nodes 0 and 1 are the same URL"],
        ),
        usage(
            "URL: port 0",
            &["--nodes", "redis://127.0.0.1:0", "ping"],
            &["node 0", "port 0"],
        ),
        usage(
            "URL: port 99999",
            &["--nodes", "redis://127.0.0.1:99999", "ping"],
            &["node 0", "invalid port number"],
        ),
        usage(
            "URL: query parameters",
            &["--nodes", "redis://127.0.0.1:1/?password=x", "ping"],
            &["node 0", "query parameters are not supported"],
        ),
        usage(
            "URL: 64 nodes",
            &["--nodes", &too_many, "ping"],
            &["64 nodes configured; at most 63"],
        ),
        usage(
            "URL: REDQUORUM_NODES unset, no --nodes",
            &["ping"],
            &["REDQUORUM_NODES is not set"],
        ),
        usage(
            "URL: REDQUORUM_NODES garbage",
            &["ping"],
            &["REDQUORUM_NODES", "node 0", "malformed URL"],
        )
        .env("REDQUORUM_NODES", "garbage"),
        usage(
            "URL: REDQUORUM_NODES with an http node",
            &["id", "next", "s"],
            &["REDQUORUM_NODES", "node 1", "unsupported scheme"],
        )
        .env("REDQUORUM_NODES", format!("{live0},http://127.0.0.1:1")),
        usage(
            "URL: --nodes after the subcommand wins over REDQUORUM_NODES",
            &["ping", "--nodes", "garbage"],
            &["--nodes: node 0", "malformed URL"],
        )
        .env("REDQUORUM_NODES", live),
        usage(
            "URL: password in a malformed URL is redacted",
            &[
                "--nodes",
                "redis://u:hunter2-secret@127.0.0.1:notaport",
                "ping",
            ],
            &["--nodes", "node 0", "malformed URL", "redis://u:***@"],
        )
        .absent("hunter2-secret"),
        usage(
            "URL: password in a second, out-of-range URL is redacted",
            &["--nodes", &live_then_secret, "ping"],
            &["node 1", "invalid port number"],
        )
        .absent("s3cret-pw-2"),
        usage(
            "URL: password in an unsupported scheme is redacted",
            &["--nodes", "http://admin:pw-in-http-9@127.0.0.1:1", "ping"],
            &["node 0", "unsupported scheme"],
        )
        .absent("pw-in-http-9"),
        usage(
            "URL: user:password@host without a scheme is not shown",
            &["--nodes", "admin:bare-pw-3@127.0.0.1", "ping"],
            &["node 0", "characters, not shown"],
        )
        .absent("bare-pw-3"),
        // --- Names ---
        usage(
            "name: empty sequence",
            &["--nodes", live, "id", "next", ""],
            &["sequence name is empty"],
        ),
        usage(
            "name: 10 kB sequence",
            &["--nodes", live, "id", "next", &long_name],
            &["sequence name is 10240 bytes long; at most 512"],
        ),
        usage(
            "name: escape character in a sequence",
            &["--nodes", live, "id", "next", "s\x1b[2J"],
            &["sequence name contains the control character U+001B"],
        ),
        usage(
            "name: empty lock",
            &["--nodes", live, "lock", "run", "", "--", "true"],
            &["lock name is empty"],
        ),
        usage(
            "name: empty lock of lock holder",
            &["--nodes", live, "lock", "holder", ""],
            &["lock name is empty"],
        ),
        usage(
            "name: empty election of election observe",
            &["--nodes", live, "election", "observe", ""],
            &["election name is empty"],
        ),
        usage(
            "name: newline in an election candidate",
            &[
                "--nodes",
                live,
                "election",
                "campaign",
                "e",
                "--candidate",
                "a\nb",
            ],
            &["candidate name contains the control character U+000A"],
        ),
        usage(
            "duration: election run --ttl 0s",
            &[
                "--nodes", live, "election", "run", "e", "--ttl", "0s", "--", "true",
            ],
            &["--ttl", "outside"],
        ),
        usage(
            "program: election run of a program that does not exist",
            &[
                "--nodes",
                live,
                "election",
                "run",
                "e",
                "--",
                "/nonexistent/program",
            ],
            &["cannot run", "/nonexistent/program"],
        ),
        usage(
            "name: empty job of job run",
            &[
                "--nodes", live, "job", "run", "", "--period", "d", "--", "true",
            ],
            &["job name is empty"],
        ),
        usage(
            "name: empty period of job run",
            &[
                "--nodes", live, "job", "run", "j", "--period", "", "--", "true",
            ],
            &["period name is empty"],
        ),
        usage(
            "name: newline in a job period",
            &[
                "--nodes",
                live,
                "job",
                "run",
                "j",
                "--period",
                "2026-11-26\nrm -rf /",
                "--",
                "true",
            ],
            &["period name contains the control character U+000A"],
        ),
        usage(
            "name: 10 kB job period",
            &[
                "--nodes", live, "job", "run", "j", "--period", &long_name, "--", "true",
            ],
            &["period name is 10240 bytes long; at most 512"],
        ),
        usage(
            "duration: job run --ttl 0s",
            &[
                "--nodes", live, "job", "run", "j", "--period", "d", "--ttl", "0s", "--", "true",
            ],
            &["--ttl", "outside"],
        ),
        usage(
            "program: job run of an empty program name",
            &[
                "--nodes", live, "job", "run", "j", "--period", "d", "--", "",
            ],
            &["cannot run \"\"", "no such executable"],
        ),
        usage(
            "usage: job run without a command",
            &["--nodes", live, "job", "run", "j", "--period", "d", "--"],
            &["<COMMAND>"],
        ),
        usage(
            "usage: job run without --period",
            &["--nodes", live, "job", "run", "j", "--", "true"],
            &["--period <P>"],
        ),
        usage(
            "output: --output json on ping",
            &["--nodes", live, "--output", "json", "ping"],
            &["--output json is not supported"],
        ),
        usage(
            "name: newline in a lock",
            &["--nodes", live, "lock", "run", "a\nb", "--", "true"],
            &["lock name contains the control character U+000A"],
        ),
        usage(
            "name: tab in a group",
            &["--nodes", live, "index", "watch", "g\tx"],
            &["group name contains the control character U+0009"],
        ),
        usage(
            "name: newline in a member ID",
            &["--nodes", live, "index", "watch", "g", "--id", "m\n1"],
            &["member name contains the control character U+000A"],
        ),
        usage(
            "name: 10 kB pool",
            &["--nodes", live, "dist", "watch", &long_name],
            &["pool name is 10240 bytes long"],
        ),
        usage(
            "name: empty pool",
            &["--nodes", live, "units", "add", "", "u1"],
            &["pool name is empty"],
        ),
        usage(
            "name: NUL in a unit (from stdin)",
            &["--nodes", live, "units", "add", "p", "--from-file", "-"],
            &["unit name contains the control character U+0000"],
        )
        .stdin(b"u1\nu\x002\n"),
        usage(
            "name: units file that is not UTF-8",
            &["--nodes", live, "units", "add", "p", "--from-file", binary],
            &["--from-file", "cannot read", binary],
        ),
        usage(
            "name: units file that does not exist",
            &[
                "--nodes",
                live,
                "units",
                "add",
                "p",
                "--from-file",
                "/nonexistent/units",
            ],
            &["--from-file", "cannot read", "/nonexistent/units"],
        ),
        usage(
            "program: lock run with a program that does not exist",
            &[
                "--nodes",
                live,
                "lock",
                "run",
                "x",
                "--",
                "/nonexistent/program",
                "-v",
            ],
            &[
                "cannot run \"/nonexistent/program\"",
                "no such executable file",
            ],
        ),
        usage(
            "program: lock run with a program not on PATH",
            &[
                "--nodes",
                live,
                "lock",
                "run",
                "x",
                "--",
                "rq-no-such-program",
            ],
            &[
                "cannot run \"rq-no-such-program\"",
                "no such executable on PATH",
            ],
        ),
        // --- Durations ---
        usage(
            "duration: --node-timeout 0s",
            &["--nodes", live, "--node-timeout", "0s", "ping"],
            &["node_timeout", "outside the allowed range"],
        ),
        usage(
            "duration: --node-timeout 2h",
            &["--nodes", live, "--node-timeout", "2h", "ping"],
            &["node_timeout", "outside the allowed range"],
        ),
        usage(
            "duration: --operation-timeout 2h",
            &["--nodes", live, "--operation-timeout", "2h", "ping"],
            &[
                "--operation-timeout",
                "operation_timeout",
                "outside the allowed range",
            ],
        ),
        usage(
            "duration: --node-timeout abc",
            &["--nodes", live, "--node-timeout", "abc", "ping"],
            &["--node-timeout", "'abc'"],
        ),
        usage(
            "duration: --node-timeout without a unit",
            &["--nodes", live, "--node-timeout", "250", "ping"],
            &["--node-timeout", "'250'"],
        ),
        usage(
            "duration: lock --ttl 0s",
            &[
                "--nodes", live, "lock", "run", "x", "--ttl", "0s", "--", "true",
            ],
            &["--ttl", "outside"],
        ),
        usage(
            "duration: lock --ttl 100d",
            &[
                "--nodes", live, "lock", "run", "x", "--ttl", "100d", "--", "true",
            ],
            &["--ttl", "outside"],
        ),
        usage(
            "duration: lock --wait -1s",
            &[
                "--nodes",
                live,
                "lock",
                "run",
                "x",
                "--wait=-1s",
                "--",
                "true",
            ],
            &["--wait", "'-1s'"],
        ),
        usage(
            "duration: index watch --interval 0ms",
            &["--nodes", live, "index", "watch", "g", "--interval", "0ms"],
            &["--interval", "outside 100ms..=1h"],
        ),
        usage(
            "duration: dist watch --interval 0ms",
            &["--nodes", live, "dist", "watch", "p", "--interval", "0ms"],
            &["--interval", "outside 100ms..=1h"],
        ),
        usage(
            "duration: dist watch --grace 2h",
            &["--nodes", live, "dist", "watch", "p", "--grace", "2h"],
            &["--grace", "above 1h"],
        ),
        // --- Counts ---
        usage(
            "count: id next -n 0",
            &["--nodes", live, "id", "next", "s", "-n", "0"],
            &["--count", "between 1 and 1048576", "got 0"],
        ),
        usage(
            "count: id next -n -1",
            &["--nodes", live, "id", "next", "s", "-n", "-1"],
            &["--count", "'-1'"],
        ),
        usage(
            "count: id next --count=-1",
            &["--nodes", live, "id", "next", "s", "--count=-1"],
            &["--count", "'-1'"],
        ),
        usage(
            "count: id next -n 99999999999999",
            &["--nodes", live, "id", "next", "s", "-n", "99999999999999"],
            &["--count", "between 1 and 1048576", "got 99999999999999"],
        ),
        usage(
            "count: id next -n above u64",
            &[
                "--nodes",
                live,
                "id",
                "next",
                "s",
                "-n",
                "99999999999999999999999",
            ],
            &["--count", "too large"],
        ),
        usage(
            "count: dist watch --weight -1",
            &["--nodes", live, "dist", "watch", "p", "--weight", "-1"],
            &["--weight", "'-1'"],
        ),
        usage(
            "count: dist watch --weight=-1",
            &["--nodes", live, "dist", "watch", "p", "--weight=-1"],
            &["--weight", "'-1'"],
        ),
        usage(
            "count: dist watch --weight 10001",
            &["--nodes", live, "dist", "watch", "p", "--weight", "10001"],
            &["--weight", "above 10000"],
        ),
        // --- Environment variables ---
        usage(
            "env: REDQUORUM_CACERT=/nonexistent",
            &["--nodes", live, "ping"],
            &["REDQUORUM_CACERT", "/nonexistent"],
        )
        .env("REDQUORUM_CACERT", "/nonexistent"),
        usage(
            "env: REDQUORUM_CERT without REDQUORUM_KEY",
            &["--nodes", tls_nodes, "ping"],
            &["REDQUORUM_CERT", "REDQUORUM_KEY", "without"],
        )
        .env("REDQUORUM_CERT", &crt),
        usage(
            "env: REDQUORUM_KEY without REDQUORUM_CERT",
            &["--nodes", tls_nodes, "ping"],
            &["REDQUORUM_KEY", "REDQUORUM_CERT", "without"],
        )
        .env("REDQUORUM_KEY", &key),
        usage(
            "env: REDQUORUM_SNI not a name",
            &["--nodes", tls_nodes, "ping"],
            &["REDQUORUM_SNI", "not a DNS name"],
        )
        .env("REDQUORUM_SNI", "not a name"),
        usage(
            "env: REDQUORUM_CLUSTER not 16 hex digits",
            &["--nodes", live, "ping"],
            &["REDQUORUM_CLUSTER", "16 hex digits"],
        )
        .env("REDQUORUM_CLUSTER", "xyz"),
        // --- TLS files ---
        usage(
            "TLS: --cacert /nonexistent",
            &["--nodes", tls_nodes, "--cacert", "/nonexistent", "ping"],
            &["--cacert", "/nonexistent", "No such file"],
        ),
        usage(
            "TLS: --cacert a directory",
            &["--nodes", tls_nodes, "--cacert", &pki_dir, "ping"],
            &["--cacert", "is a directory"],
        ),
        usage(
            "TLS: --cacert a key file",
            &["--nodes", tls_nodes, "--cacert", &key, "ping"],
            &["--cacert", "holds no certificate"],
        ),
        usage(
            "TLS: --cacert an empty file",
            &["--nodes", tls_nodes, "--cacert", empty, "ping"],
            &["--cacert", "holds no certificate"],
        ),
        usage(
            "TLS: --cert without --key",
            &["--nodes", tls_nodes, "--cert", &crt, "ping"],
            &["--cert", "without --key"],
        ),
        usage(
            "TLS: --key without --cert",
            &["--nodes", tls_nodes, "--key", &key, "ping"],
            &["--key", "without --cert"],
        ),
        usage(
            "TLS: --cert and --key that do not match",
            &[
                "--nodes", tls_nodes, "--cert", &crt, "--key", &other_key, "ping",
            ],
            &["--key", "does not fit the client certificate"],
        ),
        usage(
            "TLS: --cert is a key file",
            &["--nodes", tls_nodes, "--cert", &key, "--key", &key, "ping"],
            &["--cert", "holds no certificate"],
        ),
        usage(
            "TLS: --key is a certificate",
            &["--nodes", tls_nodes, "--cert", &crt, "--key", &crt, "ping"],
            &["--key", "holds no private key"],
        ),
        usage(
            "TLS: --sni \"not a name\"",
            &["--nodes", tls_nodes, "--sni", "not a name", "ping"],
            &["--sni", "not a DNS name"],
        ),
        usage(
            "TLS: --sni empty",
            &["--nodes", tls_nodes, "--sni", "", "ping"],
            &["--sni", "empty"],
        ),
        usage(
            "TLS: --cacert with redis:// nodes",
            &["--nodes", live, "--cacert", &ca, "ping"],
            &["node 0", "is redis://", "rediss://"],
        ),
        usage(
            "TLS: --sni with one redis:// node among rediss://",
            &["--nodes", &live_then_tls, "--sni", "localhost", "ping"],
            &["node 0", "is redis://"],
        ),
        // --- ACL ---
        usage(
            "ACL: --user with a space",
            &["acl", "--user", "a b"],
            &["ACL user name \"a b\""],
        ),
        usage(
            "ACL: --user empty",
            &["acl", "--user", ""],
            &["ACL user name \"\""],
        ),
        usage("ACL: no --user", &["acl"], &["--user"]),
        usage(
            "ACL: acl --feature nope",
            &["acl", "--user", "x", "--feature", "nope"],
            &["unknown feature \"nope\"", "ids, locks"],
        ),
        usage(
            "ACL: check --feature nope",
            &["--nodes", live, "check", "--feature", "ids,nope"],
            &["unknown feature \"nope\""],
        ),
        // --- Cluster pin ---
        usage(
            "cluster: --cluster xyz",
            &["--nodes", live, "--cluster", "xyz", "ping"],
            &["--cluster", "16 hex digits"],
        ),
        usage(
            "cluster: --cluster 16 digits, one not hex",
            &[
                "--nodes",
                live,
                "--cluster",
                "0123456789abcdeg",
                "id",
                "next",
                "s",
            ],
            &["--cluster", "16 hex digits"],
        ),
        // --- Usage ---
        usage(
            "usage: lock run without a command",
            &["--nodes", live, "lock", "run", "x"],
            &["<COMMAND>"],
        ),
        usage(
            "usage: unknown subcommand",
            &["--nodes", live, "id", "prev", "s"],
            &["unrecognized subcommand 'prev'"],
        ),
        usage(
            "usage: unknown global option",
            &["--nodes", live, "--timeout", "1s", "ping"],
            &["unexpected argument '--timeout'"],
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_fails_closed_with_a_message_that_names_the_setting() {
    let started = std::time::Instant::now();
    // Healthy plain nodes, and blank ones that no command may set up.
    let (local, blank) =
        tokio::task::spawn_blocking(|| (LocalNodes::start(3), LocalNodes::start(3)))
            .await
            .expect("local nodes");
    let live = local.urls().join(",");
    let pki = Pki::generate();
    let (t0, t1, t2) = tokio::join!(
        TlsNode::start(&pki, "yes", &[]),
        TlsNode::start(&pki, "yes", &[]),
        TlsNode::start(&pki, "yes", &[]),
    );
    let tls = [t0, t1, t2];
    let (h0, h1, h2) = tokio::join!(http_node(), http_node(), http_node());

    let files = tempfile::tempdir().expect("temp dir");
    let empty_file = files.path().join("empty.pem");
    std::fs::write(&empty_file, b"").expect("write");
    let binary_file = files.path().join("units.bin");
    std::fs::write(&binary_file, [0xff, 0xfe, b'\n', 0xc3]).expect("write");

    // The healthy nodes' set-up: a cluster (`cluster init`) and sequence s.
    for command in [&["cluster", "init"][..], &["ping"], &["id", "next", "s"]] {
        let args: Vec<&str> = ["--nodes", live.as_str()]
            .iter()
            .chain(command)
            .copied()
            .collect();
        if let Err(e) = row("setup", Exit::Code(0), &args, &[]).check().await {
            panic!("the healthy nodes must work: {e}");
        }
    }
    let mut admins = admin_connections(&local).await;
    let live_before = keyspaces(&mut admins).await;
    assert!(
        live_before
            .iter()
            .all(|k| k.1.keys().any(|k| k == "rq:id:s")),
        "the setup allocated an ID of sequence s: {:?}",
        live_before
            .iter()
            .map(|k| k.1.keys().collect::<Vec<_>>())
            .collect::<Vec<_>>()
    );

    // A user that may ping and probe, nothing else.
    let acl_pw = "acl-denied-pw-41";
    let mut tls_admins = Vec::new();
    for node in &tls {
        let mut admin = node.admin(&pki).await;
        let _: () = redis::cmd("ACL")
            .arg("SETUSER")
            .arg("rq")
            .arg("reset")
            .arg("on")
            .arg(format!(">{acl_pw}"))
            .arg("~rq:*")
            .arg("+ping")
            .arg("+info")
            .arg("+config|get")
            .query_async(&mut admin)
            .await
            .expect("ACL SETUSER");
        tls_admins.push(admin);
    }
    let tls_before = keyspaces(&mut tls_admins).await;
    let denied = tls
        .iter()
        .map(|n| format!("rediss://rq:{acl_pw}@127.0.0.1:{}", n.port()))
        .collect::<Vec<_>>()
        .join(",");
    let (ca, crt, key) = (path(&pki.ca), path(&pki.client.cert), path(&pki.client.key));
    let tls_args = |rest: &[&str]| {
        let mut args = vec![
            "--cacert",
            &ca,
            "--cert",
            &crt,
            "--key",
            &key,
            "--nodes",
            &denied,
            // TLS handshakes in a debug build on a loaded machine: room beyond the 250 ms default.
            "--node-timeout",
            "3s",
        ];
        args.extend_from_slice(rest);
        args.iter().map(|s| s.to_string()).collect::<Vec<_>>()
    };
    let http = format!("redis://127.0.0.1:{h0},redis://127.0.0.1:{h1},redis://127.0.0.1:{h2}");
    let closed = (0..3)
        .map(|_| format!("redis://127.0.0.1:{}", closed_port()))
        .collect::<Vec<_>>()
        .join(",");

    let fixtures = Fixtures {
        live0: local.url(0),
        live: live.clone(),
        pki: &pki,
        empty_file: path(&empty_file),
        binary_file: path(&binary_file),
    };
    let mut rows = table(&fixtures);
    // The rows that would reach nodes, again against blank nodes: a rejected command must not
    // even set a cluster up on them.
    let blank_fixtures = Fixtures {
        live0: blank.url(0),
        live: blank.urls().join(","),
        ..fixtures
    };
    rows.extend(
        table(&blank_fixtures)
            .into_iter()
            .filter(|r| {
                r.args
                    .iter()
                    .chain(r.env.iter().map(|(_, v)| v))
                    .any(|a| a.contains(&blank_fixtures.live0))
            })
            .map(|mut r| {
                r.label = format!("blank nodes: {}", r.label);
                r
            }),
    );

    // --- Nodes that cannot serve ---
    let mut check_denied = row("nodes: ACL-denied user, check", Exit::Code(1), &[], &[]);
    check_denied.args = tls_args(&["check"]);
    // The user may not even run the safety probe (it reads the marker with GET) nor the
    // permission check's script: every node is named with what it lacks.
    check_denied.expect = vec!["missing permissions: see `redquorum acl --user NAME`".into()];
    for node in &tls {
        let url = format!("rediss://rq:***@127.0.0.1:{}", node.port());
        check_denied = check_denied.on_one_line(&url, "DOWN").on_one_line(
            &url,
            "the Redis user lacks +evalsha (needed by every client)",
        );
    }
    rows.push(check_denied.absent(acl_pw));
    let mut id_denied = row("nodes: ACL-denied user, id next", Exit::Failure, &[], &[]);
    id_denied.args = tls_args(&["id", "next", "s"]);
    id_denied.expect = vec![
        "no majority".into(),
        "NoPerm".into(),
        "permission denied: the node answered, but its Redis user lacks a permission".into(),
    ];
    rows.push(id_denied.absent(acl_pw));
    let mut check_http = row(
        "nodes: not Redis (HTTP), check",
        Exit::Code(1),
        &["--nodes", &http, "--node-timeout", "2s", "check"],
        &["NOT all nodes are safe and reachable"],
    );
    for (i, port) in [h0, h1, h2].into_iter().enumerate() {
        check_http = check_http.on_one_line(
            format!("node{i}  redis://127.0.0.1:{port} DOWN"),
            "unreachable: not a Redis reply (is a Redis server listening on this port?)",
        );
    }
    rows.push(check_http);
    rows.push(row(
        "nodes: not Redis (HTTP), id next",
        Exit::Failure,
        &[
            "--nodes",
            &http,
            "--node-timeout",
            "300ms",
            "id",
            "next",
            "s",
        ],
        &["no majority: 0 of 3 nodes applied it", "not a Redis reply"],
    ));
    rows.push(row(
        "nodes: nothing listening, id next",
        Exit::Failure,
        &[
            "--nodes",
            &closed,
            "--node-timeout",
            "300ms",
            "id",
            "next",
            "s",
        ],
        &["no majority", "refused"],
    ));

    assert!(rows.len() >= 35, "{} rows", rows.len());
    let total = rows.len();
    // Three rows at a time: the machine is shared; the slowest rows wait for their nodes.
    let permits = Arc::new(tokio::sync::Semaphore::new(3));
    let mut tasks = Vec::new();
    for r in rows {
        let permits = permits.clone();
        tasks.push(tokio::spawn(async move {
            let _permit = permits.acquire_owned().await.expect("semaphore");
            r.check().await
        }));
    }
    let mut failures = Vec::new();
    for t in tasks {
        if let Err(e) = t.await.expect("row task") {
            failures.push(e);
        }
    }

    let mut blank_admins = admin_connections(&blank).await;
    let live_after = keyspaces(&mut admins).await;
    let tls_after = keyspaces(&mut tls_admins).await;
    let mut changed = keyspace_diff("healthy", &live_before, &live_after);
    changed.extend(keyspace_diff("ACL-denied", &tls_before, &tls_after));
    let empty: Keyspace = (0, BTreeMap::new());
    changed.extend(keyspace_diff(
        "blank",
        &[empty.clone(), empty.clone(), empty],
        &keyspaces(&mut blank_admins).await,
    ));
    if !changed.is_empty() {
        failures.push(format!(
            "[fail closed] rejected commands changed the nodes' keyspaces:\n  {}",
            changed.join("\n  ")
        ));
    }
    println!(
        "{total} bad inputs, {} failing, in {:?}",
        failures.len(),
        started.elapsed()
    );
    assert!(
        failures.is_empty(),
        "{} of {total} checks failed:\n\n{}",
        failures.len(),
        failures.join("\n\n")
    );
}
