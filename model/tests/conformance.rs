//! The models follow the code: the same calls run through a model's node step and through the
//! real Lua script on a real `redis-server`, and the replies and stored values must agree.

use redquorum_model::ids::{propose, Register, Reply};
use redquorum_testkit::LocalNodes;

/// `src/scripts/id_propose.lua` as the library sends it (the prelude first).
const ID_PROPOSE: &str = concat!(
    include_str!("../../src/scripts/prelude.lua"),
    include_str!("../../src/scripts/id_propose.lua")
);

/// One call of the script with two proposals, as the library batches sequences due together:
/// another sequence's block first (it must change nothing about this one), then
/// `base..=last` of the conformance sequence, whose status and value are returned.
fn propose_real(
    script: &redis::Script,
    con: &mut redis::Connection,
    base: u64,
    last: u64,
    expected: &str,
) -> (i64, u64) {
    let flat: Vec<i64> = script
        .key("rq:marker")
        .key("rq:id:other")
        .key("rq:id:conformance")
        .arg(expected)
        .arg(base)
        .arg(last)
        .arg(base)
        .arg(last)
        .invoke(con)
        .expect("the script runs");
    assert_eq!(flat.len(), 4, "two integers per proposal: {flat:?}");
    (flat[2], flat[3] as u64)
}

#[test]
fn the_id_models_node_step_answers_as_id_propose_lua_does() {
    let nodes = LocalNodes::start(1);
    let mut con = redis::Client::open(nodes.url(0))
        .expect("url")
        .get_connection()
        .expect("connects");
    let script = redis::Script::new(ID_PROPOSE);
    let marker = "run-a";
    let _: () = redis::cmd("SET")
        .arg("rq:marker")
        .arg(marker)
        .query(&mut con)
        .expect("marker set");
    let mut model = Register {
        value: 0,
        marked: true,
    };
    // (base, last, expected marker): accepted, behind, equal, a jump, a stale marker, the
    // test-only "*", then the marker lost (as after a wipe).
    let calls: &[(u64, u64, &str)] = &[
        (1, 2, marker),
        (1, 1, marker),
        (2, 5, marker),
        (3, 3, marker),
        (6, 6, marker),
        (100, 120, marker),
        (121, 121, "run-b"),
        (121, 130, "*"),
        (125, 125, marker),
        (131, 131, marker),
    ];
    for (i, &(base, last, expected)) in calls.iter().enumerate() {
        let (status, value) = propose_real(&script, &mut con, base, last, expected);
        let real = match status {
            1 => Reply::Accepted { previous: value },
            0 => Reply::Behind { current: value },
            _ => Reply::Refused { current: value },
        };
        let mut reg = model;
        reg.marked = expected == "*" || expected == marker;
        let modelled = propose(&mut reg, base, last, expected != "*");
        model.value = reg.value;
        assert_eq!(
            real, modelled,
            "call {i} ({base}..={last}, marker {expected:?}): the script and the model differ"
        );
        let stored: u64 = redis::cmd("GET")
            .arg("rq:id:conformance")
            .query(&mut con)
            .expect("get");
        assert_eq!(stored, model.value, "call {i}: the stored values differ");
    }
    // The marker lost (a wipe): every proposal is refused until repair marks the node.
    let _: () = redis::cmd("DEL")
        .arg("rq:marker")
        .query(&mut con)
        .expect("del");
    let (status, _) = propose_real(&script, &mut con, 500, 500, marker);
    let mut wiped = Register {
        value: model.value,
        marked: false,
    };
    assert_eq!(
        propose(&mut wiped, 500, 500, true),
        Reply::Refused {
            current: model.value
        }
    );
    assert_eq!(status, -1, "a node without its marker must refuse");
}
