//! The servers the ID and lock benchmarks run on, side by side in one run: Redis, then Valkey
//! when it is installed (`scripts/install-valkey.sh`, which `scripts/bench.sh` runs), unless
//! `--no-valkey` is given. Included by path (`#[path = "support/servers.rs"]`) by the benches
//! that use it.
#![allow(dead_code, unreachable_pub)]

use redquorum_testkit::{server_is_valkey, server_program, DEFAULT_SERVER};

/// A server program and what it says it is.
#[derive(Clone, Debug)]
pub struct Server {
    /// "Redis" or "Valkey".
    pub name: &'static str,
    /// The program local nodes run.
    pub program: String,
    /// Its version, as `--version` prints it ("7.0.15").
    pub version: String,
}

impl Server {
    /// "Redis 7.0.15".
    pub fn label(&self) -> String {
        format!("{} {}", self.name, self.version)
    }
}

/// Redis (env `REDQUORUM_TEST_SERVER`'s program unless it names Valkey, else `redis-server`),
/// then Valkey (`valkey-server`, or env's program when it names Valkey) when it runs; a line
/// says why a server is left out.
pub fn servers() -> Vec<Server> {
    let env_is_valkey = server_is_valkey();
    let redis = if env_is_valkey {
        DEFAULT_SERVER.to_string()
    } else {
        server_program()
    };
    let valkey = if env_is_valkey {
        server_program()
    } else {
        "valkey-server".to_string()
    };
    let mut out = Vec::new();
    match version(&redis) {
        Some(version) => out.push(Server {
            name: "Redis",
            program: redis,
            version,
        }),
        None => println!("bench: {redis} does not run: no Redis rows"),
    }
    if std::env::args().any(|a| a == "--no-valkey") {
        println!("bench: --no-valkey: no Valkey rows");
    } else {
        match version(&valkey) {
            Some(version) => out.push(Server {
                name: "Valkey",
                program: valkey,
                version,
            }),
            None => println!(
                "bench: {valkey} does not run (scripts/install-valkey.sh installs Valkey 8.0): \
                 no Valkey rows"
            ),
        }
    }
    out
}

/// The version `program --version` prints ("Redis server v=7.0.15 sha=..."), None when it
/// does not run.
fn version(program: &str) -> Option<String> {
    let out = std::process::Command::new(program)
        .arg("--version")
        .output()
        .ok()
        .filter(|o| o.status.success())?;
    let text = String::from_utf8_lossy(&out.stdout);
    Some(
        text.split_whitespace()
            .find_map(|w| w.strip_prefix("v="))
            .unwrap_or("(unknown version)")
            .to_string(),
    )
}
