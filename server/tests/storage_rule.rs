//! One rule for reaching storage (docs/architecture.md, "Reaching storage"): routes parse, call
//! a broker operation (`server/src/operations/`) or a read (`server/src/storage_reads.rs`), and
//! render; no route reaches `broker.storage` itself. A new direct call fails here, with where.

#![allow(clippy::expect_used, clippy::unwrap_used)] // test code: a failed expectation is the test failing

use std::path::{Path, PathBuf};

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
        .map(|e| e.expect("dir entry").path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|x| x == "rs") {
            out.push(path);
        }
    }
}

/// Where `text` names a field `storage` (`.storage` not followed by more of an identifier),
/// comments aside.
fn storage_uses(text: &str) -> Vec<(usize, String)> {
    let mut found = vec![];
    for (n, line) in text.lines().enumerate() {
        let code = line.split("//").next().unwrap_or("");
        let mut rest = code;
        while let Some(i) = rest.find(".storage") {
            let after = rest[i + ".storage".len()..].chars().next();
            if !after.is_some_and(|c| c.is_alphanumeric() || c == '_') {
                found.push((n + 1, line.trim().to_string()));
                break;
            }
            rest = &rest[i + 1..];
        }
    }
    found
}

#[test]
fn no_route_reaches_storage_directly() {
    let routes = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/routes");
    let mut files = vec![];
    rust_files(&routes, &mut files);
    assert!(
        files.len() >= 14,
        "found only {files:?}: the scan lost its way"
    );
    let mut offenders = vec![];
    for file in files {
        let text = std::fs::read_to_string(&file).expect("source");
        for (line, code) in storage_uses(&text) {
            offenders.push(format!("{}:{line}: {code}", file.display()));
        }
    }
    assert!(
        offenders.is_empty(),
        "routes call storage directly; go through a broker operation or a read in \
         storage_reads.rs:\n{}",
        offenders.join("\n")
    );
}

#[test]
fn the_scan_finds_a_direct_call() {
    let text = "let x = broker\n    .storage\n    .kv;\nlet y = broker.storage.kv;\n\
                // broker.storage in a comment\nlet z = broker.config.storage_deadline();";
    let found: Vec<usize> = storage_uses(text).into_iter().map(|(n, _)| n).collect();
    assert_eq!(found, vec![2, 4]);
}
