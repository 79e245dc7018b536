//! Whole-batch acks (the delivery ledger): a client acking its batch whole is answered exactly as
//! acking each of its messages, whether the broker that served the pop commits it in one cursor
//! write or another broker acks it item by item; an ack the cursor no longer allows (released,
//! lease moved on) is answered as the item path answers it.

#![allow(clippy::expect_used, clippy::unwrap_used)] // test code: a failed expectation is the test failing

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::{metrics, start, start_pair, Client, Store};
use queen_server::config::ServerConfig;
use serde_json::{json, Value};

async fn push(addr: SocketAddr, queue: &str, ids: &[&str]) {
    let items: Vec<Value> = ids
        .iter()
        .map(|t| json!({"queue": queue, "partition": "p", "payload": {"t": t}, "transactionId": t}))
        .collect();
    let r = Client::connect(addr)
        .await
        .post("/api/v1/push", &json!({ "items": items }))
        .await;
    assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
}

/// A leased pop of up to 10; its acknowledgments, whole and in order.
async fn pop_whole(addr: SocketAddr, queue: &str) -> Value {
    let r = Client::connect(addr)
        .await
        .get(&format!(
            "/api/v1/pop/queue/{queue}?batch=10&wait=true&timeout=3000"
        ))
        .await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let acks: Vec<Value> = r.json()["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .map(|m| json!({"transactionId": m["transactionId"], "partitionId": m["partitionId"], "leaseId": m["leaseId"], "status": "completed"}))
        .collect();
    json!({ "acknowledgments": acks })
}

async fn ack(addr: SocketAddr, body: &Value) -> Vec<Value> {
    let r = Client::connect(addr)
        .await
        .post("/api/v1/ack/batch", body)
        .await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    r.json().as_array().expect("outcomes").clone()
}

fn whole_acks(addr_metrics: &Value) -> u64 {
    addr_metrics["wholeBatchAcks"]
        .as_u64()
        .expect("wholeBatchAcks")
}

/// Outcomes without the queue's name (the comparisons use two queues).
fn shape(outcomes: &[Value]) -> Vec<Value> {
    outcomes
        .iter()
        .map(|o| {
            let mut o = o.clone();
            o.as_object_mut().expect("object").remove("queueName");
            o
        })
        .collect()
}

fn released(outcomes: &[Value]) -> Vec<bool> {
    outcomes
        .iter()
        .map(|o| o["leaseReleased"].as_bool().expect("leaseReleased"))
        .collect()
}

#[tokio::test]
async fn whole_batch_acks_answer_as_item_acks_on_postgres() {
    let (a, b) = start_pair("queen_whole_acks", ServerConfig::default()).await;
    let ids = ["t1", "t2", "t3"];
    push(a.addr, "q1", &ids).await;
    push(a.addr, "q2", &ids).await;

    // The serving broker commits the batch in one write; the other acks each message.
    let here = ack(a.addr, &pop_whole(a.addr, "q1").await).await;
    assert_eq!(whole_acks(&metrics(a.addr).await), 1);
    let elsewhere = ack(b.addr, &pop_whole(a.addr, "q2").await).await;
    assert_eq!(whole_acks(&metrics(b.addr).await), 0);
    assert_eq!(shape(&here), shape(&elsewhere));
    assert!(here.iter().all(|o| o["success"] == true), "{here:?}");
    assert_eq!(released(&here), [false, false, true]);

    // Committed through the end: the next pop starts after it.
    push(a.addr, "q1", &["t4", "t5"]).await;
    let next = pop_whole(a.addr, "q1").await;
    let named: Vec<&str> = next["acknowledgments"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["transactionId"].as_str().unwrap())
        .collect();
    assert_eq!(named, ["t4", "t5"]);

    // Acked elsewhere first (item by item, releasing the lease): the serving broker's ledger still
    // matches, the cursor no longer allows the write, and the item path answers idempotently.
    let first = ack(b.addr, &next).await;
    assert_eq!(released(&first), [false, true]);
    let again = ack(a.addr, &next).await;
    assert!(again.iter().all(|o| o["success"] == true), "{again:?}");
    assert_eq!(released(&again), [false, false]);
    assert_eq!(whole_acks(&metrics(a.addr).await), 1, "not committed twice");

    // The lease expired and another consumer holds the batch: the old lease's whole ack is refused.
    let r = Client::connect(a.addr)
        .await
        .post(
            "/api/v1/configure",
            &json!({"queue": "q3", "options": {"leaseTime": 1}}),
        )
        .await;
    assert_eq!(r.status, 200);
    push(a.addr, "q3", &ids).await;
    let stale = pop_whole(a.addr, "q3").await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let current = pop_whole(b.addr, "q3").await;
    let refused = ack(a.addr, &stale).await;
    assert!(
        refused
            .iter()
            .all(|o| o["success"] == false && o["error"] == "Invalid or expired lease"),
        "{refused:?}"
    );
    let held = ack(b.addr, &current).await;
    assert_eq!(released(&held), [false, false, true]);
}

#[tokio::test]
async fn whole_batch_acks_on_the_in_memory_backend() {
    let b = start(Store::Memory, ServerConfig::default()).await;
    push(b.addr, "q", &["t1", "t2"]).await;
    let body = pop_whole(b.addr, "q").await;
    // Not whole (one message): item by item, the lease stays.
    let mut part = body.clone();
    part["acknowledgments"].as_array_mut().unwrap().truncate(1);
    assert_eq!(released(&ack(b.addr, &part).await), [false]);
    assert_eq!(whole_acks(&metrics(b.addr).await), 0);
    // Whole: one write, the last item ends the lease.
    let out = ack(b.addr, &body).await;
    assert!(out.iter().all(|o| o["success"] == true), "{out:?}");
    assert_eq!(released(&out), [false, true]);
    assert_eq!(whole_acks(&metrics(b.addr).await), 1);
}
