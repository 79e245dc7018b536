//! The README's five-minute tour runs as written: its Python block (the one under "A
//! five-minute tour"), with Queen's Python client, against a fresh broker on each backend, so
//! the README cannot go stale. The only change made to the block is the broker's address.

#![allow(clippy::expect_used, clippy::unwrap_used)] // test code: a failed expectation is the test failing

mod common;

use common::{start, Store};
use queen_server::config::ServerConfig;

/// The address the README's tour names.
const README_ADDRESS: &str = "http://localhost:6632";

/// The tour's code: the first Python block after the tour's heading.
fn tour() -> String {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md"))
        .expect("README.md");
    let section = readme
        .split("\n## A five-minute tour")
        .nth(1)
        .expect("the README has a five-minute tour");
    let code = section
        .split("```python\n")
        .nth(1)
        .expect("the tour has a Python block")
        .split("\n```")
        .next()
        .expect("the block ends");
    assert!(
        code.contains(README_ADDRESS),
        "the tour connects to {README_ADDRESS}"
    );
    code.to_string()
}

async fn run_the_tour(store: Store) {
    let b = start(store, ServerConfig::default()).await;
    let code = tour().replace(README_ADDRESS, &format!("http://{}", b.addr));
    let python = std::env::var("QUEEN_PYTHON").expect(
        "QUEEN_PYTHON must name a Python with queen-mq==2.6.0 installed (run `bash .ci/test`)",
    );
    let out = tokio::process::Command::new(python)
        .arg("-c")
        .arg(&code)
        .output()
        .await
        .expect("run the tour");
    assert!(
        out.status.success(),
        "the README's tour failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_tour_runs_on_the_memory_backend() {
    run_the_tour(Store::Memory).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_tour_runs_on_postgres() {
    run_the_tour(Store::Postgres("queen_readme_tour")).await;
}
