//! A workload process (`rq-campaign worker ...`): calls redquorum in a loop and records every
//! call on `CLOCK_MONOTONIC` (shared by every process of the machine), one line per call,
//! written unbuffered so a process killed with -9 leaves whole lines behind:
//!
//! ```text
//! IDs:    ok   <start> <end> <first id> <last id>     an ID call that returned a range
//!         err  <start> <end> <error>                   a call that failed
//! Leases: acq  <start> <end> <token> <valid_until>     acquired (err as above when not)
//!         w    <start> <end> <token> <accepted 0|1> <valid_until>   a fenced write
//!         rel  <at> <token>                            stops relying on the lease (release)
//! Jobs:   begin <at> <period> <token>                  the period's work begins
//!         ran   <at> <period> <token>                  run_period returned Ran (recorded)
//! ```
//!
//! A holder's tenure runs from its `acq` line's end to the first of its `rel` line and the
//! last `valid_until` it recorded (a frozen or killed holder writes nothing more: its validity
//! bounds it).

use std::fs::File;
use std::io::Write;
use std::path::Path;
use std::time::Duration;

use rand::{Rng, SeedableRng};
use redquorum::{Client, Config, IdGenerator};
use redquorum_testkit::record::monotonic_ns;

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
                line(format!(
                    "err\t{start}\t{end}\t{}\n",
                    one_line(&e.to_string())
                ))?;
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
            let value = format!("{token}");
            let accepted: Result<bool, String> = if fenced {
                guard_script
                    .key(&key)
                    .key(&fence_key)
                    .arg(token)
                    .arg(&value)
                    .invoke_async::<(i64, u64)>(&mut conn)
                    .await
                    .map(|(applied, _)| applied == 1)
                    .map_err(|e| e.to_string())
            } else {
                redis::cmd("SET")
                    .arg(&key)
                    .arg(&value)
                    .query_async::<()>(&mut conn)
                    .await
                    .map(|()| true)
                    .map_err(|e| e.to_string())
            };
            let t1 = monotonic_ns();
            let accepted = accepted.map_err(|e| format!("the fenced resource: {e}"))?;
            line(format!(
                "w\t{t0}\t{t1}\t{token}\t{}\t{}\n",
                u8::from(accepted),
                ns(guard.valid_until())
            ))?;
        }
        line(format!("rel\t{}\t{token}\n", monotonic_ns()))?;
        let _ = guard.release().await;
        tokio::time::sleep(Duration::from_millis(rng.random_range(0..20))).await;
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
                .run_period(
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
