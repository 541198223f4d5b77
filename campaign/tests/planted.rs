//! Planted bugs: a campaign run with a protection switched off must report a violation of the
//! guarantee that protection keeps (or the campaign's checkers prove nothing).

use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_rq-campaign");

/// Run a campaign: its exit code, its stdout (the summary, ending with the exact last line)
/// and its stderr.
fn campaign(args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new(BIN)
        .arg("run")
        .args(args)
        .output()
        .expect("rq-campaign runs");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Seeds tried in turn: a planted bug that needs a fault at the right moment (a holder frozen
/// between its check and its write, a node's clock stepped while a lease is held) is caught by
/// one of them; the test says which. (In one loaded CI run, `server-clock-leases` escaped
/// seeds 3, 4 and 5 and was caught on the retry: five seeds.)
const SEEDS: [&str; 5] = ["3", "4", "5", "6", "7"];

/// Run 30 s campaigns with `plant` (and `workloads`: the workload the bug is about gets most of
/// the client faults when the others are left out) until one reports a violation of one of
/// `guarantees` (each the start of a guarantee's name), or fail with what each seed reported.
/// Returns the summary of the campaign that caught it.
fn caught(plant: &str, guarantees: &[&str], workloads: &[&str]) -> String {
    let mut summary = String::new();
    let mut tried = Vec::new();
    let caught = SEEDS.iter().find(|seed| {
        let mut args = vec!["--seed", seed, "--duration", "30s", "--plant", plant];
        args.extend_from_slice(workloads);
        // The HTTP callers (through `serve`) only where the test asks for them: elsewhere they
        // dilute the faults the planted bug needs and load the machine.
        for http in ["--http-id-workers", "--http-lock-workers"] {
            if !workloads.contains(&http) {
                args.extend_from_slice(&[http, "0"]);
            }
        }
        let (code, text, stderr) = campaign(&args);
        let last = text
            .trim_end()
            .lines()
            .last()
            .unwrap_or_default()
            .to_string();
        assert!(
            last.starts_with(&format!("campaign: seed={seed} operations=")),
            "{plant}: last line {last:?}\n{text}\n{stderr}"
        );
        let found = code == Some(1)
            && guarantees
                .iter()
                .any(|g| text.contains(&format!("violation ({g}")));
        tried.push(format!("seed {seed}: exit {code:?}, {last}"));
        if found {
            println!("{plant} caught with seed {seed}:\n{text}");
            summary = text;
        }
        found
    });
    assert!(
        caught.is_some(),
        "{plant}: no campaign reported a violation of {guarantees:?}: {tried:#?}"
    );
    summary
}

/// The lease holders (and one ID process) only.
const ONLY_LEASES: &[&str] = &[
    "--id-workers",
    "1",
    "--dist-members",
    "0",
    "--index-members",
    "0",
    "--job-workers",
    "0",
];

#[test]
fn a_quorum_of_half_the_nodes_is_caught_repeating_ids() {
    caught("quorum-half", &["ids"], &[]);
}

#[test]
fn fencing_off_is_caught_as_a_stale_write_accepted() {
    // In-process holders and holders through `serve` (whose server the nemesis freezes with
    // them): either one's stale write is caught.
    let with_http: Vec<&str> = [ONLY_LEASES, &["--http-lock-workers", "2"]].concat();
    caught("fencing-off", &["fenced writes"], &with_http);
}

#[test]
fn leases_on_server_clocks_are_caught_as_two_holders() {
    caught("server-clock-leases", &["leases"], ONLY_LEASES);
}

#[test]
fn a_job_that_ignores_its_completion_record_is_caught_running_a_period_twice() {
    caught("no-completion-check", &["periodic jobs"], &[]);
}

#[test]
fn the_barrier_off_is_caught_as_two_owners() {
    // Work distribution or peer indexing, whichever hand-over the faults hit first.
    caught("barrier-off", &["one owner per"], &[]);
}

#[test]
fn a_takeover_without_the_wait_is_caught_as_two_holders() {
    caught("takeover-without-wait", &["leases"], ONLY_LEASES);
}

#[test]
fn a_wiped_node_without_quarantine_after_a_missed_grant_is_caught_as_two_holders() {
    // The nemesis aims "wipe after a missed grant" at a holder: cut off from one node until it
    // acquires, frozen, then another node wiped.
    caught("no-quarantine", &["leases"], ONLY_LEASES);
}

#[test]
fn a_lost_reply_counted_as_accepted_is_caught() {
    // Two clients that each count a node they lost as a yes both "win": two holders of one
    // lease, or one ID returned twice, whichever the faults hit first.
    caught("lost-reply-accepted", &["leases", "ids"], &[]);
}

#[test]
fn a_deposed_holder_told_its_release_found_its_lease_is_caught_by_the_fenced_mutex_alone() {
    // A holder frozen past its validity is deposed; when it wakes and releases, the nodes
    // answer "not your copy" and the planted bug counts them as deleted: it is told that a
    // majority still held its lease. Nothing on the nodes is wrong (no two holders, no stale
    // write): only the fenced mutex (release only by the holder) sees a release that followed
    // another holder's grant.
    let summary = caught(
        "release-counts-foreign-copies",
        &["fenced mutex"],
        ONLY_LEASES,
    );
    for other in ["leases", "fenced writes", "ids"] {
        assert!(
            !summary.contains(&format!("violation ({other}")),
            "the other checkers were to miss this planted bug, yet one reported {other}:\n{summary}"
        );
    }
}

#[test]
fn a_bad_planted_bug_name_is_refused_with_the_list() {
    let (code, _, stderr) = campaign(&["--plant", "nonsense"]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("quorum-half"), "{stderr}");
}
