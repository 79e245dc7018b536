//! Conformance cases of the key/value store, its locks, timers and the riders of transactions.

use serde_json::{json, Value};

use queen_core::kv::{parse_op, KvLimits, KvOp};
use queen_core::locks;
use queen_core::storage::{KvStorage, TxOp};
use queen_core::timers::{DueTimer, TimerOp};

use super::{e, Backend, CaseResult};
use crate::fixtures::{group, payload_ns, pop_req, Ids};

fn op(v: Value) -> Result<KvOp, String> {
    parse_op(&v, &KvLimits::default()).map_err(|e| e.message)
}

async fn one(s: &dyn KvStorage, v: Value) -> Result<Value, String> {
    let out = s.kv_batch(vec![op(v)?]).await.map_err(e)?;
    out.results
        .into_iter()
        .next()
        .ok_or_else(|| "no result".to_string())
}

fn version(v: &Value) -> i64 {
    v["version"].as_i64().unwrap_or(-1)
}

/// Versions rise with every write of a key, across a delete and a re-create; `expect` admits
/// exactly the current version, 0 exactly an absent key.
pub async fn kv_versions_rise_and_preconditions_hold(b: &dyn Backend) -> CaseResult {
    let s = b.storage();
    let v1 = one(
        &*s,
        json!({"op":"put","ns":"n","key":"k","value":{"a":1},"forever":true}),
    )
    .await?;
    ensure!(v1["applied"] == true, "first put: {v1}");
    let v2 = one(
        &*s,
        json!({"op":"put","ns":"n","key":"k","value":2,"forever":true,"expect":version(&v1)}),
    )
    .await?;
    ensure!(
        v2["applied"] == true && version(&v2) > version(&v1),
        "fenced put: {v2}"
    );
    let stale = one(
        &*s,
        json!({"op":"put","ns":"n","key":"k","value":3,"forever":true,"expect":version(&v1)}),
    )
    .await?;
    ensure_eq!(
        stale["reason"],
        json!("version"),
        "a stale version is refused: {stale}"
    );
    ensure_eq!(
        stale["value"],
        json!(2),
        "the refusal carries the current value"
    );
    let exists = one(
        &*s,
        json!({"op":"putIfAbsent","ns":"n","key":"k","value":4,"forever":true}),
    )
    .await?;
    ensure_eq!(
        exists["reason"],
        json!("exists"),
        "putIfAbsent on a live key: {exists}"
    );
    let gone = one(
        &*s,
        json!({"op":"delete","ns":"n","key":"k","expect":version(&v2)}),
    )
    .await?;
    ensure!(gone["applied"] == true, "fenced delete: {gone}");
    let absent = one(&*s, json!({"op":"delete","ns":"n","key":"k"})).await?;
    ensure_eq!(absent["reason"], json!("absent"), "delete of an absent key");
    // An expect that matches no row creates nothing, and names the absent key's version, 0.
    let fenced = one(
        &*s,
        json!({"op":"put","ns":"n","key":"k","value":5,"forever":true,"expect":42}),
    )
    .await?;
    ensure!(
        fenced["applied"] == false
            && fenced["reason"] == json!("absent")
            && fenced["version"] == json!(0),
        "an expect on an absent key: {fenced}"
    );
    let still = one(&*s, json!({"op":"get","ns":"n","key":"k"})).await?;
    ensure_eq!(
        still["found"],
        json!(false),
        "the refused put created nothing"
    );
    let again = one(
        &*s,
        json!({"op":"putIfAbsent","ns":"n","key":"k","value":5,"forever":true}),
    )
    .await?;
    ensure!(
        again["applied"] == true && version(&again) > version(&v2),
        "a re-created key never recycles a version: {again} after {v2}"
    );
    let old = one(
        &*s,
        json!({"op":"check","ns":"n","key":"k","expect":version(&v2)}),
    )
    .await?;
    ensure_eq!(
        old["reason"],
        json!("version"),
        "check against the deleted key's version"
    );
    let held = one(
        &*s,
        json!({"op":"check","ns":"n","key":"k","expect":version(&again)}),
    )
    .await?;
    ensure!(
        held["applied"] == true,
        "check at the current version: {held}"
    );
    let got = one(&*s, json!({"op":"get","ns":"n","key":"k"})).await?;
    ensure!(
        got["found"] == true && got["value"] == json!(5),
        "get: {got}"
    );
    let miss = one(&*s, json!({"op":"get","ns":"other","key":"k"})).await?;
    ensure_eq!(miss["found"], json!(false), "namespaces are apart");
    Ok(())
}

/// A key is absent from the instant it expires, swept or not; `incr` keeps a live key's expiry
/// and starts a new window on an expired one; the sweep removes only expired rows.
pub async fn kv_expiry_is_absence(b: &dyn Backend) -> CaseResult {
    let s = b.storage();
    one(
        &*s,
        json!({"op":"put","ns":"n","key":"t","value":1,"ttlSeconds":10}),
    )
    .await?;
    one(
        &*s,
        json!({"op":"put","ns":"n","key":"f","value":1,"forever":true}),
    )
    .await?;
    let first = one(
        &*s,
        json!({"op":"incr","ns":"n","key":"c","max":2,"ttlSeconds":10}),
    )
    .await?;
    ensure_eq!(
        first["value"],
        json!(1),
        "incr of an absent key starts at delta"
    );
    b.advance_secs(4).await;
    let second = one(
        &*s,
        json!({"op":"incr","ns":"n","key":"c","max":2,"ttlSeconds":10}),
    )
    .await?;
    ensure_eq!(
        second["expiresAt"],
        first["expiresAt"],
        "a live counter keeps its expiry"
    );
    let refused = one(
        &*s,
        json!({"op":"incr","ns":"n","key":"c","max":2,"ttlSeconds":10}),
    )
    .await?;
    ensure_eq!(
        refused["reason"],
        json!("limit"),
        "the third call is over max: {refused}"
    );
    ensure_eq!(refused["value"], json!(2), "a refused incr spends nothing");
    b.advance_secs(11).await;
    let t = one(&*s, json!({"op":"get","ns":"n","key":"t"})).await?;
    ensure_eq!(t["found"], json!(false), "expired before any sweep: {t}");
    let check = one(&*s, json!({"op":"check","ns":"n","key":"t","expect":0})).await?;
    ensure!(
        check["applied"] == true,
        "an expired key counts as absent: {check}"
    );
    let window = one(
        &*s,
        json!({"op":"incr","ns":"n","key":"c","max":2,"ttlSeconds":10}),
    )
    .await?;
    ensure_eq!(
        window["value"],
        json!(1),
        "an expired counter starts a new window"
    );
    let typed = one(
        &*s,
        json!({"op":"incr","ns":"n","key":"f","delta":1,"forever":true}),
    )
    .await?;
    ensure_eq!(typed["value"], json!(2), "incr of a number");
    one(
        &*s,
        json!({"op":"put","ns":"n","key":"s","value":"x","forever":true}),
    )
    .await?;
    let not_number = one(&*s, json!({"op":"incr","ns":"n","key":"s","forever":true})).await?;
    ensure_eq!(not_number["reason"], json!("type"), "incr of a string");
    for (value, what) in [(json!(1.5), "a fraction"), (json!(5.0), "a float")] {
        one(
            &*s,
            json!({"op":"put","ns":"n","key":"x","value":value,"forever":true}),
        )
        .await?;
        let r = one(&*s, json!({"op":"incr","ns":"n","key":"x","forever":true})).await?;
        ensure_eq!(r["reason"], json!("type"), "incr of {what}: {r}");
    }
    one(
        &*s,
        json!({"op":"put","ns":"n","key":"m","value":i64::MAX,"forever":true}),
    )
    .await?;
    let over = one(&*s, json!({"op":"incr","ns":"n","key":"m","forever":true})).await?;
    ensure_eq!(over["reason"], json!("limit"), "a sum past i64: {over}");
    ensure_eq!(over["value"], json!(i64::MAX), "shown as it stands: {over}");
    let floor = one(
        &*s,
        json!({"op":"incr","ns":"n","key":"f","delta":-3,"min":0,"forever":true}),
    )
    .await?;
    ensure_eq!(floor["reason"], json!("limit"), "below min: {floor}");
    let down = one(
        &*s,
        json!({"op":"incr","ns":"n","key":"f","delta":-2,"min":0,"forever":true}),
    )
    .await?;
    ensure_eq!(down["value"], json!(0), "down to min: {down}");
    let absent_over = one(
        &*s,
        json!({"op":"incr","ns":"n","key":"new","delta":5,"max":4,"ttlSeconds":10}),
    )
    .await?;
    ensure!(
        absent_over["reason"] == json!("limit") && absent_over.get("version").is_none(),
        "an absent key over max is refused and shows nothing: {absent_over}"
    );
    let swept = s.sweep_expired_kv(100).await.map_err(e)?;
    ensure_eq!(swept, 1, "the sweep removes the one expired row (t)");
    let f = one(&*s, json!({"op":"get","ns":"n","key":"f"})).await?;
    ensure!(f["found"] == true, "a forever key stays: {f}");
    Ok(())
}

/// `getPrefix` pages in key order after its cursor, without expired keys; `getMany` names what it
/// did not find.
pub async fn kv_prefix_pages_and_get_many(b: &dyn Backend) -> CaseResult {
    let s = b.storage();
    for k in ["a/1", "a/2", "a/3", "a/4", "b/1"] {
        one(
            &*s,
            json!({"op":"put","ns":"n","key":k,"value":k,"forever":true}),
        )
        .await?;
    }
    one(
        &*s,
        json!({"op":"put","ns":"n","key":"a/5","value":0,"ttlSeconds":10}),
    )
    .await?;
    b.advance_secs(11).await;
    let page = one(
        &*s,
        json!({"op":"getPrefix","ns":"n","prefix":"a/","limit":2}),
    )
    .await?;
    let keys = |p: &Value| -> Vec<Value> {
        p["rows"]
            .as_array()
            .map(|r| r.iter().map(|x| x["key"].clone()).collect())
            .unwrap_or_default()
    };
    ensure_eq!(keys(&page), vec![json!("a/1"), json!("a/2")], "first page");
    ensure!(
        page["truncated"] == true && page["nextAfter"] == json!("a/2"),
        "more: {page}"
    );
    let rest = one(
        &*s,
        json!({"op":"getPrefix","ns":"n","prefix":"a/","after":"a/2","limit":10,"keysOnly":true}),
    )
    .await?;
    ensure_eq!(
        keys(&rest),
        vec![json!("a/3"), json!("a/4")],
        "second page, expired a/5 left out"
    );
    ensure!(
        rest["truncated"] == false && rest["rows"][0].get("value").is_none(),
        "keysOnly: {rest}"
    );
    let many = one(
        &*s,
        json!({"op":"getMany","ns":"n","keys":["b/1","zz","a/5"]}),
    )
    .await?;
    ensure_eq!(keys(&many), vec![json!("b/1")], "found rows");
    ensure_eq!(
        many["missing"],
        json!(["zz", "a/5"]),
        "missing keys, the expired one included"
    );
    Ok(())
}

/// A refused `required` op rolls back the whole call, in a KV batch and in a transaction.
pub async fn kv_required_rolls_back(b: &dyn Backend) -> CaseResult {
    let s = b.storage();
    let out = s
        .kv_batch(vec![
            op(json!({"op":"put","ns":"n","key":"x","value":1,"forever":true}))?,
            op(json!({"op":"check","ns":"n","key":"y","expect":7,"required":true}))?,
        ])
        .await
        .map_err(e)?;
    ensure_eq!(out.failed, Some(1), "the check failed: {out:?}");
    ensure_eq!(out.results[1]["reason"], json!("absent"), "its verdict");
    let x = one(&*s, json!({"op":"get","ns":"n","key":"x"})).await?;
    ensure_eq!(x["found"], json!(false), "the put before it rolled back");
    // A call of one required op that is refused fails too (PostgreSQL runs a lone incr as one
    // statement: the verdict must still fail the call).
    let lone = s
        .kv_batch(vec![op(
            json!({"op":"incr","ns":"n","key":"z","delta":5,"max":3,"forever":true,"required":true}),
        )?])
        .await
        .map_err(e)?;
    ensure_eq!(
        lone.failed,
        Some(0),
        "a lone required incr over max: {lone:?}"
    );
    ensure_eq!(lone.results[0]["reason"], json!("limit"), "its verdict");

    let guarded = |expect: i64| -> Result<Vec<TxOp>, String> {
        Ok(vec![
            TxOp::Push(vec![group(
                &mut Ids::new(18 + expect as u64),
                "q",
                "p",
                "g",
                0..1,
            )]),
            TxOp::Kv(op(
                json!({"op":"put","ns":"n","key":"w","value":1,"forever":true}),
            )?),
            TxOp::Kv(op(
                json!({"op":"check","ns":"n","key":"x","expect":expect,"required":true}),
            )?),
        ])
    };
    let refused = s.transaction(guarded(3)?).await.map_err(e)?;
    ensure!(!refused.committed, "a failed guard rolls back: {refused:?}");
    ensure_eq!(
        refused.error.as_deref(),
        Some(queen_core::storage::KV_PRECONDITION),
        "its reason"
    );
    let w = one(&*s, json!({"op":"get","ns":"n","key":"w"})).await?;
    ensure_eq!(w["found"], json!(false), "the rider's write rolled back");
    let stored = s.queue_config("q").await.map_err(e)?;
    ensure!(stored.is_none(), "the push rolled back with it");
    let done = s.transaction(guarded(0)?).await.map_err(e)?;
    ensure!(done.committed, "a guard that holds commits: {done:?}");
    let w = one(&*s, json!({"op":"get","ns":"n","key":"w"})).await?;
    ensure_eq!(w["found"], json!(true), "the rider's write committed");
    Ok(())
}

async fn lock(s: &dyn KvStorage, v: Value) -> Result<Value, String> {
    let parsed = locks::parse_op(&v)?;
    s.lock_op(parsed, "minted".into()).await.map_err(e)
}

fn token(v: &Value) -> i64 {
    v["token"].as_i64().unwrap_or(-1)
}

/// A lock admits one holder (a semaphore `limit`), a resent acquire answers the same permit, a
/// renew answers a new token, a stale token is refused, and tokens only rise across holders and
/// expiries.
pub async fn locks_fence_their_holders(b: &dyn Backend) -> CaseResult {
    let s = b.storage();
    let a = lock(
        &*s,
        json!({"op":"acquire","name":"L","ttlSeconds":10,"owner":"A"}),
    )
    .await?;
    ensure!(a["acquired"] == true && a["slot"] == 0, "A acquires: {a}");
    ensure_eq!(
        a["guard"],
        locks::guard("L", 0, token(&a)),
        "the guard names the permit"
    );
    let resent = lock(
        &*s,
        json!({"op":"acquire","name":"L","ttlSeconds":10,"owner":"A"}),
    )
    .await?;
    ensure!(
        resent["already"] == true && token(&resent) == token(&a),
        "a resent acquire: {resent}"
    );
    let busy = lock(
        &*s,
        json!({"op":"acquire","name":"L","ttlSeconds":10,"owner":"B"}),
    )
    .await?;
    ensure!(
        busy["acquired"] == false && busy["holders"][0]["owner"] == "A",
        "B waits: {busy}"
    );
    let renewed = lock(
        &*s,
        json!({"op":"renew","name":"L","token":token(&a),"ttlSeconds":10}),
    )
    .await?;
    ensure!(
        renewed["renewed"] == true && token(&renewed) > token(&a),
        "renew: {renewed}"
    );
    let stale = lock(&*s, json!({"op":"release","name":"L","token":token(&a)})).await?;
    ensure_eq!(
        stale["reason"],
        json!("lost"),
        "the pre-renew token is stale"
    );
    b.advance_secs(11).await;
    let got = lock(&*s, json!({"op":"get","name":"L"})).await?;
    ensure_eq!(got["held"], json!(false), "expired: {got}");
    let bee = lock(
        &*s,
        json!({"op":"acquire","name":"L","ttlSeconds":10,"owner":"B"}),
    )
    .await?;
    ensure!(
        bee["acquired"] == true && token(&bee) > token(&renewed),
        "B after expiry: {bee}"
    );
    let zombie = lock(
        &*s,
        json!({"op":"renew","name":"L","token":token(&renewed),"ttlSeconds":10}),
    )
    .await?;
    ensure_eq!(zombie["renewed"], json!(false), "A's renew after B took it");
    let minted = lock(&*s, json!({"op":"acquire","name":"M","ttlSeconds":10})).await?;
    ensure_eq!(
        minted["owner"],
        json!("minted"),
        "an acquire without owner gets the broker's"
    );
    for (owner, want) in [("x", true), ("y", true), ("z", false)] {
        let r = lock(
            &*s,
            json!({"op":"acquire","name":"S","ttlSeconds":10,"owner":owner,"limit":2}),
        )
        .await?;
        ensure_eq!(r["acquired"], json!(want), "semaphore of 2, {owner}: {r}");
    }
    let sem = lock(&*s, json!({"op":"get","name":"S"})).await?;
    ensure_eq!(
        sem["holders"].as_array().map(Vec::len),
        Some(2),
        "two holders: {sem}"
    );
    let released = lock(&*s, json!({"op":"release","name":"L","token":token(&bee)})).await?;
    ensure_eq!(released["released"], json!(true), "B releases");
    let guard = one(
        &*s,
        json!({"op":"check","ns":"queen-locks","key":"L#0","expect":token(&bee)}),
    )
    .await?;
    ensure_eq!(
        guard["reason"],
        json!("absent"),
        "a released permit's guard fails"
    );
    Ok(())
}

fn schedule(queue: &str, key: &str, n: u32, delay_ms: i64, id: u128) -> TimerOp {
    TimerOp::Schedule {
        queue: queue.into(),
        key: key.into(),
        partition: "p".into(),
        payload: format!("{{\"n\":{n}}}").into_bytes(),
        delay_ms,
        txn: format!("txn-{n}"),
        message_id: uuid::Uuid::from_u128(id),
    }
}

fn firing(t: &DueTimer) -> Vec<TxOp> {
    queen_core::storage::firing(std::slice::from_ref(t))
}

/// The end of `timers_fire_once_never_early`: a cancel of a pending timer and of a delivered
/// one (the caller's txn echoed), and a timer rider that rolls back with its transaction.
async fn cancels_and_riders(s: &dyn queen_core::storage::Storage) -> CaseResult {
    let cancelled = s
        .timers_batch(vec![
            TimerOp::Cancel {
                queue: "tq".into(),
                key: "other".into(),
                txn: None,
            },
            TimerOp::Cancel {
                queue: "tq".into(),
                key: "k".into(),
                txn: Some("txn-2".into()),
            },
        ])
        .await
        .map_err(e)?;
    ensure_eq!(
        cancelled[0]["status"],
        json!("cancelled"),
        "a pending timer"
    );
    ensure_eq!(
        cancelled[1]["status"],
        json!("absent"),
        "a delivered timer is absent"
    );
    ensure_eq!(
        cancelled[1]["txn"],
        json!("txn-2"),
        "the caller's txn is echoed"
    );
    // A timer rider commits with its transaction, or not at all.
    let refused = s
        .transaction(vec![
            TxOp::Timer(schedule("tq", "rider", 4, 0, 4)),
            TxOp::Kv(op(
                json!({"op":"check","ns":"n","key":"none","expect":3,"required":true}),
            )?),
        ])
        .await
        .map_err(e)?;
    ensure!(!refused.committed, "the guard fails");
    ensure!(
        s.timer_peek("tq", "rider").await.map_err(e)?.is_none(),
        "the rider's timer rolled back"
    );
    Ok(())
}

/// A timer is an upsert on (queue, key); it is due only from its deliverAt; a firing removes the
/// incarnation it read, so a second firing (another broker) or a firing of a replaced
/// incarnation commits nothing, and the message is stored once.
pub async fn timers_fire_once_never_early(b: &dyn Backend) -> CaseResult {
    let s = b.storage();
    let first = s
        .timers_batch(vec![schedule("tq", "k", 1, 10_000, 1)])
        .await
        .map_err(e)?;
    ensure_eq!(
        first[0]["status"],
        json!("scheduled"),
        "a new key: {}",
        first[0]
    );
    let again = s
        .timers_batch(vec![schedule("tq", "k", 2, 10_000, 2)])
        .await
        .map_err(e)?;
    ensure_eq!(
        again[0]["status"],
        json!("rescheduled"),
        "the same key again"
    );
    ensure_eq!(
        again[0]["messageId"],
        json!(uuid::Uuid::from_u128(2).to_string()),
        "a new incarnation"
    );
    let peeked = s.timer_peek("tq", "k").await.map_err(e)?;
    ensure!(
        peeked.as_ref().is_some_and(|r| r.payload == b"{\"n\":2}"),
        "peek: {peeked:?}"
    );
    s.timers_batch(vec![schedule("tq", "other", 3, 60_000, 3)])
        .await
        .map_err(e)?;
    let page = s.timer_page("tq", None, 1).await.map_err(e)?;
    ensure_eq!(
        page.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>(),
        vec!["k", "other"],
        "a page of one, plus the one that says more"
    );
    ensure!(
        s.due_timers(10, &[]).await.map_err(e)?.is_empty(),
        "nothing is due before deliverAt"
    );
    let early = s
        .transaction(firing(&DueTimer {
            queue: "tq".into(),
            key: "k".into(),
            row: peeked.clone().ok_or("peeked")?,
        }))
        .await
        .map_err(e)?;
    ensure!(
        !early.committed,
        "a firing before deliverAt is refused: {early:?}"
    );
    b.advance_secs(11).await;
    let due = s.due_timers(10, &[]).await.map_err(e)?;
    ensure_eq!(due.len(), 1, "due after deliverAt: {due:?}");
    let skipped = s.due_timers(10, &["tq".into()]).await.map_err(e)?;
    ensure!(
        skipped.is_empty(),
        "a skipped queue's timers are left out: {skipped:?}"
    );
    ensure!(
        s.next_timer_due(&["tq".into()]).await.map_err(e)?.is_none(),
        "and so is their due time"
    );
    ensure!(
        s.next_timer_due(&[]).await.map_err(e)?.is_some(),
        "the due time, unskipped"
    );
    let fired = s.transaction(firing(&due[0])).await.map_err(e)?;
    ensure!(fired.committed, "the firing commits: {fired:?}");
    let twice = s.transaction(firing(&due[0])).await.map_err(e)?;
    ensure!(
        !twice.committed,
        "a second firing commits nothing: {twice:?}"
    );
    ensure!(
        s.timer_peek("tq", "k").await.map_err(e)?.is_none(),
        "the timer row is gone"
    );
    let mut ids = Ids::new(31);
    let w = ids.worker();
    let r = s
        .pop_partition(pop_req("tq", "g", w, 10), "p".into())
        .await
        .map_err(e)?;
    ensure_eq!(
        payload_ns(&r),
        vec![2],
        "the rescheduled payload, stored once"
    );
    cancels_and_riders(&*s).await
}
