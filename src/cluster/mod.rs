//! Cluster identity: which servers form the cluster, written on the servers themselves.
//!
//! The guarantees are documented on `Descriptor`.

use serde::{Deserialize, Serialize};

/// Cluster identity: which servers form the cluster, written on the servers themselves.
///
/// Majorities intersect only if every client counts them over the same set of servers. A
/// client configured with another node list (an expansion rolled out one service at a time,
/// a typo, a node swapped for another) would count majorities of a different set: {0, 1} of
/// [0, 1, 2] and {2, 3, 4} of [0..4] share no server, so both could accept conflicting
/// values. So the cluster's node list is stored on every node as a *descriptor* (its node
/// names and an id derived from them), and each node's marker names the descriptor's id
/// beside its run_id (`<run_id>.<epoch>/<cluster id>`, a new epoch at every repair). Every
/// voting script compares the marker with the one the client expects, atomically with its
/// decision, so a node votes only for clients that adopted its cluster.
///
/// A client adopts the descriptor its nodes hold (or writes one when it bootstraps a new
/// cluster) and refuses to run when that descriptor lists another number of nodes, or when
/// its nodes hold unrelated descriptors: the error names both lists. A node that lost its
/// marker (wiped, new) is repaired into the cluster only when the client reaches it by a URL
/// the descriptor lists, so a misconfigured client cannot enlist a stranger. Changing the
/// node list is an explicit step (see [`Descriptor::succeeding`]) that seals the old cluster
/// before the new one is marked.
///
/// This module is the pure decision core: no I/O, no clock.
///
/// Architecture invariant: a node votes only while its marker names the cluster the client
/// adopted, and a client adopts only a descriptor whose node count equals its own.
///
/// A cluster's identity: the names of its nodes and an id derived from them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Descriptor {
    /// Format version (1).
    pub v: u32,
    /// The cluster id: 16 hex digits, a hash of the node names and the predecessor's id.
    pub id: String,
    /// The node names (URLs without passwords), sorted.
    pub nodes: Vec<String>,
    /// The id of the cluster this one replaced (a change of the node list), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prev: Option<String>,
    /// The cluster's node timeout in milliseconds: the longest per-node deadline any of its
    /// clients may use, and how long every repair waits for writes in flight. Set by
    /// `cluster init`, raised (never lowered) by a later `cluster init` or carried into the
    /// successor by `cluster change`; not part of the id. None in a descriptor written by an
    /// older release (no client is then refused for its node timeout).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_timeout_ms: Option<u64>,
    /// The node names of the cluster this one replaced (a change of the node list; not part
    /// of the id): a client still configured with that list follows this cluster at connect
    /// (see [`crate::Client::connect`]). None in a new cluster, and in a successor written by
    /// an older release.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prev_nodes: Option<Vec<String>>,
}

impl Descriptor {
    /// The descriptor of a new cluster of these nodes. Deterministic: two clients
    /// bootstrapping the same list at once write the same descriptor.
    pub fn new_cluster(names: &[String]) -> Descriptor {
        Self::build(names, None)
    }

    /// The descriptor that replaces `self` with the node list `names` (a membership change).
    /// It keeps `self`'s node timeout.
    pub fn succeeding(&self, names: &[String]) -> Descriptor {
        Descriptor {
            node_timeout_ms: self.node_timeout_ms,
            prev_nodes: Some(self.nodes.clone()),
            ..Self::build(names, Some(self.id.clone()))
        }
    }

    /// The cluster's node timeout, if its descriptor records one.
    pub fn node_timeout(&self) -> Option<std::time::Duration> {
        self.node_timeout_ms.map(std::time::Duration::from_millis)
    }

    /// This descriptor with its node timeout raised to at least `t` (never lowered).
    pub fn with_node_timeout_at_least(mut self, t: std::time::Duration) -> Descriptor {
        let ms = u64::try_from(t.as_millis()).unwrap_or(u64::MAX);
        self.node_timeout_ms = Some(self.node_timeout_ms.map_or(ms, |old| old.max(ms)));
        self
    }

    fn build(names: &[String], prev: Option<String>) -> Descriptor {
        let mut nodes: Vec<String> = names.to_vec();
        nodes.sort();
        nodes.dedup();
        let mut material = format!("redquorum cluster v1\n{}\n", nodes.len());
        for n in &nodes {
            material.push_str(n);
            material.push('\n');
        }
        if let Some(p) = &prev {
            material.push_str("prev ");
            material.push_str(p);
        }
        let id = format!("{:016x}", xxhash_rust::xxh3::xxh3_64(material.as_bytes()));
        Descriptor {
            v: 1,
            id,
            nodes,
            prev,
            node_timeout_ms: None,
            prev_nodes: None,
        }
    }

    /// How many nodes the cluster has.
    pub fn n(&self) -> usize {
        self.nodes.len()
    }

    /// Whether `name` is one of the cluster's nodes.
    pub fn lists(&self, name: &str) -> bool {
        self.nodes.iter().any(|n| n == name)
    }

    /// The stored form (JSON).
    pub fn encode(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Parse the stored form; an error names what is wrong.
    pub fn decode(s: &str) -> Result<Descriptor, String> {
        let d: Descriptor =
            serde_json::from_str(s).map_err(|e| format!("unreadable cluster descriptor: {e}"))?;
        let hex16 = |x: &str| x.len() == 16 && x.bytes().all(|b| b.is_ascii_hexdigit());
        if d.v != 1 {
            return Err(format!(
                "cluster descriptor version {} is not supported",
                d.v
            ));
        }
        if !hex16(&d.id) || d.prev.as_deref().is_some_and(|p| !hex16(p)) {
            return Err("cluster descriptor with a malformed id".into());
        }
        if d.nodes.is_empty() || d.nodes.len() > crate::MAX_NODES {
            return Err(format!("cluster descriptor with {} nodes", d.nodes.len()));
        }
        Ok(d)
    }

    /// The node list for messages.
    pub fn describe(&self) -> String {
        format!("{} nodes [{}]", self.n(), self.nodes.join(", "))
    }
}

/// The cluster's node timeout as a client may rely on it: the longest `t` that at least
/// `needed` of the seen descriptors of cluster `id` carry (or exceed). None while fewer than
/// `needed` of them are seen, or when none records one (an older release's descriptor).
///
/// Why a majority: a client is allowed a node timeout only when a majority of the nodes'
/// descriptors carry at least it, and every repair waits the longest timeout among the
/// descriptors of its sources, a majority: the two sets share a node, so the repair waits at
/// least as long as any allowed client counts a reply (a raise interrupted after one node
/// allows no client the new timeout yet).
pub(crate) fn agreed_node_timeout(
    seen: &[Result<Descriptor, String>],
    id: &str,
    needed: usize,
) -> Option<std::time::Duration> {
    let mut ms: Vec<u64> = seen
        .iter()
        .flatten()
        .filter(|d| d.id == id)
        .map(|d| d.node_timeout_ms.unwrap_or(u64::MAX))
        .collect();
    // A descriptor without a timeout (an older release's repair rewrote it) beside ones that
    // record it counts as none: what a repair from it waits is only this client's own.
    if ms.iter().any(|v| *v != u64::MAX) {
        for v in ms.iter_mut().filter(|v| **v == u64::MAX) {
            *v = 0;
        }
    }
    if ms.len() < needed || needed == 0 {
        return None;
    }
    ms.sort_unstable_by(|a, b| b.cmp(a));
    ms.get(needed - 1)
        .copied()
        .filter(|v| *v != u64::MAX)
        .map(std::time::Duration::from_millis)
}

/// The longest node timeout any of `descriptors` records (what a repair waits at least).
pub(crate) fn longest_node_timeout<'a>(
    descriptors: impl IntoIterator<Item = &'a Descriptor>,
) -> Option<std::time::Duration> {
    descriptors
        .into_iter()
        .filter_map(Descriptor::node_timeout)
        .max()
}

/// What a change of the node list appends to an old node's marker, followed by the id of the
/// cluster that replaces it (`<run_id>/<old id>#sealed:<new id>`): the node then votes for no
/// client of the old cluster, and no second change can seal it for another successor (see
/// [`crate::Client::change_cluster`]).
pub(crate) const SEALED: &str = "#sealed:";

/// What a completed change appends to the markers of the old nodes it sealed
/// (`<run_id>/<old id>#sealed:<new id>#done`): a later run of the same change finds it done
/// and never copies the old cluster's frozen state again (onto nodes of the successor that
/// were wiped for reuse since, say). A stamped node is a source of no copy.
pub(crate) const CHANGE_DONE: &str = "#done";

/// The marker value of a node verified for cluster `cluster` by the repair (or set-up) `epoch`:
/// `<run_id>.<epoch>/<cluster id>` (`<run_id>/<cluster id>` without an epoch, as an older
/// release wrote it). The epoch is new with every repair, so the marker names the node's
/// incarnation: a node that lost its data without restarting (FLUSHALL keeps the run_id) and
/// was repaired shows another marker, which restarts every watch of it (a watch is tied to the
/// marker its replies came with) and refuses every request that expected the old one.
pub(crate) fn marker_value(run_id: &str, epoch: Option<&str>, cluster: &str) -> String {
    match epoch {
        Some(e) => format!("{run_id}.{e}/{cluster}"),
        None => format!("{run_id}/{cluster}"),
    }
}

/// A marker's parts: the run_id it was written for (without its epoch) and the cluster id
/// (None in a marker written by an older release, which named the run_id only).
pub(crate) fn parse_marker(marker: &str) -> (&str, Option<&str>) {
    let (run, cluster) = match marker.split_once('/') {
        Some((run, cluster)) => (run, Some(cluster)),
        None => (marker, None),
    };
    (run.split_once('.').map_or(run, |(r, _)| r), cluster)
}

/// Which cluster a client's nodes say they form.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Adoption {
    /// No node reached so far holds a descriptor (a new cluster, or nothing reached yet).
    Unknown,
    /// The cluster this client works in.
    Adopted(Descriptor),
    /// The client must not run against these nodes; the reason names both node lists.
    Refused(String),
}

impl Adoption {
    /// The adopted cluster's id, if one is adopted.
    pub(crate) fn id(&self) -> Option<&str> {
        match self {
            Adoption::Adopted(d) => Some(&d.id),
            _ => None,
        }
    }
}

/// Decide which cluster a client configured with the node names `ours` works in, from the
/// descriptors its reachable nodes hold (`seen`, unreadable ones as errors).
///
/// - No descriptor anywhere: [`Adoption::Unknown`] (a bootstrap may write one).
/// - Descriptors that are all the same, or where every other one was replaced by the newest
///   through a chain of changes: that newest one, if it lists as many nodes as `ours`.
/// - Anything else (another node count; unrelated descriptors; an unreadable one):
///   [`Adoption::Refused`], naming the lists.
///
/// `check_count` false is the TEST-ONLY switch that adopts whatever the nodes hold.
pub(crate) fn adopt(
    ours: &[String],
    seen: &[Result<Descriptor, String>],
    check_count: bool,
) -> Adoption {
    let mut distinct: Vec<(&Descriptor, usize)> = Vec::new();
    let mut unreadable = None;
    for s in seen {
        match s {
            Ok(d) => match distinct.iter_mut().find(|(x, _)| x.id == d.id) {
                Some((_, count)) => *count += 1,
                None => distinct.push((d, 1)),
            },
            Err(e) => unreadable = Some(e.clone()),
        }
    }
    let majority = ours.len() / 2 + 1;
    let known: Vec<&Descriptor> = distinct.iter().map(|(d, _)| *d).collect();
    // The newest of one chain of changes; or else the descriptor a majority of this client's
    // nodes hold (a minority holding something else, or something unreadable, is left out as
    // strangers: one stray node must not stop the cluster).
    let chain = known
        .iter()
        .find(|d| {
            known
                .iter()
                .all(|other| other.id == d.id || supersedes(d, other, &known))
        })
        .copied()
        .filter(|_| unreadable.is_none() || !check_count);
    let by_majority = distinct
        .iter()
        .find(|(_, count)| *count >= majority)
        .map(|(d, _)| *d);
    let Some(newest) = chain.or(by_majority) else {
        if distinct.is_empty() && unreadable.is_none() {
            return Adoption::Unknown;
        }
        let mut lists: Vec<String> = distinct
            .iter()
            .map(|(d, _)| format!("cluster {}: {}", d.id, d.describe()))
            .collect();
        lists.extend(unreadable);
        return Adoption::Refused(format!(
            "the nodes belong to different clusters ({}); this client lists {} nodes [{}]",
            lists.join("; "),
            ours.len(),
            ours.join(", ")
        ));
    };
    if check_count && newest.n() != ours.len() {
        return Adoption::Refused(format!(
            "this client lists {} nodes [{}], but the cluster on these nodes (id {}) was set up \
             with {}: every client must list the cluster's nodes (to change the node list, \
             use `redquorum cluster change`)",
            ours.len(),
            ours.join(", "),
            newest.id,
            newest.describe()
        ));
    }
    // The longest node timeout its nodes record: a repair writes it (raised, never lowered).
    let longest = seen
        .iter()
        .flatten()
        .filter(|d| d.id == newest.id)
        .filter_map(|d| d.node_timeout_ms)
        .max();
    Adoption::Adopted(Descriptor {
        node_timeout_ms: longest,
        ..newest.clone()
    })
}

/// Where a change of the node list, asked by a client of the list `ours` to move to the list
/// `to`, starts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Origin {
    /// A new change: the adopted cluster (which lists exactly `ours`) and its successor.
    Fresh(Descriptor, Descriptor),
    /// A change to this very list is under way or done (some node holds the successor's
    /// descriptor): it resumes from the cluster it started from, whatever the nodes'
    /// adoption says now (a partly marked change makes the old list's client adopt the
    /// successor, or refuse it for its node count).
    Resumed(Descriptor, Descriptor),
    /// No change can start from this client; the reason names the lists.
    Refused(String),
    /// These nodes hold no cluster yet.
    Unknown,
}

/// Decide where a change from a client of `ours` (whose nodes hold `seen`, adopted as
/// `adoption`) to the list `to` starts. Re-running an interrupted change with the same two
/// lists always finds the same two clusters (the successor's id is derived from the old id and
/// the new list), so it finishes the change rather than sealing for a second, bogus successor.
pub(crate) fn change_origin(
    ours: &[String],
    seen: &[Result<Descriptor, String>],
    adoption: &Adoption,
    to: &[String],
) -> Origin {
    let ours = identities(ours);
    let known: Vec<&Descriptor> = seen.iter().flatten().collect();
    for d in known.iter().filter(|d| identities(&d.nodes) == ours) {
        // The longest node timeout any copy of this descriptor records (never lowered).
        let longest = known
            .iter()
            .filter(|k| k.id == d.id)
            .filter_map(|k| k.node_timeout())
            .max();
        let d = match longest {
            Some(t) => (*d).clone().with_node_timeout_at_least(t),
            None => (*d).clone(),
        };
        let next = d.succeeding(to);
        if known.iter().any(|k| k.id == next.id) {
            return Origin::Resumed(d, next);
        }
    }
    match adoption {
        Adoption::Adopted(d) => Origin::Fresh(d.clone(), d.succeeding(to)),
        Adoption::Refused(why) => Origin::Refused(why.clone()),
        Adoption::Unknown => Origin::Unknown,
    }
}

/// Whether a client configured with the node names `ours` must follow a successor of its
/// cluster, from the descriptors its reachable nodes hold (`seen`) and the successor ids that
/// sealed old nodes name (`seals`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Follow {
    /// Nothing to follow: the client works with its own list (or is refused as before).
    Stay,
    /// The node list was changed: work in this cluster, through the nodes it lists.
    To(Descriptor),
    /// The nodes disagree about the successor: the reason names them.
    Refuse(String),
}

/// Decide whether a client of the list `ours` follows a successor (a change of the node list
/// replaced its cluster): the newest descriptor seen that descends, through changes, from a
/// cluster of exactly `ours` (a successor records its predecessor's node list), and that every
/// seal names (a seal names the change's successor: it must be that one or one of its
/// predecessors). A client whose list is the newest cluster's stays.
pub(crate) fn follow(
    ours: &[String],
    seen: &[Result<Descriptor, String>],
    seals: &[String],
) -> Follow {
    let ours = identities(ours);
    let known: Vec<&Descriptor> = seen.iter().flatten().collect();
    let descends = |d: &Descriptor| {
        identities(&d.nodes) != ours
            && lineage(d, &known).iter().any(|a| {
                a.prev_nodes
                    .as_deref()
                    .is_some_and(|p| identities(p) == ours)
            })
    };
    let candidates: Vec<&Descriptor> = known.iter().copied().filter(|d| descends(d)).collect();
    let Some(newest) = candidates.iter().copied().find(|d| {
        candidates
            .iter()
            .all(|o| o.id == d.id || supersedes(d, o, &known))
    }) else {
        return match candidates.first() {
            None => Follow::Stay,
            Some(_) => Follow::Refuse(format!(
                "the nodes hold several successors of this client's node list ({}): none \
                 replaced the others",
                candidates
                    .iter()
                    .map(|d| format!("cluster {}: {}", d.id, d.describe()))
                    .collect::<Vec<_>>()
                    .join("; ")
            )),
        };
    };
    let ids: Vec<&str> = lineage(newest, &known)
        .iter()
        .map(|d| d.id.as_str())
        .chain(newest.prev.as_deref())
        .collect();
    if let Some(other) = seals.iter().find(|x| !ids.contains(&x.as_str())) {
        return Follow::Refuse(format!(
            "the old nodes are sealed for cluster {other}, but the new nodes hold cluster {} \
             ({}), which does not descend from it",
            newest.id,
            newest.describe()
        ));
    }
    Follow::To(newest.clone())
}

/// `d` and its predecessors among `known`, newest first.
fn lineage<'a>(d: &'a Descriptor, known: &[&'a Descriptor]) -> Vec<&'a Descriptor> {
    let mut out = vec![d];
    let mut cur = d;
    while out.len() <= known.len() {
        match cur
            .prev
            .as_ref()
            .and_then(|p| known.iter().find(|k| k.id == *p))
        {
            Some(prev) if !out.iter().any(|o| o.id == prev.id) => {
                out.push(prev);
                cur = prev;
            }
            _ => break,
        }
    }
    out
}

/// The successor a sealed marker names (`…#sealed:<new id>[#done]`), if it is sealed.
pub(crate) fn sealed_for(marker: &str) -> Option<&str> {
    let (_, rest) = marker.split_once(SEALED)?;
    Some(rest.strip_suffix(CHANGE_DONE).unwrap_or(rest))
}

/// Whether two node lists name the same servers (user part and case aside).
pub(crate) fn same_servers(a: &[String], b: &[String]) -> bool {
    identities(a) == identities(b)
}

/// Node names as a set of servers, whatever the spelling of their user part or case: the
/// operator's list and the one the descriptor holds name the same servers.
fn identities(names: &[String]) -> Vec<String> {
    let mut ids: Vec<String> = names
        .iter()
        .map(|n| {
            let (scheme, rest) = n.split_once("://").unwrap_or(("", n));
            let rest = rest.rsplit_once('@').map_or(rest, |(_, host)| host);
            format!("{scheme}://{rest}").to_ascii_lowercase()
        })
        .collect();
    ids.sort();
    ids.dedup();
    ids
}

/// Whether `newer` replaced `older` through a chain of predecessors among `known`.
fn supersedes(newer: &Descriptor, older: &Descriptor, known: &[&Descriptor]) -> bool {
    let mut cur = newer;
    for _ in 0..known.len() {
        match &cur.prev {
            Some(p) if *p == older.id => return true,
            Some(p) => match known.iter().find(|d| d.id == *p) {
                Some(d) => cur = d,
                None => return false,
            },
            None => return false,
        }
    }
    false
}

/// What a node's marker says about its standing in the adopted cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Standing {
    /// Verified for this incarnation in the adopted cluster: it may vote.
    Member,
    /// Must be repaired before it votes (the reason says why); `needs_listing` when the
    /// repair enlists it anew, which the descriptor must allow (its URL is listed).
    Quarantined {
        /// Why.
        reason: String,
        /// Whether the node's URL must be one the descriptor lists.
        needs_listing: bool,
    },
    /// Marked for an unrelated cluster: never repaired into this one.
    Stranger(String),
}

/// A node's standing from its marker, its run_id and the adopted cluster.
pub(crate) fn standing(marker: Option<&str>, run_id: Option<&str>, adopted: &Adoption) -> Standing {
    let q = |reason: String, needs_listing: bool| Standing::Quarantined {
        reason,
        needs_listing,
    };
    let Some(marker) = marker else {
        return q(
            "no marker: a new node, or one that lost its data".into(),
            true,
        );
    };
    let (run, cluster) = parse_marker(marker);
    if let (Some(c), Adoption::Adopted(d)) = (cluster, adopted) {
        if let Some((sealed, successor)) = c.split_once(SEALED) {
            return if successor == d.id || d.prev.as_deref() == Some(sealed) {
                q(
                    format!("sealed when cluster {sealed} was replaced by cluster {successor}"),
                    true,
                )
            } else if sealed == d.id {
                Standing::Stranger(format!(
                    "cluster {sealed} was replaced by cluster {successor} (a change of its node \
                     list): use the new list"
                ))
            } else {
                Standing::Stranger(format!("sealed for cluster {sealed}, not {}", d.id))
            };
        }
    }
    let Some(cluster) = cluster else {
        return q(
            "marker from an older release (no cluster id): re-verified like a new node".into(),
            true,
        );
    };
    if let Adoption::Adopted(d) = adopted {
        if cluster != d.id {
            return if d.prev.as_deref() == Some(cluster) {
                q(
                    format!(
                        "marked for cluster {cluster}, which cluster {} replaced",
                        d.id
                    ),
                    true,
                )
            } else {
                Standing::Stranger(format!(
                    "marked for cluster {cluster}, not this client's cluster {}",
                    d.id
                ))
            };
        }
    }
    match run_id {
        None => q("no run_id reported".into(), false),
        Some(r) if r != run => q(
            format!(
                "restarted since it was last verified (marker {}, run_id {})",
                short(run),
                short(r)
            ),
            false,
        ),
        Some(_) if adopted.id().is_none() => {
            q("its cluster is not known to this client yet".into(), false)
        }
        Some(_) => Standing::Member,
    }
}

fn short(s: &str) -> &str {
    s.get(..8).unwrap_or(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(xs: &[&str]) -> Vec<String> {
        xs.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn the_same_list_in_any_order_gives_the_same_cluster() {
        let a = Descriptor::new_cluster(&names(&["redis://b:1/0", "redis://a:1/0"]));
        let b = Descriptor::new_cluster(&names(&["redis://a:1/0", "redis://b:1/0"]));
        assert_eq!(a, b);
        let c = Descriptor::new_cluster(&names(&["redis://a:1/0", "redis://c:1/0"]));
        assert_ne!(a.id, c.id);
        assert_eq!(Descriptor::decode(&a.encode()), Ok(a.clone()));
        let next = a.succeeding(&names(&["redis://a:1/0", "redis://b:1/0"]));
        assert_ne!(
            next.id, a.id,
            "a change gets a new id even for the same list"
        );
    }

    #[test]
    fn the_node_timeout_a_client_may_use_is_the_one_a_majority_records() {
        use std::time::Duration;
        let list = names(&["redis://a:1/0", "redis://b:1/0", "redis://c:1/0"]);
        let base = Descriptor::new_cluster(&list);
        let at = |ms: u64| {
            Ok(base
                .clone()
                .with_node_timeout_at_least(Duration::from_millis(ms)))
        };
        let ms = Duration::from_millis;
        assert_eq!(
            base.clone()
                .with_node_timeout_at_least(ms(500))
                .with_node_timeout_at_least(ms(250))
                .node_timeout(),
            Some(ms(500)),
            "raised, never lowered"
        );
        assert_eq!(
            base.id,
            at(900).unwrap().id,
            "the timeout is not part of the id"
        );
        // A raise from 250 ms to 1 s interrupted after one node allows no client 1 s yet.
        let seen = [at(1000), at(250), at(250)];
        assert_eq!(agreed_node_timeout(&seen, &base.id, 2), Some(ms(250)));
        let seen = [at(1000), at(1000), at(250)];
        assert_eq!(agreed_node_timeout(&seen, &base.id, 2), Some(ms(1000)));
        // Beside ones that record it, a descriptor without one counts as none (0 ms).
        let seen = [at(1000), Ok(base.clone()), at(1000)];
        assert_eq!(agreed_node_timeout(&seen, &base.id, 2), Some(ms(1000)));
        let seen = [at(1000), Ok(base.clone()), at(250)];
        assert_eq!(agreed_node_timeout(&seen, &base.id, 2), Some(ms(250)));
        // Too few seen to judge; an older release's descriptors record none.
        assert_eq!(agreed_node_timeout(&[at(1000)], &base.id, 2), None);
        assert_eq!(
            agreed_node_timeout(&[Ok(base.clone()), Ok(base.clone())], &base.id, 2),
            None
        );
        // What a repair waits and what a client adopts: the longest any node records.
        match adopt(&list, &[at(1000), at(250), at(250)], true) {
            Adoption::Adopted(d) => assert_eq!(d.node_timeout(), Some(ms(1000))),
            other => panic!("expected the cluster adopted, got {other:?}"),
        }
        let succ = at(700).unwrap().succeeding(&list);
        assert_eq!(
            succ.node_timeout(),
            Some(ms(700)),
            "a change keeps the timeout"
        );
    }

    #[test]
    fn an_old_list_follows_the_successor_its_seal_names_and_nothing_else() {
        let three = names(&["redis://a:1", "redis://b:1", "redis://c:1"]);
        let five = names(&[
            "redis://a:1",
            "redis://b:1",
            "redis://c:1",
            "redis://d:1",
            "redis://e:1",
        ]);
        let old = Descriptor::new_cluster(&three);
        let new = old.succeeding(&five);
        // The removed nodes are gone: only the new cluster's descriptor is seen.
        assert_eq!(
            follow(&three, &[Ok(new.clone())], &[]),
            Follow::To(new.clone())
        );
        // Beside the old one and a seal naming it.
        assert_eq!(
            follow(
                &three,
                &[Ok(old.clone()), Ok(new.clone())],
                std::slice::from_ref(&new.id)
            ),
            Follow::To(new.clone())
        );
        // A client of the new list, or of the old cluster before any change, stays.
        assert_eq!(follow(&five, &[Ok(new.clone())], &[]), Follow::Stay);
        assert_eq!(follow(&three, &[Ok(old.clone())], &[]), Follow::Stay);
        // Two changes on: the newest, through the chain.
        let four = names(&["redis://a:1", "redis://b:1", "redis://d:1", "redis://e:1"]);
        let newer = new.succeeding(&four);
        assert_eq!(
            follow(
                &three,
                &[Ok(new.clone()), Ok(newer.clone())],
                std::slice::from_ref(&new.id)
            ),
            Follow::To(newer.clone())
        );
        // A seal naming another successor: refused.
        let bogus = old.succeeding(&four);
        assert!(matches!(
            follow(&three, &[Ok(new.clone())], std::slice::from_ref(&bogus.id)),
            Follow::Refuse(why) if why.contains(&bogus.id)
        ));
        // A list that is no predecessor follows nothing.
        let other = names(&["redis://x:1", "redis://y:1", "redis://z:1"]);
        assert_eq!(follow(&other, &[Ok(new.clone())], &[]), Follow::Stay);
        // A successor written by an older release (no predecessor list) is not followed.
        let legacy = Descriptor {
            prev_nodes: None,
            ..new.clone()
        };
        assert_eq!(follow(&three, &[Ok(legacy)], &[]), Follow::Stay);
        assert_eq!(
            sealed_for(&format!("r.e/{}#sealed:{}#done", old.id, new.id)),
            Some(new.id.as_str())
        );
    }

    #[test]
    fn malformed_descriptors_are_rejected_with_a_reason() {
        for bad in [
            "",
            "nan",
            r#"{"v":2,"id":"0123456789abcdef","nodes":["a"]}"#,
            r#"{"v":1,"id":"xyz","nodes":["a"]}"#,
            r#"{"v":1,"id":"0123456789abcdef","nodes":[]}"#,
        ] {
            assert!(Descriptor::decode(bad).is_err(), "{bad:?} must not decode");
        }
    }

    #[test]
    fn a_client_with_another_node_count_is_refused_naming_both_lists() {
        let three = names(&["redis://n0:1/0", "redis://n1:1/0", "redis://n2:1/0"]);
        let five = names(&[
            "redis://n0:1/0",
            "redis://n1:1/0",
            "redis://n2:1/0",
            "redis://n3:1/0",
            "redis://n4:1/0",
        ]);
        let d = Descriptor::new_cluster(&three);
        let seen = vec![Ok(d.clone()), Ok(d.clone())];
        assert_eq!(adopt(&three, &seen, true), Adoption::Adopted(d.clone()));
        match adopt(&five, &seen, true) {
            Adoption::Refused(why) => {
                assert!(
                    why.contains("redis://n4:1/0") && why.contains("3 nodes"),
                    "{why}"
                )
            }
            other => panic!("expected a refusal, got {other:?}"),
        }
        assert_eq!(adopt(&five, &seen, false), Adoption::Adopted(d));
        assert_eq!(adopt(&five, &[], true), Adoption::Unknown);
    }

    #[test]
    fn a_changed_cluster_supersedes_its_predecessor_and_strangers_are_refused() {
        let three = names(&["a", "b", "c"]);
        let five = names(&["a", "b", "c", "d", "e"]);
        let old = Descriptor::new_cluster(&three);
        let new = old.succeeding(&five);
        let seen = vec![Ok(old.clone()), Ok(new.clone()), Ok(new.clone())];
        assert_eq!(adopt(&five, &seen, true), Adoption::Adopted(new.clone()));
        let other = Descriptor::new_cluster(&names(&["x", "y", "z"]));
        assert!(matches!(
            adopt(&three, &[Ok(old.clone()), Ok(other)], true),
            Adoption::Refused(_)
        ));
        assert!(matches!(
            adopt(&three, &[Ok(old.clone()), Err("unreadable".into())], true),
            Adoption::Refused(_)
        ));
        // A majority agreeing leaves a stray or unreadable minority out, as strangers.
        let stray = Descriptor::new_cluster(&names(&["x", "y", "z"]));
        assert_eq!(
            adopt(&three, &[Ok(old.clone()), Ok(old.clone()), Ok(stray)], true),
            Adoption::Adopted(old.clone())
        );
        assert_eq!(
            adopt(
                &three,
                &[Ok(old.clone()), Ok(old.clone()), Err("v2".into())],
                true
            ),
            Adoption::Adopted(old)
        );
    }

    #[test]
    fn a_rerun_change_resumes_from_the_cluster_it_started_from() {
        let three = names(&["a", "b", "c"]);
        let swap = names(&["a", "b", "d"]);
        let five = names(&["a", "b", "c", "d", "e"]);
        let old = Descriptor::new_cluster(&three);
        let seen = vec![Ok(old.clone()), Ok(old.clone()), Ok(old.clone())];
        let adopted = adopt(&three, &seen, true);
        assert_eq!(
            change_origin(&three, &seen, &adopted, &swap),
            Origin::Fresh(old.clone(), old.succeeding(&swap))
        );
        // Interrupted after marking one overlapping node: the old list's client now adopts
        // the successor (same count) or is refused (another count); both resume.
        for to in [&swap, &five] {
            let next = old.succeeding(to);
            let seen = vec![Ok(next.clone()), Ok(old.clone()), Ok(old.clone())];
            let adopted = adopt(&three, &seen, true);
            assert_eq!(
                change_origin(&three, &seen, &adopted, to),
                Origin::Resumed(old.clone(), next.clone()),
                "adopted {adopted:?}"
            );
        }
        // A change to another list from the old list, once the swap is done, changes the
        // successor (its client's majority is one of the successor's).
        let next = old.succeeding(&swap);
        let seen = vec![Ok(next.clone()), Ok(next.clone()), Ok(old.clone())];
        let adopted = adopt(&three, &seen, true);
        let other = names(&["a", "b", "e"]);
        assert_eq!(
            change_origin(&three, &seen, &adopted, &other),
            Origin::Fresh(next.clone(), next.succeeding(&other))
        );
        // The operator's spelling of the user part does not hide a change under way.
        let spelled = names(&["redis://ops@h1:1/0", "redis://h2:1/0", "redis://H3:1/0"]);
        let stored = Descriptor::new_cluster(&names(&[
            "redis://svc@h1:1/0",
            "redis://h2:1/0",
            "redis://h3:1/0",
        ]));
        let to = names(&["redis://h1:1/0", "redis://h2:1/0", "redis://h4:1/0"]);
        let seen = vec![Ok(stored.succeeding(&to)), Ok(stored.clone())];
        assert_eq!(
            change_origin(&spelled, &seen, &Adoption::Unknown, &to),
            Origin::Resumed(stored.clone(), stored.succeeding(&to))
        );
        assert_eq!(
            change_origin(&three, &[], &Adoption::Unknown, &swap),
            Origin::Unknown
        );
    }

    #[test]
    fn standing_follows_marker_run_id_and_cluster() {
        let d = Descriptor::new_cluster(&names(&["a", "b", "c"]));
        let adopted = Adoption::Adopted(d.clone());
        let m = marker_value("run1", None, &d.id);
        assert_eq!(standing(Some(&m), Some("run1"), &adopted), Standing::Member);
        assert!(matches!(
            standing(Some(&m), Some("run2"), &adopted),
            Standing::Quarantined {
                needs_listing: false,
                ..
            }
        ));
        assert!(matches!(
            standing(None, Some("run1"), &adopted),
            Standing::Quarantined {
                needs_listing: true,
                ..
            }
        ));
        assert!(matches!(
            standing(Some("run1"), Some("run1"), &adopted),
            Standing::Quarantined {
                needs_listing: true,
                ..
            }
        ));
        let stranger = marker_value("run1", None, "00000000000000ff");
        assert!(matches!(
            standing(Some(&stranger), Some("run1"), &adopted),
            Standing::Stranger(_)
        ));
        let next = d.succeeding(&names(&["a", "b", "c", "d", "e"]));
        assert!(matches!(
            standing(Some(&m), Some("run1"), &Adoption::Adopted(next)),
            Standing::Quarantined {
                needs_listing: true,
                ..
            }
        ));
        assert!(matches!(
            standing(Some(&m), Some("run1"), &Adoption::Unknown),
            Standing::Quarantined { .. }
        ));
    }
}
