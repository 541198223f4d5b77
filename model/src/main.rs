//! `rq-model`: run the model checks and print what each explored.
//!
//! ```text
//! rq-model [ids] [--amnesia | --deep] [--calls N] [--rounds N] [--block N]
//!          [--bug quorum-half|no-quarantine|repair-without-wait]
//! rq-model leases [--network | --amnesia | --deep] [--clients N] [--rounds N] [--extensions N]
//!          [--bug takeover-without-wait|no-drift-margin|no-quarantine|fencing-off|quorum-half]
//! rq-model views [--crash | --amnesia | --planted | --deep]
//!          [--bug barrier-off|forkable-register|no-write-back|validity-beyond-window]
//! common:  [--threads N] [--losses N] [--crashes N] [--wipes N] [--max-states N]
//!          [--shortest]   (breadth-first, shortest traces; the default is depth-first with
//!                          symmetry reduction: each class of renamed nodes and clients once)
//! ```
//! The CI bounds (each model has several sets), larger ones with `--deep`, or any bound set
//! by hand (`--losses` and the like apply to ids and leases; views take their sets as given). Exit code 0: every property held; 1: a property failed
//! (its trace is printed); 2: bad arguments.

use std::process::ExitCode;

use redquorum_model::{check_at_most, check_symmetric, ids, leases, views, Report};

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
    fn text(&self, flag: &str) -> Option<&str> {
        self.0
            .iter()
            .position(|a| a == flag)
            .and_then(|i| self.0.get(i + 1))
            .map(String::as_str)
    }
}

const USAGE: &str = "\
rq-model [ids] [--amnesia | --deep] [--calls N] [--rounds N] [--block N]
         [--bug quorum-half|no-quarantine|repair-without-wait]
rq-model leases [--network | --amnesia | --deep] [--clients N] [--rounds N] [--extensions N]
         [--bug takeover-without-wait|no-drift-margin|no-quarantine|fencing-off|quorum-half]
rq-model views [--crash | --amnesia | --planted | --deep]
         [--bug barrier-off|forkable-register|no-write-back|validity-beyond-window]
common:  [--threads N] [--losses N] [--crashes N] [--wipes N] [--max-states N]
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
            } else if args.flag("--network") {
                leases::LeaseModel::ci_network()
            } else {
                leases::LeaseModel::ci_takeover()
            };
            m.clients = args
                .value("--clients")
                .map_or(m.clients, |c| c.clamp(1, 3) as usize);
            m.rounds = args.small("--rounds").unwrap_or(m.rounds);
            m.extensions = args.small("--extensions").unwrap_or(m.extensions);
            m.losses = args.small("--losses").unwrap_or(m.losses);
            m.crashes = args.small("--crashes").unwrap_or(m.crashes);
            m.wipes = args.small("--wipes").unwrap_or(m.wipes);
            m.bug = match args.text("--bug") {
                None => None,
                Some("takeover-without-wait") => Some(leases::Bug::TakeoverWithoutWait),
                Some("no-drift-margin") => Some(leases::Bug::NoDriftMargin),
                Some("no-quarantine") => Some(leases::Bug::NoQuarantine),
                Some("fencing-off") => Some(leases::Bug::FencingOff),
                Some("quorum-half") => Some(leases::Bug::QuorumHalf),
                Some(b) => {
                    eprintln!("rq-model: unknown lease bug {b:?}: takeover-without-wait, no-drift-margin, no-quarantine, fencing-off or quorum-half");
                    return ExitCode::from(2);
                }
            };
            let bounds = format!("{m:?}");
            let r = if args.flag("--shortest") {
                check_at_most(m, threads, max_states)
            } else {
                check_symmetric(m, threads, max_states)
            };
            (format!("leases ({bounds})"), r)
        }
        "views" => {
            let mut m = if args.flag("--deep") {
                views::ViewModel::deep()
            } else if args.flag("--amnesia") {
                views::ViewModel::ci_amnesia()
            } else if args.flag("--crash") {
                views::ViewModel::ci_crash()
            } else if args.flag("--planted") {
                views::ViewModel::planted()
            } else {
                views::ViewModel::ci()
            };
            m.bug = match args.text("--bug") {
                None => None,
                Some("barrier-off") => Some(views::Bug::BarrierOff),
                Some("forkable-register") => Some(views::Bug::ForkableRegister),
                Some("no-write-back") => Some(views::Bug::NoWriteBack),
                Some("validity-beyond-window") => Some(views::Bug::ValidityBeyondWindow),
                Some(b) => {
                    eprintln!("rq-model: unknown view bug {b:?}: barrier-off, forkable-register, no-write-back or validity-beyond-window");
                    return ExitCode::from(2);
                }
            };
            let bounds = format!("{m:?}");
            (
                format!("views ({bounds})"),
                check_at_most(m, threads, max_states),
            )
        }
        "ids" | "--amnesia" | "--deep" | "--threads" | "--calls" | "--rounds" | "--losses"
        | "--crashes" | "--wipes" | "--block" | "--bug" | "--max-states" | "--shortest" => {
            let mut m = if args.flag("--deep") {
                ids::IdModel::deep()
            } else if args.flag("--amnesia") {
                ids::IdModel::ci_amnesia()
            } else {
                ids::IdModel::ci_network()
            };
            m.calls = args.small("--calls").unwrap_or(m.calls);
            m.rounds = args.small("--rounds").unwrap_or(m.rounds);
            m.losses = args.small("--losses").unwrap_or(m.losses);
            m.crashes = args.small("--crashes").unwrap_or(m.crashes);
            m.wipes = args.small("--wipes").unwrap_or(m.wipes);
            m.block = args.value("--block").unwrap_or(m.block).max(1);
            m.bug = match args.text("--bug") {
                None => None,
                Some("quorum-half") => Some(ids::Bug::QuorumHalf),
                Some("no-quarantine") => Some(ids::Bug::NoQuarantine),
                Some("repair-without-wait") => Some(ids::Bug::RepairWithoutWait),
                Some(b) => {
                    eprintln!("rq-model: unknown ID bug {b:?}: quorum-half, no-quarantine or repair-without-wait");
                    return ExitCode::from(2);
                }
            };
            let bounds = format!("{m:?}");
            let r = if args.flag("--shortest") {
                check_at_most(m, threads, max_states)
            } else {
                check_symmetric(m, threads, max_states)
            };
            (format!("ids ({bounds})"), r)
        }
        other => {
            eprintln!("rq-model: unknown model {other:?}: ids, leases or views\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    print(&what, &report)
}

fn print(what: &str, r: &Report) -> ExitCode {
    println!(
        "{what}: {} states ({} distinct) in {:.1} s, {}",
        r.states,
        r.unique,
        r.elapsed.as_secs_f64(),
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
