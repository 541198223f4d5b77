//! The lease model follows the code: one sequence of calls runs through the real scripts
//! (`lock_acquire.lua`, `lock_extend.lua`, `lock_release.lua`, `restore.lua` in lease mode,
//! `fenced_set.lua`) on a real `redis-server` and through the model's node steps, and every
//! reply and every stored register must agree.

use redquorum_model::leases::{
    fenced_set, lock_acquire, lock_extend, lock_release, restore_lease, Ask, Data, Grant, Key,
    Status, BLOCKER,
};
use redquorum_testkit::LocalNodes;

macro_rules! script {
    ($name:literal) => {
        redis::Script::new(concat!(
            include_str!("../../src/scripts/prelude.lua"),
            include_str!(concat!("../../src/scripts/", $name))
        ))
    };
}

const LOCK: &str = "rq:lock:conformance";
const FENCE: &str = "rq:fence:conformance";
const MARKER: &str = "rq:marker";
const FLOOR: &str = "rq:floor:7";
const OLD_FLOOR: &str = "rq:floor";

/// A model value as the library writes it: 128 random bits in hex, the token, the holder; the
/// model's [`BLOCKER`] as `restore.lua` writes it.
fn value_text(value: u8, token: u8) -> String {
    if value == BLOCKER {
        return format!("repair-blocker:{token}:{BLOCKER_TEXT}");
    }
    format!("{value:032x}:{token}:conformance")
}

/// A stored lease value in the model's terms (the inverse of [`value_text`]).
fn parse_key(v: &str, version: u8) -> Key {
    let mut parts = v.split(':');
    let head = parts.next().expect("value");
    let value = if head == "repair-blocker" {
        BLOCKER
    } else {
        u8::from_str_radix(head, 16).expect("hex")
    };
    Key {
        value,
        token: parts.next().expect("token").parse().expect("token"),
        version,
    }
}

/// The holder text of a blocker, as the repair passes it to `restore.lua`.
const BLOCKER_TEXT: &str = "unknown";

fn marker_text(run: Option<u8>) -> String {
    run.map_or("*".to_string(), |r| format!("run-{r}"))
}

struct Real {
    con: redis::Connection,
    acquire: redis::Script,
    extend: redis::Script,
    release: redis::Script,
    restore: redis::Script,
    raise: redis::Script,
    fenced: redis::Script,
}

impl Real {
    fn get(&mut self, key: &str) -> u8 {
        let v: Option<u8> = redis::cmd("GET")
            .arg(key)
            .query(&mut self.con)
            .expect("GET");
        v.unwrap_or(0)
    }

    /// What the node stores, read back into the model's terms.
    fn data(&mut self) -> Data {
        let (v, n): (Option<String>, Option<u8>) = redis::cmd("HMGET")
            .arg(LOCK)
            .arg("v")
            .arg("n")
            .query(&mut self.con)
            .expect("HMGET");
        let key = v.map(|v| parse_key(&v, n.expect("version")));
        let marker: Option<String> = redis::cmd("GET")
            .arg(MARKER)
            .query(&mut self.con)
            .expect("GET");
        Data {
            key,
            fence: self.get(FENCE),
            floor: self.get(FLOOR).max(self.get(OLD_FLOOR)),
            marker: marker.map(|m| m.trim_start_matches("run-").parse().expect("run")),
        }
    }

    fn acquire(
        &mut self,
        value: u8,
        token: u8,
        expect: Option<u8>,
        ask: Ask,
        tokens: &[u8],
    ) -> Grant {
        let (mode, ev, en) = match ask {
            Ask::Absent => ("absent", String::new(), 0),
            Ask::Read => ("read", String::new(), 0),
            Ask::Swap { value, version } if value == BLOCKER => {
                let current: String = redis::cmd("HGET")
                    .arg(LOCK)
                    .arg("v")
                    .query(&mut self.con)
                    .expect("HGET");
                ("swap", current, version)
            }
            Ask::Swap { value, version } => {
                ("swap", value_text(value, tokens[value as usize]), version)
            }
        };
        let (status, fence, cur, version, _ttl): (i64, u8, String, u8, u64) = self
            .acquire
            .key(LOCK)
            .key(FENCE)
            .key(MARKER)
            .key(FLOOR)
            .key(OLD_FLOOR)
            .arg(value_text(value, token))
            .arg(1000)
            .arg(token)
            .arg(marker_text(expect))
            .arg(mode)
            .arg(ev)
            .arg(en)
            .arg("")
            .invoke(&mut self.con)
            .expect("lock_acquire.lua runs");
        let key = (!cur.is_empty()).then(|| parse_key(&cur, version));
        Grant {
            status: match status {
                1 => Status::Granted,
                0 => Status::NotAsExpected,
                -2 => Status::TokenLow,
                _ => Status::Refused,
            },
            fence,
            key,
        }
    }

    /// `lock_extend.lua` with a batch of two leases: another lock's first (it must not change
    /// anything about this one), then this one, whose status is returned.
    fn extend(&mut self, value: u8, version: u8, token: u8, expect: Option<u8>) -> i8 {
        let reply: redis::Value = self
            .extend
            .key(MARKER)
            .key(OLD_FLOOR)
            .key("rq:lock:other")
            .key("rq:fence:other")
            .key(FLOOR)
            .key(LOCK)
            .key(FENCE)
            .key(FLOOR)
            .arg(marker_text(expect))
            .arg("")
            .arg("another-holder")
            .arg(1)
            .arg(1000)
            .arg(1)
            .arg(value_text(value, token))
            .arg(version)
            .arg(1000)
            .arg(token)
            .invoke(&mut self.con)
            .expect("lock_extend.lua runs");
        match reply {
            redis::Value::Int(status) => status as i8,
            redis::Value::Array(statuses) => match statuses.get(1) {
                Some(redis::Value::Int(status)) => *status as i8,
                other => panic!("lock_extend.lua: no status for the lease: {other:?}"),
            },
            other => panic!("lock_extend.lua: unexpected reply {other:?}"),
        }
    }

    fn release(&mut self, value: u8, token: u8) -> bool {
        let r: i64 = self
            .release
            .key(LOCK)
            .key(FENCE)
            .key(FLOOR)
            .arg(value_text(value, token))
            .arg("rq:released:conformance")
            .invoke(&mut self.con)
            .expect("lock_release.lua runs");
        r == 1
    }

    fn restore(&mut self, copy: Key) -> bool {
        let r: i64 = self
            .restore
            .key("rq:repairing")
            .key(LOCK)
            .key(FENCE)
            .arg("*") // the claim check is tested in the library's own tests
            .arg("lease")
            .arg(value_text(copy.value, copy.token))
            .arg(copy.version)
            .arg(1000)
            .arg(copy.token)
            .arg(BLOCKER_TEXT)
            .invoke(&mut self.con)
            .expect("restore.lua runs");
        r == 1
    }

    fn fenced_set(&mut self, token: u8) -> bool {
        let (applied, _): (i64, u64) = self
            .fenced
            .key("rq:conformance:resource")
            .key("rq:conformance:resource:fence")
            .arg(token)
            .arg("written")
            .invoke(&mut self.con)
            .expect("fenced_set.lua runs");
        applied == 1
    }
}

/// One call, applied to both.
#[derive(Clone, Copy, Debug)]
enum Call {
    Acquire(u8, u8, Option<u8>, Ask),
    Extend(u8, u8, u8, Option<u8>),
    Release(u8, u8),
    Restore(Key),
    Raise(u8),
    SetMarker(Option<u8>),
}

#[test]
fn the_lease_models_node_steps_answer_as_the_lease_scripts_do() {
    let nodes = LocalNodes::start(1);
    let con = redis::Client::open(nodes.url(0))
        .expect("url")
        .get_connection()
        .expect("connects");
    let mut real = Real {
        con,
        acquire: script!("lock_acquire.lua"),
        extend: script!("lock_extend.lua"),
        release: script!("lock_release.lua"),
        restore: script!("restore.lua"),
        raise: script!("raise.lua"),
        fenced: script!("fenced_set.lua"),
    };
    let run = Some(1);
    // The token of each value (values are fresh per acquisition round; the token is inside).
    let tokens: [u8; 8] = [0, 1, 2, 2, 3, 5, 4, 6];
    use Ask::*;
    use Call::*;
    let calls: Vec<(&str, Call)> = vec![
        ("the node is verified", SetMarker(run)),
        ("a free lock is granted", Acquire(1, 1, run, Absent)),
        ("a held lock is not free", Acquire(2, 2, run, Absent)),
        ("a read changes nothing", Acquire(2, 2, run, Read)),
        (
            "a swap of another version is refused",
            Acquire(
                2,
                2,
                run,
                Swap {
                    value: 1,
                    version: 2,
                },
            ),
        ),
        ("the holder extends to version 2", Extend(1, 2, 1, run)),
        ("an older extension changes nothing", Extend(1, 2, 1, run)),
        ("another value cannot extend", Extend(3, 2, 2, run)),
        (
            "a swap whose token is not above the fence",
            Acquire(
                2,
                1,
                run,
                Swap {
                    value: 1,
                    version: 2,
                },
            ),
        ),
        (
            "a swap on another incarnation",
            Acquire(
                2,
                2,
                Some(9),
                Swap {
                    value: 1,
                    version: 2,
                },
            ),
        ),
        (
            "the watched state is swapped",
            Acquire(
                3,
                2,
                run,
                Swap {
                    value: 1,
                    version: 2,
                },
            ),
        ),
        ("the old holder cannot extend", Extend(1, 3, 1, run)),
        ("the old holder cannot release", Release(1, 1)),
        ("the new holder releases", Release(3, 2)),
        (
            "an extension re-creates a missing copy",
            Extend(3, 2, 2, run),
        ),
        ("released again", Release(3, 2)),
        ("no re-creation below the floor", Extend(1, 4, 1, run)),
        (
            "the test-only \"*\" skips the marker",
            Acquire(4, 3, None, Absent),
        ),
        (
            "no restore over a copy",
            Restore(Key {
                value: 5,
                token: 5,
                version: 1,
            }),
        ),
        ("released", Release(4, 3)),
        (
            "restored: the script reads the fence key, not the floor",
            Restore(Key {
                value: 1,
                token: 1,
                version: 4,
            }),
        ),
        ("released", Release(1, 1)),
        ("the repair raises the fence key", Raise(5)),
        (
            "below the fence key: a blocker with the fence's token",
            Restore(Key {
                value: 6,
                token: 4,
                version: 1,
            }),
        ),
        (
            "no restore over the blocker",
            Restore(Key {
                value: 5,
                token: 5,
                version: 2,
            }),
        ),
        ("nobody extends the blocker", Extend(5, 3, 5, run)),
        (
            "a watcher takes the blocker over",
            Acquire(
                5,
                6,
                run,
                Swap {
                    value: BLOCKER,
                    version: 1,
                },
            ),
        ),
        ("the new holder extends", Extend(5, 3, 6, run)),
        ("released", Release(5, 6)),
        (
            "the node restarted: its marker names the old run",
            SetMarker(Some(0)),
        ),
        ("a stale marker refuses a grant", Acquire(7, 6, run, Absent)),
        ("a stale marker refuses an extension", Extend(5, 4, 5, run)),
        ("the marker lost with the data", SetMarker(None)),
        ("no marker refuses a grant", Acquire(7, 6, run, Absent)),
    ];
    let mut model = Data::default();
    for (i, (story, call)) in calls.iter().enumerate() {
        let (modelled, actual) = match *call {
            Acquire(value, token, expect, ask) => {
                let m = lock_acquire(&mut model, value, token, expect, ask);
                let r = real.acquire(value, token, expect, ask, &tokens);
                (format!("{m:?}"), format!("{r:?}"))
            }
            Extend(value, version, token, expect) => {
                let m = lock_extend(&mut model, value, version, token, expect);
                let r = real.extend(value, version, token, expect);
                (m.to_string(), r.to_string())
            }
            Release(value, token) => {
                let m = lock_release(&mut model, value);
                let r = real.release(value, token);
                (m.to_string(), r.to_string())
            }
            Restore(copy) => {
                let m = restore_lease(&mut model, copy);
                let r = real.restore(copy);
                (m.to_string(), r.to_string())
            }
            Raise(fence) => {
                model.fence = model.fence.max(fence);
                let _: i64 = real
                    .raise
                    .key("rq:repairing")
                    .arg("*")
                    .key(FENCE)
                    .arg(fence)
                    .invoke(&mut real.con)
                    .expect("raise.lua runs");
                (String::new(), String::new())
            }
            SetMarker(run) => {
                match run {
                    Some(r) => redis::cmd("SET")
                        .arg(MARKER)
                        .arg(marker_text(Some(r)))
                        .query::<()>(&mut real.con),
                    None => redis::cmd("DEL").arg(MARKER).query::<()>(&mut real.con),
                }
                .expect("marker written");
                model.marker = run;
                (String::new(), String::new())
            }
        };
        assert_eq!(
            modelled, actual,
            "call {i} ({story}, {call:?}): the model's reply differs from the script's"
        );
        let stored = real.data();
        assert_eq!(
            model, stored,
            "call {i} ({story}, {call:?}): the model stores something else than the node"
        );
    }
    // The resource guard.
    let mut highest = 0;
    for (token, story) in [
        (1, "first"),
        (3, "newer"),
        (2, "stale"),
        (3, "equal"),
        (4, "newer"),
    ] {
        assert_eq!(
            fenced_set(&mut highest, token),
            real.fenced_set(token),
            "fenced_set with token {token} ({story}): the model differs from the script"
        );
    }
}
