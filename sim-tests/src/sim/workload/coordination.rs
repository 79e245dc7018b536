//! The lock holders (with the fenced resource they write) and the KV clients.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use queen_core::rng::SeededRng;
use serde_json::json;

use super::{
    KV_COUNTER, KV_COUNTER_MAX, KV_KEYS, KV_NAMESPACE, KV_PAIR, KV_TTL_KEY, KV_TTL_SECS, LOCKS,
};
use crate::sim::http::request;
use crate::sim::Shared;

/// Takes a lock (a 1 s permit) through one broker, resending through the other when the answer
/// is lost (the same owner: the broker answers the permit it holds), holds it up to 1.5 s (past
/// its lifetime, sometimes) and releases it, three times in four.
pub(super) async fn hold_locks(shared: Arc<Shared>, who: usize, owner: String, mut rng: SeededRng) {
    let timeout = Duration::from_secs(2);
    let mut k = who;
    // Per lock: this holder's tenures so far (a resent acquire answers the permit kept).
    let mut tenures: BTreeMap<&str, u64> = BTreeMap::new();
    while !shared.draining.load(Ordering::SeqCst) {
        let (name, limit) = LOCKS[rng.below(LOCKS.len() as u64) as usize];
        k += 1;
        let acquire = json!({"operations": [
            {"op": "acquire", "name": name, "ttlSeconds": 1, "owner": owner, "limit": limit}]});
        let mut granted = None;
        for attempt in 0..5 {
            let broker = &shared.brokers[(k + attempt) % shared.brokers.len()];
            let invoked = shared.now();
            match request(broker, "POST", "/api/v1/locks", Some(&acquire), timeout).await {
                Ok((200, body)) => {
                    let r = body["results"][0].clone();
                    if r["acquired"] == true {
                        if r["already"] == true {
                            shared.bump("locks: a resent acquire answered the permit held");
                        }
                        granted = Some((broker.clone(), r));
                    } else {
                        shared.bump("locks: acquire refused, permits held");
                        let tokens = r["holders"]
                            .as_array()
                            .map(|hs| hs.iter().filter_map(|h| h["token"].as_i64()).collect())
                            .unwrap_or_default();
                        if let Ok(mut refusals) = shared.lock_refusals.lock() {
                            refusals.push((name.to_string(), invoked, tokens));
                        }
                    }
                    break;
                }
                _ => {
                    shared.bump("fault: request without an answer (locks)");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
        if let Some((broker, r)) = granted {
            shared.bump("locks: acquired");
            // The holder's tenure: a resent acquire answered the permit this holder kept.
            let tenure = tenures.entry(name).or_default();
            if r["already"] != true {
                *tenure += 1;
            }
            let holder = format!("{owner}-{tenure}");
            let slot = r["slot"].as_u64().unwrap_or(0);
            let mut token = r["token"].as_i64().unwrap_or(-1);
            write_fenced(&shared, name, slot, &holder, token);
            tokio::time::sleep(Duration::from_millis(50 + rng.below(1_450))).await;
            write_fenced(&shared, name, slot, &holder, token);
            if rng.below(3) == 0 {
                // A renew, now and then after the permit's second (so some find it lapsed), and
                // a write with the token it answered.
                let renew = json!({"operations": [{"op": "renew", "name": name, "token": token,
                    "slot": slot, "ttlSeconds": 1, "owner": owner}]});
                match request(&broker, "POST", "/api/v1/locks", Some(&renew), timeout).await {
                    Ok((200, body)) if body["results"][0]["renewed"] == true => {
                        shared.bump("locks: renewed");
                        token = body["results"][0]["token"].as_i64().unwrap_or(-1);
                        tokio::time::sleep(Duration::from_millis(rng.below(900))).await;
                        write_fenced(&shared, name, slot, &holder, token);
                    }
                    Ok((200, _)) => shared.bump("locks: renew found the permit lost"),
                    _ => shared.bump("fault: request without an answer (locks)"),
                }
            }
            if rng.below(4) != 0 {
                let release = json!({"operations": [
                    {"op": "release", "name": name, "token": token, "slot": slot}]});
                if let Ok((200, body)) =
                    request(&broker, "POST", "/api/v1/locks", Some(&release), timeout).await
                {
                    shared.bump(if body["results"][0]["released"] == true {
                        "locks: released"
                    } else {
                        "locks: release found the permit expired"
                    });
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(20 + rng.below(280))).await;
    }
}

/// A holder's write to the fenced resource of (lock, slot), with its permit's token.
fn write_fenced(shared: &Shared, name: &str, slot: u64, holder: &str, token: i64) {
    if let Ok(mut fenced) = shared.fenced.lock() {
        let accepted = fenced
            .entry((name.to_string(), slot))
            .or_default()
            .write(holder, token);
        shared.bump(if accepted {
            "locks: fenced writes accepted"
        } else {
            "locks: fenced writes refused (a lapsed holder)"
        });
    }
}

/// Gets, puts (plain, `putIfAbsent`, compare-and-set on the version last seen) and deletes on
/// the shared keys, each call through one broker and never resent: a call without an answer is
/// recorded with an unknown outcome (it may have committed).
pub(super) async fn use_kv(shared: Arc<Shared>, who: usize, client: String, mut rng: SeededRng) {
    use crate::sim::kv_check::{KvCall, KvCallOp};
    let mut seen: BTreeMap<&str, i64> = BTreeMap::new();
    let mut n: i64 = 0;
    let mut counter_rng = rng.child("counter");
    let mut pair_rng = rng.child("pair");
    let mut ttl_rng = rng.child("ttl");
    // The first pair key's version this client last saw (0: absent).
    let mut pair_version = 0i64;
    while !shared.draining.load(Ordering::SeqCst) {
        // One call in five takes a permit of the counter (its own draw, so the other calls'
        // draws stay as they were).
        if counter_rng.below(5) == 0 {
            n += 1;
            incr_counter(&shared, who + n as usize).await;
            tokio::time::sleep(Duration::from_millis(20 + counter_rng.below(180))).await;
            continue;
        }
        // One in six of the rest puts or gets the TTL key (its own draws too).
        if ttl_rng.below(6) == 0 {
            n += 1;
            let value = (who as i64 + 1) * 1_000_000 + n;
            use_ttl_key(&shared, who + n as usize, value, ttl_rng.below(3) == 0).await;
            tokio::time::sleep(Duration::from_millis(20 + ttl_rng.below(400))).await;
            continue;
        }
        // One in six of the rest writes or reads the pair (its own draws too).
        if pair_rng.below(6) == 0 {
            n += 1;
            let value = (who as i64 + 1) * 1_000_000 + n;
            let write = pair_rng.below(3) != 0;
            use_pair(&shared, who + n as usize, value, write, &mut pair_version).await;
            tokio::time::sleep(Duration::from_millis(20 + pair_rng.below(180))).await;
            continue;
        }
        let key = KV_KEYS[rng.below(KV_KEYS.len() as u64) as usize];
        n += 1;
        // Unique across clients: a read that shows the value names the put that wrote it.
        let value = (who as i64 + 1) * 1_000_000 + n;
        let last = seen.get(key).copied();
        let roll = rng.below(100);
        let op = match roll {
            0..35 => KvCallOp::Get,
            35..60 => KvCallOp::Put {
                value,
                expect: None,
            },
            60..70 => KvCallOp::Put {
                value,
                expect: Some(0),
            },
            70..85 => KvCallOp::Put {
                value,
                expect: Some(last.unwrap_or(0)),
            },
            _ => KvCallOp::Delete {
                expect: last.filter(|_| roll.is_multiple_of(2)),
            },
        };
        let mut body = json!({"ns": KV_NAMESPACE, "key": key});
        match &op {
            KvCallOp::Get => body["op"] = json!("get"),
            KvCallOp::Put { value, expect } => {
                body["op"] = json!(if *expect == Some(0) {
                    "putIfAbsent"
                } else {
                    "put"
                });
                body["value"] = json!(value);
                body["forever"] = json!(true);
                if let Some(e) = expect.filter(|e| *e != 0) {
                    body["expect"] = json!(e);
                }
            }
            KvCallOp::Delete { expect } => {
                body["op"] = json!("delete");
                if let Some(e) = expect {
                    body["expect"] = json!(e);
                }
            }
            KvCallOp::Incr { delta, max } => {
                body["op"] = json!("incr");
                body["delta"] = json!(delta);
                body["max"] = json!(max);
                body["forever"] = json!(true);
            }
        }
        let broker = &shared.brokers[(who + n as usize) % shared.brokers.len()];
        let invoked = shared.now();
        let call = json!({ "operations": [body] });
        let answered = match request(
            broker,
            "POST",
            "/api/v1/kv",
            Some(&call),
            Duration::from_secs(2),
        )
        .await
        {
            Ok((200, a)) => {
                let r = a["results"][0].clone();
                if let Some(v) = r["version"].as_i64() {
                    seen.insert(key, v);
                }
                shared.bump("kv: calls answered");
                Some((shared.now(), r))
            }
            _ => {
                shared.bump("fault: request without an answer (kv)");
                None
            }
        };
        if let Ok(mut calls) = shared.kv_calls.lock() {
            calls.push(KvCall {
                client: client.clone(),
                key: key.to_string(),
                op,
                invoked,
                answered,
            });
        }
        tokio::time::sleep(Duration::from_millis(20 + rng.below(180))).await;
    }
}

/// A put of the TTL key (`KV_TTL_SECS`), or a get of it, through broker `k`, never resent.
async fn use_ttl_key(shared: &Shared, k: usize, value: i64, put: bool) {
    use crate::sim::kv_check::TtlCall;
    let broker = &shared.brokers[k % shared.brokers.len()];
    let op = if put {
        json!({"op": "put", "ns": KV_NAMESPACE, "key": KV_TTL_KEY, "value": value,
               "ttlSeconds": KV_TTL_SECS})
    } else {
        json!({"op": "get", "ns": KV_NAMESPACE, "key": KV_TTL_KEY})
    };
    let invoked = shared.now();
    let call = json!({ "operations": [op] });
    let Ok((200, answer)) = request(
        broker,
        "POST",
        "/api/v1/kv",
        Some(&call),
        Duration::from_secs(2),
    )
    .await
    else {
        shared.bump("kv: TTL key calls without an answer");
        return;
    };
    let answered = shared.now();
    let r = &answer["results"][0];
    let seen = match (put, r["version"].as_i64()) {
        (true, Some(version)) => TtlCall::Put {
            invoked,
            answered,
            version,
        },
        (true, None) => return,
        (false, version) => {
            shared.bump(if version.is_some() {
                "kv: TTL key read live"
            } else {
                "kv: TTL key read absent"
            });
            TtlCall::Get {
                invoked,
                answered,
                version,
            }
        }
    };
    if let Ok(mut calls) = shared.ttl_calls.lock() {
        calls.push(seen);
    }
}

/// A batch that writes `value` to both pair keys, the second write required and conditional on
/// the first key's version last seen (so some are refused and roll the first write back), or a
/// read of both in one call; through broker `k`, never resent.
async fn use_pair(shared: &Shared, k: usize, value: i64, write: bool, version: &mut i64) {
    let broker = &shared.brokers[k % shared.brokers.len()];
    let [first, second] = KV_PAIR;
    let call = if write {
        json!({"operations": [
            {"op": "put", "ns": KV_NAMESPACE, "key": second, "value": value, "forever": true},
            {"op": "put", "ns": KV_NAMESPACE, "key": first, "value": value, "forever": true,
             "expect": *version, "required": true}]})
    } else {
        json!({"operations": [{"op": "getMany", "ns": KV_NAMESPACE, "keys": [first, second]}]})
    };
    let Ok((200, answer)) = request(
        broker,
        "POST",
        "/api/v1/kv",
        Some(&call),
        Duration::from_secs(2),
    )
    .await
    else {
        shared.bump("kv: pair calls without an answer");
        return;
    };
    if write {
        let second_write = &answer["results"][1];
        if second_write["applied"] == true {
            shared.bump("kv: pair batches applied");
        } else {
            shared.bump("kv: pair batches refused whole");
        }
        if let Some(v) = second_write["version"].as_i64() {
            *version = v;
        }
        return;
    }
    let rows = answer["results"][0]["rows"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let value_of = |key: &str| {
        rows.iter()
            .find(|r| r["key"] == key)
            .and_then(|r| r["value"].as_i64())
    };
    if let Some(r) = rows.iter().find(|r| r["key"] == first) {
        *version = r["version"].as_i64().unwrap_or(*version);
    }
    shared.bump("kv: pair reads");
    if let Ok(mut reads) = shared.pair_reads.lock() {
        reads.push((value_of(first), value_of(second)));
    }
}

/// One `incr` of the rate-limit counter with `max`, through broker `k`: admitted (the value it
/// answered), refused at the limit, or without an answer.
async fn incr_counter(shared: &Shared, k: usize) {
    use crate::sim::kv_check::IncrOutcome;
    let broker = &shared.brokers[k % shared.brokers.len()];
    let call = json!({"operations": [{"op": "incr", "ns": KV_NAMESPACE, "key": KV_COUNTER,
                                      "delta": 1, "max": KV_COUNTER_MAX, "forever": true}]});
    let invoked = shared.now();
    let answer = request(
        broker,
        "POST",
        "/api/v1/kv",
        Some(&call),
        Duration::from_secs(2),
    )
    .await;
    // For the counter's linearizability: an answer other than 200 may hide a commit.
    let answered = match &answer {
        Ok((200, a)) => Some((shared.now(), a["results"][0].clone())),
        _ => None,
    };
    if let Ok(mut calls) = shared.kv_calls.lock() {
        calls.push(crate::sim::kv_check::KvCall {
            client: format!("incr-{k}"),
            key: KV_COUNTER.to_string(),
            op: crate::sim::kv_check::KvCallOp::Incr {
                delta: 1,
                max: Some(KV_COUNTER_MAX),
            },
            invoked,
            answered,
        });
    }
    let outcome = match answer {
        Ok((200, a)) => match (
            a["results"][0]["applied"].as_bool(),
            a["results"][0]["value"].as_i64(),
        ) {
            (Some(true), Some(v)) => {
                shared.bump("kv: increments admitted");
                IncrOutcome::Admitted(v)
            }
            (Some(false), _) => {
                shared.bump("kv: increments refused at the limit");
                IncrOutcome::Refused
            }
            _ => IncrOutcome::Unknown,
        },
        _ => {
            shared.bump("kv: increments without an answer");
            IncrOutcome::Unknown
        }
    };
    if let Ok(mut calls) = shared.incr_calls.lock() {
        calls.push(outcome);
    }
}
