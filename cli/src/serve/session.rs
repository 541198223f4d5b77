//! Sessions: what `serve` holds for a remote caller (a lease, a leadership, a period's run, a
//! group or pool membership), and how long it holds it.
//!
//! A session lives while its caller shows it is alive, in one of two ways the caller picks:
//! - **stream** (the default): the response to the request that opened the session is an
//!   NDJSON stream of its events; the session ends when that stream ends, and the server ends
//!   the stream's body when the caller's connection closes (a dropped body ends the session
//!   at once: [`EndOnDrop`]);
//! - **keepalive**: the response is one JSON object; the caller must call
//!   `POST /v1/sessions/{id}/keepalive` within `keepalive` of the last call, or the session
//!   ends.
//!
//! A stream session may ask for keep-alives too (`keepalive=` without `session=keepalive`):
//! it then ends at the first of its stream's end and a missed keep-alive. A frozen caller's
//! kernel keeps its connection open for hours, so a caller that can freeze (a GC pause, a
//! stopped process) should ask for them.
//!
//! An ended session leaves a tombstone with its final event for [`TOMBSTONE_TTL`], so that a
//! caller retrying `release` or `complete` after a lost reply learns how its session ended.
//!
//! Every session is driven by one task (in the module of its kind) that owns the library's
//! handle: the only place the handle is released, resigned, completed or left. The task
//! serves the session's control requests ([`Control`]) and ends when the session ends
//! ([`Session::ended`]: the caller is gone, released, or the server shuts down), removing the
//! session from the registry.
//!
//! Across the process boundary the events (a loss above all) are advice: the caller learns of
//! a loss only as fast as the stream carries it, and not at all while partitioned from the
//! server. The fencing token the caller passes with every write is what keeps its resource
//! safe.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::api::{ms, ApiError, Query};

/// How the caller keeps its session alive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Liveness {
    /// While the response stream is open (otherwise the answer is one JSON object).
    pub(crate) stream: bool,
    /// While keep-alives arrive within this long of each other (required without a stream).
    pub(crate) keepalive: Option<Duration>,
}

impl Liveness {
    /// The query's `session=stream` (the default; with `keepalive=DURATION` the session also
    /// ends when keep-alives stop) or `session=keepalive` (`keepalive` default 10 s).
    pub(crate) fn from_query(q: &Query) -> Result<Liveness, ApiError> {
        let range = Duration::from_millis(100)..=Duration::from_secs(3600);
        let given = match q.get("keepalive") {
            Some(_) => Some(q.duration("keepalive", Duration::ZERO, range)?),
            None => None,
        };
        match q.get("session") {
            None | Some("stream") => Ok(Liveness {
                stream: true,
                keepalive: given,
            }),
            Some("keepalive") => Ok(Liveness {
                stream: false,
                keepalive: Some(given.unwrap_or(Duration::from_secs(10))),
            }),
            Some(other) => Err(ApiError::invalid(
                "session",
                format!("session={other:?}: use stream (the default) or keepalive"),
            )),
        }
    }
}

/// How long an ended session's final event is kept for callers that retry.
pub(crate) const TOMBSTONE_TTL: Duration = Duration::from_secs(300);
/// Most tombstones kept (the oldest go first).
const MAX_TOMBSTONES: usize = 10_000;

/// A session ID as logged: its first 8 characters (the whole ID lets anyone end the session).
pub(crate) fn short(id: &str) -> &str {
    id.get(..8).unwrap_or(id)
}

/// A request to a session's task, with the channel its answer goes back on.
#[derive(Debug)]
pub(crate) enum Control {
    /// Release the lease (resign, abandon the period, leave the group): the answer says
    /// whether a majority applied the release.
    Release(oneshot::Sender<Result<Value, ApiError>>),
    /// Record the period as done (periodic jobs only).
    Complete(oneshot::Sender<Result<Value, ApiError>>),
    /// The caller stopped the work a drain asked it to stop (group and pool members only).
    Drained(u64, oneshot::Sender<Result<Value, ApiError>>),
    /// The remaining validity of what the session holds, computed when asked (a keep-alive's
    /// answer): the lease's or the assignment's `valid_until`, on both clocks; 0 once it is
    /// over or lost, or when the session holds nothing.
    Validity(oneshot::Sender<u64>),
}

/// One session, as the registry holds it.
#[derive(Debug)]
pub(crate) struct Session {
    pub(crate) id: String,
    /// What it holds: "lock", "leadership", "period", "group member", "pool member".
    pub(crate) kind: &'static str,
    /// The lock's, election's, job's, group's or pool's name.
    pub(crate) name: String,
    pub(crate) liveness: Liveness,
    end: CancellationToken,
    control: mpsc::Sender<Control>,
    /// The last state the session's task published (what `GET /v1/sessions/{id}` shows).
    state: Mutex<Value>,
    /// The last keep-alive (keepalive sessions).
    touched: Mutex<Instant>,
    /// Wakes the task when a keep-alive moved the deadline.
    pub(crate) touch: tokio::sync::Notify,
}

impl Session {
    /// Resolves when the session must end: its stream was dropped, a keep-alive was missed,
    /// it was released, or the server shuts down.
    pub(crate) async fn ended(&self) {
        let Some(every) = self.liveness.keepalive else {
            return self.end.cancelled().await;
        };
        loop {
            let deadline = self.touched() + every;
            tokio::select! {
                _ = self.end.cancelled() => return,
                _ = tokio::time::sleep_until(deadline) => {
                    if self.touched() + every <= Instant::now() {
                        tracing::info!(session = short(&self.id), kind = self.kind, name = %self.name,
                            "serve: no keep-alive within {every:?}: the session ends");
                        return;
                    }
                }
                _ = self.touch.notified() => {}
            }
        }
    }

    fn touched(&self) -> Instant {
        *self.touched.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A keep-alive: the deadline moves to now plus the session's keep-alive interval.
    pub(crate) fn keepalive(&self) {
        *self.touched.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
        self.touch.notify_one();
    }

    /// The remaining validity of what the session holds, in ms, computed now by its task
    /// ([`Control::Validity`]); 0 when the task does not answer within a second (it is ending
    /// the session, or stuck on a full stream): a caller must then count it as over.
    pub(crate) async fn valid_for_ms_now(&self) -> u64 {
        let ask = async {
            let (tx, rx) = oneshot::channel();
            self.control.send(Control::Validity(tx)).await.ok()?;
            rx.await.ok()
        };
        tokio::time::timeout(Duration::from_secs(1), ask)
            .await
            .ok()
            .flatten()
            .unwrap_or(0)
    }

    /// Publish the session's state (shown by `GET /v1/sessions/{id}`).
    pub(crate) fn set_state(&self, state: Value) {
        *self.state.lock().unwrap_or_else(|p| p.into_inner()) = state;
    }

    /// The last event the session's task published.
    pub(crate) fn last_state(&self) -> Value {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The session's description and last state.
    pub(crate) fn describe(&self) -> Value {
        let state = self.state.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let liveness = json!({
            "mode": if self.liveness.stream { "stream" } else { "keepalive" },
            "keepalive_ms": self.liveness.keepalive.map(ms),
        });
        json!({"session": self.id, "kind": self.kind, "name": self.name, "liveness": liveness, "state": state})
    }

    /// The answer to `complete` on a session that is not a periodic job's run.
    pub(crate) fn cannot_complete(&self) -> ApiError {
        ApiError::not_supported(format!(
            "a {} session cannot be completed (only a periodic job's run can)",
            self.kind
        ))
    }

    /// The answer to `drained` on a session that is not a group or pool member.
    pub(crate) fn has_no_drains(&self) -> ApiError {
        ApiError::not_supported(format!(
            "a {} session has no drains (only group and pool members do)",
            self.kind
        ))
    }

    /// Send a control request to the session's task and wait for its answer.
    pub(crate) async fn request(
        &self,
        make: impl FnOnce(oneshot::Sender<Result<Value, ApiError>>) -> Control,
    ) -> Result<Value, ApiError> {
        let (tx, rx) = oneshot::channel();
        if self.control.send(make(tx)).await.is_err() {
            return Err(ApiError::gone(&self.id));
        }
        rx.await.unwrap_or_else(|_| Err(ApiError::gone(&self.id)))
    }
}

/// The sessions of one server, and its limits on sessions and streams.
#[derive(Debug)]
pub(crate) struct Sessions {
    map: Mutex<HashMap<String, Arc<Session>>>,
    /// Ended sessions' final events, with when they ended.
    tombstones: Mutex<HashMap<String, (Instant, Value)>>,
    /// Requests admitted that have not opened their session yet (waiting for a lease).
    pending: Arc<std::sync::atomic::AtomicUsize>,
    max_sessions: usize,
    max_streams: usize,
    streams: Arc<std::sync::atomic::AtomicUsize>,
    /// Cancelled at shutdown: every session ends, every stream closes.
    pub(crate) shutdown: CancellationToken,
}

/// A new session's parts for its task: the session, its control requests, its events.
pub(crate) struct Opened {
    pub(crate) session: Arc<Session>,
    pub(crate) control: mpsc::Receiver<Control>,
    pub(crate) events: Events,
    /// The response stream (stream sessions), to return once the first event is queued.
    pub(crate) stream: Option<EventStream>,
}

impl Sessions {
    pub(crate) fn new(max_sessions: usize, max_streams: usize) -> Sessions {
        Sessions {
            map: Mutex::new(HashMap::new()),
            tombstones: Mutex::new(HashMap::new()),
            pending: Arc::new(std::sync::atomic::AtomicUsize::new(0)),
            max_sessions,
            max_streams,
            streams: Arc::new(std::sync::atomic::AtomicUsize::new(0)),
            shutdown: CancellationToken::new(),
        }
    }

    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Session>>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Admit a request that will open a session (before anything is acquired): it counts
    /// against `--max-sessions` while it waits, and its admission becomes the session.
    pub(crate) fn admit(&self, liveness: Liveness) -> Result<Admission, ApiError> {
        use std::sync::atomic::Ordering::SeqCst;
        if self.shutdown.is_cancelled() {
            return Err(ApiError::shutting_down());
        }
        let admission = Admission(self.pending.clone());
        self.pending.fetch_add(1, SeqCst);
        if self.map().len() + self.pending.load(SeqCst) > self.max_sessions {
            return Err(ApiError::limit("sessions", self.max_sessions));
        }
        if liveness.stream {
            self.admit_stream()?;
        }
        Ok(admission)
    }

    /// Whether one more stream may be opened now.
    pub(crate) fn admit_stream(&self) -> Result<(), ApiError> {
        if self.streams.load(std::sync::atomic::Ordering::Relaxed) >= self.max_streams {
            return Err(ApiError::limit("streams", self.max_streams));
        }
        Ok(())
    }

    /// Register a session of `kind` on `name`, for the request `admission` admitted.
    pub(crate) fn open(
        &self,
        admission: Admission,
        kind: &'static str,
        name: &str,
        liveness: Liveness,
    ) -> Result<Opened, ApiError> {
        if self.shutdown.is_cancelled() {
            return Err(ApiError::shutting_down());
        }
        let id = new_session_id()?;
        let (control_tx, control) = mpsc::channel(8);
        let session = Arc::new(Session {
            id: id.clone(),
            kind,
            name: name.to_owned(),
            liveness,
            end: self.shutdown.child_token(),
            control: control_tx,
            state: Mutex::new(Value::Null),
            touched: Mutex::new(Instant::now()),
            touch: tokio::sync::Notify::new(),
        });
        let (events, stream) = if liveness.stream {
            let (tx, rx) = mpsc::channel(64);
            let stream = self.stream(rx, Some(session.end.clone()));
            (Events(Some(tx)), Some(stream))
        } else {
            (Events(None), None)
        };
        let open = {
            let mut map = self.map();
            map.insert(id, session.clone());
            map.len()
        };
        drop(admission);
        metrics_sessions(open);
        Ok(Opened {
            session,
            control,
            events,
            stream,
        })
    }

    /// A stream of `rx`'s events (an observer's, or a session's with `end` cancelled when the
    /// stream is dropped). Counted against the stream limit while it lives.
    pub(crate) fn stream(
        &self,
        rx: mpsc::Receiver<Value>,
        end: Option<CancellationToken>,
    ) -> EventStream {
        self.streams
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        EventStream {
            rx,
            _guard: EndOnDrop {
                end,
                streams: self.streams.clone(),
            },
        }
    }

    /// The session `id`: live, or ended (its final event, for [`TOMBSTONE_TTL`]).
    pub(crate) fn get(&self, id: &str) -> Result<Found, ApiError> {
        if let Some(s) = self.map().get(id) {
            return Ok(Found::Live(s.clone()));
        }
        let tombs = self.tombstones.lock().unwrap_or_else(|p| p.into_inner());
        match tombs.get(id) {
            Some((at, last)) if at.elapsed() < TOMBSTONE_TTL => Ok(Found::Ended(json!({
                "session": id, "ended": true, "state": last,
            }))),
            _ => Err(ApiError::gone(id)),
        }
    }

    /// Forget the session `id` (its task ended with `last`, kept as its tombstone).
    pub(crate) fn remove(&self, id: &str, last: Value) {
        let left = {
            let mut map = self.map();
            map.remove(id);
            map.len()
        };
        metrics_sessions(left);
        let mut tombs = self.tombstones.lock().unwrap_or_else(|p| p.into_inner());
        tombs.retain(|_, (at, _)| at.elapsed() < TOMBSTONE_TTL);
        if tombs.len() >= MAX_TOMBSTONES {
            let oldest = tombs
                .iter()
                .min_by_key(|(_, (at, _))| *at)
                .map(|(k, _)| k.clone());
            if let Some(oldest) = oldest {
                tombs.remove(&oldest);
            }
        }
        tombs.insert(id.to_owned(), (Instant::now(), last));
    }

    /// Sessions open now.
    pub(crate) fn len(&self) -> usize {
        self.map().len()
    }
}

/// A request admitted to open a session: counted as pending until dropped.
#[derive(Debug)]
pub(crate) struct Admission(Arc<std::sync::atomic::AtomicUsize>);

impl Drop for Admission {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// A session as `GET /v1/sessions/{id}` finds it.
#[derive(Debug)]
pub(crate) enum Found {
    Live(Arc<Session>),
    /// Ended: its description with the final event.
    Ended(Value),
}

/// A session ID: 128 random bits from the OS, in hex (whoever knows it can release the
/// session, so it is never guessable).
fn new_session_id() -> Result<String, ApiError> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes)
        .map_err(|e| ApiError::internal(format!("no randomness for a session ID: {e}")))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// Where a session's task sends its events: the response stream, or nowhere (keepalive
/// sessions, or a stream whose caller is gone).
#[derive(Debug)]
pub(crate) struct Events(Option<mpsc::Sender<Value>>);

impl Events {
    /// An event that must arrive (the first, a loss, the end): waits while the stream is full,
    /// unless `session` ends meanwhile.
    pub(crate) async fn send(&self, session: &Session, event: Value) {
        session.set_state(event.clone());
        if let Some(tx) = &self.0 {
            tokio::select! {
                biased;
                _ = tx.send(event) => {}
                _ = session.end.cancelled() => {}
            }
        }
    }

    /// The session's last event, sent after it ended (its stream may still be read while the
    /// server stops): waits up to a second for room, then gives up.
    pub(crate) async fn last(&self, session: &Session, event: Value) {
        session.set_state(event.clone());
        if let Some(tx) = &self.0 {
            let _ = tx.send_timeout(event, Duration::from_secs(1)).await;
        }
    }

    /// A periodic event (remaining validity): dropped when the stream is full.
    pub(crate) fn tick(&self, session: &Session, event: Value) {
        session.set_state(event.clone());
        if let Some(tx) = &self.0 {
            let _ = tx.try_send(event);
        }
    }
}

/// The stream body of NDJSON events; its drop ends the session it belongs to.
#[derive(Debug)]
pub(crate) struct EventStream {
    rx: mpsc::Receiver<Value>,
    _guard: EndOnDrop,
}

impl EventStream {
    /// The response body: one JSON object per line, flushed as it comes.
    pub(crate) fn into_body(self) -> Body {
        let stream = futures_util::stream::unfold(self, |mut s| async move {
            let event = s.rx.recv().await?;
            let mut line = event.to_string().into_bytes();
            line.push(b'\n');
            Some((Ok::<_, std::convert::Infallible>(Bytes::from(line)), s))
        });
        Body::from_stream(stream)
    }

    /// The NDJSON stream answer (200).
    pub(crate) fn response(self) -> Response {
        let mut response = self.into_body().into_response();
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/x-ndjson"),
        );
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
        // Proxies (nginx) must not buffer the events.
        headers.insert("x-accel-buffering", HeaderValue::from_static("no"));
        response
    }
}

/// Ends a session when its stream is dropped (the caller's connection closed, or the stream
/// ended), and counts the stream out.
#[derive(Debug)]
struct EndOnDrop {
    end: Option<CancellationToken>,
    streams: Arc<std::sync::atomic::AtomicUsize>,
}

impl Drop for EndOnDrop {
    fn drop(&mut self) {
        if let Some(end) = &self.end {
            end.cancel();
        }
        self.streams
            .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Milliseconds left until `until` (0 once passed).
pub(crate) fn ms_left(until: Instant) -> u64 {
    until
        .saturating_duration_since(Instant::now())
        .as_millis()
        .try_into()
        .unwrap_or(u64::MAX)
}

/// Publish the count of open sessions.
fn metrics_sessions(open: usize) {
    metrics::gauge!("redquorum_serve_sessions").set(open as f64);
}
