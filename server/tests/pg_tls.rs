//! TLS to PostgreSQL against the test command's server, which offers TLS with a certificate its
//! own throwaway CA signed for the name `localhost` (.ci/pg.sh: PG_TLS_CA, PG_TLS_OTHER_CA).
//! Each sslmode connects (or refuses) as libpq's does, every connection of a broker (the pool and
//! the LISTEN connection) is encrypted when the mode says so, and Queen's PG_USE_SSL settings map
//! onto the same modes.

#![allow(clippy::expect_used, clippy::unwrap_used)] // test code: a failed expectation is the test failing

mod common;

use std::sync::Arc;

use queen_core::storage::{StorageError, StorageSet};
use queen_server::broker::Broker;
use queen_server::config::ServerConfig;
use queen_storage_pg::tls::SslMode;
use queen_storage_pg::{PgConfig, PgSettings, PgStorage};

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| {
        panic!("{name} must name the test server's CA file: run `bash .ci/test`, which starts PostgreSQL with TLS")
    })
}

/// DATABASE_URL's database and port, on `host`, with `options` appended.
fn url(db: &str, host: &str, options: &str) -> String {
    let base = queen_storage_pg::testing::database_url();
    let port = base
        .rsplit_once(':')
        .and_then(|(_, rest)| rest.split('/').next())
        .unwrap()
        .to_string();
    format!("postgres://postgres@{host}:{port}/{db}?{options}")
}

fn config(url: String) -> PgConfig {
    PgConfig::from_settings(PgSettings {
        url: Some(url),
        pool_size: Some(2),
        ..PgSettings::default()
    })
    .unwrap()
    .unwrap()
}

/// Whether this session's connection is encrypted, as the server sees it.
async fn encrypted(storage: &PgStorage) -> bool {
    let c = storage.pool().get().await.unwrap();
    c.query_one(
        "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
        &[],
    )
    .await
    .unwrap()
    .get(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_sslmode_as_libpq() {
    let (ca, other) = (env("PG_TLS_CA"), env("PG_TLS_OTHER_CA"));
    let db = format!("pg_tls_{}", std::process::id());
    queen_storage_pg::testing::fresh_database_config(&db).await;
    let connect = |u: String| async move { PgStorage::connect(&config(u)).await };

    // Encrypted, the certificate verified: chain and name, chain only, or not at all.
    let cases = [
        ("localhost", format!("sslmode=verify-full&sslrootcert={ca}")),
        ("127.0.0.1", format!("sslmode=verify-ca&sslrootcert={ca}")),
        ("127.0.0.1", "sslmode=require".to_string()),
        // prefer (the default): TLS because the server offers it.
        ("127.0.0.1", String::new()),
    ];
    for (host, options) in &cases {
        let s = connect(url(&db, host, options))
            .await
            .unwrap_or_else(|e| panic!("{host} {options}: {e}"));
        assert!(encrypted(&s).await, "{host} {options} is encrypted");
    }
    // disable: in the clear.
    let plain = connect(url(&db, "127.0.0.1", "sslmode=disable"))
        .await
        .unwrap();
    assert!(!encrypted(&plain).await);

    // Refused: the certificate does not name 127.0.0.1; it does not chain to another CA (in
    // verify-ca, and in require once a root is named, as libpq does).
    let refused = [
        ("127.0.0.1", format!("sslmode=verify-full&sslrootcert={ca}")),
        (
            "localhost",
            format!("sslmode=verify-full&sslrootcert={other}"),
        ),
        (
            "localhost",
            format!("sslmode=verify-ca&sslrootcert={other}"),
        ),
        ("localhost", format!("sslmode=require&sslrootcert={other}")),
        // No sslrootcert: the webpki roots, which never signed a test CA.
        ("localhost", "sslmode=verify-full".to_string()),
    ];
    for (host, options) in &refused {
        let e = connect(url(&db, host, options)).await;
        // Internal, not Unavailable: the binary stops and says why rather than waiting for a
        // certificate that will not change.
        assert!(
            matches!(e, Err(StorageError::Internal(_))),
            "{host} {options} must be refused as a setting: {:?}",
            e.err()
        );
    }
    assert!(PgConfig::from_settings(PgSettings {
        url: Some(url(&db, "localhost", "sslmode=sometimes")),
        ..PgSettings::default()
    })
    .is_err());
}

/// Queen's settings: PG_USE_SSL with PG_SSL_REJECT_UNAUTHORIZED (default true: verify-full)
/// and PG_SSL_ROOT_CERT; false: require.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queens_settings() {
    let ca = env("PG_TLS_CA");
    let db = format!("pg_tls_q_{}", std::process::id());
    queen_storage_pg::testing::fresh_database_config(&db).await;
    let settings = |host: &str, reject: bool, root: Option<&str>| PgSettings {
        url: Some(url(&db, host, "")),
        use_ssl: true,
        ssl_reject_unauthorized: reject,
        ssl_root_cert: root.map(str::to_string),
        pool_size: Some(2),
        ..PgSettings::default()
    };
    let verified = PgConfig::from_settings(settings("localhost", true, Some(&ca)))
        .unwrap()
        .unwrap();
    assert_eq!(verified.tls.mode, SslMode::VerifyFull);
    assert!(encrypted(&PgStorage::connect(&verified).await.unwrap()).await);
    let wrong_name = PgConfig::from_settings(settings("127.0.0.1", true, Some(&ca)))
        .unwrap()
        .unwrap();
    assert!(PgStorage::connect(&wrong_name).await.is_err());
    let any = PgConfig::from_settings(settings("127.0.0.1", false, None))
        .unwrap()
        .unwrap();
    assert_eq!(any.tls.mode, SslMode::Require);
    assert!(encrypted(&PgStorage::connect(&any).await.unwrap()).await);
}

/// A broker on verify-full: its pool and its LISTEN connection are encrypted, and an event
/// reaches it over the encrypted LISTEN (a push through another broker wakes its parked pop).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_connection_of_a_broker_is_encrypted() {
    let ca = env("PG_TLS_CA");
    let db = format!("pg_tls_b_{}", std::process::id());
    queen_storage_pg::testing::fresh_database_config(&db).await;
    let cfg = config(url(
        &db,
        "localhost",
        &format!("sslmode=verify-full&sslrootcert={ca}"),
    ));
    let mut addrs = vec![];
    let mut keep = vec![];
    for seed in 0..2 {
        let pg = PgStorage::connect(&cfg).await.unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        addrs.push(listener.local_addr().unwrap());
        let app = Broker::new(
            ServerConfig::default(),
            StorageSet::of(Arc::new(pg.clone())),
            seed,
        );
        queen_server::tasks::start(&app);
        queen_server::spawn_event_listener(app.clone(), &pg);
        tokio::spawn(queen_server::serve_listener(app.clone(), listener));
        keep.push((app, pg));
    }
    let (a, b) = (addrs[0], addrs[1]);
    let waiter = tokio::spawn(async move {
        common::request(
            b,
            "GET",
            "/api/v1/pop/queue/tlsq?wait=true&timeout=10000",
            None,
        )
        .await
    });
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let push = serde_json::json!({"items": [{"queue": "tlsq", "payload": {"over": "tls"}}]});
    assert_eq!(
        common::request(a, "POST", "/api/v1/push", Some(&push))
            .await
            .status,
        201
    );
    let got = waiter.await.unwrap();
    assert_eq!(got.status, 200);
    assert_eq!(
        got.json()["messages"][0]["data"],
        serde_json::json!({"over": "tls"})
    );
    // Every backend session on the database, the LISTEN ones included, is encrypted.
    let pg = &keep[0].1;
    let c = pg.pool().get().await.unwrap();
    let rows = c
        .query(
            "SELECT a.query, s.ssl FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid)
              WHERE a.datname = $1",
            &[&db],
        )
        .await
        .unwrap();
    let listening = rows
        .iter()
        .filter(|r| r.get::<_, String>(0).contains("LISTEN"))
        .count();
    assert_eq!(listening, 2, "both brokers' LISTEN connections are seen");
    assert!(
        rows.iter().all(|r| r.get::<_, bool>(1)),
        "every session is encrypted"
    );
}
