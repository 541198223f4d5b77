//! Pure decisions of a repair: whether a node needs one, and, from a census of every node,
//! whether to copy (and from which nodes), bootstrap a new cluster, or wait. No I/O, no clock.

use std::collections::HashSet;

use crate::cluster::{self, Adoption, Descriptor, Standing, INIT_HINT};

use super::{Census, RepairOutcome};

/// What a node's probe says about repairing it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Need {
    /// Repair it: why, and the incarnation to repair.
    Repair { reason: String, run_id: String },
    /// Do nothing now, with this outcome.
    Done(RepairOutcome),
}

/// Whether the node `name` (probed with `run_id`, standing `standing` in the client's
/// `adoption`) needs a repair. A node the repair would enlist anew must be listed by the
/// cluster's descriptor (unless the test-only switch is off: `check_listing` false).
pub(super) fn need(
    adoption: &Adoption,
    standing: Standing,
    run_id: Option<&str>,
    name: &str,
    check_listing: bool,
) -> Need {
    let (reason, needs_listing) = match (adoption, standing) {
        (Adoption::Refused(why), _) => return Need::Done(RepairOutcome::Deferred(why.clone())),
        (_, Standing::Stranger(why)) => return Need::Done(RepairOutcome::Deferred(why)),
        (_, Standing::Member) => return Need::Done(RepairOutcome::NotNeeded),
        (
            _,
            Standing::Quarantined {
                reason,
                needs_listing,
            },
        ) => (reason, needs_listing),
    };
    let Some(run_id) = run_id else {
        return Need::Done(RepairOutcome::Deferred("the node reports no run_id".into()));
    };
    if let Adoption::Adopted(d) = adoption {
        if needs_listing && check_listing && !d.lists(name) {
            return Need::Done(RepairOutcome::Deferred(format!(
                "{name} is not one of the nodes of cluster {} ({}): a client enlists a node only \
                 by a URL the cluster lists",
                d.id,
                d.describe()
            )));
        }
    }
    Need::Repair {
        reason,
        run_id: run_id.to_string(),
    }
}

/// What a repair does after its census.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Plan {
    /// Copy from these nodes (a majority of one server each), then mark for the cluster.
    Copy {
        sources: Vec<usize>,
        cluster: Descriptor,
    },
    /// Not now.
    Wait(String),
}

/// The plan for repairing node `target` from a census of `nodes` nodes (the answers only),
/// with a majority of `needed`: a copy from `needed` marked others. A repair never sets a
/// cluster up: nodes where fewer than a majority are marked and none holds state wait for
/// `cluster init` ([`set_up`]).
pub(super) fn after_census(
    adoption: &Adoption,
    census: &[Census],
    target: usize,
    needed: usize,
    nodes: usize,
) -> Plan {
    let adopted = match adoption {
        Adoption::Adopted(d) => Some(d),
        _ => None,
    };
    let sources = adopted.map(|d| choose_sources(census, target, &d.id, needed));
    if let (Some(d), Some(sources)) = (adopted, &sources) {
        if sources.len() >= needed {
            return Plan::Copy {
                sources: sources.clone(),
                cluster: d.clone(),
            };
        }
    }
    let any_state = census.iter().any(|c| c.has_state);
    let marked = census.iter().filter(|c| c.marker.is_some()).count();
    if marked < needed && !any_state {
        return Plan::Wait(format!(
            "no cluster is set up on these nodes ({marked} of the {} that answered are marked, \
             none holds data): {INIT_HINT}",
            census.len()
        ));
    }
    Plan::Wait(format!(
        "{} marked node(s) other than this one answered; {needed} of {nodes} are needed to \
         repair it",
        sources.map_or(0, |s| s.len()),
    ))
}

/// What `cluster init` does, from a census of every answering node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum SetUp {
    /// Mark every unmarked node for this (new, or half set-up) cluster.
    Mark(Descriptor),
    /// The cluster is set up already: a majority of the nodes is marked for it.
    Exists(Descriptor),
    /// Nothing can be set up; the reason says why and what to do.
    Refuse(String),
    /// Not every node answered (and those that did do not form a cluster set up already):
    /// nothing can be decided until they do.
    Incomplete { answered: usize, nodes: usize },
}

/// Whether `cluster init` sets up a cluster for the node list `our_names` (`nodes` of them,
/// majority `needed`), from the client's `adoption` and a `census` of the nodes that
/// answered. A cluster is set up only when every node answers, fewer than a majority are
/// marked, none holds state, no marker names another cluster, and the client's `pin` (if
/// any) names this cluster: then no majority can ever have accepted a value, so marking
/// every node loses nothing (see the module docs of `repair`). A majority marked for the
/// adopted cluster is an existing one.
pub(crate) fn set_up(
    adoption: &Adoption,
    census: &[Census],
    needed: usize,
    nodes: usize,
    our_names: &[String],
    pin: Option<&str>,
) -> SetUp {
    let descriptor = match adoption {
        Adoption::Refused(why) => return SetUp::Refuse(why.clone()),
        Adoption::Adopted(d) if !cluster::same_servers(&d.nodes, our_names) => {
            return SetUp::Refuse(format!(
                "these nodes hold cluster {} ({}), not one of this node list: to change a \
                 cluster's node list, use `redquorum cluster change`",
                d.id,
                d.describe()
            ))
        }
        Adoption::Adopted(d) => d.clone(),
        Adoption::Unknown => Descriptor::new_cluster(our_names),
    };
    let ours = |c: &&Census| {
        c.marker
            .as_deref()
            .is_some_and(|m| cluster::parse_marker(m).1 == Some(descriptor.id.as_str()))
    };
    if census.iter().filter(ours).count() >= needed {
        return SetUp::Exists(descriptor);
    }
    if census.len() < nodes {
        return SetUp::Incomplete {
            answered: census.len(),
            nodes,
        };
    }
    if let Some(c) = census.iter().find(|c| c.marker.is_some() && !ours(c)) {
        return SetUp::Refuse(format!(
            "node {} is marked for another cluster ({}): it is not blank",
            c.node,
            c.marker.as_deref().unwrap_or_default()
        ));
    }
    if let Some(c) = census.iter().find(|c| c.has_state) {
        return SetUp::Refuse(format!(
            "node {} holds redquorum data, but fewer than a majority of the nodes are marked \
             for cluster {}: a majority lost its data. Setting a cluster up here would lose \
             what node {} holds; to start over anyway, empty every node first (FLUSHALL)",
            c.node, descriptor.id, c.node
        ));
    }
    match pin.filter(|p| *p != descriptor.id) {
        Some(pin) => SetUp::Refuse(format!(
            "this client is pinned to cluster {pin}, but these nodes would form cluster {} ({})",
            descriptor.id,
            descriptor.describe()
        )),
        None => SetUp::Mark(descriptor),
    }
}

/// The nodes a repair of node `target` reads from: one per server, marked for cluster
/// `cluster`. Nodes verified for their current incarnation are preferred; only when fewer
/// than `needed` of them answered are nodes that restarted since (a marker naming an older
/// run_id) used too: after a restart of the whole cluster no node is current, and a restart
/// keeps what the AOF holds. A node restored from an old backup also shows an older run_id;
/// it is taken only in that fallback.
pub(super) fn choose_sources(
    census: &[Census],
    target: usize,
    cluster: &str,
    needed: usize,
) -> Vec<usize> {
    let target_run = census
        .iter()
        .find(|c| c.node == target)
        .map(|c| c.run_id.clone())
        .unwrap_or_default();
    let mut seen = HashSet::new();
    let (mut current, mut restarted) = (Vec::new(), Vec::new());
    for c in census {
        // Never the target itself, also not through a second URL to its server.
        if c.node == target || c.run_id == target_run || !seen.insert(c.run_id.clone()) {
            continue;
        }
        let Some(marker) = c.marker.as_deref() else {
            continue;
        };
        match cluster::parse_marker(marker) {
            (run, Some(cl)) if cl == cluster && run == c.run_id => current.push(c.node),
            (_, Some(cl)) if cl == cluster => restarted.push(c.node),
            _ => {}
        }
    }
    if current.len() < needed {
        current.extend(restarted);
    }
    current
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names() -> Vec<String> {
        vec!["a:1".into(), "b:1".into(), "c:1".into()]
    }

    fn census(node: usize, run: &str, marker: Option<&str>, has_state: bool) -> Census {
        Census {
            node,
            run_id: run.into(),
            marker: marker.map(String::from),
            marked: None,
            descriptor: None,
            has_state,
        }
    }

    fn quarantined(needs_listing: bool) -> Standing {
        Standing::Quarantined {
            reason: "no marker".into(),
            needs_listing,
        }
    }

    #[test]
    fn which_nodes_need_a_repair() {
        let d = Descriptor::new_cluster(&names());
        let adopted = Adoption::Adopted(d.clone());
        let repair = |n: Need| matches!(n, Need::Repair { .. });
        assert!(repair(need(
            &adopted,
            quarantined(false),
            Some("r"),
            "x:1",
            true
        )));
        assert_eq!(
            need(&adopted, Standing::Member, Some("r"), "a:1", true),
            Need::Done(RepairOutcome::NotNeeded)
        );
        assert!(matches!(
            need(
                &adopted,
                Standing::Stranger("other".into()),
                Some("r"),
                "a:1",
                true
            ),
            Need::Done(RepairOutcome::Deferred(_))
        ));
        assert!(
            matches!(
                need(&adopted, quarantined(true), Some("r"), "x:1", true),
                Need::Done(RepairOutcome::Deferred(why)) if why.contains("not one of the nodes")
            ),
            "an unlisted URL is never enlisted"
        );
        assert!(repair(need(
            &adopted,
            quarantined(true),
            Some("r"),
            "a:1",
            true
        )));
        assert!(
            repair(need(&adopted, quarantined(true), Some("r"), "x:1", false)),
            "test switch"
        );
        assert!(matches!(
            need(&adopted, quarantined(false), None, "a:1", true),
            Need::Done(RepairOutcome::Deferred(_))
        ));
        assert!(matches!(
            need(&Adoption::Refused("two lists".into()), quarantined(false), Some("r"), "a:1", true),
            Need::Done(RepairOutcome::Deferred(why)) if why == "two lists"
        ));
    }

    #[test]
    fn a_majority_of_marked_others_is_copied_from() {
        let d = Descriptor::new_cluster(&names());
        let (m0, m1) = (format!("r0/{}", d.id), format!("r1/{}", d.id));
        let census = [
            census(0, "r0", Some(&m0), true),
            census(1, "r1", Some(&m1), true),
            census(2, "r2", None, false),
        ];
        let plan = after_census(&Adoption::Adopted(d.clone()), &census, 2, 2, 3);
        assert_eq!(
            plan,
            Plan::Copy {
                sources: vec![0, 1],
                cluster: d
            }
        );
    }

    #[test]
    fn never_the_target_itself_and_each_server_once() {
        let d = Descriptor::new_cluster(&names());
        let m = |r: &str| format!("{r}/{}", d.id);
        let census = [
            census(0, "r0", Some(&m("r0")), true),
            census(1, "r0", Some(&m("r0")), true),
            census(2, "r2", Some(&m("r2")), true),
        ];
        assert_eq!(
            choose_sources(&census, 2, &d.id, 2),
            vec![0],
            "node 1 is node 0's server"
        );
        let plan = after_census(&Adoption::Adopted(d), &census, 2, 2, 3);
        assert!(matches!(plan, Plan::Wait(why) if why.starts_with("1 marked")));
    }

    #[test]
    fn restarted_sources_are_used_only_when_current_ones_are_too_few() {
        let d = Descriptor::new_cluster(&names());
        let m = |r: &str| format!("{r}/{}", d.id);
        let census = [
            census(0, "r0", Some(&m("r0")), true),
            census(1, "r1-new", Some(&m("r1-old")), true),
            census(2, "r2", None, false),
        ];
        assert_eq!(choose_sources(&census, 2, &d.id, 2), vec![0, 1]);
        assert_eq!(choose_sources(&census, 2, &d.id, 1), vec![0]);
    }

    #[test]
    fn a_repair_never_sets_a_cluster_up_and_names_cluster_init() {
        let blank = [
            census(0, "r0", None, false),
            census(1, "r1", None, false),
            census(2, "r2", None, false),
        ];
        let fresh = Descriptor::new_cluster(&names());
        for adoption in [Adoption::Unknown, Adoption::Adopted(fresh)] {
            assert!(
                matches!(
                    after_census(&adoption, &blank, 0, 2, 3),
                    Plan::Wait(why) if why.contains("cluster init")
                ),
                "blank nodes, adoption {adoption:?}: a repair must wait for cluster init"
            );
        }
    }

    #[test]
    fn cluster_init_marks_only_blank_nodes_that_all_answer() {
        let blank = [
            census(0, "r0", None, false),
            census(1, "r1", None, false),
            census(2, "r2", None, false),
        ];
        let fresh = Descriptor::new_cluster(&names());
        let unknown = Adoption::Unknown;
        let init = |adoption: &Adoption, census: &[Census], pin: Option<&str>| {
            set_up(adoption, census, 2, 3, &names(), pin)
        };
        assert_eq!(init(&unknown, &blank, None), SetUp::Mark(fresh.clone()));
        assert_eq!(
            init(&unknown, &blank, Some(&fresh.id)),
            SetUp::Mark(fresh.clone()),
            "pinned to this very cluster"
        );
        assert!(matches!(
            init(&unknown, &blank, Some("0123456789abcdef")),
            SetUp::Refuse(why) if why.contains("pinned")
        ));
        assert!(
            matches!(
                init(&unknown, &blank[..2], None),
                SetUp::Incomplete {
                    answered: 2,
                    nodes: 3
                }
            ),
            "every node must answer"
        );
        let mut with_state = blank.clone();
        with_state[1].has_state = true;
        assert!(matches!(
            init(&unknown, &with_state, None),
            SetUp::Refuse(why) if why.contains("FLUSHALL")
        ));
        let mut stranger = blank.clone();
        stranger[2].marker = Some("r2/0123456789abcdef".into());
        assert!(matches!(
            init(&unknown, &stranger, None),
            SetUp::Refuse(why) if why.contains("another cluster")
        ));
        // Half set up (one node marked): finished.
        let mut half = blank.clone();
        half[0].marker = Some(format!("r0/{}", fresh.id));
        let adopted = Adoption::Adopted(fresh.clone());
        assert_eq!(init(&adopted, &half, None), SetUp::Mark(fresh.clone()));
        // Set up: a majority marked, whatever answers.
        half[1].marker = Some(format!("r1/{}", fresh.id));
        assert_eq!(
            init(&adopted, &half[..2], None),
            SetUp::Exists(fresh.clone())
        );
        // A half set-up of another list of as many nodes is not finished by this list.
        let other = Descriptor::new_cluster(&["a:1".into(), "b:1".into(), "d:1".into()]);
        assert!(matches!(
            init(&Adoption::Adopted(other), &blank, None),
            SetUp::Refuse(why) if why.contains("cluster change")
        ));
        assert!(matches!(
            init(&Adoption::Refused("two lists".into()), &blank, None),
            SetUp::Refuse(why) if why == "two lists"
        ));
    }
}
