//! Pop autopilot on both backends: a pop with `autopilot=true` gets the knobs it left out sized
//! by the broker (`queen_core::autopilot`) and the choice echoed under `autopilot`, in JSON and
//! in the framed answer; the knobs it sent are kept; a pop without it gets no echo.

#![allow(clippy::expect_used, clippy::unwrap_used)] // test code: a failed expectation is the test failing

mod common;

use std::collections::BTreeSet;

use common::{start, Client, Store};
use queen_core::autopilot::{BUDGET_PER_PARTITION, MAX_BUDGET};
use queen_core::params::DEFAULT_BATCH;
use queen_raw_client::wire;
use queen_server::config::ServerConfig;
use serde_json::{json, Value};

const PARTITIONS: usize = 40;

async fn push_one_per_partition(c: &mut Client, queue: &str) {
    let items: Vec<Value> = (0..PARTITIONS)
        .map(|i| json!({"queue": queue, "partition": format!("p{i:02}"), "payload": {"i": i}}))
        .collect();
    let r = c.post("/api/v1/push", &json!({ "items": items })).await;
    assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
}

/// The budget the autopilot gives a width (one rule: `queen_core::autopilot::size`).
fn budget_for(width: u64) -> u64 {
    (width * u64::from(BUDGET_PER_PARTITION)).clamp(u64::from(DEFAULT_BATCH), u64::from(MAX_BUDGET))
}

async fn autopilot(store: Store) {
    let b = start(store, ServerConfig::default()).await;
    let mut c = Client::connect(b.addr).await;

    // A consumer that leaves both knobs to the broker drains a queue of one message in each of
    // forty partitions in sweeps: after the group's first contact, the width follows the
    // ready partitions, and every message comes once.
    push_one_per_partition(&mut c, "ap").await;
    let mut seen = BTreeSet::new();
    let mut widths = vec![];
    for _ in 0..PARTITIONS {
        let r = c
            .get("/api/v1/pop/queue/ap?autopilot=true&wait=false&consumerGroup=g&autoAck=true")
            .await;
        if r.status == 204 {
            break;
        }
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
        let answer = r.json();
        let echo = &answer["autopilot"];
        let width = echo["partitions"].as_u64().expect("an echoed width");
        assert_eq!(echo["batch"].as_u64(), Some(budget_for(width)), "{answer}");
        assert_eq!(echo["waitMs"], 0);
        let messages = answer["messages"].as_array().unwrap();
        assert!(
            messages.len() as u64 <= width,
            "one message per partition, at most the width: {answer}"
        );
        for m in messages {
            assert!(seen.insert(m["partition"].as_str().unwrap().to_string()));
        }
        widths.push(width);
    }
    assert_eq!(
        seen.len(),
        PARTITIONS,
        "every message once; widths {widths:?}"
    );
    assert!(
        widths.iter().any(|w| *w >= 8),
        "the broker widened the sweep over the ready partitions: {widths:?}"
    );
    assert!(
        widths.len() < PARTITIONS / 2,
        "sweeps, not a partition per pop: {widths:?}"
    );

    // Knobs the request sent are kept; the others are chosen.
    push_one_per_partition(&mut c, "pinned").await;
    let r = c
        .get("/api/v1/pop/queue/pinned?autopilot=true&batch=3&wait=false&consumerGroup=g&autoAck=true")
        .await;
    assert_eq!(r.status, 200);
    let answer = r.json();
    assert_eq!(answer["autopilot"]["batch"], 3, "{answer}");
    let r = c
        .get("/api/v1/pop/queue/pinned?autopilot=true&partitions=1&wait=false&consumerGroup=g&autoAck=true")
        .await;
    assert_eq!(r.status, 200);
    let answer = r.json();
    assert_eq!(answer["autopilot"]["partitions"], 1, "{answer}");
    assert_eq!(answer["autopilot"]["batch"], DEFAULT_BATCH, "{answer}");
    assert_eq!(answer["partitionsClaimed"], 1);

    // A named partition is one wide.
    let r = c
        .get("/api/v1/pop/queue/pinned/partition/p39?autopilot=true&wait=false&consumerGroup=h")
        .await;
    assert_eq!(r.status, 200);
    let answer = r.json();
    assert_eq!(
        answer["autopilot"],
        json!({"partitions": 1, "batch": DEFAULT_BATCH, "waitMs": 0})
    );

    // Without autopilot=true there is no echo, and the defaults hold (200 messages, 1 partition).
    let r = c
        .get("/api/v1/pop/queue/pinned?wait=false&consumerGroup=k&autoAck=true")
        .await;
    assert_eq!(r.status, 200);
    let answer = r.json();
    assert!(answer.get("autopilot").is_none(), "{answer}");
    assert_eq!(answer["partitionsClaimed"], 1);

    // The framed answer carries the echo in version 1's keys.
    let r = c
        .get("/api/v1/pop/queue/pinned?autopilot=true&wait=false&consumerGroup=f&frames=true")
        .await;
    assert_eq!(r.status, 200);
    let framed = wire::read_pop_frames(&r.body);
    let keys = framed.own_keys.expect("a version 1 answer");
    let width = keys["autopilot"]["partitions"].as_u64().unwrap();
    assert_eq!(keys["autopilot"]["batch"].as_u64(), Some(budget_for(width)));
    assert!(framed.claims.len() as u64 <= width);
    let r = c
        .get("/api/v1/pop/queue/pinned?wait=false&consumerGroup=f2&frames=true")
        .await;
    assert!(wire::read_pop_frames(&r.body).own_keys.is_none());

    // Nothing to deliver: a 204, with no body to carry an echo.
    let r = c
        .get("/api/v1/pop/queue/empty-q?autopilot=true&wait=false")
        .await;
    assert_eq!(r.status, 204);

    // A malformed flag is the client's mistake.
    let r = c.get("/api/v1/pop/queue/ap?autopilot=maybe").await;
    assert_eq!(r.status, 400);
}

#[tokio::test]
async fn autopilot_on_the_memory_backend() {
    autopilot(Store::Memory).await;
}

#[tokio::test]
async fn autopilot_on_postgres() {
    autopilot(Store::Postgres("queen_autopilot")).await;
}
