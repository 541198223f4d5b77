//! Which cluster a client works in: adoption of the descriptor its nodes hold, where a change
//! of the node list starts (or resumes), and whether a client of a replaced list follows the
//! successor. Pure.

use super::Descriptor;

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
    let (distinct, unreadable) = count_distinct(seen);
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

/// The distinct descriptors among `seen`, each with how many nodes hold it, and the last
/// unreadable one's error.
fn count_distinct(
    seen: &[Result<Descriptor, String>],
) -> (Vec<(&Descriptor, usize)>, Option<String>) {
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
    (distinct, unreadable)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::sealed_for;

    fn names(xs: &[&str]) -> Vec<String> {
        xs.iter().map(|s| s.to_string()).collect()
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
}
