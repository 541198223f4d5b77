//! The view model follows the code: the same calls run through the model's node steps and
//! through the real Lua scripts on a real `redis-server`, and the replies and stored values
//! must agree: `view_write.lua` (the view register) and `record.lua` (the acknowledgements).

use redquorum_model::views::{
    record, view_write, AckRecord, Base, RecordReply, ViewRegister, WriteReply,
};
use redquorum_testkit::LocalNodes;

/// `src/scripts/view_write.lua` as the library sends it (the prelude first).
const VIEW_WRITE: &str = concat!(
    include_str!("../../src/scripts/prelude.lua"),
    include_str!("../../src/scripts/view_write.lua")
);

/// `src/scripts/record.lua` as the library sends it (the prelude first).
const RECORD: &str = concat!(
    include_str!("../../src/scripts/prelude.lua"),
    include_str!("../../src/scripts/record.lua")
);

const MARKER: &str = "run-a";

fn connect(nodes: &LocalNodes) -> redis::Connection {
    let mut con = redis::Client::open(nodes.url(0))
        .expect("url")
        .get_connection()
        .expect("connects");
    let _: () = redis::cmd("SET")
        .arg("rq:marker")
        .arg(MARKER)
        .query(&mut con)
        .expect("marker set");
    con
}

/// A view's digest as stored: 16 hex digits (the model names a content by a number).
fn digest(hash: u64) -> String {
    format!("{hash:016x}")
}

/// One call of `view_write.lua`: the view's token, its content (by number), its base (`None`:
/// the test-only `"-"`), and the marker the caller expects (`"*"`: none).
struct Write {
    what: &'static str,
    token: u64,
    hash: u64,
    base: Option<u64>,
    marker: &'static str,
}

#[test]
fn the_view_models_node_step_answers_as_view_write_lua_does() {
    let nodes = LocalNodes::start(1);
    let mut con = connect(&nodes);
    let script = redis::Script::new(VIEW_WRITE);
    let key = "rq:view:conformance";
    let w = |what, token, hash, base, marker| Write {
        what,
        token,
        hash,
        base,
        marker,
    };
    let calls = [
        w("the first view is stored", 17, 1, Some(0), MARKER),
        w(
            "the same view again is already held",
            17,
            1,
            Some(0),
            MARKER,
        ),
        w(
            "a view derived from the one held is stored",
            18,
            2,
            Some(17),
            MARKER,
        ),
        w(
            "a sibling derived from an older base is refused",
            19,
            3,
            Some(17),
            MARKER,
        ),
        w(
            "another view at the held version is a fork, refused",
            18,
            4,
            Some(17),
            MARKER,
        ),
        w("a stale marker may not vote", 19, 3, Some(18), "run-b"),
        w(
            "the held view again is already held",
            18,
            2,
            Some(17),
            MARKER,
        ),
        w(
            "an older view is refused: a newer one is present",
            17,
            1,
            Some(0),
            MARKER,
        ),
        w(
            "a view whose base is above the one held is stored",
            20,
            5,
            Some(19),
            MARKER,
        ),
        w(
            "\"-\": an equal token counts as held, content unchanged",
            20,
            6,
            None,
            MARKER,
        ),
        w("\"-\": a lower token is refused", 19, 7, None, MARKER),
        w(
            "\"-\": a higher token is stored, whatever its base",
            21,
            8,
            None,
            MARKER,
        ),
        w(
            "a base not below the token is an error",
            22,
            9,
            Some(22),
            MARKER,
        ),
        w("a token of 0 is an error", 0, 9, Some(0), MARKER),
        w(
            "\"*\" (repair) skips the marker check",
            22,
            9,
            Some(21),
            "*",
        ),
    ];
    let mut model = ViewRegister {
        token: 0,
        hash: 0,
        marked: true,
    };
    for (i, c) in calls.iter().enumerate() {
        let base = c.base.map_or("-".to_string(), |b| b.to_string());
        let real: Result<(i64, u64), redis::RedisError> = script
            .key(key)
            .key("rq:marker")
            .arg(c.token)
            .arg(format!("{{\"view\":{}}}", c.hash))
            .arg(digest(c.hash))
            .arg(&base)
            .arg(c.marker)
            .invoke(&mut con);
        let real = match real {
            Ok((1, v)) => WriteReply::Held { previous: v },
            Ok((0, v)) => WriteReply::Newer { current: v },
            Ok((-2, v)) => WriteReply::Fork { current: v },
            Ok((-1, v)) => WriteReply::Refused { current: v },
            Ok(other) => panic!("call {i} ({}): unexpected reply {other:?}", c.what),
            Err(e) if e.to_string().contains("bad token") => WriteReply::BadToken,
            Err(e) if e.to_string().contains("bad base") => WriteReply::BadBase,
            Err(e) => panic!("call {i} ({}): the script failed: {e}", c.what),
        };
        model.marked = c.marker == "*" || c.marker == MARKER;
        let base = c.base.map_or(Base::Forkable, Base::Token);
        let modelled = view_write(&mut model, c.token, c.hash, base, c.marker != "*");
        assert_eq!(
            real, modelled,
            "call {i} ({}): the script and the model answer differently",
            c.what
        );
        let (token, hash): (Option<u64>, Option<String>) = redis::cmd("HMGET")
            .arg(key)
            .arg("token")
            .arg("hash")
            .query(&mut con)
            .expect("hmget");
        assert_eq!(
            (token.unwrap_or(0), hash.unwrap_or_else(|| digest(0))),
            (model.token, digest(model.hash)),
            "call {i} ({}): the stored views differ",
            c.what
        );
    }
    // The marker lost (as after a wipe): every write is refused until repair marks the node.
    let _: () = redis::cmd("DEL")
        .arg("rq:marker")
        .query(&mut con)
        .expect("del");
    let (status, current): (i64, u64) = script
        .key(key)
        .key("rq:marker")
        .arg(23u64)
        .arg("{}")
        .arg(digest(10))
        .arg("22")
        .arg(MARKER)
        .invoke(&mut con)
        .expect("the script runs");
    model.marked = false;
    assert_eq!(
        view_write(&mut model, 23, 10, Base::Token(22), true),
        WriteReply::Refused { current }
    );
    assert_eq!(status, -1, "a node without its marker must refuse");
}

#[test]
fn the_view_models_acknowledgement_step_answers_as_record_lua_does() {
    let nodes = LocalNodes::start(1);
    let mut con = connect(&nodes);
    let script = redis::Script::new(RECORD);
    let key = "rq:ack:conformance";
    let member = "a#1";
    let companion = "a#1#h";
    // (what, token, digest, marker)
    let calls: &[(&str, u64, u64, &str)] = &[
        ("the first acknowledgement is recorded", 18, 2, MARKER),
        ("a later view's acknowledgement raises it", 20, 5, MARKER),
        (
            "an older one never lowers it, but names its content",
            18,
            2,
            MARKER,
        ),
        ("a stale marker may not vote", 21, 8, "run-b"),
        ("\"*\" skips the marker check", 21, 8, "*"),
    ];
    let mut model = AckRecord::default();
    for (i, &(what, token, hash, marker)) in calls.iter().enumerate() {
        let (status, value): (i64, u64) = script
            .key(key)
            .key("rq:marker")
            .arg(member)
            .arg(token)
            .arg(marker)
            .arg(companion)
            .arg(format!("{token}:{}", digest(hash)))
            .invoke(&mut con)
            .expect("the script runs");
        let real = match status {
            1 => RecordReply::Recorded { previous: value },
            _ => RecordReply::Refused { current: value },
        };
        let marked = marker == "*" || marker == MARKER;
        let modelled = record(&mut model, marked, token, hash, marker != "*");
        assert_eq!(
            real, modelled,
            "call {i} ({what}): the script and the model differ"
        );
        let (field, pair): (Option<u64>, Option<String>) = redis::cmd("HMGET")
            .arg(key)
            .arg(member)
            .arg(companion)
            .query(&mut con)
            .expect("hmget");
        let stored = AckRecord {
            token: field.unwrap_or(0),
            companion: pair.and_then(|p| {
                let (t, d) = p.split_once(':')?;
                Some((t.parse().ok()?, u64::from_str_radix(d, 16).ok()?))
            }),
        };
        assert_eq!(
            stored, model,
            "call {i} ({what}): the stored records differ"
        );
    }
}
