//! Changing the cluster's node list: seal the old cluster, copy its state, mark the new one.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use super::copy::{Sources, Target};
use super::{sources_of, Census, Mark, RepairClaim};
use crate::client::{decode, script_call, Client, Guard, Request, Steps, Targets};
use crate::cluster::{self, Adoption, Descriptor, Origin};
use crate::config::{Config, ConfigError, CopyEvent};
use crate::error::{Error, NoQuorum};
use crate::scripts::SEAL;

/// The new list's nodes a change copies to (each under its claim), and how many are marked
/// for the new cluster already (by an earlier run, or repaired since).
struct Enlisted {
    claims: BTreeMap<usize, RepairClaim>,
    targets: BTreeMap<usize, Target>,
    already: usize,
}

/// What a change of the node list did.
#[derive(Clone, Debug)]
pub struct ClusterChange {
    /// The cluster that was replaced.
    pub from: Descriptor,
    /// The new cluster.
    pub to: Descriptor,
    /// Old nodes sealed (they vote for no client of the old cluster any more).
    pub sealed: usize,
    /// New nodes raised and marked (the others are repaired by the first client that reaches
    /// them, by the URL the new cluster lists).
    pub marked: usize,
    /// Keys copied from the old cluster.
    pub keys: usize,
    /// An earlier run had completed this change (a majority of the new list was marked for
    /// it): this run did nothing.
    pub done_before: bool,
}

impl Client {
    /// Change the cluster's node list to `to`'s (add, remove or replace nodes), from a client
    /// of the current cluster. `to` is a whole configuration: give it the TLS settings the
    /// new nodes need (this client's are not copied). The procedure, safe while clients keep
    /// running:
    ///
    /// 1. **Seal** a majority of the old nodes: their marker gets a suffix, so no client of the
    ///    old list gets a majority any more (its operations fail, and a new client with the
    ///    old list is refused with an error that names both lists).
    /// 2. Wait one node timeout, so every write an old client counted is on its nodes.
    /// 3. **Copy** every register from the sealed majority (it meets every old majority) onto
    ///    every node of the new list it reaches, page by page.
    /// 4. **Mark** those nodes for the new cluster (descriptor, then marker); at least a
    ///    majority of the new list must be marked.
    ///
    /// Clients configured with the new list work once a majority of it is marked; clients
    /// still configured with the old list are refused.
    ///
    /// **An interrupted change is finished by running it again** with the same two lists
    /// (here, or with [`Client::change_node_list`], which also accepts the old list while a
    /// partly marked change makes [`Client::connect`] refuse it): the successor's id is
    /// derived from the old id and the new list, so the re-run finds the same change, sealed
    /// nodes count as sealed, nodes marked already count as marked, and a change completed
    /// already (a majority of the new list marked) returns with `done_before` and does
    /// nothing. It never seals for a second successor.
    ///
    /// # Errors
    /// [`ConfigError::ClusterMismatch`] when this client's list is not its nodes' cluster (nor
    /// the origin of a change to `to` under way);
    /// [`Error::InvalidArgument`] when these nodes hold no cluster yet; [`Error::NoQuorum`]
    /// when fewer than a majority of the old nodes could be sealed; [`Error::Unfinished`] when
    /// too few of the new nodes could be enlisted, copied to or marked (run it again).
    ///
    /// # Cancel safety
    /// Not cancel-safe: a dropped call can leave the old cluster sealed and the new one partly
    /// marked; run it again to finish.
    pub async fn change_cluster(&self, to: Config) -> Result<ClusterChange, Error> {
        // One list from start to end (the one in use now): the change's own client never
        // follows the change it makes.
        self.current_or_pinned().change_from_here(to).await
    }

    /// [`Client::change_cluster`] on this handle's own list (a pinned one).
    async fn change_from_here(&self, to: Config) -> Result<ClusterChange, Error> {
        to.validate()?;
        let (from, new, old) = self.change_origin(&to).await?;
        let target = Client::open(to, false).await?.current();
        // A change that an earlier run completed (a majority of the new list is marked for
        // the successor, or an old node carries the completion stamp) has nothing left to
        // do: its clients repair the others.
        let old_census = old.census().await;
        let stamped = stamped_for(&old_census, &from.id, &new.id);
        let already = marked_for(&target.census().await, &new.id);
        if stamped > 0 || already >= target.inner.majority.needed() {
            tracing::info!(to = %new.id, marked = already, stamped, "the node-list change was done already");
            old.stamp_done(&old_census, &from.id, &new.id).await;
            return Ok(ClusterChange {
                from,
                to: new,
                sealed: 0,
                marked: already,
                keys: 0,
                done_before: true,
            });
        }
        let settle = old
            .inner
            .config
            .node_timeout
            .max(target.inner.config.node_timeout)
            .max(from.node_timeout().unwrap_or_default());
        let sources = old.seal_for(&from, &new, settle).await?;
        let enlisted = target.enlist(&from, &new).await?;
        let sealed = sources.nodes.len();
        let copied = old.copy_and_mark(sources, &target, &enlisted, &new).await;
        for claim in enlisted.claims.values() {
            claim.release().await;
        }
        let (copied, marked) = copied?;
        old.stamp_done(&old.census().await, &from.id, &new.id).await;
        tracing::warn!(from = %from.id, to = %new.id, nodes = %new.describe(), "cluster node list changed");
        Ok(ClusterChange {
            sealed,
            marked,
            keys: copied.keys,
            from,
            to: new,
            done_before: false,
        })
    }

    /// Change the node list from the cluster of the list `from` to the list `to`, or finish a
    /// change to `to` that an earlier run started (see [`Client::change_cluster`]). Unlike
    /// [`Client::connect`] it does not refuse `from` while a change is under way: a change
    /// interrupted after marking part of the new list makes the old list's clients refused
    /// (or adopt the successor), and this is how the operator finishes it.
    ///
    /// # Errors
    /// As [`Client::change_cluster`].
    ///
    /// # Cancel safety
    /// As [`Client::change_cluster`]: run it again to finish.
    pub async fn change_node_list(from: Config, to: Config) -> Result<ClusterChange, Error> {
        Client::open(from, true).await?.change_cluster(to).await
    }

    /// The cluster a change to `to` replaces, its successor, and the client of the old list
    /// to seal and copy with (this one, or one that adopts the old cluster exactly, when a
    /// resumed change's successor shows on some of its nodes).
    async fn change_origin(&self, to: &Config) -> Result<(Descriptor, Descriptor, Client), Error> {
        let adoption = self.verdicts().adoption.clone();
        let ours = self.inner.config.node_names();
        let origin = if self.inner.config.change_resumes {
            cluster::change_origin(&ours, &self.seen_descriptors(), &adoption, &to.node_names())
        } else {
            // TEST ONLY: whatever the nodes' adoption says is the cluster to replace.
            match &adoption {
                Adoption::Adopted(d) => Origin::Fresh(d.clone(), d.succeeding(&to.node_names())),
                Adoption::Refused(why) => Origin::Refused(why.clone()),
                Adoption::Unknown => Origin::Unknown,
            }
        };
        // A pinned operator's change must start from, or resume towards, the pinned cluster.
        if let (Some(pin), Origin::Fresh(from, new) | Origin::Resumed(from, new)) =
            (&self.inner.config.cluster_pin, &origin)
        {
            if *pin != from.id && *pin != new.id {
                return Err(Error::Config(ConfigError::ClusterMismatch(format!(
                    "this client is pinned to cluster {pin}, but the change found is from \
                     cluster {} to cluster {}",
                    from.id, new.id
                ))));
            }
        }
        match origin {
            Origin::Fresh(from, new) => Ok((from, new, self.clone())),
            Origin::Resumed(from, new) if adoption.id() == Some(from.id.as_str()) => {
                Ok((from, new, self.clone()))
            }
            Origin::Resumed(from, new) => {
                tracing::info!(from = %from.id, to = %new.id, "resuming an interrupted node-list change");
                let mut config = self.inner.config.clone();
                config.adopt_as = Some(from.id.clone());
                let old = Client::open(config, false).await?.current();
                Ok((from, new, old))
            }
            Origin::Refused(why) => Err(Error::Config(ConfigError::ClusterMismatch(why))),
            Origin::Unknown => Err(Error::Config(ConfigError::ClusterSetUp(format!(
                "no cluster is set up on these nodes, so none can change its node list: \
                 {}",
                crate::cluster::INIT_HINT
            )))),
        }
    }

    /// Steps 1 and 2: seal every old node that is verified for the old cluster now (or was
    /// sealed for the same successor by an earlier run), settle, and return the sealed nodes
    /// to copy from (a majority of the old list, one per server).
    async fn seal_for(
        &self,
        from: &Descriptor,
        new: &Descriptor,
        settle: Duration,
    ) -> Result<Sources, Error> {
        let inner = &self.inner;
        let (from_id, new_id) = (from.id.clone(), new.id.clone());
        // Only nodes this client expects to hold the old cluster's marker: never a node of
        // the successor, whatever this client adopts by the time it sends.
        let seal_step = Steps::per_node(move |ctx| {
            (cluster::parse_marker(&ctx.marker).1 == Some(from_id.as_str()))
                .then(|| seal_step(ctx, &new_id))
        });
        let request =
            Request::any_node("cluster.seal", Targets::All).within(inner.config.operation_timeout);
        let seal = self.send(request, seal_step).await;
        self.copy_event(CopyEvent::Sealed).await;
        // Settle, then find the sealed nodes: sealed for this successor, by this run or an
        // earlier one, whatever the node's run_id now (a restart keeps what the AOF holds).
        tokio::time::sleep(settle + Duration::from_millis(25)).await;
        let census = self.census().await;
        let sealed = sealed_sources(&census, &from.id, &new.id);
        if sealed.len() < inner.majority.needed() {
            let why = |_: &()| {
                "not verified for this cluster (restarted or wiped, or sealed for another \
                 change): repair it first"
                    .to_string()
            };
            return Err(NoQuorum::from_tally("cluster.seal", &seal, &inner.urls, why).into());
        }
        Ok(sources_of(&census, &sealed, inner.majority.needed()))
    }

    /// Step 3a, on the new list's client: the nodes a copy may go to (new ones, or nodes of
    /// this cluster's lineage, never another cluster's, one per server), each carrying a
    /// claim during the copy, so one emptied meanwhile (FLUSHALL) is never marked and no
    /// repair runs on it at the same time.
    async fn enlist(&self, from: &Descriptor, new: &Descriptor) -> Result<Enlisted, Error> {
        let census = self.census().await;
        let targets = enlistable(&census, &from.id, &new.id);
        let already = marked_for(&census, &new.id);
        let needed_new = self.inner.majority.needed();
        if targets.len() + already < needed_new {
            return Err(Error::Unfinished {
                op: "cluster.change",
                reason: format!(
                    "only {} node(s) of the new list can be enlisted (reachable, not of another \
                     cluster); {needed_new} are needed",
                    targets.len()
                ),
            });
        }
        // All at once: a claim left by an interrupted run is taken over only after watching
        // it for its lifetime, and the targets' watches overlap.
        let takes = targets.keys().map(|node| {
            let marker = census
                .iter()
                .find(|c| c.node == *node)
                .and_then(|c| c.marker.as_deref());
            let claim = RepairClaim::new(self.clone(), *node, marker);
            async move { claim.take().await.then_some((*node, claim)) }
        });
        let claims: BTreeMap<usize, RepairClaim> = futures::future::join_all(takes)
            .await
            .into_iter()
            .flatten()
            .collect();
        let targets = targets
            .into_iter()
            .filter_map(|(n, run)| Some((n, self.copy_target(&run, claims.get(&n)?))))
            .collect();
        Ok(Enlisted {
            claims,
            targets,
            already,
        })
    }

    /// Step 5: stamp the old nodes sealed for this change as done (`seal.lua`, comparing the
    /// sealed marker the census found): a later run of the same change returns at once.
    /// Best effort: a node missed keeps its seal, and a majority of the new list marked says
    /// the same while it lasts.
    async fn stamp_done(&self, census: &[Census], from: &str, new: &str) {
        if !self.inner.config.change_resumes {
            return; // TEST ONLY: no stamp (`with_unresumable_changes_for_tests`).
        }
        let sealed = format!("{from}{}{new}", cluster::SEALED);
        let markers: Arc<BTreeMap<usize, String>> = Arc::new(
            census
                .iter()
                .filter_map(|c| {
                    let m = c.marker.as_deref()?;
                    (cluster::parse_marker(m).1 == Some(sealed.as_str()))
                        .then(|| (c.node, m.to_string()))
                })
                .collect(),
        );
        if markers.is_empty() {
            return;
        }
        let steps = Steps::per_node(move |ctx| {
            let m = markers.get(&ctx.node)?;
            let step = script_call(&SEAL, Guard::None("compares the sealed marker itself"))
                .marker_key()
                .arg(m)
                .arg(format!("{m}{}", cluster::CHANGE_DONE))
                .decode(|_, v| decode::one_applied(v));
            Some(step)
        });
        let request = Request::any_node("cluster.done", Targets::All)
            .within(self.inner.config.operation_timeout);
        let stamped = self.send(request, steps).await;
        tracing::info!(
            stamped = stamped.applied(),
            "old nodes stamped: the change is done"
        );
    }

    /// Steps 3b and 4: copy from the sealed sources, then mark every target that took the
    /// whole copy for the new cluster. Returns the copy and how many were marked.
    async fn copy_and_mark(
        &self,
        sources: Sources,
        target: &Client,
        enlisted: &Enlisted,
        new: &Descriptor,
    ) -> Result<(super::copy::Copied, usize), Error> {
        let (claims, targets) = (&enlisted.claims, enlisted.targets.clone());
        if enlisted.already >= target.inner.majority.needed() {
            // A majority of the new list is marked already: the change is done; the others
            // are repaired from it by its clients.
            return Ok((super::copy::Copied::default(), enlisted.already));
        }
        // A target whose claim is lost refuses the next page (every write checks the claim)
        // and is dropped; the copy goes on for the others.
        let refresh_all = || async {
            for (node, claim) in claims {
                if let Err(why) = claim.refresh().await {
                    tracing::warn!(node, why = %why, "a target of the change lost its claim");
                }
            }
            Ok(())
        };
        let copied = self
            .copy_paged(sources, target, targets, refresh_all)
            .await
            .map_err(|why| Error::Unfinished {
                op: "cluster.change",
                reason: format!("the copy stopped: {why}; run the change again"),
            })?;
        for (node, t) in &copied.complete {
            let Some(claim) = claims.get(node) else {
                continue;
            };
            let run = &t.run_id;
            let mark = Arc::new(Mark {
                run_id: run.clone(),
                descriptor: new.encode(),
                marker: cluster::marker_value(run, target.epoch(claim).as_deref(), &new.id),
                claim: claim.nonce.clone(),
            });
            if !target.mark(Targets::Only(*node), mark).await.is_empty() {
                self.copy_event(CopyEvent::Marked).await;
            }
        }
        // Counted afresh: a node marked before may have lost its data since.
        let marked = marked_for(&target.census().await, &new.id);
        let needed_new = target.inner.majority.needed();
        if marked < needed_new {
            return Err(Error::Unfinished {
                op: "cluster.change",
                reason: format!(
                    "marked {marked} node(s) of the new list; {needed_new} are needed: run \
                     the change again"
                ),
            });
        }
        Ok((copied, marked))
    }
}

/// How many nodes are marked for cluster `new` (one per server; a node restarted since keeps
/// what its AOF holds, and the new cluster's clients repair it from the others).
fn marked_for(census: &[Census], new: &str) -> usize {
    marked_as(census, |_, _, cl| cl == Some(new)).count()
}

/// How many old nodes carry the stamp of a completed change from `from` to `new`.
fn stamped_for(census: &[Census], from: &str, new: &str) -> usize {
    let stamped = format!("{from}{}{new}{}", cluster::SEALED, cluster::CHANGE_DONE);
    marked_as(census, |_, _, cl| cl == Some(stamped.as_str())).count()
}

/// The census's nodes whose marker (run part, cluster part) passes `keep`, one per server.
fn marked_as<'a>(
    census: &'a [Census],
    keep: impl Fn(&str, &Census, Option<&str>) -> bool + 'a,
) -> impl Iterator<Item = &'a Census> + 'a {
    let mut seen = HashSet::new();
    census
        .iter()
        .filter(move |c| {
            c.marker
                .as_deref()
                .map(cluster::parse_marker)
                .is_some_and(|(run, cl)| keep(run, c, cl))
        })
        .filter(move |c| seen.insert(c.run_id.clone()))
}

/// `seal.lua` on one old node: its marker (compared atomically) becomes
/// `<marker>#sealed:<new id>`.
fn seal_step(ctx: &crate::client::NodeCtx, new_id: &str) -> crate::client::Step<()> {
    let sealed = format!("{}{}{new_id}", ctx.marker, cluster::SEALED);
    script_call(&SEAL, Guard::Marker)
        .marker_key()
        .marker()
        .arg(sealed)
        .decode(|_, v| decode::one_applied(v))
}

/// The old nodes a change from `from` to `new` copies from (one per server): those sealed for
/// it, and those of the old list it marked for the new cluster already (an interrupted run
/// marked them after a complete copy from a sealed majority, and the new cluster accepts
/// nothing before a majority of it is marked, when the change is done). Without the latter, a
/// run interrupted after marking more old nodes than a minority of the old list could never
/// be finished.
fn sealed_sources(census: &[Census], from: &str, new: &str) -> Vec<usize> {
    let sealed_cluster = format!("{from}{}{new}", cluster::SEALED);
    marked_as(census, |_, _, cl| {
        cl == Some(sealed_cluster.as_str()) || cl == Some(new)
    })
    .map(|c| c.node)
    .collect()
}

/// The new list's nodes a change from `from` to `new` may copy to, with their run_ids: blank
/// ones, or ones of the old cluster (verified or sealed for this very change), one per server.
fn enlistable(census: &[Census], from: &str, new: &str) -> BTreeMap<usize, String> {
    let lineage = |marker: Option<&str>| match marker.map(cluster::parse_marker) {
        None => true,
        Some((_, Some(c))) => match c.split_once(cluster::SEALED) {
            Some((old, successor)) => old == from && successor == new,
            // A node already marked for the new cluster is not copied onto again (its state may
            // have moved on since: a unit collected there must not come back from the frozen
            // old cluster); it counts as marked.
            None => c == from,
        },
        Some((_, None)) => false,
    };
    let mut seen = HashSet::new();
    census
        .iter()
        .filter(|c| lineage(c.marker.as_deref()) && seen.insert(c.run_id.clone()))
        .map(|c| (c.node, c.run_id.clone()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn census(node: usize, run: &str, marker: Option<&str>) -> Census {
        Census {
            node,
            run_id: run.into(),
            marker: marker.map(String::from),
            marked: None,
            descriptor: None,
            has_state: marker.is_some(),
        }
    }

    #[test]
    fn a_seal_compares_the_nodes_marker_and_names_the_successor() {
        let ctx = crate::client::NodeCtx {
            node: 0,
            marker: "r0/old".into(),
            run_id: "r0".into(),
        };
        let step = seal_step(&ctx, "new");
        assert!(step.is_guarded());
        assert_eq!(
            step.args_for_tests("r0/old"),
            vec!["r0/old", "r0/old#sealed:new"]
        );
    }

    #[test]
    fn sources_are_the_old_nodes_sealed_for_this_successor_once_per_server() {
        let c = [
            census(0, "r0", Some("r0/old#sealed:new")),
            census(1, "r0", Some("r0/old#sealed:new")),
            census(2, "r2", Some("r2/old#sealed:other")),
            census(3, "r3", Some("r3/old")),
            census(4, "r4-restarted", Some("r4/old#sealed:new")),
            census(5, "r5", Some("r5.e/new")),
            census(6, "r6", Some("r6/old#sealed:new#done")),
        ];
        assert_eq!(
            sealed_sources(&c, "old", "new"),
            vec![0, 4, 5],
            "sealed for this change, or marked by it already; never stamped done"
        );
        assert_eq!(stamped_for(&c, "old", "new"), 1);
    }

    #[test]
    fn targets_are_blank_or_of_the_old_cluster_never_another_clusters() {
        let c = [
            census(0, "a", None),
            census(1, "b", Some("b/old")),
            census(2, "c", Some("c/new")),
            census(3, "d", Some("d/old#sealed:new")),
            census(4, "e", Some("e/old#sealed:other")),
            census(5, "f", Some("f/stranger")),
            census(6, "a", None),
        ];
        let got: Vec<usize> = enlistable(&c, "old", "new").into_keys().collect();
        assert_eq!(
            got,
            vec![0, 1, 3],
            "node 2, already marked for new, is not copied onto"
        );
        assert_eq!(marked_for(&c, "new"), 1);
    }
}
