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
use crate::quorum::NodeOutcome;

use super::page::{behind, raise, read_keys, Behind};
pub(crate) use super::page::{Incarnation, Target};
pub(crate) use super::plan::classify;
use super::plan::{plan_with, Holdings, Plan};

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
            self.copy_source(
                source,
                &mut sources,
                target,
                &mut copied,
                &mut between_pages,
            )
            .await?;
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

    /// Copy every page of `source`'s keyspace (each read from every source, see
    /// [`copy_page`](Self::copy_page)), running `between_pages` after each. A source that
    /// changed or stopped answering is dropped, and its scan ends there.
    async fn copy_source<F, Fut>(
        &self,
        source: usize,
        sources: &mut Sources,
        target: &Client,
        copied: &mut Copied,
        between_pages: &mut F,
    ) -> Result<(), String>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<(), String>>,
    {
        let mut cursor: u64 = 0;
        while sources.nodes.contains_key(&source) {
            let (next, keys) = match self.scan_page(sources, source, cursor).await {
                Ok(Some(page)) => page,
                Ok(None) => return sources.drop_changed(source, CHANGED),
                Err(why) => return sources.drop_changed(source, &why),
            };
            if !keys.is_empty() {
                self.copy_page(sources, target, keys, copied).await?;
            }
            between_pages().await?;
            if next == 0 {
                break;
            }
            cursor = next;
        }
        Ok(())
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
        // Every key of the page is copied, also keys an earlier source holds: SCAN need not
        // return a key created on that source after its scan passed.
        copied.keys += keys.len();
        let plan = self.read_page(sources, Arc::new(keys)).await?;
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
        self.write_page(target, Arc::new(plan), copied).await
    }

    /// The merge of `page` as read from every source, behind its incarnation (a source that
    /// changed or did not answer is dropped). Each read is sound on its own (it follows the
    /// repair's wait), so a page whose sources disagree on a lease's holder is read again a few
    /// times, one node timeout apart, before the disputed keys get a blocker: a contender's
    /// losing round is usually released within milliseconds.
    async fn read_page(
        &self,
        sources: &mut Sources,
        page: Arc<Vec<String>>,
    ) -> Result<Plan, String> {
        let deadline = self.inner.config.operation_timeout;
        let check = self.inner.config.copy_checks;
        let mut rereads = 0;
        loop {
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
                return Ok(plan);
            }
            rereads += 1;
            tokio::time::sleep(self.inner.config.node_timeout).await;
        }
    }

    /// Raise every target still complete to `plan` (through `target`, the targets' client);
    /// a target that does not take it is dropped, and none left is an error.
    async fn write_page(
        &self,
        target: &Client,
        plan: Arc<Plan>,
        copied: &mut Copied,
    ) -> Result<(), String> {
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
        let deadline = self.inner.config.operation_timeout;
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
