//! The run's table: printed on stdout after a run, and written into docs/benchmarks.md from a
//! run's JSON by `queen-bench report`, so the file's headline is always a real run's output.

use std::path::Path;

use crate::args::ReportArgs;
use crate::util::Row;

/// Where the generated part of docs/benchmarks.md starts and ends; the hand-written sections
/// (how to read it, the method, the findings) stand outside the markers.
const BEGIN: &str =
    "<!-- queen-bench report: generated from the run's JSON; do not edit by hand -->";
const END: &str = "<!-- end of the generated table -->";

fn number(x: f64) -> String {
    if x.is_nan() {
        "-".to_string()
    } else if x.abs() >= 100.0 {
        format!("{x:.0}")
    } else {
        format!("{x:.2}")
    }
}

fn ratio(x: f64) -> String {
    if x.is_nan() {
        "-".into()
    } else {
        format!("{x:.2}x")
    }
}

const HEADER: &str = "| scenario | metric | broker | baseline | baseline value | broker / baseline |\n|---|---|---:|---|---:|---:|\n";

fn row_line(
    scenario: &str,
    metric: &str,
    broker: f64,
    baseline: &str,
    value: f64,
    r: f64,
) -> String {
    format!(
        "| {scenario} | {metric} | {} | {baseline} | {} | {} |\n",
        number(broker),
        number(value),
        ratio(r)
    )
}

/// The table a run prints when it ends (CI's smoke run checks its rows by name).
pub fn print_table(quick: bool, secs: u64, rows: &[Row]) {
    println!(
        "\nqueen-bench ({}; PostgreSQL on this host; {secs} s per throughput measurement)\n",
        if quick { "quick" } else { "full" },
    );
    let mut out = String::from(HEADER);
    for r in rows {
        out.push_str(&row_line(
            &r.scenario,
            r.metric,
            r.broker,
            &r.baseline_name,
            r.baseline,
            r.ratio(),
        ));
    }
    print!("{out}");
}

/// The commit the run measured (`+dirty` when the work tree had changes), or "unknown".
pub fn git_commit() -> String {
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    match git(&["rev-parse", "--short", "HEAD"]) {
        Some(c)
            if git(&["status", "--porcelain", "--untracked-files=no"])
                .is_some_and(|s| !s.is_empty()) =>
        {
            format!("{c}+dirty")
        }
        Some(c) => c,
        None => "unknown".into(),
    }
}

/// Today's date (UTC), as the run's JSON records it.
pub fn today() -> String {
    let iso = queen_core::time::format_iso_micros(queen_server::wall_now());
    iso.chars().take(10).collect()
}

/// The machine in one line: cores, memory and CPU model, read from /proc.
pub fn machine() -> String {
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let mem_gib = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1_048_576.0);
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map(|v| v.trim_start_matches([' ', '\t', ':']).trim().to_string())
        .unwrap_or_else(|| "unknown CPU".into());
    format!("{cores} cores, {mem_gib:.0} GiB, {model}")
}

/// The generated section: the run's identity, then its table.
fn section(doc: &serde_json::Value) -> Result<String, String> {
    let text = |k: &str| {
        doc.get(k)
            .and_then(|v| v.as_str())
            .unwrap_or("unknown")
            .to_string()
    };
    let mode = text("mode");
    let secs = doc.get("seconds").and_then(|v| v.as_u64()).unwrap_or(0);
    let rows = doc
        .get("rows")
        .and_then(|v| v.as_array())
        .ok_or("the JSON has no \"rows\" array")?;
    let mut out = format!(
        "{BEGIN}\n\nqueen-bench ({mode} run; {secs} s per throughput measurement) at commit `{}` on {}, on {}.\n\n{HEADER}",
        text("commit"),
        text("date"),
        text("machine"),
    );
    for r in rows {
        let f = |k: &str| r.get(k).and_then(|v| v.as_f64()).unwrap_or(f64::NAN);
        let s = |k: &str| r.get(k).and_then(|v| v.as_str()).unwrap_or("-").to_string();
        out.push_str(&row_line(
            &s("scenario"),
            &s("metric"),
            f("broker"),
            &s("baseline"),
            f("baselineValue"),
            f("ratio"),
        ));
    }
    out.push('\n');
    out.push_str(END);
    Ok(out)
}

/// Replaces the generated section of `existing` (or puts one after its title).
fn splice(existing: &str, section: &str) -> String {
    if let (Some(b), Some(e)) = (existing.find(BEGIN), existing.find(END)) {
        if b < e {
            return format!("{}{section}{}", &existing[..b], &existing[e + END.len()..]);
        }
    }
    match existing.find('\n') {
        Some(i) => format!("{}\n\n{section}\n{}", &existing[..i], &existing[i + 1..]),
        None => format!("# Benchmarks\n\n{section}\n"),
    }
}

/// `queen-bench report`: reads the run's JSON and rewrites the table section of the markdown.
pub fn write(args: &ReportArgs) -> Result<(), String> {
    let read = |p: &Path| std::fs::read(p).map_err(|e| format!("reading {}: {e}", p.display()));
    let doc: serde_json::Value = serde_json::from_slice(&read(&args.json)?)
        .map_err(|e| format!("{} is not a run's JSON: {e}", args.json.display()))?;
    let existing = std::fs::read_to_string(&args.out).unwrap_or_default();
    let updated = splice(&existing, &section(&doc)?);
    std::fs::write(&args.out, updated)
        .map_err(|e| format!("writing {}: {e}", args.out.display()))?;
    eprintln!("wrote {} from {}", args.out.display(), args.json.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // test code
    use super::*;

    #[test]
    fn the_section_is_replaced_and_the_rest_kept() {
        let doc = serde_json::json!({"mode": "full", "seconds": 10, "commit": "abc1234",
            "date": "2026-12-04", "machine": "2 cores",
            "rows": [{"scenario": "push, batch 1", "metric": "msg/s", "broker": 1500.0,
                      "baseline": "(a) rows", "baselineValue": 3000.0, "ratio": 0.5}]});
        let first = splice("# Benchmarks\n\n## Method\ntext\n", &section(&doc).unwrap());
        assert!(first.contains("| push, batch 1 | msg/s | 1500 | (a) rows | 3000 | 0.50x |"));
        assert!(first.contains("commit `abc1234` on 2026-12-04"));
        assert!(first.ends_with("## Method\ntext\n"));
        let doc2 = serde_json::json!({"commit": "def5678", "rows": []});
        let second = splice(&first, &section(&doc2).unwrap());
        assert!(!second.contains("abc1234"));
        assert!(second.contains("def5678"));
        assert_eq!(second.matches(BEGIN).count(), 1);
        assert!(second.ends_with("## Method\ntext\n"));
    }
}
