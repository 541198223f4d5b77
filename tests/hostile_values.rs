//! Hostile and corrupted values on a node: the scripts parse integers strictly and refuse a
//! corrupted register instead of reading it as 0. The fenced guard's story also runs with the
//! lenient parsing of the earlier release (kept below as text), where it must break.

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

mod common;

use common::{client, init_tracing};
use std::time::Duration;

use redquorum::{IdGenerator, Lock, FENCED_SET_LUA};
use redquorum_testkit::Cluster;

/// The guard as the earlier release shipped it: `tonumber` accepts "nan", and NaN compares
/// false with everything, so `token < highest` never rejects afterwards.
const LENIENT_FENCED_SET: &str = r#"
local token = tonumber(ARGV[1])
if not token or token < 1 or token >= 9007199254740992 then
  return redis.error_reply('ERR rq fenced_set: bad token')
end
local highest = tonumber(redis.call('GET', KEYS[2]) or '0') or 0
if token < highest then
  return {0, highest}
end
redis.call('SET', KEYS[2], ARGV[1])
redis.call('SET', KEYS[1], ARGV[2])
return {1, token}
"#;

/// A writer with token 5 writes; a hostile writer sends "nan"; then a stale writer with token
/// 3. Returns whether the stale write was applied.
async fn stale_write_after_nan(script: &str) -> bool {
    init_tracing();
    let cluster = Cluster::start(1).await;
    let mut con = cluster.node(0).direct_connection().await;
    let guard = redis::Script::new(script);
    let run = |token: &str, value: &str| {
        let mut inv = guard.prepare_invoke();
        inv.key("resource")
            .key("resource:fence")
            .arg(token)
            .arg(value);
        inv
    };
    let first: redis::RedisResult<Vec<redis::Value>> =
        run("5", "from 5").invoke_async(&mut con).await;
    assert!(first.is_ok(), "token 5 writes: {first:?}");
    let nan: redis::RedisResult<redis::Value> = run("nan", "hostile").invoke_async(&mut con).await;
    println!("the guard's answer to token \"nan\": {nan:?}");
    let _: redis::RedisResult<redis::Value> = run("3", "stale").invoke_async(&mut con).await;
    let value: String = redis::cmd("GET")
        .arg("resource")
        .query_async(&mut con)
        .await
        .expect("GET");
    value == "stale"
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nan_token_is_refused_and_stale_writes_stay_rejected() {
    assert!(
        !stale_write_after_nan(FENCED_SET_LUA).await,
        "after a \"nan\" token the guard must still reject token 3 below 5"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_lenient_parsing_a_nan_token_lets_every_stale_write_through() {
    assert!(
        stale_write_after_nan(LENIENT_FENCED_SET).await,
        "the lenient guard must be shown to accept the stale write (else this test has no teeth)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_typed_fence_is_an_error_on_its_node_never_absent() {
    init_tracing();
    let cluster = Cluster::start(3).await;
    let c = client(&cluster.urls()).await;
    let lock = Lock::new(&c, "typed", Duration::from_secs(5)).expect("valid");
    let first = lock.try_acquire().await.expect("a free lock");
    let t1 = first.token().get();
    assert!(first.release().await.expect("released"));
    // Node 0's fence for the lock (gone after the release, folded into the floor) comes back
    // as a hash: a stray HSET, a bad restore. Read as absent (as MGET reads another type), node
    // 0 would grant from its floor alone and overwrite it; refused, the two healthy nodes carry on.
    let mut con = cluster.node(0).direct_connection().await;
    let _: () = redis::cmd("HSET")
        .arg("rq:fence:typed")
        .arg("x")
        .arg("1")
        .query_async(&mut con)
        .await
        .expect("HSET");
    let second = lock
        .try_acquire()
        .await
        .expect("a majority of healthy nodes");
    assert!(second.token().get() > t1, "tokens still grow");
    assert!(second.release().await.expect("released"));
    let kind: String = redis::cmd("TYPE")
        .arg("rq:fence:typed")
        .query_async(&mut con)
        .await
        .expect("TYPE");
    assert_eq!(
        kind, "hash",
        "a wrong-typed register is an error on its node, never overwritten as if absent"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupted_register_is_an_error_on_its_node_never_zero() {
    init_tracing();
    let cluster = Cluster::start(3).await;
    let c = client(&cluster.urls()).await;
    let ids = IdGenerator::new(&c, "corrupt").expect("valid");
    let before = ids.next_id().await.expect("IDs flow");
    // Node 0's copy of the sequence is overwritten with garbage (a bad restore, a stray SET).
    let mut con = cluster.node(0).direct_connection().await;
    let _: () = redis::cmd("SET")
        .arg("rq:id:corrupt")
        .arg("12abc")
        .query_async(&mut con)
        .await
        .expect("SET");
    // Read as 0, node 0 would accept any block; refused, it counts for nothing and the two
    // healthy nodes carry on.
    for _ in 0..20 {
        let id = ids.next_id().await.expect("a majority of healthy nodes");
        assert!(id > before);
    }
    let held: String = redis::cmd("GET")
        .arg("rq:id:corrupt")
        .query_async(&mut con)
        .await
        .expect("GET");
    assert_eq!(
        held, "12abc",
        "a corrupted register is never overwritten as if it were 0"
    );
}
