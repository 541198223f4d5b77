//! Least privilege: the exact Redis ACL each feature needs, as `ACL SETUSER` commands, and a
//! side-effect-free check of a node's user against it.
//!
//! Every client needs the base permissions: it probes each node (`PING`, `INFO`, `CONFIG
//! GET`), reads markers and the cluster descriptor, sends scripts (`EVALSHA`, `SCRIPT LOAD`),
//! reads behind the marker in `MULTI`/`EXEC`, and repairs a wiped node (scans and copies every
//! `rq:` key). Each feature adds the commands its scripts and reads use. Keys and pub/sub
//! channels are all under [`KEY_PREFIX`] (`~rq:*`, `&rq:*`).
//!
//! Architecture invariant: the tables here list every command the library sends or its
//! scripts call (a unit test reads the scripts' sources; each feature's integration tests
//! run under exactly that user over TLS in CI), and nothing else.

use std::fmt;

use crate::client::Client;
use crate::error::Error;
use crate::keys::KEY_PREFIX;
use crate::quorum::NodeId;

/// A feature of the library, for its ACL.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum Feature {
    /// Fencing IDs ([`IdGenerator`](crate::IdGenerator)) and [`fenced_set`](crate::fenced_set).
    Ids,
    /// Fenced leases ([`Lock`](crate::Lock)).
    Locks,
    /// Leader election and periodic jobs ([`Election`](crate::Election),
    /// [`PeriodicJob`](crate::PeriodicJob)).
    Election,
    /// Fenced peer indexing ([`Member`](crate::Member)).
    Indexing,
    /// Work distribution (pools and units).
    Distribution,
}

impl Feature {
    /// Every feature, in the order `redquorum acl` prints them.
    pub const ALL: [Feature; 5] = [
        Feature::Ids,
        Feature::Locks,
        Feature::Election,
        Feature::Indexing,
        Feature::Distribution,
    ];

    /// The feature's name as the CLI spells it.
    pub fn name(self) -> &'static str {
        match self {
            Feature::Ids => "ids",
            Feature::Locks => "locks",
            Feature::Election => "election",
            Feature::Indexing => "indexing",
            Feature::Distribution => "distribution",
        }
    }

    /// Parse a feature name (as [`name`](Feature::name) prints it).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] naming the known features.
    pub fn parse(s: &str) -> Result<Feature, Error> {
        let s = s.trim().to_ascii_lowercase();
        Feature::ALL
            .into_iter()
            .find(|f| f.name() == s)
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "unknown feature {s:?}: expected one of {}",
                    Feature::ALL.map(Feature::name).join(", ")
                ))
            })
    }

    /// The commands this feature needs beyond the base, in ACL form (`config|get`).
    fn commands(self) -> &'static [&'static str] {
        match self {
            // id_propose.lua, fenced_set.lua: GET and SET, in the base.
            Feature::Ids => &["get", "set"],
            // lock_acquire/extend/release.lua, Lock::holder, the release hint.
            Feature::Locks => LOCKS,
            // Locks, plus record.lua and prune.lua (periodic jobs' completion records).
            Feature::Election => LEADERS,
            // Locks (the group's leader lease and its records), member_beat.lua,
            // view_write.lua, hints.
            Feature::Indexing => LEADERS,
            // Indexing, plus plist.lua, units*.lua.
            Feature::Distribution => &[
                "hmget",
                "hget",
                "hset",
                "del",
                "publish",
                "subscribe",
                "hdel",
                "hgetall",
                "hkeys",
                "hlen",
                "exists",
                "incr",
                "zadd",
                "zcard",
                "zrangebyscore",
            ],
        }
    }
}

impl fmt::Display for Feature {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

const LOCKS: &[&str] = &["hmget", "hget", "hset", "del", "publish", "subscribe"];

/// Locks, plus what completion records (record.lua, prune.lua) and member beats need.
const LEADERS: &[&str] = &[
    "hmget",
    "hget",
    "hset",
    "del",
    "publish",
    "subscribe",
    "hdel",
    "hgetall",
];

/// What every client needs: node probes, markers and descriptors, scripts, guarded reads,
/// and the repair of a wiped node (which every client runs when it meets one).
const BASE: &[&str] = &[
    "ping",
    "info",
    "get",
    "set",
    "del",
    "exists",
    "hget",
    "hset",
    "hgetall",
    "hmget",
    "scan",
    "multi",
    "exec",
    "evalsha",
    "script|load",
];

/// Checks a user name before it is put in a command line.
fn valid_user(user: &str) -> Result<(), Error> {
    let ok = !user.is_empty()
        && user.len() <= 128
        && user
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.' | b'@'));
    if ok {
        Ok(())
    } else {
        Err(Error::InvalidArgument(format!(
            "ACL user name {user:?}: use 1 to 128 letters, digits, '_', '-', '.' or '@'"
        )))
    }
}

/// The `ACL SETUSER` commands that give `user` exactly what `features` need, one per line,
/// as `redis-cli` runs them: the first resets the user and grants the base (every client's
/// needs, with the `rq:` keys and channels), then one line per feature adds its commands.
/// No line holds a password: the user stays unable to log in until the operator adds one
/// (`ACL SETUSER NAME >PASSWORD`). `features` empty means every feature.
///
/// `CONFIG GET` is not granted unless `config_get`: it cannot be limited to one parameter,
/// and it reads `requirepass` and `masterauth`, so a user with it can read the admin
/// password. Without it the clients must attest the fsync policy
/// ([`Config::with_fsync_always_attested`](crate::Config::with_fsync_always_attested),
/// `--attest-fsync-always`), and `redquorum check` run as an admin verifies it.
///
/// # Errors
/// [`Error::InvalidArgument`] when `user` is empty, longer than 128 bytes or holds
/// anything but letters, digits, `_`, `-`, `.` and `@`.
pub fn setuser_lines(
    user: &str,
    features: &[Feature],
    config_get: bool,
) -> Result<Vec<String>, Error> {
    valid_user(user)?;
    let mut features: Vec<Feature> = if features.is_empty() {
        Feature::ALL.to_vec()
    } else {
        features.to_vec()
    };
    features.sort();
    features.dedup();
    let plus = |cmds: &[&str]| {
        cmds.iter()
            .map(|c| format!("+{c}"))
            .collect::<Vec<_>>()
            .join(" ")
    };
    let mut base = plus(BASE);
    if config_get {
        base.push_str(" +config|get");
    }
    // `resetchannels` again after `reset`: on a server with `acl-pubsub-default allchannels`
    // a reset user has every channel, and a channel pattern after that is refused.
    let mut lines = vec![format!(
        "ACL SETUSER {user} reset resetchannels on ~{KEY_PREFIX}* &{KEY_PREFIX}* {base}"
    )];
    for f in features {
        lines.push(format!("ACL SETUSER {user} {}", plus(f.commands())));
    }
    Ok(lines)
}

/// The arguments `redis.acl_check_cmd` checks for a permission (a probe key and channel
/// under the prefix; nothing is run).
fn probe_args(permission: &str) -> Vec<&'static str> {
    const K: &str = "rq:acl-probe";
    match permission {
        "ping" => vec!["ping"],
        "info" => vec!["info", "server"],
        "config|get" => vec!["config", "get", "appendfsync"],
        "get" => vec!["get", K],
        "set" => vec!["set", K, "1"],
        "del" => vec!["del", K],
        "exists" => vec!["exists", K],
        "hget" => vec!["hget", K, "f"],
        "hset" => vec!["hset", K, "f", "1"],
        "hgetall" => vec!["hgetall", K],
        "hmget" => vec!["hmget", K, "f"],
        "hdel" => vec!["hdel", K, "f"],
        "hkeys" => vec!["hkeys", K],
        "hlen" => vec!["hlen", K],
        "scan" => vec!["scan", "0"],
        "multi" => vec!["multi"],
        "exec" => vec!["exec"],
        "evalsha" => vec!["evalsha", "0000000000000000000000000000000000000000", "0"],
        "script|load" => vec!["script", "load", "return 1"],
        "publish" => vec!["publish", K, "x"],
        "subscribe" => vec!["subscribe", K],
        "incr" => vec!["incr", K],
        "zadd" => vec!["zadd", K, "1", "m"],
        "zcard" => vec!["zcard", K],
        "zrangebyscore" => vec!["zrangebyscore", K, "0", "1"],
        _ => vec![],
    }
}

/// Asks the node, for each group of arguments, whether its user may run that command on
/// those keys and channels (`redis.acl_check_cmd`, Redis 7): nothing is run.
const PROBE_LUA: &str = r"#!lua flags=no-writes
if not redis.acl_check_cmd then return {'needs Redis 7 (redis.acl_check_cmd)'} end
local out = {}
local i = 1
while i <= #ARGV do
  local n = tonumber(ARGV[i])
  local name = ARGV[i + 1]
  local args = {}
  for j = 1, n do args[j] = ARGV[i + 1 + j] end
  local ok, allowed = pcall(redis.acl_check_cmd, unpack(args))
  if not ok or not allowed then table.insert(out, name) end
  i = i + 2 + n
end
return out
";

static PROBE: std::sync::LazyLock<redis::Script> =
    std::sync::LazyLock::new(|| redis::Script::new(PROBE_LUA));

/// A permission the node's user lacks.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Missing {
    /// In ACL form, as `redquorum acl` grants it (`hset`, `config|get`).
    pub permission: String,
    /// The features that need it (empty: every client, the base).
    pub features: Vec<Feature>,
}

impl fmt::Display for Missing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "+{} (needed by ", self.permission)?;
        if self.permission == "config|get" {
            f.write_str(
                "every client, unless the fsync policy is attested: --attest-fsync-always",
            )?;
        } else if self.features.is_empty() {
            f.write_str("every client")?;
        } else {
            let names: Vec<&str> = self.features.iter().map(|f| f.name()).collect();
            f.write_str(&names.join(", "))?;
        }
        f.write_str(")")
    }
}

/// One node's permission check.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct PermissionReport {
    /// Which node.
    pub node: NodeId,
    /// Its URL, password redacted.
    pub url: String,
    /// The permissions its user lacks, or why the node could not be checked.
    pub missing: Result<Vec<Missing>, String>,
}

/// The permissions `features` need (empty: every feature), each with the features that need
/// it (empty for the base).
fn needed(features: &[Feature]) -> Vec<(&'static str, Vec<Feature>)> {
    let features: Vec<Feature> = if features.is_empty() {
        Feature::ALL.to_vec()
    } else {
        features.to_vec()
    };
    let mut out: Vec<(&'static str, Vec<Feature>)> = BASE.iter().map(|c| (*c, vec![])).collect();
    for f in features {
        for c in f.commands() {
            match out.iter_mut().find(|(p, _)| p == c) {
                Some((_, fs)) if fs.is_empty() => {}
                Some((_, fs)) => {
                    if !fs.contains(&f) {
                        fs.push(f)
                    }
                }
                None => out.push((c, vec![f])),
            }
        }
    }
    out
}

impl Client {
    /// Check on every node, without running anything but one read-only script, that this
    /// client's Redis user has every permission `features` need (empty: every feature), as
    /// [`setuser_lines`] grants them. `CONFIG GET` is not required when the fsync policy is
    /// attested ([`Config::with_fsync_always_attested`](crate::Config::with_fsync_always_attested)).
    /// Needs Redis 7 (`redis.acl_check_cmd`).
    ///
    /// # Errors
    /// None: a node that cannot be checked has `Err(reason)` in its report (a user without
    /// `EVALSHA` or `SCRIPT LOAD` is reported as missing those).
    ///
    /// # Cancel safety
    /// Cancel-safe (read-only).
    pub async fn check_permissions(&self, features: &[Feature]) -> Vec<PermissionReport> {
        let mut needed: Vec<(&'static str, Vec<Feature>)> = needed(features);
        if !self.config().attest_fsync_always {
            needed.insert(2, ("config|get", vec![]));
        }
        let argv = probe_argv(&needed);
        let deadline = self.config().node_timeout;
        let on = self.current_or_pinned();
        let checks = on.inner.nodes.iter().map(|node| {
            let (node, argv, needed) = (node.clone(), argv.clone(), needed.clone());
            async move {
                let missing = denied(&node, argv, deadline).await.map(|denied| {
                    denied
                        .into_iter()
                        .map(|p| Missing {
                            features: needed
                                .iter()
                                .find(|(n, _)| *n == p)
                                .map(|(_, f)| f.clone())
                                .unwrap_or_default(),
                            permission: p,
                        })
                        .collect()
                });
                PermissionReport {
                    node: node.id,
                    url: node.url.to_string(),
                    missing,
                }
            }
        });
        futures::future::join_all(checks).await
    }
}

/// The probe script's arguments: for each permission, the count of its sample arguments, the
/// permission, and the arguments.
fn probe_argv(needed: &[(&'static str, Vec<Feature>)]) -> Vec<String> {
    let mut argv: Vec<String> = Vec::new();
    for (permission, _) in needed {
        let args = probe_args(permission);
        argv.push(args.len().to_string());
        argv.push(permission.to_string());
        argv.extend(args.into_iter().map(String::from));
    }
    argv
}

/// The permissions of `argv` that `node`'s user lacks, asked by the probe script on a
/// connection of its own, not probed (a user that cannot even run the safety probe still
/// learns every permission it lacks). A user that may not run the script itself lacks
/// `evalsha` or `script|load`; an error says why the node could not be checked.
async fn denied(
    node: &crate::node::Node,
    argv: Vec<String>,
    deadline: std::time::Duration,
) -> Result<Vec<String>, String> {
    let mut invocation = PROBE.prepare_invoke();
    invocation.arg(argv);
    let mut conn = tokio::time::timeout(deadline, node.connect())
        .await
        .map_err(|_| format!("no connection within {deadline:?}"))?
        .map_err(|e| e.to_string())?;
    let run =
        tokio::time::timeout(deadline, invocation.invoke_async::<Vec<String>>(&mut conn)).await;
    let denied = match run {
        Err(_) => return Err(format!("no answer within {deadline:?}")),
        Ok(Ok(denied)) => denied,
        Ok(Err(e)) => {
            let text = node.url.scrub(&e.to_string());
            if !text.to_ascii_lowercase().contains("noperm") {
                return Err(text);
            }
            let lower = text.to_ascii_lowercase();
            let which = if lower.contains("'script|load'") || lower.contains("'script'") {
                "script|load"
            } else {
                "evalsha"
            };
            vec![which.to_string()]
        }
    };
    if let Some(old) = denied.iter().find(|d| d.starts_with("needs Redis 7")) {
        return Err(format!("cannot check permissions: the node {old}"));
    }
    Ok(denied)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The commands a script's source calls (`redis.call('X'` / `redis.pcall('X'`).
    fn called(source: &str) -> Vec<String> {
        let mut out = Vec::new();
        for part in source.split("call(").skip(1) {
            let quote = part.chars().next();
            if let Some(q @ ('\'' | '"')) = quote {
                if let Some(end) = part[1..].find(q) {
                    out.push(part[1..1 + end].to_ascii_lowercase());
                }
            }
        }
        out.sort();
        out.dedup();
        out
    }

    fn granted(features: &[Feature]) -> Vec<String> {
        needed(features)
            .into_iter()
            .map(|(p, _)| p.to_string())
            .collect()
    }

    #[test]
    fn every_command_a_features_scripts_call_is_granted_to_it() {
        use Feature::*;
        let scripts: &[(&str, &str, &[Feature])] = &[
            ("mark", include_str!("scripts/mark.lua"), &[]),
            ("claim", include_str!("scripts/claim.lua"), &[]),
            (
                "cluster_init",
                include_str!("scripts/cluster_init.lua"),
                &[],
            ),
            ("raise", include_str!("scripts/raise.lua"), &[]),
            ("restore", include_str!("scripts/restore.lua"), &[]),
            ("view_write", include_str!("scripts/view_write.lua"), &[]),
            ("seal", include_str!("scripts/seal.lua"), &[]),
            ("id_propose", include_str!("scripts/id_propose.lua"), &[Ids]),
            ("fenced_set", include_str!("scripts/fenced_set.lua"), &[Ids]),
            (
                "lock_acquire",
                include_str!("scripts/lock_acquire.lua"),
                &[Locks, Election, Indexing, Distribution],
            ),
            (
                "lock_extend",
                include_str!("scripts/lock_extend.lua"),
                &[Locks, Election, Indexing, Distribution],
            ),
            (
                "lock_release",
                include_str!("scripts/lock_release.lua"),
                &[Locks, Election, Indexing, Distribution],
            ),
            // Periodic jobs, and a group's or pool's leader (its completion records).
            (
                "record",
                include_str!("scripts/record.lua"),
                &[Election, Indexing, Distribution],
            ),
            (
                "prune",
                include_str!("scripts/prune.lua"),
                &[Election, Indexing, Distribution],
            ),
            (
                "member_beat",
                include_str!("scripts/member_beat.lua"),
                &[Indexing, Distribution],
            ),
            ("plist", include_str!("scripts/plist.lua"), &[Distribution]),
            ("units", include_str!("scripts/units.lua"), &[Distribution]),
            (
                "units_gc",
                include_str!("scripts/units_gc.lua"),
                &[Distribution],
            ),
            (
                "units_since",
                include_str!("scripts/units_since.lua"),
                &[Distribution],
            ),
        ];
        for (name, source, features) in scripts {
            let needs: Vec<String> = called(source)
                .into_iter()
                // PEXPIRE runs only under the test switch `with_server_clock_leases_for_tests`.
                .filter(|c| c != "pexpire")
                .collect();
            let sets: Vec<Vec<Feature>> = if features.is_empty() {
                vec![vec![Ids]]
            } else {
                features.iter().map(|f| vec![*f]).collect()
            };
            for set in sets {
                let granted = granted(&set);
                for c in &needs {
                    assert!(
                        granted.contains(c),
                        "{name}.lua calls {c}, which the ACL of {set:?} does not grant"
                    );
                }
            }
        }
        // Every script of src/scripts is listed above.
        let listed: Vec<&str> = scripts.iter().map(|(n, _, _)| *n).collect();
        for entry in std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/src/scripts"))
            .expect("scripts dir")
        {
            let path = entry.expect("entry").path();
            let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or("");
            if stem != "prelude" && path.extension().is_some_and(|e| e == "lua") {
                assert!(listed.contains(&stem), "{stem}.lua has no ACL entry here");
            }
        }
    }

    #[test]
    fn every_permission_has_probe_arguments() {
        for (p, _) in needed(&[]) {
            assert!(!probe_args(p).is_empty(), "{p} has no probe arguments");
        }
    }

    #[test]
    fn the_lines_reset_then_grant_and_hold_no_password() {
        let lines = setuser_lines("svc", &[Feature::Ids], false).expect("valid");
        assert_eq!(lines.len(), 2);
        assert!(
            lines[0]
                .starts_with("ACL SETUSER svc reset resetchannels on ~rq:* &rq:* +ping +info +get"),
            "{}",
            lines[0]
        );
        assert!(
            !lines[0].contains("config"),
            "no CONFIG GET by default: {}",
            lines[0]
        );
        let with = setuser_lines("svc", &[Feature::Ids], true).expect("valid");
        assert!(with[0].ends_with(" +config|get"), "{}", with[0]);
        assert_eq!(lines[1], "ACL SETUSER svc +get +set");
        assert!(lines
            .iter()
            .all(|l| !l.contains('>') && !l.contains("nopass")));
        assert_eq!(setuser_lines("svc", &[], false).expect("valid").len(), 6);
        for bad in ["", "a b", "x;FLUSHALL", "ü", &"u".repeat(129)] {
            assert!(setuser_lines(bad, &[], false).is_err(), "{bad:?} accepted");
        }
        assert!(Feature::parse("IDS").is_ok());
        assert!(Feature::parse("locks ").is_ok());
        let e = Feature::parse("lock").expect_err("unknown");
        assert!(
            e.to_string()
                .contains("ids, locks, election, indexing, distribution"),
            "{e}"
        );
    }
}
