//! The broker runs as a role with no more than it needs: one that owns the schemas a DBA made
//! for it (`queen`, `queen_streams`) and may create nothing else in the database. Before, its
//! migrations began with `CREATE SCHEMA IF NOT EXISTS queen`, which PostgreSQL refuses without
//! the database's CREATE privilege even when the schema exists, and the broker could not start.

#![allow(clippy::expect_used, clippy::unwrap_used)] // test code: a failed expectation is the test failing

use std::str::FromStr;

use queen_core::storage::{MessageStorage, PushOutcome};
use queen_storage_pg::{testing, PgConfig, PgStorage};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_role_owning_only_its_schemas_migrates_and_serves() {
    let name = format!("queen_priv_{}", std::process::id());
    let role = format!("queen_priv_role_{}", std::process::id());
    let cfg = testing::fresh_database_config(&name).await;
    let (admin, conn) = cfg
        .connect(tokio_postgres::NoTls)
        .await
        .expect("admin connection");
    let driver = tokio::spawn(conn);
    admin
        .batch_execute(&format!(
            "DROP ROLE IF EXISTS {role};
             CREATE ROLE {role} LOGIN;
             REVOKE CREATE, TEMPORARY ON DATABASE {name} FROM PUBLIC;
             REVOKE CREATE ON SCHEMA public FROM PUBLIC;
             CREATE SCHEMA queen AUTHORIZATION {role};
             CREATE SCHEMA queen_streams AUTHORIZATION {role};"
        ))
        .await
        .expect("a role that owns its schemas and nothing more");

    let mut as_role = cfg.clone();
    as_role.user(&role);
    let pg = PgStorage::connect(&PgConfig {
        tls: Default::default(),
        pg: as_role,
        pool_size: 4,
    })
    .await
    .unwrap_or_else(|e| panic!("the role's broker starts: {e}"));
    let outcome = pg
        .push(vec![testing::one_message("owned", "p", 1)])
        .await
        .expect("push")
        .remove(0)
        .remove(0);
    assert!(matches!(outcome, PushOutcome::Queued { .. }), "{outcome:?}");
    drop(pg);

    drop(admin);
    let _ = driver.await;
    testing::drop_database(&name).await;
    let base = tokio_postgres::Config::from_str(&testing::database_url()).expect("URL");
    let (admin, conn) = base.connect(tokio_postgres::NoTls).await.expect("connect");
    let driver = tokio::spawn(conn);
    admin
        .batch_execute(&format!("DROP ROLE IF EXISTS {role}"))
        .await
        .expect("drop the role");
    drop(admin);
    let _ = driver.await;
}
