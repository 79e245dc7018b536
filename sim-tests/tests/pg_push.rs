//! Push on real PostgreSQL: de-duplication under concurrent pushes, and offsets in commit order.

#![allow(clippy::expect_used, clippy::unwrap_used)] // test code: a failed expectation is the test failing

use std::sync::Arc;

use queen_core::frames::Frame;
use queen_core::storage::{PushGroup, PushOutcome, Storage};
use queen_storage_pg::testing;

fn one(partition: &str, txid: &str, id: u128) -> PushGroup {
    PushGroup {
        queue: "dedup".into(),
        partition: partition.into(),
        frames: vec![Frame {
            message_id: uuid::Uuid::from_u128(id),
            transaction_id: txid.into(),
            trace_id: None,
            payload: b"{}".to_vec(),
        }],
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_pushes_of_one_transaction_id_store_it_once() {
    let pg =
        Arc::new(testing::fresh_database(&format!("queen_push_{}", std::process::id()), 16).await);
    for round in 0..20u128 {
        let txid = format!("same-{round}");
        let mut tasks = vec![];
        for k in 0..8u128 {
            let pg = pg.clone();
            let txid = txid.clone();
            // Half the rounds race on a partition that does not exist yet.
            let partition = if round % 2 == 0 {
                format!("fresh-{round}")
            } else {
                "p".to_string()
            };
            tasks.push(tokio::spawn(async move {
                pg.push(vec![one(&partition, &txid, round * 100 + k + 1)])
                    .await
                    .expect("push")
            }));
        }
        let mut queued = vec![];
        let mut dups = vec![];
        for t in tasks {
            match t.await.unwrap().remove(0).remove(0) {
                PushOutcome::Queued { message_id, .. } => queued.push(message_id),
                PushOutcome::Duplicate { message_id, .. } => dups.push(message_id),
            }
        }
        assert_eq!(
            queued.len(),
            1,
            "round {round}: exactly one push stores the message"
        );
        assert_eq!(dups.len(), 7);
        assert!(
            dups.iter().all(|d| *d == queued[0]),
            "round {round}: duplicates answer the winner's id"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_pushes_get_gapless_offsets_in_commit_order() {
    let pg = Arc::new(
        testing::fresh_database(&format!("queen_push_order_{}", std::process::id()), 16).await,
    );
    let mut tasks = vec![];
    for k in 0..16u128 {
        let pg = pg.clone();
        tasks.push(tokio::spawn(async move {
            let mut offsets = vec![];
            for i in 0..20u128 {
                let out = pg
                    .push(vec![one("p", &format!("w{k}-{i}"), k * 1000 + i + 1)])
                    .await
                    .expect("push");
                if let PushOutcome::Queued { offset, .. } = out[0][0] {
                    offsets.push(offset);
                }
            }
            offsets
        }));
    }
    let mut all = vec![];
    for t in tasks {
        let o = t.await.unwrap();
        assert!(
            o.windows(2).all(|w| w[0] < w[1]),
            "one producer's offsets rise"
        );
        all.extend(o);
    }
    all.sort();
    assert_eq!(
        all,
        (0..320).collect::<Vec<i64>>(),
        "offsets are gapless and unique"
    );
}
