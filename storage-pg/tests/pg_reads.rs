//! Reads on real PostgreSQL with a writer's transaction held open:
//! - partition discovery's `safeTime`: a writer whose transaction is still open when an answer
//!   is read commits a write time above that answer's `safeTime`. A `safeTime` taken from the
//!   clock alone would not be (the writer's time is that of its transaction's start, a second
//!   earlier), so this fails if the open transactions are ignored;
//! - a fetch beside a push in flight (its offsets allocated, not committed) reads up to the
//!   committed end and reports it as the high watermark: no offset above a gap a later commit
//!   fills, and the records it read keep their offsets after that commit.

#![allow(clippy::expect_used, clippy::unwrap_used)] // test code: a failed expectation is the test failing

use queen_core::frames::{build_blob, slice_blob, Frame};
use queen_core::reads::ChangedQuery;
use queen_core::storage::{MessageStorage, PartitionRead, PushGroup, ReadStorage};
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

fn frame(txid: &str, id: u128) -> Frame {
    Frame {
        producer: None,
        encrypted: false,
        message_id: uuid::Uuid::from_u128(id),
        transaction_id: txid.into(),
        trace_id: None,
        payload: b"{}".to_vec(),
    }
}

/// (offset, transactionId) of everything a read returned, and its high watermark.
async fn read_all(pg: &queen_storage_pg::PgStorage) -> (i64, Vec<(i64, String)>) {
    let PartitionRead::Found { range, segments } = pg
        .read_partition("gq", "p", 0, u64::MAX)
        .await
        .expect("read")
    else {
        panic!("the partition exists");
    };
    let mut out = vec![];
    for s in &segments {
        let frames = slice_blob(
            &s.blob,
            s.start_idx as usize,
            s.take as usize,
            s.msg_count as usize,
        )
        .expect("frames");
        for (i, f) in frames.into_iter().enumerate() {
            out.push((
                s.base_offset + i64::from(s.start_idx) + i as i64,
                f.transaction_id,
            ));
        }
    }
    (range.high_watermark, out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fetch_beside_a_push_in_flight_stops_at_the_committed_end() {
    let name = format!("queen_reads_gap_{}", std::process::id());
    let pg = testing::fresh_database(&name, 4).await;
    pg.push(vec![PushGroup {
        queue: "gq".into(),
        partition: "p".into(),
        frames: (0..3).map(|i| frame(&format!("t{i}"), 1 + i)).collect(),
        blob: None,
    }])
    .await
    .expect("push");
    // A push in flight: offsets 3 and 4 allocated under the partition row's lock, not committed.
    let (mut writer, conn) = testing::fresh_database_config_existing(&name)
        .connect(tokio_postgres::NoTls)
        .await
        .expect("connect");
    let driver = tokio::spawn(conn);
    let tx = writer.transaction().await.expect("begin");
    let later = [frame("t3", 10), frame("t4", 11)];
    let blob = build_blob(&later).expect("blob");
    let txids: Vec<&str> = later.iter().map(|f| f.transaction_id.as_str()).collect();
    let ids: Vec<uuid::Uuid> = later.iter().map(|f| f.message_id).collect();
    let stored = tx
        .query(
            "SELECT o_status, o_offset FROM queen.push_v6('gq', 'p', $1, $2, $3, NULL, NULL, true)",
            &[&txids, &ids, &blob],
        )
        .await
        .expect("push in flight");
    assert_eq!(stored[0].get::<_, i64>(1), 3, "offsets 3.. allocated");
    let (hw, before) = read_all(&pg).await;
    assert_eq!(hw, 3, "the high watermark is the committed end");
    assert_eq!(
        before.iter().map(|(o, _)| *o).collect::<Vec<_>>(),
        vec![0, 1, 2],
        "nothing above the committed end"
    );
    tx.commit().await.expect("commit");
    let (hw, after) = read_all(&pg).await;
    assert_eq!(hw, 5);
    assert_eq!(&after[..3], &before[..], "what was read keeps its offsets");
    assert_eq!(
        after[3..]
            .iter()
            .map(|(_, t)| t.as_str())
            .collect::<Vec<_>>(),
        vec!["t3", "t4"],
        "the committed push fills the offsets after the earlier read's end"
    );
    drop(writer);
    let _ = driver.await;
    drop(pg);
    testing::drop_database(&name).await;
}
