//! Copying the cluster's state onto nodes, page by page: the part of a repair (and of a change
//! of the node list) that reads every key from a set of source nodes and raises target nodes
//! to it.
//!
//! Each source's keyspace is walked with `SCAN ... MATCH rq:*` a page at a time; the keys of a
//! page are read from EVERY source (a pipeline each), merged (the highest register, the newest
//! view, the lease copy the sources agree on or a blocker where they disagree, each hash
//! field's highest value), and written to the targets
//! with the same monotonic scripts the protocols use (idempotent, so a key several sources
//! hold is simply written more than once). Memory stays bounded by a page,
//! each page has its own deadline, and a keyspace of any size finishes.
//!
//! Keys that appear on the sources after the copy started were accepted by majorities without
//! the targets (which were quarantined, or not yet marked), so the copy need not include
//! them: any later majority meets those majorities at a node other than the targets. The one
//! exception is a fence floor bucket: a lock release writes an OLD token into it (and deletes
//! the fence key that held it), so every floor is read again from every source after the
//! scans.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use crate::client::{Client, NodeConn, Request, Step, Targets};
use crate::keys::{fixed_key, KeyKind};
use crate::quorum::NodeOutcome;
use crate::scripts::{RAISE, RESTORE, VIEW_WRITE};

pub(crate) use super::plan::classify;
use super::plan::{fence_of, lease_token, plan, Holdings, Kind, Plan, BLOCKER_HOLDER};

/// Keys per SCAN page.
const PAGE: usize = 1000;

/// How many times a page whose sources disagree on a lease's holder is read again (one node
/// timeout apart) before the disputed keys get a blocker.
const DISPUTE_REREADS: u32 = 3;

/// The pattern every state key matches (a fixed string: user names never reach a pattern).
const STATE_PATTERN: &str = "rq:*";

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
            .arg(BLOCKER_HOLDER)
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
        // A lock release moves a token granted BEFORE the copy from the lock's fence key into
        // its floor bucket, then deletes the fence key: both can escape the scans (the fence
        // deleted before its page was read, the floor raised after its page was read, or
        // created after the scan passed). Floors only grow and a fence is folded into its
        // floor before it is deleted, so reading every floor from every source after the
        // scans sees every such token.
        if self.inner.config.floor_recheck {
            let counted = copied.keys;
            self.copy_page(sources, target, crate::keys::all_floor_keys(), &mut copied)
                .await?;
            copied.keys = counted;
            between_pages().await?;
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
        // Every key of the page is copied, also keys an earlier source holds: SCAN need not
        // return a key created on that source after its scan passed.
        copied.keys += page.len();
        // Each read is sound on its own (it follows the repair's wait), so a page whose sources
        // disagree on a lease's holder is read again a few times before the disputed keys get
        // a blocker: a contender's losing round is usually released within milliseconds.
        let mut rereads = 0;
        let plan = loop {
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
            let plan = plan(
                &read.values().collect::<Vec<_>>(),
                self.inner.config.server_clock_leases,
                self.inner.config.newest_lease_restore,
            );
            if plan.disputed == 0 || rereads == DISPUTE_REREADS {
                break Arc::new(plan);
            }
            rereads += 1;
            tokio::time::sleep(self.inner.config.node_timeout).await;
        };
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
