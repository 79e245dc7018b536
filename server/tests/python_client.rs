//! Queen's real Python client (queen-mq 2.6.0) against the broker, on both backends. The test
//! command installs the client into a virtual environment and sets QUEEN_PYTHON.

#![allow(clippy::expect_used, clippy::unwrap_used)] // test code: a failed expectation is the test failing

mod common;

use common::{start, Store};
use queen_server::config::ServerConfig;

/// The compatibility script in one of its wire modes (json, binary, compressed).
async fn run_client(store: Store, mode: &str) {
    run_script_with(
        store,
        ServerConfig::default(),
        "client_compat.py",
        &[mode],
        &[],
        "client compatibility",
    )
    .await;
}

const SECRET: &str = "the-python-client-tests-shared-secret";
const KEY: &str = "9f8e7d6c5b4a39281706f5e4d3c2b1a09f8e7d6c5b4a39281706f5e4d3c2b1a0";

fn token(sub: &str, role: &str) -> String {
    let exp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        + 3600;
    jsonwebtoken::encode(
        &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
        &serde_json::json!({"sub": sub, "role": role, "exp": exp}),
        &jsonwebtoken::EncodingKey::from_secret(SECRET.as_bytes()),
    )
    .unwrap()
}

/// JWT auth (HS256).
fn with_auth() -> ServerConfig {
    use queen_server::http::auth::{AuthSettings, Authenticator, JwtAlgorithm};
    ServerConfig {
        auth: Some(std::sync::Arc::new(
            Authenticator::new(AuthSettings {
                secret: Some(SECRET.into()),
                ..AuthSettings::new(JwtAlgorithm::Hs256)
            })
            .unwrap(),
        )),
        ..ServerConfig::default()
    }
}

/// JWT auth and a payload key (a broker with a key answers framed pops as JSON).
fn secured() -> ServerConfig {
    ServerConfig {
        cipher: Some(std::sync::Arc::new(
            queen_server::sealing::PayloadCipher::from_hex(KEY).unwrap(),
        )),
        ..with_auth()
    }
}

/// The whole compatibility script with auth on, every request carrying an admin token.
async fn run_client_with_auth(store: Store, mode: &str) {
    let admin = token("py-admin", "admin");
    run_script_with(
        store,
        with_auth(),
        "client_compat.py",
        &[mode],
        &[("QUEEN_BEARER_TOKEN", &admin)],
        "client compatibility",
    )
    .await;
}

/// Roles, producer identity and an encrypted queue through the client.
async fn run_security(store: Store, mode: &str) {
    let (admin, reader) = (token("py-admin", "admin"), token("py-reader", "read-only"));
    run_script_with(
        store,
        secured(),
        "security.py",
        &[mode, &admin, &reader],
        &[],
        "security",
    )
    .await;
}

/// The Python with Queen's client that the test command installed.
fn python() -> String {
    std::env::var("QUEEN_PYTHON").expect(
        "QUEEN_PYTHON must name a Python with queen-mq==2.6.0 installed (run `bash .ci/test`)",
    )
}

/// A finished Python run's stdout, after asserting it exited 0 (`what` names it in the failure).
fn succeeded(out: &std::process::Output, what: &str) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{what} failed:\n{stdout}\n{stderr}");
    stdout
}

/// Runs one script of tests/python against a fresh broker; it must print "<marker>: all checks
/// passed".
async fn run_script(store: Store, config: ServerConfig, script: &str, marker: &str) {
    run_script_with(store, config, script, &[], &[], marker).await
}

async fn run_script_with(
    store: Store,
    config: ServerConfig,
    script: &str,
    args: &[&str],
    env: &[(&str, &str)],
    marker: &str,
) {
    let b = start(store, config).await;
    let script = format!("{}/tests/python/{script}", env!("CARGO_MANIFEST_DIR"));
    let out = tokio::process::Command::new(python())
        .arg(script)
        .arg(format!("http://{}", b.addr))
        .args(args)
        .envs(env.iter().copied())
        .output()
        .await
        .expect("run the Python client");
    let stdout = succeeded(&out, "the Python client");
    assert!(
        stdout.contains(&format!("{marker}: all checks passed")),
        "{stdout}"
    );
}

/// Re-checks 60 s apart: the client's 30 s long-polls are served by revisits alone.
fn event_driven() -> ServerConfig {
    ServerConfig {
        backoff: queen_core::backoff::WaitBackoff {
            initial_ms: 60_000,
            threshold: 1,
            multiplier: 1.0,
            max_ms: 60_000,
        },
        ..ServerConfig::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_client_is_served_by_revisits_memory() {
    run_script(
        Store::Memory,
        event_driven(),
        "prompt_delivery.py",
        "prompt delivery",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_client_is_served_by_revisits_postgres() {
    run_script(
        Store::Postgres("queen_pyprompt"),
        event_driven(),
        "prompt_delivery.py",
        "prompt delivery",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_client_against_the_memory_backend() {
    run_client(Store::Memory, "json").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_client_against_postgres() {
    run_client(Store::Postgres("queen_pyclient"), "json").await;
}

/// `Queen(url, binary_push=True, framed_pop=True)`: QPB1 with transactionIds (flag 4), QPF1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_client_binary_wire_memory() {
    run_client(Store::Memory, "binary").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_client_binary_wire_postgres() {
    run_client(Store::Postgres("queen_pybinary"), "binary").await;
}

/// `Queen(url, binary_push=True, push_compression=True, framed_pop=True)`: client-compressed
/// frames stored as they came (flag 8), QTB1 transactions, QPF1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_client_compressed_wire_memory() {
    run_client(Store::Memory, "compressed").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_client_compressed_wire_postgres() {
    run_client(Store::Postgres("queen_pycompressed"), "compressed").await;
}

/// `Queen(url, bearer_token=...)`: the whole compatibility suite with JWT auth on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_client_with_auth_memory() {
    run_client_with_auth(Store::Memory, "json").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_client_with_auth_compressed_postgres() {
    run_client_with_auth(Store::Postgres("queen_pyauth"), "compressed").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_security_json_memory() {
    run_security(Store::Memory, "json").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_security_binary_memory() {
    run_security(Store::Memory, "binary").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_security_json_postgres() {
    run_security(Store::Postgres("queen_pysecure"), "json").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_security_compressed_postgres() {
    run_security(Store::Postgres("queen_pysecure_z"), "compressed").await;
}

#[tokio::test]
async fn python_admin_json_memory() {
    run_script_with(
        Store::Memory,
        ServerConfig::default(),
        "admin.py",
        &["json"],
        &[],
        "admin",
    )
    .await;
}

#[tokio::test]
async fn python_admin_compressed_postgres() {
    run_script_with(
        Store::Postgres("queen_py_admin"),
        ServerConfig::default(),
        "admin.py",
        &["compressed"],
        &[],
        "admin",
    )
    .await;
}

/// Queen's own tests of its Python client (the `tests/` of the queen-mq 2.6.0 source
/// distribution, which the test command fetches and names in QUEEN_CLIENT_SUITE), run with pytest
/// against the broker: every surface as Queen's maintainers pin it (ack as a commit, KV, locks,
/// timers, transactions, reads, subscriptions), unchanged. `files` narrows it to some test files.
async fn run_queen_suite(store: Store, config: ServerConfig, files: &[&str], env: &[(&str, &str)]) {
    let b = start(store, config).await;
    run_queen_suite_at(&[b.addr], files, env).await;
}

/// The suite against brokers already running: with two, its client sends its calls to them in
/// turn (round robin), and direct HTTP calls go to the first.
async fn run_queen_suite_at(
    brokers: &[std::net::SocketAddr],
    files: &[&str],
    env: &[(&str, &str)],
) {
    let suite = std::env::var("QUEEN_CLIENT_SUITE").expect(
        "QUEEN_CLIENT_SUITE must name the unpacked queen-mq 2.6.0 source distribution (run `bash .ci/test`)",
    );
    let urls: Vec<String> = brokers.iter().map(|a| format!("http://{a}")).collect();
    let url = urls[0].clone();
    let targets: Vec<String> = if files.is_empty() {
        vec!["tests".into()]
    } else {
        files.iter().map(|f| format!("tests/{f}")).collect()
    };
    let run = tokio::process::Command::new(python())
        .current_dir(&suite)
        .args([
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "queen_suite_fixtures",
        ])
        .args(&targets)
        .env(
            "PYTHONPATH",
            concat!(env!("CARGO_MANIFEST_DIR"), "/tests/python"),
        )
        .env("QUEEN_URL", &url)
        .env("QUEEN_URLS", urls.join(","))
        .env("QUEEN_SERVER_URL", &url)
        .envs(env.iter().copied())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(std::time::Duration::from_secs(900), run)
        .await
        .expect("Queen's client suite ran past 15 minutes")
        .expect("run pytest");
    let stdout = succeeded(&out, "Queen's client suite");
    let summary = stdout.lines().last().unwrap_or_default();
    assert!(
        summary.contains(" passed") && !summary.contains("failed") && !summary.contains("error"),
        "{stdout}"
    );
    eprintln!("Queen's client suite: {summary}");
}

/// A payload key: the suite configures an encrypted queue.
fn with_key() -> ServerConfig {
    ServerConfig {
        cipher: Some(std::sync::Arc::new(
            queen_server::sealing::PayloadCipher::from_hex(KEY).unwrap(),
        )),
        ..ServerConfig::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queen_client_suite_memory() {
    run_queen_suite(Store::Memory, with_key(), &[], &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queen_client_suite_postgres() {
    run_queen_suite(Store::Postgres("queen_py_suite"), with_key(), &[], &[]).await;
}

/// The whole suite through two brokers on one PostgreSQL, each call of its client to the other
/// broker than the call before: a push through one and the pop, ack, lock renew or KV read that
/// follows through the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queen_client_suite_two_brokers_postgres() {
    let (a, b) = common::start_pair("queen_py_suite_pair", with_key()).await;
    run_queen_suite_at(&[a.addr, b.addr], &[], &[]).await;
}

/// Its producer-identity tests, which need a broker with JWT and the secret to sign with.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queen_client_suite_auth_postgres() {
    run_queen_suite(
        Store::Postgres("queen_py_suite_auth"),
        with_auth(),
        &["test_auth.py"],
        &[("JWT_SECRET", SECRET)],
    )
    .await;
}

/// Chromium for the dashboard tests: QUEEN_CHROMIUM, else `chromium` on the PATH (the test
/// command installs Debian's package when it is missing).
fn chromium() -> String {
    std::env::var("QUEEN_CHROMIUM").unwrap_or_else(|_| "chromium".to_string())
}

#[tokio::test]
async fn dashboard_in_chromium_memory() {
    let browser = chromium();
    run_script_with(
        Store::Memory,
        ServerConfig::default(),
        "dashboard.py",
        &[&browser],
        &[],
        "dashboard",
    )
    .await;
}

#[tokio::test]
async fn dashboard_in_chromium_with_auth_postgres() {
    let (browser, admin) = (chromium(), token("dash-admin", "admin"));
    run_script_with(
        Store::Postgres("queen_dashboard"),
        with_auth(),
        "dashboard.py",
        &[&browser, &admin],
        &[],
        "dashboard",
    )
    .await;
}

/// KV, locks and semaphores, transaction riders and a supervised consumer (coordination.py).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_coordination_json_memory() {
    run_script_with(
        Store::Memory,
        ServerConfig::default(),
        "coordination.py",
        &["json"],
        &[],
        "coordination",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_coordination_compressed_postgres() {
    run_script_with(
        Store::Postgres("queen_py_coordination"),
        ServerConfig::default(),
        "coordination.py",
        &["compressed"],
        &[],
        "coordination",
    )
    .await;
}

/// Reads by offset and partition discovery (reads.py), with a retention worker every 200 ms.
fn retention_fast() -> ServerConfig {
    ServerConfig {
        retention: queen_server::config::RetentionSettings {
            interval_ms: 200,
            ..queen_server::config::RetentionSettings::default()
        },
        ..ServerConfig::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_reads_json_memory() {
    run_script_with(
        Store::Memory,
        retention_fast(),
        "reads.py",
        &["json"],
        &[],
        "reads",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_reads_compressed_postgres() {
    run_script_with(
        Store::Postgres("queen_py_reads"),
        retention_fast(),
        "reads.py",
        &["compressed"],
        &[],
        "reads",
    )
    .await;
}

/// Streams end to end through the client's `queen.streams` SDK (streams.py): a tumbling-window
/// sum, a token-bucket gate, a killed worker's replacement resuming from committed state.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_streams_memory() {
    run_script_with(
        Store::Memory,
        ServerConfig::default(),
        "streams.py",
        &[],
        &[],
        "streams",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_streams_postgres() {
    run_script_with(
        Store::Postgres("queen_py_streams"),
        ServerConfig::default(),
        "streams.py",
        &[],
        &[],
        "streams",
    )
    .await;
}

/// Conflation through the client's `.conflation()` (conflation.py): the newest a partition, the
/// echo on empty pops, the stored policy winning, consume() and a woken long-poll, the 400s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_conflation_memory() {
    run_script(
        Store::Memory,
        ServerConfig::default(),
        "conflation.py",
        "conflation",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_conflation_postgres() {
    run_script(
        Store::Postgres("queen_py_conflation"),
        ServerConfig::default(),
        "conflation.py",
        "conflation",
    )
    .await;
}

/// Ephemeral queues through `client.ephemeral` (ephemeral.py): every verb, fan-out, competing
/// consumers, a woken long poll, lease expiry and the retryLimit drop, each bound and policy,
/// commit on delivery, the ack outcomes and the two 404s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_ephemeral_memory() {
    run_script(
        Store::Memory,
        ServerConfig::default(),
        "ephemeral.py",
        "ephemeral",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_ephemeral_postgres() {
    run_script(
        Store::Postgres("queen_py_ephemeral"),
        ServerConfig::default(),
        "ephemeral.py",
        "ephemeral",
    )
    .await;
}

/// A declaration outlives the broker that made it: a queue configured and filled through one
/// broker is, once that broker stopped, on another broker of the same database (as after a
/// restart: a new incarnation, empty memory) there as configured and empty, listed by `queues`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ephemeral_declarations_survive_a_restart_postgres() {
    let (before, after) = common::start_pair("queen_eph_restart", ServerConfig::default()).await;
    let configure = serde_json::json!({
        "queue": "declared",
        "options": {"maxLength": 77, "policy": "drop_oldest"}
    });
    let r = common::request(
        before.addr,
        "POST",
        "/api/v1/ephemeral/configure",
        Some(&configure),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.json());
    let push = serde_json::json!({"queue": "declared", "messages": [{"payload": 1}]});
    let r = common::request(before.addr, "POST", "/api/v1/ephemeral/push", Some(&push)).await;
    assert_eq!(r.status, 200, "{}", r.json());
    // The first broker stops (it leaves the live brokers' list, so the second claims the queue
    // at once instead of after the first's liveness runs out).
    let _ = before.app.shutting_down.send(true);
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let script = format!("{}/tests/python/ephemeral.py", env!("CARGO_MANIFEST_DIR"));
    let out = tokio::process::Command::new(python())
        .arg(script)
        .arg(format!("http://{}", after.addr))
        .arg("declared")
        .output()
        .await
        .expect("run the Python client");
    let stdout = succeeded(&out, "the Python client");
    assert!(
        stdout.contains("ephemeral-restart: all checks passed"),
        "{stdout}"
    );
}

/// The same script against two brokers on one PostgreSQL, the client sending its calls to both in
/// turn: each queue's ring lives in one owner and the other forwards, so every check holds as on
/// one broker; then pops parked through each broker woken by pushes through the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_ephemeral_two_brokers_postgres() {
    let (a, b) = common::start_pair("queen_eph_pair", ServerConfig::default()).await;
    let script = format!("{}/tests/python/ephemeral.py", env!("CARGO_MANIFEST_DIR"));
    let out = tokio::process::Command::new(python())
        .arg(script)
        .arg(format!("http://{},http://{}", a.addr, b.addr))
        .output()
        .await
        .expect("run the Python client");
    let stdout = succeeded(&out, "the Python client");
    assert!(stdout.contains("ephemeral: all checks passed"), "{stdout}");
}
