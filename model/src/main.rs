//! `rq-model`: run the model checks and print what each explored.
//!
//! ```text
//! rq-model [ids] [--amnesia | --flush | --spare | --deep] [--calls N] [--rounds N] [--block N]
//!          [--lookahead N]
//!          [--bug quorum-half|no-quarantine|repair-without-wait|spare-without-read|
//!                 spare-read-from-one]
//! rq-model leases [--network | --amnesia | --flush | --collect | --repair | --deep] [--clients N]
//!          [--rounds N] [--extensions N] [--release-modes | --fold-only] [--collects N]
//!          [--bug takeover-without-wait|no-drift-margin|no-quarantine|fencing-off|quorum-half|
//!          repair-without-restore|repair-without-raise|restore-newest|collect-beside-copy]
//! rq-model views [--crash | --amnesia | --flush | --planted | --deep]
//!          [--bug barrier-off|forkable-register|no-write-back|validity-beyond-window]
//! rq-model copy [--two-flushes | --deep] [--rounds N] [--flushes N]
//!          [--bug blind-copy-reads|unclaimed-copy-writes|copy-without-majority]
//! common:  [--threads N] [--losses N] [--crashes N] [--wipes N] [--flushes N] [--max-states N]
//!          [--shortest]   (breadth-first, shortest traces; the default is depth-first with
//!                          symmetry reduction: each class of renamed nodes and clients once)
//! ```
//! The CI bounds (each model has several sets), larger ones with `--deep`, or any bound set
//! by hand (`--losses` and the like apply to ids and leases, `--losses` and `--flushes` to copy;
//! views take their sets as given; copy is explored breadth-first). Exit code 0: every property held; 1: a property failed
//! (its trace is printed); 2: bad arguments.

use std::process::ExitCode;

use redquorum_model::{check_at_most, check_symmetric, copy, ids, leases, views, Report};
use stateright::{Model, Representative};

struct Args(Vec<String>);

impl Args {
    fn flag(&self, f: &str) -> bool {
        self.0.iter().any(|a| a == f)
    }
    fn value(&self, flag: &str) -> Option<u64> {
        self.0
            .iter()
            .position(|a| a == flag)
            .and_then(|i| self.0.get(i + 1))
            .and_then(|t| t.parse().ok())
    }
    fn small(&self, flag: &str) -> Option<u8> {
        self.value(flag).map(|v| v.min(u8::MAX as u64) as u8)
    }
    /// The planted bug named by `--bug`, from `table`; an unknown name is reported (exit 2).
    fn bug<B: Copy>(&self, kind: &str, table: &[(&str, B)]) -> Result<Option<B>, ExitCode> {
        let Some(name) = self.text("--bug") else {
            return Ok(None);
        };
        match table.iter().find(|(n, _)| *n == name) {
            Some((_, b)) => Ok(Some(*b)),
            None => {
                let names: Vec<&str> = table.iter().map(|(n, _)| *n).collect();
                eprintln!(
                    "rq-model: unknown {kind} bug {name:?}: {}",
                    names.join(", ")
                );
                Err(ExitCode::from(2))
            }
        }
    }

    /// Depth-first with symmetry reduction, or breadth-first with `--shortest`.
    fn explore<M>(&self, m: M, threads: usize, max_states: Option<usize>) -> Report
    where
        M: Model + Send + Sync + 'static,
        M::State:
            std::fmt::Debug + std::hash::Hash + Send + Sync + Clone + PartialEq + Representative,
        M::Action: std::fmt::Debug + std::fmt::Display + Clone + PartialEq,
    {
        if self.flag("--shortest") {
            check_at_most(m, threads, max_states)
        } else {
            check_symmetric(m, threads, max_states)
        }
    }

    fn text(&self, flag: &str) -> Option<&str> {
        self.0
            .iter()
            .position(|a| a == flag)
            .and_then(|i| self.0.get(i + 1))
            .map(String::as_str)
    }
}

const USAGE: &str = "\
rq-model [ids] [--amnesia | --flush | --spare | --deep] [--calls N] [--rounds N] [--block N]
         [--lookahead N]
         [--bug quorum-half|no-quarantine|repair-without-wait|spare-without-read|
                spare-read-from-one]
rq-model leases [--network | --amnesia | --flush | --collect | --repair | --deep] [--clients N]
         [--rounds N] [--extensions N] [--release-modes | --fold-only] [--collects N]
         [--bug takeover-without-wait|no-drift-margin|no-quarantine|fencing-off|quorum-half|
                repair-without-restore|repair-without-raise|restore-newest|collect-beside-copy]
rq-model views [--crash | --amnesia | --flush | --planted | --deep]
         [--bug barrier-off|forkable-register|no-write-back|validity-beyond-window]
rq-model copy [--two-flushes | --deep] [--rounds N] [--flushes N]
         [--bug blind-copy-reads|unclaimed-copy-writes|copy-without-majority]
common:  [--threads N] [--losses N] [--crashes N] [--wipes N] [--flushes N] [--max-states N]
         [--shortest]   (breadth-first, shortest traces; the default is depth-first with
                         symmetry reduction: each class of renamed nodes and clients once)
Exit codes: 0 every property held; 1 a property failed (its trace is printed); 2 bad arguments.
";

fn main() -> ExitCode {
    let args = Args(std::env::args().skip(1).collect());
    if args.flag("--help") || args.flag("-h") {
        print!("{USAGE}");
        return ExitCode::SUCCESS;
    }
    let threads = args.value("--threads").unwrap_or(2) as usize;
    let max_states = args.value("--max-states").map(|n| n as usize);
    let model = args.0.first().map(String::as_str).unwrap_or("ids");
    let (what, report) = match model {
        "leases" => {
            let mut m = if args.flag("--deep") {
                leases::LeaseModel::deep()
            } else if args.flag("--amnesia") {
                leases::LeaseModel::ci_amnesia()
            } else if args.flag("--flush") {
                leases::LeaseModel::ci_flush()
            } else if args.flag("--repair") {
                leases::LeaseModel::ci_repair()
            } else if args.flag("--network") {
                leases::LeaseModel::ci_network()
            } else if args.flag("--collect") {
                leases::LeaseModel::ci_collect()
            } else {
                leases::LeaseModel::ci_takeover()
            };
            m.clients = args
                .value("--clients")
                .map_or(m.clients, |c| c.clamp(1, 3) as usize);
            m.rounds = args.small("--rounds").unwrap_or(m.rounds);
            m.extensions = args.small("--extensions").unwrap_or(m.extensions);
            m.losses = args.small("--losses").unwrap_or(m.losses);
            m.collects = args.small("--collects").unwrap_or(m.collects);
            // Collects follow kept fences: `--collects N` explores the release modes too.
            if args.flag("--release-modes") || (m.collects > 0 && !args.flag("--fold-only")) {
                m.release_modes = true;
            } else if args.flag("--fold-only") {
                m.release_modes = false;
                m.collects = 0;
            }
            m.crashes = args.small("--crashes").unwrap_or(m.crashes);
            m.wipes = args.small("--wipes").unwrap_or(m.wipes);
            m.flushes = args.small("--flushes").unwrap_or(m.flushes);
            m.bug = match args.bug(
                "lease",
                &[
                    ("takeover-without-wait", leases::Bug::TakeoverWithoutWait),
                    ("no-drift-margin", leases::Bug::NoDriftMargin),
                    ("no-quarantine", leases::Bug::NoQuarantine),
                    ("fencing-off", leases::Bug::FencingOff),
                    ("quorum-half", leases::Bug::QuorumHalf),
                    ("repair-without-restore", leases::Bug::RepairWithoutRestore),
                    ("repair-without-raise", leases::Bug::RepairWithoutRaise),
                    ("restore-newest", leases::Bug::RestoreNewest),
                    ("collect-beside-copy", leases::Bug::CollectBesideCopy),
                ],
            ) {
                Ok(b) => b,
                Err(code) => return code,
            };
            let bounds = format!("{m:?}");
            let r = args.explore(m, threads, max_states);
            (format!("leases ({bounds})"), r)
        }
        "views" => {
            let mut m = if args.flag("--deep") {
                views::ViewModel::deep()
            } else if args.flag("--amnesia") {
                views::ViewModel::ci_amnesia()
            } else if args.flag("--flush") {
                views::ViewModel::ci_flush()
            } else if args.flag("--crash") {
                views::ViewModel::ci_crash()
            } else if args.flag("--planted") {
                views::ViewModel::planted()
            } else {
                views::ViewModel::ci()
            };
            m.bug = match args.bug(
                "view",
                &[
                    ("barrier-off", views::Bug::BarrierOff),
                    ("forkable-register", views::Bug::ForkableRegister),
                    ("no-write-back", views::Bug::NoWriteBack),
                    ("validity-beyond-window", views::Bug::ValidityBeyondWindow),
                ],
            ) {
                Ok(b) => b,
                Err(code) => return code,
            };
            let bounds = format!("{m:?}");
            (
                format!("views ({bounds})"),
                check_at_most(m, threads, max_states),
            )
        }
        "copy" => {
            let mut m = if args.flag("--deep") {
                copy::CopyModel::deep()
            } else if args.flag("--two-flushes") {
                copy::CopyModel::ci_two_flushes()
            } else {
                copy::CopyModel::ci()
            };
            m.rounds = args.small("--rounds").unwrap_or(m.rounds);
            m.losses = args.small("--losses").unwrap_or(m.losses);
            m.flushes = args.small("--flushes").unwrap_or(m.flushes);
            m.bug = match args.bug(
                "copy",
                &[
                    ("blind-copy-reads", copy::Bug::BlindCopyReads),
                    ("unclaimed-copy-writes", copy::Bug::UnclaimedCopyWrites),
                    ("copy-without-majority", copy::Bug::CopyWithoutMajority),
                ],
            ) {
                Ok(b) => b,
                Err(code) => return code,
            };
            let bounds = format!("{m:?}");
            (
                format!("copy ({bounds})"),
                check_at_most(m, threads, max_states),
            )
        }
        "ids" | "--amnesia" | "--spare" | "--flush" | "--deep" | "--threads" | "--calls"
        | "--rounds" | "--losses" | "--crashes" | "--wipes" | "--flushes" | "--block"
        | "--lookahead" | "--bug" | "--max-states" | "--shortest" => {
            let mut m = if args.flag("--deep") {
                ids::IdModel::deep()
            } else if args.flag("--amnesia") {
                ids::IdModel::ci_amnesia()
            } else if args.flag("--spare") {
                ids::IdModel::ci_spare()
            } else if args.flag("--flush") {
                ids::IdModel::ci_flush()
            } else {
                ids::IdModel::ci_network()
            };
            m.calls = args.small("--calls").unwrap_or(m.calls);
            m.rounds = args.small("--rounds").unwrap_or(m.rounds);
            m.losses = args.small("--losses").unwrap_or(m.losses);
            m.crashes = args.small("--crashes").unwrap_or(m.crashes);
            m.wipes = args.small("--wipes").unwrap_or(m.wipes);
            m.flushes = args.small("--flushes").unwrap_or(m.flushes);
            m.block = args.value("--block").unwrap_or(m.block).max(1);
            m.lookahead = args.value("--lookahead").unwrap_or(m.lookahead);
            m.bug = match args.bug(
                "ID",
                &[
                    ("quorum-half", ids::Bug::QuorumHalf),
                    ("no-quarantine", ids::Bug::NoQuarantine),
                    ("repair-without-wait", ids::Bug::RepairWithoutWait),
                    ("spare-without-read", ids::Bug::SpareWithoutRead),
                    ("spare-read-from-one", ids::Bug::SpareReadFromOne),
                ],
            ) {
                Ok(b) => b,
                Err(code) => return code,
            };
            let bounds = format!("{m:?}");
            let r = args.explore(m, threads, max_states);
            (format!("ids ({bounds})"), r)
        }
        other => {
            eprintln!("rq-model: unknown model {other:?}: ids, leases, views or copy\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    print(&what, &report)
}

fn print(what: &str, r: &Report) -> ExitCode {
    println!(
        "{what}: {}, {}",
        r.summary(),
        if r.complete { "complete" } else { "INCOMPLETE" }
    );
    for (name, trace) in &r.failed {
        println!("  FAILED: {name}\n{trace}");
    }
    if r.failed.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}
