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
    fn delivery(&self) -> Arc<dyn queen_core::storage::DeliveryStorage> {
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
    async fn dead_letters(&self, queue: &str) -> Vec<(i64, String)> {
        self.storage
            .dead_letters(queue)
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
