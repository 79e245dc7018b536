//! The release notifications of both backends, for the same acks: a lease ended by acks that
//! commit its whole batch is announced `batch_committed` (a broker's ring then forgets a
//! partition whose lease took everything), any other release is not. The model's triggers and
//! PostgreSQL's notify_cursor_event must agree, or the brokers' rings would diverge between a
//! simulation and production. Requires DATABASE_URL (the test command sets it).

#![allow(clippy::expect_used, clippy::unwrap_used)] // test code: a failed expectation is the test failing

use std::sync::{Arc, Mutex};
use std::time::Duration;

use queen_core::events::DeliveryEvent;
use queen_core::storage::{AckItem, AckStatus, BatchEnd, Claim, Storage};
use queen_core::Timestamp;
use queen_sim_tests::fixtures::{block_on, group, pop_req, Ids};
use queen_storage_pg::testing;
use queen_storage_sim::{ManualClock, SimBugs, SimDb};

fn item(tx: &str, pid: &str, status: AckStatus, lease: &str) -> AckItem {
    AckItem {
        transaction_id: tx.into(),
        partition_id: pid.into(),
        status,
        lease_id: Some(lease.into()),
        error: None,
    }
}

/// A new worker's leased pop of partition p: the worker and its one claim.
async fn lease(s: &dyn Storage, ids: &mut Ids) -> (queen_core::WorkerId, Claim) {
    let w = ids.worker();
    let mut r = s
        .pop_partition(pop_req("q", "g", w, 10), "p".into())
        .await
        .expect("pop");
    assert_eq!(r.claims.len(), 1, "one claim: {:?}", r.verdicts);
    (w, r.claims.remove(0))
}

/// Three leases of one partition, each ended differently. Answers how many releases it expects.
async fn three_releases(s: &dyn Storage) -> usize {
    let mut ids = Ids::new(3);
    s.push(vec![group(&mut ids, "q", "p", "t", 0..3)])
        .await
        .expect("push");
    // 1. Every message of the batch acked one by one: committed through its end.
    let (w, c) = lease(s, &mut ids).await;
    let pid = c.partition_id;
    let items = (0..3)
        .map(|i| {
            item(
                &format!("t-{i}"),
                &pid,
                AckStatus::Completed,
                &w.to_string(),
            )
        })
        .collect();
    s.ack("g", items).await.expect("ack 1");
    // 2. A nack of the first message: released, nothing committed.
    s.push(vec![group(&mut ids, "q", "p", "u", 0..2)])
        .await
        .expect("push");
    let (w, c) = lease(s, &mut ids).await;
    assert_eq!(c.first_offset, 3, "the second batch");
    s.ack(
        "g",
        vec![item("u-0", &pid, AckStatus::Retry, &w.to_string())],
    )
    .await
    .expect("nack");
    // 3. The redelivered batch committed whole.
    let (w, c) = lease(s, &mut ids).await;
    assert_eq!((c.first_offset, c.last_offset), (3, 4), "the redelivery");
    let committed = s
        .ack_batch_ends(
            "g",
            w,
            &[BatchEnd {
                partition_id: pid.clone(),
                end_offset: 4,
                first_transaction_id: "u-0".into(),
            }],
        )
        .await
        .expect("whole-batch ack");
    assert_eq!(committed, vec![pid], "the batch committed");
    3
}

fn committed_flags(events: &[DeliveryEvent]) -> Vec<bool> {
    events
        .iter()
        .filter_map(|e| match e {
            DeliveryEvent::Released {
                queue,
                partition,
                group,
                batch_committed,
            } => {
                assert_eq!((&**queue, &**partition, &**group), ("q", "p", "g"));
                Some(*batch_committed)
            }
            _ => None,
        })
        .collect()
}

const EXPECTED: [bool; 3] = [true, false, true];

#[test]
fn the_model_marks_releases_that_commit_their_batch() {
    let clock = ManualClock::new(Timestamp::from_secs(1_700_000_000));
    let db = SimDb::new(7, clock.as_sim_clock(), SimBugs::default());
    let heard: Arc<Mutex<Vec<DeliveryEvent>>> = Arc::default();
    let sink = heard.clone();
    let _subscription = db.subscribe(Arc::new(move |e: &DeliveryEvent| {
        sink.lock().unwrap().push(e.clone());
    }));
    let storage: Arc<dyn Storage> = db.clone();
    assert_eq!(block_on(three_releases(&*storage)), EXPECTED.len());
    assert_eq!(committed_flags(&heard.lock().unwrap()), EXPECTED);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_marks_releases_that_commit_their_batch() {
    let name = format!("queen_release_events_{}", std::process::id());
    let pg = testing::fresh_database(&name, 2).await;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(pg.listen_events(tx));
    // The listener announces itself with a Resync once it listens.
    let first = tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .expect("the listener connects");
    assert_eq!(first, Some(DeliveryEvent::Resync));
    let expected = three_releases(&pg).await;
    let mut heard = vec![];
    while committed_flags(&heard).len() < expected {
        match tokio::time::timeout(Duration::from_secs(10), rx.recv()).await {
            Ok(Some(e)) => heard.push(e),
            other => panic!("waiting for release notifications: {other:?}; heard {heard:?}"),
        }
    }
    assert_eq!(committed_flags(&heard), EXPECTED);
    drop(pg);
    testing::drop_database(&name).await;
}
