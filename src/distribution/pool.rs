//! A pool's tables on the quorum nodes: the leader's planner (units read only when a node's
//! change stamp moved, lists resolved once and cached, the plan computed only when its inputs
//! changed), the writes of new list fields, their collection, and a member's load of its own
//! lists (only its own ID's hash: data proportional to its units).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use futures::FutureExt;
use tokio::time::Instant;

use super::lists::{field_version, resolve, Resolved};
use super::plan::{self, PlanInputs};
use crate::client::{decode, script_call, Client, Guard, Request, Step};
use crate::error::Error;
use crate::keys::{pool_list_key, KeyKind, Name};
use crate::membership::tables::{Held, Planned, Tables};
use crate::membership::{ListRef, View, ViewState};
use crate::quorum::NodeOutcome;
use crate::scripts::PLIST;

use super::blocking;
use super::units::PoolSettings;

/// List fields per write request.
const WRITE_BATCH: usize = 512;

/// The units as a leader last read them, with every node's stamp at that read.
struct UnitsSeen {
    stamps: BTreeMap<Arc<str>, u64>,
    units: Arc<UnitsAndSettings>,
    generation: u64,
}

/// A pool's units and its settings (one register).
type UnitsAndSettings = (BTreeSet<String>, PoolSettings);

/// What the plan was computed from (recomputed only when this changes).
#[derive(Clone, PartialEq, Eq)]
struct Fingerprint {
    view: crate::membership::ViewVersion,
    live: BTreeSet<String>,
    away: BTreeSet<String>,
    units: u64,
}

/// A resolved list: its units and the version of its chain's snapshot.
type Known = (Arc<BTreeSet<String>>, u64);

#[derive(Default)]
struct LeaderCache {
    /// (ID, field) -> the list, resolved.
    lists: HashMap<(String, String), Known>,
    units: Option<UnitsSeen>,
    /// IDs whose process is gone, since when (on this leader's clock).
    away: HashMap<String, Instant>,
    last: Option<(Fingerprint, Option<Planned>)>,
}

/// A pool's side of its group (see the module docs).
pub(crate) struct PoolTables {
    client: Client,
    pool: Name,
    units_key: String,
    stamp_key: String,
    grace: Duration,
    stateless: bool,
    leader: Mutex<LeaderCache>,
    /// This member's resolved lists: field -> units.
    mine: Mutex<HashMap<String, Arc<BTreeSet<String>>>>,
    /// When this member (as leader) last collected the pool's removed units.
    last_gc: Mutex<Option<Instant>>,
}

/// A pool's leader collects removed units at most this often, the first time this long after
/// it first activated a table (see
/// [`Units::collect_removed`](super::Units::collect_removed)).
const GC_EVERY: Duration = Duration::from_secs(600);

impl PoolTables {
    pub(crate) fn new(client: &Client, pool: &Name, grace: Duration, stateless: bool) -> Self {
        PoolTables {
            client: client.clone(),
            pool: pool.clone(),
            units_key: pool.key(KeyKind::Units),
            stamp_key: pool.key(KeyKind::UnitStamp),
            grace,
            stateless,
            leader: Mutex::default(),
            mine: Mutex::default(),
            last_gc: Mutex::default(),
        }
    }

    /// The per-node deadline of reads and writes whose size grows with the pool (a unit
    /// register of 100,000 entries is megabytes): the operation timeout, not the node timeout.
    fn bulk(&self) -> Duration {
        self.client.config().operation_timeout()
    }

    fn cache(&self) -> std::sync::MutexGuard<'_, LeaderCache> {
        self.leader.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The pool's units and settings: read again only when some node's stamp moved since the
    /// last read.
    async fn units(&self) -> Result<(Arc<UnitsAndSettings>, u64), Error> {
        let stamp_key = self.stamp_key.clone();
        let read = Step::read(vec![get(&stamp_key)], |ctx, v| {
            let stamp: Option<u64> = redis::from_redis_value(v)?;
            Ok(NodeOutcome::Applied((
                ctx.marker.clone(),
                stamp.unwrap_or(0),
            )))
        });
        let tally = self
            .client
            .decide(Request::vote("pool.units.stamp"), read)
            .await?;
        if let Some(seen) = &self.cache().units {
            let unchanged = tally
                .replies()
                .all(|(_, (m, s))| seen.stamps.get(m) == Some(s));
            if unchanged {
                return Ok((seen.units.clone(), seen.generation));
            }
        }
        // The stamp is read before the units in one round trip: a write in between shows up
        // as a changed stamp next time (a re-read), never as a missed change.
        let mut all = redis::cmd("HGETALL");
        all.arg(&self.units_key);
        // The register is decoded and merged off the async runtime (megabytes for a large
        // pool): the replies are kept as raw values here.
        let read = Step::read(vec![get(&stamp_key), all], |ctx, v| {
            let (stamp, units): (Option<u64>, redis::Value) = redis::from_redis_value(v)?;
            Ok(NodeOutcome::Applied((
                ctx.marker.clone(),
                stamp.unwrap_or(0),
                units,
            )))
        });
        let tally = self
            .client
            .decide(Request::vote("pool.units.read").within(self.bulk()), read)
            .await?;
        let stamps = tally
            .replies()
            .map(|(_, (m, s, _))| (m.clone(), *s))
            .collect();
        let raw: Vec<redis::Value> = tally.replies().map(|(_, (_, _, u))| u.clone()).collect();
        let units = Arc::new(
            blocking(move || {
                let nodes = raw
                    .into_iter()
                    .map(redis::from_redis_value::<BTreeMap<String, String>>)
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| Error::Internal(format!("a unit register: {e}")))?;
                Ok(super::units::merge_all(nodes.iter()))
            })
            .await?,
        );
        let mut cache = self.cache();
        let generation = cache.units.as_ref().map_or(1, |u| u.generation + 1);
        cache.units = Some(UnitsSeen {
            stamps,
            units: units.clone(),
            generation,
        });
        Ok((units, generation))
    }

    /// The fields of these IDs' list hashes, merged from a majority (each field is immutable:
    /// the union).
    async fn read_lists(&self, ids: &[String]) -> Result<Vec<HashMap<String, String>>, Error> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let cmds: Vec<redis::Cmd> = ids
            .iter()
            .map(|id| {
                let mut c = redis::cmd("HGETALL");
                c.arg(pool_list_key(&self.pool, id));
                c
            })
            .collect();
        let many = ids.len() > 1;
        let read = Step::read(cmds, move |_, v| {
            if many {
                decode::value::<Vec<HashMap<String, String>>>(v)
            } else {
                Ok(NodeOutcome::Applied(vec![redis::from_redis_value(v)?]))
            }
        });
        let tally = self
            .client
            .decide(Request::vote("pool.lists.read").within(self.bulk()), read)
            .await?;
        let mut merged = vec![HashMap::new(); ids.len()];
        for (_, hashes) in tally.replies() {
            for (m, h) in merged.iter_mut().zip(hashes) {
                for (f, p) in h {
                    m.entry(f.clone()).or_insert_with(|| p.clone());
                }
            }
        }
        Ok(merged)
    }

    /// Resolve (and cache) every list of `lists` the leader has not resolved yet.
    async fn resolve_all(
        &self,
        lists: &BTreeMap<String, ListRef>,
    ) -> Result<HashMap<String, Arc<BTreeSet<String>>>, Error> {
        let missing: Vec<(String, ListRef)> = {
            let cache = self.cache();
            lists
                .iter()
                .filter(|(id, r)| !cache.lists.contains_key(&((*id).clone(), r.field.clone())))
                .map(|(id, r)| (id.clone(), r.clone()))
                .collect()
        };
        let ids: Vec<String> = missing.iter().map(|(id, _)| id.clone()).collect();
        let fields = self.read_lists(&ids).await?;
        let resolved = blocking(move || {
            missing
                .into_iter()
                .zip(&fields)
                .map(|((id, r), f)| {
                    let Resolved { units, snapshot } = resolve(f, &r).map_err(Error::Internal)?;
                    Ok(((id, r.field), (Arc::new(units), snapshot)))
                })
                .collect::<Result<Vec<_>, Error>>()
        })
        .await?;
        let mut cache = self.cache();
        cache.lists.extend(resolved);
        Ok(lists
            .iter()
            .filter_map(|(id, r)| {
                let units = cache.lists.get(&(id.clone(), r.field.clone()))?.0.clone();
                Some((id.clone(), units))
            })
            .collect())
    }

    /// Every list of `lists`, resolved (for a reader of the whole table).
    pub(crate) async fn resolve_lists(
        &self,
        lists: &BTreeMap<String, ListRef>,
    ) -> Result<BTreeMap<String, BTreeSet<String>>, Error> {
        let ids: Vec<String> = lists.keys().cloned().collect();
        let fields = self.read_lists(&ids).await?;
        let lists = lists.clone();
        blocking(move || {
            lists
                .iter()
                .zip(&fields)
                .map(|((id, r), f)| Ok((id.clone(), resolve(f, r).map_err(Error::Internal)?.units)))
                .collect()
        })
        .await
    }

    /// IDs of the view's lists whose process is not live: away within their grace.
    fn away(&self, view: &View, live: &BTreeSet<String>) -> BTreeSet<String> {
        let workers = plan::workers(&view.lists, live);
        let now = Instant::now();
        let mut cache = self.cache();
        cache
            .away
            .retain(|id, _| !workers.contains_key(id) && view.lists.contains_key(id));
        view.lists
            .keys()
            .filter(|id| !workers.contains_key(*id))
            .filter(|id| {
                let since = *cache.away.entry((*id).clone()).or_insert(now);
                now.duration_since(since) < self.grace
            })
            .cloned()
            .collect()
    }

    async fn plan_inner(
        &self,
        view: &View,
        live: &BTreeSet<String>,
    ) -> Result<Option<Planned>, Error> {
        let (units, generation) = self.units().await?;
        let away = self.away(view, live);
        let fingerprint = Fingerprint {
            view: view.version,
            live: live.clone(),
            away: away.clone(),
            units: generation,
        };
        if let Some((f, planned)) = &self.cache().last {
            if *f == fingerprint {
                return Ok(planned.clone());
            }
        }
        let resolved = self.resolve_all(&view.lists).await?;
        let version = view
            .version
            .token()
            .map(|t| t.get() + 1)
            .ok_or_else(|| Error::Internal("view version out of range".into()))?;
        let (lists, live_keys, stateless, pool) = (
            view.lists.clone(),
            live.clone(),
            self.stateless,
            self.pool.clone(),
        );
        let (planned, by_id) = blocking(move || {
            let inputs = PlanInputs {
                lists: &lists,
                resolved: &resolved,
                live: &live_keys,
                away: &away,
                units: &units.0,
                settings: &units.1,
                stateless,
                version,
            };
            Ok(plan::plan(&inputs, |id| pool_list_key(&pool, id)))
        })
        .await?;
        let mut cache = self.cache();
        // The leader knows the lists it plans (a field's name is its content's digest): cache
        // them, so it never reads its own lists back.
        for (id, r) in &planned.lists {
            let key = (id.clone(), r.field.clone());
            if cache.lists.contains_key(&key) {
                continue;
            }
            let snapshot = match view.lists.get(id) {
                Some(old) if r.chain > 0 => cache
                    .lists
                    .get(&(id.clone(), old.field.clone()))
                    .map_or(0, |e| e.1),
                _ => field_version(&r.field).unwrap_or(0),
            };
            let units = Arc::new(by_id.get(id).cloned().unwrap_or_default());
            cache.lists.insert(key, (units, snapshot));
        }
        let planned = (planned.lists != view.lists).then_some(planned);
        cache.last = Some((fingerprint, planned.clone()));
        Ok(planned)
    }

    async fn write_inner(&self, planned: &Planned) -> Result<(), Error> {
        for chunk in planned.writes.chunks(WRITE_BATCH) {
            let mut call = script_call(&PLIST, Guard::Marker).marker_key();
            for w in chunk {
                call = call.key(w.key.clone());
            }
            call = call.marker().arg("w");
            for (i, w) in chunk.iter().enumerate() {
                call = call.arg(i + 2).arg(&w.field).arg(&w.payload);
            }
            let step = call.decode(|_, v| decode::count_or_refusal(v));
            self.client
                .decide(Request::vote("pool.lists.write").within(self.bulk()), step)
                .await?;
        }
        Ok(())
    }

    /// Collect the list fields no view at or after the active `view` can need: below each
    /// list's snapshot, and every field at or below the view's token of IDs it no longer names.
    /// Collect the pool's removed units, at most every [`GC_EVERY`] (a leader's chore after
    /// an activation).
    async fn collect_removed(&self) {
        {
            // The first activation only starts the clock: a new leader has enough to read.
            let mut last = self.last_gc.lock().unwrap_or_else(|p| p.into_inner());
            match *last {
                None => {
                    *last = Some(Instant::now());
                    return;
                }
                Some(t) if t.elapsed() < GC_EVERY => return,
                Some(_) => *last = Some(Instant::now()),
            }
        }
        match super::Units::new(&self.client, self.pool.as_str()) {
            Ok(units) => match units.collect_removed().await {
                Ok(n) => {
                    tracing::debug!(pool = %self.pool, collected = n, "removed units collected")
                }
                Err(e) => {
                    tracing::debug!(pool = %self.pool, error = %e, "cannot collect removed units")
                }
            },
            Err(e) => {
                tracing::debug!(pool = %self.pool, error = %e, "cannot collect removed units")
            }
        }
    }

    async fn collect(&self, view: View) {
        self.collect_removed().await;
        let Some(token) = view.version.token().map(|t| t.get()) else {
            return;
        };
        let floors: Vec<(String, u64)> = {
            let mut cache = self.cache();
            let mut floors: Vec<(String, u64)> = view
                .lists
                .iter()
                .filter_map(|(id, r)| {
                    let snap = cache.lists.get(&(id.clone(), r.field.clone()))?.1;
                    Some((id.clone(), snap))
                })
                .collect();
            let gone: BTreeSet<String> = cache
                .lists
                .keys()
                .map(|(id, _)| id.clone())
                .filter(|id| !view.lists.contains_key(id))
                .collect();
            floors.extend(gone.iter().map(|id| (id.clone(), token + 1)));
            // Keep in memory only what this view names.
            cache
                .lists
                .retain(|(id, f), _| view.lists.get(id).is_some_and(|r| r.field == *f));
            floors
        };
        for chunk in floors.chunks(WRITE_BATCH) {
            let mut call = script_call(&PLIST, Guard::Marker).marker_key();
            for (id, _) in chunk {
                call = call.key(pool_list_key(&self.pool, id));
            }
            call = call.marker().arg("p");
            for (_, floor) in chunk {
                call = call.arg(*floor);
            }
            let step = call.decode(|_, v| decode::value::<i64>(v));
            let _ = self
                .client
                .send(Request::vote("pool.lists.collect"), step)
                .await;
        }
    }

    async fn load_inner(&self, view: &View, key: &str) -> Result<Held, Error> {
        let current = view.list_of(key);
        let previous = match view.state {
            ViewState::Prepare => view
                .previous_view()
                .list_of(key)
                .map(|(i, r)| (i.to_string(), r.clone())),
            ViewState::Active => None,
        };
        let wanted: Vec<ListRef> = current
            .map(|(_, r)| r.clone())
            .into_iter()
            .chain(previous.as_ref().map(|(_, r)| r.clone()))
            .collect();
        let Some(id) = current
            .map(|(id, _)| id.to_string())
            .or_else(|| previous.as_ref().map(|(id, _)| id.clone()))
        else {
            return Ok(Held::default());
        };
        let cached = |r: &ListRef| -> Option<Arc<BTreeSet<String>>> {
            self.mine
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(&r.field)
                .cloned()
        };
        if wanted.iter().any(|r| cached(r).is_none()) {
            let fields = self.read_lists(std::slice::from_ref(&id)).await?;
            let fields = fields.into_iter().next().unwrap_or_default();
            let want = wanted.clone();
            let loaded = blocking(move || {
                want.iter()
                    .map(|r| {
                        let units = resolve(&fields, r).map_err(Error::Internal)?.units;
                        Ok((r.field.clone(), Arc::new(units)))
                    })
                    .collect::<Result<Vec<_>, Error>>()
            })
            .await?;
            let mut mine = self.mine.lock().unwrap_or_else(|p| p.into_inner());
            mine.retain(|f, _| wanted.iter().any(|r| r.field == *f));
            mine.extend(loaded);
        }
        let get = |r: Option<&ListRef>| r.and_then(cached).unwrap_or_default();
        Ok(Held {
            current: get(current.map(|(_, r)| r)),
            previous: get(previous.as_ref().map(|(_, r)| r)),
        })
    }
}

fn get(key: &str) -> redis::Cmd {
    let mut c = redis::cmd("GET");
    c.arg(key);
    c
}

impl Tables for PoolTables {
    fn plan<'a>(
        &'a self,
        view: &'a View,
        live: &'a BTreeSet<String>,
    ) -> BoxFuture<'a, Result<Option<Planned>, Error>> {
        self.plan_inner(view, live).boxed()
    }

    fn write<'a>(&'a self, planned: &'a Planned) -> BoxFuture<'a, Result<(), Error>> {
        self.write_inner(planned).boxed()
    }

    fn load<'a>(&'a self, view: &'a View, key: &'a str) -> BoxFuture<'a, Result<Held, Error>> {
        self.load_inner(view, key).boxed()
    }

    fn activated(self: Arc<Self>, view: &View) {
        let view = view.clone();
        tokio::spawn(async move { self.collect(view).await });
    }
}
