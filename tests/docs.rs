//! The documentation rule, enforced: every public async fn of the library documents its
//! `# Cancel safety`, and `# Errors` when it returns a `Result`. No Redis needed.

use std::path::{Path, PathBuf};

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// `(file:line, fn name, missing sections)` for every public async fn lacking a section.
fn undocumented(src: &Path) -> Vec<(String, String, Vec<&'static str>)> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    files.sort();
    let mut missing = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            let t = line.trim_start();
            let Some(rest) = t.strip_prefix("pub async fn ") else {
                continue;
            };
            let name: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            // The doc comment and attributes above the fn.
            let doc: Vec<&str> = lines[..i]
                .iter()
                .rev()
                .map(|l| l.trim_start())
                .take_while(|l| l.starts_with("///") || l.starts_with("#["))
                .collect();
            // The signature, up to the opening brace.
            let mut signature = String::new();
            for l in &lines[i..] {
                signature.push_str(l);
                signature.push(' ');
                if l.contains('{') {
                    break;
                }
            }
            let signature = signature.split('{').next().unwrap_or_default();
            let has = |section: &str| {
                doc.iter()
                    .any(|l| l.trim_start_matches("///").trim() == section)
            };
            let mut absent = Vec::new();
            if !has("# Cancel safety") {
                absent.push("# Cancel safety");
            }
            if signature.contains("Result<") && !has("# Errors") {
                absent.push("# Errors");
            }
            if !absent.is_empty() {
                missing.push((format!("{}:{}", file.display(), i + 1), name, absent));
            }
        }
    }
    missing
}

#[test]
fn every_public_async_fn_documents_cancel_safety_and_errors() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let missing = undocumented(&src);
    assert!(
        missing.is_empty(),
        "public async fns without the required doc sections:\n{}",
        missing
            .iter()
            .map(|(at, name, absent)| format!("  {at} `{name}`: missing {}", absent.join(", ")))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

#[test]
fn the_docs_checker_notices_a_missing_section() {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(
        dir.path().join("a.rs"),
        "/// Does a thing.\n///\n/// # Cancel safety\n/// Cancel-safe.\npub async fn fine() {}\n\n\
         /// Fails sometimes.\npub async fn bad() -> Result<(), E> {\n}\n",
    )
    .expect("write");
    let missing = undocumented(dir.path());
    assert_eq!(missing.len(), 1, "only `bad` lacks sections: {missing:?}");
    assert_eq!(missing[0].1, "bad");
    assert_eq!(missing[0].2, vec!["# Cancel safety", "# Errors"]);
}
