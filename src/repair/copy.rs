//! Copying the cluster's state onto nodes, page by page: the part of a repair (and of a change
//! of the node list) that reads every key from a set of source nodes and raises target nodes
//! to it.
//!
//! Each source's keyspace is walked with `SCAN ... MATCH rq:*` a page at a time; the keys of a
//! page are read from EVERY source (a pipeline each), merged (the highest register, the newest
//! view, the newest lease copy, each hash field's highest value), and written to the targets
//! with the same monotonic scripts the protocols use (idempotent, so a key several sources
//! hold is simply written more than once). Memory stays bounded by a page,
//! each page has its own deadline, and a keyspace of any size finishes.
//!
//! Keys that appear on the sources after the copy started were accepted by majorities without
//! the targets (which were quarantined, or not yet marked), so the copy need not include
//! them: any later majority meets those majorities at a node other than the targets.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use crate::client::{Client, NodeConn, Request, Step, Targets};
use crate::keys::{fixed_key, KeyKind};
use crate::quorum::NodeOutcome;
use crate::scripts::{RAISE, RESTORE, VIEW_WRITE};

/// Keys per SCAN page.
const PAGE: usize = 1000;

/// The pattern every state key matches (a fixed string: user names never reach a pattern).
const STATE_PATTERN: &str = "rq:*";

/// What kind of state a key holds, from its prefix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A monotonic register (string): ID sequences, lock fences.
    Register,
    /// A group's view register (hash token, view, hash).
    View,
    /// A lease key (hash v, n, t), restored beside its fence key.
    Lease,
    /// A hash merged field by field.
    Hash(HashMerge),
}

/// Key prefixes and their kinds. Anything else under `rq:` (the marker, the descriptor, a
/// repair claim) is not copied.
const KINDS: &[(&str, Kind)] = &[
    ("rq:id:", Kind::Register),
    ("rq:fence:", Kind::Register),
    ("rq:gfence:", Kind::Register),
    ("rq:floor", Kind::Register),
    ("rq:view:", Kind::View),
    ("rq:lock:", Kind::Lease),
    ("rq:glock:", Kind::Lease),
    ("rq:done:", Kind::Hash(HashMerge::Max)),
    ("rq:ack:", Kind::Hash(HashMerge::Max)),
    ("rq:members:", Kind::Hash(HashMerge::IfAbsent)),
];

/// The kind of state `key` holds, if it is state to copy.
pub(crate) fn classify(key: &str) -> Option<Kind> {
    KINDS
        .iter()
        .find(|(prefix, _)| key.starts_with(prefix))
        .map(|(_, kind)| *kind)
}

/// A lease key's fence key (`rq:lock:x` -> `rq:fence:x`, `rq:glock:g` -> `rq:gfence:g`).
fn fence_of(lease_key: &str) -> Option<String> {
    if let Some(name) = lease_key.strip_prefix("rq:lock:") {
        Some(format!("rq:fence:{name}"))
    } else {
        lease_key
            .strip_prefix("rq:glock:")
            .map(|name| format!("rq:gfence:{name}"))
    }
}

/// How a hash is merged field by field.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum HashMerge {
    /// Each field raised to its highest value (completion records, acknowledgements).
    Max,
    /// A field written where missing (membership beats).
    IfAbsent,
}

impl HashMerge {
    fn mode(self) -> &'static str {
        match self {
            HashMerge::Max => "max",
            HashMerge::IfAbsent => "absent",
        }
    }
}

/// A lease key's content: holder value, version, ttl (ms).
type LeaseCopy = (String, u64, u64);

/// What one source holds of the keys of one page.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Holdings {
    pub(crate) registers: BTreeMap<String, u64>,
    /// Group view registers: key -> (version token, view JSON).
    pub(crate) views: BTreeMap<String, (u64, String)>,
    /// Lease keys: key -> (value, version, ttl ms).
    pub(crate) leases: BTreeMap<String, LeaseCopy>,
    /// Merged hashes: key -> field -> value.
    pub(crate) hashes: BTreeMap<String, BTreeMap<String, String>>,
}

/// The fencing token inside a lease value (`random:token:holder`).
fn lease_token(value: &str) -> u64 {
    value
        .split(':')
        .nth(1)
        .and_then(|t| t.parse().ok())
        .unwrap_or(0)
}

/// What the targets must be given.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Plan {
    /// Registers and the value each is raised to.
    pub(crate) registers: Vec<(String, u64)>,
    /// Per view key the newest view the sources hold.
    pub(crate) views: Vec<(String, (u64, String))>,
    /// View keys whose newest view has a sibling on the sources (another view derived from the
    /// same base): which of the two a majority adopted may have been decided on the target
    /// alone, so the copy must wait until a later seal moves the chain past both.
    pub(crate) ambiguous: Vec<String>,
    /// Per lease key the newest copy (highest token, then highest version).
    pub(crate) leases: BTreeMap<String, LeaseCopy>,
    /// Per hash field the highest value (or any, for beats).
    pub(crate) hashes: BTreeMap<String, (HashMerge, BTreeMap<String, String>)>,
}

impl Plan {
    fn is_empty(&self) -> bool {
        self.registers.is_empty()
            && self.views.is_empty()
            && self.leases.is_empty()
            && self.hashes.is_empty()
    }
}

/// Merge what the sources hold. `server_clock_leases` is the TEST-ONLY unsafe mode in which a
/// lost lease copy or beat stays lost.
pub(crate) fn plan(sources: &[&Holdings], server_clock_leases: bool) -> Plan {
    let mut registers: BTreeMap<String, u64> = BTreeMap::new();
    let mut all_views: BTreeMap<String, BTreeMap<u64, String>> = BTreeMap::new();
    let mut leases: BTreeMap<String, LeaseCopy> = BTreeMap::new();
    let mut hashes: BTreeMap<String, (HashMerge, BTreeMap<String, String>)> = BTreeMap::new();
    for h in sources {
        for (k, v) in &h.registers {
            let e = registers.entry(k.clone()).or_insert(0);
            *e = (*e).max(*v);
        }
        for (k, (t, v)) in &h.views {
            all_views
                .entry(k.clone())
                .or_default()
                .insert(*t, v.clone());
        }
        if server_clock_leases {
            continue;
        }
        for (k, copy) in &h.leases {
            let newer = leases
                .get(k)
                .is_none_or(|old| (lease_token(&copy.0), copy.1) > (lease_token(&old.0), old.1));
            if newer {
                leases.insert(k.clone(), copy.clone());
            }
        }
    }
    for h in sources {
        for (k, fields) in &h.hashes {
            let Some(Kind::Hash(merge)) = classify(k) else {
                continue;
            };
            if server_clock_leases && merge == HashMerge::IfAbsent {
                continue;
            }
            let entry = hashes
                .entry(k.clone())
                .or_insert_with(|| (merge, BTreeMap::new()));
            for (f, v) in fields {
                let keep = entry.1.get(f).is_some_and(|old| {
                    merge == HashMerge::IfAbsent
                        || old.parse::<u64>().unwrap_or(0) >= v.parse::<u64>().unwrap_or(0)
                });
                if !keep {
                    entry.1.insert(f.clone(), v.clone());
                }
            }
        }
    }
    Plan {
        registers: registers.into_iter().collect(),
        ambiguous: all_views
            .iter()
            .filter(|(_, vs)| newest_has_sibling(vs))
            .map(|(k, _)| k.clone())
            .collect(),
        views: all_views
            .into_iter()
            .filter_map(|(k, vs)| vs.into_iter().next_back().map(|(t, v)| (k, (t, v))))
            .collect(),
        leases,
        hashes,
    }
}

/// Whether the newest of these views (token -> JSON) shares its base with another one.
fn newest_has_sibling(views: &BTreeMap<u64, String>) -> bool {
    let base = |json: &String| {
        serde_json::from_str::<crate::membership::View>(json)
            .ok()
            .map(|v| v.base)
    };
    let Some((newest, json)) = views.iter().next_back() else {
        return false;
    };
    let Some(newest_base) = base(json) else {
        return false;
    };
    views
        .iter()
        .any(|(t, v)| t != newest && base(v) == Some(newest_base))
}

/// Read the given keys from one node, each by its kind, in one pipeline. A key of an
/// unexpected type (an older layout) or with a value that does not parse is skipped.
async fn read_keys(mut nc: NodeConn, keys: &[String]) -> redis::RedisResult<Holdings> {
    let mut pipe = redis::pipe();
    pipe.ignore_errors();
    let kinds: Vec<Kind> = keys.iter().filter_map(|k| classify(k)).collect();
    for (key, kind) in keys.iter().zip(&kinds) {
        match kind {
            Kind::Register => pipe.cmd("GET").arg(key),
            Kind::View => pipe.cmd("HMGET").arg(key).arg("token").arg("view"),
            Kind::Lease => pipe.cmd("HMGET").arg(key).arg("v").arg("n").arg("t"),
            Kind::Hash(_) => pipe.cmd("HGETALL").arg(key),
        };
    }
    let replies: Vec<redis::RedisResult<redis::Value>> = pipe.query_async(&mut nc.conn).await?;
    let mut h = Holdings::default();
    for ((key, kind), reply) in keys.iter().zip(&kinds).zip(replies) {
        let Ok(value) = reply else { continue };
        match kind {
            Kind::Register => {
                if let Ok(Some(v)) = redis::from_redis_value::<Option<u64>>(value) {
                    h.registers.insert(key.clone(), v);
                }
            }
            Kind::View => {
                if let Ok((Some(t), Some(v))) =
                    redis::from_redis_value::<(Option<u64>, Option<String>)>(value)
                {
                    h.views.insert(key.clone(), (t, v));
                }
            }
            Kind::Lease => {
                if let Ok((Some(v), Some(n), Some(t))) =
                    redis::from_redis_value::<(Option<String>, Option<u64>, Option<u64>)>(value)
                {
                    h.leases.insert(key.clone(), (v, n, t));
                }
            }
            Kind::Hash(_) => {
                if let Ok(fields) = redis::from_redis_value::<BTreeMap<String, String>>(value) {
                    if !fields.is_empty() {
                        h.hashes.insert(key.clone(), fields);
                    }
                }
            }
        }
    }
    Ok(h)
}

/// Raise one node to `plan`, only while it is still the incarnation `run_id` (when given).
/// Applied(number of keys or fields written), or Rejected when the node restarted.
async fn raise(
    mut nc: NodeConn,
    plan: &Plan,
    run_id: Option<&str>,
) -> redis::RedisResult<NodeOutcome<usize>> {
    if run_id.is_some_and(|r| nc.run_id() != r) {
        return Ok(NodeOutcome::Rejected(0));
    }
    let mut raised = 0usize;
    for chunk in plan.registers.chunks(200) {
        let mut inv = RAISE.prepare_invoke();
        for (k, v) in chunk {
            inv.key(k).arg(*v);
        }
        raised += inv.invoke_async::<usize>(&mut nc.conn).await?;
    }
    for (key, (token, view)) in &plan.views {
        // The view register's own compare-and-set on the view's base, without the marker
        // check: the node is being repaired precisely because its marker is missing or stale.
        let Ok(parsed) = serde_json::from_str::<crate::membership::View>(view) else {
            continue;
        };
        let base = parsed.base.token().map(|t| t.get()).unwrap_or(0);
        let (stored, _): (i64, u64) = VIEW_WRITE
            .key(key)
            .key(fixed_key(KeyKind::Marker))
            .arg(*token)
            .arg(view)
            .arg(crate::membership::View::digest(view))
            .arg(base)
            .arg("*")
            .invoke_async(&mut nc.conn)
            .await?;
        raised += usize::from(stored == 1);
    }
    for (key, (value, version, ttl)) in &plan.leases {
        let Some(fence_key) = fence_of(key) else {
            continue;
        };
        let written: usize = RESTORE
            .key(key)
            .key(&fence_key)
            .arg("lease")
            .arg(value)
            .arg(*version)
            .arg(*ttl)
            .arg(lease_token(value))
            .invoke_async(&mut nc.conn)
            .await?;
        raised += written;
    }
    for (key, (merge, fields)) in &plan.hashes {
        for chunk in fields.iter().collect::<Vec<_>>().chunks(200) {
            let mut inv = RESTORE.prepare_invoke();
            inv.key(key).key(key).arg(merge.mode());
            for (f, v) in chunk {
                inv.arg(*f).arg(*v);
            }
            raised += inv.invoke_async::<usize>(&mut nc.conn).await?;
        }
    }
    Ok(NodeOutcome::Applied(raised))
}

/// How a paged copy ended.
#[derive(Clone, Debug, Default)]
pub(crate) struct Copied {
    /// Keys or fields written, summed over the targets.
    pub(crate) written: usize,
    /// Keys read from the sources.
    pub(crate) keys: usize,
    /// The targets that took every page, with the run_id they kept throughout.
    pub(crate) complete: BTreeMap<usize, String>,
}

impl Client {
    /// Copy what `sources` (nodes of this client) hold onto `targets` (nodes of `target`, with
    /// the run_id each must keep), page by page. `between_pages` runs after every page (a
    /// repair refreshes its claim there; an error stops the copy).
    ///
    /// # Errors
    /// A message when a source stops answering (the copy must cover every source's keys), or
    /// when no target takes a page.
    pub(crate) async fn copy_paged<F, Fut>(
        &self,
        sources: &[usize],
        target: &Client,
        targets: BTreeMap<usize, String>,
        mut between_pages: F,
    ) -> Result<Copied, String>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<(), String>>,
    {
        let mut copied = Copied {
            complete: targets,
            ..Copied::default()
        };
        for &source in sources {
            let mut cursor: u64 = 0;
            loop {
                let (next, keys) = self.scan_page(source, cursor).await?;
                if !keys.is_empty() {
                    self.copy_page(sources, target, keys, &mut copied).await?;
                }
                between_pages().await?;
                if next == 0 {
                    break;
                }
                cursor = next;
            }
        }
        Ok(copied)
    }

    /// One SCAN page of `source`: the next cursor and the state keys on the page.
    async fn scan_page(&self, source: usize, cursor: u64) -> Result<(u64, Vec<String>), String> {
        let scan = Step::session(move |mut nc: NodeConn| async move {
            let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(STATE_PATTERN)
                .arg("COUNT")
                .arg(PAGE)
                .query_async(&mut nc.conn)
                .await?;
            Ok(NodeOutcome::Applied((next, keys)))
        });
        let request = Request::any_node("repair.scan", Targets::Only(source))
            .within(self.inner.config.operation_timeout);
        let tally = self.send(request, scan).await;
        let Some((next, keys)) = tally.replies().next().map(|(_, r)| r.clone()) else {
            return Err(format!(
                "source node{source} stopped answering during the copy"
            ));
        };
        Ok((
            next,
            keys.into_iter().filter(|k| classify(k).is_some()).collect(),
        ))
    }

    /// Read one page of keys from every source, merge, and raise the targets that are still
    /// complete (dropping those that did not take it).
    async fn copy_page(
        &self,
        sources: &[usize],
        target: &Client,
        keys: Vec<String>,
        copied: &mut Copied,
    ) -> Result<(), String> {
        let deadline = self.inner.config.operation_timeout;
        let page: Arc<Vec<String>> = Arc::new(keys);
        let p = page.clone();
        let read = Step::session(move |nc: NodeConn| {
            let p = p.clone();
            async move { read_keys(nc, &p).await.map(NodeOutcome::Applied) }
        });
        let request = Request::any_node("repair.page", Targets::of(sources)).within(deadline);
        let reads = self.send(request, read).await;
        let read: BTreeMap<usize, Holdings> =
            reads.replies().map(|(id, h)| (id.0, h.clone())).collect();
        if let Some(missing) = sources.iter().find(|s| !read.contains_key(s)) {
            return Err(format!(
                "source node{missing} stopped answering during the copy"
            ));
        }
        // Every key of the page is copied, also keys an earlier source holds: SCAN need not
        // return a key created on that source after its scan passed.
        copied.keys += page.len();
        let plan = Arc::new(plan(
            &read.values().collect::<Vec<_>>(),
            self.inner.config.server_clock_leases,
        ));
        if let Some(key) = plan.ambiguous.first() {
            return Err(format!(
                "the sources hold two views of {key} derived from one base; the repair waits \
                 for the next seal"
            ));
        }
        if plan.is_empty() {
            return Ok(());
        }
        let runs = Arc::new(copied.complete.clone());
        let nodes: Vec<usize> = runs.keys().copied().collect();
        let write = Step::session(move |nc: NodeConn| {
            let (plan, runs) = (plan.clone(), runs.clone());
            async move {
                let run = runs.get(&nc.node()).cloned();
                raise(nc, &plan, run.as_deref()).await
            }
        });
        let request = Request::any_node("repair.write", Targets::of(&nodes)).within(deadline);
        let write = target.send(request, write).await;
        let mut took = BTreeSet::new();
        for r in write.results() {
            if let NodeOutcome::Applied(n) = r.outcome {
                copied.written += n;
                took.insert(r.node.0);
            }
        }
        copied.complete.retain(|node, _| took.contains(node));
        if copied.complete.is_empty() {
            return Err("no target took the copy (restarted or unreachable)".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn holdings(registers: &[(&str, u64)], beats: &[(&str, &str)]) -> Holdings {
        let mut h = Holdings {
            registers: registers.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
            ..Holdings::default()
        };
        if !beats.is_empty() {
            h.hashes.insert(
                "rq:members:g".into(),
                beats
                    .iter()
                    .map(|(f, v)| (f.to_string(), v.to_string()))
                    .collect(),
            );
        }
        h
    }

    #[test]
    fn a_newest_view_with_a_sibling_on_the_sources_is_ambiguous() {
        use crate::membership::View;
        let set = |ids: &[&str]| ids.iter().map(|s| s.to_string()).collect();
        let v1 = View::empty().next(&set(&["a"]), 1);
        let x = v1.next(&set(&["a", "c"]), 1); // (1, 2), base v1
        let w = v1.next(&set(&["a", "d"]), 2); // (2, 1), base v1: a sibling of x
        let w2 = x.next(&set(&["a", "e"]), 2); // (2, 1) in another chain: base x
        let json = |v: &View| serde_json::to_string(v).expect("json");
        let tok = |v: &View| v.version.token().expect("t").get();
        let holding = |views: &[&View]| Holdings {
            views: views
                .iter()
                .map(|v| ("rq:view:g".to_string(), (tok(v), json(v))))
                .collect::<Vec<_>>()
                .into_iter()
                .take(1)
                .collect(),
            ..Holdings::default()
        };
        let (hx, hw) = (holding(&[&x]), holding(&[&w]));
        let p = plan(&[&hx, &hw], false);
        assert_eq!(
            p.ambiguous,
            vec!["rq:view:g".to_string()],
            "x and w share a base"
        );
        let mut w2 = w2;
        w2.version.seq = 2;
        let hw2 = holding(&[&w2]);
        let p = plan(&[&hx, &hw2], false);
        assert!(p.ambiguous.is_empty(), "w2 derives from x: one chain");
        assert_eq!(p.views[0].1 .0, tok(&w2));
    }

    #[test]
    fn only_state_keys_are_copied() {
        assert_eq!(classify("rq:id:orders"), Some(Kind::Register));
        assert_eq!(
            classify("rq:members:g"),
            Some(Kind::Hash(HashMerge::IfAbsent))
        );
        for not_state in [
            "rq:marker",
            "rq:cluster",
            "rq:repairing",
            "user:key",
            "rq:idx",
        ] {
            assert_eq!(classify(not_state), None, "{not_state}");
        }
        assert_eq!(fence_of("rq:lock:a"), Some("rq:fence:a".into()));
        assert_eq!(fence_of("rq:glock:g"), Some("rq:gfence:g".into()));
    }

    #[test]
    fn the_highest_register_and_every_beat_are_planned() {
        let a = holdings(&[("rq:id:x", 5), ("rq:id:y", 9)], &[("m1", "3")]);
        let b = holdings(&[("rq:id:x", 7)], &[("m1", "2"), ("m2", "1")]);
        let p = plan(&[&a, &b], false);
        assert_eq!(
            p.registers,
            vec![("rq:id:x".into(), 7), ("rq:id:y".into(), 9)]
        );
        let beats = &p.hashes["rq:members:g"].1;
        assert_eq!(
            beats.len(),
            2,
            "a beat any source holds is restored: {beats:?}"
        );
        let unsafe_plan = plan(&[&a, &b], true);
        assert!(
            unsafe_plan.hashes.is_empty(),
            "the test-only mode restores no beats"
        );
    }
}
