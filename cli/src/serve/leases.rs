//! Leases as sessions: locks, elections and periodic jobs.
//!
//! - `POST /v1/locks/{name}/acquire?ttl&wait&holder&session&keepalive`: a lease, with its
//!   fencing token; `GET /v1/locks/{name}/holder?watch`: who holds it.
//! - `POST /v1/elections/{name}/campaign?candidate&ttl&wait&session&keepalive`: leadership
//!   (the term is the fencing token); `GET /v1/elections/{name}/leader?watch`;
//!   `GET /v1/elections/{name}/observe?interval`: a stream of leadership changes.
//! - `POST /v1/jobs/{name}/periods/{period}/begin?ttl&wait&session&keepalive`: a period's
//!   run (`begun`, with its token) or `done` (by which token); the session's `complete`
//!   records it, its end without `complete` records nothing.
//!
//! One task per session ([`drive`]) owns the library's handle: it extends nothing itself (the
//! library's auto-extension does), publishes the remaining validity every quarter TTL (at most
//! every 2 s), forwards a loss at once, and releases when the session ends. The request that
//! opens a session answers only once the lease is held (or with 409 when it is not within
//! `wait`), so the response's first event carries the token.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, RawQuery, State};
use axum::response::Response;
use futures_util::StreamExt;
use redquorum::{
    Election, JobOptions, Leadership, Lock, LockGuard, LockOptions, PeriodRun, PeriodStart,
    PeriodicJob, MAX_TTL, MIN_TTL,
};
use serde_json::{json, Value};
use tokio::sync::oneshot;

use super::api::{checked_name, ms, ok, ApiError, Query};
use super::session::{ms_left, Control, Events, Liveness, Opened, Session};
use super::Shared;

/// The longest `wait` a request may ask for.
const MAX_WAIT: Duration = Duration::from_secs(3600);
/// The default lease time.
const DEFAULT_TTL: Duration = Duration::from_secs(10);

/// What a lease session holds.
enum Held {
    Lock(LockGuard),
    Leader(Leadership),
    Period(PeriodRun),
}

impl Held {
    fn guard(&self) -> &LockGuard {
        match self {
            Held::Lock(g) => g,
            Held::Leader(l) => l.guard(),
            Held::Period(p) => p.guard(),
        }
    }

    /// Give the lease back: release, resign, or abandon the period (nothing recorded).
    async fn end(self) -> Value {
        match self {
            Held::Lock(g) => match g.release().await {
                Ok(released) => json!({"event": "released", "released": released}),
                Err(e) => json!({"event": "released", "released": false, "error": e.to_string()}),
            },
            Held::Leader(l) => match l.resign().await {
                Ok(()) => json!({"event": "resigned", "released": true}),
                Err(e) => json!({"event": "resigned", "released": false, "error": e.to_string()}),
            },
            Held::Period(p) => {
                p.abandon().await;
                json!({"event": "abandoned", "recorded": false})
            }
        }
    }
}

/// What the session's task does next.
enum Next {
    Lost(redquorum::LossReason),
    Ended,
    Control(Control),
    Tick,
}

/// Serve one lease session until it ends; the session is then removed.
async fn drive(shared: Arc<Shared>, opened: Opened, mut held: Held, ttl: Duration, first: Value) {
    let Opened {
        session,
        mut control,
        events,
        ..
    } = opened;
    events.send(&session, first).await;
    let lost = held.guard().lost();
    tokio::pin!(lost);
    let every = (ttl / 4).clamp(Duration::from_millis(100), Duration::from_secs(2));
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        let next = tokio::select! {
            biased;
            reason = &mut lost => Next::Lost(reason),
            () = session.ended() => Next::Ended,
            Some(c) = control.recv() => Next::Control(c),
            _ = tick.tick() => Next::Tick,
        };
        match next {
            Next::Lost(reason) => {
                tracing::info!(session = super::session::short(&session.id), kind = session.kind,
                    name = %session.name, "serve: the lease was lost: {reason}");
                let event = json!({"event": "lost", "reason": reason.to_string()});
                events.send(&session, event).await;
                break;
            }
            Next::Ended => {
                // The caller is gone (nobody reads), or the server is stopping (the stream
                // still carries the end).
                let event = held.end().await;
                events.last(&session, event).await;
                break;
            }
            Next::Control(Control::Release(reply)) => {
                let event = held.end().await;
                events.send(&session, event.clone()).await;
                let _ = reply.send(Ok(event));
                break;
            }
            Next::Control(Control::Complete(reply)) => {
                match complete(held, &session, &events, reply).await {
                    Some(not_a_period) => held = not_a_period,
                    None => break,
                }
            }
            Next::Control(Control::Drained(_, reply)) => {
                let _ = reply.send(Err(session.has_no_drains()));
            }
            Next::Control(Control::Validity(reply)) => {
                let guard = held.guard();
                let _ = reply.send(if guard.is_held() {
                    ms_left(guard.valid_until())
                } else {
                    0
                });
            }
            Next::Tick => {
                let left = ms_left(held.guard().valid_until());
                events.tick(&session, json!({"event": "held", "valid_for_ms": left}));
            }
        }
    }
    shared.sessions.remove(&session.id, session.last_state());
}

/// A `complete` request to a lease session: record the period as done (the session then
/// ends: `None`), or refuse when the session holds no period (it goes on with `held`, given
/// back).
async fn complete(
    held: Held,
    session: &Session,
    events: &Events,
    reply: oneshot::Sender<Result<Value, ApiError>>,
) -> Option<Held> {
    match held {
        // A lease lost (or run out on this server's clock) records nothing: another
        // caller may be running the period with a newer token.
        Held::Period(run) if !run.guard().is_held() => {
            run.abandon().await;
            let event = json!({"event": "lost", "reason": "the lease ran out before complete: nothing recorded"});
            events.send(session, event).await;
            let _ = reply.send(Err(ApiError::new(
                axum::http::StatusCode::CONFLICT,
                "lease_lost",
                "the job's lease was lost before complete: the period is not recorded (another caller may run it)",
            )));
            None
        }
        // The library checks the lease again, and the record counts only if a majority
        // applied it while the lease held: a late or refused record is `lease_lost` (409),
        // one decided neither way `no_quorum` (503); never `recorded: true`.
        Held::Period(run) => {
            let event = match run.complete().await {
                Ok(token) => {
                    Ok(json!({"event": "completed", "recorded": true, "token": token.get()}))
                }
                // A record that went out may have counted (one a majority applied late still
                // does for later readers): the answer says the outcome is unknown.
                Err(e) => {
                    let mut e = ApiError::from_lib(e, None);
                    if e.code == "lease_lost" {
                        e.outcome_unknown = true;
                    }
                    Err(e)
                }
            };
            let shown = match &event {
                Ok(v) => v.clone(),
                Err(e) if e.code == "lease_lost" => json!({"event": "lost", "reason": e.message}),
                Err(e) => json!({"event": "completed", "recorded": false, "error": e.message}),
            };
            events.send(session, shown).await;
            let _ = reply.send(event);
            None
        }
        other => {
            let _ = reply.send(Err(session.cannot_complete()));
            Some(other)
        }
    }
}

/// Start the session's task and answer: the stream, or (keepalive) the first event.
fn start(
    shared: &Arc<Shared>,
    mut opened: Opened,
    held: Held,
    ttl: Duration,
    first: Value,
) -> Response {
    let stream_body = opened.stream.take();
    let task = drive(shared.clone(), opened, held, ttl, first.clone());
    tokio::spawn(task);
    match stream_body {
        Some(s) => s.response(),
        None => ok(first),
    }
}

/// The lease-time and wait parameters.
fn ttl_and_wait(q: &Query) -> Result<(Duration, Duration), ApiError> {
    Ok((
        q.duration("ttl", DEFAULT_TTL, MIN_TTL..=MAX_TTL)?,
        q.duration("wait", Duration::ZERO, Duration::ZERO..=MAX_WAIT)?,
    ))
}

/// Wait for `f` unless the server shuts down first.
async fn unless_shutdown<T>(
    shared: &Shared,
    f: impl std::future::Future<Output = Result<T, redquorum::Error>>,
) -> Result<T, ApiError> {
    tokio::select! {
        r = f => r.map_err(|e| ApiError::from_lib(e, None)),
        () = shared.sessions.shutdown.cancelled() => Err(ApiError::shutting_down()),
    }
}

/// `POST /v1/locks/{name}/acquire`.
pub(crate) async fn acquire(
    State(shared): State<Arc<Shared>>,
    Path(name): Path<String>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let q = Query::parse(
        query.as_deref(),
        &["ttl", "wait", "holder", "session", "keepalive"],
    )?;
    let name = checked_name("lock", &name)?;
    let (ttl, wait) = ttl_and_wait(&q)?;
    let holder = q.name("holder")?.unwrap_or_else(|| shared.label.clone());
    let liveness = Liveness::from_query(&q)?;
    let admission = shared.sessions.admit(liveness)?;
    let options = LockOptions::default().with_holder(&holder);
    let lock = Lock::with_options(&shared.client, &name, ttl, options)
        .map_err(|e| ApiError::from_lib(e, Some("ttl")))?;
    let guard = unless_shutdown(&shared, lock.acquire(wait)).await?;
    let opened = shared.sessions.open(admission, "lock", &name, liveness)?;
    let first = json!({
        "event": "acquired",
        "session": opened.session.id,
        "lock": name,
        "holder": holder,
        "token": guard.token().get(),
        "ttl_ms": ms(ttl),
        "valid_for_ms": ms_left(guard.valid_until()),
    });
    Ok(start(&shared, opened, Held::Lock(guard), ttl, first))
}

/// A holder as JSON (`null` for none).
fn holder_json(h: Option<redquorum::Holder>) -> Value {
    match h {
        None => Value::Null,
        Some(h) => json!({
            "holder": h.holder,
            "token": h.token.get(),
            "version": h.version,
            "ttl_ms": ms(h.ttl),
            "unchanged_ms": h.unchanged_for.map(ms),
            "abandoned": h.looks_abandoned(),
        }),
    }
}

/// `GET /v1/locks/{name}/holder?watch=DURATION`.
pub(crate) async fn holder(
    State(shared): State<Arc<Shared>>,
    Path(name): Path<String>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let q = Query::parse(query.as_deref(), &["watch"])?;
    let name = checked_name("lock", &name)?;
    let watch = q.duration("watch", Duration::ZERO, Duration::ZERO..=MAX_WAIT)?;
    // The TTL only shapes how the handle reads; any valid one reads the same lease.
    let lock = Lock::new(&shared.client, &name, DEFAULT_TTL)
        .map_err(|e| ApiError::from_lib(e, Some("name")))?;
    let holder = unless_shutdown(&shared, lock.holder_watching(watch)).await?;
    Ok(ok(json!({"lock": name, "holder": holder_json(holder)})))
}

/// `POST /v1/elections/{name}/campaign`.
pub(crate) async fn campaign(
    State(shared): State<Arc<Shared>>,
    Path(name): Path<String>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let q = Query::parse(
        query.as_deref(),
        &["candidate", "ttl", "wait", "session", "keepalive"],
    )?;
    let name = checked_name("election", &name)?;
    let (ttl, wait) = ttl_and_wait(&q)?;
    let candidate = q.name("candidate")?.ok_or_else(|| {
        ApiError::invalid(
            "candidate",
            "candidate is required (the ID others see as the leader)",
        )
    })?;
    let liveness = Liveness::from_query(&q)?;
    let admission = shared.sessions.admit(liveness)?;
    let election = Election::new(&shared.client, &name, ttl, &candidate)
        .map_err(|e| ApiError::from_lib(e, Some("candidate")))?;
    let leadership = if wait.is_zero() {
        unless_shutdown(&shared, election.try_campaign()).await?
    } else {
        unless_shutdown(&shared, election.campaign_for(wait)).await?
    };
    let opened = shared
        .sessions
        .open(admission, "leadership", &name, liveness)?;
    let first = json!({
        "event": "elected",
        "session": opened.session.id,
        "election": name,
        "candidate": candidate,
        "term": leadership.term().get(),
        "ttl_ms": ms(ttl),
        "valid_for_ms": ms_left(leadership.guard().valid_until()),
    });
    Ok(start(&shared, opened, Held::Leader(leadership), ttl, first))
}

/// A leader as JSON (`null` for none).
fn leader_json(l: Option<redquorum::LeaderInfo>) -> Value {
    match l {
        None => Value::Null,
        Some(l) => json!({
            "candidate": l.candidate,
            "term": l.term.get(),
            "ttl_ms": ms(l.ttl),
            "unchanged_ms": l.unchanged_for.map(ms),
            "abandoned": l.looks_abandoned(),
        }),
    }
}

/// An election handle for reading (the candidate ID is not used by reads).
fn reader(shared: &Shared, name: &str) -> Result<Election, ApiError> {
    Election::new(&shared.client, name, DEFAULT_TTL, &shared.label)
        .map_err(|e| ApiError::from_lib(e, Some("name")))
}

/// `GET /v1/elections/{name}/leader?watch=DURATION`.
pub(crate) async fn leader(
    State(shared): State<Arc<Shared>>,
    Path(name): Path<String>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let q = Query::parse(query.as_deref(), &["watch"])?;
    let name = checked_name("election", &name)?;
    let watch = q.duration("watch", Duration::ZERO, Duration::ZERO..=MAX_WAIT)?;
    let election = reader(&shared, &name)?;
    let leader = unless_shutdown(&shared, election.leader_watching(watch)).await?;
    Ok(ok(json!({"election": name, "leader": leader_json(leader)})))
}

/// `GET /v1/elections/{name}/observe?interval=DURATION`: `{"event": "leader", "leader": ...}`
/// for the current state, then for every change.
pub(crate) async fn observe(
    State(shared): State<Arc<Shared>>,
    Path(name): Path<String>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let q = Query::parse(query.as_deref(), &["interval"])?;
    let name = checked_name("election", &name)?;
    let interval = q.duration(
        "interval",
        Duration::from_secs(1),
        Duration::from_millis(50)..=MAX_WAIT,
    )?;
    let election = reader(&shared, &name)?;
    shared.sessions.admit_stream()?;
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    let shutdown = shared.sessions.shutdown.clone();
    tokio::spawn(async move {
        let changes = election.observe(interval);
        tokio::pin!(changes);
        loop {
            tokio::select! {
                change = changes.next() => {
                    let Some(change) = change else { return };
                    let event = json!({"event": "leader", "leader": leader_json(change)});
                    tokio::select! {
                        sent = tx.send(event) => if sent.is_err() { return },
                        () = shutdown.cancelled() => return,
                    }
                }
                () = tx.closed() => return,
                () = shutdown.cancelled() => return,
            }
        }
    });
    Ok(shared.sessions.stream(rx, None).response())
}

/// `POST /v1/jobs/{name}/periods/{period}/begin`.
pub(crate) async fn begin_period(
    State(shared): State<Arc<Shared>>,
    Path((name, period)): Path<(String, String)>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let q = Query::parse(query.as_deref(), &["ttl", "wait", "session", "keepalive"])?;
    let name = checked_name("job", &name)?;
    let period = checked_name("period", &period)?;
    let (ttl, wait) = ttl_and_wait(&q)?;
    let liveness = Liveness::from_query(&q)?;
    let admission = shared.sessions.admit(liveness)?;
    let options =
        JobOptions::default().with_lock(LockOptions::default().with_holder(&shared.label));
    let job = PeriodicJob::with_options(&shared.client, &name, ttl, options)
        .map_err(|e| ApiError::from_lib(e, Some("ttl")))?;
    let run = match unless_shutdown(&shared, job.begin_period(&period, wait)).await? {
        PeriodStart::Due(run) => run,
        PeriodStart::AlreadyDone { token } => {
            let done =
                json!({"event": "done", "job": name, "period": period, "token": token.get()});
            if liveness.stream {
                shared.sessions.admit_stream()?;
                let (tx, rx) = tokio::sync::mpsc::channel(1);
                let _ = tx.try_send(done);
                return Ok(shared.sessions.stream(rx, None).response());
            }
            return Ok(ok(done));
        }
        PeriodStart::NotLeader => {
            return Err(ApiError::from_lib(
                redquorum::Error::LockHeld { name: name.clone() },
                None,
            ))
        }
    };
    let opened = shared.sessions.open(admission, "period", &name, liveness)?;
    let first = json!({
        "event": "begun",
        "session": opened.session.id,
        "job": name,
        "period": period,
        "token": run.token().get(),
        "ttl_ms": ms(ttl),
        "valid_for_ms": ms_left(run.guard().valid_until()),
    });
    Ok(start(&shared, opened, Held::Period(run), ttl, first))
}
