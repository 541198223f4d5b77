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
//! **Every read is behind the incarnation the copy planned on.** The census gives each source's
//! incarnation: its run_id, its marker and its last repair's nonce (`rq:marked`). Every SCAN
//! page and every page read runs in one MULTI/EXEC with a read of the marker and the nonce, on
//! a connection of the census's run_id; a source that shows anything else lost its data (a
//! FLUSHALL keeps the run_id but takes the marker; a repair since writes a new nonce; a
//! restart changes the run_id), so what it returned is dropped with it, and the copy goes on
//! only while at least a majority of sources (`needed`) stayed unchanged throughout. Why that
//! is enough: the intersection argument needs, for each accepted value, one source of the
//! read set that held it from before the census to the read of its page, and whose scan ran
//! to its end without losing anything; a source unchanged at every read is such a node, and
//! `needed` of them meet every majority. After the last page every source is checked once
//! more.
//!
//! **Every write is under the repairer's claim.** Each script call that writes a page
//! (`raise.lua`, `restore.lua`, `view_write.lua` in claim mode) first checks, atomically, that
//! the target still carries this repairer's claim: a repairer that lost its claim (paused past
//! its lifetime while another repaired the node) or a target emptied by FLUSHALL since the copy
//! began takes nothing, and a target that refused a page is dropped (never marked).
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
use crate::config::CopyEvent;
use crate::keys::{fixed_key, KeyKind};
use crate::quorum::NodeOutcome;
use crate::scripts::{RAISE, RESTORE, VIEW_WRITE};

pub(crate) use super::plan::classify;
use super::plan::{
    fence_of, lease_token, plan_with, HashMerge, Holdings, Kind, Plan, BLOCKER_HOLDER,
};

/// Why a source is dropped from a copy.
const CHANGED: &str = "lost its data, restarted or was repaired during the copy";
const SILENT: &str = "stopped answering during the copy";

/// Keys per SCAN page.
const PAGE: usize = 1000;

/// How many times a page whose sources disagree on a lease's holder is read again (one node
/// timeout apart) before the disputed keys get a blocker.
const DISPUTE_REREADS: u32 = 3;

/// The pattern every state key matches (a fixed string: user names never reach a pattern).
const STATE_PATTERN: &str = "rq:*";

/// A source's incarnation as the census found it: the copy reads it only while it is the same.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Incarnation {
    /// The server's run_id (a restart changes it).
    pub(crate) run_id: String,
    /// Its marker (a FLUSHALL removes it).
    pub(crate) marker: Option<String>,
    /// Its last repair's nonce (`rq:marked`: every repair writes a new one).
    pub(crate) marked: Option<String>,
}

/// The nodes a copy reads from, each with the incarnation it must keep, and how many must stay
/// unchanged for the copy to go on (a majority of the cluster the copy reads).
#[derive(Clone, Debug)]
pub(crate) struct Sources {
    pub(crate) nodes: BTreeMap<usize, Incarnation>,
    pub(crate) needed: usize,
}

impl Sources {
    fn list(&self) -> Vec<usize> {
        self.nodes.keys().copied().collect()
    }

    /// Drop `node`, which changed under the copy (or stopped answering: what it would have
    /// shown can no longer be read behind its incarnation). The argument needs only the sources
    /// that answered every read unchanged; an error when too few of them are left.
    fn drop_changed(&mut self, node: usize, why: &str) -> Result<(), String> {
        if self.nodes.remove(&node).is_some() {
            tracing::warn!(
                node,
                why,
                left = self.nodes.len(),
                needed = self.needed,
                "a source of a copy dropped"
            );
        }
        if self.nodes.len() < self.needed {
            return Err(format!(
                "source node{node} {why}, and only {} unchanged source(s) are left ({} are \
                 needed)",
                self.nodes.len(),
                self.needed
            ));
        }
        Ok(())
    }
}

/// One source's answer to a read behind its incarnation.
#[derive(Clone, Debug)]
enum Behind<T> {
    /// Read on the incarnation the copy planned on.
    Same(T),
    /// The source is not that incarnation any more: what it returned is worthless.
    Changed,
}

/// Run `fill`'s commands on `nc` in one MULTI/EXEC behind a read of the marker and of the last
/// repair's nonce, and compare both (and the connection's run_id) with `expected`. `check`
/// false is the TEST-ONLY blind copy.
async fn behind(
    nc: &mut NodeConn,
    expected: &Incarnation,
    check: bool,
    fill: impl FnOnce(&mut redis::Pipeline),
) -> redis::RedisResult<Behind<Vec<redis::RedisResult<redis::Value>>>> {
    let mut pipe = redis::pipe();
    pipe.atomic().ignore_errors();
    pipe.cmd("GET").arg(fixed_key(KeyKind::Marker));
    pipe.cmd("GET").arg(fixed_key(KeyKind::Marked));
    fill(&mut pipe);
    let mut replies: Vec<redis::RedisResult<redis::Value>> = pipe.query_async(&mut nc.conn).await?;
    if replies.len() < 2 {
        return Err(redis::RedisError::from((
            redis::ErrorKind::Client,
            "copy read",
            format!("expected at least 2 replies, got {}", replies.len()),
        )));
    }
    let rest = replies.split_off(2);
    let marked: Option<String> =
        redis::from_redis_value(replies.pop().unwrap_or(Ok(redis::Value::Nil))?)?;
    let marker: Option<String> =
        redis::from_redis_value(replies.pop().unwrap_or(Ok(redis::Value::Nil))?)?;
    let same = nc.run_id() == expected.run_id.as_str()
        && marker == expected.marker
        && marked == expected.marked;
    Ok(if same || !check {
        Behind::Same(rest)
    } else {
        Behind::Changed
    })
}

/// Read the given keys from one node, each by its kind, in one transaction behind its
/// incarnation. A key of an unexpected type (an older layout) or with a value that does not
/// parse is skipped.
async fn read_keys(
    mut nc: NodeConn,
    keys: &[String],
    expected: &Incarnation,
    check: bool,
) -> redis::RedisResult<Behind<Holdings>> {
    let kinds: Vec<Kind> = keys.iter().filter_map(|k| classify(k)).collect();
    let replies = behind(&mut nc, expected, check, |pipe| {
        for (key, kind) in keys.iter().zip(&kinds) {
            match kind {
                Kind::Register => pipe.cmd("GET").arg(key),
                Kind::View => pipe.cmd("HMGET").arg(key).arg("token").arg("view"),
                Kind::Lease => pipe.cmd("HMGET").arg(key).arg("v").arg("n").arg("t"),
                Kind::Hash(_) => pipe.cmd("HGETALL").arg(key),
            };
        }
    })
    .await?;
    let Behind::Same(replies) = replies else {
        return Ok(Behind::Changed);
    };
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
    Ok(Behind::Same(h))
}

/// A node a copy writes to: the incarnation it must keep and the claim it must carry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Target {
    pub(crate) run_id: String,
    /// The repairer's claim nonce the node must carry for every write (`*`: the TEST-ONLY
    /// unclaimed write).
    pub(crate) claim: String,
}

/// Raise one node to `plan`, only while it is still the incarnation `target` names and carries
/// its claim. Applied(number of keys or fields written), or Rejected when the node restarted
/// or refused a write (its claim is gone: another repair finished, or the node lost its data).
async fn raise(
    mut nc: NodeConn,
    plan: &Plan,
    target: &Target,
) -> redis::RedisResult<NodeOutcome<usize>> {
    if nc.run_id() != target.run_id.as_str() {
        return Ok(NodeOutcome::Rejected(0));
    }
    let claim_key = fixed_key(KeyKind::RepairClaim);
    let claim = target.claim.as_str();
    let mut raised = 0usize;
    // Each call answers -1 when the claim is not the repairer's: the node then takes nothing
    // more of this copy.
    let counted = |raised: &mut usize, n: i64| -> Option<()> {
        *raised += usize::try_from(n).ok()?;
        Some(())
    };
    for chunk in plan.registers.chunks(200) {
        let mut inv = RAISE.prepare_invoke();
        inv.key(&claim_key).arg(claim);
        for (k, v) in chunk {
            inv.key(k).arg(*v);
        }
        if counted(&mut raised, inv.invoke_async::<i64>(&mut nc.conn).await?).is_none() {
            return Ok(NodeOutcome::Rejected(0));
        }
    }
    for (key, (token, view)) in &plan.views {
        // The view register's own compare-and-set on the view's base, under the claim instead
        // of the marker: the node is being repaired precisely because its marker is missing or
        // stale.
        let Ok(parsed) = serde_json::from_str::<crate::membership::View>(view) else {
            continue;
        };
        let base = parsed.base.token().map(|t| t.get()).unwrap_or(0);
        let (stored, _): (i64, u64) = VIEW_WRITE
            .key(key)
            .key(fixed_key(KeyKind::Marker))
            .key(&claim_key)
            .arg(*token)
            .arg(view)
            .arg(crate::membership::View::digest(view))
            .arg(base)
            .arg(format!("claim:{claim}"))
            .invoke_async(&mut nc.conn)
            .await?;
        if stored == -1 {
            return Ok(NodeOutcome::Rejected(0));
        }
        raised += usize::from(stored == 1);
    }
    for (key, (value, version, ttl)) in &plan.leases {
        let Some(fence_key) = fence_of(key) else {
            continue;
        };
        let written: i64 = RESTORE
            .key(&claim_key)
            .key(key)
            .key(&fence_key)
            .arg(claim)
            .arg("lease")
            .arg(value)
            .arg(*version)
            .arg(*ttl)
            .arg(lease_token(value))
            .arg(BLOCKER_HOLDER)
            .invoke_async(&mut nc.conn)
            .await?;
        if counted(&mut raised, written).is_none() {
            return Ok(NodeOutcome::Rejected(0));
        }
    }
    for (key, (merge, fields)) in &plan.hashes {
        let third = match merge {
            HashMerge::Units => units_floor_of(key).unwrap_or_else(|| key.clone()),
            _ => key.clone(),
        };
        for chunk in fields.iter().collect::<Vec<_>>().chunks(200) {
            let mut inv = RESTORE.prepare_invoke();
            inv.key(&claim_key)
                .key(key)
                .key(&third)
                .arg(claim)
                .arg(merge.mode());
            for (f, v) in chunk {
                inv.arg(*f).arg(*v);
            }
            if counted(&mut raised, inv.invoke_async::<i64>(&mut nc.conn).await?).is_none() {
                return Ok(NodeOutcome::Rejected(0));
            }
        }
    }
    Ok(NodeOutcome::Applied(raised))
}

/// A pool's collection floor key from its unit register's key (`rq:units:p` -> `rq:ufloor:p`).
fn units_floor_of(units_key: &str) -> Option<String> {
    let pool = units_key.strip_prefix("rq:units:")?;
    Some(format!("rq:ufloor:{pool}"))
}

/// How a paged copy ended.
#[derive(Clone, Debug, Default)]
pub(crate) struct Copied {
    /// Keys or fields written, summed over the targets.
    pub(crate) written: usize,
    /// Keys read from the sources.
    pub(crate) keys: usize,
    /// The targets that took every page (each still the incarnation it was, under its claim).
    pub(crate) complete: BTreeMap<usize, Target>,
    /// The sources that stayed unchanged from the census to the end of the copy.
    pub(crate) sources: Vec<usize>,
}

impl Client {
    /// Copy what `sources` (nodes of this client) hold onto `targets` (nodes of `target`, each
    /// with the incarnation it must keep and the claim it must carry), page by page, every read
    /// behind the source's incarnation (see the module docs). `between_pages` runs after every
    /// page (a repair refreshes its claim there; an error stops the copy).
    ///
    /// # Errors
    /// A message when a source stops answering, when fewer than `sources.needed` sources stayed
    /// unchanged, or when no target takes a page.
    pub(crate) async fn copy_paged<F, Fut>(
        &self,
        sources: Sources,
        target: &Client,
        targets: BTreeMap<usize, Target>,
        mut between_pages: F,
    ) -> Result<Copied, String>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<(), String>>,
    {
        let mut sources = sources;
        if sources.nodes.len() < sources.needed {
            return Err(format!(
                "{} source(s); {} are needed",
                sources.nodes.len(),
                sources.needed
            ));
        }
        let mut copied = Copied {
            complete: targets,
            ..Copied::default()
        };
        self.copy_event(CopyEvent::Started).await;
        for source in sources.list() {
            let mut cursor: u64 = 0;
            loop {
                if !sources.nodes.contains_key(&source) {
                    break;
                }
                let (next, keys) = match self.scan_page(&sources, source, cursor).await {
                    Ok(Some(page)) => page,
                    Ok(None) => {
                        sources.drop_changed(source, CHANGED)?;
                        break;
                    }
                    Err(why) => {
                        sources.drop_changed(source, &why)?;
                        break;
                    }
                };
                if !keys.is_empty() {
                    self.copy_page(&mut sources, target, keys, &mut copied)
                        .await?;
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
            self.copy_page(
                &mut sources,
                target,
                crate::keys::all_floor_keys(),
                &mut copied,
            )
            .await?;
            copied.keys = counted;
            between_pages().await?;
        }
        // Once more after the last page: every source still the incarnation it was.
        self.verify_sources(&mut sources).await?;
        copied.sources = sources.list();
        Ok(copied)
    }

    /// The test-only pause points of a copy.
    pub(super) async fn copy_event(&self, _event: CopyEvent) {
        #[cfg(feature = "test-util")]
        if let Some(hook) = &self.inner.config.copy_hook {
            (hook.0)(_event).await;
        }
    }

    /// Read every source's incarnation behind nothing: drop those that changed.
    async fn verify_sources(&self, sources: &mut Sources) -> Result<(), String> {
        let expected = Arc::new(sources.nodes.clone());
        let check = self.inner.config.copy_checks;
        let verify = Step::session(move |mut nc: NodeConn| {
            let expected = expected.clone();
            async move {
                let Some(inc) = expected.get(&nc.node()) else {
                    return Ok(NodeOutcome::Applied(false));
                };
                let read = behind(&mut nc, inc, check, |_| {}).await?;
                Ok(NodeOutcome::Applied(matches!(read, Behind::Same(_))))
            }
        });
        let request = Request::any_node("repair.verify", Targets::of(&sources.list()))
            .within(self.inner.config.operation_timeout);
        let tally = self.send(request, verify).await;
        let same: BTreeMap<usize, bool> = tally.replies().map(|(id, s)| (id.0, *s)).collect();
        for node in sources.list() {
            match same.get(&node) {
                Some(true) => {}
                Some(false) => sources.drop_changed(node, CHANGED)?,
                None => sources.drop_changed(node, SILENT)?,
            }
        }
        Ok(())
    }

    /// One SCAN page of `source`, behind its incarnation: the next cursor and the state keys on
    /// the page, or None when the source changed.
    async fn scan_page(
        &self,
        sources: &Sources,
        source: usize,
        cursor: u64,
    ) -> Result<Option<(u64, Vec<String>)>, String> {
        let Some(expected) = sources.nodes.get(&source).cloned() else {
            return Ok(None);
        };
        let check = self.inner.config.copy_checks;
        let scan = Step::session(move |mut nc: NodeConn| {
            let expected = expected.clone();
            async move {
                let read = behind(&mut nc, &expected, check, |pipe| {
                    pipe.cmd("SCAN")
                        .arg(cursor)
                        .arg("MATCH")
                        .arg(STATE_PATTERN)
                        .arg("COUNT")
                        .arg(PAGE);
                })
                .await?;
                let page = match read {
                    Behind::Same(mut replies) => {
                        let reply = replies.pop().unwrap_or(Ok(redis::Value::Nil))?;
                        let (next, keys): (u64, Vec<String>) = redis::from_redis_value(reply)?;
                        Some((next, keys))
                    }
                    Behind::Changed => None,
                };
                Ok(NodeOutcome::Applied(page))
            }
        });
        let request = Request::any_node("repair.scan", Targets::Only(source))
            .within(self.inner.config.operation_timeout);
        let tally = self.send(request, scan).await;
        let Some(page) = tally.replies().next().map(|(_, r)| r.clone()) else {
            return Err(SILENT.into());
        };
        Ok(page.map(|(next, keys)| {
            (
                next,
                keys.into_iter().filter(|k| classify(k).is_some()).collect(),
            )
        }))
    }

    /// Read one page of keys from every source (behind its incarnation: a source that changed
    /// is dropped), merge, and raise the targets that are still complete (dropping those that
    /// did not take it).
    async fn copy_page(
        &self,
        sources: &mut Sources,
        target: &Client,
        keys: Vec<String>,
        copied: &mut Copied,
    ) -> Result<(), String> {
        let deadline = self.inner.config.operation_timeout;
        let check = self.inner.config.copy_checks;
        let page: Arc<Vec<String>> = Arc::new(keys);
        // Every key of the page is copied, also keys an earlier source holds: SCAN need not
        // return a key created on that source after its scan passed.
        copied.keys += page.len();
        // Each read is sound on its own (it follows the repair's wait), so a page whose sources
        // disagree on a lease's holder is read again a few times before the disputed keys get
        // a blocker: a contender's losing round is usually released within milliseconds.
        let mut rereads = 0;
        let plan = loop {
            let (p, expected) = (page.clone(), Arc::new(sources.nodes.clone()));
            let read = Step::session(move |nc: NodeConn| {
                let (p, expected) = (p.clone(), expected.clone());
                async move {
                    let Some(inc) = expected.get(&nc.node()) else {
                        return Ok(NodeOutcome::Applied(Behind::Changed));
                    };
                    read_keys(nc, &p, inc, check)
                        .await
                        .map(NodeOutcome::Applied)
                }
            });
            let request =
                Request::any_node("repair.page", Targets::of(&sources.list())).within(deadline);
            let reads = self.send(request, read).await;
            let mut read: BTreeMap<usize, Holdings> = BTreeMap::new();
            for (id, r) in reads.replies() {
                match r {
                    Behind::Same(h) => {
                        read.insert(id.0, h.clone());
                    }
                    Behind::Changed => sources.drop_changed(id.0, CHANGED)?,
                }
            }
            for missing in sources.list().into_iter().filter(|s| !read.contains_key(s)) {
                sources.drop_changed(missing, SILENT)?;
            }
            let plan = plan_with(
                &read.values().collect::<Vec<_>>(),
                self.inner.config.server_clock_leases,
                self.inner.config.newest_lease_restore,
                self.inner.config.repair_epochs,
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
        self.copy_event(CopyEvent::PageRead).await;
        if plan.is_empty() {
            return Ok(());
        }
        let targets = Arc::new(copied.complete.clone());
        let nodes: Vec<usize> = targets.keys().copied().collect();
        let write = Step::session(move |nc: NodeConn| {
            let (plan, targets) = (plan.clone(), targets.clone());
            async move {
                let Some(t) = targets.get(&nc.node()) else {
                    return Ok(NodeOutcome::Rejected(0));
                };
                raise(nc, &plan, t).await
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
            return Err(
                "no target took the copy (restarted, unreachable, or its claim is gone)".into(),
            );
        }
        Ok(())
    }
}
