//! `POST /v1/ids/{sequence}?count=N`: fencing IDs, the "IDs server" of antirez's article.
//!
//! One generator per sequence, shared by every HTTP caller of this server: concurrent callers
//! join the generator's rounds (its group commit), as callers in one process do. Several
//! servers over one cluster stay unique and in real-time order, as several processes do: an
//! ID returned to a caller is above every ID any server returned before the call started.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::extract::{Path, RawQuery, State};
use axum::response::Response;
use redquorum::IdGenerator;
use serde_json::json;

use super::api::{checked_name, ok, ApiError, Query};
use super::Shared;

/// Most IDs one HTTP call may ask for (the library allows more; a JSON list of them would be
/// megabytes).
pub(crate) const MAX_IDS_PER_REQUEST: u64 = 10_000;

/// Most sequences whose generator a server keeps; beyond, a call gets a generator of its own
/// (correct, without shared rounds).
const MAX_CACHED_SEQUENCES: usize = 4096;

/// The generators this server keeps, one per sequence.
#[derive(Debug, Default)]
pub(crate) struct Generators(Mutex<HashMap<String, IdGenerator>>);

impl Generators {
    fn get(&self, client: &redquorum::Client, sequence: &str) -> Result<IdGenerator, ApiError> {
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(g) = map.get(sequence) {
            return Ok(g.clone());
        }
        let g = IdGenerator::new(client, sequence)
            .map_err(|e| ApiError::from_lib(e, Some("sequence")))?;
        if map.len() < MAX_CACHED_SEQUENCES {
            map.insert(sequence.to_owned(), g.clone());
        }
        Ok(g)
    }
}

/// `POST /v1/ids/{sequence}?count=N` -> `{"sequence", "ids": [...], "first", "last"}`.
pub(crate) async fn next(
    State(shared): State<Arc<Shared>>,
    Path(sequence): Path<String>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let query = Query::parse(query.as_deref(), &["count"])?;
    let sequence = checked_name("sequence", &sequence)?;
    let count = query.number("count", 1, 1..=MAX_IDS_PER_REQUEST)?;
    let generator = shared.ids.get(&shared.client, &sequence)?;
    let ids = generator
        .next_ids(count)
        .await
        .map_err(|e| ApiError::from_lib(e, Some("count")))?;
    let (first, last) = (*ids.start(), *ids.end());
    Ok(ok(json!({
        "sequence": sequence,
        "ids": ids.collect::<Vec<u64>>(),
        "first": first,
        "last": last,
    })))
}
