//! The lease model follows the code: sequences of calls run through the real scripts
//! (`lock_acquire.lua`, `lock_extend.lua`, `lock_release.lua` in its four modes,
//! `restore.lua` in lease mode, `fenced_set.lua`) on a real `redis-server` and through the
//! model's node steps, and every reply and every stored register must agree: a written story
//! that visits each branch, then seeded pseudo-random sequences.

use redquorum_model::leases::{
    self, fenced_set, lock_acquire, lock_collect, lock_extend, lock_release, lock_undo,
    restore_lease, Ask, Data, Grant, Key, Release, Status, BLOCKER,
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
        let (v, n, prev): (Option<String>, Option<u8>, Option<u8>) = redis::cmd("HMGET")
            .arg(LOCK)
            .arg("v")
            .arg("n")
            .arg("p")
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
            prev,
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

    /// `lock_release.lua` in mode `mode` (`None`: no ARGV[3], as an older client sends it).
    fn release(&mut self, value: u8, token: u8, mode: Option<Release>) -> bool {
        let mut call = self.release.prepare_invoke();
        call.key(LOCK)
            .key(FENCE)
            .key(FLOOR)
            .arg(value_text(value, token))
            .arg("rq:released:conformance");
        match mode {
            Some(Release::Fold) => call.arg("fold"),
            Some(Release::Keep) => call.arg("keep"),
            None => &mut call,
        };
        let r: i64 = call.invoke(&mut self.con).expect("lock_release.lua runs");
        r == 1
    }

    /// `lock_release.lua` in mode `"undo"`: its status (2 rolled back, 1 folded, 0 not ours).
    fn undo(&mut self, value: u8, token: u8) -> i8 {
        let r: i64 = self
            .release
            .key(LOCK)
            .key(FENCE)
            .key(FLOOR)
            .arg(value_text(value, token))
            .arg("rq:released:conformance")
            .arg("undo")
            .arg(token)
            .invoke(&mut self.con)
            .expect("lock_release.lua runs in mode undo");
        r as i8
    }

    /// `lock_release.lua` in mode `"collect"` (no value; the marker checked).
    fn collect(&mut self, expect: Option<u8>) -> i8 {
        let r: i64 = self
            .release
            .key(LOCK)
            .key(FENCE)
            .key(FLOOR)
            .key(MARKER)
            .arg("")
            .arg("rq:released:conformance")
            .arg("collect")
            .arg(marker_text(expect))
            .invoke(&mut self.con)
            .expect("lock_release.lua runs in mode collect");
        r as i8
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
    /// Value, token, mode (`None`: no ARGV[3], which the script takes as `"fold"`).
    Release(u8, u8, Option<Release>),
    Collect(Option<u8>),
    /// A round's undo of value, token.
    Undo(u8, u8),
    Restore(Key),
    Raise(u8),
    SetMarker(Option<u8>),
}

/// Apply `call` to the node and to the model: their replies, as text. `tokens[v]` is the
/// token inside value `v`.
fn apply(real: &mut Real, model: &mut Data, call: Call, tokens: &[u8]) -> (String, String) {
    match call {
        Call::Acquire(value, token, expect, ask) => {
            let m = lock_acquire(model, value, token, expect, ask);
            let r = real.acquire(value, token, expect, ask, tokens);
            (format!("{m:?}"), format!("{r:?}"))
        }
        Call::Extend(value, version, token, expect) => {
            let m = lock_extend(model, value, version, token, expect);
            let r = real.extend(value, version, token, expect);
            (m.to_string(), r.to_string())
        }
        Call::Release(value, token, mode) => {
            let m = lock_release(model, value, mode.unwrap_or(Release::Fold));
            let r = real.release(value, token, mode);
            (m.to_string(), r.to_string())
        }
        Call::Undo(value, token) => {
            let m = lock_undo(model, value, token, false);
            let r = real.undo(value, token);
            (m.to_string(), r.to_string())
        }
        Call::Collect(expect) => {
            let m = lock_collect(model, expect);
            let r = real.collect(expect);
            (m.to_string(), r.to_string())
        }
        Call::Restore(copy) => {
            let m = restore_lease(model, copy);
            let r = real.restore(copy);
            (m.to_string(), r.to_string())
        }
        Call::Raise(fence) => {
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
        Call::SetMarker(run) => {
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
    }
}

/// Apply `call` to both, and require the same reply and the same stored registers.
fn check(real: &mut Real, model: &mut Data, call: Call, tokens: &[u8], what: &str) {
    let (modelled, actual) = apply(real, model, call, tokens);
    assert_eq!(
        modelled, actual,
        "{what}, {call:?}: the model's reply differs from the script's"
    );
    let stored = real.data();
    assert_eq!(
        *model, stored,
        "{what}, {call:?}: the model stores something else than the node"
    );
}

fn start() -> (LocalNodes, Real) {
    let nodes = LocalNodes::start(1);
    let con = redis::Client::open(nodes.url(0))
        .expect("url")
        .get_connection()
        .expect("connects");
    let real = Real {
        con,
        acquire: script!("lock_acquire.lua"),
        extend: script!("lock_extend.lua"),
        release: script!("lock_release.lua"),
        restore: script!("restore.lua"),
        raise: script!("raise.lua"),
        fenced: script!("fenced_set.lua"),
    };
    (nodes, real)
}

#[test]
fn the_lease_models_node_steps_answer_as_the_lease_scripts_do() {
    let (_nodes, mut real) = start();
    let run = Some(1);
    // The token of each value (values are fresh per acquisition round; the token is inside).
    let tokens: [u8; 9] = [0, 1, 2, 2, 3, 5, 4, 7, 8];
    use Ask::*;
    use Call::*;
    const KEEP: Option<leases::Release> = Some(leases::Release::Keep);
    const FOLD: Option<leases::Release> = Some(leases::Release::Fold);
    let story: Vec<(&str, Call)> = vec![
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
        ("the old holder cannot release (keep)", Release(1, 1, KEEP)),
        ("the old holder cannot release (fold)", Release(1, 1, FOLD)),
        (
            "the new holder releases, keeping the fence key",
            Release(3, 2, KEEP),
        ),
        (
            "an extension re-creates a missing copy beside a kept fence key",
            Extend(3, 2, 2, run),
        ),
        ("no collect beside a copy", Collect(run)),
        ("released again, folding", Release(3, 2, FOLD)),
        ("no collect without a fence key", Collect(run)),
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
        ("released, keeping the fence key", Release(4, 3, KEEP)),
        ("no collect on another incarnation", Collect(Some(9))),
        ("a collect folds the kept fence key", Collect(run)),
        (
            "restored: the script reads the fence key, not the floor",
            Restore(Key {
                value: 1,
                token: 1,
                version: 4,
            }),
        ),
        (
            "released by an older client (no mode: fold)",
            Release(1, 1, None),
        ),
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
        ("released, keeping the fence key", Release(5, 6, KEEP)),
        (
            "the next grant counts from the kept fence key",
            Acquire(6, 6, run, Absent),
        ),
        ("a grant above it rewrites it", Acquire(7, 7, run, Absent)),
        ("released, keeping the fence key", Release(7, 7, KEEP)),
        ("the test-only \"*\" skips the marker", Collect(None)),
        ("once", Collect(run)),
        (
            "a round granted above the kept fence key",
            Acquire(8, 8, run, Absent),
        ),
        (
            "its undo rolls it back: no fence key again (the floor kept)",
            Undo(8, 8),
        ),
        (
            "a round granted above the floor",
            Acquire(8, 8, run, Absent),
        ),
        ("the holder extends it (version 2)", Extend(8, 2, 8, run)),
        ("an extended copy is folded, not rolled back", Undo(8, 8)),
        ("no undo of a value the node does not hold", Undo(8, 8)),
        ("granted again", Acquire(8, 9, run, Absent)),
        ("the repair raises the fence key past it", Raise(10)),
        ("a raised fence key is folded, not rolled back", Undo(8, 9)),
        (
            "restored after a raise: a copy without p",
            Restore(Key {
                value: 8,
                token: 10,
                version: 1,
            }),
        ),
        ("a restored copy is folded, not rolled back", Undo(8, 10)),
        (
            "the node restarted: its marker names the old run",
            SetMarker(Some(0)),
        ),
        ("a stale marker refuses a grant", Acquire(8, 8, run, Absent)),
        ("a stale marker refuses an extension", Extend(7, 4, 7, run)),
        ("a stale marker refuses a collect", Collect(run)),
        ("the marker lost with the data", SetMarker(None)),
        ("no marker refuses a grant", Acquire(8, 8, run, Absent)),
        ("no marker refuses a collect", Collect(run)),
    ];
    let mut model = Data::default();
    for (i, (story, call)) in story.iter().enumerate() {
        check(
            &mut real,
            &mut model,
            *call,
            &tokens,
            &format!("call {i} ({story})"),
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

/// xorshift64*: a fixed seed gives the same sequence on every run (no dependency).
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 32) % n
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

/// How often the random sequences reached the branches of the three release modes.
#[derive(Debug, Default)]
struct Reached {
    calls: u32,
    granted: u32,
    kept: u32,
    folded: u32,
    collected: u32,
    collect_refused: u32,
    collect_beside_copy: u32,
    collect_without_fence: u32,
    rolled_back: u32,
    undo_folded: u32,
}

/// A call drawn from the node's current state (the model's, equal to the node's): fresh
/// values for acquisitions (their tokens around the fence, recorded in `tokens`), the held
/// value or an older one for extensions and releases, each release mode, collects, and now
/// and then a raise, a restore or a marker change.
fn draw(rng: &mut Rng, d: &Data, tokens: &mut [u8; 256], next: &mut u8) -> Call {
    let run = Some(1);
    let expect = match rng.below(20) {
        0 => None,
        1 => Some(9),
        _ => run,
    };
    let base = d.fence.max(d.floor);
    // A value this node may hold or have held: the held one (not a blocker, which no client
    // holds) or any issued before.
    let held = d.key.map(|k| k.value).filter(|&v| v != BLOCKER);
    let issued = *next - 1;
    let some_value = |rng: &mut Rng| match held {
        Some(v) if rng.chance(70) => v,
        _ => 1 + rng.below(u64::from(issued)) as u8,
    };
    // Nothing issued yet: an acquisition first (the other calls name an issued value).
    let r = if issued == 0 { 0 } else { rng.below(100) };
    if r < 35 {
        let value = *next;
        *next += 1;
        // At, just above, or (rarely) below the fence: refused, granted, refused.
        let token = match rng.below(10) {
            0 => base.saturating_sub(1),
            1..=3 => base,
            _ => base + 1,
        }
        .max(1);
        tokens[value as usize] = token;
        let ask = match (d.key, rng.below(3)) {
            (_, 0) => Ask::Read,
            (Some(k), _) => Ask::Swap {
                value: k.value,
                version: k.version + u8::from(rng.chance(10)),
            },
            (None, _) => Ask::Absent,
        };
        return Call::Acquire(value, token, expect, ask);
    }
    if r < 48 {
        let value = some_value(rng);
        let version = 1 + rng.below(4) as u8;
        return Call::Extend(value, version, tokens[value as usize], expect);
    }
    if r < 70 {
        let value = some_value(rng);
        let mode = match rng.below(5) {
            0 => None,
            1 | 2 => Some(Release::Fold),
            _ => Some(Release::Keep),
        };
        return Call::Release(value, tokens[value as usize], mode);
    }
    if r < 76 {
        let value = some_value(rng);
        return Call::Undo(value, tokens[value as usize]);
    }
    if r < 92 {
        return Call::Collect(expect);
    }
    if r < 95 {
        return Call::Raise(base + 1 + rng.below(2) as u8);
    }
    if r < 98 {
        let value = 1 + rng.below(u64::from(issued)) as u8;
        return Call::Restore(Key {
            value,
            token: tokens[value as usize],
            version: 1 + rng.below(3) as u8,
        });
    }
    Call::SetMarker(match rng.below(10) {
        0 => None,
        1 | 2 => Some(0),
        _ => run,
    })
}

#[test]
fn the_lease_models_node_steps_answer_as_the_lease_scripts_do_on_random_sequences() {
    let (_nodes, mut real) = start();
    let mut reached = Reached::default();
    for seed in [0x5eed_0001_u64, 0x5eed_0002, 0x5eed_0003, 0x5eed_0004] {
        redis::cmd("FLUSHALL")
            .query::<()>(&mut real.con)
            .expect("FLUSHALL");
        let mut rng = Rng(seed);
        let mut model = Data::default();
        check(
            &mut real,
            &mut model,
            Call::SetMarker(Some(1)),
            &[],
            "the node is verified",
        );
        let mut tokens = [0u8; 256];
        let mut next = 1u8;
        for i in 0..250 {
            // Values and tokens are u8 in the model: stop well before either runs out.
            if next > 200 || model.fence.max(model.floor) > 200 {
                break;
            }
            let before = model;
            let call = draw(&mut rng, &model, &mut tokens, &mut next);
            check(
                &mut real,
                &mut model,
                call,
                &tokens,
                &format!("seed {seed:#x}, call {i} (state before: {before:?})"),
            );
            let changed = model != before;
            reached.calls += 1;
            if matches!(call, Call::Acquire(..)) && changed {
                reached.granted += 1;
            }
            match call {
                Call::Release(_, _, Some(Release::Keep)) if changed => reached.kept += 1,
                Call::Release(_, _, _) if changed => reached.folded += 1,
                Call::Collect(_) if changed => reached.collected += 1,
                Call::Undo(value, token) if changed => {
                    match lock_undo(&mut before.clone(), value, token, false) {
                        2 => reached.rolled_back += 1,
                        _ => reached.undo_folded += 1,
                    }
                }
                Call::Collect(e) if e.is_some() && before.marker != e => {
                    reached.collect_refused += 1
                }
                Call::Collect(_) if before.key.is_some() && before.fence > 0 => {
                    reached.collect_beside_copy += 1
                }
                Call::Collect(_) if before.key.is_none() => reached.collect_without_fence += 1,
                _ => {}
            }
        }
    }
    println!("random sequences reached: {reached:?}");
    assert!(
        reached.kept > 0
            && reached.folded > 0
            && reached.collected > 0
            && reached.collect_refused > 0
            && reached.collect_beside_copy > 0
            && reached.collect_without_fence > 0
            && reached.rolled_back > 0
            && reached.undo_folded > 0,
        "the random sequences missed a branch of lock_release.lua's modes: {reached:?}"
    );
}
