//! The bench's in-process brokers: their runtime (apart from the load generator's), their
//! configuration, and starting one on the bench's database.

use std::sync::Arc;

use queen_core::storage::StorageSet;
use queen_server::broker::Broker;
use queen_server::config::ServerConfig;

use crate::util;

pub(crate) async fn start_app(
    pg: &queen_storage_pg::PgStorage,
    hotlist: bool,
) -> (Arc<Broker>, std::net::SocketAddr) {
    let config = ServerConfig {
        hotlist,
        ..crate::bench_config()
    };
    start_with(pg, config, 1).await
}

/// The in-process brokers' runtime, apart from the load generator's: its threads are named
/// (util::BROKER_THREAD), so the broker's CPU time is read from /proc apart, and the two do not
/// share worker threads, as a broker and its clients would not.
pub(crate) fn broker_runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: std::sync::OnceLock<tokio::runtime::Runtime> = std::sync::OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name(util::BROKER_THREAD)
            .enable_all()
            .build()
            .expect("broker runtime")
    })
}

/// The configuration of the bench's in-process brokers: the defaults without a retention
/// worker. Every broker it starts lives to the end of the run, so default workers would run
/// retention passes over other scenarios' queues (one removed the retention scenario's filled
/// partitions before the pass it measures); the soak turns its own worker on.
pub(crate) fn bench_config() -> ServerConfig {
    ServerConfig {
        retention: queen_server::config::RetentionSettings::OFF,
        pop_rounds: std::env::var("POP_ROUNDS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(queen_server::config::DEFAULT_POP_ROUNDS),
        push_rounds: std::env::var("PUSH_ROUNDS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(queen_server::config::DEFAULT_PUSH_ROUNDS),
        limiter: bench_limiter(),
        client_idle_timeout_ms: std::env::var("CLIENT_IDLE_TIMEOUT_MS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(queen_server::config::DEFAULT_CLIENT_IDLE_TIMEOUT_MS),
        ..ServerConfig::default()
    }
}

/// The serving limiter's bounds, from `QUEEN_LIMITER_MIN` / `QUEEN_LIMITER_MAX` as the server
/// reads them (min = max: a fixed limit), to compare limits on one load.
fn bench_limiter() -> queen_core::limiter::LimiterConfig {
    let env = |name: &str| std::env::var(name).ok().and_then(|v| v.parse::<u32>().ok());
    let mut limiter = queen_core::limiter::LimiterConfig::default();
    if let Some(min) = env("QUEEN_LIMITER_MIN") {
        limiter.min_limit = min;
    }
    if let Some(max) = env("QUEEN_LIMITER_MAX") {
        limiter.max_limit = max;
    }
    // The initial limit is left as it is: the limiter holds it within the bounds itself.
    limiter
}

/// An in-process broker on the bench's database, serving on an ephemeral port.
pub(crate) async fn start_with(
    pg: &queen_storage_pg::PgStorage,
    config: ServerConfig,
    seed: u64,
) -> (Arc<Broker>, std::net::SocketAddr) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    serve_on(pg, config, seed, listener)
}

/// A broker with its background tasks, serving `listener` on the brokers' runtime.
fn serve_on(
    pg: &queen_storage_pg::PgStorage,
    config: ServerConfig,
    seed: u64,
    listener: std::net::TcpListener,
) -> (Arc<Broker>, std::net::SocketAddr) {
    listener
        .set_nonblocking(true)
        .expect("nonblocking listener");
    let addr = listener.local_addr().expect("addr");
    let app = Broker::new(config, StorageSet::of(Arc::new(pg.clone())), seed);
    queen_server::tasks::start(&app);
    let served = app.clone();
    broker_runtime().spawn(async move {
        let listener = tokio::net::TcpListener::from_std(listener).expect("listener");
        queen_server::serve_listener(served, listener).await
    });
    (app, addr)
}

/// An in-process broker that shares its ephemeral queues with the other peers on the bench's
/// database: its `PEER_ADDRESS` is the port it serves on.
pub(crate) async fn start_peer(
    pg: &queen_storage_pg::PgStorage,
    seed: u64,
) -> (Arc<Broker>, std::net::SocketAddr) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    let config = ServerConfig {
        peer_address: Some(addr.to_string()),
        ..bench_config()
    };
    serve_on(pg, config, seed, listener)
}
