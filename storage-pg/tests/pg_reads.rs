//! Partition discovery's `safeTime` on real PostgreSQL: a writer whose transaction is still
//! open when an answer is read commits a write time above that answer's `safeTime`. A
//! `safeTime` taken from the clock alone would not be (the writer's time is that of its
//! transaction's start, a second earlier), so this fails if the open transactions are ignored.

#![allow(clippy::expect_used, clippy::unwrap_used)] // test code: a failed expectation is the test failing

use queen_core::frames::Frame;
use queen_core::reads::ChangedQuery;
use queen_core::storage::{MessageStorage, PushGroup, ReadStorage};
use queen_storage_pg::testing;

fn query(queue: &str) -> ChangedQuery {
    ChangedQuery {
        queue: queue.into(),
        since: None,
        after: None,
        limit: 1000,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_committed_after_an_answer_is_above_its_safe_time() {
    let name = format!("queen_reads_{}", std::process::id());
    let pg = testing::fresh_database(&name, 4).await;
    pg.push(vec![PushGroup {
        queue: "sq".into(),
        partition: "p".into(),
        frames: vec![Frame {
            producer: None,
            encrypted: false,
            message_id: uuid::Uuid::from_u128(1),
            transaction_id: "t1".into(),
            trace_id: None,
            payload: b"{}".to_vec(),
        }],
        blob: None,
    }])
    .await
    .expect("push");
    // A writer: its transaction stamps the partition as every push does (never before the
    // transaction began), and stays open across a second boundary.
    let (mut writer, conn) = testing::fresh_database_config_existing(&name)
        .connect(tokio_postgres::NoTls)
        .await
        .expect("connect");
    let driver = tokio::spawn(conn);
    let tx = writer.transaction().await.expect("begin");
    tx.execute(
        "UPDATE queen.log_partitions SET last_write_at = date_trunc('second', queen.now())
          WHERE name = 'p'",
        &[],
    )
    .await
    .expect("stamp");
    tokio::time::sleep(std::time::Duration::from_millis(1_100)).await;
    let answer = pg.changed_partitions(&query("sq")).await.expect("changed");
    tx.commit().await.expect("commit");
    let after = pg.changed_partitions(&query("sq")).await.expect("changed");
    let written = after.partitions.expect("the queue")[0].last_write_at;
    assert!(
        written > answer.safe_time,
        "a write committed after the answer carries {written:?}, at or before its safeTime {:?}",
        answer.safe_time
    );
    drop(writer);
    let _ = driver.await;
    drop(pg);
    testing::drop_database(&name).await;
}
