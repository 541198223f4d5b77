//! The codebase's habits, enforced cheaply (no Redis, no network: these tests only read files
//! of the repository):
//!
//! - modules depend on each other one way: no cycle between the top-level modules of a crate,
//!   nor between the files of one folder;
//! - the pure decision cores do no I/O and read no clock;
//! - functions stay under 70 lines and files under 600 non-test lines, with an allow-list that
//!   only shrinks;
//! - every repository path the documentation names exists.
//!
//! Each failure names the file and line, what broke and how to fix it. The source is read as
//! text: comments, string and char literals are blanked first, and test code (a
//! `#[cfg(test)]` item, usually `mod tests`, up to its closing brace) is left out.

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

// ----------------------------------------------------------------------------------------------
// The rules' parameters.
// ----------------------------------------------------------------------------------------------

/// The longest a function may be, from its `fn` line to its closing brace.
const MAX_FN_LINES: usize = 70;

/// The most non-test lines a file may have.
const MAX_FILE_LINES: usize = 600;

/// The source trees whose sizes are checked.
const SIZE_ROOTS: &[&str] = &["src", "cli/src", "testkit/src", "campaign/src"];

/// Functions allowed over [`MAX_FN_LINES`] for now: `(file, fn name, its size today)`. The list
/// only shrinks: an entry whose function grew fails, and so does one whose function shrank
/// (tighten it to the new size, or remove it once the function is within the limit).
/// Several functions of one name in one file count as their longest.
const FN_ALLOW: &[(&str, &str, usize)] = &[
    // The fault campaign's driver, the last offender (the library, the CLI and the test kit are
    // within the limits).
    ("campaign/src/main.rs", "main", 179),
    ("campaign/src/run.rs", "begin", 88),
    ("campaign/src/run.rs", "run", 323),
    ("campaign/src/run.rs", "spawn_worker", 109),
    ("campaign/src/worker.rs", "http_locks", 123),
    ("campaign/src/worker.rs", "locks", 83),
];

/// Files allowed over [`MAX_FILE_LINES`] non-test lines for now: `(file, its size today)`.
/// Shrinks like [`FN_ALLOW`].
const FILE_ALLOW: &[(&str, usize)] = &[
    // Today's offenders, as the size tests print them on failure.
    ("campaign/src/run.rs", 1242),
];

/// The pure decision cores: files that decide from values passed in and never do I/O, read a
/// clock or draw randomness themselves (each one's module doc says so). Time, randomness and
/// node replies come in as arguments.
const PURE_CORES: &[&str] = &[
    "src/cluster/adopt.rs",
    "src/cluster/marker.rs",
    "src/cluster/mod.rs",
    "src/distribution/lists.rs",
    "src/distribution/plan.rs",
    "src/distribution/table.rs",
    "src/distribution/unit_log.rs",
    "src/id/decide.rs",
    "src/lease/beats.rs",
    "src/lease/mod.rs",
    "src/lock/decide.rs",
    "src/membership/assign.rs",
    "src/membership/assignment.rs",
    "src/membership/decide.rs",
    "src/quorum/mod.rs",
    "src/repair/decide.rs",
    "src/repair/plan.rs",
    "src/safety.rs",
];

/// What a pure core must not mention in its non-test code, and how to do without it.
const NOT_IN_PURE_CORES: &[(&str, &str)] = &[
    ("tokio", "take time as an `Instant`/`Duration` argument (`crate::clock::Instant`) and leave the runtime to the caller"),
    ("redis::", "decode the reply where it is received (the node step's decode) and pass typed values in"),
    ("std::net", "do the networking in the caller and pass the result in"),
    ("std::fs", "read the file in the caller and pass its contents in"),
    ("std::io", "do the I/O in the caller and pass the result in"),
    ("std::env", "read the environment in the caller (or the configuration) and pass the value in"),
    ("std::process", "run processes in the caller"),
    ("SystemTime", "take the time as an argument"),
    ("Instant::now", "take `now` as an argument"),
    ("::now(", "take `now` as an argument"),
    ("boot_now(", "take the boot-clock reading as an argument"),
    (".passed()", "`Stamp::passed` reads both clocks: take `now` as an argument and compare"),
    ("thread_rng", "take an `&mut impl Rng` argument"),
    ("rand::rng(", "take an `&mut impl Rng` argument"),
    ("rand::random", "take an `&mut impl Rng` argument"),
    ("fanout::", "the fan-out is I/O: let the caller send and pass the replies in"),
    (".await", "make the function synchronous; the caller awaits and passes the result in"),
    ("async", "make the function synchronous; the caller awaits and passes the result in"),
];

/// Modules a pure core must not reference (however the path is written: `crate::client::X`,
/// `use crate::{client::X}`, `super::super::client`).
const IO_MODULES: &[&[&str]] = &[&["client"], &["node"], &["quorum", "fanout"]];

/// The Markdown files whose paths are checked, besides `docs/**/*.md` and the `//!` docs of
/// `src/**/mod.rs`. CHANGELOG.md is history: it may name paths that are gone.
const DOCS: &[&str] = &["README.md", "ARCHITECTURE.md", "SECURITY.md"];

/// The extensions that make a backticked word a path even without a `/`.
const PATH_EXTENSIONS: &[&str] = &[".rs", ".md", ".lua", ".sh", ".toml", ".yml", ".yaml", ".py"];

// ----------------------------------------------------------------------------------------------
// The stories.
// ----------------------------------------------------------------------------------------------

#[test]
fn the_library_top_level_modules_depend_on_each_other_without_a_cycle() {
    let krate = Crate::load("src", "lib.rs");
    let cycles = cycles_in("the library's top-level modules (src/)", &krate.top_graph());
    assert!(
        cycles.is_empty(),
        "{}",
        report("module cycles", &cycles, CYCLE_FIX)
    );
}

#[test]
fn the_files_of_each_library_folder_depend_on_each_other_without_a_cycle() {
    let krate = Crate::load("src", "lib.rs");
    let cycles = krate.folder_cycles();
    assert!(
        cycles.is_empty(),
        "{}",
        report("cycles between sibling files", &cycles, CYCLE_FIX)
    );
}

#[test]
fn the_cli_modules_and_the_files_of_its_folders_depend_on_each_other_without_a_cycle() {
    let krate = Crate::load("cli/src", "main.rs");
    let mut cycles = cycles_in("the CLI's top-level modules (cli/src/)", &krate.top_graph());
    cycles.extend(krate.folder_cycles());
    assert!(
        cycles.is_empty(),
        "{}",
        report("module cycles in the CLI", &cycles, CYCLE_FIX)
    );
}

#[test]
fn the_testkit_modules_depend_on_each_other_without_a_cycle() {
    let krate = Crate::load("testkit/src", "lib.rs");
    let mut cycles = cycles_in("the testkit's modules (testkit/src/)", &krate.top_graph());
    cycles.extend(krate.folder_cycles());
    assert!(
        cycles.is_empty(),
        "{}",
        report("module cycles in the testkit", &cycles, CYCLE_FIX)
    );
}

#[test]
fn the_campaign_modules_depend_on_each_other_without_a_cycle() {
    let krate = Crate::load("campaign/src", "main.rs");
    let mut cycles = cycles_in("the campaign's modules (campaign/src/)", &krate.top_graph());
    cycles.extend(krate.folder_cycles());
    assert!(
        cycles.is_empty(),
        "{}",
        report("module cycles in the campaign", &cycles, CYCLE_FIX)
    );
}

#[test]
fn the_pure_decision_cores_do_no_io_and_read_no_clock() {
    let mut broken = Vec::new();
    for rel in PURE_CORES {
        let Some(file) = SourceFile::read(rel, &[]) else {
            broken.push(format!(
                "{rel}: listed in PURE_CORES but missing. Fix: update PURE_CORES in tests/habits.rs \
                 to the file's new path (or remove the entry if the core is gone)."
            ));
            continue;
        };
        broken.extend(impurities(&file));
    }
    assert!(
        broken.is_empty(),
        "{}",
        report("I/O in pure decision cores", &broken, PURE_FIX)
    );
}

#[test]
fn every_file_whose_module_doc_promises_no_io_is_listed_as_a_pure_core() {
    let mut unlisted = Vec::new();
    for dir in ["src"] {
        for rel in rust_files(dir) {
            let text = read(&rel);
            let doc = module_doc(&text).to_lowercase();
            let promises = doc.contains("no i/o")
                || doc.contains("nothing in this module does i/o")
                || doc.contains("pure:");
            if promises && !PURE_CORES.contains(&rel.as_str()) {
                unlisted.push(format!(
                    "{rel}:1: its module doc says it is pure (no I/O), but it is not in PURE_CORES, \
                     so nothing holds it to that. Fix: add \"{rel}\" to PURE_CORES in \
                     tests/habits.rs (or change the doc if the file does I/O)."
                ));
            }
        }
    }
    assert!(
        unlisted.is_empty(),
        "{}",
        report("unchecked pure cores", &unlisted, "")
    );
}

#[test]
fn no_function_is_longer_than_70_lines_outside_the_allow_list() {
    let sizes = Sizes::measure();
    let mut broken = Vec::new();
    for ((file, name), f) in &sizes.fns {
        if f.lines <= MAX_FN_LINES {
            continue;
        }
        let allowed = FN_ALLOW.iter().find(|(p, n, _)| p == file && n == name);
        match allowed {
            None => broken.push(format!(
                "{file}:{}: fn `{name}` is {} lines, over the {MAX_FN_LINES}-line limit. Fix: split it \
                 into named steps (a helper per phase, a pure decision apart from its I/O).",
                f.line, f.lines
            )),
            Some((_, _, max)) if f.lines > *max => broken.push(format!(
                "{file}:{}: fn `{name}` grew to {} lines; FN_ALLOW allows it {max} and the \
                 allow-list only shrinks. Fix: split it back under {max} lines (better: under \
                 {MAX_FN_LINES}).",
                f.line, f.lines
            )),
            Some(_) => {}
        }
    }
    assert!(
        broken.is_empty(),
        "{}{}",
        report("functions too long", &broken, ""),
        sizes.regenerated_fn_allow()
    );
}

#[test]
fn no_file_has_more_than_600_non_test_lines_outside_the_allow_list() {
    let sizes = Sizes::measure();
    let mut broken = Vec::new();
    for (file, lines) in &sizes.files {
        if *lines <= MAX_FILE_LINES {
            continue;
        }
        match FILE_ALLOW.iter().find(|(p, _)| p == file) {
            None => broken.push(format!(
                "{file}:1: {lines} non-test lines, over the {MAX_FILE_LINES}-line limit. Fix: split \
                 the file into a folder of modules, one concern each."
            )),
            Some((_, max)) if lines > max => broken.push(format!(
                "{file}:1: grew to {lines} non-test lines; FILE_ALLOW allows it {max} and the \
                 allow-list only shrinks. Fix: move code out until it is back under {max} lines \
                 (better: under {MAX_FILE_LINES})."
            )),
            Some(_) => {}
        }
    }
    assert!(
        broken.is_empty(),
        "{}{}",
        report("files too long", &broken, ""),
        sizes.regenerated_file_allow()
    );
}

#[test]
fn every_size_allow_list_entry_is_still_needed_and_exact_so_the_list_only_shrinks() {
    let sizes = Sizes::measure();
    let mut stale = Vec::new();
    for (file, name, max) in FN_ALLOW {
        let entry = format!("(\"{file}\", \"{name}\", {max}),");
        match sizes.fns.get(&(file.to_string(), name.to_string())) {
            None => stale.push(format!(
                "tests/habits.rs: FN_ALLOW names fn `{name}` in {file}, which no longer exists. \
                 Fix: remove `{entry}` from FN_ALLOW."
            )),
            Some(f) if f.lines <= MAX_FN_LINES => stale.push(format!(
                "{file}:{}: fn `{name}` is now {} lines, within the {MAX_FN_LINES}-line limit. \
                 Fix: remove `{entry}` from FN_ALLOW.",
                f.line, f.lines
            )),
            Some(f) if f.lines < *max => stale.push(format!(
                "{file}:{}: fn `{name}` is now {} lines but FN_ALLOW still allows {max}: tighten \
                 the allow-list. Fix: replace `{entry}` with `(\"{file}\", \"{name}\", {}),`.",
                f.line, f.lines, f.lines
            )),
            Some(_) => {}
        }
    }
    for (file, max) in FILE_ALLOW {
        let entry = format!("(\"{file}\", {max}),");
        match sizes.files.get(*file) {
            None => stale.push(format!(
                "tests/habits.rs: FILE_ALLOW names {file}, which no longer exists. Fix: remove \
                 `{entry}` from FILE_ALLOW."
            )),
            Some(lines) if *lines <= MAX_FILE_LINES => stale.push(format!(
                "{file}:1: now {lines} non-test lines, within the {MAX_FILE_LINES}-line limit. Fix: \
                 remove `{entry}` from FILE_ALLOW."
            )),
            Some(lines) if lines < max => stale.push(format!(
                "{file}:1: now {lines} non-test lines but FILE_ALLOW still allows {max}: tighten the \
                 allow-list. Fix: replace `{entry}` with `(\"{file}\", {lines}),`."
            )),
            Some(_) => {}
        }
    }
    assert!(
        stale.is_empty(),
        "{}{}{}",
        report("allow-list entries to tighten", &stale, ""),
        sizes.regenerated_fn_allow(),
        sizes.regenerated_file_allow()
    );
}

#[test]
fn every_repository_path_the_docs_name_exists() {
    let repo = RepoIndex::build();
    let mut missing = Vec::new();
    for (doc, text) in documents() {
        let doc_dir = Path::new(&doc)
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_default();
        for named in named_paths(&text) {
            if !repo.has(&named.path, &doc_dir) {
                missing.push(format!(
                    "{doc}:{}: names `{}`, which does not exist in the repository.{} Fix: correct \
                     the path in the doc (or drop the mention).",
                    named.line,
                    named.written,
                    repo.suggestion(&named.path)
                ));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "{}",
        report("paths the docs name that do not exist", &missing, "")
    );
}

// The checker's own teeth: each parser on a small planted example.

#[test]
fn the_lexer_blanks_comments_strings_and_chars_but_keeps_every_line() {
    let src = "let a = \"crate::x { \"; // crate::y {\n/* crate::z\n { */ let c = '{';\nlet r = r#\"}\"#;\nlet q = ('\\'', '\\\\', '\\u{7d}');\nfn f<'a>(x: &'a str) {}\n";
    let code: String = blank_comments_and_literals(src).into_iter().collect();
    assert_eq!(code.lines().count(), src.lines().count());
    assert!(!code.contains("crate::"), "{code}");
    assert_eq!(code.matches('{').count(), 1, "{code}");
    assert_eq!(code.matches('}').count(), 1, "{code}");
    assert!(code.contains("fn f<'a>(x: &'a str) {}"), "{code}");
}

#[test]
fn test_code_is_cut_from_the_cfg_test_line_to_the_end_of_its_item() {
    let src = "fn a() {}\n#[cfg(test)]\nmod tests {\n    fn b() { crate::x::y(); }\n}\n#[cfg(test)]\nuse crate::z;\nfn c() { crate::w::v(); }\n";
    let file = SourceFile::parse("src/k.rs", src, &[]);
    let code: String = file.code.iter().collect();
    assert!(
        !code.contains("crate::x") && !code.contains("crate::z"),
        "{code}"
    );
    assert!(code.contains("crate::w::v"), "{code}");
    assert_eq!(file.non_test_lines(), 2);
}

#[test]
fn a_use_group_yields_one_reference_per_path_with_its_own_line() {
    let src = "use crate::{\n    alpha::A,\n    beta::{self, B},\n};\nuse super::{gamma, Delta as D};\nfn f() { crate::eps::g(); self::zeta::h(); }\n";
    let file = SourceFile::parse("src/one/two.rs", src, &["one".into(), "two".into()]);
    let refs: Vec<(String, usize)> = file
        .references()
        .into_iter()
        .map(|r| (r.abs.join("::"), r.line))
        .collect();
    let want = [
        ("alpha::A", 2),
        ("beta", 3),
        ("beta::B", 3),
        ("one::gamma", 5),
        ("one::Delta", 5),
        ("eps::g", 6),
        ("one::two::zeta::h", 6),
    ];
    let want: Vec<(String, usize)> = want.iter().map(|(p, l)| (p.to_string(), *l)).collect();
    assert_eq!(refs, want);
}

#[test]
fn the_cycle_finder_reports_a_planted_cycle_with_its_references_and_ignores_a_chain() {
    let mut graph = Graph::new();
    let site = |line| Site {
        file: "src/a.rs".into(),
        line,
        written: "crate::x".into(),
    };
    graph.add("a", "b", site(1));
    graph.add("b", "c", site(2));
    graph.add("c", "a", site(3));
    graph.add("c", "d", site(4));
    let cycles = cycles_in("a planted graph", &graph);
    assert_eq!(cycles.len(), 1, "{cycles:?}");
    assert!(cycles[0].contains("a -> b -> c -> a"), "{}", cycles[0]);
    assert!(cycles[0].contains("src/a.rs:3"), "{}", cycles[0]);
    assert!(!cycles[0].contains("src/a.rs:4"), "{}", cycles[0]);
    graph.edges.remove("c");
    assert!(cycles_in("a chain", &graph).is_empty());
}

#[test]
fn a_function_is_measured_from_its_fn_line_to_its_closing_brace() {
    let src = "trait T { fn decl(&self); }\nfn outer(x: [u8; 2]) -> u8 {\n    let s = \"}\";\n    // }\n    fn inner() {\n    }\n    x[0]\n}\n";
    let file = SourceFile::parse("src/k.rs", src, &[]);
    let fns: Vec<(String, usize, usize)> = file
        .functions()
        .into_iter()
        .map(|f| (f.name, f.line, f.lines))
        .collect();
    assert_eq!(fns, vec![("outer".into(), 2, 7), ("inner".into(), 5, 2)]);
}

#[test]
fn doc_path_candidates_skip_urls_globs_placeholders_code_blocks_and_absolute_paths() {
    let md = "See `src/a.rs:12`, `docs/x.md#part`, [b](../b/c.md), `scripts/t.sh --fast`.\n\
              Not `https://x.io/a`, `/etc/redis.conf`, `src/*.lua`, `rq:lock:<name>`, `a b/c`, `1/3`.\n\
              ```\nsrc/in_block.rs\n`src/in_block.rs`\n```\n";
    let paths: Vec<(String, usize)> = named_paths(md)
        .into_iter()
        .map(|n| (n.path, n.line))
        .collect();
    let want = [
        ("src/a.rs", 1),
        ("docs/x.md", 1),
        ("scripts/t.sh", 1),
        ("../b/c.md", 1),
    ];
    let want: Vec<(String, usize)> = want.iter().map(|(p, l)| (p.to_string(), *l)).collect();
    assert_eq!(paths, want);
}

// ----------------------------------------------------------------------------------------------
// Reports.
// ----------------------------------------------------------------------------------------------

const CYCLE_FIX: &str = "How to fix a cycle: make the dependency one-way. Move what both sides \
    need into the lower module (or a new leaf module both can use), or pass it in (an argument, \
    a trait, a callback) instead of naming the higher module. Each reference below is a place \
    where one module names another.";

const PURE_FIX: &str = "A pure core decides from values passed in; the caller does the I/O, \
    reads the clock and draws the randomness. Do not weaken the rule: move the offending code \
    to the I/O layer that calls the core.";

fn report(what: &str, problems: &[String], advice: &str) -> String {
    let mut out = format!("\n{} {what}:\n\n", problems.len());
    for p in problems {
        let _ = writeln!(out, "{p}\n");
    }
    if !advice.is_empty() {
        let _ = writeln!(out, "{advice}");
    }
    out
}

// ----------------------------------------------------------------------------------------------
// Reading files.
// ----------------------------------------------------------------------------------------------

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(root().join(rel)).unwrap_or_else(|e| panic!("{rel}: cannot read: {e}"))
}

/// The `.rs` files under `dir` (relative to the repository), sorted, as repository paths.
fn rust_files(dir: &str) -> Vec<String> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    let base = root();
    let mut files = Vec::new();
    walk(&base.join(dir), &mut files);
    let mut rels: Vec<String> = files
        .iter()
        .filter_map(|p| p.strip_prefix(&base).ok())
        .map(|p| p.to_string_lossy().replace('\\', "/"))
        .collect();
    rels.sort();
    rels
}

/// The text of a file's leading `//!` lines.
fn module_doc(text: &str) -> String {
    text.lines()
        .map(str::trim_start)
        .take_while(|l| l.starts_with("//!") || l.is_empty())
        .filter_map(|l| l.strip_prefix("//!"))
        .collect::<Vec<_>>()
        .join("\n")
}

// ----------------------------------------------------------------------------------------------
// Rust source as the checks see it.
// ----------------------------------------------------------------------------------------------

fn is_ident_char(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// `src` with every comment (doc comments included), string literal (raw, byte and C strings
/// included) and char literal replaced by spaces; newlines are kept, so lines and columns stay.
fn blank_comments_and_literals(src: &str) -> Vec<char> {
    let s: Vec<char> = src.chars().collect();
    let mut out = s.clone();
    let mut i = 0;
    while i < s.len() {
        match comment_or_literal_end(&s, i) {
            Some(end) => {
                let end = end.min(s.len());
                for c in &mut out[i..end] {
                    if *c != '\n' {
                        *c = ' ';
                    }
                }
                i = end;
            }
            None => i += 1,
        }
    }
    out
}

/// The index just past the comment or literal that starts at `i`, if one does.
fn comment_or_literal_end(s: &[char], i: usize) -> Option<usize> {
    let at = |i: usize| s.get(i).copied().unwrap_or('\0');
    let after_ident = i > 0 && is_ident_char(s[i - 1]);
    match (at(i), at(i + 1)) {
        ('/', '/') => Some(
            s[i..]
                .iter()
                .position(|&c| c == '\n')
                .map_or(s.len(), |p| i + p),
        ),
        ('/', '*') => Some(block_comment_end(s, i)),
        ('r', _) if !after_ident => raw_string_end(s, i + 1),
        ('b' | 'c', 'r') if !after_ident => raw_string_end(s, i + 2),
        ('"', _) => {
            let mut k = i + 1;
            while k < s.len() && s[k] != '"' {
                k += if s[k] == '\\' { 2 } else { 1 };
            }
            Some(k + 1)
        }
        ('\'', '\\') => Some(
            s.get(i + 3..)
                .unwrap_or_default()
                .iter()
                .position(|&c| c == '\'')
                .map_or(s.len(), |p| i + 4 + p),
        ),
        // `'x'` is a char; `'a` (no closing quote after one char) a lifetime or a label.
        ('\'', _) if at(i + 2) == '\'' => Some(i + 3),
        _ => None,
    }
}

/// The index just past the (nested) block comment starting at `i`.
fn block_comment_end(s: &[char], i: usize) -> usize {
    let (mut depth, mut j) = (0usize, i);
    while j + 1 < s.len() {
        match (s[j], s[j + 1]) {
            ('/', '*') => {
                depth += 1;
                j += 2;
            }
            ('*', '/') => {
                depth -= 1;
                j += 2;
                if depth == 0 {
                    return j;
                }
            }
            _ => j += 1,
        }
    }
    s.len()
}

/// After a raw string's `r` (at `j`): the index just past `#*"..."#*`, if that is what follows.
fn raw_string_end(s: &[char], mut j: usize) -> Option<usize> {
    let hashes = s[j.min(s.len())..]
        .iter()
        .take_while(|&&c| c == '#')
        .count();
    j += hashes;
    if s.get(j) != Some(&'"') {
        return None; // A raw identifier (`r#type`) or a plain identifier.
    }
    let closes = |k: usize| s[k] == '"' && (1..=hashes).all(|h| s.get(k + h) == Some(&'#'));
    Some(
        (j + 1..s.len())
            .find(|&k| closes(k))
            .map_or(s.len(), |k| k + 1 + hashes),
    )
}

/// The char index just past the item that starts at or after `from` (skipping attributes):
/// its closing brace, or its `;` when it has no body. `None` if it never closes.
fn item_end(code: &[char], from: usize) -> Option<usize> {
    let mut i = from;
    let (mut paren, mut bracket) = (0i64, 0i64);
    while i < code.len() {
        match code[i] {
            '(' => paren += 1,
            ')' => paren -= 1,
            '[' => bracket += 1,
            ']' => bracket -= 1,
            ';' if paren == 0 && bracket == 0 => return Some(i + 1),
            '{' if paren == 0 && bracket == 0 => return matching_brace(code, i).map(|e| e + 1),
            _ => {}
        }
        i += 1;
    }
    None
}

/// The index of the `}` that closes the `{` at `open`.
fn matching_brace(code: &[char], open: usize) -> Option<usize> {
    let mut depth = 0i64;
    for (i, &c) in code.iter().enumerate().skip(open) {
        if c == '{' {
            depth += 1;
        } else if c == '}' {
            depth -= 1;
            if depth == 0 {
                return Some(i);
            }
        }
    }
    None
}

/// A token of blanked code: an identifier (or number), `::`, or one punctuation char.
#[derive(Debug)]
struct Tok {
    text: String,
    pos: usize,
}

fn tokens(code: &[char]) -> Vec<Tok> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < code.len() {
        let c = code[i];
        if c.is_whitespace() {
            i += 1;
        } else if is_ident_char(c) {
            let start = i;
            while i < code.len() && is_ident_char(code[i]) {
                i += 1;
            }
            out.push(Tok {
                text: code[start..i].iter().collect(),
                pos: start,
            });
        } else if c == ':' && code.get(i + 1) == Some(&':') {
            out.push(Tok {
                text: "::".into(),
                pos: i,
            });
            i += 2;
        } else {
            out.push(Tok {
                text: c.to_string(),
                pos: i,
            });
            i += 1;
        }
    }
    out
}

fn is_ident(s: &str) -> bool {
    s.chars()
        .next()
        .is_some_and(|c| c.is_alphabetic() || c == '_')
}

/// One path of a `use` tree or of an expression, as written.
#[derive(Debug)]
struct Leaf {
    segs: Vec<String>,
    alias: Option<String>,
    pos: usize,
}

/// Parses the path or use tree at `t[i..]`, appending its leaves; returns the index after it.
/// `a::b::{c, d::{self, e}, f::*}` gives `a::b::c`, `a::b::d`, `a::b::d::e`, `a::b::f`.
fn parse_tree(t: &[Tok], mut i: usize, prefix: &[String], leaves: &mut Vec<Leaf>) -> usize {
    let text = |i: usize| t.get(i).map_or("", |x| x.text.as_str());
    let mut segs = prefix.to_vec();
    if text(i) == "::" {
        i += 1;
    }
    loop {
        match text(i) {
            "{" => {
                i += 1;
                loop {
                    match text(i) {
                        "" => return i,
                        "}" => return i + 1,
                        "," => i += 1,
                        _ => {
                            let next = parse_tree(t, i, &segs, leaves);
                            i = if next == i { i + 1 } else { next };
                        }
                    }
                }
            }
            "*" => {
                leaves.push(Leaf {
                    segs,
                    alias: None,
                    pos: t[i].pos,
                });
                return i + 1;
            }
            s if is_ident(s) => {
                let pos = t[i].pos;
                if s != "self" || segs.is_empty() {
                    segs.push(s.to_string());
                }
                i += 1;
                if text(i) == "::" && (is_ident(text(i + 1)) || matches!(text(i + 1), "{" | "*")) {
                    i += 1;
                    continue;
                }
                let mut alias = None;
                if text(i) == "as" && is_ident(text(i + 1)) {
                    alias = Some(text(i + 1).to_string());
                    i += 2;
                }
                leaves.push(Leaf { segs, alias, pos });
                return i;
            }
            _ => return i,
        }
    }
}

/// A reference from one module to another: where, and the absolute module path it names.
#[derive(Debug)]
struct Ref {
    line: usize,
    abs: Vec<String>,
    written: String,
    in_pub_use: bool,
}

/// A Rust file: its repository path, module path and blanked non-test code.
struct SourceFile {
    rel: String,
    module: Vec<String>,
    /// Comments, literals and test code blanked.
    code: Vec<char>,
    line_starts: Vec<usize>,
    test_lines: BTreeSet<usize>,
    total_lines: usize,
}

impl SourceFile {
    fn read(rel: &str, module: &[String]) -> Option<SourceFile> {
        let text = std::fs::read_to_string(root().join(rel)).ok()?;
        Some(SourceFile::parse(rel, &text, module))
    }

    fn parse(rel: &str, text: &str, module: &[String]) -> SourceFile {
        let mut code = blank_comments_and_literals(text);
        let mut line_starts = vec![0];
        line_starts.extend(
            code.iter()
                .enumerate()
                .filter(|(_, &c)| c == '\n')
                .map(|(i, _)| i + 1),
        );
        let line_of = |pos: usize| line_starts.partition_point(|&s| s <= pos);
        let mut test_lines = BTreeSet::new();
        let flat: String = code.iter().collect();
        for marker in ["#[cfg(test)]", "#[cfg(all(test"] {
            for (byte, _) in flat.match_indices(marker) {
                let start = flat[..byte].chars().count();
                let Some(attr_end) = bracket_end(&code, start + 1) else {
                    continue;
                };
                let Some(end) = item_end_after_attributes(&code, attr_end) else {
                    continue;
                };
                test_lines.extend(line_of(start)..=line_of(end.saturating_sub(1)));
            }
        }
        for &line in &test_lines {
            let from = line_starts.get(line - 1).copied().unwrap_or(code.len());
            let to = line_starts.get(line).copied().unwrap_or(code.len());
            for c in &mut code[from..to] {
                if *c != '\n' {
                    *c = ' ';
                }
            }
        }
        SourceFile {
            rel: rel.to_string(),
            module: module.to_vec(),
            code,
            total_lines: text.lines().count(),
            line_starts,
            test_lines,
        }
    }

    fn line_of(&self, pos: usize) -> usize {
        self.line_starts.partition_point(|&s| s <= pos)
    }

    fn non_test_lines(&self) -> usize {
        self.total_lines
            - self
                .test_lines
                .iter()
                .filter(|&&l| l <= self.total_lines)
                .count()
    }

    /// Every `crate::`, `super::` and `self::` path of the non-test code, `use` trees
    /// expanded, resolved against this file's module path.
    fn references(&self) -> Vec<Ref> {
        let t = tokens(&self.code);
        let text = |i: usize| t.get(i).map_or("", |x| x.text.as_str());
        let mut refs = Vec::new();
        let mut i = 0;
        while i < t.len() {
            let is_use = text(i) == "use";
            let is_path = matches!(text(i), "crate" | "super" | "self")
                && text(i + 1) == "::"
                && (i == 0 || text(i - 1) != "::");
            if !is_use && !is_path {
                i += 1;
                continue;
            }
            let in_pub_use = is_use
                && i > 0
                && (text(i - 1) == "pub" || (text(i - 1) == ")" && i >= 4 && text(i - 4) == "pub"));
            let mut leaves = Vec::new();
            let end = parse_tree(&t, if is_use { i + 1 } else { i }, &[], &mut leaves);
            for leaf in leaves {
                if let Some(abs) = resolve(&self.module, &leaf.segs) {
                    refs.push(Ref {
                        line: self.line_of(leaf.pos),
                        abs,
                        written: leaf.segs.join("::"),
                        in_pub_use,
                    });
                }
            }
            i = end.max(i + 1);
        }
        refs
    }

    /// Every function of the non-test code with a body.
    fn functions(&self) -> Vec<FnSize> {
        let t = tokens(&self.code);
        let mut out = Vec::new();
        for w in t.windows(2) {
            if w[0].text != "fn" || !is_ident(&w[1].text) {
                continue;
            }
            let Some(end) = item_end(&self.code, w[1].pos) else {
                continue;
            };
            if self.code[end - 1] != '}' {
                continue; // A declaration without a body.
            }
            let line = self.line_of(w[0].pos);
            out.push(FnSize {
                name: w[1].text.clone(),
                line,
                lines: self.line_of(end - 1) - line + 1,
            });
        }
        out
    }
}

/// The index just past the `]` closing the `[` at `open`.
fn bracket_end(code: &[char], open: usize) -> Option<usize> {
    let mut depth = 0i64;
    for (i, &c) in code.iter().enumerate().skip(open) {
        match c {
            '[' => depth += 1,
            ']' => {
                depth -= 1;
                if depth == 0 {
                    return Some(i + 1);
                }
            }
            _ => {}
        }
    }
    None
}

/// The end of the item after `from`, skipping further attributes.
fn item_end_after_attributes(code: &[char], mut from: usize) -> Option<usize> {
    loop {
        while code.get(from).is_some_and(|c| c.is_whitespace()) {
            from += 1;
        }
        if code.get(from) == Some(&'#') && code.get(from + 1) == Some(&'[') {
            from = bracket_end(code, from + 1)?;
        } else {
            return item_end(code, from);
        }
    }
}

/// The absolute module path of a `crate::`/`super::`/`self::` path written in `module`; `None`
/// for other paths (external crates, paths relative to the current module).
fn resolve(module: &[String], segs: &[String]) -> Option<Vec<String>> {
    let (head, rest) = segs.split_first()?;
    let mut abs: Vec<String> = match head.as_str() {
        "crate" => Vec::new(),
        "self" => module.to_vec(),
        "super" => module[..module.len().saturating_sub(1)].to_vec(),
        _ => return None,
    };
    for s in rest {
        match s.as_str() {
            "super" => {
                abs.pop();
            }
            "self" => {}
            _ => abs.push(s.clone()),
        }
    }
    Some(abs)
}

// ----------------------------------------------------------------------------------------------
// Module graphs and their cycles.
// ----------------------------------------------------------------------------------------------

#[derive(Clone, Debug)]
struct Site {
    file: String,
    line: usize,
    written: String,
}

/// Edges between nodes, each with the places that make it.
#[derive(Default)]
struct Graph {
    edges: BTreeMap<String, BTreeMap<String, Vec<Site>>>,
}

impl Graph {
    fn new() -> Graph {
        Graph::default()
    }

    fn add(&mut self, from: &str, to: &str, site: Site) {
        if from != to {
            self.edges
                .entry(from.into())
                .or_default()
                .entry(to.into())
                .or_default()
                .push(site);
        }
    }

    fn nodes(&self) -> BTreeSet<&str> {
        self.edges
            .iter()
            .flat_map(|(f, tos)| std::iter::once(f.as_str()).chain(tos.keys().map(String::as_str)))
            .collect()
    }

    fn successors(&self, node: &str) -> impl Iterator<Item = &str> {
        self.edges
            .get(node)
            .into_iter()
            .flat_map(|tos| tos.keys().map(String::as_str))
    }
}

/// The strongly connected components of more than one node (Tarjan's algorithm).
fn components(graph: &Graph) -> Vec<Vec<String>> {
    struct State<'g> {
        graph: &'g Graph,
        index: BTreeMap<&'g str, usize>,
        low: BTreeMap<&'g str, usize>,
        stack: Vec<&'g str>,
        on_stack: BTreeSet<&'g str>,
        out: Vec<Vec<String>>,
    }
    fn visit<'g>(s: &mut State<'g>, v: &'g str) {
        let n = s.index.len();
        s.index.insert(v, n);
        s.low.insert(v, n);
        s.stack.push(v);
        s.on_stack.insert(v);
        let graph = s.graph;
        for w in graph.successors(v) {
            if !s.index.contains_key(w) {
                visit(s, w);
                let low = s.low[v].min(s.low[w]);
                s.low.insert(v, low);
            } else if s.on_stack.contains(w) {
                let low = s.low[v].min(s.index[w]);
                s.low.insert(v, low);
            }
        }
        if s.low[v] == s.index[v] {
            let mut component = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack.remove(w);
                component.push(w.to_string());
                if w == v {
                    break;
                }
            }
            if component.len() > 1 {
                component.sort();
                s.out.push(component);
            }
        }
    }
    let mut s = State {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in graph.nodes() {
        if !s.index.contains_key(v) {
            visit(&mut s, v);
        }
    }
    s.out.sort();
    s.out
}

/// A shortest cycle through `start` inside `component`, as `a -> b -> a`.
fn one_cycle(graph: &Graph, component: &BTreeSet<&str>, start: &str) -> String {
    let mut parent: BTreeMap<&str, &str> = BTreeMap::new();
    let mut queue = VecDeque::from([start]);
    while let Some(v) = queue.pop_front() {
        for w in graph.successors(v).filter(|w| component.contains(w)) {
            if w == start {
                let mut path = vec![v];
                let mut at = v;
                while let Some(&p) = parent.get(at) {
                    path.push(p);
                    at = p;
                }
                path.reverse();
                path.push(start);
                return path.join(" -> ");
            }
            if !parent.contains_key(w) {
                parent.insert(w, v);
                queue.push_back(w);
            }
        }
    }
    start.to_string()
}

/// One message per cycle (strongly connected component) of `graph`, with every edge inside it
/// and the file:line of each reference that makes the edge.
fn cycles_in(scope: &str, graph: &Graph) -> Vec<String> {
    const SITES_SHOWN: usize = 8;
    let mut out = Vec::new();
    for component in components(graph) {
        let members: BTreeSet<&str> = component.iter().map(String::as_str).collect();
        let mut msg = format!(
            "cycle in {scope} among {{{}}}, e.g. {}\n",
            component.join(", "),
            one_cycle(graph, &members, &component[0])
        );
        for from in &component {
            let Some(tos) = graph.edges.get(from) else {
                continue;
            };
            for (to, sites) in tos.iter().filter(|(to, _)| members.contains(to.as_str())) {
                let _ = writeln!(msg, "  {from} -> {to} ({} references):", sites.len());
                for site in sites.iter().take(SITES_SHOWN) {
                    let _ = writeln!(msg, "    {}:{}: `{}`", site.file, site.line, site.written);
                }
                if sites.len() > SITES_SHOWN {
                    let _ = writeln!(msg, "    ... and {} more", sites.len() - SITES_SHOWN);
                }
            }
        }
        out.push(msg);
    }
    out
}

/// A crate's source files and how their references form module graphs.
struct Crate {
    dir: String,
    root_file: String,
    files: Vec<SourceFile>,
}

impl Crate {
    /// `dir` is the crate's source folder (`src`), `root_file` its root (`lib.rs`).
    fn load(dir: &str, root_file: &str) -> Crate {
        let files = rust_files(dir)
            .into_iter()
            .map(|rel| {
                let inner = rel[dir.len() + 1..].trim_end_matches(".rs").to_string();
                let mut module: Vec<String> = inner.split('/').map(String::from).collect();
                if module.last().is_some_and(|m| m == "mod")
                    || inner == root_file.trim_end_matches(".rs")
                {
                    module.pop();
                }
                SourceFile::read(&rel, &module).expect("listed file reads")
            })
            .collect();
        Crate {
            dir: dir.into(),
            root_file: root_file.into(),
            files,
        }
    }

    fn root_label(&self) -> String {
        format!("(crate root {})", self.root_file)
    }

    fn is_root(&self, file: &SourceFile) -> bool {
        file.module.is_empty()
    }

    /// The top-level module names.
    fn top_modules(&self) -> BTreeSet<String> {
        self.files
            .iter()
            .filter_map(|f| f.module.first().cloned())
            .collect()
    }

    /// Names the crate root re-exports (`pub use config::{Config, ...}`), to their paths.
    fn root_names(&self) -> BTreeMap<String, Vec<String>> {
        let mut names = BTreeMap::new();
        let Some(root) = self.files.iter().find(|f| self.is_root(f)) else {
            return names;
        };
        let t = tokens(&root.code);
        for (i, tok) in t.iter().enumerate() {
            if tok.text != "use" {
                continue;
            }
            let mut leaves = Vec::new();
            parse_tree(&t, i + 1, &[], &mut leaves);
            for leaf in leaves {
                let mut segs = leaf.segs.clone();
                if segs.first().is_some_and(|s| s == "crate" || s == "self") {
                    segs.remove(0);
                }
                if let Some(name) = leaf.alias.clone().or_else(|| segs.last().cloned()) {
                    names.insert(name, segs);
                }
            }
        }
        names
    }

    /// `abs` with a first segment the crate root re-exports replaced by the path it names
    /// (`crate::Error` is `crate::error::Error`).
    fn canonical(
        &self,
        abs: &[String],
        modules: &BTreeSet<String>,
        names: &BTreeMap<String, Vec<String>>,
    ) -> Vec<String> {
        let mut abs = abs.to_vec();
        for _ in 0..4 {
            let Some(first) = abs.first() else { break };
            if modules.contains(first) {
                break;
            }
            match names.get(first) {
                Some(target) if target.first() != Some(first) => {
                    abs = target.iter().chain(abs.iter().skip(1)).cloned().collect();
                }
                _ => break,
            }
        }
        abs
    }

    /// The top-level module an absolute path lands in (the crate root for the root's own items).
    fn top_of(
        &self,
        abs: &[String],
        modules: &BTreeSet<String>,
        names: &BTreeMap<String, Vec<String>>,
    ) -> String {
        match self.canonical(abs, modules, names).first() {
            Some(first) if modules.contains(first) => first.clone(),
            _ => self.root_label(),
        }
    }

    /// The graph of references between top-level modules. The root's `pub use` lines are its
    /// public face, not dependencies, and are left out.
    fn top_graph(&self) -> Graph {
        let modules = self.top_modules();
        let names = self.root_names();
        let mut graph = Graph::new();
        for file in &self.files {
            let from = file
                .module
                .first()
                .cloned()
                .unwrap_or_else(|| self.root_label());
            for r in file.references() {
                if self.is_root(file) && r.in_pub_use {
                    continue;
                }
                let to = self.top_of(&r.abs, &modules, &names);
                graph.add(
                    &from,
                    &to,
                    Site {
                        file: file.rel.clone(),
                        line: r.line,
                        written: r.written,
                    },
                );
            }
        }
        graph
    }

    /// The module paths of the crate's folders (`["membership"]`, `["membership", "group"]`).
    fn folders(&self) -> BTreeSet<Vec<String>> {
        let mut folders = BTreeSet::new();
        for file in &self.files {
            let inner = &file.rel[self.dir.len() + 1..];
            let parts: Vec<&str> = inner.split('/').collect();
            for depth in 1..parts.len() {
                folders.insert(parts[..depth].iter().map(|s| s.to_string()).collect());
            }
        }
        folders
    }

    /// The graph of references between the files of the folder `folder`: its children
    /// (`decide`, `group`) and the folder's own module file (`mod.rs`).
    fn folder_graph(&self, folder: &[String]) -> Graph {
        let inside = |m: &[String]| m.len() >= folder.len() && m[..folder.len()] == *folder;
        let children: BTreeSet<&String> = self
            .files
            .iter()
            .filter(|f| f.module.len() > folder.len() && inside(&f.module))
            .map(|f| &f.module[folder.len()])
            .collect();
        let own = self
            .files
            .iter()
            .find(|f| f.module == folder)
            .map_or("mod.rs".to_string(), |f| {
                f.rel.rsplit('/').next().unwrap_or("mod.rs").to_string()
            });
        let node = |m: &[String]| {
            if m.len() > folder.len() && children.contains(&m[folder.len()]) {
                m[folder.len()].clone()
            } else {
                own.clone()
            }
        };
        let (modules, names) = (self.top_modules(), self.root_names());
        let mut graph = Graph::new();
        for file in self.files.iter().filter(|f| inside(&f.module)) {
            let from = node(&file.module);
            for r in file.references() {
                let abs = self.canonical(&r.abs, &modules, &names);
                if inside(&abs) {
                    graph.add(
                        &from,
                        &node(&abs),
                        Site {
                            file: file.rel.clone(),
                            line: r.line,
                            written: r.written,
                        },
                    );
                }
            }
        }
        graph
    }

    fn folder_cycles(&self) -> Vec<String> {
        let mut out = Vec::new();
        for folder in self.folders() {
            let scope = format!("the files of {}/{}/", self.dir, folder.join("/"));
            out.extend(cycles_in(&scope, &self.folder_graph(&folder)));
        }
        out
    }
}

// ----------------------------------------------------------------------------------------------
// Pure cores.
// ----------------------------------------------------------------------------------------------

fn impurities(file: &SourceFile) -> Vec<String> {
    let mut out = Vec::new();
    let code: String = file.code.iter().collect();
    let raw = std::fs::read_to_string(root().join(&file.rel)).unwrap_or_default();
    let raw_lines: Vec<&str> = raw.lines().collect();
    for (n, line) in code.lines().enumerate() {
        let hit = NOT_IN_PURE_CORES
            .iter()
            .find(|(pattern, _)| mentions(line, pattern));
        if let Some((pattern, fix)) = hit {
            out.push(format!(
                "{}:{}: a pure core mentions `{pattern}`: `{}`. Fix: {fix}.",
                file.rel,
                n + 1,
                raw_lines.get(n).map_or("", |l| l.trim())
            ));
        }
    }
    for r in file.references() {
        if IO_MODULES.iter().any(|m| {
            r.abs.len() >= m.len() && r.abs[..m.len()].iter().zip(m.iter()).all(|(a, b)| a == b)
        }) {
            out.push(format!(
                "{}:{}: a pure core references the I/O module `crate::{}` (`{}`). Fix: let the caller \
                 talk to the nodes and pass the values in.",
                file.rel,
                r.line,
                r.abs.join("::"),
                r.written
            ));
        }
    }
    out
}

/// Whether `line` contains `pattern` as a word (no identifier character just before a pattern
/// that starts with one, nor just after one that ends with one).
fn mentions(line: &str, pattern: &str) -> bool {
    let starts_ident = pattern.chars().next().is_some_and(is_ident_char);
    let ends_ident = pattern.chars().last().is_some_and(is_ident_char);
    line.match_indices(pattern).any(|(at, _)| {
        let before = line[..at].chars().last();
        let after = line[at + pattern.len()..].chars().next();
        let glued_before = starts_ident && before.is_some_and(is_ident_char);
        let glued_after = ends_ident && after.is_some_and(is_ident_char);
        !glued_before && !glued_after
    })
}

// ----------------------------------------------------------------------------------------------
// Sizes.
// ----------------------------------------------------------------------------------------------

#[derive(Clone, Debug)]
struct FnSize {
    name: String,
    line: usize,
    lines: usize,
}

struct Sizes {
    /// `(file, fn name)` -> the longest function of that name in the file.
    fns: BTreeMap<(String, String), FnSize>,
    /// file -> non-test lines.
    files: BTreeMap<String, usize>,
}

impl Sizes {
    fn measure() -> Sizes {
        let mut fns: BTreeMap<(String, String), FnSize> = BTreeMap::new();
        let mut files = BTreeMap::new();
        for dir in SIZE_ROOTS {
            for rel in rust_files(dir) {
                let Some(file) = SourceFile::read(&rel, &[]) else {
                    continue;
                };
                files.insert(rel.clone(), file.non_test_lines());
                for f in file.functions() {
                    let key = (rel.clone(), f.name.clone());
                    if fns.get(&key).is_none_or(|old| old.lines < f.lines) {
                        fns.insert(key, f);
                    }
                }
            }
        }
        Sizes { fns, files }
    }

    fn regenerated_fn_allow(&self) -> String {
        let mut out = String::from(
            "\nFN_ALLOW as today's sources would have it (replace the const's entries with these \
             only once the functions that can be split are split; the list only shrinks):\n",
        );
        for ((file, name), f) in &self.fns {
            if f.lines > MAX_FN_LINES {
                let _ = writeln!(out, "    (\"{file}\", \"{name}\", {}),", f.lines);
            }
        }
        out
    }

    fn regenerated_file_allow(&self) -> String {
        let mut out = String::from("\nFILE_ALLOW as today's sources would have it:\n");
        for (file, lines) in &self.files {
            if *lines > MAX_FILE_LINES {
                let _ = writeln!(out, "    (\"{file}\", {lines}),");
            }
        }
        out
    }
}

// ----------------------------------------------------------------------------------------------
// Paths named by the docs.
// ----------------------------------------------------------------------------------------------

/// The documents to check, `(repository path, Markdown text)`; the `//!` docs of
/// `src/**/mod.rs` as Markdown with their line numbers kept.
fn documents() -> Vec<(String, String)> {
    let mut docs: Vec<(String, String)> = DOCS.iter().map(|d| (d.to_string(), read(d))).collect();
    let mut markdown = Vec::new();
    collect_files(&root().join("docs"), "md", &mut markdown);
    markdown.sort();
    for rel in markdown {
        let text = read(&rel);
        docs.push((rel, text));
    }
    for rel in rust_files("src")
        .into_iter()
        .filter(|r| r.ends_with("/mod.rs"))
    {
        let text: Vec<String> = read(&rel)
            .lines()
            .map(|l| {
                l.trim_start()
                    .strip_prefix("//!")
                    .map_or(String::new(), |d| d.to_string())
            })
            .collect();
        docs.push((rel, text.join("\n")));
    }
    docs
}

fn collect_files(dir: &Path, ext: &str, out: &mut Vec<String>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            collect_files(&path, ext, out);
        } else if path.extension().is_some_and(|e| e == ext) {
            if let Ok(rel) = path.strip_prefix(root()) {
                out.push(rel.to_string_lossy().replace('\\', "/"));
            }
        }
    }
}

#[derive(Debug)]
struct NamedPath {
    line: usize,
    /// As written in the doc.
    written: String,
    /// Without `./`, a trailing `/`, `:line` or `#anchor`.
    path: String,
}

/// The repository paths a Markdown text names: in inline code (the whole span, or the first
/// word of a command such as `scripts/bench.sh ids`) and as link targets. Fenced code blocks
/// are examples (generated files, server paths) and are left out.
fn named_paths(markdown: &str) -> Vec<NamedPath> {
    let (spans, links) = spans_and_links(&without_fenced_blocks(markdown));
    let mut out = Vec::new();
    for (line, content) in spans {
        // A span of several words names a path only as a command: `scripts/bench.sh ids`.
        let mut words = content.split_whitespace();
        let word = words.next().unwrap_or("");
        if words.next().is_some() && !PATH_EXTENSIONS.iter().any(|e| word.ends_with(e)) {
            continue;
        }
        if let Some(path) = path_candidate(word, false) {
            out.push(NamedPath {
                line,
                written: content.trim().to_string(),
                path,
            });
        }
    }
    for (line, target) in links {
        if let Some(path) = path_candidate(&target, true) {
            out.push(NamedPath {
                line,
                written: target,
                path,
            });
        }
    }
    out
}

/// `markdown` with the lines of fenced code blocks emptied (line numbers kept).
fn without_fenced_blocks(markdown: &str) -> String {
    let mut fenced = false;
    let lines: Vec<&str> = markdown
        .lines()
        .map(|l| {
            let t = l.trim_start();
            if t.starts_with("```") || t.starts_with("~~~") {
                fenced = !fenced;
                ""
            } else if fenced {
                ""
            } else {
                l
            }
        })
        .collect();
    lines.join("\n")
}

/// The inline code spans and the link targets of `text`, each with its line.
#[allow(clippy::type_complexity)]
fn spans_and_links(text: &str) -> (Vec<(usize, String)>, Vec<(usize, String)>) {
    let chars: Vec<char> = text.chars().collect();
    let newlines: Vec<usize> = (0..chars.len()).filter(|&i| chars[i] == '\n').collect();
    let line_at = |i: usize| newlines.partition_point(|&n| n < i) + 1;
    let run_at = |i: usize| chars[i..].iter().take_while(|&&c| c == '`').count();
    let (mut spans, mut links) = (Vec::new(), Vec::new());
    let mut i = 0;
    while i < chars.len() {
        if chars[i] == '`' {
            // A span opens with a run of backticks and closes with a run of the same length.
            let run = run_at(i);
            let mut j = i + run;
            while j < chars.len() && !(chars[j] == '`' && run_at(j) == run) {
                j += if chars[j] == '`' { run_at(j) } else { 1 };
            }
            if j < chars.len() {
                spans.push((line_at(i), chars[i + run..j].iter().collect()));
                i = j + run;
            } else {
                i += run;
            }
            continue;
        }
        if chars[i] == ']' && chars.get(i + 1) == Some(&'(') {
            if let Some(len) = chars[i + 2..].iter().position(|&c| c == ')' || c == '\n') {
                let target: String = chars[i + 2..i + 2 + len].iter().collect();
                let target = target.split_whitespace().next().unwrap_or("");
                links.push((line_at(i), target.trim_matches(['<', '>']).to_string()));
            }
        }
        i += 1;
    }
    (spans, links)
}

/// The repository path `word` names, if it looks like one. A link target needs no `/` or
/// extension to count.
fn path_candidate(word: &str, link: bool) -> Option<String> {
    if word.is_empty() || word.contains("://") || word.starts_with("mailto:") || word.contains("::")
    {
        return None;
    }
    if word.starts_with(['/', '#', '~', '-', '$']) {
        return None;
    }
    if !word
        .chars()
        .all(|c| c.is_alphanumeric() || "_-./@+:#".contains(c))
    {
        return None; // `*`, `<`, `{`, `=`, ...: a pattern or a placeholder, not a path.
    }
    let mut path = word.split('#').next().unwrap_or("");
    // A `:line` or `:line:column` suffix.
    while let Some((head, tail)) = path.rsplit_once(':') {
        if tail.is_empty() || !tail.chars().all(|c| c.is_ascii_digit() || c == '-') {
            break;
        }
        path = head;
    }
    if path.contains(':') {
        return None;
    }
    let path = path.trim_start_matches("./").trim_end_matches('/');
    if path.is_empty() || !path.chars().any(char::is_alphabetic) {
        return None;
    }
    let named = link || word.contains('/') || PATH_EXTENSIONS.iter().any(|e| path.ends_with(e));
    named.then(|| path.to_string())
}

/// Every file and folder of the repository (without `.git` and build output).
struct RepoIndex {
    paths: BTreeSet<String>,
    top: BTreeSet<String>,
}

impl RepoIndex {
    fn build() -> RepoIndex {
        fn walk(dir: &Path, base: &Path, out: &mut BTreeSet<String>) {
            let Ok(entries) = std::fs::read_dir(dir) else {
                return;
            };
            for entry in entries.flatten() {
                let path = entry.path();
                let name = entry.file_name().to_string_lossy().to_string();
                if matches!(
                    name.as_str(),
                    ".git" | "target" | "node_modules" | "__pycache__" | ".venv"
                ) {
                    continue;
                }
                if let Ok(rel) = path.strip_prefix(base) {
                    out.insert(rel.to_string_lossy().replace('\\', "/"));
                }
                if path.is_dir() {
                    walk(&path, base, out);
                }
            }
        }
        let base = root();
        let mut paths = BTreeSet::new();
        walk(&base, &base, &mut paths);
        let top = paths.iter().filter(|p| !p.contains('/')).cloned().collect();
        RepoIndex { paths, top }
    }

    /// Whether `path` exists: from the repository root, from the doc's own folder, or, for a
    /// path that does not start at a top-level folder (`decide.rs`, `repair/copy.rs`), as the
    /// tail of some repository path.
    fn has(&self, path: &str, doc_dir: &Path) -> bool {
        if root().join(path).exists() || root().join(doc_dir).join(path).exists() {
            return true;
        }
        let first = path.split('/').next().unwrap_or("");
        if self.top.contains(first) || first == ".." {
            return false;
        }
        // `membership/assign` names the module `membership/assign.rs`.
        let no_extension = !path.rsplit('/').next().unwrap_or("").contains('.');
        let tails = [format!("/{path}"), format!("/{path}.rs")];
        self.paths
            .iter()
            .any(|p| p.ends_with(&tails[0]) || (no_extension && p.ends_with(&tails[1])))
    }

    /// Where the file may have gone, from its name.
    fn suggestion(&self, path: &str) -> String {
        let name = path.rsplit('/').next().unwrap_or(path);
        let mut near: Vec<&String> = Vec::new();
        if let Some(stem) = path.strip_suffix(".rs") {
            let folder_form = format!("{stem}/mod.rs");
            near.extend(self.paths.iter().filter(|p| **p == folder_form));
        }
        let tail = format!("/{name}");
        near.extend(
            self.paths
                .iter()
                .filter(|p| p.ends_with(&tail) || **p == name)
                .take(3),
        );
        near.dedup();
        if near.is_empty() {
            String::new()
        } else {
            let list: Vec<String> = near.iter().map(|p| format!("`{p}`")).collect();
            format!(" Perhaps: {}.", list.join(", "))
        }
    }
}

// ----------------------------------------------------------------------------------------------
// Where node I/O happens, and what the scripts may not do.
// ----------------------------------------------------------------------------------------------

/// The files that may talk to a Redis server themselves, and why. Everything else builds a
/// `Request` and its `Step`s and leaves the sending to `Client::send` and the one fan-out.
const NODE_IO_FILES: &[(&str, &str)] = &[
    (
        "src/client/send.rs",
        "sends every Request's steps, each node within its deadline",
    ),
    ("src/node.rs", "opens and probes a node's connection"),
    (
        "src/repair/mod.rs",
        "the repair's copy session, a Step that takes several round trips",
    ),
    (
        "src/repair/page.rs",
        "the repair's copy session: one page read and written",
    ),
    (
        "src/acl.rs",
        "the read-only permission check (asks redis.acl_check_cmd, runs nothing)",
    ),
    (
        "src/fencing.rs",
        "fenced_set writes to the caller's resource, not to a node",
    ),
    (
        "src/lock/holder.rs",
        "the pub/sub hint that wakes a lock's waiters (decides nothing)",
    ),
    (
        "src/membership/group/hints.rs",
        "the pub/sub hint of a sealed view (decides nothing)",
    ),
];

/// What sends a command to a server directly (in code, not comments or strings).
const NODE_IO_CALLS: &[&str] = &[
    "query_async",
    "invoke_async",
    "req_packed_command",
    "get_async_pubsub",
];

#[test]
fn node_io_happens_only_in_the_client_layer_and_the_named_exceptions() {
    let mut broken = Vec::new();
    for rel in rust_files("src") {
        let Some(file) = SourceFile::read(&rel, &[]) else {
            continue;
        };
        if NODE_IO_FILES.iter().any(|(f, _)| *f == rel) {
            continue;
        }
        let code: String = file.code.iter().collect();
        for (n, line) in code.lines().enumerate() {
            if let Some(call) = NODE_IO_CALLS.iter().find(|c| line.contains(*c)) {
                broken.push(format!(
                    "{rel}:{}: `{call}` sends to a server outside the client layer. Fix: build a \
                     Request with Steps and send it with Client::send (one fan-out, per-node \
                     deadlines, the marker guard), or, if this is a new kind of exception, add it \
                     to NODE_IO_FILES with the reason.",
                    n + 1
                ));
            }
        }
    }
    for (rel, why) in NODE_IO_FILES {
        assert!(
            root().join(rel).exists(),
            "{rel} is in NODE_IO_FILES ({why}) but does not exist: update the list"
        );
    }
    assert!(
        broken.is_empty(),
        "{}",
        report("direct node I/O", &broken, "")
    );
}

#[test]
fn no_script_reads_the_nodes_clock_and_expiry_is_set_only_behind_the_test_switch() {
    let mut broken = Vec::new();
    let dir = root().join("src/scripts");
    let mut scripts: Vec<_> = std::fs::read_dir(&dir)
        .expect("src/scripts")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "lua"))
        .collect();
    scripts.sort();
    assert!(
        scripts.len() > 10,
        "the scripts are expected in src/scripts/"
    );
    for path in scripts {
        let name = path
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .to_string();
        let text = std::fs::read_to_string(&path).expect("a script");
        let lines: Vec<&str> = text.lines().collect();
        for (n, line) in lines.iter().enumerate() {
            let code = line.split("--").next().unwrap_or("");
            if code.contains("'TIME'") || code.contains("\"TIME\"") {
                broken.push(format!(
                    "src/scripts/{name}:{}: the script reads the node's wall clock (TIME). Fix: no \
                     safety decision may use a node's clock; pass the client's reading as an \
                     argument, or decide on the client's monotonic clock.",
                    n + 1
                ));
            }
            let expires = ["EXPIRE", "'PX'", "'EX'", "\"PX\"", "\"EX\""]
                .iter()
                .any(|w| code.to_uppercase().contains(w));
            if expires {
                let gate = lines[..n]
                    .iter()
                    .rev()
                    .find(|l| !l.trim().is_empty())
                    .map(|l| l.trim())
                    .unwrap_or("");
                let gated =
                    gate.starts_with("if ") && (gate.contains("'x'") || gate.contains("px > 0"));
                if !gated {
                    broken.push(format!(
                        "src/scripts/{name}:{}: the script sets an expiry outside the test switch's \
                         gate (`{}`). Fix: nothing may rely on a node's clock: a lease ends by the \
                         clients' monotonic clocks (src/lease/); an expiry may only be set under \
                         the test-only argument (the line before must be `if ... == 'x'` or `if px > 0`).",
                        n + 1,
                        line.trim()
                    ));
                }
            }
        }
    }
    assert!(
        broken.is_empty(),
        "{}",
        report("node clocks in scripts", &broken, "")
    );
}

/// The README's quickstarts, in order, and the examples that carry the same text (so
/// `scripts/demo.sh` runs what a newcomer pastes).
const QUICKSTARTS: &[&str] = &[
    "examples/quickstart_ids.rs",
    "examples/quickstart_lock.rs",
    "examples/quickstart_leader.rs",
    "examples/quickstart_job.rs",
    "examples/quickstart_pool.rs",
];

#[test]
fn the_readme_quickstarts_are_the_examples_the_demo_runs() {
    let readme = read("README.md");
    let mut blocks = Vec::new();
    let mut current: Option<String> = None;
    for line in readme.lines() {
        match &mut current {
            None if line.trim_start().starts_with("```rust") => current = Some(String::new()),
            Some(block) if line.trim_start().starts_with("```") => {
                blocks.push(std::mem::take(block));
                current = None;
            }
            Some(block) => {
                block.push_str(line);
                block.push('\n');
            }
            None => {}
        }
    }
    assert_eq!(
        blocks.len(),
        QUICKSTARTS.len(),
        "README.md has {} Rust blocks, QUICKSTARTS in tests/habits.rs names {}: add the example \
         for a new quickstart (or remove the entry of one that went)",
        blocks.len(),
        QUICKSTARTS.len()
    );
    for (block, example) in blocks.iter().zip(QUICKSTARTS) {
        let text = read(example);
        // The example is its `//!` header, a blank line, then the README's block verbatim.
        let body: String = text
            .lines()
            .skip_while(|l| l.starts_with("//!"))
            .skip_while(|l| l.is_empty())
            .map(|l| format!("{l}\n"))
            .collect();
        assert!(
            body == *block,
            "{example} is not the README's quickstart any more. Fix: make the two the same text \
             (the README block is what users paste; the example is what scripts/demo.sh runs).\n\
             README:\n{block}\nexample:\n{body}"
        );
    }
}
