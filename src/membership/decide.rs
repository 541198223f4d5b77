//! Pure decisions of peer indexing: a member's assignment from the view it adopted, when it
//! drains, what the leader seals next, which acknowledgements count, which member IDs run in
//! two processes. Time comes in as parameters; no I/O, no clock.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use super::assign::{self, parse_int, ListRef, Ownership, View, ViewState, ViewVersion};
use super::assignment::Assignment;
use super::tables::Held;
use crate::clock::{Instant, Stamp};

/// How many members of a view, by index, are deputies (see [`Role::Deputy`]).
pub(super) const DEPUTIES: u32 = 2;

/// A member's part in its group's rhythm, which sets how often it reads the view and what the
/// read carries (`register::Extras`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Role {
    /// It holds the leader lease: it reads the view and the beats twice an interval to judge
    /// the members (and at once when one that stopped beating could be judged gone).
    Leader,
    /// One of the first [`DEPUTIES`] members of its view by index: it reads the view, the
    /// beats and the leader lease twice an interval, so that it takes a crashed leader's lease
    /// over within about a lease time and, as the new leader, judges the old one gone from a
    /// warm watch.
    Deputy,
    /// Any other member: it reads the view, with the leader lease, once per beat.
    Member,
}

/// The role of a member whose adopted view gives it `index` (`None`: not in the view). A member the view does not name yet is a deputy: in a new group, or a group whose
/// every process was restarted (the view names only dead keys), the first to try leads, from a
/// warm watch of the beats; a joiner of a running group is one only until the next view.
pub(super) fn role(leading: bool, index: Option<u32>) -> Role {
    match (leading, index) {
        (true, _) => Role::Leader,
        (false, Some(i)) if i < DEPUTIES => Role::Deputy,
        (false, None) => Role::Deputy,
        _ => Role::Member,
    }
}

/// How long a member's loop sleeps before its next view read, at most (a beat, the leader's
/// hint of a new view, the end of its assignment's validity, or, for a leader, the instant a
/// silent member can be judged gone, wake it sooner). An eighth of an interval while something
/// is moving (the view is prepared, it drains, a leader sealed in this round, or it does not
/// hear the leader's hints on a majority of nodes), so a prepared view is drained and
/// acknowledged, and an acknowledged one activated, within a fraction of an interval. When all
/// is settled, every beat wakes it (an assignment's validity comes only from a beat sent before
/// a view read), so a member reads once per beat (the tick, two intervals, only backs the beats
/// up), and a leader or a deputy twice: half an interval after a round a beat woke
/// (`after_beat`), and at the next beat after that.
pub(super) fn member_tick(
    interval: Duration,
    role: Role,
    busy: bool,
    after_beat: bool,
) -> Duration {
    match (busy, role) {
        (true, _) => interval / 8,
        (false, Role::Leader | Role::Deputy) if after_beat => interval / 2,
        (false, Role::Leader | Role::Deputy) => interval,
        (false, Role::Member) => interval * 2,
    }
}

/// When a contender for the leader lease next tries (see `group/campaign.rs`): at the instant
/// its watch, fed by its view reads, says the lease could be won (`ready`; for a lease that is
/// winnable now, when it first saw it so), plus a slack: a thirty-second of an interval for a
/// deputy, whose reads every half interval show a live leader's extensions; three quarters for
/// any other member, which reads once per beat, so that a deputy (with its warm watch of the
/// beats) takes a crashed leader's lease first and the others stand by; and no later than
/// three intervals after a view read last carried the lease (`seen`; then the try reads the
/// lease itself).
pub(super) fn campaign_wake(
    ready: Instant,
    deputy: bool,
    seen: Option<Instant>,
    now: Instant,
    interval: Duration,
) -> Instant {
    let slack = if deputy {
        interval / 32
    } else {
        interval * 3 / 4
    };
    let fallback = seen.unwrap_or(now) + interval * 3;
    (ready + slack).min(fallback)
}

/// The assignment a member with key `key` holds under `view`, given the validity of its last
/// beat a majority applied (snapshotted BEFORE the view was read) and whether that validity
/// is still running: an index in an active view, or in a prepared view it drains from. A pool
/// member passes the units it loaded for the view (`held`): under an active view it owns the
/// view's list, under a prepared one only the units both lists give it.
pub(super) fn assignment(
    view: &View,
    key: &Arc<str>,
    beat_until: Option<Stamp>,
    beat_valid: bool,
    ownership: Ownership,
    held: Option<&Held>,
) -> Option<Assignment> {
    let index = view.index_of(key)?;
    let until = beat_until.filter(|_| beat_valid)?;
    let token = view.version.token()?;
    let state = view.state;
    if state != ViewState::Active && !view.draining.contains(&**key) {
        return None;
    }
    Some(Assignment {
        index,
        replicas: view.replicas(),
        version: view.version,
        token,
        state,
        until,
        view: Arc::new(view.clone()),
        previous: (state == ViewState::Prepare).then(|| Arc::new(view.previous_view())),
        member: key.clone(),
        ownership,
        units: held.map(|h| match state {
            ViewState::Active => h.current.clone(),
            ViewState::Prepare => Arc::new(h.current.intersection(&h.previous).cloned().collect()),
        }),
    })
}

/// Whether a member must start draining: `view` is a prepared view it drains from, not yet
/// acknowledged and not already draining.
pub(super) fn starts_drain(
    view: &View,
    key: &str,
    acked: Option<ViewVersion>,
    draining: Option<ViewVersion>,
) -> bool {
    view.state == ViewState::Prepare
        && view.draining.contains(key)
        && acked != Some(view.version)
        && draining != Some(view.version)
}

/// Whether two published assignments are the same for a watcher (no change to publish).
pub(super) fn same_assignment(a: Option<&Assignment>, b: Option<&Assignment>) -> bool {
    match (a, b) {
        (None, None) => true,
        (Some(a), Some(b)) => a.version == b.version && a.index == b.index && a.until == b.until,
        _ => false,
    }
}

/// What the leader seals next from the view it adopted, the live and gone members it judged,
/// (for a prepared view) the acknowledgements, and (for a pool) the unit lists its planner
/// proposes: `None` when nothing changes. A prepared view is activated once every member of
/// the last active view acknowledged it or is gone; a membership change while draining
/// prepares the next view (new lists alone wait for the activation). Without the barrier (a test-only switch) a prepared
/// view is activated at once.
pub(super) fn leader_decision(
    view: &View,
    live: &BTreeSet<String>,
    gone: &BTreeSet<String>,
    acks: &BTreeSet<String>,
    term: u64,
    barrier: bool,
    lists: Option<&BTreeMap<String, ListRef>>,
) -> Option<View> {
    let members: BTreeSet<String> = view.members.keys().cloned().collect();
    let same_members = *live == members;
    let same = same_members && lists.is_none_or(|l| *l == view.lists);
    let next = || {
        let next = view.next(live, term);
        match lists {
            Some(l) => next.with_lists(l.clone()),
            None => next,
        }
    };
    match view.state {
        ViewState::Prepare if assign::transition_ready(view, acks, gone) => {
            Some(view.activated(term))
        }
        // While a view drains, only a membership change re-prepares: new lists alone wait for
        // the activation, so a stream of unit changes cannot starve the barrier.
        ViewState::Prepare if !same_members => Some(next()),
        ViewState::Prepare => None,
        ViewState::Active if same => None,
        ViewState::Active if barrier => Some(next()),
        ViewState::Active => Some(next().activated(term)),
    }
}

/// The suffix of an acknowledgement's companion field, `<member>#h` = `<token>:<view digest>`.
pub(super) const ACK_DIGEST: &str = "#h";

/// Members whose acknowledgement (field `member` = token) covers the prepared view `token`
/// with content `digest`: a token above it, or this token with no digest recorded or the same
/// digest. An acknowledgement of this very token for other content is not counted (a fork
/// would show there; it cannot happen while one version names one view).
pub(crate) fn acked_members(
    acks: &HashMap<String, String>,
    token: u64,
    digest: &str,
) -> BTreeSet<String> {
    acks.iter()
        .filter(|(m, _)| !m.ends_with(ACK_DIGEST))
        .filter_map(|(m, t)| Some((m, parse_int(t)?)))
        .filter(|(m, t)| {
            *t > token
                || (*t == token
                    && acks
                        .get(&format!("{m}{ACK_DIGEST}"))
                        .and_then(|d| d.split_once(':'))
                        .is_none_or(|(dt, d)| dt != t.to_string() || d == digest))
        })
        .map(|(m, _)| m.clone())
        .collect()
}

/// The live member keys (`<id>#<nonce>`) that share a member ID with another live key: two
/// processes joined with one ID.
pub(super) fn duplicate_keys(live: &BTreeSet<String>) -> Vec<String> {
    let mut by_id: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for key in live {
        let id = key.rsplit_once('#').map_or(key.as_str(), |(id, _)| id);
        by_id.entry(id).or_default().push(key);
    }
    by_id
        .values()
        .filter(|k| k.len() > 1)
        .flat_map(|k| k.iter().map(|s| s.to_string()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(keys: &[&str]) -> BTreeSet<String> {
        keys.iter().map(|s| s.to_string()).collect()
    }

    fn active(members: &[&str], term: u64) -> View {
        View::empty().next(&set(members), term).activated(term)
    }

    #[test]
    fn the_leader_keeps_a_view_whose_members_are_live() {
        let v = active(&["a#1", "b#1"], 1);
        let none = set(&[]);
        assert_eq!(
            leader_decision(&v, &set(&["a#1", "b#1"]), &none, &none, 1, true, None),
            None
        );
    }

    #[test]
    fn a_membership_change_prepares_a_view_that_drains_the_old_members() {
        let v = active(&["a#1", "b#1"], 1);
        let none = set(&[]);
        let next = leader_decision(
            &v,
            &set(&["a#1", "b#1", "c#1"]),
            &none,
            &none,
            1,
            true,
            None,
        )
        .expect("a new view");
        assert_eq!(next.state, ViewState::Prepare);
        assert!(next.version > v.version);
        assert!(next.draining.contains("a#1") && next.draining.contains("b#1"));
        let unsafe_next = leader_decision(
            &v,
            &set(&["a#1", "b#1", "c#1"]),
            &none,
            &none,
            1,
            false,
            None,
        )
        .expect("a new view");
        assert_eq!(
            unsafe_next.state,
            ViewState::Active,
            "without the barrier (test-only) it is active at once"
        );
    }

    #[test]
    fn a_prepared_view_is_activated_only_when_every_old_member_acked_or_is_gone() {
        let v = active(&["a#1", "b#1"], 1);
        let none = set(&[]);
        let live = set(&["a#1", "b#1", "c#1"]);
        let prepared = leader_decision(&v, &live, &none, &none, 1, true, None).expect("prepared");
        assert_eq!(
            leader_decision(&prepared, &live, &none, &set(&["a#1"]), 1, true, None),
            None,
            "b has neither acknowledged nor gone"
        );
        let activated = leader_decision(
            &prepared,
            &live,
            &none,
            &set(&["a#1", "b#1"]),
            1,
            true,
            None,
        )
        .expect("activated");
        assert_eq!(activated.state, ViewState::Active);
        let b_gone = leader_decision(
            &prepared,
            &set(&["a#1", "c#1"]),
            &set(&["b#1"]),
            &set(&["a#1"]),
            1,
            true,
            None,
        )
        .expect("activated");
        assert_eq!(
            b_gone.state,
            ViewState::Active,
            "a gone member needs no ack"
        );
        let changed_again = leader_decision(&prepared, &set(&["a#1"]), &none, &none, 1, true, None)
            .expect("re-prepared");
        assert_eq!(changed_again.state, ViewState::Prepare);
        assert!(changed_again.version > prepared.version);
    }

    fn list(key: &str, field: &str) -> ListRef {
        ListRef {
            key: Some(key.into()),
            field: field.into(),
            count: 1,
            digest: "0".into(),
            chain: 0,
            weight: 1,
        }
    }

    #[test]
    fn new_unit_lists_prepare_a_view_even_when_membership_stands() {
        let none = set(&[]);
        let live = set(&["a#1", "b#1"]);
        let lists: BTreeMap<String, ListRef> = [("a".to_string(), list("a#1", "5.x"))].into();
        let v = active(&["a#1", "b#1"], 1).with_lists(lists.clone());
        assert_eq!(
            leader_decision(&v, &live, &none, &none, 1, true, Some(&lists)),
            None,
            "the same lists: nothing to seal"
        );
        let moved: BTreeMap<String, ListRef> = [("b".to_string(), list("b#1", "6.y"))].into();
        let next = leader_decision(&v, &live, &none, &none, 1, true, Some(&moved)).expect("new");
        assert_eq!(next.state, ViewState::Prepare);
        assert_eq!(next.lists, moved);
        assert_eq!(
            next.previous_lists, lists,
            "the last active view's lists drain"
        );
        let other: BTreeMap<String, ListRef> = [("a".to_string(), list("a#1", "7.z"))].into();
        assert_eq!(
            leader_decision(&next, &live, &none, &none, 1, true, Some(&other)),
            None,
            "while draining, new lists alone wait for the activation"
        );
        let active = next.activated(1);
        assert_eq!(active.lists, moved);
        assert!(active.previous_lists.is_empty());
    }

    #[test]
    fn under_a_prepared_view_a_pool_member_owns_only_units_both_lists_give_it() {
        let key: Arc<str> = "a#1".into();
        let v = active(&["a#1"], 1);
        let prepared = v.next(&set(&["a#1", "b#1"]), 1);
        let units = |u: &[&str]| Arc::new(u.iter().map(|s| s.to_string()).collect());
        let held = Held {
            current: units(&["x", "y"]),
            previous: units(&["y", "z"]),
        };
        let until = Some(Stamp::now());
        let a = assignment(&prepared, &key, until, true, Ownership::Modulo, Some(&held))
            .expect("draining");
        assert_eq!(a.units().map(|u| u.len()), Some(1));
        assert!(a.covers_unit("y") && !a.covers_unit("x") && !a.covers_unit("z"));
        let act = assignment(&v, &key, until, true, Ownership::Modulo, Some(&held)).expect("on");
        assert!(act.covers_unit("x") && act.covers_unit("y") && !act.covers_unit("z"));
    }

    #[test]
    fn an_assignment_needs_a_valid_beat_and_a_place_in_the_view() {
        let key: Arc<str> = "a#1".into();
        let v = active(&["a#1", "b#1"], 1);
        let until = Some(Stamp::now());
        let a = assignment(&v, &key, until, true, Ownership::Modulo, None).expect("assigned");
        assert_eq!((a.replicas, a.state), (2, ViewState::Active));
        assert!(
            assignment(&v, &key, until, false, Ownership::Modulo, None).is_none(),
            "lease over"
        );
        assert!(
            assignment(&v, &key, None, true, Ownership::Modulo, None).is_none(),
            "never beat"
        );
        let stranger: Arc<str> = "z#9".into();
        assert!(assignment(&v, &stranger, until, true, Ownership::Modulo, None).is_none());
    }

    #[test]
    fn under_a_prepared_view_only_draining_members_hold_anything() {
        let v = active(&["a#1"], 1);
        let prepared = v.next(&set(&["a#1", "c#1"]), 1);
        let (a, c): (Arc<str>, Arc<str>) = ("a#1".into(), "c#1".into());
        let until = Some(Stamp::now());
        let held =
            assignment(&prepared, &a, until, true, Ownership::Modulo, None).expect("draining");
        assert_eq!(held.state, ViewState::Prepare);
        assert!(
            assignment(&prepared, &c, until, true, Ownership::Modulo, None).is_none(),
            "a joining member owns nothing before activation"
        );
        assert!(starts_drain(&prepared, "a#1", None, None));
        assert!(
            !starts_drain(&prepared, "a#1", Some(prepared.version), None),
            "acked"
        );
        assert!(
            !starts_drain(&prepared, "a#1", None, Some(prepared.version)),
            "draining"
        );
        assert!(
            !starts_drain(&prepared, "c#1", None, None),
            "nothing to drain"
        );
    }

    #[test]
    fn acknowledgements_count_for_this_token_and_content_or_later() {
        let acks: HashMap<String, String> = [
            ("a#1", "7"),
            ("b#1", "8"),
            ("c#1", "6"),
            ("d#1", "7"),
            ("d#1#h", "7:other"),
            ("e#1", "7"),
            ("e#1#h", "7:same"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        assert_eq!(acked_members(&acks, 7, "same"), set(&["a#1", "b#1", "e#1"]));
    }

    #[test]
    fn two_live_processes_with_one_id_are_reported() {
        assert_eq!(
            duplicate_keys(&set(&["a#1", "a#2", "b#1"])),
            vec!["a#1".to_string(), "a#2".to_string()]
        );
        assert!(duplicate_keys(&set(&["a#1", "b#1"])).is_empty());
    }

    #[test]
    fn a_settled_member_reads_once_per_beat_and_a_leader_or_deputy_twice_an_interval() {
        let interval = Duration::from_millis(800);
        for role in [Role::Leader, Role::Deputy, Role::Member] {
            for after_beat in [false, true] {
                assert_eq!(
                    member_tick(interval, role, true, after_beat),
                    Duration::from_millis(100)
                );
            }
        }
        for role in [Role::Leader, Role::Deputy] {
            assert_eq!(
                member_tick(interval, role, false, true),
                Duration::from_millis(400),
                "half an interval after a beat's read"
            );
            assert_eq!(
                member_tick(interval, role, false, false),
                interval,
                "then the next beat's"
            );
        }
        for after_beat in [false, true] {
            assert_eq!(
                member_tick(interval, Role::Member, false, after_beat),
                Duration::from_millis(1600),
                "longer than a beat: the beats pace a settled member's reads"
            );
        }
    }

    #[test]
    fn the_first_members_by_index_are_deputies_unless_they_lead() {
        assert_eq!(role(true, Some(0)), Role::Leader);
        assert_eq!(role(true, None), Role::Leader);
        assert_eq!(role(false, Some(0)), Role::Deputy);
        assert_eq!(role(false, Some(DEPUTIES - 1)), Role::Deputy);
        assert_eq!(role(false, Some(DEPUTIES)), Role::Member);
        assert_eq!(
            role(false, None),
            Role::Deputy,
            "a joiner, until a view names it"
        );
    }

    #[test]
    fn a_contender_tries_after_a_slack_and_reads_for_itself_when_no_view_read_came() {
        let interval = Duration::from_millis(800);
        let now = Instant::now();
        let ready = now + Duration::from_millis(500);
        let seen = Some(now);
        assert_eq!(
            campaign_wake(ready, true, seen, now, interval),
            ready + Duration::from_millis(25)
        );
        assert_eq!(
            campaign_wake(ready, false, seen, now, interval),
            ready + Duration::from_millis(600)
        );
        let late = now + Duration::from_secs(10);
        assert_eq!(
            campaign_wake(late, false, seen, now, interval),
            now + Duration::from_millis(2400)
        );
    }
}
