//! Ephemeral queues shared by several brokers: one owner a queue, fenced by liveness. Two brokers
//! on one model database with a manual clock, each over real HTTP; the first owner's liveness
//! renewals fail (it lost its database) while the second claims the queue. The fenced owner must
//! not serve its old ring: one queue, one ring. With `serve_past_fence` (the owner keeps serving
//! once its liveness lapsed) the check fails, which the last test proves.

#![allow(clippy::expect_used, clippy::unwrap_used)] // test code: a failed expectation is the test failing

mod common;

use std::sync::Arc;

use common::fleet::Fleet;
use queen_core::ephemeral::EphemeralBugs;
use queen_server::tasks::ephemeral_liveness::renew;
use queen_storage_sim::reach::OwnerReach;
use serde_json::{json, Value};

struct Pair {
    clock: queen_storage_sim::ManualClock,
    a: Arc<queen_server::broker::Broker>,
    a_addr: std::net::SocketAddr,
    a_reach: Arc<OwnerReach>,
    b: Arc<queen_server::broker::Broker>,
    b_addr: std::net::SocketAddr,
    b_reach: Arc<OwnerReach>,
}

async fn pair() -> Pair {
    let fleet = Fleet::new();
    let a = fleet.member(1).await;
    let b = fleet.member(2).await;
    Pair {
        clock: fleet.clock,
        a: a.broker,
        a_addr: a.addr,
        a_reach: a.reach,
        b: b.broker,
        b_addr: b.addr,
        b_reach: b.reach,
    }
}

/// Moves the clock on by `ms` a second at a time, renewing the liveness of each of `alive` after
/// every second, as their liveness tasks would (the fleet runs none of its own): they stay alive
/// without a break, so they may take over a lapsed owner's queues.
async fn advance_renewing(
    clock: &queen_storage_sim::ManualClock,
    alive: &[&queen_server::broker::Broker],
    ms: u64,
) {
    for _ in 0..ms / 1000 {
        for b in alive {
            assert!(
                renew(b).await,
                "a broker meant to stay alive could not renew"
            );
        }
        clock.advance_millis(1000);
    }
    for b in alive {
        assert!(
            renew(b).await,
            "a broker meant to stay alive could not renew"
        );
    }
}

async fn push(addr: std::net::SocketAddr, queue: &str, payload: &str) -> u16 {
    let body = json!({"queue": queue, "messages": [{"payload": payload}]});
    common::request(addr, "POST", "/api/v1/ephemeral/push", Some(&body))
        .await
        .status
}

/// A pop's payloads, or its status when it is not 200.
async fn pop(addr: std::net::SocketAddr, queue: &str) -> Result<Vec<Value>, u16> {
    let r = common::request(
        addr,
        "GET",
        &format!("/api/v1/ephemeral/pop?queue={queue}&group=g&batch=10"),
        None,
    )
    .await;
    if r.status != 200 {
        return Err(r.status);
    }
    Ok(r.json()["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["payload"].clone())
        .collect())
}

/// Broker a owns `q` and holds "old"; it loses the database; past its liveness b claims `q` and
/// takes "new". Answers what a pop through a, still cut off, got: it must never be "old".
async fn after_a_lapse(bugs: EphemeralBugs) -> Result<(), String> {
    let p = pair().await;
    p.a.ephemeral.set_bugs(bugs);
    assert_eq!(push(p.a_addr, "q", "old").await, 200);
    p.a_reach.set_cut(true);
    // Past ALIVE_MS (5 s) from a's only renewal: b, alive throughout, takes the queue.
    advance_renewing(&p.clock, &[&p.b], 6_000).await;
    assert_eq!(
        push(p.b_addr, "q", "new").await,
        200,
        "b claims q and takes the push"
    );
    match pop(p.a_addr, "q").await {
        Ok(got) if got.contains(&json!("old")) => {
            return Err(format!("a served its lapsed ring: {got:?}"))
        }
        Ok(got) => assert!(got.is_empty() || got == [json!("new")], "{got:?}"),
        Err(status) => assert_eq!(status, 503, "a fenced broker answers 503"),
    }
    // a reaches the database again: it finds b the owner, and forwards.
    p.a_reach.set_cut(false);
    let got = pop(p.a_addr, "q")
        .await
        .expect("a answers once it reaches the database");
    if got != [json!("new")] {
        return Err(format!("a forwarded to the owner and got {got:?}"));
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lapsed_owner_stops_serving_before_another_claims_its_queue() {
    after_a_lapse(EphemeralBugs::default()).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serving_past_the_fence_is_caught() {
    let caught = after_a_lapse(EphemeralBugs {
        serve_past_fence: true,
        ..EphemeralBugs::default()
    })
    .await;
    assert!(
        caught.is_err(),
        "an owner serving past its fence must be caught"
    );
}

/// Every ephemeral call answers while its queue's owner is unreachable (503, for the client to
/// retry), and once the owner's liveness runs out another broker takes the queue over, empty.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_answer_while_the_owner_is_gone_and_the_queue_moves() {
    let p = pair().await;
    assert_eq!(push(p.a_addr, "q", "lost").await, 200);
    // a is gone: it neither answers nor renews (its listener is shut; its renewals fail).
    p.a_reach.set_cut(true);
    let _ = p.a.shutting_down.send(true);
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    let answered = pop(p.b_addr, "q").await;
    assert!(
        matches!(answered, Err(503) | Ok(_)),
        "b answers while a's liveness lives: {answered:?}"
    );
    advance_renewing(&p.clock, &[&p.b], 6_000).await;
    assert_eq!(pop(p.b_addr, "q").await, Ok(vec![]), "b owns q now: empty");
    assert_eq!(push(p.b_addr, "q", "kept").await, 200);
    assert_eq!(pop(p.b_addr, "q").await, Ok(vec![json!("kept")]));
}

/// An owner that loses the database for longer than its fence (a PostgreSQL restart) while no
/// other broker takes its queue keeps the ring: once it renews, the same epoch answers and the
/// contents are still there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lapse_nobody_took_over_keeps_the_ring() {
    let p = pair().await;
    assert_eq!(push(p.a_addr, "q", "kept").await, 200);
    p.a_reach.set_cut(true);
    p.clock.advance_millis(6_000);
    assert_eq!(pop(p.a_addr, "q").await, Err(503), "fenced while cut off");
    p.a_reach.set_cut(false);
    assert_eq!(pop(p.a_addr, "q").await, Ok(vec![json!("kept")]));
    // Through the other broker too: a is the owner still.
    assert_eq!(push(p.b_addr, "q", "more").await, 200);
    assert_eq!(
        pop(p.a_addr, "q").await,
        Ok(vec![]),
        "the partition is leased to the first pop"
    );
}

/// The database is gone for longer than the brokers' liveness (a PostgreSQL restart that took
/// 6 s): a owns `q` and holds "kept"; both brokers lose the database; when it is back, the first
/// call for `q` reaches b, which renews first. b has not been alive long enough to take a lapsed
/// owner's queue, so it forwards to a, which renews and keeps its ring under the same epoch.
/// Answers what a pop then got: "kept" and b's "more", never "more" alone (a's ring dropped).
async fn back_from_an_outage(bugs: EphemeralBugs) -> Result<(), String> {
    let p = pair().await;
    p.b.ephemeral.set_bugs(bugs);
    assert_eq!(push(p.a_addr, "q", "kept").await, 200);
    assert!(renew(&p.b).await, "b is alive before the outage");
    p.a_reach.set_cut(true);
    p.b_reach.set_cut(true);
    p.clock.advance_millis(6_000);
    assert_eq!(
        push(p.b_addr, "q", "lost").await,
        503,
        "b answers 503 in the outage"
    );
    p.a_reach.set_cut(false);
    p.b_reach.set_cut(false);
    assert_eq!(
        push(p.b_addr, "q", "more").await,
        200,
        "b takes a push once it is back"
    );
    match pop(p.b_addr, "q").await {
        Ok(got) if got == [json!("kept"), json!("more")] => Ok(()),
        other => Err(format!("after the outage a pop got {other:?}")),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_of_the_database_keeps_every_ring() {
    back_from_an_outage(EphemeralBugs::default()).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn taking_over_at_once_after_an_outage_is_caught() {
    let caught = back_from_an_outage(EphemeralBugs {
        take_over_at_once: true,
        ..EphemeralBugs::default()
    })
    .await;
    let Err(finding) = caught else {
        panic!("a broker back first taking every queue over must be caught");
    };
    assert!(finding.contains("\"more\""), "{finding}");
}

/// a owns `q` and holds "old"; it lapses; b takes `q` and serves it; b lapses; a comes back and,
/// staying alive, takes `q` back. Answers what a's pops got until one was served: never "old"
/// (the queue changed hands twice meanwhile, so a's ring is gone).
async fn back_after_another_owner(bugs: EphemeralBugs) -> Result<(), String> {
    let fleet = Fleet::new();
    let (a, b) = (fleet.member(1).await, fleet.member(2).await);
    a.broker.ephemeral.set_bugs(bugs);
    assert_eq!(push(a.addr, "q", "old").await, 200);
    a.reach.set_cut(true);
    advance_renewing(&fleet.clock, &[&b.broker], 6_000).await;
    assert_eq!(push(b.addr, "q", "new").await, 200);
    assert_eq!(
        pop(b.addr, "q").await,
        Ok(vec![json!("new")]),
        "b owns q now"
    );
    b.reach.set_cut(true);
    a.reach.set_cut(false);
    fleet.clock.advance_millis(6_000);
    let mut answers = vec![];
    for _ in 0..5 {
        let got = pop(a.addr, "q").await;
        answers.push(got.clone());
        match got {
            Ok(got) if got.is_empty() => return Ok(()),
            Ok(_) => break,
            // b's liveness ran out, but a is only just back: it may not take q yet.
            Err(503) => advance_renewing(&fleet.clock, &[&a.broker], 2_000).await,
            Err(_) => break,
        }
    }
    Err(format!("a's pops after it came back got {answers:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ring_replaced_meanwhile_is_dropped() {
    back_after_another_owner(EphemeralBugs::default())
        .await
        .unwrap();
}

/// A broker back from a lapse takes nothing over before a renewal has resolved the rings it
/// kept (`TAKEOVER_AFTER_MS`), and a ring of a queue that moved is dropped then, so a kept ring
/// of another epoch is reached only by taking over at once as well; the epoch check is what
/// catches it then, and taking over at once alone serves no old ring here.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keeping_a_ring_across_epochs_is_caught() {
    let at_once = EphemeralBugs {
        take_over_at_once: true,
        ..EphemeralBugs::default()
    };
    back_after_another_owner(at_once).await.unwrap();
    let caught = back_after_another_owner(EphemeralBugs {
        keep_ring_across_epochs: true,
        ..at_once
    })
    .await;
    let Err(finding) = caught else {
        panic!("an older ring serving again must be caught");
    };
    assert!(finding.contains("\"old\""), "{finding}");
}

/// a owns `q` and holds "old"; it loses the database and, while it is lapsed, nobody calls it;
/// b takes `q` and "new". a reaches the database again and renews. Answers what a pop
/// through a then got: it must be b's "new", never a's old ring. Without a call during the lapse,
/// only the renewal can tell a that it lapsed.
async fn lapse_no_call_saw(bugs: EphemeralBugs) -> Result<(), String> {
    let p = pair().await;
    p.a.ephemeral.set_bugs(bugs);
    assert_eq!(push(p.a_addr, "q", "old").await, 200);
    p.a_reach.set_cut(true);
    advance_renewing(&p.clock, &[&p.b], 6_000).await;
    assert_eq!(push(p.b_addr, "q", "new").await, 200, "b claims q");
    p.a_reach.set_cut(false);
    // One round of a's liveness task (the fleet runs none of its own).
    assert!(renew(&p.a).await, "a renews once it reaches the database");
    if bugs == EphemeralBugs::default() {
        assert!(
            !p.a.ephemeral.exists("q"),
            "a's ring of a queue that moved stays in memory after the renewal"
        );
    }
    match pop(p.a_addr, "q").await {
        Ok(got) if got == [json!("new")] => Ok(()),
        other => Err(format!(
            "a, back from a lapse no call saw, answered {other:?}"
        )),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lapse_no_call_saw_ends_at_the_next_renewal() {
    lapse_no_call_saw(EphemeralBugs::default()).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lapse_seen_only_by_calls_is_caught() {
    let caught = lapse_no_call_saw(EphemeralBugs {
        lapse_seen_only_by_calls: true,
        ..EphemeralBugs::default()
    })
    .await;
    let Err(finding) = caught else {
        panic!("an owner back from an unseen lapse serving its old ring must be caught");
    };
    assert!(finding.contains("\"old\""), "{finding}");
}
