//! Parked ephemeral pops and the wakes that reach them: a push wakes one parked consumer of each
//! group that may take it (no herd), consumers parked on a named partition included, and acks
//! hand a released partition to the next. The bound checked is generous (5 s against pops parked
//! for 30 s): a wake that does not come shows as a pop answered only at its timeout. The switch
//! `wake_queue_wide_only` (a push wakes only queue-wide pops) is caught.

#![allow(clippy::expect_used, clippy::unwrap_used)] // test code: a failed expectation is the test failing

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::{start, Store};
use queen_core::ephemeral::EphemeralBugs;
use queen_server::config::ServerConfig;
use serde_json::{json, Value};

const BOUND: Duration = Duration::from_secs(5);

fn parked_pop(addr: SocketAddr, path: String) -> tokio::task::JoinHandle<(Instant, Value)> {
    tokio::spawn(async move {
        let r = common::request(addr, "GET", &path, None).await;
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
        (Instant::now(), r.json())
    })
}

async fn push(addr: SocketAddr, queue: &str, partition: &str, n: u64) {
    let body = json!({"queue": queue, "partition": partition, "messages": [{"payload": n}]});
    let r = common::request(addr, "POST", "/api/v1/ephemeral/push", Some(&body)).await;
    assert_eq!(r.status, 200);
}

/// 40 consumers of group `g` park queue-wide, 2 of `g` and 2 of `h` on partition `named`; 20
/// pushes go to other partitions and one to `named`. Answers the messages delivered within the
/// bound, by group, each sorted.
async fn scenario(bugs: EphemeralBugs) -> (Vec<u64>, Vec<u64>) {
    let b = start(Store::Memory, ServerConfig::default()).await;
    b.app.ephemeral.set_bugs(bugs);
    let q = "wakes";
    let mut pops = tokio::task::JoinSet::new();
    let path = |group: &str, partition: Option<&str>| {
        let named = partition.map_or(String::new(), |p| format!("&partition={p}"));
        format!("/api/v1/ephemeral/pop?queue={q}&group={group}{named}&wait=true&timeout=30000&autoAck=true")
    };
    let mut parked = vec![];
    for _ in 0..40 {
        parked.push(("g", path("g", None)));
    }
    for group in ["g", "g", "h", "h"] {
        parked.push((group, path(group, Some("named"))));
    }
    for (group, path) in parked {
        let addr = b.addr;
        pops.spawn(async move {
            let r = common::request(addr, "GET", &path, None).await;
            assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
            (group, r.json())
        });
    }
    // Until both groups have pops parked (a group exists from its first pop; under load the
    // requests take a while to arrive).
    for _ in 0..100 {
        let d = common::request(
            b.addr,
            "GET",
            &format!("/api/v1/ephemeral/queues/{q}/depth"),
            None,
        )
        .await;
        let groups: Vec<Value> = d.json()["groups"].as_array().cloned().unwrap_or_default();
        if groups.len() == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let deadline = tokio::time::Instant::now() + BOUND;
    for n in 0..20 {
        push(b.addr, q, &format!("p{}", n % 4), n).await;
    }
    push(b.addr, q, "named", 100).await;
    let (mut g, mut h) = (vec![], vec![]);
    while g.len() + h.len() < 22 {
        match tokio::time::timeout_at(deadline, pops.join_next()).await {
            Ok(Some(Ok((group, answer)))) => {
                for m in answer["messages"].as_array().into_iter().flatten() {
                    let n = m["payload"].as_u64().unwrap();
                    if group == "g" {
                        g.push(n)
                    } else {
                        h.push(n)
                    }
                }
            }
            _ => break,
        }
    }
    // The rest answer empty as the broker stops.
    let _ = b.app.shutting_down.send(true);
    while pops.join_next().await.is_some() {}
    g.sort_unstable();
    h.sort_unstable();
    (g, h)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_push_wakes_one_parked_consumer_that_may_take_it() {
    let (g, h) = scenario(EphemeralBugs::default()).await;
    let mut all: Vec<u64> = (0..20).collect();
    all.push(100);
    assert_eq!(g, all, "group g: every message, each to one pop, at once");
    assert_eq!(
        h,
        vec![100],
        "group h's pop parked on the partition, at once"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waking_only_queue_wide_pops_is_caught() {
    let (_, h) = scenario(EphemeralBugs {
        wake_queue_wide_only: true,
        ..EphemeralBugs::default()
    })
    .await;
    assert!(
        h.is_empty(),
        "a partition's parked pop left waiting must be caught: {h:?}"
    );
}

/// A consumer parked while its group's only partition is leased to another gets the partition
/// when that one acks: the ack wakes it, not its timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ack_hands_the_partition_to_a_parked_consumer() {
    let b = start(Store::Memory, ServerConfig::default()).await;
    let q = "handover";
    push(b.addr, q, "p", 1).await;
    push(b.addr, q, "p", 2).await;
    let first = common::request(
        b.addr,
        "GET",
        &format!("/api/v1/ephemeral/pop?queue={q}&group=g&batch=1"),
        None,
    )
    .await
    .json();
    let waiting = parked_pop(
        b.addr,
        format!("/api/v1/ephemeral/pop?queue={q}&group=g&wait=true&timeout=30000"),
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    let acked_at = Instant::now();
    let body = json!({"queue": q, "group": "g", "acks": [{"id": first["messages"][0]["id"]}]});
    let r = common::request(b.addr, "POST", "/api/v1/ephemeral/ack", Some(&body)).await;
    assert_eq!(r.json()["results"][0]["outcome"], "acked");
    let (at, answer) = tokio::time::timeout(BOUND, waiting)
        .await
        .expect("woken by the ack")
        .unwrap();
    assert_eq!(answer["messages"][0]["payload"], 2);
    assert!(at.duration_since(acked_at) < BOUND);
    let _ = b.app.shutting_down.send(true);
}
