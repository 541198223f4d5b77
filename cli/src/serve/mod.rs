//! `redquorum serve`: the library over HTTP, for services in any language.
//!
//! One [`redquorum::Client`] per server process, shared by every caller: concurrent callers
//! of one ID sequence share the generator's rounds, as callers in one process do. The routes
//! are listed in [`routes`] and described by `openapi.json` (served at `/v1/openapi.json`; a
//! test keeps the two in step). Bodies are JSON; streams are NDJSON (one JSON object per
//! line).
//!
//! Safe by default: it listens on 127.0.0.1 (or a Unix socket); any other address needs a
//! bearer token (`--token-file`); TLS with `--tls-cert`/`--tls-key`; request bodies, sessions
//! and streams are bounded; names are checked as the library checks them, and bad input is a
//! 4xx with a JSON error naming the field, with nothing written on the nodes.
//!
//! What it guarantees is what the library does, for the server's process: a lease held for a
//! caller is the server's lease. Across the process boundary, a loss event is advice (it
//! arrives as fast as the stream carries it); the fencing token passed with every write is the
//! guarantee. A server killed or frozen loses its sessions' leases only by another holder's
//! takeover after the TTL (plus drift); a caller whose connection drops ends its session, and
//! the lease is released at once.
//!
//! - `api.rs`: errors, query parameters, responses (it uses no other module here).
//! - `session.rs`: sessions (stream or keep-alive), their registry and limits, their NDJSON
//!   streams (it uses `api.rs`, never the reverse).
//! - `ids.rs`, `leases.rs` (locks, elections, periodic jobs), `groups.rs` (peer indexing,
//!   pools): the routes.
//! - `listen.rs`: TCP, Unix socket, TLS, the bearer token.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{DefaultBodyLimit, Path, RawQuery, Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, MethodRouter};
use axum::Router;
use redquorum::Client;
use serde_json::json;

mod api;
mod groups;
mod ids;
mod leases;
mod listen;
mod session;

use api::{ok, ApiError, Query};
use session::{Control, Found, Sessions};

/// The OpenAPI document of the routes.
pub(crate) const OPENAPI: &str = include_str!("openapi.json");

/// `redquorum serve`'s options.
#[derive(clap::Args, Debug)]
pub(crate) struct ServeArgs {
    /// Where to listen: IP:PORT, or unix:PATH for a Unix socket. An address other than
    /// loopback needs --token-file.
    #[arg(long, default_value = "127.0.0.1:7380", value_name = "ADDR", value_parser = listen::parse_bind)]
    pub(crate) listen: listen::Bind,
    /// A file whose first line is the bearer token every request must carry
    /// (`Authorization: Bearer TOKEN`; at least 16 characters).
    #[arg(long, value_name = "FILE")]
    pub(crate) token_file: Option<PathBuf>,
    /// Serve HTTPS with this certificate chain (PEM); needs --tls-key.
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    pub(crate) tls_cert: Option<PathBuf>,
    /// The private key (PEM) of --tls-cert.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub(crate) tls_key: Option<PathBuf>,
    /// Most sessions (held leases, leaderships, periods, group and pool members) at once.
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub(crate) max_sessions: u32,
    /// Most open streams (sessions' and observers') at once.
    #[arg(long, default_value_t = 4096, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub(crate) max_streams: u32,
    /// Largest request body, in bytes.
    #[arg(long, default_value_t = 65536, value_parser = clap::value_parser!(u32).range(0..=16_777_216))]
    pub(crate) max_body_bytes: u32,
}

/// What every handler shares.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) client: Client,
    pub(crate) sessions: Sessions,
    pub(crate) ids: ids::Generators,
    /// The holder label of leases taken without `holder`: `redquorum serve <host>-<pid>`.
    pub(crate) label: String,
    metrics: metrics_exporter_prometheus::PrometheusHandle,
    token: Option<Vec<u8>>,
    /// The largest request body, in bytes.
    max_body: u64,
}

/// The routes: method, path (as in the OpenAPI document) and handler.
pub(crate) fn routes() -> Vec<(&'static str, &'static str, MethodRouter<Arc<Shared>>)> {
    vec![
        ("get", "/v1/health", get(health)),
        ("get", "/metrics", get(metrics_text)),
        ("get", "/v1/openapi.json", get(openapi)),
        ("post", "/v1/ids/{sequence}", post(ids::next)),
        ("post", "/v1/locks/{name}/acquire", post(leases::acquire)),
        ("get", "/v1/locks/{name}/holder", get(leases::holder)),
        (
            "post",
            "/v1/elections/{name}/campaign",
            post(leases::campaign),
        ),
        ("get", "/v1/elections/{name}/leader", get(leases::leader)),
        ("get", "/v1/elections/{name}/observe", get(leases::observe)),
        (
            "post",
            "/v1/jobs/{name}/periods/{period}/begin",
            post(leases::begin_period),
        ),
        ("post", "/v1/groups/{group}/join", post(groups::join_group)),
        ("post", "/v1/pools/{pool}/join", post(groups::join_pool)),
        ("get", "/v1/sessions/{session}", get(session_show)),
        (
            "post",
            "/v1/sessions/{session}/keepalive",
            post(session_keepalive),
        ),
        (
            "post",
            "/v1/sessions/{session}/release",
            post(session_release),
        ),
        (
            "post",
            "/v1/sessions/{session}/complete",
            post(session_complete),
        ),
        (
            "post",
            "/v1/sessions/{session}/drained",
            post(session_drained),
        ),
    ]
}

/// The router over `shared`.
fn router(shared: Arc<Shared>, max_body: usize) -> Router {
    let mut router = Router::new();
    for (_, path, handler) in routes() {
        router = router.route(path, handler);
    }
    router
        .fallback(|| async {
            ApiError::new(
                StatusCode::NOT_FOUND,
                "not_found",
                "no such route (see /v1/openapi.json)",
            )
        })
        .method_not_allowed_fallback(|| async {
            ApiError::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "method_not_allowed",
                "this route does not take that method (see /v1/openapi.json)",
            )
        })
        .layer(axum::middleware::from_fn_with_state(shared.clone(), guard))
        .layer(DefaultBodyLimit::max(max_body))
        .with_state(shared)
}

/// Every request: the bearer token (when the server has one), then counted by route and
/// status.
async fn guard(State(shared): State<Arc<Shared>>, request: Request, next: Next) -> Response {
    if let Some(token) = &shared.token {
        let header = request
            .headers()
            .get(axum::http::header::AUTHORIZATION)
            .map(|h| h.as_bytes());
        if !listen::authorized(header, token) {
            return ApiError::new(
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                "this server needs `Authorization: Bearer TOKEN` (the token of its --token-file)",
            )
            .into_response();
        }
    }
    // No route reads a body beyond this; a larger one is refused unread.
    let length = request
        .headers()
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if length.is_some_and(|n| n > shared.max_body) {
        return ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "too_large",
            format!(
                "the request body is over this server's {} bytes (--max-body-bytes)",
                shared.max_body
            ),
        )
        .into_response();
    }
    let route = request
        .extensions()
        .get::<axum::extract::MatchedPath>()
        .map(|p| p.as_str().to_owned())
        .unwrap_or_else(|| "unmatched".into());
    let response = next.run(request).await;
    metrics::counter!(
        "redquorum_serve_requests_total",
        "route" => route,
        "status" => response.status().as_u16().to_string()
    )
    .increment(1);
    response
}

/// `GET /v1/health`: 200 when a majority of the nodes is reachable and votes (safe), else
/// 503; each node's findings either way.
async fn health(
    State(shared): State<Arc<Shared>>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    Query::parse(query.as_deref(), &[])?;
    let reports = shared.client.check().await;
    let majority = shared.client.majority();
    let voting = reports.iter().filter(|r| r.votes).count();
    let healthy = voting >= majority.needed();
    let nodes: Vec<_> = reports
        .iter()
        .map(|r| json!({"node": r.node.to_string(), "url": r.url, "votes": r.votes, "summary": r.summary()}))
        .collect();
    let body = json!({
        "healthy": healthy,
        "voting": voting,
        "needed": majority.needed(),
        "nodes": nodes,
        "sessions": shared.sessions.len(),
    });
    let status = if healthy {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    Ok((status, axum::Json(body)).into_response())
}

/// `GET /metrics`: the library's and the server's metrics, Prometheus text.
async fn metrics_text(State(shared): State<Arc<Shared>>) -> Response {
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4",
        )],
        shared.metrics.render(),
    )
        .into_response()
}

/// `GET /v1/openapi.json`.
async fn openapi() -> Response {
    (
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        OPENAPI,
    )
        .into_response()
}

/// `GET /v1/sessions/{session}`: a live session, or an ended one's final event (for five
/// minutes).
async fn session_show(
    State(shared): State<Arc<Shared>>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    Ok(ok(match shared.sessions.get(&id)? {
        Found::Live(s) => s.describe(),
        Found::Ended(v) => v,
    }))
}

/// A control request to a live session. An ended session (a retry after a lost reply, or a
/// request that came too late) answers with its final event: 200 when that event is what the
/// request asked for (`done`: e.g. `released`, `completed`), else 409 `ended` naming it.
async fn control(
    shared: &Shared,
    id: &str,
    done: &[&str],
    make: impl FnOnce(tokio::sync::oneshot::Sender<Result<serde_json::Value, ApiError>>) -> Control,
) -> Result<Response, ApiError> {
    match shared.sessions.get(id)? {
        Found::Live(session) => Ok(ok(session.request(make).await?)),
        Found::Ended(v) => {
            let last = &v["state"];
            let event = last["event"].as_str().unwrap_or("");
            let recorded = last["recorded"].as_bool() != Some(false);
            if done.contains(&event) && recorded {
                Ok(ok(last.clone()))
            } else {
                Err(ApiError::new(
                    StatusCode::CONFLICT,
                    "ended",
                    format!("session {id:?} had ended already: {last}"),
                ))
            }
        }
    }
}

/// `POST /v1/sessions/{session}/keepalive`.
async fn session_keepalive(
    State(shared): State<Arc<Shared>>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let session = match shared.sessions.get(&id)? {
        Found::Live(s) => s,
        Found::Ended(v) => {
            return Err(ApiError::new(
                StatusCode::NOT_FOUND,
                "gone",
                format!("session {id:?} ended: {}", v["state"]),
            ))
        }
    };
    let Some(every) = session.liveness.keepalive else {
        return Err(ApiError::not_supported(
            "this stream session lives while its stream is open; it was opened without keepalive=",
        ));
    };
    session.keepalive();
    // The validity now, not the last event's (up to 2 s old, or from before a host suspend).
    let valid_for_ms = session.valid_for_ms_now().await;
    let mut state = session.last_state();
    refresh_validity(&mut state, valid_for_ms);
    Ok(ok(json!({
        "session": id,
        "keepalive_ms": api::ms(every),
        "valid_for_ms": valid_for_ms,
        "state": state,
    })))
}

/// The `valid_for_ms` an event carries (at its top level, or in its assignment) replaced by
/// `valid_for_ms`, the validity computed now.
fn refresh_validity(event: &mut serde_json::Value, valid_for_ms: u64) {
    if let Some(v) = event.get_mut("valid_for_ms") {
        *v = json!(valid_for_ms);
    }
    if let Some(v) = event
        .get_mut("assignment")
        .and_then(|a| a.get_mut("valid_for_ms"))
    {
        *v = json!(valid_for_ms);
    }
}

/// `POST /v1/sessions/{session}/release`: release the lease, resign, abandon the period
/// (nothing recorded), or leave the group or pool; the session ends.
async fn session_release(
    State(shared): State<Arc<Shared>>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    control(
        &shared,
        &id,
        &["released", "resigned", "abandoned", "left"],
        Control::Release,
    )
    .await
}

/// `POST /v1/sessions/{session}/complete`: record the period as done (with the run's token)
/// and release the job's lease; the session ends.
async fn session_complete(
    State(shared): State<Arc<Shared>>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    control(&shared, &id, &["completed"], Control::Complete).await
}

/// `POST /v1/sessions/{session}/drained?drain=N`: the caller stopped the work drain N asked
/// it to give up.
async fn session_drained(
    State(shared): State<Arc<Shared>>,
    Path(id): Path<String>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let q = Query::parse(query.as_deref(), &["drain"])?;
    if q.get("drain").is_none() {
        return Err(ApiError::invalid(
            "drain",
            "drain is required (the number of the drain event)",
        ));
    }
    let n = q.number("drain", 0, 1..=u64::MAX)?;
    control(&shared, &id, &[], |reply| Control::Drained(n, reply)).await
}

/// Check the options before any node is contacted: the address, the token, the TLS files.
pub(crate) fn precheck(args: &ServeArgs) -> Result<(), String> {
    if args.listen.is_exposed() && args.token_file.is_none() {
        return Err(format!(
            "--listen {}: an address other than loopback needs --token-file (a bearer token \
             every caller must send); use 127.0.0.1 or unix:PATH for local callers",
            args.listen
        ));
    }
    if let Some(path) = &args.token_file {
        listen::read_token(path)?;
    }
    if let (Some(cert), Some(key)) = (&args.tls_cert, &args.tls_key) {
        listen::tls_config(cert, key)?;
    }
    if args.tls_cert.is_some() && matches!(args.listen, listen::Bind::Unix(_)) {
        return Err("--tls-cert: TLS is for TCP addresses, not unix: sockets".into());
    }
    Ok(())
}

/// Serve until SIGINT/SIGTERM; then end every session (releasing its lease, leaving its
/// group) and stop.
pub(crate) async fn run(client: Client, args: ServeArgs) -> Result<std::process::ExitCode, String> {
    precheck(&args)?;
    let token = args
        .token_file
        .as_deref()
        .map(listen::read_token)
        .transpose()?;
    let metrics = install_metrics()?;
    let shared = Arc::new(Shared {
        client,
        sessions: Sessions::new(args.max_sessions as usize, args.max_streams as usize),
        ids: ids::Generators::default(),
        label: format!("redquorum serve {}", crate::checks::default_id()),
        metrics,
        token,
        max_body: u64::from(args.max_body_bytes),
    });
    let app = router(shared.clone(), args.max_body_bytes as usize);
    let served = serve_on(&args, app, shutdown(shared.clone())).await?;
    served.map_err(|e| format!("serve: {e}"))?;
    Ok(std::process::ExitCode::SUCCESS)
}

/// The process's metrics recorder (rendered by `GET /metrics`), with the server's metrics
/// described.
fn install_metrics() -> Result<metrics_exporter_prometheus::PrometheusHandle, String> {
    let metrics = metrics_exporter_prometheus::PrometheusBuilder::new()
        .install_recorder()
        .map_err(|e| format!("cannot install the metrics recorder: {e}"))?;
    redquorum::describe_metrics();
    metrics::describe_counter!(
        "redquorum_serve_requests_total",
        "HTTP requests served, by route and status."
    );
    metrics::describe_gauge!("redquorum_serve_sessions", "Sessions open now.");
    Ok(metrics)
}

/// Until SIGINT/SIGTERM; then end every session of `stopping` and wait (up to 10 s) for them
/// to end: the graceful shutdown of the server. The signal handlers are installed when this is
/// called, before the URL is printed (`child::stop_signal`).
fn shutdown(stopping: Arc<Shared>) -> impl std::future::Future<Output = ()> {
    let stop = crate::child::stop_signal();
    async move {
        stop.await;
        stopped(stopping).await;
    }
}

async fn stopped(stopping: Arc<Shared>) {
    tracing::info!("serve: stopping: ending every session");
    stopping.sessions.shutdown.cancel();
    let drained = async {
        while stopping.sessions.len() > 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(10), drained).await;
    // Streams close as their sessions end; a caller that stopped reading cannot hold the
    // process: it exits 5 s later whatever is still open.
    tokio::spawn(async {
        tokio::time::sleep(Duration::from_secs(5)).await;
        tracing::warn!("serve: connections still open 5 s after every session ended: exiting");
        std::process::exit(0);
    });
}

/// Listen where `--listen` says (TLS with `--tls-cert`), print the URL, serve `app` until
/// `shutdown` completes. Errors: cannot listen (the outer result), or serving failed (the
/// inner one).
async fn serve_on(
    args: &ServeArgs,
    app: Router,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<std::io::Result<()>, String> {
    Ok(match &args.listen {
        listen::Bind::Tcp(addr) => {
            let tcp = tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|e| format!("--listen {addr}: {e}"))?;
            let local = tcp.local_addr().map_err(|e| e.to_string())?;
            if let (Some(cert), Some(key)) = (&args.tls_cert, &args.tls_key) {
                let tls = listen::TlsListener::new(tcp, listen::tls_config(cert, key)?)
                    .map_err(|e| e.to_string())?;
                announce(&format!("https://{local}"));
                axum::serve(tls, app).with_graceful_shutdown(shutdown).await
            } else {
                announce(&format!("http://{local}"));
                let tcp = axum::serve::ListenerExt::tap_io(tcp, |s| listen::tune(s));
                axum::serve(tcp, app).with_graceful_shutdown(shutdown).await
            }
        }
        listen::Bind::Unix(path) => {
            let unix = listen::bind_unix(path)?;
            announce(&format!("unix:{}", path.display()));
            let ours = listen::inode(path);
            let served = axum::serve(unix, app)
                .with_graceful_shutdown(shutdown)
                .await;
            // Only our own socket file: another server may have replaced it meanwhile.
            if ours.is_some() && listen::inode(path) == ours {
                let _ = std::fs::remove_file(path);
            }
            served
        }
    })
}

/// The one line `serve` prints on stdout once it listens (scripts wait for it).
fn announce(url: &str) {
    let _ = crate::output::line(&format!("listening on {url}"));
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    #[test]
    fn the_openapi_document_describes_exactly_the_routes_served() {
        let doc: serde_json::Value =
            serde_json::from_str(super::OPENAPI).expect("openapi.json parses");
        let mut documented = BTreeSet::new();
        for (path, methods) in doc["paths"].as_object().expect("paths") {
            for method in methods.as_object().expect("methods").keys() {
                if method != "parameters" {
                    documented.insert((method.clone(), path.clone()));
                }
            }
        }
        let served: BTreeSet<(String, String)> = super::routes()
            .into_iter()
            .map(|(m, p, _)| (m.to_string(), p.to_string()))
            .collect();
        let undocumented: Vec<_> = served.difference(&documented).collect();
        let unserved: Vec<_> = documented.difference(&served).collect();
        assert!(
            undocumented.is_empty() && unserved.is_empty(),
            "openapi.json and serve::routes() differ: served but not documented {undocumented:?}; documented but not served {unserved:?}"
        );
    }

    #[test]
    fn every_documented_query_parameter_is_one_its_route_accepts() {
        // Each route's accepted parameters, as its handler passes them to Query::parse, are
        // listed in the document; a parameter documented but refused would be a 400.
        let doc: serde_json::Value =
            serde_json::from_str(super::OPENAPI).expect("openapi.json parses");
        for (path, methods) in doc["paths"].as_object().expect("paths") {
            for (method, op) in methods.as_object().expect("methods") {
                for p in op["parameters"].as_array().into_iter().flatten() {
                    let name = p["name"].as_str().unwrap_or("");
                    let place = p["in"].as_str().unwrap_or("");
                    assert!(
                        matches!(place, "path" | "query" | "header"),
                        "{method} {path}: parameter {name} is in {place:?}"
                    );
                    if place == "path" {
                        assert!(
                            path.contains(&format!("{{{name}}}")),
                            "{method} {path}: path parameter {name} is not in the path"
                        );
                    }
                }
            }
        }
    }
}
