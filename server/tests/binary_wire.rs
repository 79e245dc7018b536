//! The broker's side of Queen 2.x's binary forms, on both backends: a client-compressed segment
//! is stored and served byte for byte, a small slice of a segment ships only its frames, acks
//! name partitions by the framed answer's number, counts answers, and hostile bodies get a 400
//! that stores nothing.

#![allow(clippy::expect_used, clippy::unwrap_used)] // test code: a failed expectation is the test failing

mod common;

use common::{start, Store};
use queen_raw_client::wire::{self, Batch};
use queen_raw_client::Client;
use queen_server::config::ServerConfig;
use serde_json::json;

fn batch(queue: &str, partition: &str, n: usize, tx_prefix: &str) -> Batch {
    Batch {
        queue: queue.into(),
        partition: partition.into(),
        payloads: (0..n)
            .map(|i| format!("{{\"i\":{i}}}").into_bytes())
            .collect(),
        transaction_ids: Some((0..n).map(|i| format!("{tx_prefix}-{i}")).collect()),
    }
}

async fn pop_framed(c: &mut Client, path: &str) -> wire::FramedAnswer {
    let r = c.get(path).await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.header("content-type"), Some("application/x-queen-pop"));
    wire::read_pop_frames(&r.body)
}

async fn binary_forms(store: Store) {
    let b = start(store, ServerConfig::default()).await;
    let mut c = Client::connect(b.addr).await;
    let mut ids = 0u64;

    framed_push_and_acks_by_number(&mut c, &mut ids).await;
    plain_push_sliced_pop_and_a_transaction(&mut c, &mut ids).await;
    hostile_binary_bodies(&mut c, &mut ids).await;
}

/// A framed push (flag 8) answered per item, its zstd frame shipped untouched by a whole-segment
/// pop; acks by the framed answer's partition number.
async fn framed_push_and_acks_by_number(c: &mut Client, ids: &mut u64) {
    // A framed push (flag 8): the answer is per item; a whole-segment pop ships the client's
    // zstd frame untouched.
    let (body, blobs) = wire::push_frames(&[batch("bq", "p", 40, "a")], false, ids);
    let r = c
        .post_bytes("/api/v1/push", wire::PUSH_CONTENT_TYPE, &body)
        .await;
    assert_eq!(r.status, 201);
    let answer = r.json();
    assert_eq!(answer.as_array().unwrap().len(), 40);
    assert!(answer
        .as_array()
        .unwrap()
        .iter()
        .all(|a| a["status"] == "queued"));
    let f = pop_framed(c, "/api/v1/pop/queue/bq?batch=100&frames=true").await;
    assert_eq!(f.claims.len(), 1);
    let claim = &f.claims[0];
    assert_eq!((claim.start, claim.end, claim.records.len()), (0, 39, 1));
    assert_eq!(claim.records[0].codec, 1);
    assert_eq!(
        claim.records[0].bytes, blobs[0],
        "the stored segment is the client's frame"
    );
    let got: Vec<String> = claim
        .messages
        .iter()
        .map(|m| String::from_utf8(m.payload.clone()).unwrap())
        .collect();
    assert_eq!(got[7], "{\"i\":7}");

    // Acks by the framed answer's partition number; an unknown number finds nothing.
    let number = claim.partition_id.to_string();
    let r = c
        .post(
            "/api/v1/ack",
            &json!({"transactionId": "a-39", "partitionId": number,
        "status": "completed", "leaseId": f.lease_id}),
        )
        .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json()[0]["success"], true, "{}", r.json());
    let r = c
        .post(
            "/api/v1/ack",
            &json!({"transactionId": "a-1", "partitionId": "987654321",
        "status": "completed", "leaseId": f.lease_id}),
        )
        .await;
    assert_eq!(r.json()[0]["error"], queen_core::storage::ACK_NOT_FOUND);
}

/// A plain push (flag 4) with a zstd body and counts; a pop of a slice of a segment ships only
/// those frames; QTB1 acks one of them (the head's ack first, then the pushes in wire order).
async fn plain_push_sliced_pop_and_a_transaction(c: &mut Client, ids: &mut u64) {
    // A plain push (flag 4) with a zstd body (flag 1) and counts (flag 2); a duplicate counts.
    let plain = wire::push_plain(
        &[batch("bq", "q", 100, "b")],
        wire::FLAG_ZSTD | wire::FLAG_COUNTS,
    );
    let r = c
        .post_bytes("/api/v1/push", wire::PUSH_CONTENT_TYPE, &plain)
        .await;
    assert_eq!(r.status, 201);
    assert_eq!(
        r.json(),
        json!({"count": 100, "queued": 100, "duplicate": 0, "error": 0})
    );
    let r = c
        .post_bytes("/api/v1/push", wire::PUSH_CONTENT_TYPE, &plain)
        .await;
    assert_eq!(
        r.json(),
        json!({"count": 100, "queued": 0, "duplicate": 100, "error": 0})
    );

    // A pop of 5 from a 100-message segment ships only those frames, raw.
    let f = pop_framed(c, "/api/v1/pop/queue/bq/partition/q?batch=5&frames=true").await;
    let claim = &f.claims[0];
    assert_eq!((claim.start, claim.end), (0, 4));
    assert_eq!((claim.records[0].codec, claim.records[0].count), (0, 5));
    let txids: Vec<&str> = claim
        .messages
        .iter()
        .map(|m| m.transaction_id.as_str())
        .collect();
    assert_eq!(txids, ["b-0", "b-1", "b-2", "b-3", "b-4"]);
    // QTB1: the head's ack first, then the pushes in wire order.
    let head = json!({"operations": [{"type": "ack", "transactionId": "b-4", "partitionId": claim.partition_id.to_string(),
        "status": "completed", "leaseId": f.lease_id}], "requiredLeases": [f.lease_id]});
    let body = wire::transaction(&head, &[batch("out", "Default", 2, "t")], false, ids);
    let r = c
        .post_bytes("/api/v1/transaction", wire::PUSH_CONTENT_TYPE, &body)
        .await;
    assert_eq!(r.status, 200);
    let t = r.json();
    assert_eq!(t["success"], true, "{t}");
    let kinds: Vec<&str> = t["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["type"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["ack", "push", "push"]);
    let r = c.get("/api/v1/pop/queue/out?batch=10").await;
    assert_eq!(
        r.json()["messages"].as_array().unwrap().len(),
        2,
        "JSON stays the default answer"
    );
}

/// Hostile binary bodies: 400, nothing stored.
async fn hostile_binary_bodies(c: &mut Client, ids: &mut u64) {
    // Hostile bodies: 400, nothing stored.
    let before = c.get("/metrics").await.json()["messagesPushed"].clone();
    let good = wire::push_plain(&[batch("hostile", "p", 2, "h")], 0);
    let (framed, _) = wire::push_frames(&[batch("hostile", "p", 2, "h")], false, ids);
    let mut bad_flags = good.clone();
    bad_flags[4] |= 0x10;
    let mut trailing = good.clone();
    trailing.push(0);
    let not_json = wire::push_plain(
        &[Batch {
            payloads: vec![b"{oops".to_vec()],
            transaction_ids: None,
            ..batch("hostile", "p", 1, "h")
        }],
        0,
    );
    let empty_name = wire::push_plain(&[batch("", "p", 1, "h")], 0);
    let mut count_lies = framed.clone();
    // The group's message count (after "QPB1", flags, group count and the two names) says 3.
    let at = 4 + 1 + 4 + 2 + "hostile".len() + 2 + 1;
    count_lies[at..at + 4].copy_from_slice(&3u32.to_le_bytes());
    let huge = {
        let mut h = b"QPB1\x01".to_vec();
        h.extend_from_slice(&u32::MAX.to_le_bytes());
        h.extend_from_slice(&wire::zstd1(&[0u8; 64]));
        h
    };
    for (what, body) in [
        ("truncated", &good[..good.len() - 3]),
        ("unknown flags", &bad_flags[..]),
        ("trailing bytes", &trailing[..]),
        ("a payload that is not JSON", &not_json[..]),
        ("an empty queue name", &empty_name[..]),
        ("a frame count that lies", &count_lies[..]),
        ("a raw length that lies", &huge[..]),
        ("a bare magic", &b"QPB1"[..]),
    ] {
        let r = c
            .post_bytes("/api/v1/push", wire::PUSH_CONTENT_TYPE, body)
            .await;
        assert_eq!(
            r.status,
            400,
            "{what}: {}",
            String::from_utf8_lossy(&r.body)
        );
        assert!(
            r.json()["error"]
                .as_str()
                .unwrap()
                .starts_with("binary push"),
            "{what}"
        );
    }
    let r = c
        .post_bytes(
            "/api/v1/transaction",
            wire::PUSH_CONTENT_TYPE,
            b"QTB1\x00\xff\xff\xff\xff",
        )
        .await;
    assert_eq!(r.status, 400);
    assert_eq!(
        c.get("/metrics").await.json()["messagesPushed"],
        before,
        "nothing stored"
    );
    let r = c.get("/api/v1/pop/queue/hostile?batch=10").await;
    assert_eq!(r.status, 204);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binary_forms_on_the_memory_backend() {
    binary_forms(Store::Memory).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binary_forms_on_postgres() {
    binary_forms(Store::Postgres("queen_binary_wire")).await;
}
