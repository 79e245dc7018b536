//! Test support: an in-process broker on an ephemeral port, and a minimal HTTP/1.1 client.

#![allow(dead_code)]

pub mod fleet;

use std::net::SocketAddr;
use std::sync::Arc;

use queen_core::storage::StorageSet;
use queen_server::broker::Broker;
use queen_server::config::ServerConfig;
use queen_server::wall_now;
use queen_storage_sim::{SimBugs, SimDb};

/// A broker serving on an ephemeral port, with its backend.
pub struct TestBroker {
    pub app: Arc<Broker>,
    pub addr: SocketAddr,
    /// The PostgreSQL backend, for tests that reach past the broker.
    pub pg: Option<queen_storage_pg::PgStorage>,
}

pub enum Store {
    Memory,
    Postgres(&'static str),
}

pub async fn start(store: Store, config: ServerConfig) -> TestBroker {
    let (storage, pg) = match store {
        Store::Memory => {
            let db = SimDb::new(1, Arc::new(wall_now), SimBugs::default());
            (StorageSet::of(db), None)
        }
        Store::Postgres(name) => {
            let pg = queen_storage_pg::testing::fresh_database(
                &format!("{name}_{}", std::process::id()),
                16,
            )
            .await;
            (StorageSet::of(Arc::new(pg.clone())), Some(pg))
        }
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let mut config = config;
    if pg.is_some() {
        // As the binary does on PostgreSQL: peers reach it here (ephemeral queues' owners).
        config.peer_address = Some(addr.to_string());
    }
    let app = Broker::new(config, storage, 7);
    queen_server::tasks::start(&app);
    tokio::spawn(queen_server::serve_listener(app.clone(), listener));
    TestBroker { app, addr, pg }
}

/// A second broker on `first`'s storage (its backend and connections), with a config of its own:
/// what one broker leaves in storage for another, on either backend.
pub async fn start_beside(first: &TestBroker, config: ServerConfig) -> TestBroker {
    let (listener, addr, config) = bind_peer(config).await;
    let app = Broker::new(config, first.app.storage.clone(), 8);
    queen_server::tasks::start(&app);
    tokio::spawn(queen_server::serve_listener(app.clone(), listener));
    TestBroker {
        app,
        addr,
        pg: first.pg.clone(),
    }
}

/// Two brokers on one fresh PostgreSQL database, each listening for the other's events.
pub async fn start_pair(name: &str, config: ServerConfig) -> (TestBroker, TestBroker) {
    start_pair_with(name, config.clone(), config).await
}

/// Two brokers on one fresh PostgreSQL database with configs of their own (a key each, say).
pub async fn start_pair_with(
    name: &str,
    a: ServerConfig,
    b: ServerConfig,
) -> (TestBroker, TestBroker) {
    let cfg =
        queen_storage_pg::testing::fresh_database_config(&format!("{name}_{}", std::process::id()))
            .await;
    let mut brokers = vec![];
    for (seed, config) in [a, b].into_iter().enumerate() {
        let pg = queen_storage_pg::PgStorage::connect(&queen_storage_pg::PgConfig {
            tls: Default::default(),
            pg: cfg.clone(),
            pool_size: 8,
        })
        .await
        .expect("pg");
        let (listener, addr, config) = bind_peer(config).await;
        let app = Broker::new(config, StorageSet::of(Arc::new(pg.clone())), seed as u64);
        queen_server::tasks::start(&app);
        queen_server::spawn_event_listener(app.clone(), &pg);
        queen_server::spawn_clock_alignment(&app, &pg);
        tokio::spawn(queen_server::serve_listener(app.clone(), listener));
        brokers.push(TestBroker {
            app,
            addr,
            pg: Some(pg),
        });
    }
    let b = brokers.pop().expect("two brokers");
    let a = brokers.pop().expect("two brokers");
    (a, b)
}

/// A listener on a free port, and `config` with it as the broker's peer address (the ephemeral
/// queues' owners are reached there).
pub async fn bind_peer(
    config: ServerConfig,
) -> (tokio::net::TcpListener, SocketAddr, ServerConfig) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let config = ServerConfig {
        peer_address: Some(addr.to_string()),
        ..config
    };
    (listener, addr, config)
}

pub use queen_raw_client::{Client, Response};

/// One request on a fresh connection.
pub async fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: Option<&serde_json::Value>,
) -> Response {
    let mut c = Client::connect(addr).await;
    match body {
        Some(b) => {
            c.send(method, path, Some(&serde_json::to_vec(b).expect("json")))
                .await
        }
        None => c.send(method, path, None).await,
    }
}

pub async fn metrics(addr: SocketAddr) -> serde_json::Value {
    request(addr, "GET", "/metrics", None).await.json()
}

/// Pops `queue` (autoAck, 300 ms long-polls, `token` as a bearer token when given) until `n`
/// messages came or 40 polls passed; `field` of each message, by transactionId.
pub async fn pop_until(
    addr: SocketAddr,
    token: Option<&str>,
    queue: &str,
    n: usize,
    field: &str,
) -> std::collections::BTreeMap<String, serde_json::Value> {
    let mut seen = std::collections::BTreeMap::new();
    let path = format!("/api/v1/pop/queue/{queue}?batch=100&wait=true&timeout=300&autoAck=true");
    for _ in 0..40 {
        let mut c = Client::connect(addr).await;
        if let Some(t) = token {
            c = c.with_header("authorization", &format!("Bearer {t}"));
        }
        let r = c.get(&path).await;
        if r.status == 200 {
            for m in r.json()["messages"].as_array().expect("messages") {
                seen.insert(
                    m["transactionId"]
                        .as_str()
                        .expect("transactionId")
                        .to_string(),
                    m[field].clone(),
                );
            }
        }
        if seen.len() >= n {
            break;
        }
    }
    seen
}
