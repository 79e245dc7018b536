//! Every switch struct (a `pub struct ...Bugs` of the workspace's crates) is one field of the
//! simulation's `Bugs`, so a run can switch it on, and is listed in docs/testing.md's
//! "Switches" section, so a reader finds it. A new struct that misses either fails here.

#![allow(clippy::expect_used, clippy::unwrap_used)] // test code: a failed expectation is the test failing

use std::path::{Path, PathBuf};

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("sim-tests lives in the workspace")
        .to_path_buf()
}

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

/// The names of `pub struct <Name>Bugs` declared in the crates' sources (tests aside).
fn declared_switch_structs() -> Vec<String> {
    let mut files = vec![];
    for krate in ["core", "storage-sim", "storage-pg", "server"] {
        rust_files(&workspace().join(krate).join("src"), &mut files);
    }
    let mut names = vec![];
    for file in files {
        let text = std::fs::read_to_string(&file).expect("source");
        for line in text.lines() {
            let Some(rest) = line.trim_start().strip_prefix("pub struct ") else {
                continue;
            };
            let name: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            if name.ends_with("Bugs") {
                names.push(name);
            }
        }
    }
    names.sort();
    names.dedup();
    names
}

/// The last path segment of each field type of the simulation's `pub struct Bugs { .. }`.
fn fields_of_sim_bugs() -> Vec<String> {
    let text = std::fs::read_to_string(workspace().join("sim-tests/src/sim/mod.rs")).expect("sim");
    let start = text
        .find("pub struct Bugs {")
        .expect("sim/mod.rs declares pub struct Bugs");
    let body = &text[start..start + text[start..].find('}').expect("the struct closes")];
    body.lines()
        .filter_map(|l| l.trim().strip_prefix("pub "))
        .filter_map(|l| l.split_once(':'))
        .map(|(_, ty)| {
            let ty = ty.trim().trim_end_matches(',');
            ty.rsplit("::").next().unwrap_or(ty).to_string()
        })
        .collect()
}

#[test]
fn switch_structs_are_listed() {
    let declared = declared_switch_structs();
    assert!(
        declared.len() >= 7,
        "found only {declared:?}: the scan lost its way"
    );
    let fields = fields_of_sim_bugs();
    let docs = std::fs::read_to_string(workspace().join("docs/testing.md")).expect("docs");
    let section = docs
        .split("## Switches")
        .nth(1)
        .expect("docs/testing.md has a Switches section");
    let section = section.split("\n## ").next().unwrap_or(section);
    for name in &declared {
        assert!(
            fields.contains(name),
            "{name} is not a field of the simulation's Bugs (sim-tests/src/sim/mod.rs): {fields:?}"
        );
        assert!(
            section.contains(&format!("`{name}`")),
            "{name} is not listed in docs/testing.md's Switches section"
        );
    }
}
