//! A workload process (`rq-campaign worker ...`): calls redquorum in a loop and records every
//! call on `CLOCK_MONOTONIC` (shared by every process of the machine), one line per call,
//! written unbuffered so a process killed with -9 leaves whole lines behind:
//!
//! ```text
//! IDs:    ok   <start> <end> <first id> <last id>     an ID call that returned a range
//!         err  <start> <end> <error>                   a call that failed
//! Leases: acq  <start> <end> <token> <valid_until>     acquired (err as above when not;
//!                                                      unk: an outcome that is unknown)
//!         w    <start> <end> <token> <accepted 0|1> <valid_until>   a fenced write
//!         rel  <at> <token>                            stops relying on the lease (release)
//!         released <start> <end> <token> <held 0|1>    the release call; 1: it answered
//!                                                      that a majority still held the lease
//!         late <start> <end> <token>                   (http) granted after its validity
//!                                                      had passed: no tenure, released
//! Jobs:   begin <at> <period> <token>                  the period's work begins
//!         ran   <at> <period> <token>                  run_period returned Ran (recorded)
//! ```
//!
//! A holder's tenure runs from its `acq` line's end to the first of its `rel` line and the
//! last `valid_until` it recorded (a frozen or killed holder writes nothing more: its validity
//! bounds it).
//!
//! The `http-ids` and `http-locks` workers do what `ids` and `locks` do through a `redquorum
//! serve` process's HTTP API, and write the same lines (see [`http_locks`] for the validity an
//! HTTP caller may rely on). A lease held through `serve` is released as soon as its caller's
//! connection closes, so a killed `http-locks` process does not stay bounded by its validity:
//! the campaign appends a `rel` line to its record, at the instant just before it sent the
//! kill (see `run.rs`).

use std::fs::File;
use std::io::Write;
use std::path::Path;
use std::time::Duration;

use rand::{Rng, SeedableRng};
use redquorum::{Client, Config, IdGenerator};
use redquorum_testkit::record::monotonic_ns;

use crate::http;
use crate::plant::Plant;

/// The ID workload: `next_ids(1..=batch)` in a loop on `sequence`, until killed.
pub async fn ids(
    urls: &[String],
    sequence: &str,
    out: &Path,
    seed: u64,
    plant: Option<Plant>,
) -> Result<(), String> {
    let mut file = File::create(out).map_err(|e| format!("{}: {e}", out.display()))?;
    let mut config = Config::from_urls(urls).map_err(|e| e.to_string())?;
    if let Some(p) = plant {
        config = p.apply(config, urls.len());
    }
    let client = Client::connect(config).await.map_err(|e| e.to_string())?;
    let ids = IdGenerator::new(&client, sequence).map_err(|e| e.to_string())?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    loop {
        let count = rng.random_range(1..=4u64);
        let start = monotonic_ns();
        let result = ids.next_ids(count).await;
        let end = monotonic_ns();
        let line = match result {
            Ok(r) => format!("ok\t{start}\t{end}\t{}\t{}\n", r.start(), r.end()),
            Err(e) => format!("err\t{start}\t{end}\t{}\n", one_line(&e.to_string())),
        };
        file.write_all(line.as_bytes())
            .map_err(|e| format!("{}: {e}", out.display()))?;
        tokio::time::sleep(Duration::from_millis(rng.random_range(0..10))).await;
    }
}

/// The lease workload: acquire `lock_name` (TTL `ttl`, auto-extended), then while holding it
/// "work" (a short pause) and write to the fenced resource with the token, a few times;
/// release; again. `fenced: false` writes without the guard (the planted bug "fencing off").
pub async fn locks(
    urls: &[String],
    resource: &str,
    lock_name: &str,
    out: &Path,
    seed: u64,
    plant: Option<Plant>,
) -> Result<(), String> {
    use redquorum::Lock;

    let mut file = File::create(out).map_err(|e| format!("{}: {e}", out.display()))?;
    let mut line = |l: String| {
        file.write_all(l.as_bytes())
            .map_err(|e| format!("{}: {e}", out.display()))
    };
    let mut config = Config::from_urls(urls).map_err(|e| e.to_string())?;
    if let Some(p) = plant {
        config = p.apply(config, urls.len());
    }
    let client = Client::connect(config).await.map_err(|e| e.to_string())?;
    let lock = Lock::new(&client, lock_name, LEASE_TTL).map_err(|e| e.to_string())?;
    let (key, fence_key) = (
        format!("{lock_name}:resource"),
        format!("{lock_name}:resource:fence"),
    );
    let mut conn = redis::Client::open(resource)
        .map_err(|e| e.to_string())?
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| format!("the fenced resource: {e}"))?;
    let guard_script = redis::Script::new(redquorum::FENCED_SET_LUA);
    let fenced = plant != Some(Plant::FencingOff);
    let origin = (tokio::time::Instant::now(), monotonic_ns());
    let ns = |i: tokio::time::Instant| -> u64 {
        let (i0, n0) = origin;
        match i.checked_duration_since(i0) {
            Some(d) => n0 + d.as_nanos() as u64,
            None => n0.saturating_sub(i0.duration_since(i).as_nanos() as u64),
        }
    };
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    loop {
        let start = monotonic_ns();
        let guard = match lock.acquire(Duration::from_secs(2)).await {
            Ok(g) => g,
            Err(e) => {
                let end = monotonic_ns();
                let kind = if e.is_outcome_unknown() { "unk" } else { "err" };
                let e = one_line(&e.to_string());
                line(format!("{kind}\t{start}\t{end}\t{e}\n"))?;
                continue;
            }
        };
        let token = guard.token().get();
        line(format!(
            "acq\t{start}\t{}\t{token}\t{}\n",
            monotonic_ns(),
            ns(guard.valid_until())
        ))?;
        for _ in 0..rng.random_range(1..=6) {
            if !guard.is_held() {
                break;
            }
            // The work between the check and the write: a holder frozen here writes late.
            tokio::time::sleep(Duration::from_millis(rng.random_range(0..150))).await;
            let t0 = monotonic_ns();
            let accepted =
                write_resource(&mut conn, &guard_script, (&key, &fence_key), token, fenced).await;
            let t1 = monotonic_ns();
            let accepted = accepted.map_err(|e| format!("the fenced resource: {e}"))?;
            line(format!(
                "w\t{t0}\t{t1}\t{token}\t{}\t{}\n",
                u8::from(accepted),
                ns(guard.valid_until())
            ))?;
        }
        line(format!("rel\t{}\t{token}\n", monotonic_ns()))?;
        let r0 = monotonic_ns();
        let held = matches!(guard.release().await, Ok(true));
        line(released_line(r0, token, held))?;
        tokio::time::sleep(Duration::from_millis(rng.random_range(0..20))).await;
    }
}

/// How long an HTTP call may take before the caller gives up on it (longer than the longest
/// freeze of a `serve` process, 5 s, plus the acquisition's wait).
const HTTP_CALL_LIMIT: Duration = Duration::from_secs(10);

/// The ID workload through `serve`: `POST /v1/ids/{sequence}?count=1..=4` in a loop, on one
/// kept-alive connection (a new one after an error), to the server whose base URL is in
/// `server` (read again at every new connection: a restarted server may listen elsewhere).
/// Each call is timed from before its request is sent (and its connection opened) to after
/// its answer is read: the interval holds the server's own, so the ID checker's real-time
/// order is checked on intervals no shorter than the server's.
pub async fn http_ids(server: &Path, sequence: &str, out: &Path, seed: u64) -> Result<(), String> {
    let mut file = File::create(out).map_err(|e| format!("{}: {e}", out.display()))?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut conn: Option<http::Conn> = None;
    loop {
        let count = rng.random_range(1..=4u64);
        let start = monotonic_ns();
        let call = http_next_ids(&mut conn, server, sequence, count);
        let result = tokio::time::timeout(HTTP_CALL_LIMIT, call)
            .await
            .unwrap_or_else(|_| Err(format!("no answer within {HTTP_CALL_LIMIT:?}")));
        let end = monotonic_ns();
        let line = match &result {
            Ok((first, last)) => format!("ok\t{start}\t{end}\t{first}\t{last}\n"),
            Err(e) => {
                conn = None;
                format!("err\t{start}\t{end}\t{}\n", one_line(e))
            }
        };
        file.write_all(line.as_bytes())
            .map_err(|e| format!("{}: {e}", out.display()))?;
        // A server down refuses at once: no busy loop while it restarts.
        let pause = if result.is_ok() { 0..10 } else { 20..60 };
        tokio::time::sleep(Duration::from_millis(rng.random_range(pause))).await;
    }
}

/// One ID call through `serve`: the first and last ID returned.
async fn http_next_ids(
    conn: &mut Option<http::Conn>,
    server: &Path,
    sequence: &str,
    count: u64,
) -> Result<(u64, u64), String> {
    if conn.as_ref().is_none_or(|c| !c.reusable()) {
        *conn = Some(http_connect(server).await?);
    }
    let Some(c) = conn.as_mut() else {
        return Err("no connection".into());
    };
    let status = c
        .post(&format!("/v1/ids/{sequence}?count={count}"))
        .await
        .map_err(|e| e.to_string())?;
    let body = c.body().await.map_err(|e| e.to_string())?;
    let v: serde_json::Value = serde_json::from_slice(&body)
        .map_err(|e| format!("{status}: a body that is not JSON ({e})"))?;
    if status != 200 {
        return Err(http_error(status, &v));
    }
    let ids: Vec<u64> = v["ids"]
        .as_array()
        .map(|a| a.iter().filter_map(serde_json::Value::as_u64).collect())
        .unwrap_or_default();
    match (v["first"].as_u64(), v["last"].as_u64()) {
        (Some(first), Some(last))
            if ids.len() as u64 == count
                && last >= first
                && last - first + 1 == count
                && ids.iter().copied().eq(first..=last) =>
        {
            Ok((first, last))
        }
        _ => Err(format!(
            "an answer that is not {count} consecutive IDs: {v}"
        )),
    }
}

/// A new connection to the server whose base URL is in `server`.
async fn http_connect(server: &Path) -> Result<http::Conn, String> {
    let host = http::read_base(server).map_err(|e| format!("the server's URL: {e}"))?;
    http::Conn::connect(&host)
        .await
        .map_err(|e| format!("{host}: {e}"))
}

/// An error answer as one line: status, code, message.
fn http_error(status: u16, v: &serde_json::Value) -> String {
    let e = &v["error"];
    format!(
        "HTTP {status} {}: {}",
        e["code"].as_str().unwrap_or("?"),
        e["message"].as_str().unwrap_or("")
    )
}

/// The lease workload through `serve`: what [`locks`] does, with the lease acquired by
/// `POST /v1/locks/{lock}/acquire?ttl=1s&wait=2s` (an NDJSON stream), released by
/// `POST /v1/sessions/{session}/release` (the stream closed after it), and the writes to the
/// fenced resource made by this process with the token, as a caller in another language would.
/// `plant = FencingOff` writes with a plain SET.
///
/// **The validity this caller relies on** (its `valid_until`, recorded in its `acq` and `w`
/// lines; the tenure checker's bound on when it stopped relying on the lease): the monotonic
/// instant just before the acquire request was sent, plus the `acquired` event's
/// `valid_for_ms`, and nothing later.
///
/// Why this is safe. The server computes `valid_for_ms` as the whole milliseconds left until
/// its guard's validity `V` (the library's bound: no other holder's tenure begins before `V`),
/// at an instant `r` after it received the request, so after the caller sent it (`s <= r`),
/// all on the machine's one `CLOCK_MONOTONIC`: `s + valid_for_ms <= r + valid_for_ms <= V`.
/// Any delay (the request or the answer held up, the server or the caller frozen) only makes
/// the caller's bound earlier than `V`, never later. An answer that arrives after its bound
/// has passed gives no tenure at all: it is recorded as a failed try and released (recording
/// it as an `acq` would be an empty tenure that starts after a later holder's, which the
/// checker would take for two holders). The price: the validity runs from the send, so an
/// acquisition the server had to wait for (a release, or a takeover, which watches the lease
/// unchanged for its TTL plus drift) comes with its validity spent, or nearly; it is given
/// back, and the next try finds the lease free. (An `acquired` event that also said how long
/// after receiving the request the server computed `valid_for_ms` would let a caller add that
/// much to `s`: a duration on the server's monotonic clock, not an instant.)
///
/// Why the `held` events do not extend it. A `held` event carries `valid_for_ms` computed at
/// the server's tick `r'`, and the caller cannot bound `r'` from below by anything later than
/// `s`: the event may wait in the server's queue or the socket, or be read by a caller that was
/// frozen while it arrived. The receipt time plus `valid_for_ms` overestimates `V` by the
/// event's age, unboundedly (a caller frozen for 5 s reads a 5 s old event; its server may have
/// been frozen or killed meanwhile, and the lease taken over). The only safe bound from a
/// `held` event is again `s + valid_for_ms`, at most `s + ttl`: nothing worth having. So this
/// caller relies on the `acquired` bound only and, as the in-process holder does when its
/// guard is no longer held, stops writing, releases and acquires again once it passes (the
/// holders hold briefly: a few writes). A caller that wants to hold longer safely needs a
/// validity computed at a request it sent (a fresh acquisition here).
///
/// A `lost` event, or the stream ending (the server gone), also stops the writes at the next
/// check; the caller's fencing token is what protects a write already under way.
pub async fn http_locks(
    server: &Path,
    resource: &str,
    lock_name: &str,
    holder: &str,
    out: &Path,
    seed: u64,
    plant: Option<Plant>,
) -> Result<(), String> {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    let mut file = File::create(out).map_err(|e| format!("{}: {e}", out.display()))?;
    let mut line = |l: String| {
        file.write_all(l.as_bytes())
            .map_err(|e| format!("{}: {e}", out.display()))
    };
    let (key, fence_key) = (
        format!("{lock_name}:resource"),
        format!("{lock_name}:resource:fence"),
    );
    let mut conn = redis::Client::open(resource)
        .map_err(|e| e.to_string())?
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| format!("the fenced resource: {e}"))?;
    let guard_script = redis::Script::new(redquorum::FENCED_SET_LUA);
    let fenced = plant != Some(Plant::FencingOff);
    let ttl_ms = LEASE_TTL.as_millis();
    let path = format!("/v1/locks/{lock_name}/acquire?ttl={ttl_ms}ms&wait=2s&holder={holder}");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    loop {
        // Taken before the connection is opened and the request sent: the validity's origin.
        let sent = monotonic_ns();
        let opened = tokio::time::timeout(HTTP_CALL_LIMIT, http_acquire(server, &path))
            .await
            .unwrap_or_else(|_| Err(format!("no answer within {HTTP_CALL_LIMIT:?}")));
        let received = monotonic_ns();
        let (mut events, first) = match opened {
            Ok(x) => x,
            Err(e) => {
                // Only an error answer below 500 says that nothing was granted.
                let refused = e.starts_with("HTTP 4");
                let kind = if refused { "err" } else { "unk" };
                line(format!("{kind}\t{sent}\t{received}\t{}\n", one_line(&e)))?;
                tokio::time::sleep(Duration::from_millis(rng.random_range(20..60))).await;
                continue;
            }
        };
        let (Some(token), Some(valid_for_ms), Some(session)) = (
            first["token"].as_u64(),
            first["valid_for_ms"].as_u64(),
            first["session"].as_str().map(String::from),
        ) else {
            line(format!(
                "unk\t{sent}\t{received}\tan acquired event without token, validity or session: {}\n",
                one_line(&first.to_string())
            ))?;
            tokio::time::sleep(Duration::from_millis(rng.random_range(20..60))).await;
            continue;
        };
        let valid_until = sent.saturating_add(valid_for_ms.saturating_mul(1_000_000));
        if received >= valid_until {
            // A grant for the fenced-mutex check, no tenure (see above).
            line(format!("late\t{sent}\t{received}\t{token}\n"))?;
            let r0 = monotonic_ns();
            let held = http_release(server, &session).await;
            line(released_line(r0, token, held))?;
            drop(events);
            continue;
        }
        line(format!("acq\t{sent}\t{received}\t{token}\t{valid_until}\n"))?;
        // The rest of the stream, read as it comes: a loss or the end stops the writes.
        let lost = Arc::new(AtomicBool::new(false));
        let reader = tokio::spawn({
            let lost = lost.clone();
            async move {
                loop {
                    match events.next().await {
                        Ok(Some(e)) if e["event"] == "held" => {}
                        _ => {
                            lost.store(true, Ordering::SeqCst);
                            return;
                        }
                    }
                }
            }
        });
        let mut failure = None;
        for _ in 0..rng.random_range(1..=6) {
            if lost.load(Ordering::SeqCst) || monotonic_ns() >= valid_until {
                break;
            }
            // The work between the check and the write: a holder frozen here writes late.
            tokio::time::sleep(Duration::from_millis(rng.random_range(0..150))).await;
            let t0 = monotonic_ns();
            let accepted =
                write_resource(&mut conn, &guard_script, (&key, &fence_key), token, fenced).await;
            let t1 = monotonic_ns();
            match accepted {
                Ok(accepted) => line(format!(
                    "w\t{t0}\t{t1}\t{token}\t{}\t{valid_until}\n",
                    u8::from(accepted)
                ))?,
                Err(e) => {
                    failure = Some(format!("the fenced resource: {e}"));
                    break;
                }
            }
        }
        // Stops relying on the lease before it gives it back (and before it exits on an
        // error: the server releases the lease as soon as this process's connection closes).
        line(format!("rel\t{}\t{token}\n", monotonic_ns()))?;
        let r0 = monotonic_ns();
        let held = http_release(server, &session).await;
        line(released_line(r0, token, held))?;
        reader.abort();
        if let Some(e) = failure {
            return Err(e);
        }
        tokio::time::sleep(Duration::from_millis(rng.random_range(0..20))).await;
    }
}

/// Open an acquisition's stream: the stream and its first event (`acquired`), or the error
/// answer as one line.
async fn http_acquire(
    server: &Path,
    path: &str,
) -> Result<(http::Events, serde_json::Value), String> {
    let mut conn = http_connect(server).await?;
    let status = conn.post(path).await.map_err(|e| e.to_string())?;
    if status != 200 {
        let body = conn.body().await.map_err(|e| e.to_string())?;
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
        return Err(http_error(status, &v));
    }
    let mut events = http::Events::new(conn);
    match events.next().await {
        Ok(Some(first)) if first["event"] == "acquired" => Ok((events, first)),
        Ok(Some(other)) => Err(format!("a first event that is not acquired: {other}")),
        Ok(None) => Err("the stream ended before its first event".into()),
        Err(e) => Err(format!("the stream: {e}")),
    }
}

/// Release a session (bounded: a frozen or dead server's session ends when the caller's
/// stream closes, which the caller does next): whether the server answered that a majority
/// still held the lease.
async fn http_release(server: &Path, session: &str) -> bool {
    let release = async {
        let mut conn = http_connect(server).await?;
        conn.post(&format!("/v1/sessions/{session}/release"))
            .await
            .map_err(|e| e.to_string())?;
        conn.body().await.map_err(|e| e.to_string())
    };
    match tokio::time::timeout(Duration::from_secs(2), release).await {
        Ok(Ok(body)) => {
            serde_json::from_slice::<serde_json::Value>(&body).is_ok_and(|v| v["released"] == true)
        }
        _ => false,
    }
}

/// A `released` line: the release call from `start` to now, and whether it answered that a
/// majority still held the lease (the fenced-mutex check's confirmed release).
fn released_line(start: u64, token: u64, held: bool) -> String {
    let end = monotonic_ns();
    format!("released\t{start}\t{end}\t{token}\t{}\n", u8::from(held))
}

/// Write `token` to the fenced resource at `key` through the fenced guard (`fenced: false`:
/// a plain SET, the planted bug "fencing off"): whether the resource accepted it.
async fn write_resource(
    conn: &mut redis::aio::MultiplexedConnection,
    guard_script: &redis::Script,
    (key, fence_key): (&str, &str),
    token: u64,
    fenced: bool,
) -> Result<bool, String> {
    let value = format!("{token}");
    if fenced {
        guard_script
            .key(key)
            .key(fence_key)
            .arg(token)
            .arg(&value)
            .invoke_async::<(i64, u64)>(conn)
            .await
            .map(|(applied, _)| applied == 1)
            .map_err(|e| e.to_string())
    } else {
        redis::cmd("SET")
            .arg(key)
            .arg(&value)
            .query_async::<()>(conn)
            .await
            .map(|()| true)
            .map_err(|e| e.to_string())
    }
}

/// The periodic-job workload: the period is `CLOCK_MONOTONIC / JOB_PERIOD` (shared by every
/// process of the machine); each process runs `run_period` for the current period, whose
/// work records `begin`, pauses 50-400 ms and returns; a `Ran` outcome records `ran`.
/// `plant = NoCompletionCheck` runs the work under a plain lock instead (no completion record
/// is read or written).
pub async fn jobs(
    urls: &[String],
    out: &Path,
    seed: u64,
    plant: Option<Plant>,
) -> Result<(), String> {
    use redquorum::{JobOutcome, Lock, PeriodicJob};
    use std::sync::{Arc, Mutex};

    let file = Arc::new(Mutex::new(
        File::create(out).map_err(|e| format!("{}: {e}", out.display()))?,
    ));
    let write = {
        let file = file.clone();
        move |l: String| {
            let mut f = file.lock().unwrap_or_else(|p| p.into_inner());
            let _ = f.write_all(l.as_bytes());
        }
    };
    let mut config = Config::from_urls(urls).map_err(|e| e.to_string())?;
    if let Some(p) = plant {
        config = p.apply(config, urls.len());
    }
    let client = Client::connect(config).await.map_err(|e| e.to_string())?;
    let job = PeriodicJob::new(&client, "campaign-job", LEASE_TTL).map_err(|e| e.to_string())?;
    let plain = Lock::new(&client, "campaign-job-plain", LEASE_TTL).map_err(|e| e.to_string())?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    loop {
        let period = monotonic_ns() / JOB_PERIOD.as_nanos() as u64;
        let pause = Duration::from_millis(rng.random_range(50..400));
        let work = {
            let write = write.clone();
            move |token: u64| async move {
                write(format!("begin\t{}\t{period}\t{token}\n", monotonic_ns()));
                tokio::time::sleep(pause).await;
            }
        };
        if plant == Some(Plant::NoCompletionCheck) {
            if let Ok(g) = plain.acquire(Duration::from_millis(300)).await {
                let token = g.token().get();
                work(token).await;
                write(format!("ran\t{}\t{period}\t{token}\n", monotonic_ns()));
                let _ = g.release().await;
            }
        } else {
            let outcome = job
                .run_period_infallible(
                    &period.to_string(),
                    Duration::from_millis(300),
                    |token, _| work(token.get()),
                )
                .await;
            if let Ok(JobOutcome::Ran { token, .. }) = outcome {
                write(format!(
                    "ran\t{}\t{period}\t{}\n",
                    monotonic_ns(),
                    token.get()
                ));
            }
        }
        tokio::time::sleep(Duration::from_millis(rng.random_range(20..200))).await;
    }
}

/// The periodic job's period.
pub const JOB_PERIOD: Duration = Duration::from_secs(2);

/// The lease workload's TTL: short, so holders frozen for seconds are frozen past it.
pub const LEASE_TTL: Duration = Duration::from_millis(1000);

/// An error message on one line (no tabs either).
pub fn one_line(s: &str) -> String {
    s.replace(['\n', '\t'], " ")
}
