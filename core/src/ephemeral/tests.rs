use super::*;
use crate::rng::SeededRng;

const INC: u64 = 0xabc;

fn at(ms: i64) -> Timestamp {
    Timestamp::from_millis(ms)
}

fn store() -> EphemeralStore {
    EphemeralStore::new(INC, 1 << 30)
}

fn texts(items: &[&str]) -> Vec<Box<str>> {
    items
        .iter()
        .map(|s| Box::from(format!("\"{s}\"")))
        .collect()
}

fn pop(s: &mut EphemeralStore, q: &str, group: &str, batch: u32, now: Timestamp) -> Vec<Delivery> {
    let req = PopRequest {
        partition: None,
        group,
        batch,
        auto_ack: false,
    };
    s.pop(q, &req, now).expect("queue exists")
}

fn payloads(d: &[Delivery]) -> Vec<&str> {
    d.iter().map(|m| m.payload.as_ref()).collect()
}

fn with(options: EphemeralOptions) -> EphemeralStore {
    let mut s = store();
    s.configure("q", options);
    s
}

#[test]
fn every_group_reads_every_message_and_one_group_shares_them() {
    let mut s = store();
    s.ensure("q", EphemeralOptions::default);
    s.push("q", "p", texts(&["a", "b", "c"]), at(0)).unwrap();
    let a = pop(&mut s, "q", "fan-a", 10, at(1));
    let b = pop(&mut s, "q", "fan-b", 10, at(1));
    assert_eq!(payloads(&a), ["\"a\"", "\"b\"", "\"c\""]);
    assert_eq!(payloads(&b), payloads(&a));
    // One group, two consumers: the partition is leased to the first until it acks.
    let w1 = pop(&mut s, "q", "workers", 2, at(1));
    let w2 = pop(&mut s, "q", "workers", 2, at(1));
    assert_eq!(payloads(&w1), ["\"a\"", "\"b\""]);
    assert!(
        w2.is_empty(),
        "a leased partition is not handed to a second consumer"
    );
    for m in &w1 {
        assert_eq!(
            s.ack("q", "workers", &m.id, AckStatus::Completed, at(2)),
            AckOutcome::Acked
        );
    }
    let w2 = pop(&mut s, "q", "workers", 2, at(2));
    assert_eq!(payloads(&w2), ["\"c\""]);
}

#[test]
fn an_expired_lease_redelivers_with_attempts_until_the_retry_limit() {
    let mut s = with(EphemeralOptions {
        lease_ms: 1000,
        retry_limit: 1,
        ..EphemeralOptions::default()
    });
    s.push("q", "p", texts(&["a"]), at(0)).unwrap();
    let first = pop(&mut s, "q", "g", 1, at(0));
    assert_eq!(first[0].attempts, 1);
    assert_eq!(s.next_lease_end("q"), Some(at(1000)));
    assert!(pop(&mut s, "q", "g", 1, at(999)).is_empty());
    let second = pop(&mut s, "q", "g", 1, at(1000));
    assert_eq!(
        (second[0].attempts, second[0].payload.as_ref()),
        (2, "\"a\"")
    );
    // The first delivery's ack comes too late.
    assert_eq!(
        s.ack("q", "g", &first[0].id, AckStatus::Completed, at(1001)),
        AckOutcome::Redelivered
    );
    // Attempt 2 is past retryLimit 1: when its lease runs out the message is dropped.
    assert!(pop(&mut s, "q", "g", 1, at(2500)).is_empty());
    let depth = s.depth("q", at(2500)).unwrap();
    assert_eq!(depth["dropped"]["retryLimit"], 1);
    assert_eq!(depth["length"], 0, "a message no group needs is freed");
}

#[test]
fn a_retry_ack_returns_the_message_first_and_counts_the_limit() {
    let mut s = with(EphemeralOptions {
        retry_limit: 2,
        ..EphemeralOptions::default()
    });
    s.push("q", "p", texts(&["a", "b"]), at(0)).unwrap();
    let mut attempts = vec![];
    for _ in 0..3 {
        let got = pop(&mut s, "q", "g", 1, at(0));
        assert_eq!(
            got[0].payload.as_ref(),
            "\"a\"",
            "FIFO holds across a retry"
        );
        attempts.push(got[0].attempts);
        assert_eq!(
            s.ack("q", "g", &got[0].id, AckStatus::Retry, at(0)),
            AckOutcome::Acked
        );
    }
    assert_eq!(attempts, [1, 2, 3]);
    let next = pop(&mut s, "q", "g", 1, at(0));
    assert_eq!(
        next[0].payload.as_ref(),
        "\"b\"",
        "a dropped after three deliveries"
    );
    assert_eq!(s.depth("q", at(0)).unwrap()["dropped"]["retryLimit"], 1);
}

#[test]
fn acks_tell_stale_from_unknown() {
    let mut s = store();
    s.ensure("q", EphemeralOptions::default);
    s.push("q", "p", texts(&["a", "b"]), at(0)).unwrap();
    let got = pop(&mut s, "q", "g", 2, at(0));
    // Another incarnation of the broker.
    let mut restarted = EphemeralStore::new(INC + 1, 1 << 30);
    restarted.ensure("q", EphemeralOptions::default);
    assert_eq!(
        restarted.ack("q", "g", &got[0].id, AckStatus::Completed, at(0)),
        AckOutcome::Stale
    );
    assert_eq!(
        s.ack("q", "g", "not-an-id", AckStatus::Completed, at(0)),
        AckOutcome::Unknown
    );
    assert_eq!(
        s.ack("q", "other", &got[0].id, AckStatus::Completed, at(0)),
        AckOutcome::Unknown,
        "another group never had it"
    );
    assert_eq!(
        s.ack("q", "g", &got[0].id, AckStatus::Completed, at(0)),
        AckOutcome::Acked
    );
    assert_eq!(
        s.ack("q", "g", &got[0].id, AckStatus::Completed, at(0)),
        AckOutcome::Unknown,
        "acked once"
    );
    assert_eq!(s.reset("q"), 1, "b was still held");
    assert_eq!(
        s.ack("q", "g", &got[1].id, AckStatus::Completed, at(0)),
        AckOutcome::Stale,
        "a reset starts a new generation"
    );
    assert_eq!(s.reset("missing"), 0);
    assert!(s.delete("q"));
    assert!(!s.delete("q"));
}

#[test]
fn reject_refuses_a_push_whole_and_drop_oldest_evicts_across_partitions() {
    let mut s = with(EphemeralOptions {
        max_length: 3,
        ..EphemeralOptions::default()
    });
    s.push("q", "p", texts(&["a", "b"]), at(0)).unwrap();
    let full = s.push("q", "p", texts(&["c", "d"]), at(0)).unwrap_err();
    assert_eq!(
        (full.kind, full.code),
        (ErrorKind::Full, "ephemeral_queue_full")
    );
    assert_eq!(
        s.depth("q", at(0)).unwrap()["length"],
        2,
        "nothing of it stored"
    );

    let mut s = with(EphemeralOptions {
        max_length: 3,
        policy: FullPolicy::DropOldest,
        ..EphemeralOptions::default()
    });
    s.push("q", "p1", texts(&["a"]), at(0)).unwrap();
    s.push("q", "p2", texts(&["b"]), at(1)).unwrap();
    s.push("q", "p1", texts(&["c"]), at(2)).unwrap();
    s.push("q", "p2", texts(&["d", "e"]), at(3)).unwrap();
    let d = s.depth("q", at(3)).unwrap();
    assert_eq!(d["length"], 3);
    assert_eq!(d["dropped"]["evicted"], 2);
    let mut seen = vec![];
    for _ in 0..2 {
        for m in pop(&mut s, "q", "g", 10, at(4)) {
            seen.push(m.payload.to_string());
        }
    }
    seen.sort();
    assert_eq!(
        seen,
        ["\"c\"", "\"d\"", "\"e\""],
        "a and b, the oldest, went"
    );
    assert!(
        s.push("q", "p", texts(&["1", "2", "3", "4"]), at(5))
            .is_err(),
        "larger than the bound itself"
    );
}

#[test]
fn max_bytes_and_the_broker_budget_bound_bytes() {
    let mut s = with(EphemeralOptions {
        max_bytes: 10,
        ..EphemeralOptions::default()
    });
    s.push("q", "p", texts(&["abc", "def"]), at(0)).unwrap(); // 5 bytes each
    assert_eq!(
        s.push("q", "p", texts(&["g"]), at(0)).unwrap_err().kind,
        ErrorKind::Full
    );

    let mut s = EphemeralStore::new(INC, 12);
    s.ensure("a", EphemeralOptions::default);
    s.ensure("b", EphemeralOptions::default);
    s.push("a", "p", texts(&["abc", "def"]), at(0)).unwrap();
    let e = s.push("b", "p", texts(&["ghi"]), at(0)).unwrap_err();
    assert_eq!(
        (e.kind, e.code),
        (ErrorKind::Budget, "ephemeral_budget_exhausted")
    );
    assert!(s.delete("a"));
    assert_eq!(s.bytes(), 0);
    s.push("b", "p", texts(&["ghi"]), at(0)).unwrap();
}

#[test]
fn messages_older_than_the_ttl_are_dropped() {
    let mut s = with(EphemeralOptions {
        ttl_ms: Some(1000),
        ..EphemeralOptions::default()
    });
    s.push("q", "p", texts(&["old"]), at(0)).unwrap();
    s.push("q", "p", texts(&["new"]), at(600)).unwrap();
    let got = pop(&mut s, "q", "g", 10, at(1000));
    assert_eq!(payloads(&got), ["\"new\""]);
    assert_eq!(s.depth("q", at(1000)).unwrap()["dropped"]["expired"], 1);
}

#[test]
fn auto_ack_commits_at_delivery_and_frees_what_every_group_completed() {
    let mut s = store();
    s.ensure("q", EphemeralOptions::default);
    s.push("q", "p", texts(&["a", "b"]), at(0)).unwrap();
    let req = PopRequest {
        partition: Some("p"),
        group: QUEUE_MODE,
        batch: 1,
        auto_ack: true,
    };
    assert_eq!(payloads(&s.pop("q", &req, at(0)).unwrap()), ["\"a\""]);
    assert_eq!(payloads(&s.pop("q", &req, at(0)).unwrap()), ["\"b\""]);
    assert!(s.pop("q", &req, at(0)).unwrap().is_empty());
    assert_eq!(s.bytes(), 0, "the only group read both");
    let other = PopRequest {
        partition: Some("nope"),
        ..req
    };
    assert!(s.pop("q", &other, at(0)).unwrap().is_empty());
}

#[test]
fn a_group_that_popped_nothing_still_gets_what_comes_next() {
    let mut s = store();
    s.ensure("q", EphemeralOptions::default);
    // Group h looks first and finds nothing (a consumer about to park); g arrives later.
    assert!(pop(&mut s, "q", "h", 1, at(0)).is_empty());
    s.push("q", "p", texts(&["a"]), at(1)).unwrap();
    let req = PopRequest {
        partition: None,
        group: "g",
        batch: 1,
        auto_ack: true,
    };
    assert_eq!(payloads(&s.pop("q", &req, at(2)).unwrap()), ["\"a\""]);
    assert_eq!(
        payloads(&pop(&mut s, "q", "h", 1, at(3))),
        ["\"a\""],
        "g completing it first does not free it from under h"
    );
    // A group that only parked (join) holds messages the same way.
    s.join("q", "k");
    s.push("q", "p", texts(&["b"]), at(4)).unwrap();
    assert_eq!(payloads(&s.pop("q", &req, at(5)).unwrap()), ["\"b\""]);
    assert_eq!(
        payloads(&pop(&mut s, "q", "k", 5, at(6))),
        ["\"a\"", "\"b\""]
    );
}

#[test]
fn options_parse_a_closed_list() {
    let o = EphemeralOptions::parse(&json!({
        "maxBytes": 100, "maxLength": 5, "policy": "drop_oldest", "ttlSeconds": 2,
        "leaseSeconds": 3, "retryLimit": 0, "windowBuffer": {"ms": 50, "count": 10}
    }))
    .unwrap();
    assert_eq!(o.policy, FullPolicy::DropOldest);
    assert_eq!((o.ttl_ms, o.lease_ms, o.retry_limit), (Some(2000), 3000, 0));
    assert_eq!(o.window_buffer, Some(WindowBuffer { ms: 50, count: 10 }));
    assert_eq!(EphemeralOptions::parse(&o.to_json()).unwrap(), o);
    for bad in [
        json!({"maxLenght": 5}),
        json!({"policy": "block"}),
        json!({"maxLength": 0}),
        json!({"leaseSeconds": -1}),
        json!({"windowBuffer": {"ms": 5}}),
        json!([1]),
    ] {
        assert!(EphemeralOptions::parse(&bad).is_err(), "{bad}");
    }
}

/// Random pushes, pops, acks, resets and clock steps against the invariants: bounds never
/// exceeded, the byte accounting exact, and per (group, partition) nothing handed out twice while
/// a lease on it lives, new messages in push order.
#[test]
fn random_operations_keep_the_invariants() {
    for seed in 0..40u64 {
        let mut rng = SeededRng::new(seed);
        let options = EphemeralOptions {
            max_length: 1 + rng.below(20),
            max_bytes: 10 + rng.below(200),
            policy: if rng.chance(1, 2) {
                FullPolicy::Reject
            } else {
                FullPolicy::DropOldest
            },
            ttl_ms: rng.chance(1, 3).then(|| 500 + rng.below(3000)),
            lease_ms: 100 + rng.below(1000),
            retry_limit: rng.below(3) as u32,
            window_buffer: None,
        };
        let mut s = EphemeralStore::new(INC, 150 + rng.below(400));
        s.configure("q", options.clone());
        let mut now = 0i64;
        let mut held: Vec<(String, Delivery, i64)> = vec![];
        // (group, partition) -> the highest first-delivery seq seen: new messages come in order.
        let mut last_new: BTreeMap<(String, String), u64> = BTreeMap::new();
        let mut counter = 0u32;
        for _ in 0..400 {
            match rng.below(10) {
                0..=3 => {
                    let n = 1 + rng.below(3) as usize;
                    let batch: Vec<Box<str>> = (0..n)
                        .map(|_| {
                            counter += 1;
                            Box::from(format!(
                                "{counter:0width$}",
                                width = 1 + rng.below(9) as usize
                            ))
                        })
                        .collect();
                    let part = format!("p{}", rng.below(3));
                    let before = s.depth("q", at(now)).unwrap()["length"].as_u64().unwrap();
                    match s.push("q", &part, batch, at(now)) {
                        Ok(k) => assert_eq!(k as usize, n),
                        Err(e) => {
                            let after = s.depth("q", at(now)).unwrap()["length"].as_u64().unwrap();
                            if e.kind == ErrorKind::Full && options.policy == FullPolicy::Reject {
                                assert_eq!(
                                    before, after,
                                    "seed {seed}: a refused push stores nothing"
                                );
                            }
                        }
                    }
                }
                4..=6 => {
                    let group = format!("g{}", rng.below(2));
                    let got = pop(&mut s, "q", &group, 1 + rng.below(4) as u32, at(now));
                    for m in got {
                        let d = DeliveryId::parse(&m.id).unwrap();
                        assert!(
                            !held.iter().any(|(g, h, _)| *g == group
                                && DeliveryId::parse(&h.id).unwrap().seq == d.seq
                                && h.partition == m.partition),
                            "seed {seed}: {} handed out twice while held",
                            m.id
                        );
                        if m.attempts == 1 {
                            let key = (group.clone(), m.partition.clone());
                            if let Some(prev) = last_new.get(&key) {
                                assert!(d.seq > *prev, "seed {seed}: new messages out of order");
                            }
                            last_new.insert(key, d.seq);
                        }
                        held.push((group.clone(), m, now));
                    }
                }
                7 | 8 if !held.is_empty() => {
                    let i = rng.below(held.len() as u64) as usize;
                    let (group, m, _) = held.swap_remove(i);
                    let status = if rng.chance(1, 3) {
                        AckStatus::Retry
                    } else {
                        AckStatus::Completed
                    };
                    s.ack("q", &group, &m.id, status, at(now));
                }
                9 => {
                    now += rng.below(700) as i64;
                    // Deliveries whose lease ran out are no longer held by anyone.
                    let lease = options.lease_ms as i64;
                    held.retain(|(_, _, popped)| popped + lease > now);
                    if rng.chance(1, 30) {
                        s.reset("q");
                        held.clear();
                        last_new.clear();
                    }
                }
                _ => {}
            }
            let d = s.depth("q", at(now)).unwrap();
            assert!(
                d["length"].as_u64().unwrap() <= options.max_length,
                "seed {seed}"
            );
            assert!(
                d["bytes"].as_u64().unwrap() <= options.max_bytes,
                "seed {seed}"
            );
            assert_eq!(
                d["bytes"].as_u64().unwrap(),
                s.bytes(),
                "seed {seed}: accounting"
            );
        }
    }
}
