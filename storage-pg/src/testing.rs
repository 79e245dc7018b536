//! Test support: a fresh database per test, migrated by the broker's own runner.

use std::str::FromStr;

use crate::{PgConfig, PgStorage};

/// The URL tests run against; the test command starts a throwaway PostgreSQL and sets it.
pub fn database_url() -> String {
    match std::env::var("DATABASE_URL") {
        Ok(u) if !u.is_empty() => u,
        _ => panic!("DATABASE_URL must point at a PostgreSQL the tests may create databases in (run `bash .ci/test`)"),
    }
}

/// Drops and re-creates database `name` next to DATABASE_URL's, and returns its config.
pub async fn fresh_database_config(name: &str) -> tokio_postgres::Config {
    let base = match tokio_postgres::Config::from_str(&database_url()) {
        Ok(c) => c,
        Err(e) => panic!("DATABASE_URL is not a PostgreSQL URL: {e}"),
    };
    let (admin, conn) = match base.connect(tokio_postgres::NoTls).await {
        Ok(c) => c,
        Err(e) => panic!("cannot connect to DATABASE_URL: {e}"),
    };
    let driver = tokio::spawn(conn);
    for sql in [
        format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"),
        format!("CREATE DATABASE {name}"),
    ] {
        if let Err(e) = admin.batch_execute(&sql).await {
            panic!("{sql}: {e}");
        }
    }
    drop(admin);
    let _ = driver.await;
    let mut cfg = base;
    cfg.dbname(name);
    cfg
}

/// A fresh database with the schema applied, behind a pool of `pool_size`.
pub async fn fresh_database(name: &str, pool_size: usize) -> PgStorage {
    let cfg = fresh_database_config(name).await;
    match PgStorage::connect(&PgConfig {
        tls: Default::default(),
        pg: cfg,
        pool_size,
    })
    .await
    {
        Ok(s) => s,
        Err(e) => panic!("connecting to and migrating {name}: {e}"),
    }
}

/// Drops a test database (its pools must be gone or idle; connections are forced out).
pub async fn drop_database(name: &str) {
    let base = match tokio_postgres::Config::from_str(&database_url()) {
        Ok(c) => c,
        Err(e) => panic!("DATABASE_URL is not a PostgreSQL URL: {e}"),
    };
    if let Ok((admin, conn)) = base.connect(tokio_postgres::NoTls).await {
        let driver = tokio::spawn(conn);
        let _ = admin
            .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
            .await;
        drop(admin);
        let _ = driver.await;
    }
}

/// The config of an existing database next to DATABASE_URL's.
pub fn fresh_database_config_existing(name: &str) -> tokio_postgres::Config {
    let mut base = match tokio_postgres::Config::from_str(&database_url()) {
        Ok(c) => c,
        Err(e) => panic!("DATABASE_URL is not a PostgreSQL URL: {e}"),
    };
    base.dbname(name);
    base
}

/// A push of one `{}` message to (`queue`, `partition`), with message id `id` and transactionId
/// `tx-{id}`.
pub fn one_message(queue: &str, partition: &str, id: u128) -> queen_core::storage::PushGroup {
    queen_core::storage::PushGroup {
        queue: queue.into(),
        partition: partition.into(),
        frames: vec![queen_core::frames::Frame {
            producer: None,
            encrypted: false,
            message_id: uuid::Uuid::from_u128(id),
            transaction_id: format!("tx-{id}"),
            trace_id: None,
            payload: b"{}".to_vec(),
        }],
        blob: None,
    }
}
