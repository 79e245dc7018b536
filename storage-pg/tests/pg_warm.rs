//! The warmer of idle PostgreSQL connections (storage-pg/src/warm.rs): a pass compiles the first
//! contact's functions in every idle backend it borrows, leaves nothing behind, warms a
//! connection once, and never takes the last idle connection of a full pool.

#![allow(clippy::expect_used, clippy::unwrap_used)] // test code: a failed expectation is the test failing

use queen_storage_pg::{testing, ConnectionWarmer, PgStorage, WarmPass};

const POOL: usize = 4;

/// Whether each of `n` connections held at once has compiled the first contact's function (a
/// backend keeps a memory context per compiled PL/pgSQL function, named by its signature).
async fn compiled(pg: &PgStorage, n: usize) -> Vec<bool> {
    let mut held = vec![];
    for _ in 0..n {
        held.push(pg.pool().get().await.expect("connection"));
    }
    let mut out = vec![];
    for c in &held {
        let row = c
            .query_one(
                "SELECT count(*) FROM pg_backend_memory_contexts
                  WHERE name = 'PL/pgSQL function' AND ident LIKE '%log_pop_wildcard_v2(%'",
                &[],
            )
            .await
            .expect("memory contexts");
        out.push(row.get::<_, i64>(0) > 0);
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pass_warms_each_spare_idle_connection_once_and_leaves_nothing() {
    let name = format!("queen_warm_{}", std::process::id());
    let pg = testing::fresh_database(&name, POOL).await;
    // Three connections made and idle; the two besides the one that ran the migrations (whose
    // CREATE FUNCTION validated the body) have never compiled the first contact.
    let before = compiled(&pg, 3).await;
    assert!(
        before.iter().filter(|c| !**c).count() >= 2,
        "cold connections before the pass: {before:?}"
    );
    assert_eq!(pg.pool().status().size, 3);

    let mut warmer = ConnectionWarmer::default();
    assert_eq!(
        warmer.pass(&pg).await,
        WarmPass {
            cold_idle: 3,
            warmed: 3
        }
    );
    assert_eq!(
        compiled(&pg, 3).await,
        vec![true; 3],
        "every idle connection warmed"
    );
    assert_eq!(warmer.pass(&pg).await, WarmPass::default(), "warmed once");

    // The scratch work was rolled back: no queue, partition, message or cursor of it remains.
    let c = pg.pool().get().await.expect("connection");
    let left: i64 = c
        .query_one(
            "SELECT (SELECT count(*) FROM queen.queues) + (SELECT count(*) FROM queen.log_partitions)
                  + (SELECT count(*) FROM queen.log_segments) + (SELECT count(*) FROM queen.log_consumers)
                  + (SELECT count(*) FROM queen.consumer_groups_metadata)",
            &[],
        )
        .await
        .expect("counts")
        .get(0);
    assert_eq!(left, 0, "the warm-up left rows behind");
    drop(c);

    // A full pool with one idle connection: that one is left to requests, cold or not.
    let mut busy = vec![];
    for _ in 0..POOL {
        busy.push(pg.pool().get().await.expect("connection"));
    }
    busy.pop();
    assert_eq!(pg.pool().status().size, POOL);
    let mut fresh = ConnectionWarmer::default();
    assert_eq!(
        fresh.pass(&pg).await,
        WarmPass {
            cold_idle: 1,
            warmed: 0
        }
    );
    drop(busy);
    drop(pg);
    testing::drop_database(&name).await;
}
