//! Queen's real Python client (queen-mq 2.6.0) against the broker, on both backends. The test
//! command installs the client into a virtual environment and sets QUEEN_PYTHON.

#![allow(clippy::expect_used, clippy::unwrap_used)] // test code: a failed expectation is the test failing

mod common;

use common::{start, Store};
use queen_server::config::ServerConfig;

async fn run_client(store: Store) {
    let python = std::env::var("QUEEN_PYTHON").expect(
        "QUEEN_PYTHON must name a Python with queen-mq==2.6.0 installed (run `bash .ci/test`)",
    );
    let b = start(store, ServerConfig::default()).await;
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/python/client_compat.py");
    let out = tokio::process::Command::new(&python)
        .arg(script)
        .arg(format!("http://{}", b.addr))
        .output()
        .await
        .expect("run the Python client");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "the Python client failed:\n{stdout}\n{stderr}"
    );
    assert!(
        stdout.contains("client compatibility: all checks passed"),
        "{stdout}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_client_against_the_memory_backend() {
    run_client(Store::Memory).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_client_against_postgres() {
    run_client(Store::Postgres("queen_pyclient")).await;
}
