//! A pool's tables on the quorum nodes: the leader's planner (units read as the fields raised
//! since its last read of each node, lists resolved once and cached, the plan computed only when its inputs
//! changed), the writes of new list fields, their collection, and a member's load of its own
//! lists (only its own ID's hash: data proportional to its units).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use futures::FutureExt;
use tokio::time::Instant;

use super::lists::{field_version, resolve, Resolved};
use super::plan::{self, PlanInputs};
use crate::client::{decode, script_call, Client, Guard, Request, Step};
use crate::error::Error;
use crate::keys::{pool_list_key, Name};
use crate::membership::tables::{Held, Planned, Tables};
use crate::membership::{ListRef, View, ViewState};
use crate::quorum::NodeOutcome;
use crate::scripts::PLIST;

use super::blocking;
use super::since;
use super::unit_log::{Mirrors, UnitsAndSettings};
use super::units::{epoch_id, UnitKeys};

/// List fields per write request.
const WRITE_BATCH: usize = 512;

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
    /// IDs whose process is gone, since when (on this leader's clock).
    away: HashMap<String, Instant>,
    last: Option<(Fingerprint, Option<Planned>)>,
}

/// A pool's side of its group (see the module docs).
pub(crate) struct PoolTables {
    client: Client,
    pool: Name,
    keys: UnitKeys,
    grace: Duration,
    stateless: bool,
    leader: Mutex<LeaderCache>,
    /// The leader's copies of every node's unit register (one reader at a time).
    mirrors: tokio::sync::Mutex<Mirrors>,
    /// Raised whenever the merged units change; never reset (a plan cached under an older
    /// value is never reused for other units, even after the copies were lost).
    generation: AtomicU64,
    /// This member's resolved lists: field -> units.
    mine: Mutex<HashMap<String, Arc<BTreeSet<String>>>>,
    /// When this member (as leader) last collected the pool's removed units.
    last_gc: Mutex<Option<Instant>>,
    /// When the leader last waited for every node in a units read (see `units`).
    last_catch_up: Mutex<Option<Instant>>,
}

/// How often a leader's units read may wait for every node, so a node without a copy gets one.
const CATCH_UP_EVERY: Duration = Duration::from_secs(10);

/// A pool's leader collects removed units at most this often, the first time this long after
/// it first activated a table (see
/// [`Units::collect_removed`](super::Units::collect_removed)).
const GC_EVERY: Duration = Duration::from_secs(600);

impl PoolTables {
    pub(crate) fn new(client: &Client, pool: &Name, grace: Duration, stateless: bool) -> Self {
        PoolTables {
            client: client.clone(),
            pool: pool.clone(),
            keys: UnitKeys::new(pool),
            grace,
            stateless,
            leader: Mutex::default(),
            mirrors: tokio::sync::Mutex::default(),
            generation: AtomicU64::new(0),
            mine: Mutex::default(),
            last_gc: Mutex::default(),
            last_catch_up: Mutex::default(),
        }
    }

    /// The per-node deadline of reads whose size grows with the pool (a unit register of
    /// 100,000 entries is megabytes): the operation timeout, not the node timeout. Writes stay
    /// within the node timeout (`Request::node_deadline`), which a repair waits for them.
    fn bulk(&self) -> Duration {
        self.client.config().operation_timeout()
    }

    fn cache(&self) -> std::sync::MutexGuard<'_, LeaderCache> {
        self.leader.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The pool's units and settings, from a majority: each node sends only the fields changed
    /// since this leader's last read of it (`units_since.lua`: its change log), or its whole
    /// register when the leader holds no valid cursor there (first read, node restarted or
    /// repaired, a write that did not log); the leader keeps a copy of each node's register and
    /// merges the copies of the nodes that answered (`unit_log.rs`). So a unit change costs the
    /// leader O(change) on the wire, and an idle pool one small reply per node.
    async fn units(&self) -> Result<(Arc<UnitsAndSettings>, u64), Error> {
        let mut guard = self.mirrors.lock().await;
        let steps = since::steps(
            guard.cursors(),
            self.keys.clone(),
            epoch_id(),
            rand::random::<u64>() >> 24,
        );
        let request = self.units_request(&guard);
        let tally = self.client.decide(request, steps).await?;
        let replies: Vec<since::RawReply> = tally
            .results()
            .iter()
            .filter(|r| r.outcome.is_applied())
            .filter_map(|r| r.outcome.reply().cloned())
            .collect();
        // Moved out for the fold; a cancelled fold leaves fresh copies (whole reads next time).
        let mirrors = std::mem::take(&mut *guard);
        let (mirrors, folded) = self.fold(mirrors, replies).await?;
        *guard = mirrors;
        tracing::trace!(pool = %self.pool, per_node = ?guard.last, "pool leader read the units");
        let changed = folded.map_err(|e| Error::Internal(format!("pool units read: {e}")))?;
        let generation = if changed {
            self.generation.fetch_add(1, Ordering::SeqCst) + 1
        } else {
            self.generation.load(Ordering::SeqCst)
        };
        Ok((guard.units(), generation))
    }

    /// The request of a units read. A node without a copy here sends its whole register,
    /// which a majority of quick deltas would never wait for: it would never get a cursor and
    /// send megabytes every time. So such a read waits for every node, at most once per
    /// [`CATCH_UP_EVERY`] (a node that is down makes that read wait its deadline). Otherwise
    /// late replies linger a little.
    ///
    /// It counts as a read (`reads_only`: up to the operation timeout, not the node timeout)
    /// although `units_since.lua` writes: only its own change-log bookkeeping (the stamp, the
    /// cursor's binding, a trimmed log), which a repair need not see. The binding names the
    /// node's marker and its last repair (`rq:marked`), which a repair changes: the leader's
    /// cursor there no longer matches and the next read takes the whole register.
    fn units_request(&self, mirrors: &Mirrors) -> Request {
        let nodes = self.client.node_urls().len();
        let mut last = self.last_catch_up.lock().unwrap_or_else(|p| p.into_inner());
        let catch_up =
            mirrors.missing_any(nodes) && last.is_none_or(|t| t.elapsed() >= CATCH_UP_EVERY);
        if catch_up {
            *last = Some(Instant::now());
            Request::vote("pool.units.read")
                .wait_all()
                .within(self.bulk())
                .reads_only()
        } else {
            Request::vote("pool.units.read")
                .within(self.bulk())
                .reads_only()
                .linger(self.client.config().node_timeout())
        }
    }

    /// Decode `replies` and fold them into `mirrors`, on the blocking pool (a whole register
    /// is megabytes). A reply that does not decode is not counted.
    async fn fold(
        &self,
        mut mirrors: Mirrors,
        replies: Vec<since::RawReply>,
    ) -> Result<(Mirrors, Result<bool, String>), Error> {
        let needed = self.client.majority().needed();
        let pool = self.pool.clone();
        blocking(move || {
            let decoded = replies
                .into_iter()
                .filter_map(|(node, marker, v)| match since::decode(node, marker, v) {
                    Ok(r) => Some(r),
                    Err(e) => {
                        tracing::warn!(pool = %pool, node, error = %e, "a unit register reply does not decode: not counted");
                        None
                    }
                })
                .collect();
            let folded = mirrors.fold(decoded, needed);
            Ok((mirrors, folded))
        })
        .await
    }

    /// TEST ONLY: the leader's read of the units ([`PoolTables::units`]) and, per node that
    /// answered, whether it sent its whole register and how many fields.
    #[cfg(feature = "test-util")]
    pub(crate) async fn units_for_tests(
        &self,
    ) -> Result<(BTreeSet<String>, Vec<(bool, usize)>), Error> {
        let (units, _) = self.units().await?;
        let last = self.mirrors.lock().await.last.clone();
        Ok((units.0.clone(), last))
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
            .decide(
                Request::vote("pool.lists.read")
                    .within(self.bulk())
                    .reads_only(),
                read,
            )
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
        let all_units = units.clone();
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
        self.warn_if_unowned(&planned, &all_units);
        let mut cache = self.cache();
        remember_planned(&mut cache, view, &planned, &by_id);
        let planned = (planned.lists != view.lists).then_some(planned);
        cache.last = Some((fingerprint, planned.clone()));
        Ok(planned)
    }

    /// Warn when some units are owned by nobody: by design (a drain leaves the weighted
    /// members to share the units), but an operator should hear of it rather than find units
    /// silently unworked.
    fn warn_if_unowned(&self, planned: &Planned, units: &UnitsAndSettings) {
        let owned: u64 = planned.lists.values().map(|r| r.count).sum();
        let total = units.0.len() as u64;
        if owned < total && !planned.lists.is_empty() {
            tracing::warn!(
                pool = %self.pool,
                unowned = total - owned,
                drained = ?units.1.drained,
                "units owned by nobody: every member present with a weight is drained or away"
            );
        }
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
                .decide(Request::vote("pool.lists.write"), step)
                .await?;
        }
        Ok(())
    }

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

    /// Collect the list fields no view at or after the active `view` can need: below each
    /// list's snapshot, and every field at or below the view's token of IDs it no longer names.
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

/// Cache the lists the leader planned (`by_id`: each member ID's units): the leader knows them
/// (a field's name is its content's digest), so it never reads its own lists back.
fn remember_planned(
    cache: &mut LeaderCache,
    view: &View,
    planned: &Planned,
    by_id: &BTreeMap<String, BTreeSet<String>>,
) {
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
