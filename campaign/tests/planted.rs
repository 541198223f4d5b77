//! Planted bugs: a campaign run with a protection switched off must report a violation of the
//! guarantee that protection keeps (or the campaign's checkers prove nothing).

use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_rq-campaign");

fn campaign(args: &[&str]) -> (Option<i32>, String) {
    let out = Command::new(BIN)
        .arg("run")
        .args(args)
        .output()
        .expect("rq-campaign runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code(), text)
}

/// Each planted bug and the guarantee it must be caught breaking. (So far only the ID
/// workload runs as processes; the other planted bugs arrive with their workloads.)
const TABLE: &[(&str, &str)] = &[("quorum-half", "ids")];

#[test]
fn each_planted_bug_is_caught_and_named() {
    for (plant, guarantee) in TABLE.iter().copied() {
        let (code, text) = campaign(&["--seed", "11", "--duration", "15s", "--plant", plant]);
        println!("{text}");
        assert_eq!(code, Some(1), "{plant}: the campaign must fail\n{text}");
        assert!(
            text.contains(&format!("violation ({guarantee})")),
            "{plant}: a violation of {guarantee} must be reported\n{text}"
        );
        let last = text.trim_end().lines().last().unwrap_or_default();
        assert!(
            last.starts_with("campaign: seed=11 operations=") && !last.ends_with("violations=0"),
            "{plant}: last line {last:?}"
        );
    }
}

#[test]
fn a_bad_planted_bug_name_is_refused_with_the_list() {
    let (code, text) = campaign(&["--plant", "nonsense"]);
    assert_eq!(code, Some(2), "{text}");
    assert!(text.contains("quorum-half"), "{text}");
}
