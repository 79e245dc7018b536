//! The conformance cases on real PostgreSQL: each case gets a fresh database with the schema
//! applied by the broker's own migration runner. Requires DATABASE_URL (the test command starts
//! a throwaway PostgreSQL and sets it).

#![allow(clippy::expect_used, clippy::unwrap_used)] // test code: a failed expectation is the test failing

use std::sync::Arc;

use async_trait::async_trait;
use queen_core::storage::Storage;
use queen_sim_tests::conformance::{self, Backend};
use queen_storage_pg::{testing, PgConfig, PgStorage};

struct Pg {
    storage: PgStorage,
}

#[async_trait]
impl Backend for Pg {
    fn storage(&self) -> Arc<dyn Storage> {
        Arc::new(self.storage.clone())
    }
    async fn advance_secs(&self, secs: i64) {
        self.storage
            .advance_clock(secs)
            .await
            .expect("advance clock");
    }
    async fn drop_segments(&self, queue: &str, partition: &str, before: i64) {
        self.storage
            .drop_segments(queue, partition, before)
            .await
            .expect("retention");
    }
    async fn filed_dead_letters(&self, queue: &str) -> Vec<(i64, String)> {
        self.storage
            .filed_dead_letters(queue)
            .await
            .expect("dead letters")
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_case_passes_on_postgres() {
    let mut failures = vec![];
    for (i, (name, case)) in conformance::all().into_iter().enumerate() {
        let storage =
            testing::fresh_database(&format!("queen_conf_{}_{i}", std::process::id()), 8).await;
        let pg = Pg { storage };
        if let Err(e) = case(&pg).await {
            failures.push(format!("{name}: {e}"));
        }
    }
    assert!(
        failures.is_empty(),
        "conformance failures on PostgreSQL:\n{}",
        failures.join("\n")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrations_are_idempotent_and_safe_to_race() {
    let cfg = testing::fresh_database_config(&format!("queen_mig_{}", std::process::id())).await;
    // Several brokers starting at once against the same database.
    let mut handles = vec![];
    for _ in 0..4 {
        let cfg = cfg.clone();
        handles.push(tokio::spawn(async move {
            PgStorage::connect(&PgConfig {
                tls: Default::default(),
                pg: cfg,
                pool_size: 2,
            })
            .await
            .map(|_| ())
        }));
    }
    for h in handles {
        h.await.expect("join").expect("concurrent start-up");
    }
    let (client, conn) = cfg.connect(tokio_postgres::NoTls).await.expect("connect");
    tokio::spawn(conn);
    let n: i64 = client
        .query_one("SELECT count(*) FROM queen.schema_migrations", &[])
        .await
        .expect("count")
        .get(0);
    assert_eq!(n as usize, queen_storage_pg::MIGRATIONS.len());
}

/// A released migration must not change under a database that applied it: the broker refuses
/// to start rather than run a schema that differs from a new database's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edited_applied_migration_refuses_start_up() {
    let name = format!("queen_mig_sum_{}", std::process::id());
    let cfg = testing::fresh_database_config(&name).await;
    let config = PgConfig {
        tls: Default::default(),
        pg: cfg.clone(),
        pool_size: 2,
    };
    PgStorage::connect(&config).await.expect("first start");
    let (client, conn) = cfg.connect(tokio_postgres::NoTls).await.expect("connect");
    tokio::spawn(conn);
    client
        .execute(
            "UPDATE queen.schema_migrations SET checksum = 'edited' WHERE version = 8",
            &[],
        )
        .await
        .expect("tamper");
    let refused = PgStorage::connect(&config).await.err().expect("refused");
    assert!(
        refused
            .to_string()
            .contains("008_pop_retention_gap was edited"),
        "{refused}"
    );
    // A database from before checksums were kept takes the files as applied.
    client
        .execute("UPDATE queen.schema_migrations SET checksum = NULL", &[])
        .await
        .expect("forget checksums");
    PgStorage::connect(&config)
        .await
        .expect("start after backfill");
    let unset: i64 = client
        .query_one(
            "SELECT count(*) FROM queen.schema_migrations WHERE checksum IS NULL",
            &[],
        )
        .await
        .expect("count")
        .get(0);
    assert_eq!(unset, 0);
    drop(client);
    testing::drop_database(&name).await;
}

/// A function whose file differs from what the database last applied is defined again at
/// start-up; the others are left alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changed_function_definitions_are_reapplied_at_start_up() {
    let name = format!("queen_mig_fn_{}", std::process::id());
    let cfg = testing::fresh_database_config(&name).await;
    let config = PgConfig {
        tls: Default::default(),
        pg: cfg.clone(),
        pool_size: 2,
    };
    PgStorage::connect(&config).await.expect("first start");
    let (client, conn) = cfg.connect(tokio_postgres::NoTls).await.expect("connect");
    tokio::spawn(conn);
    // An operator's hand edit (or an older broker's definition) of one function.
    client
        .batch_execute(
            "DROP FUNCTION queen.log_next_pending_v1(text[], text);
             UPDATE queen.schema_functions SET checksum = 'older' WHERE name = 'log_next_pending_v1'",
        )
        .await
        .expect("stale function");
    let before: Vec<(String, std::time::SystemTime)> = client
        .query(
            "SELECT name, applied_at FROM queen.schema_functions ORDER BY name",
            &[],
        )
        .await
        .expect("applied")
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    PgStorage::connect(&config).await.expect("restart");
    let exists: bool = client
        .query_one(
            "SELECT to_regprocedure('queen.log_next_pending_v1(text[], text)') IS NOT NULL",
            &[],
        )
        .await
        .expect("lookup")
        .get(0);
    assert!(exists, "the stale function was not defined again");
    let after: Vec<(String, std::time::SystemTime)> = client
        .query(
            "SELECT name, applied_at FROM queen.schema_functions ORDER BY name",
            &[],
        )
        .await
        .expect("applied")
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let reapplied: Vec<&str> = before
        .iter()
        .zip(&after)
        .filter(|(b, a)| b.1 != a.1)
        .map(|(b, _)| b.0.as_str())
        .collect();
    assert_eq!(reapplied, vec!["log_next_pending_v1"]);
    drop(client);
    testing::drop_database(&name).await;
}
