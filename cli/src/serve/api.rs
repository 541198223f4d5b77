//! The API's edges: errors as JSON with the field they concern, query parameters checked as
//! the library checks them (before anything is sent to a node), responses.
//!
//! It depends on no other module of `serve`: sessions (`session.rs`) build on it, not the
//! reverse (a session's NDJSON stream answer and its liveness parameters are `session.rs`'s).

use std::time::Duration;

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

/// An error answer: `{"error": {"code", "message", "field"?}}` with its HTTP status.
#[derive(Debug)]
pub(crate) struct ApiError {
    pub(crate) status: StatusCode,
    /// A stable, machine-readable code: `invalid`, `unauthorized`, `not_found`, `held`,
    /// `timeout`, `no_quorum`, `contended`, `too_slow`, `limit`, `shutting_down`, `exhausted`,
    /// `lease_lost`, `internal`, `gone`, `not_supported`, `looks_abandoned`.
    pub(crate) code: &'static str,
    pub(crate) message: String,
    /// The query parameter, path segment or body field at fault.
    pub(crate) field: Option<&'static str>,
    /// Whether the operation may have taken effect although it failed.
    pub(crate) outcome_unknown: bool,
    /// `looks_abandoned`: how long until the lease can be taken over (the error's
    /// `takeover_in_ms`, and a `Retry-After` header in whole seconds, rounded up).
    pub(crate) takeover_in: Option<Duration>,
}

impl ApiError {
    pub(crate) fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            message: message.into(),
            field: None,
            outcome_unknown: false,
            takeover_in: None,
        }
    }

    /// Bad input in `field`; nothing was sent to any node.
    pub(crate) fn invalid(field: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            field: Some(field),
            ..ApiError::new(StatusCode::BAD_REQUEST, "invalid", message)
        }
    }

    pub(crate) fn gone(session: &str) -> Self {
        ApiError {
            field: Some("session"),
            ..ApiError::new(
                StatusCode::NOT_FOUND,
                "gone",
                format!("no session {session:?} on this server (ended, or never opened here)"),
            )
        }
    }

    pub(crate) fn limit(what: &'static str, max: usize) -> Self {
        ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "limit",
            format!("this server already holds its limit of {max} {what} (--max-{what})"),
        )
    }

    pub(crate) fn shutting_down() -> Self {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "shutting_down",
            "the server is shutting down",
        )
    }

    pub(crate) fn internal(message: impl Into<String>) -> Self {
        ApiError {
            outcome_unknown: true,
            ..ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", message)
        }
    }

    pub(crate) fn not_supported(message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::CONFLICT, "not_supported", message)
    }

    /// A library error, with `field` named for invalid input where the caller knows it.
    pub(crate) fn from_lib(e: redquorum::Error, field: Option<&'static str>) -> Self {
        use redquorum::Error as E;
        let unknown = e.is_outcome_unknown();
        let (status, code) = match &e {
            E::Name(_) | E::InvalidArgument(_) | E::Config(_) => {
                (StatusCode::BAD_REQUEST, "invalid")
            }
            E::NoQuorum(_) => (StatusCode::SERVICE_UNAVAILABLE, "no_quorum"),
            E::Contended { .. } => (StatusCode::SERVICE_UNAVAILABLE, "contended"),
            E::TooSlow { .. } => (StatusCode::SERVICE_UNAVAILABLE, "too_slow"),
            E::LockHeld { .. } => (StatusCode::CONFLICT, "held"),
            // Nobody was seen alive holding it: not 409 (held), but "come back then".
            E::LockLooksAbandoned { .. } => (StatusCode::SERVICE_UNAVAILABLE, "looks_abandoned"),
            E::Timeout { .. } => (StatusCode::CONFLICT, "timeout"),
            E::LeaseLost { .. } => (StatusCode::CONFLICT, "lease_lost"),
            E::Unfinished { .. } => (StatusCode::SERVICE_UNAVAILABLE, "unfinished"),
            E::Exhausted { .. } => (StatusCode::UNPROCESSABLE_ENTITY, "exhausted"),
            _ => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
        };
        let field = if status == StatusCode::BAD_REQUEST {
            field
        } else {
            None
        };
        ApiError {
            status,
            code,
            message: e.to_string(),
            field,
            outcome_unknown: unknown,
            takeover_in: match e {
                E::LockLooksAbandoned { takeover_in, .. } => Some(takeover_in),
                _ => None,
            },
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut error = json!({"code": self.code, "message": self.message});
        if let Some(field) = self.field {
            error["field"] = json!(field);
        }
        if self.outcome_unknown {
            error["outcome_unknown"] = json!(true);
        }
        if let Some(takeover_in) = self.takeover_in {
            error["takeover_in_ms"] = json!(takeover_in.as_millis() as u64);
        }
        let mut response = (self.status, axum::Json(json!({ "error": error }))).into_response();
        if let Some(takeover_in) = self.takeover_in {
            let seconds = takeover_in.as_millis().div_ceil(1000);
            if let Ok(value) = HeaderValue::from_str(&seconds.to_string()) {
                response.headers_mut().insert(header::RETRY_AFTER, value);
            }
        }
        if self.status == StatusCode::UNAUTHORIZED {
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"redquorum\""),
            );
        }
        response
    }
}

/// A JSON answer (200).
pub(crate) fn ok(value: Value) -> Response {
    axum::Json(value).into_response()
}

/// The raw query parameters, checked by the accessors below. Unknown parameters are refused,
/// so a misspelt one is not silently ignored.
#[derive(Debug)]
pub(crate) struct Query {
    pairs: Vec<(String, String)>,
}

impl Query {
    /// Parse `raw` (the URI's query), allowing only the parameters in `allowed`.
    pub(crate) fn parse(raw: Option<&str>, allowed: &[&'static str]) -> Result<Query, ApiError> {
        let mut pairs: Vec<(String, String)> = Vec::new();
        for (k, v) in form_pairs(raw.unwrap_or(""))? {
            if !allowed.contains(&k.as_str()) {
                return Err(ApiError::invalid(
                    "query",
                    format!(
                        "unknown query parameter {k:?} (this route takes: {})",
                        if allowed.is_empty() {
                            "none".to_string()
                        } else {
                            allowed.join(", ")
                        }
                    ),
                ));
            }
            if pairs.iter().any(|(seen, _)| *seen == k) {
                return Err(ApiError::invalid(
                    "query",
                    format!("query parameter {k:?} is given twice"),
                ));
            }
            pairs.push((k, v));
        }
        Ok(Query { pairs })
    }

    pub(crate) fn get(&self, name: &str) -> Option<&str> {
        self.pairs
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// A duration like `500ms`, `5s`, `1m`, within `range`; `default` when absent.
    pub(crate) fn duration(
        &self,
        name: &'static str,
        default: Duration,
        range: std::ops::RangeInclusive<Duration>,
    ) -> Result<Duration, ApiError> {
        let Some(raw) = self.get(name) else {
            return Ok(default);
        };
        let d = humantime::parse_duration(raw).map_err(|e| {
            ApiError::invalid(
                name,
                format!("{name}={raw:?} is not a duration: {e} (use e.g. 500ms, 2s, 1m)"),
            )
        })?;
        if !range.contains(&d) {
            return Err(ApiError::invalid(
                name,
                format!(
                    "{name}={raw} is outside {}..={}",
                    humantime::format_duration(*range.start()),
                    humantime::format_duration(*range.end())
                ),
            ));
        }
        Ok(d)
    }

    /// A whole number within `range`; `default` when absent.
    pub(crate) fn number(
        &self,
        name: &'static str,
        default: u64,
        range: std::ops::RangeInclusive<u64>,
    ) -> Result<u64, ApiError> {
        let Some(raw) = self.get(name) else {
            return Ok(default);
        };
        let n: u64 = raw.parse().map_err(|_| {
            ApiError::invalid(name, format!("{name}={raw:?} is not a whole number"))
        })?;
        if !range.contains(&n) {
            return Err(ApiError::invalid(
                name,
                format!("{name}={n} is outside {}..={}", range.start(), range.end()),
            ));
        }
        Ok(n)
    }

    /// A name checked as the library checks it (1 to 512 bytes, no control characters).
    pub(crate) fn name(&self, name: &'static str) -> Result<Option<String>, ApiError> {
        self.get(name).map(|v| checked_name(name, v)).transpose()
    }
}

/// A name (path segment or parameter) checked as the library checks it.
pub(crate) fn checked_name(field: &'static str, value: &str) -> Result<String, ApiError> {
    redquorum::Name::new(field, value)
        .map(|n| n.as_str().to_owned())
        .map_err(|e| ApiError::invalid(field, e.to_string()))
}

/// `application/x-www-form-urlencoded` pairs, refusing what does not decode to UTF-8.
fn form_pairs(raw: &str) -> Result<Vec<(String, String)>, ApiError> {
    let mut out = Vec::new();
    for part in raw.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = part.split_once('=').unwrap_or((part, ""));
        out.push((decode(k)?, decode(v)?));
    }
    Ok(out)
}

/// Percent-decoding (and `+` as a space) of one query component, refusing what does not
/// decode to UTF-8.
fn decode(s: &str) -> Result<String, ApiError> {
    let spaced = s.replace('+', " ");
    if let Some(at) = spaced.find('%') {
        let bad = |i: usize| {
            !spaced
                .as_bytes()
                .get(i + 1..i + 3)
                .is_some_and(|h| h.iter().all(u8::is_ascii_hexdigit))
        };
        if spaced.match_indices('%').any(|(i, _)| bad(i)) || bad(at) {
            return Err(ApiError::invalid(
                "query",
                format!("bad percent-encoding in {s:?}"),
            ));
        }
    }
    percent_encoding::percent_decode_str(&spaced)
        .decode_utf8()
        .map(|c| c.into_owned())
        .map_err(|_| ApiError::invalid("query", format!("{s:?} does not decode to UTF-8")))
}

/// A duration in whole milliseconds, for JSON.
pub(crate) fn ms(d: Duration) -> u64 {
    d.as_millis().try_into().unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_that_looks_abandoned_is_a_503_with_when_it_can_be_taken_not_a_409_held() {
        let e = redquorum::Error::LockLooksAbandoned {
            name: "nightly".into(),
            ttl: Duration::from_secs(30),
            quiet_for: Duration::from_secs(20),
            takeover_in: Duration::from_millis(10_301),
        };
        let answer = ApiError::from_lib(e, None);
        assert_eq!(
            (answer.status, answer.code),
            (StatusCode::SERVICE_UNAVAILABLE, "looks_abandoned")
        );
        let response = answer.into_response();
        assert_eq!(
            response.headers().get(header::RETRY_AFTER).unwrap(),
            "11",
            "whole seconds, rounded up"
        );
        let held = ApiError::from_lib(redquorum::Error::LockHeld { name: "n".into() }, None);
        assert_eq!((held.status, held.code), (StatusCode::CONFLICT, "held"));
        assert!(held.takeover_in.is_none());
    }

    #[test]
    fn a_query_refuses_unknown_and_repeated_parameters_and_names_them() {
        let e = Query::parse(Some("count=2&cuont=3"), &["count"]).unwrap_err();
        assert_eq!(e.field, Some("query"));
        assert!(e.message.contains("\"cuont\""), "{}", e.message);
        let e = Query::parse(Some("count=2&count=3"), &["count"]).unwrap_err();
        assert!(e.message.contains("twice"), "{}", e.message);
    }

    #[test]
    fn durations_and_numbers_out_of_range_name_their_parameter() {
        let q = Query::parse(
            Some("ttl=1000h&count=0&wait=soon"),
            &["ttl", "count", "wait"],
        )
        .unwrap();
        let range = Duration::from_millis(10)..=Duration::from_secs(60);
        assert_eq!(
            q.duration("ttl", Duration::ZERO, range.clone())
                .unwrap_err()
                .field,
            Some("ttl")
        );
        assert_eq!(
            q.duration("wait", Duration::ZERO, range).unwrap_err().field,
            Some("wait")
        );
        assert_eq!(
            q.number("count", 1, 1..=10).unwrap_err().field,
            Some("count")
        );
    }

    #[test]
    fn percent_encoded_names_decode_and_control_characters_are_refused() {
        let q = Query::parse(Some("id=a%20b+c&bad=x%0Ay"), &["id", "bad"]).unwrap();
        assert_eq!(q.name("id").unwrap().as_deref(), Some("a b c"));
        assert_eq!(q.name("bad").unwrap_err().field, Some("bad"));
        assert!(Query::parse(Some("id=%ZZ"), &["id"]).is_err());
        assert!(Query::parse(Some("id=%FF"), &["id"]).is_err());
    }
}
