//! `rq-model`: run the model checks and print what each explored.
//!
//! `rq-model [--amnesia | --deep] [--threads N] [--calls N] [--rounds N] [--losses N] [--crashes N]
//! [--wipes N] [--block N] [--bug quorum-half|no-quarantine|repair-without-wait] [--max-states N]`: the CI bounds
//! for the network (or for amnesia), larger ones with `--deep`, or any bound set by hand.

use std::process::ExitCode;

use redquorum_model::{check_at_most, ids};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let value = |flag: &str| -> Option<u64> {
        args.iter()
            .position(|a| a == flag)
            .and_then(|i| args.get(i + 1))
            .and_then(|t| t.parse().ok())
    };
    let threads = value("--threads").unwrap_or(2) as usize;
    let mut m = if args.iter().any(|a| a == "--deep") {
        ids::IdModel::deep()
    } else if args.iter().any(|a| a == "--amnesia") {
        ids::IdModel::ci_amnesia()
    } else {
        ids::IdModel::ci_network()
    };
    let small = |v: u64| v.min(u8::MAX as u64) as u8;
    m.calls = value("--calls").map(small).unwrap_or(m.calls);
    m.rounds = value("--rounds").map(small).unwrap_or(m.rounds);
    m.losses = value("--losses").map(small).unwrap_or(m.losses);
    m.crashes = value("--crashes").map(small).unwrap_or(m.crashes);
    m.wipes = value("--wipes").map(small).unwrap_or(m.wipes);
    m.block = value("--block").unwrap_or(m.block).max(1);
    match args
        .iter()
        .position(|a| a == "--bug")
        .and_then(|i| args.get(i + 1))
    {
        Some(b) if b == "quorum-half" => m.bug = Some(ids::Bug::QuorumHalf),
        Some(b) if b == "no-quarantine" => m.bug = Some(ids::Bug::NoQuarantine),
        Some(b) if b == "repair-without-wait" => m.bug = Some(ids::Bug::RepairWithoutWait),
        Some(b) => {
            eprintln!(
                "rq-model: unknown bug {b:?}: quorum-half, no-quarantine or repair-without-wait"
            );
            return ExitCode::from(2);
        }
        None => {}
    }
    let bounds = format!("{m:?}");
    let r = check_at_most(m, threads, value("--max-states").map(|n| n as usize));
    println!(
        "ids: {} states ({} distinct) in {:.1} s, {}; bounds {bounds}",
        r.states,
        r.unique,
        r.elapsed.as_secs_f64(),
        if r.complete { "complete" } else { "INCOMPLETE" }
    );
    let mut ok = true;
    for (name, trace) in &r.failed {
        ok = false;
        println!("  FAILED: {name}\n{trace}");
    }
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}
