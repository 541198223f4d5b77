//! Peer indexing and pools as sessions.
//!
//! - `POST /v1/groups/{group}/join?id&interval&session&keepalive`: a member of a peer-indexing
//!   group; its events are `assignment` (`index`, `replicas`, `token`, `state` prepare/active,
//!   or `null` when it owns nothing) and `drain`.
//! - `POST /v1/pools/{pool}/join?id&weight&interval&grace&session&keepalive`: a member of a
//!   pool's work distribution; its assignments carry `units`.
//!
//! A `drain` event (`{"event": "drain", "drain": N, "gives_up": [...]}`) asks the caller to
//! stop the work it gives up and then call `POST /v1/sessions/{id}/drained?drain=N`; the new
//! view becomes active once every old member drained or its drain timeout (`drain_timeout`,
//! default the interval) passed. A `held` event every half interval carries the assignment's
//! remaining validity: a caller that reads no event for that long must stop its work (its
//! server may be frozen or cut off, and the tasks reassigned). A caller that acknowledges without stopping breaks only its own exclusivity: the
//! token of each assignment is what fences its writes. The member leaves when the session
//! ends.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, RawQuery, State};
use axum::response::Response;
use futures_util::FutureExt;
use redquorum::{Assignment, Drain, DrainHook, GroupOptions, Member, PoolMember, PoolOptions};
use serde_json::{json, Value};
use tokio::sync::{mpsc, oneshot, watch};

use super::api::{checked_name, ms, ok, ApiError, Query};
use super::session::{ms_left, Control, Liveness, Opened};
use super::Shared;

/// A drain the library asked for, on its way to the caller.
struct DrainAsk {
    gives_up: Value,
    done: oneshot::Sender<()>,
}

/// A drain hook that asks the session's task, which asks the caller.
fn hook(tx: mpsc::Sender<DrainAsk>, pool: bool) -> DrainHook {
    Arc::new(move |drain: Drain| {
        let tx = tx.clone();
        async move {
            let gives_up = if pool {
                json!(drain.units_given_up())
            } else {
                // A group's tasks are the caller's own numbers: it applies `gives_up` itself
                // from the two assignments.
                json!({"from": assignment_json(Some(&drain.from)), "keeps": assignment_json(drain.keeps.as_ref())})
            };
            let (done, acked) = oneshot::channel();
            if tx.send(DrainAsk { gives_up, done }).await.is_ok() {
                // The library bounds the hook by the drain timeout.
                let _ = acked.await;
            }
        }
        .boxed()
    })
}

/// An assignment as JSON (`null` for none).
fn assignment_json(a: Option<&Assignment>) -> Value {
    let Some(a) = a else { return Value::Null };
    let mut v = json!({
        "index": a.index,
        "replicas": a.replicas,
        "token": a.token.get(),
        "state": match a.state {
            redquorum::ViewState::Prepare => "prepare",
            redquorum::ViewState::Active => "active",
        },
        "valid_for_ms": ms_left(a.valid_until()),
    });
    if let Some(units) = a.units() {
        v["units"] = json!(units);
    }
    v
}

/// What a member session's task watches and ends.
enum Joined {
    Group(Member),
    Pool(PoolMember),
}

impl Joined {
    fn changes(&self) -> watch::Receiver<Option<Assignment>> {
        match self {
            Joined::Group(m) => m.changes(),
            Joined::Pool(m) => m.changes(),
        }
    }

    async fn leave(self) {
        match self {
            Joined::Group(m) => m.leave().await,
            Joined::Pool(m) => m.leave().await,
        }
    }
}

/// The drains asked of the caller and not acknowledged yet, by number (from 1).
#[derive(Default)]
struct Drains {
    waiting: HashMap<u64, oneshot::Sender<()>>,
    last: u64,
}

impl Drains {
    /// A new drain's number; `done` is told when the caller acknowledges it.
    fn ask(&mut self, done: oneshot::Sender<()>) -> u64 {
        self.last += 1;
        self.waiting.retain(|_, done| !done.is_closed());
        self.waiting.insert(self.last, done);
        self.last
    }

    /// The caller's acknowledgement of drain `n`: the answer to `drained`.
    fn acknowledge(&mut self, n: u64) -> Result<Value, ApiError> {
        match self.waiting.remove(&n) {
            Some(done) => match done.send(()) {
                Ok(()) => Ok(json!({"drain": n, "acknowledged": true})),
                Err(()) => Err(ApiError::new(
                    axum::http::StatusCode::CONFLICT,
                    "timeout",
                    format!("drain {n} timed out before this acknowledgement: the hand-over went ahead without it"),
                )),
            },
            None => Err(ApiError::invalid(
                "drain",
                format!("no drain {n} is waiting (acknowledged already, or never asked)"),
            )),
        }
    }
}

/// An assignment event when what `current` gives changed since `last` (not its validity
/// alone); `last` becomes what it gives.
fn assignment_event(current: Option<&Assignment>, last: &mut Option<Value>) -> Option<Value> {
    let now = assignment_json(current);
    let mut key = now.clone();
    if let Some(o) = key.as_object_mut() {
        o.remove("valid_for_ms");
    }
    if last.as_ref() == Some(&key) {
        return None;
    }
    *last = Some(key);
    Some(json!({"event": "assignment", "assignment": now}))
}

/// Serve one member session until it ends (the member then leaves).
async fn drive(
    shared: Arc<Shared>,
    opened: Opened,
    joined: Joined,
    mut asks: mpsc::Receiver<DrainAsk>,
    interval: Duration,
    first: Value,
) {
    let Opened {
        session,
        mut control,
        events,
        ..
    } = opened;
    events.send(&session, first).await;
    let mut changes = joined.changes();
    let mut last: Option<Value> = None;
    let mut drains = Drains::default();
    let mut tick = tokio::time::interval((interval / 2).max(Duration::from_millis(50)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let last_event = loop {
        let event = assignment_event(changes.borrow_and_update().as_ref(), &mut last);
        if let Some(event) = event {
            events.send(&session, event).await;
        }
        tokio::select! {
            biased;
            () = session.ended() => break json!({"event": "left"}),
            changed = changes.changed() => if changed.is_err() { break json!({"event": "left"}) },
            _ = tick.tick() => {
                if let Some(a) = changes.borrow().as_ref() {
                    events.tick(&session, json!({"event": "held", "valid_for_ms": ms_left(a.valid_until())}));
                }
            }
            Some(ask) = asks.recv() => {
                let n = drains.ask(ask.done);
                events.send(&session, json!({"event": "drain", "drain": n, "gives_up": ask.gives_up})).await;
            }
            Some(c) = control.recv() => match c {
                Control::Release(reply) => {
                    joined.leave().await;
                    let event = json!({"event": "left"});
                    events.send(&session, event.clone()).await;
                    let _ = reply.send(Ok(event.clone()));
                    shared.sessions.remove(&session.id, event);
                    return;
                }
                Control::Drained(n, reply) => {
                    let _ = reply.send(drains.acknowledge(n));
                }
                Control::Complete(reply) => {
                    let _ = reply.send(Err(session.cannot_complete()));
                }
                Control::Validity(reply) => {
                    let left = changes.borrow().as_ref().map_or(0, |a| ms_left(a.valid_until()));
                    let _ = reply.send(left);
                }
            },
        }
    };
    joined.leave().await;
    events.last(&session, last_event.clone()).await;
    shared.sessions.remove(&session.id, last_event);
}

/// Start the member session's task and answer.
fn start(
    shared: &Arc<Shared>,
    mut opened: Opened,
    joined: Joined,
    asks: mpsc::Receiver<DrainAsk>,
    interval: Duration,
    first: Value,
) -> Response {
    let body = opened.stream.take();
    tokio::spawn(drive(
        shared.clone(),
        opened,
        joined,
        asks,
        interval,
        first.clone(),
    ));
    match body {
        Some(s) => s.response(),
        None => ok(first),
    }
}

/// The interval parameter (the library's 100 ms ..= 1 h) and the drain timeout (default the
/// interval, at most 1 h).
fn interval(q: &Query) -> Result<(Duration, Duration), ApiError> {
    let interval = q.duration(
        "interval",
        Duration::from_secs(2),
        Duration::from_millis(100)..=Duration::from_secs(3600),
    )?;
    let drain = q.duration(
        "drain_timeout",
        interval,
        Duration::from_millis(100)..=Duration::from_secs(3600),
    )?;
    Ok((interval, drain))
}

/// `POST /v1/groups/{group}/join`.
pub(crate) async fn join_group(
    State(shared): State<Arc<Shared>>,
    Path(group): Path<String>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let q = Query::parse(
        query.as_deref(),
        &["id", "interval", "session", "keepalive"],
    )?;
    let group = checked_name("group", &group)?;
    let id = q
        .name("id")?
        .ok_or_else(|| ApiError::invalid("id", "id is required (this member's ID in the group)"))?;
    let (interval, drain_timeout) = interval(&q)?;
    let liveness = Liveness::from_query(&q)?;
    let admission = shared.sessions.admit(liveness)?;
    let (tx, asks) = mpsc::channel(4);
    let opts = GroupOptions::default()
        .with_interval(interval)
        .with_drain(drain_timeout, hook(tx, false));
    let member = Member::join(&shared.client, &group, &id, opts)
        .await
        .map_err(|e| ApiError::from_lib(e, Some("id")))?;
    let opened = shared
        .sessions
        .open(admission, "group member", &group, liveness)?;
    let first = json!({"event": "joined", "session": opened.session.id, "group": group, "id": id, "interval_ms": ms(interval)});
    Ok(start(
        &shared,
        opened,
        Joined::Group(member),
        asks,
        interval,
        first,
    ))
}

/// `POST /v1/pools/{pool}/join`.
pub(crate) async fn join_pool(
    State(shared): State<Arc<Shared>>,
    Path(pool): Path<String>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let q = Query::parse(
        query.as_deref(),
        &[
            "id",
            "weight",
            "interval",
            "drain_timeout",
            "grace",
            "session",
            "keepalive",
        ],
    )?;
    let pool = checked_name("pool", &pool)?;
    let id = q
        .name("id")?
        .ok_or_else(|| ApiError::invalid("id", "id is required (this member's ID in the pool)"))?;
    let weight = q.number("weight", 1, 0..=u64::from(redquorum::MAX_WEIGHT))?;
    let (interval, drain_timeout) = interval(&q)?;
    let grace = q.duration(
        "grace",
        Duration::ZERO,
        Duration::ZERO..=Duration::from_secs(3600),
    )?;
    let liveness = Liveness::from_query(&q)?;
    let admission = shared.sessions.admit(liveness)?;
    let (tx, asks) = mpsc::channel(4);
    let opts = PoolOptions::default()
        .with_interval(interval)
        .with_weight(u32::try_from(weight).unwrap_or(redquorum::MAX_WEIGHT))
        .with_restart_grace(grace)
        .with_drain(drain_timeout, hook(tx, true));
    let member = PoolMember::join(&shared.client, &pool, &id, opts)
        .await
        .map_err(|e| ApiError::from_lib(e, Some("id")))?;
    let opened = shared
        .sessions
        .open(admission, "pool member", &pool, liveness)?;
    let first = json!({"event": "joined", "session": opened.session.id, "pool": pool, "id": id, "weight": weight, "interval_ms": ms(interval)});
    Ok(start(
        &shared,
        opened,
        Joined::Pool(member),
        asks,
        interval,
        first,
    ))
}
