//! Explicit-state models of redquorum's protocols, checked with `stateright`: every
//! interleaving of the clients' steps, the nodes' steps and the faults, within bounds, not
//! only the ones a test or a campaign happens to hit.
//!
//! Each model's node step names the Lua script it mirrors, and `tests/conformance.rs` runs the
//! same calls on a real `redis-server` and through the model's step, so the two cannot drift
//! apart unnoticed. Each model has planted bugs (a protection switched off) for which the
//! checker must find a counterexample: `tests/models.rs`.

#![forbid(unsafe_code)]

pub mod copy;
pub mod ids;
pub mod leases;
pub mod views;

/// Helpers of the models' symmetry reduction (renaming interchangeable nodes and clients).
mod symmetry {
    /// A bit mask of nodes, with node `i` renamed `node[i]`.
    pub(crate) fn remap_mask(mask: u8, node: &[usize]) -> u8 {
        (0..node.len())
            .filter(|&i| mask & (1 << i) != 0)
            .fold(0, |acc, i| acc | (1 << node[i]))
    }

    /// Ranks: `rank[i]` is the place of `i` when `0..n` is sorted by `key` (ties keep their
    /// order). Renaming `i` to `rank[i]` sorts the renamed items by their own state.
    pub(crate) fn ranks<K: Ord>(n: usize, key: impl Fn(usize) -> K) -> Vec<usize> {
        let mut order: Vec<usize> = (0..n).collect();
        order.sort_by_key(|&i| key(i));
        let mut rank = vec![0; n];
        for (r, &i) in order.iter().enumerate() {
            rank[i] = r;
        }
        rank
    }
}

use std::fmt::Debug;
use std::hash::Hash;
use std::time::{Duration, Instant};

use stateright::{Checker, Expectation, Model, Representative};

/// What one exploration found.
#[derive(Debug)]
pub struct Report {
    /// States generated, and distinct states.
    pub states: usize,
    pub unique: usize,
    /// How long it took.
    pub elapsed: Duration,
    /// Whether every reachable state within the bounds was visited.
    pub complete: bool,
    /// Properties that failed (an `always` with a counterexample, or a `sometimes` never
    /// reached), each with its trace.
    pub failed: Vec<(&'static str, String)>,
}

impl Report {
    /// `N states (M distinct) in T s`.
    pub fn summary(&self) -> String {
        format!(
            "{} states ({} distinct) in {:.1} s",
            self.states,
            self.unique,
            self.elapsed.as_secs_f64()
        )
    }

    /// The trace of the failed property `name`, if it failed.
    pub fn counterexample(&self, name: &str) -> Option<&str> {
        self.failed
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, t)| t.as_str())
    }
}

/// The summary, then every failed property with its trace.
impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "{}", self.summary())?;
        for (name, trace) in &self.failed {
            write!(f, "  {name}:\n{trace}")?;
        }
        Ok(())
    }
}

/// Explore `model` breadth-first (shortest counterexamples first) on `threads` threads.
pub fn check<M>(model: M, threads: usize) -> Report
where
    M: Model + Send + Sync + 'static,
    M::State: Debug + Hash + Send + Sync + Clone + PartialEq,
    M::Action: Debug + std::fmt::Display + Clone + PartialEq,
{
    check_at_most(model, threads, None)
}

/// [`check`], stopping after about `max_states` states (the report then says incomplete).
pub fn check_at_most<M>(model: M, threads: usize, max_states: Option<usize>) -> Report
where
    M: Model + Send + Sync + 'static,
    M::State: Debug + Hash + Send + Sync + Clone + PartialEq,
    M::Action: Debug + std::fmt::Display + Clone + PartialEq,
{
    let properties = model.properties();
    let started = Instant::now();
    let mut builder = model.checker().threads(threads.max(1));
    if let Some(n) = max_states {
        builder = builder.target_state_count(n);
    }
    let checker = builder.spawn_bfs().join();
    report(&properties, &checker, started, max_states)
}

/// Search `model` breadth-first until `property` has a discovery (a counterexample to an
/// `always`, a witness of a `sometimes`): the planted-bug searches, which need the shortest
/// trace, not the whole space.
pub fn find<M>(model: M, threads: usize, property: &'static str) -> Report
where
    M: Model + Send + Sync + 'static,
    M::State: Debug + Hash + Send + Sync + Clone + PartialEq,
    M::Action: Debug + std::fmt::Display + Clone + PartialEq,
{
    let properties = model.properties();
    let started = Instant::now();
    let checker = model
        .checker()
        .threads(threads.max(1))
        .finish_when(stateright::HasDiscoveries::AnyOf([property].into()))
        .spawn_bfs()
        .join();
    report(&properties, &checker, started, None)
}

/// [`find`] depth-first with symmetry reduction: far fewer states before the discovery on
/// models whose counterexamples lie deep (a takeover after a repair), at the price of a trace
/// that is not the shortest.
pub fn find_symmetric<M>(model: M, threads: usize, property: &'static str) -> Report
where
    M: Model + Send + Sync + 'static,
    M::State: Debug + Hash + Send + Sync + Clone + PartialEq + Representative,
    M::Action: Debug + std::fmt::Display + Clone + PartialEq,
{
    let properties = model.properties();
    let started = Instant::now();
    let checker = model
        .checker()
        .threads(threads.max(1))
        .symmetry()
        .finish_when(stateright::HasDiscoveries::AnyOf([property].into()))
        .spawn_dfs()
        .join();
    report(&properties, &checker, started, None)
}

/// Explore `model` depth-first with symmetry reduction: each class of states that differ only
/// by a renaming of interchangeable nodes and clients is visited once (stateright reduces
/// symmetry only depth-first). Exhaustive like [`check`], with far fewer states; its
/// counterexamples are not the shortest (use [`check`] to find those).
pub fn check_symmetric<M>(model: M, threads: usize, max_states: Option<usize>) -> Report
where
    M: Model + Send + Sync + 'static,
    M::State: Debug + Hash + Send + Sync + Clone + PartialEq + Representative,
    M::Action: Debug + std::fmt::Display + Clone + PartialEq,
{
    let properties = model.properties();
    let started = Instant::now();
    let mut builder = model.checker().threads(threads.max(1)).symmetry();
    if let Some(n) = max_states {
        builder = builder.target_state_count(n);
    }
    let checker = builder.spawn_dfs().join();
    report(&properties, &checker, started, max_states)
}

fn report<M>(
    properties: &[stateright::Property<M>],
    checker: &impl Checker<M>,
    started: Instant,
    max_states: Option<usize>,
) -> Report
where
    M: Model,
    M::State: Debug + Hash + Clone + PartialEq,
    M::Action: Debug + std::fmt::Display + Clone + PartialEq,
{
    let elapsed = started.elapsed();
    let mut failed = Vec::new();
    for p in properties {
        let found = checker.discovery(p.name);
        let bad = match p.expectation {
            Expectation::Always | Expectation::Eventually => found.is_some(),
            Expectation::Sometimes => found.is_none(),
        };
        if !bad {
            continue;
        }
        let trace = match found {
            Some(path) => {
                let mut t = String::new();
                for (i, action) in path.into_actions().iter().enumerate() {
                    t.push_str(&format!("  {:>2}. {action}\n", i + 1));
                }
                t
            }
            None => "  (never reached within the bounds)\n".to_string(),
        };
        failed.push((p.name, trace));
    }
    Report {
        states: checker.state_count(),
        unique: checker.unique_state_count(),
        elapsed,
        complete: checker.is_done() && max_states.is_none_or(|n| checker.state_count() < n),
        failed,
    }
}
