//! Work distribution against real nodes: pool members join, leave, crash and freeze while
//! units are added and removed and a minority of Redis nodes fails. A checker over every
//! member's recorded ownership verifies: no unit with two owners at any instant (I1); every
//! unit owned exactly once once membership and units are stable (I2); each change active
//! within two intervals (I3, with one interval of slack on a loaded CI machine); loads within
//! one unit of the weighted share; movement within one unit of the minimum. The same run with
//! the hand-over barrier switched off shows a double owner.

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

mod common;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{client, init_tracing, ms};
use redquorum::{pool_table, Assignment, Drain, DrainHook, PoolMember, PoolOptions, Units};
use redquorum_testkit::checker::{self, OwnerViolation, OwnershipInterval};
use redquorum_testkit::Cluster;
use tokio::time::Instant;

const INTERVAL: Duration = Duration::from_millis(500);
const I3_BOUND: Duration = Duration::from_millis(1500);
/// A crash is seen after the member's lease (1.25 intervals) plus drift, unchanged on a
/// majority of the nodes the leader read (every node that answers about as fast as the first
/// majority, so a restarted node's young watch does not hold the judgement up); prepare,
/// acknowledgement and activation add a few ticks. Measured 1.0-2.1 intervals alone and up to
/// 3.1 with another real-node test running on the same two cores: asserted at 2 intervals with
/// 2 of slack, the figure printed.
const CRASH_BOUND: Duration = Duration::from_millis(2000);
const POOL: &str = "sites";

type History = Vec<(Instant, Option<Assignment>)>;

fn site(i: usize) -> String {
    format!("site-{i:03}")
}

/// Ownership intervals of every member's history, per unit (indexed in `index`).
fn ownership(
    histories: &[(String, History)],
    end: Instant,
    index: &BTreeMap<String, u64>,
) -> Vec<OwnershipInterval> {
    let mut out = Vec::new();
    for (member, history) in histories {
        for (i, (at, a)) in history.iter().enumerate() {
            let Some(a) = a else { continue };
            let next = history.get(i + 1).map(|(t, _)| *t).unwrap_or(end);
            let until = next.min(a.valid_until());
            if *at >= until {
                continue;
            }
            for unit in a.units().into_iter().flatten() {
                out.push(OwnershipInterval {
                    owner: member.clone(),
                    unit: index.get(unit).copied().unwrap_or(u64::MAX),
                    detail: format!("{unit}, view {:?} {:?}", a.version, a.state),
                    start: *at,
                    end: until,
                });
            }
        }
    }
    out
}

/// Who owns what now, from every member's current assignment (a unit two members claim at
/// this instant is left out: the checker reports those from the full histories).
fn owners(members: &[&PoolMember]) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut twice = BTreeSet::new();
    for m in members {
        for u in m.units() {
            if out.insert(u.clone(), m.id().to_string()).is_some() {
                twice.insert(u);
            }
        }
    }
    out.retain(|u, _| !twice.contains(u));
    out
}

/// Wait until every member holds an active assignment of one version and, together, they own
/// exactly `units`; returns how long it took.
async fn until_settled(
    members: &[&PoolMember],
    units: &BTreeSet<String>,
    limit: Duration,
) -> Duration {
    let start = Instant::now();
    loop {
        let a: Vec<Option<Assignment>> = members.iter().map(|m| m.assignment()).collect();
        let versions: BTreeSet<_> = a.iter().map(|x| x.as_ref().map(|x| x.version)).collect();
        let all_active = a.iter().all(|x| {
            x.as_ref()
                .is_some_and(|x| x.state == redquorum::ViewState::Active)
        });
        if versions.len() == 1 && all_active {
            let owned: BTreeSet<String> = owners(members).into_keys().collect();
            if owned == *units {
                return start.elapsed();
            }
        }
        tracing::debug!(?versions, all_active, owned = owners(members).len(), per_member = ?members.iter().map(|m| (m.id().to_string(), m.units().len())).collect::<Vec<_>>(), "test: not settled yet");
        assert!(
            start.elapsed() < limit,
            "not settled after {}: versions {versions:?}, {} units owned of {}",
            ms(limit),
            owners(members).len(),
            units.len()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Loads within one unit of each member's weighted share.
fn assert_balanced(members: &[(&PoolMember, u32)], units: usize) {
    let total: u32 = members.iter().map(|(_, w)| *w).sum();
    for (m, w) in members {
        let share = units as f64 * f64::from(*w) / f64::from(total);
        let load = m.units().len() as f64;
        assert!(
            (load - share).abs() < 1.0 + 1e-9,
            "member {} (weight {w}) holds {load} units, its share is {share:.2}",
            m.id()
        );
    }
}

/// How many units changed owner between two tables.
fn moved(before: &BTreeMap<String, String>, after: &BTreeMap<String, String>) -> usize {
    after
        .iter()
        .filter(|(u, m)| before.get(*u).is_some_and(|b| b != *m))
        .count()
}

async fn join(urls: &[String], id: &str, opts: PoolOptions) -> PoolMember {
    PoolMember::join(&client(urls).await, POOL, id, opts)
        .await
        .expect("join")
}

struct Run {
    verdict: Result<(), OwnerViolation>,
    notes: Vec<String>,
}

async fn scenario(barrier: bool) -> Run {
    let cluster = Cluster::start(3).await;
    let urls = cluster.urls();
    let units = Units::new(&client(&urls).await, POOL).expect("pool name");
    let mut expected: BTreeSet<String> = (0..120).map(site).collect();
    units
        .add(&expected.iter().cloned().collect::<Vec<_>>())
        .await
        .expect("units added");
    let index: BTreeMap<String, u64> = (0..200).map(|i| (site(i), i as u64)).collect();

    let drains = Arc::new(AtomicUsize::new(0));
    let hook: DrainHook = {
        let drains = drains.clone();
        Arc::new(move |d: Drain| {
            if !d.units_given_up().is_empty() {
                drains.fetch_add(1, Ordering::SeqCst);
            }
            Box::pin(async {})
        })
    };
    let opts = |i: u32, weight: u32| {
        let o = PoolOptions::default()
            .with_interval(INTERVAL)
            .with_weight(weight)
            .with_drain(Duration::from_millis(200), hook.clone())
            .with_skew_for_tests(INTERVAL / 4 * (i % 5) / 4)
            .record_history_for_tests();
        if barrier {
            o
        } else {
            o.without_barrier_for_tests()
        }
    };
    let mut notes = Vec::new();
    let mut members = vec![join(&urls, "m0", opts(0, 2)).await];
    for i in 1..4 {
        members.push(join(&urls, &format!("m{i}"), opts(i, 1)).await);
    }
    let t = until_settled(
        &members.iter().collect::<Vec<_>>(),
        &expected,
        INTERVAL * 12,
    )
    .await;
    notes.push(format!(
        "4 members (weights 2,1,1,1) active after {}",
        ms(t)
    ));
    if barrier {
        let weighted: Vec<(&PoolMember, u32)> = members.iter().zip([2, 1, 1, 1]).collect();
        assert_balanced(&weighted, expected.len());
    }
    let mut before = owners(&members.iter().collect::<Vec<_>>());
    let mut weights = vec![2u32, 1, 1, 1];

    // A minority of Redis nodes fails for the next changes.
    cluster.node(2).kill().await;

    // A join: active within two intervals, moving only the newcomer's share.
    let t0 = Instant::now();
    members.push(join(&urls, "m4", opts(4, 1)).await);
    weights.push(1);
    until_settled(
        &members.iter().collect::<Vec<_>>(),
        &expected,
        INTERVAL * 12,
    )
    .await;
    let join_t = t0.elapsed();
    let after = owners(&members.iter().collect::<Vec<_>>());
    let newcomer = members[4].units().len();
    notes.push(format!(
        "join active after {} ({:.2} intervals), {} units moved (minimum {newcomer})",
        ms(join_t),
        join_t.as_secs_f64() / INTERVAL.as_secs_f64(),
        moved(&before, &after)
    ));
    if barrier {
        assert!(
            join_t <= I3_BOUND,
            "a join must be active within 2 intervals (+1 slack): {}",
            ms(join_t)
        );
        assert!(
            moved(&before, &after) <= newcomer + 1,
            "a join moves at most the newcomer's share plus one: {} moved, newcomer holds {newcomer}",
            moved(&before, &after)
        );
    }
    before = after;

    // Units change: ten added, five removed (none of the removed is owned afterwards).
    let added: Vec<String> = (120..130).map(site).collect();
    let removed: Vec<String> = (0..5).map(site).collect();
    units.add(&added).await.expect("added");
    units.remove(&removed).await.expect("removed");
    expected.extend(added.iter().cloned());
    for r in &removed {
        expected.remove(r);
    }
    let t0 = Instant::now();
    until_settled(
        &members.iter().collect::<Vec<_>>(),
        &expected,
        INTERVAL * 12,
    )
    .await;
    let after = owners(&members.iter().collect::<Vec<_>>());
    let others = moved(&before, &after);
    notes.push(format!(
        "10 units added and 5 removed: active after {}, {others} other units moved",
        ms(t0.elapsed())
    ));
    if barrier {
        assert!(
            others <= 5,
            "adding and removing units moves almost no other unit: {others} moved"
        );
    }

    // An operator pins two units to m0 and drains m2: m2 stays a member (an active
    // assignment with no unit) and its units move through the barrier; then the drain ends.
    let pinned = [site(10), site(11)];
    for u in &pinned {
        units.pin(u, "m0").await.expect("pinned");
    }
    units.drain("m2", true).await.expect("drained");
    let t0 = Instant::now();
    until_settled(
        &members.iter().collect::<Vec<_>>(),
        &expected,
        INTERVAL * 12,
    )
    .await;
    let limit = Instant::now() + INTERVAL * 12;
    while !(members[2].units().is_empty() && pinned.iter().all(|u| members[0].owns(u))) {
        assert!(
            Instant::now() < limit,
            "m2 still holds {:?} after its drain, or m0 lacks its pins",
            members[2].units()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    until_settled(
        &members.iter().collect::<Vec<_>>(),
        &expected,
        INTERVAL * 12,
    )
    .await;
    notes.push(format!("drain active after {}", ms(t0.elapsed())));
    assert!(
        members[2]
            .assignment()
            .is_some_and(|a| a.state == redquorum::ViewState::Active),
        "a drained member stays a member"
    );
    units.drain("m2", false).await.expect("drain ended");
    units.unpin(&pinned).await.expect("unpinned");
    let limit = Instant::now() + INTERVAL * 12;
    while members[2].units().is_empty() {
        assert!(
            Instant::now() < limit,
            "m2 never got units back after its drain ended"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    until_settled(
        &members.iter().collect::<Vec<_>>(),
        &expected,
        INTERVAL * 12,
    )
    .await;

    // A graceful leave, then the failed node comes back.
    let t0 = Instant::now();
    let leaving = members.remove(1);
    weights.remove(1);
    let left = (
        "m1".to_string(),
        leaving.leave_with_history_for_tests().await,
    );
    until_settled(
        &members.iter().collect::<Vec<_>>(),
        &expected,
        INTERVAL * 12,
    )
    .await;
    notes.push(format!("leave active after {}", ms(t0.elapsed())));
    cluster.node(2).restart().await;

    // A crash of a member that does not lead (its lease must expire before its units move).
    let t0 = Instant::now();
    let victim = (1..members.len())
        .find(|i| !members[*i].is_leader())
        .expect("a member that does not lead");
    let crashed = members.remove(victim);
    weights.remove(victim);
    let crashed_history = (crashed.id().to_string(), crashed.history_for_tests());
    tracing::info!(member = crashed.id(), "test: crashing a member");
    crashed.crash_for_tests();
    until_settled(
        &members.iter().collect::<Vec<_>>(),
        &expected,
        INTERVAL * 12,
    )
    .await;
    let crash_t = t0.elapsed();
    notes.push(format!(
        "crash active after {} ({:.2} intervals)",
        ms(crash_t),
        crash_t.as_secs_f64() / INTERVAL.as_secs_f64()
    ));
    if barrier {
        assert!(
            crash_t <= CRASH_BOUND,
            "after a crash the new table must be active within 2 intervals (+2 slack): {}",
            ms(crash_t)
        );
    }

    // The leader crashes: another member takes the leader lease over (after watching it
    // unchanged for its TTL, one interval, plus drift), then judges the crashed member gone.
    let t0 = Instant::now();
    let leader = members
        .iter()
        .position(|m| m.is_leader())
        .expect("a leader");
    let crashed_leader = members.remove(leader);
    weights.remove(leader);
    let leader_history = (
        format!("{} (leader)", crashed_leader.id()),
        crashed_leader.history_for_tests(),
    );
    crashed_leader.crash_for_tests();
    until_settled(
        &members.iter().collect::<Vec<_>>(),
        &expected,
        INTERVAL * 12,
    )
    .await;
    let leader_t = t0.elapsed();
    notes.push(format!(
        "leader crash active after {} ({:.2} intervals)",
        ms(leader_t),
        leader_t.as_secs_f64() / INTERVAL.as_secs_f64()
    ));
    if barrier {
        assert!(
            leader_t <= CRASH_BOUND,
            "after the leader's crash the new table must be active within 2 intervals (+2 slack): {}",
            ms(leader_t)
        );
    }

    // A member freezes past its lease, then resumes; a Redis node loses its data.
    members[1].freeze_for_tests(INTERVAL * 3);
    tokio::time::sleep(INTERVAL * 4).await;
    cluster.node(1).wipe_and_restart().await;

    // Two more joins, then stable: every unit owned exactly once, balanced.
    members.push(join(&urls, "m5", opts(5, 1)).await);
    members.push(join(&urls, "m6", opts(6, 3)).await);
    members.push(join(&urls, "m7", opts(7, 1)).await);
    weights.extend([1, 3, 1]);
    until_settled(
        &members.iter().collect::<Vec<_>>(),
        &expected,
        INTERVAL * 16,
    )
    .await;
    tokio::time::sleep(INTERVAL).await;
    until_settled(
        &members.iter().collect::<Vec<_>>(),
        &expected,
        INTERVAL * 12,
    )
    .await;
    if barrier {
        let weighted: Vec<(&PoolMember, u32)> =
            members.iter().zip(weights.iter().copied()).collect();
        assert_balanced(&weighted, expected.len());
        assert!(
            drains.load(Ordering::SeqCst) > 0,
            "members drained through the hook"
        );
        // The reader's view of the table agrees with the members'.
        let table = pool_table(&client(&urls).await, POOL).await.expect("table");
        let listed: BTreeMap<String, String> = table
            .members
            .iter()
            .flat_map(|(m, us)| us.iter().map(move |u| (u.clone(), m.clone())))
            .collect();
        assert_eq!(listed, owners(&members.iter().collect::<Vec<_>>()));
    }
    let end = Instant::now();
    let mut histories: Vec<(String, History)> = members
        .iter()
        .map(|m| (m.id().to_string(), m.history_for_tests()))
        .collect();
    histories.push(left);
    histories.push(crashed_history);
    histories.push(leader_history);
    let verdict = checker::check_single_owner(&ownership(&histories, end, &index));
    for m in members {
        m.leave().await;
    }
    Run { verdict, notes }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn joins_leaves_crashes_and_unit_changes_never_give_a_unit_two_owners() {
    init_tracing();
    let run = scenario(true).await;
    for n in &run.notes {
        println!("{n}");
    }
    run.verdict
        .unwrap_or_else(|e| panic!("checker (I1, no unit with two owners): {e}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_hand_over_barrier_the_checker_finds_a_double_owner() {
    init_tracing();
    let run = scenario(false).await;
    for n in &run.notes {
        println!("{n}");
    }
    let e = run
        .verdict
        .expect_err("without the barrier a moved unit must have two owners at some instant");
    println!("as expected without the barrier: {e}");
}

/// One consistent snapshot of a pool: every member active under one version, every unit owned
/// exactly once. Member ID -> its units.
type Snapshot = BTreeMap<String, Arc<BTreeSet<String>>>;

/// Wait (up to `limit`) for a snapshot in which the members together own exactly `units`,
/// each exactly once, all active under one version; returns it and how long it took.
async fn snapshot(
    members: &[PoolMember],
    units: &BTreeSet<String>,
    limit: Duration,
) -> (Snapshot, Duration) {
    let start = Instant::now();
    loop {
        let a: Vec<Option<Assignment>> = members.iter().map(|m| m.assignment()).collect();
        let versions: BTreeSet<_> = a.iter().map(|x| x.as_ref().map(|x| x.version)).collect();
        // Cheap checks first (sizes); the sets are copied only for a candidate snapshot.
        let sizes: Option<usize> = a
            .iter()
            .map(|x| {
                let x = x
                    .as_ref()
                    .filter(|x| x.state == redquorum::ViewState::Active)?;
                Some(x.units()?.len())
            })
            .sum();
        let held: Option<Snapshot> = (versions.len() == 1 && sizes == Some(units.len()))
            .then(|| {
                members
                    .iter()
                    .zip(&a)
                    .map(|(m, x)| {
                        let units = x.as_ref()?.units()?.clone();
                        Some((m.id().to_string(), Arc::new(units)))
                    })
                    .collect::<Option<Snapshot>>()
            })
            .flatten();
        if let (1, Some(held)) = (versions.len(), held) {
            let total: usize = held.values().map(|u| u.len()).sum();
            if total == units.len() {
                let union: BTreeSet<&String> = held.values().flat_map(|u| u.iter()).collect();
                if union.len() == units.len() && union.into_iter().eq(units.iter()) {
                    return (held, start.elapsed());
                }
            }
        }
        assert!(
            start.elapsed() < limit,
            "a pool of {} units did not settle in {}: versions {versions:?}",
            units.len(),
            ms(limit)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Each member's load within one unit of its weighted share, in a snapshot.
fn assert_snapshot_balanced(snap: &Snapshot, weights: &BTreeMap<&str, u32>) {
    let units: usize = snap.values().map(|u| u.len()).sum();
    let total: u32 = weights.values().sum();
    for (id, held) in snap {
        let w = weights[id.as_str()];
        let share = units as f64 * f64::from(w) / f64::from(total);
        assert!(
            (held.len() as f64 - share).abs() < 1.0 + 1e-9,
            "member {id} (weight {w}) holds {} units, its share is {share:.2}",
            held.len()
        );
    }
}

/// Units that changed owner between two snapshots (units in both).
fn moved_between(before: &Snapshot, after: &Snapshot) -> usize {
    let owner: HashMap<&String, &String> = before
        .iter()
        .flat_map(|(id, us)| us.iter().map(move |u| (u, id)))
        .collect();
    after
        .iter()
        .flat_map(|(id, us)| us.iter().map(move |u| (u, id)))
        .filter(|(u, id)| owner.get(u).is_some_and(|b| b != id))
        .count()
}

/// A pool of 100,000 units on real nodes: four members (weights 2,1,1,1) share it by weight, a
/// fifth joins and takes exactly its share from the others, one unit removed and one added
/// move no other unit. Timings are printed (in the unoptimised test build).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_of_100000_units_is_shared_by_weight_and_changes_move_only_what_they_must() {
    init_tracing();
    const UNITS: usize = 100_000;
    const LIMIT: Duration = Duration::from_secs(90);
    let cluster = Cluster::start(3).await;
    let urls = cluster.urls();
    let pool = "big";
    let units = Units::new(&client(&urls).await, pool).expect("pool name");
    let unit = |i: usize| format!("unit-{i:06}");
    let mut expected: BTreeSet<String> = (0..UNITS).map(unit).collect();
    let t0 = Instant::now();
    units
        .add(&expected.iter().cloned().collect::<Vec<_>>())
        .await
        .expect("units added");
    let added = t0.elapsed();
    let mut weights: BTreeMap<&str, u32> = [("m0", 2), ("m1", 1), ("m2", 1), ("m3", 1)].into();
    let mut members = Vec::new();
    for (id, w) in &weights {
        let opts = PoolOptions::default()
            .with_interval(Duration::from_secs(1))
            .with_weight(*w);
        members.push(
            PoolMember::join(&client(&urls).await, pool, id, opts)
                .await
                .expect("join"),
        );
    }
    let (before, first) = snapshot(&members, &expected, LIMIT).await;
    assert_snapshot_balanced(&before, &weights);

    let opts = PoolOptions::default().with_interval(Duration::from_secs(1));
    members.push(
        PoolMember::join(&client(&urls).await, pool, "m4", opts)
            .await
            .expect("join"),
    );
    weights.insert("m4", 1);
    let (after, join_t) = snapshot(&members, &expected, LIMIT).await;
    assert_snapshot_balanced(&after, &weights);
    let newcomer = after["m4"].len();
    let join_moved = moved_between(&before, &after);
    assert!(
        join_moved <= newcomer + 1,
        "a join moves the newcomer's share: {join_moved} moved, it holds {newcomer}"
    );

    units.remove(&[unit(7)]).await.expect("removed");
    units.add(&["unit-new".to_string()]).await.expect("added");
    expected.remove(&unit(7));
    expected.insert("unit-new".to_string());
    let (changed, change_t) = snapshot(&members, &expected, LIMIT).await;
    let others = moved_between(&after, &changed);
    assert!(
        others <= 2,
        "one unit removed and one added moved {others} other units"
    );
    println!(
        "100,000 units (test build): added in {}, 4 members active after {}, a join after {} \
         ({join_moved} units moved, minimum {newcomer}), one unit removed and one added after {} \
         ({others} other units moved)",
        ms(added),
        ms(first),
        ms(join_t),
        ms(change_t),
    );
    for m in members {
        m.leave().await;
    }
}
