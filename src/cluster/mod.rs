//! Cluster identity: which servers form the cluster, written on the servers themselves, so that
//! every client counts its majorities over the same servers. Pure: no I/O, no clock.
//!
//! # How it works
//! Majorities intersect only if every client counts them over the same set of servers.
//! 1. The cluster's node list is stored on every node as a [`Descriptor`] (`rq:cluster`: the
//!    sorted node names and an id derived from them, the predecessor's id, the cluster's node
//!    timeout), and each node's marker names the cluster beside its incarnation,
//!    `<run_id>.<epoch>/<cluster id>` (`marker.rs`).
//! 2. A client adopts the descriptor its nodes hold (`adopt.rs`: the newest of one chain of
//!    changes, or the one a majority of its nodes hold) and refuses to run when it lists another
//!    number of nodes or the nodes hold unrelated descriptors; it then expects its adopted
//!    cluster's marker in every script call.
//! 3. A node's marker gives its standing (`standing`): a member votes; a node without a marker,
//!    restarted, or sealed for this cluster is quarantined (repaired only by a URL the
//!    descriptor lists); a node of another cluster is a stranger.
//! 4. A change of the node list (`change_origin`, run by `src/repair/change.rs`) replaces the
//!    cluster with its successor, whose id hashes the old id and the new list: it seals a
//!    majority of the old nodes (`<run_id>/<old id>#sealed:<new id>`) before the new nodes are
//!    marked, and stamps them done (`#done`) at the end. A client configured with a replaced
//!    list follows the successor (`follow`), at connect and while it runs (the swap of its
//!    list is argued in `src/client/mod.rs`).
//!
//! # Guarantees
//! With "a URL names one server", at most `n` servers are marked for a cluster of `n` nodes, and
//! any two clients' majorities (each `n / 2 + 1` distinct marked servers) share one: a vote a
//! client counts comes from a server marked for its cluster. A sealed old cluster accepts nothing
//! after the seal, and no value it accepted is missing from a majority of its successor. Re-running
//! an interrupted change finds the same two clusters and resumes it. A client pinned to its
//! cluster (`Config::with_cluster_id`) adopts only it or its direct successor. Not guaranteed:
//! two clients that spell the same nodes differently both work, but only a client whose spelling
//! the descriptor holds can enlist a wiped node; concurrent first-time set-ups by clients with
//! different spellings can split the nodes between two descriptors (a manual reset).
//!
//! # Invariants
//! - Architecture invariant: a node votes only while its marker names the cluster the client
//!   adopted, and a client adopts only a descriptor whose node count equals its own; a server
//!   counts once per fan-out (claimed by its run_id by the first node of the fan-out to reach
//!   it, in `src/client/send.rs`).
//! - Architecture invariant: a node-list change is identified by its two lists alone (the
//!   successor's id hashes the old id and the new list), so running an interrupted change again
//!   resumes it, never seals for a second successor (`change_origin`).
//! - Architecture invariant: the node timeout a client may use is the one a majority of the
//!   nodes' descriptors record (`agreed_node_timeout`); a repair waits the longest its sources
//!   record (`longest_node_timeout`).
//! - A marker never repeats on a node: its epoch is new at every repair and set-up.
//!
//! # What it relies on outside this folder
//! - Applied by the client layer (`src/client/verdicts.rs`: adoption, standing, the node-timeout
//!   check; `src/client/send.rs`: one vote per server) and by the repair layer (`src/repair/`:
//!   set-up, repair and change write descriptors and markers).
//! - Keys (`src/keys.rs`): `KeyKind::Marker` (`rq:marker`) and `KeyKind::Cluster` (`rq:cluster`).
//! - Scripts: every script that writes or decides compares the marker (after
//!   `src/scripts/prelude.lua`); `src/scripts/mark.lua`, `src/scripts/cluster_init.lua` and
//!   `src/scripts/seal.lua` write descriptors and markers.
//! - Repair rule (`src/repair/plan.rs`): `marker` and `cluster` are never copied (they describe
//!   the node itself); a repair writes them last.
//! - ACL (`src/acl.rs`): the base (`GET` of the marker and the descriptor, in every probe).
//! - Model: cluster identity itself is not modelled; `model/src/copy.rs` models the copy of a
//!   node-list change (sealed sources, FLUSHALL at any moment).
//! - Tests: the unit tests here; `tests/cluster.rs` (a client with another node list refused,
//!   one vote per server, a change of the list, with teeth), `tests/cluster_init.rs`,
//!   `tests/interrupted_change.rs`, `cli/tests/cli.rs` (`cluster show`, `cluster change`).
//!
//! # Files
//! - `mod.rs`: [`Descriptor`], the node timeout a client may use, the set-up hint.
//! - `marker.rs`: markers, seals and a node's [`Standing`].
//! - `adopt.rs`: adoption, where a change starts ([`Origin`]), following a successor
//!   ([`Follow`]).

use serde::{Deserialize, Serialize};

mod adopt;
mod marker;

pub(crate) use adopt::{adopt, change_origin, follow, same_servers, Adoption, Follow, Origin};
pub(crate) use marker::{
    marker_value, parse_marker, sealed_for, standing, Standing, CHANGE_DONE, SEALED,
};

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

/// What the error of a client on nodes without a set-up cluster says to do.
pub(crate) const INIT_HINT: &str = "set one up with `redquorum cluster init` \
     (Client::init_cluster): nothing was written. If these nodes held a cluster before, a \
     majority of them lost their data, and its IDs and fencing tokens start again from 1 in \
     the cluster set up anew";

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
}
