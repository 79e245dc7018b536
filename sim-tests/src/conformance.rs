//! Conformance cases: written once against the storage traits, run on every backend (the
//! in-memory model in tests/conformance_sim.rs, PostgreSQL in tests/conformance_pg.rs), so the model is held to the truth.
//!
//! Each case gets a fresh backend and a clock it may advance. A case returns `Err(description)`
//! on the first divergence, so a runner can report which backend failed which rule.

use std::sync::Arc;

use async_trait::async_trait;
use queen_core::claim::SubscriptionIntent;
use queen_core::params::{SubscriptionFrom, SubscriptionMode};
use queen_core::storage::{
    AckItem, AckStatus, DeadLetterPage, DlqQuery, PopRequest, PushOutcome, QueueConfig, Removed,
    Requeued, RetentionPass, SeekTarget, Storage, TxOp, TxOpResult, Verdict,
};
use queen_core::types::QUEUE_MODE_GROUP;

use crate::fixtures::{group, messages, payload_ns, pop_req, Ids};

/// A backend under test: its storage plus control of the clock storage reads.
#[async_trait]
pub trait Backend: Send + Sync {
    fn storage(&self) -> Arc<dyn Storage>;
    /// Moves storage's now() forward.
    async fn advance_secs(&self, secs: i64);
    /// Retention: removes a partition's segments below `before`.
    async fn drop_segments(&self, queue: &str, partition: &str, before: i64);
    /// (offset, transactionId) of a queue's dead letters, in filing order.
    async fn filed_dead_letters(&self, queue: &str) -> Vec<(i64, String)>;
}

pub type CaseResult = Result<(), String>;

macro_rules! ensure {
    ($cond:expr, $($fmt:tt)*) => {
        if !$cond {
            return Err(format!("{}:{}: {}", file!(), line!(), format!($($fmt)*)));
        }
    };
}

macro_rules! ensure_eq {
    ($a:expr, $b:expr, $($fmt:tt)*) => {{
        let (a, b) = (&$a, &$b);
        if a != b {
            return Err(format!("{}:{}: {}: {:?} != {:?}", file!(), line!(), format!($($fmt)*), a, b));
        }
    }};
}

mod conflation;
mod ephemeral;
mod kv;
mod reads;
mod rounds;
mod streams;
pub use conflation::*;
pub use ephemeral::*;
pub use kv::*;
pub use reads::*;
pub use rounds::*;
pub use streams::*;

/// Whether the group has any backlog in the queue, claimable or leased.
async fn backlog(s: &dyn Storage, queue: &str, group: &str) -> Result<bool, String> {
    Ok(s.next_pending(&[queue.to_string()], group)
        .await
        .map_err(e)?
        .is_some())
}

fn e(err: impl std::fmt::Display) -> String {
    err.to_string()
}

fn verdict_of(r: &queen_core::storage::PopResult, p: &str) -> Option<Verdict> {
    r.verdicts.iter().find(|(n, _)| n == p).map(|(_, v)| *v)
}

async fn push(
    s: &dyn Storage,
    ids: &mut Ids,
    q: &str,
    p: &str,
    prefix: &str,
    range: std::ops::Range<u32>,
) -> Result<Vec<PushOutcome>, String> {
    let mut r = s
        .push(vec![group(ids, q, p, prefix, range)])
        .await
        .map_err(e)?;
    r.pop().ok_or_else(|| "push returned no group".to_string())
}

async fn configure(s: &dyn Storage, config: QueueConfig) -> CaseResult {
    s.configure_queue(config).await.map(|_| ()).map_err(e)
}

fn ack(tx: &str, pid: &str, status: AckStatus, lease: Option<String>) -> AckItem {
    AckItem {
        transaction_id: tx.into(),
        partition_id: pid.into(),
        status,
        lease_id: lease,
        error: None,
    }
}

/// The admin plane's partition reads: pages by bytewise name after a name, with every cursor or
/// one group's; by id in (queue, name) order, leaving out ids of no partition.
pub async fn partition_views_page_and_by_id(b: &dyn Backend) -> CaseResult {
    let s = b.storage();
    let mut ids = Ids::new(95);
    let mut pid = std::collections::BTreeMap::new();
    for p in ["c", "a", "b"] {
        let out = push(&*s, &mut ids, "iv", p, "t", 0..2).await?;
        let Some(PushOutcome::Queued { partition_id, .. }) = out.first() else {
            return Err(format!("push to {p}: {out:?}"));
        };
        pid.insert(p, partition_id.clone());
    }
    for g in ["g", QUEUE_MODE_GROUP] {
        let w = ids.worker();
        s.pop_partition(pop_req("iv", g, w, 1), "b".into())
            .await
            .map_err(e)?;
    }
    let names = |v: &[queen_core::storage::PartitionView]| -> Vec<String> {
        v.iter().map(|p| p.partition.clone()).collect()
    };
    let first = s
        .partition_views_page("iv", None, 2, None)
        .await
        .map_err(e)?;
    ensure_eq!(names(&first), vec!["a", "b"], "first page");
    let groups: Vec<&str> = first[1].cursors.iter().map(|c| c.group.as_str()).collect();
    ensure_eq!(groups, vec![QUEUE_MODE_GROUP, "g"], "every cursor on b");
    let rest = s
        .partition_views_page("iv", Some("b"), 2, None)
        .await
        .map_err(e)?;
    ensure_eq!(names(&rest), vec!["c"], "the page after b");
    let of_g = s
        .partition_views_page("iv", Some("a"), 1, Some("g"))
        .await
        .map_err(e)?;
    let groups: Vec<&str> = of_g[0].cursors.iter().map(|c| c.group.as_str()).collect();
    ensure_eq!(groups, vec!["g"], "g's cursor only");
    let asked = vec![
        pid["c"].clone(),
        "not-a-uuid".to_string(),
        pid["a"].clone(),
        uuid::Uuid::from_u128(7).to_string(),
        pid["c"].clone(),
    ];
    let found = s.partition_views_by_id(&asked).await.map_err(e)?;
    ensure_eq!(names(&found), vec!["a", "c"], "by id");
    ensure_eq!(
        (found[0].last_offset, found[0].partition_id.clone()),
        (1, pid["a"].clone()),
        "a's view"
    );
    // The whole queue in one read holds what its pages hold (leases, every cursor, a partition
    // no group read), in any order.
    let mut whole = vec![];
    let seen = s
        .each_partition_of("iv", &mut |p| whole.push(p))
        .await
        .map_err(e)?;
    whole.sort_by(|a, b| a.partition.cmp(&b.partition));
    let paged = s
        .partition_views_page("iv", None, 100, None)
        .await
        .map_err(e)?;
    ensure_eq!(seen, 3, "partitions the whole read counted");
    ensure_eq!(whole, paged, "the whole queue against its pages");
    let mut none = 0;
    let seen = s
        .each_partition_of("no-such-queue", &mut |_| none += 1)
        .await
        .map_err(e)?;
    ensure_eq!((seen, none), (0, 0), "a queue that does not exist");
    // Several queues in one read hold what each queue's own read holds, each partition with its
    // queue's place in the list; a queue that does not exist has none.
    push(&*s, &mut ids, "iv2", "x", "t", 0..3).await?;
    let asked = ["iv2", "no-such-queue", "iv"].map(String::from);
    let mut together = vec![];
    let counts = s
        .each_partition_of_queues(&asked, &mut |at, p| together.push((at, p)))
        .await
        .map_err(e)?;
    together.sort_by(|a, b| (a.0, &a.1.partition).cmp(&(b.0, &b.1.partition)));
    let mut alone = vec![];
    for (at, q) in asked.iter().enumerate() {
        let mut of_q = vec![];
        s.each_partition_of(q, &mut |p| of_q.push((at, p)))
            .await
            .map_err(e)?;
        of_q.sort_by(|a, b| a.1.partition.cmp(&b.1.partition));
        alone.extend(of_q);
    }
    ensure_eq!(
        counts,
        vec![1, 0, 3],
        "partitions of each queue read together"
    );
    ensure_eq!(together, alone, "queues read together against each alone");
    Ok(())
}

/// The admin totals' stored pass: the later of two stays whatever order they are stored in, and
/// a broker holding a pass reads a body only when a newer one is stored.
pub async fn stored_totals_keep_the_later_pass(b: &dyn Backend) -> CaseResult {
    use queen_core::storage::StoredTotals;
    use queen_core::Timestamp;
    let s = b.storage();
    ensure_eq!(
        s.stored_totals(None).await.map_err(e)?,
        None,
        "none stored yet"
    );
    let pass = |secs: i64, body: &[u8]| StoredTotals {
        taken_at: Timestamp(1_700_000_000_000_000 + secs * 1_000_000),
        body: body.to_vec(),
    };
    s.store_totals(&pass(10, b"second")).await.map_err(e)?;
    s.store_totals(&pass(5, b"first, finished last"))
        .await
        .map_err(e)?;
    ensure_eq!(
        s.stored_totals(None).await.map_err(e)?,
        Some(pass(10, b"second")),
        "an earlier pass does not replace a later one"
    );
    s.store_totals(&pass(20, b"third")).await.map_err(e)?;
    ensure_eq!(
        s.stored_totals(Some(pass(10, b"").taken_at))
            .await
            .map_err(e)?,
        Some(pass(20, b"third")),
        "newer than the pass held"
    );
    ensure_eq!(
        s.stored_totals(Some(pass(20, b"").taken_at))
            .await
            .map_err(e)?,
        None,
        "nothing newer than the pass held"
    );
    Ok(())
}

/// Messages by creation time (the analytics route): counted per queue and per interval where they
/// are stored, a queue alone when asked, the window's end excluded.
pub async fn messages_created_per_interval(b: &dyn Backend) -> CaseResult {
    use queen_core::Timestamp;
    let s = b.storage();
    let mut ids = Ids::new(97);
    push(&*s, &mut ids, "an1", "p", "t", 0..3).await?;
    b.advance_secs(3600).await;
    push(&*s, &mut ids, "an1", "p", "u", 0..2).await?;
    push(&*s, &mut ids, "an2", "p", "t", 0..1).await?;
    // 1970 to the year 3000: every message of the case.
    let (from, to) = (Timestamp(0), Timestamp(32_503_680_000_000_000));
    let all = s.messages_created(from, to, 3600, None).await.map_err(e)?;
    let mine: Vec<_> = all
        .iter()
        .filter(|c| c.queue == "an1" || c.queue == "an2")
        .collect();
    let shape: Vec<(&str, u64)> = mine
        .iter()
        .map(|c| (c.queue.as_str(), c.messages))
        .collect();
    ensure_eq!(
        shape,
        vec![("an1", 3), ("an1", 2), ("an2", 1)],
        "per queue and hour"
    );
    ensure_eq!(
        mine[1].bucket.0 - mine[0].bucket.0,
        3_600_000_000,
        "an1's two pushes an hour apart, in consecutive hours"
    );
    ensure!(
        mine.iter().all(|c| c.bucket.0 % 3_600_000_000 == 0),
        "intervals start at multiples of their width: {mine:?}"
    );
    ensure_eq!(
        mine[2].bucket,
        mine[1].bucket,
        "an2's push in an1's second hour"
    );
    let one = s
        .messages_created(from, to, 60, Some("an2"))
        .await
        .map_err(e)?;
    let shape: Vec<(&str, u64)> = one.iter().map(|c| (c.queue.as_str(), c.messages)).collect();
    ensure_eq!(shape, vec![("an2", 1)], "an2 alone, per minute");
    let before = s
        .messages_created(from, mine[1].bucket, 3600, Some("an1"))
        .await
        .map_err(e)?;
    let shape: Vec<u64> = before.iter().map(|c| c.messages).collect();
    ensure_eq!(
        shape,
        vec![3],
        "a window ending where the second hour starts"
    );
    Ok(())
}

/// A pushed, leased batch comes back exactly as pushed; the cursor does not move on a lease.
pub async fn leased_pop_delivers_in_order(b: &dyn Backend) -> CaseResult {
    let s = b.storage();
    let mut ids = Ids::new(1);
    let out = push(&*s, &mut ids, "q", "p1", "t", 0..3).await?;
    ensure_eq!(out.len(), 3, "push outcomes");
    ensure!(
        out.iter().all(|o| matches!(o, PushOutcome::Queued { .. })),
        "all queued: {out:?}"
    );
    let w = ids.worker();
    let r = s
        .pop_partition(pop_req("q", QUEUE_MODE_GROUP, w, 10), "p1".into())
        .await
        .map_err(e)?;
    ensure_eq!(payload_ns(&r), vec![0, 1, 2], "payloads");
    let c = &r.claims[0];
    ensure_eq!(
        (c.first_offset, c.last_offset, c.attempt_count),
        (0, 2, 1),
        "claim span"
    );
    ensure!(!c.partition_id.is_empty(), "partition id present");
    ensure!(c.lease_expires_at.is_some(), "leased");
    ensure!(
        matches!(verdict_of(&r, "p1"), Some(Verdict::Took { count: 3, .. })),
        "verdict {:?}",
        r.verdicts
    );
    // A second consumer of the same group sees the live lease.
    let r2 = s
        .pop_partition(
            pop_req("q", QUEUE_MODE_GROUP, ids.worker(), 10),
            "p1".into(),
        )
        .await
        .map_err(e)?;
    ensure!(
        r2.claims.is_empty(),
        "second pop during the lease took {:?}",
        r2.claims
    );
    ensure!(
        matches!(verdict_of(&r2, "p1"), Some(Verdict::LeasedUntil(_))),
        "verdict {:?}",
        r2.verdicts
    );
    Ok(())
}

/// The lease length is COALESCE(leaseSeconds, queue lease_time, 60).
pub async fn lease_length_coalesces(b: &dyn Backend) -> CaseResult {
    let s = b.storage();
    let mut ids = Ids::new(2);
    configure(
        &*s,
        QueueConfig {
            lease_time_secs: 100,
            ..QueueConfig::with_defaults("q")
        },
    )
    .await?;
    push(&*s, &mut ids, "q", "p", "t", 0..2).await?;
    let r = s
        .pop_partition(pop_req("q", "g1", ids.worker(), 10), "p".into())
        .await
        .map_err(e)?;
    let now_ish = r.claims[0].lease_expires_at.ok_or("no lease")?;
    let r2 = s
        .pop_partition(
            PopRequest {
                lease_seconds: Some(5),
                ..pop_req("q", "g2", ids.worker(), 10)
            },
            "p".into(),
        )
        .await
        .map_err(e)?;
    let short = r2.claims[0].lease_expires_at.ok_or("no lease")?;
    let diff = now_ish.0 - short.0;
    ensure!(
        (94_000_000..=96_000_000).contains(&diff),
        "lease 100 s vs 5 s differ by {diff} us"
    );
    configure(
        &*s,
        QueueConfig {
            lease_time_secs: 0,
            ..QueueConfig::with_defaults("q")
        },
    )
    .await?;
    let r3 = s
        .pop_partition(pop_req("q", "g3", ids.worker(), 10), "p".into())
        .await
        .map_err(e)?;
    let dflt = r3.claims[0].lease_expires_at.ok_or("no lease")?;
    let diff = dflt.0 - short.0;
    ensure!(
        (54_000_000..=56_000_000).contains(&diff),
        "lease_time 0 falls back to 60 s: {diff} us"
    );
    Ok(())
}

/// autoAck commits inside the pop: nothing is redelivered, no lease is held.
pub async fn auto_ack_commits(b: &dyn Backend) -> CaseResult {
    let s = b.storage();
    let mut ids = Ids::new(3);
    push(&*s, &mut ids, "q", "p", "t", 0..3).await?;
    let req = PopRequest {
        auto_ack: true,
        ..pop_req("q", "g", ids.worker(), 2)
    };
    let r = s.pop_partition(req.clone(), "p".into()).await.map_err(e)?;
    ensure_eq!(payload_ns(&r), vec![0, 1], "first autoAck batch");
    ensure!(
        r.claims[0].lease_expires_at.is_none(),
        "no lease on autoAck"
    );
    let r = s
        .pop_partition(
            PopRequest {
                worker: ids.worker(),
                ..req.clone()
            },
            "p".into(),
        )
        .await
        .map_err(e)?;
    ensure_eq!(
        payload_ns(&r),
        vec![2],
        "second autoAck batch continues after the commit"
    );
    b.advance_secs(3600).await;
    let r = s
        .pop_partition(
            PopRequest {
                worker: ids.worker(),
                ..req
            },
            "p".into(),
        )
        .await
        .map_err(e)?;
    ensure!(r.claims.is_empty(), "autoAck deliveries never repeat");
    Ok(())
}

/// An expired lease's span is redelivered with attempt_count + 1; fresh work resets it to 1.
pub async fn expiry_redelivers_and_counts_attempts(b: &dyn Backend) -> CaseResult {
    let s = b.storage();
    let mut ids = Ids::new(4);
    push(&*s, &mut ids, "q", "p", "t", 0..4).await?;
    let req = |w| PopRequest {
        lease_seconds: Some(10),
        ..pop_req("q", "g", w, 2)
    };
    let r = s
        .pop_partition(req(ids.worker()), "p".into())
        .await
        .map_err(e)?;
    ensure_eq!(
        (r.claims[0].first_offset, r.claims[0].attempt_count),
        (0, 1),
        "first delivery"
    );
    b.advance_secs(11).await;
    let w2 = ids.worker();
    let r = s.pop_partition(req(w2), "p".into()).await.map_err(e)?;
    ensure_eq!(
        (r.claims[0].first_offset, r.claims[0].attempt_count),
        (0, 2),
        "redelivery after expiry"
    );
    let pid = r.claims[0].partition_id.clone();
    let o = s
        .ack(
            "g",
            vec![ack("t-1", &pid, AckStatus::Completed, Some(w2.to_string()))],
        )
        .await
        .map_err(e)?;
    ensure!(
        o[0].success && o[0].lease_released,
        "ack of the whole batch releases: {o:?}"
    );
    let r = s
        .pop_partition(req(ids.worker()), "p".into())
        .await
        .map_err(e)?;
    ensure_eq!(
        (r.claims[0].first_offset, r.claims[0].attempt_count),
        (2, 1),
        "fresh work resets the count"
    );
    Ok(())
}

/// Acking a prefix advances the cursor to it and keeps the lease on the rest; a stale lease id is refused.
pub async fn positional_ack_and_fencing(b: &dyn Backend) -> CaseResult {
    let s = b.storage();
    let mut ids = Ids::new(5);
    push(&*s, &mut ids, "q", "p", "t", 0..3).await?;
    let w = ids.worker();
    let r = s
        .pop_partition(pop_req("q", "g", w, 10), "p".into())
        .await
        .map_err(e)?;
    let pid = r.claims[0].partition_id.clone();
    let wrong = ids.worker().to_string();
    let o = s
        .ack(
            "g",
            vec![ack("t-0", &pid, AckStatus::Completed, Some(wrong))],
        )
        .await
        .map_err(e)?;
    ensure!(
        !o[0].success && o[0].error.as_deref() == Some("Invalid or expired lease"),
        "wrong lease refused: {o:?}"
    );
    let o = s
        .ack(
            "g",
            vec![ack("t-1", &pid, AckStatus::Completed, Some(w.to_string()))],
        )
        .await
        .map_err(e)?;
    ensure!(
        o[0].success && !o[0].lease_released && !o[0].noop,
        "prefix ack keeps the lease: {o:?}"
    );
    let r2 = s
        .pop_partition(pop_req("q", "g", ids.worker(), 10), "p".into())
        .await
        .map_err(e)?;
    ensure!(r2.claims.is_empty(), "the rest is still leased");
    // Re-acking is idempotent; an ack of another group is refused (no cursor there).
    let o = s
        .ack(
            "g",
            vec![ack("t-0", &pid, AckStatus::Completed, Some(w.to_string()))],
        )
        .await
        .map_err(e)?;
    ensure!(
        o[0].success && o[0].noop,
        "re-ack is idempotent, and says so: {o:?}"
    );
    // A nack the cursor already passed cannot be honoured: refused, nothing changes.
    for status in [AckStatus::Failed, AckStatus::Retry, AckStatus::Dlq] {
        let o = s
            .ack("g", vec![ack("t-0", &pid, status, Some(w.to_string()))])
            .await
            .map_err(e)?;
        ensure!(
            !o[0].success
                && o[0].error.as_deref() == Some(queen_core::storage::ACK_ALREADY_COMMITTED)
                && !o[0].lease_released
                && !o[0].dlq,
            "a nack below the cursor is refused: {o:?}"
        );
    }
    let r2 = s
        .pop_partition(pop_req("q", "g", ids.worker(), 10), "p".into())
        .await
        .map_err(e)?;
    ensure!(
        r2.claims.is_empty(),
        "the refused nacks left the lease alone"
    );
    let o = s
        .ack("other", vec![ack("t-2", &pid, AckStatus::Completed, None)])
        .await
        .map_err(e)?;
    ensure!(!o[0].success, "wrong group refused: {o:?}");
    let o = s
        .ack(
            "g",
            vec![ack("t-2", &pid, AckStatus::Completed, Some(w.to_string()))],
        )
        .await
        .map_err(e)?;
    ensure!(
        o[0].success && o[0].lease_released,
        "last ack releases: {o:?}"
    );
    let o = s
        .ack("g", vec![ack("nope", &pid, AckStatus::Completed, None)])
        .await
        .map_err(e)?;
    ensure_eq!(
        o[0].error.as_deref(),
        Some(queen_core::storage::ACK_NOT_FOUND),
        "unknown transaction id"
    );
    Ok(())
}

/// De-duplication by (partition, transactionId): the original id, in and across requests.
pub async fn dedup_by_partition_and_transaction_id(b: &dyn Backend) -> CaseResult {
    let s = b.storage();
    let mut ids = Ids::new(6);
    let first = push(&*s, &mut ids, "q", "p", "t", 0..1).await?;
    let PushOutcome::Queued { message_id, .. } = first[0] else {
        return Err(format!("not queued: {first:?}"));
    };
    let again = push(&*s, &mut ids, "q", "p", "t", 0..1).await?;
    ensure!(
        matches!(again[0], PushOutcome::Duplicate { message_id: m, .. } if m == message_id),
        "duplicate carries the original id: {again:?}"
    );
    let other = push(&*s, &mut ids, "q", "p2", "t", 0..1).await?;
    ensure!(
        matches!(other[0], PushOutcome::Queued { .. }),
        "another partition is a new message"
    );
    let mut g = group(&mut ids, "q", "p3", "x", 0..3);
    for f in &mut g.frames {
        f.transaction_id = "same".into();
    }
    let out = s.push(vec![g]).await.map_err(e)?;
    let out = &out[0];
    ensure!(
        matches!(out[0], PushOutcome::Queued { .. }),
        "first occurrence wins"
    );
    let PushOutcome::Queued {
        message_id: winner, ..
    } = out[0]
    else {
        return Err("unreachable".into());
    };
    ensure!(
        out[1..].iter().all(
            |o| matches!(o, PushOutcome::Duplicate { message_id, .. } if *message_id == winner)
        ),
        "intra-request duplicates: {out:?}"
    );
    let r = s
        .pop_partition(pop_req("q", "g", ids.worker(), 10), "p3".into())
        .await
        .map_err(e)?;
    ensure_eq!(r.claims[0].message_count(), 1, "only one message stored");
    Ok(())
}

/// Seeding order: durable record, then pop-carried intent, then -1; queue mode never skips.
pub async fn subscription_seeding(b: &dyn Backend) -> CaseResult {
    let s = b.storage();
    let mut ids = Ids::new(7);
    push(&*s, &mut ids, "q", "p", "old", 0..5).await?;
    let new = SubscriptionIntent {
        mode: SubscriptionMode::New,
        from: SubscriptionFrom::Unset,
    };
    let r = s
        .pop_partition(
            PopRequest {
                intent: new,
                ..pop_req("q", "g-new", ids.worker(), 10)
            },
            "p".into(),
        )
        .await
        .map_err(e)?;
    ensure!(r.claims.is_empty(), "mode new skips the backlog");
    let r = s
        .pop_partition(
            PopRequest {
                intent: new,
                ..pop_req("q", QUEUE_MODE_GROUP, ids.worker(), 10)
            },
            "p".into(),
        )
        .await
        .map_err(e)?;
    ensure_eq!(
        payload_ns(&r),
        vec![0, 1, 2, 3, 4],
        "queue mode never skips backlog"
    );
    let r = s
        .pop_partition(pop_req("q", "g-all", ids.worker(), 10), "p".into())
        .await
        .map_err(e)?;
    ensure_eq!(r.message_count(), 5, "mode all delivers everything");
    let now_intent = SubscriptionIntent {
        mode: SubscriptionMode::All,
        from: SubscriptionFrom::Now,
    };
    let r = s
        .pop_partition(
            PopRequest {
                intent: now_intent,
                ..pop_req("q", "g-now", ids.worker(), 10)
            },
            "p".into(),
        )
        .await
        .map_err(e)?;
    ensure!(
        r.claims.is_empty(),
        "subscriptionFrom=now skips the backlog"
    );
    b.advance_secs(10).await;
    push(&*s, &mut ids, "q", "p", "later", 0..2).await?;
    let r = s
        .pop_partition(pop_req("q", "g-new", ids.worker(), 10), "p".into())
        .await
        .map_err(e)?;
    ensure_eq!(
        payload_ns(&r),
        vec![0, 1],
        "the group then sees only new messages"
    );
    // An existing cursor is never re-seeded, whatever a later pop carries.
    let r = s
        .pop_partition(
            PopRequest {
                intent: new,
                ..pop_req("q", "g-all", ids.worker(), 10)
            },
            "p".into(),
        )
        .await
        .map_err(e)?;
    ensure!(
        r.claims.is_empty(),
        "g-all is leased (5 messages outstanding)"
    );
    Ok(())
}

/// A group registered through the wildcard path with a timestamp sees the whole backlog of a
/// partition created after it subscribed.
pub async fn durable_subscription_covers_later_partitions(b: &dyn Backend) -> CaseResult {
    let s = b.storage();
    let mut ids = Ids::new(8);
    push(&*s, &mut ids, "q", "a", "old", 0..3).await?;
    b.advance_secs(5).await;
    let new = SubscriptionIntent {
        mode: SubscriptionMode::New,
        from: SubscriptionFrom::Unset,
    };
    let r = s
        .pop_wildcard(PopRequest {
            intent: new,
            ..pop_req("q", "g", ids.worker(), 10)
        })
        .await
        .map_err(e)?;
    ensure!(
        r.claims.is_empty(),
        "registration with mode new skips existing backlog: {:?}",
        r.claims
    );
    b.advance_secs(5).await;
    push(&*s, &mut ids, "q", "b", "fresh", 0..4).await?;
    let r = s
        .pop_wildcard(pop_req("q", "g", ids.worker(), 10))
        .await
        .map_err(e)?;
    ensure_eq!(
        payload_ns(&r),
        vec![0, 1, 2, 3],
        "the later partition's whole backlog"
    );
    let r = s
        .pop_wildcard(pop_req("q", "g", ids.worker(), 10))
        .await
        .map_err(e)?;
    ensure!(
        r.claims.is_empty(),
        "partition a stays skipped: {:?}",
        r.claims
    );
    Ok(())
}

/// delayedProcessing is enforced in storage, also on the ring path; windowBuffer is bypassed
/// only when the broker says it owns the hold.
pub async fn visibility_gates(b: &dyn Backend) -> CaseResult {
    let s = b.storage();
    let mut ids = Ids::new(9);
    configure(
        &*s,
        QueueConfig {
            delayed_processing_secs: 5,
            ..QueueConfig::with_defaults("d")
        },
    )
    .await?;
    push(&*s, &mut ids, "d", "p", "t", 0..2).await?;
    let req = PopRequest {
        skip_window_debounce: true,
        conflation: false,
        ..pop_req("d", "g", ids.worker(), 10)
    };
    let r = s.pop_list(req.clone(), vec!["p".into()]).await.map_err(e)?;
    ensure!(r.claims.is_empty(), "delayed messages are invisible");
    ensure!(
        matches!(verdict_of(&r, "p"), Some(Verdict::DeferredUntil(_))),
        "deferred verdict: {:?}",
        r.verdicts
    );
    b.advance_secs(6).await;
    let r = s
        .pop_list(
            PopRequest {
                worker: ids.worker(),
                ..req
            },
            vec!["p".into()],
        )
        .await
        .map_err(e)?;
    ensure_eq!(r.message_count(), 2, "visible after the delay");

    configure(
        &*s,
        QueueConfig {
            window_buffer_secs: 3,
            ..QueueConfig::with_defaults("w")
        },
    )
    .await?;
    push(&*s, &mut ids, "w", "p", "t", 0..3).await?;
    let r = s
        .pop_list(pop_req("w", "g", ids.worker(), 10), vec!["p".into()])
        .await
        .map_err(e)?;
    ensure!(
        r.claims.is_empty() && matches!(verdict_of(&r, "p"), Some(Verdict::DeferredUntil(_))),
        "window holds: {:?}",
        r.verdicts
    );
    let r = s
        .pop_list(
            PopRequest {
                skip_window_debounce: true,
                conflation: false,
                ..pop_req("w", "g2", ids.worker(), 10)
            },
            vec!["p".into()],
        )
        .await
        .map_err(e)?;
    ensure_eq!(r.message_count(), 3, "the ring path owns the hold");
    b.advance_secs(4).await;
    let r = s
        .pop_list(pop_req("w", "g", ids.worker(), 10), vec!["p".into()])
        .await
        .map_err(e)?;
    ensure_eq!(
        r.message_count(),
        3,
        "quiet for the window: everything at once"
    );
    Ok(())
}

/// The empty-partition seal fires only on a partition with no segments at all.
pub async fn seal_guards(b: &dyn Backend) -> CaseResult {
    let s = b.storage();
    let mut ids = Ids::new(10);
    push(&*s, &mut ids, "q", "p", "t", 0..3).await?;
    b.drop_segments("q", "p", i64::MAX).await;
    ensure!(
        backlog(&*s, "q", "g").await?,
        "phantom pending before the seal"
    );
    let r = s
        .pop_partition(pop_req("q", "g", ids.worker(), 10), "p".into())
        .await
        .map_err(e)?;
    ensure!(
        r.claims.is_empty() && verdict_of(&r, "p") == Some(Verdict::Empty),
        "empty: {:?}",
        r.verdicts
    );
    ensure!(!backlog(&*s, "q", "g").await?, "sealed: no longer pending");
    // New pushes land above the seal and are delivered.
    push(&*s, &mut ids, "q", "p", "u", 0..2).await?;
    let r = s
        .pop_partition(pop_req("q", "g", ids.worker(), 10), "p".into())
        .await
        .map_err(e)?;
    ensure_eq!(payload_ns(&r), vec![0, 1], "messages after the seal");
    // Deferred segments are never sealed past.
    configure(
        &*s,
        QueueConfig {
            delayed_processing_secs: 60,
            ..QueueConfig::with_defaults("d")
        },
    )
    .await?;
    push(&*s, &mut ids, "d", "p", "t", 0..2).await?;
    let r = s
        .pop_partition(pop_req("d", "g", ids.worker(), 10), "p".into())
        .await
        .map_err(e)?;
    ensure!(r.claims.is_empty(), "deferred");
    b.advance_secs(61).await;
    let r = s
        .pop_partition(pop_req("d", "g", ids.worker(), 10), "p".into())
        .await
        .map_err(e)?;
    ensure_eq!(
        r.message_count(),
        2,
        "deferred messages survive: the seal did not fire"
    );
    Ok(())
}

/// `batch` is a global cap across partitions; `partitions` caps the claims.
pub async fn budgets(b: &dyn Backend) -> CaseResult {
    let s = b.storage();
    let mut ids = Ids::new(11);
    for p in ["a", "b", "c", "d", "e"] {
        push(&*s, &mut ids, "q", p, "t", 0..50).await?;
    }
    let req = PopRequest {
        max_partitions: 5,
        ..pop_req("q", "g", ids.worker(), 20)
    };
    let r = s.pop_wildcard(req).await.map_err(e)?;
    ensure_eq!(r.message_count(), 20, "global cap");
    let req = PopRequest {
        max_partitions: 3,
        ..pop_req("q", "g2", ids.worker(), 1000)
    };
    let r = s.pop_wildcard(req).await.map_err(e)?;
    ensure_eq!(r.claims.len(), 3, "partition cap");
    ensure_eq!(r.message_count(), 150, "three whole partitions");
    let names: Vec<String> = ["a", "b", "c", "d", "e", "zz"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let req = PopRequest {
        max_partitions: 2,
        ..pop_req("q", "g3", ids.worker(), 1000)
    };
    let r = s.pop_list(req, names).await.map_err(e)?;
    ensure_eq!(r.claims.len(), 2, "list respects the partition cap");
    ensure_eq!(
        verdict_of(&r, "e"),
        Some(Verdict::NotEvaluated),
        "budget spent before e"
    );
    ensure_eq!(
        verdict_of(&r, "zz"),
        Some(Verdict::NotEvaluated),
        "budget spent before zz"
    );
    let r = s
        .pop_list(pop_req("q", "g4", ids.worker(), 10), vec!["zz".into()])
        .await
        .map_err(e)?;
    ensure_eq!(
        verdict_of(&r, "zz"),
        Some(Verdict::Missing),
        "unknown partition"
    );
    Ok(())
}

/// Renewal extends live leases of that id; an expired lease is not revived.
pub async fn lease_renewal(b: &dyn Backend) -> CaseResult {
    let s = b.storage();
    let mut ids = Ids::new(12);
    push(&*s, &mut ids, "q", "a", "t", 0..1).await?;
    push(&*s, &mut ids, "q", "b", "t", 0..1).await?;
    let w = ids.worker();
    let r = s
        .pop_wildcard(PopRequest {
            max_partitions: 2,
            lease_seconds: Some(10),
            ..pop_req("q", "g", w, 10)
        })
        .await
        .map_err(e)?;
    ensure_eq!(r.claims.len(), 2, "two partitions under one lease");
    b.advance_secs(8).await;
    let o = s.renew_lease(&w.to_string(), 60).await.map_err(e)?;
    ensure_eq!(o.renewed, 2, "both partitions renewed");
    b.advance_secs(30).await;
    let r = s
        .pop_wildcard(PopRequest {
            max_partitions: 2,
            ..pop_req("q", "g", ids.worker(), 10)
        })
        .await
        .map_err(e)?;
    ensure!(r.claims.is_empty(), "renewed leases still hold");
    b.advance_secs(40).await;
    let o = s.renew_lease(&w.to_string(), 60).await.map_err(e)?;
    ensure_eq!(o.renewed, 0, "an expired lease is not revived");
    Ok(())
}

/// A failed message charges its own budget and reaches the DLQ after retryLimit redeliveries;
/// in a mixed batch it is never lost.
pub async fn failed_acks_retry_then_dead_letter(b: &dyn Backend) -> CaseResult {
    let s = b.storage();
    let mut ids = Ids::new(13);
    configure(
        &*s,
        QueueConfig {
            retry_limit: 1,
            ..QueueConfig::with_defaults("q")
        },
    )
    .await?;
    push(&*s, &mut ids, "q", "p", "t", 0..3).await?;
    // Mixed batch: [t-0 failed, t-1 completed, t-2 completed] must redeliver t-0.
    let w = ids.worker();
    let r = s
        .pop_partition(pop_req("q", "g", w, 10), "p".into())
        .await
        .map_err(e)?;
    let pid = r.claims[0].partition_id.clone();
    let l = Some(w.to_string());
    let o = s
        .ack(
            "g",
            vec![
                ack("t-0", &pid, AckStatus::Failed, l.clone()),
                ack("t-1", &pid, AckStatus::Completed, l.clone()),
                ack("t-2", &pid, AckStatus::Completed, l),
            ],
        )
        .await
        .map_err(e)?;
    ensure!(o.iter().all(|x| x.success), "all accepted: {o:?}");
    // retryDelay (1000 ms by default): the partition is held for the group, renewal included.
    let r = s
        .pop_partition(pop_req("q", "g", ids.worker(), 10), "p".into())
        .await
        .map_err(e)?;
    ensure!(r.claims.is_empty(), "held during retryDelay: {r:?}");
    let renewed = s
        .renew_lease(&queen_core::WorkerId::RETRY_HOLD.to_string(), 60)
        .await
        .map_err(e)?;
    ensure_eq!(renewed.renewed, 0, "a retry hold is nobody's lease");
    b.advance_secs(2).await;
    let w = ids.worker();
    let r = s
        .pop_partition(pop_req("q", "g", w, 10), "p".into())
        .await
        .map_err(e)?;
    ensure_eq!(
        payload_ns(&r),
        vec![0, 1, 2],
        "the failed message comes back (with what followed)"
    );
    ensure_eq!(r.claims[0].attempt_count, 2, "a redelivery");
    let o = s
        .ack(
            "g",
            vec![ack("t-0", &pid, AckStatus::Failed, Some(w.to_string()))],
        )
        .await
        .map_err(e)?;
    ensure!(
        o[0].dlq && o[0].lease_released,
        "second failure with retryLimit 1 dead-letters, and the nack ends the lease (its \
         consumer drops the rest of the batch): {o:?}"
    );
    // No retryDelay hold after a dead letter: what followed comes back at once.
    let w = ids.worker();
    let r = s
        .pop_partition(pop_req("q", "g", w, 10), "p".into())
        .await
        .map_err(e)?;
    ensure_eq!(
        payload_ns(&r),
        vec![1, 2],
        "past the dead letter, the rest of the batch at once"
    );
    // The next message starts with a full budget.
    let o = s
        .ack(
            "g",
            vec![ack("t-1", &pid, AckStatus::Failed, Some(w.to_string()))],
        )
        .await
        .map_err(e)?;
    ensure!(
        o[0].success && !o[0].dlq && o[0].lease_released,
        "t-1 has its own budget: {o:?}"
    );
    b.advance_secs(2).await;
    let r = s
        .pop_partition(pop_req("q", "g", ids.worker(), 10), "p".into())
        .await
        .map_err(e)?;
    ensure_eq!(
        payload_ns(&r),
        vec![1, 2],
        "t-1 redelivered after its retryDelay"
    );
    let dl = b.filed_dead_letters("q").await;
    ensure_eq!(dl, vec![(0, "t-0".to_string())], "one dead letter");
    Ok(())
}

/// A call's acks of one partition apply in offset order, whatever order the call lists them
/// in: a nack listed after a completed ack of a later message still holds the cursor before
/// it, so the failed message comes back (a caller that acks its successes, then its failures,
/// loses none). Answered in the call's order.
pub async fn a_nack_bounds_its_call_in_any_order(b: &dyn Backend) -> CaseResult {
    let s = b.storage();
    let mut ids = Ids::new(80);
    push(&*s, &mut ids, "q", "p", "t", 0..4).await?;
    let w = ids.worker();
    let r = s
        .pop_partition(pop_req("q", "g", w, 10), "p".into())
        .await
        .map_err(e)?;
    let pid = r.claims[0].partition_id.clone();
    let l = Some(w.to_string());
    let o = s
        .ack(
            "g",
            vec![
                ack("t-2", &pid, AckStatus::Completed, l.clone()),
                ack("t-0", &pid, AckStatus::Completed, l.clone()),
                ack("t-1", &pid, AckStatus::Retry, l.clone()),
                ack("nope", &pid, AckStatus::Completed, l),
            ],
        )
        .await
        .map_err(e)?;
    ensure_eq!(o.len(), 4, "one answer an item");
    ensure!(
        o[0].success && o[1].success && o[2].success,
        "the nack is honoured, not refused as committed: {o:?}"
    );
    ensure!(
        o[2].lease_released && !o[0].noop && !o[1].noop,
        "the nack ends the lease; the completed acks are fresh: {o:?}"
    );
    ensure_eq!(
        o[3].error.as_deref(),
        Some(queen_core::storage::ACK_NOT_FOUND),
        "answers keep the call's order"
    );
    let r = s
        .pop_partition(pop_req("q", "g", ids.worker(), 10), "p".into())
        .await
        .map_err(e)?;
    ensure_eq!(
        payload_ns(&r),
        vec![1, 2, 3],
        "the retried message comes back, with what followed it"
    );
    Ok(())
}

/// Namespace/task discovery.
pub async fn discovery(b: &dyn Backend) -> CaseResult {
    let s = b.storage();
    let mut ids = Ids::new(14);
    push(&*s, &mut ids, "billing.invoice.v2", "p", "t", 0..1).await?;
    push(&*s, &mut ids, "billing.refund", "p", "t", 0..1).await?;
    push(&*s, &mut ids, "ops", "p", "t", 0..1).await?;
    let mut q = s
        .queues_matching(Some("billing".into()), None)
        .await
        .map_err(e)?;
    q.sort();
    ensure_eq!(
        q,
        vec![
            "billing.invoice.v2".to_string(),
            "billing.refund".to_string()
        ],
        "by namespace"
    );
    let q = s
        .queues_matching(Some("billing".into()), Some("refund".into()))
        .await
        .map_err(e)?;
    ensure_eq!(
        q,
        vec!["billing.refund".to_string()],
        "by namespace and task"
    );
    let q = s
        .queues_matching(None, Some("invoice".into()))
        .await
        .map_err(e)?;
    ensure_eq!(q, vec!["billing.invoice.v2".to_string()], "by task");
    // priority (stored but never read by 0.15): the discovery pop tries higher priority first.
    for (name, priority) in [("prio.low", 1), ("prio.high", 5), ("prio.mid", 3)] {
        configure(
            &*s,
            QueueConfig {
                priority,
                ..QueueConfig::with_defaults(name)
            },
        )
        .await?;
    }
    let q = s
        .queues_matching(Some("prio".into()), None)
        .await
        .map_err(e)?;
    ensure_eq!(
        q,
        vec![
            "prio.high".to_string(),
            "prio.mid".to_string(),
            "prio.low".to_string()
        ],
        "by priority"
    );
    Ok(())
}

/// Pending probes and queue deletion.
pub async fn pending_and_delete(b: &dyn Backend) -> CaseResult {
    let s = b.storage();
    let mut ids = Ids::new(15);
    ensure!(
        !backlog(&*s, "q", "g").await?,
        "unknown queue has nothing pending"
    );
    push(&*s, &mut ids, "q", "a", "t", 0..2).await?;
    push(&*s, &mut ids, "q", "b", "t", 0..2).await?;
    ensure_eq!(
        s.pending_partitions("q", "g", None, 10).await.map_err(e)?,
        vec!["a".to_string(), "b".to_string()],
        "pending names"
    );
    // The reseed walk pages by name: a page starts after the previous page's last name.
    ensure_eq!(
        s.pending_partitions("q", "g", None, 1).await.map_err(e)?,
        vec!["a".to_string()],
        "first page"
    );
    ensure_eq!(
        s.pending_partitions("q", "g", Some("a"), 1)
            .await
            .map_err(e)?,
        vec!["b".to_string()],
        "second page"
    );
    ensure_eq!(
        s.pending_partitions("q", "g", Some("b"), 1)
            .await
            .map_err(e)?,
        Vec::<String>::new(),
        "the walk's end"
    );
    let w = ids.worker();
    let r = s
        .pop_list(pop_req("q", "g", w, 10), vec!["a".into()])
        .await
        .map_err(e)?;
    ensure_eq!(r.message_count(), 2, "took a");
    ensure_eq!(
        s.pending_partitions("q", "g", None, 10).await.map_err(e)?,
        vec!["a".to_string(), "b".to_string()],
        "a leased backlog is still listed: the ring learns its lease from the verdict"
    );
    ensure!(s.delete_queue("q").await.map_err(e)?, "deleted");
    ensure!(!s.delete_queue("q").await.map_err(e)?, "already gone");
    ensure!(!backlog(&*s, "q", "g").await?, "nothing left");
    ensure!(
        s.queue_config("q").await.map_err(e)?.is_none(),
        "config gone"
    );
    let out = push(&*s, &mut ids, "q", "a", "t", 0..1).await?;
    ensure!(
        matches!(out[0], PushOutcome::Queued { offset: 0, .. }),
        "a recreated queue starts over: {out:?}"
    );
    Ok(())
}

/// Configure stores every option and creates the Default partition.
pub async fn configure_round_trip(b: &dyn Backend) -> CaseResult {
    let s = b.storage();
    let cfg = QueueConfig {
        lease_time_secs: 7,
        retry_limit: 9,
        delayed_processing_secs: 1,
        window_buffer_secs: 2,
        min_pop_wait_ms: 50,
        priority: 4,
        ..QueueConfig::with_defaults("a.b.c")
    };
    let ids = s.configure_queue(cfg.clone()).await.map_err(e)?;
    ensure!(
        !ids.queue_id.is_empty() && !ids.default_partition_id.is_empty(),
        "ids"
    );
    let got = s.queue_config("a.b.c").await.map_err(e)?;
    ensure_eq!(got, Some(cfg.clone()), "stored config");
    let again = QueueConfig {
        lease_time_secs: 8,
        ..cfg
    };
    let ids2 = s.configure_queue(again.clone()).await.map_err(e)?;
    ensure_eq!(ids2, ids, "reconfigure keeps ids");
    ensure_eq!(
        s.queue_config("a.b.c").await.map_err(e)?,
        Some(again),
        "overwritten"
    );
    Ok(())
}

/// Acks and pushes of a transaction commit together or not at all; a retried transaction is
/// idempotent (its pushes are duplicates, its acks already applied). Queen 0.15 failed a retried
/// transaction on the duplicate transactionId.
pub async fn transactions_are_atomic_and_idempotent(b: &dyn Backend) -> CaseResult {
    let s = b.storage();
    let d = b.storage();
    let mut ids = Ids::new(16);
    push(&*s, &mut ids, "a", "p", "t", 0..1).await?;
    let w = ids.worker();
    let r = s
        .pop_partition(pop_req("a", "g", w, 10), "p".into())
        .await
        .map_err(e)?;
    let pid = r.claims[0].partition_id.clone();
    let ops = vec![
        TxOp::Push(vec![group(&mut ids, "b", "p", "out", 0..1)]),
        TxOp::Ack {
            group: "g".into(),
            item: ack("t-0", &pid, AckStatus::Completed, Some(w.to_string())),
        },
    ];
    let out = d.transaction(ops.clone()).await.map_err(e)?;
    ensure!(out.committed, "committed: {out:?}");
    ensure!(
        matches!(&out.results[0], TxOpResult::Push(g) if matches!(g[0][0], PushOutcome::Queued { .. })),
        "push result first: {out:?}"
    );
    ensure!(
        matches!(&out.results[1], TxOpResult::Ack(a) if a.success),
        "ack result second"
    );
    let again = d.transaction(ops).await.map_err(e)?;
    ensure!(
        again.committed,
        "a retried transaction is idempotent: {again:?}"
    );
    ensure!(
        matches!(&again.results[0], TxOpResult::Push(g) if matches!(g[0][0], PushOutcome::Duplicate { .. })),
        "retried push is a duplicate"
    );
    let rb = s
        .pop_partition(pop_req("b", "g", ids.worker(), 10), "p".into())
        .await
        .map_err(e)?;
    ensure_eq!(
        rb.message_count(),
        1,
        "exactly one message pushed by the two runs"
    );
    let ra = s
        .pop_partition(pop_req("a", "g", ids.worker(), 10), "p".into())
        .await
        .map_err(e)?;
    ensure!(ra.claims.is_empty(), "a acked by the transaction");
    // A refused ack rolls back the whole transaction, pushes included.
    let bad = vec![
        TxOp::Push(vec![group(&mut ids, "c", "p", "never", 0..2)]),
        TxOp::Ack {
            group: "g".into(),
            item: ack("no-such-tx", &pid, AckStatus::Completed, None),
        },
    ];
    let out = d.transaction(bad).await.map_err(e)?;
    ensure!(
        !out.committed
            && out
                .error
                .as_deref()
                .is_some_and(|x| x.contains("Message not found")),
        "refused: {out:?}"
    );
    ensure!(
        !backlog(&*s, "c", "g").await?,
        "the rolled-back push left nothing"
    );
    Ok(())
}

/// The cursor never moves backwards: a late ack of an older message changes nothing. (Queen 0.15
/// moved the cursor back and redelivered what had been acknowledged.)
pub async fn the_cursor_never_rewinds(b: &dyn Backend) -> CaseResult {
    let s = b.storage();
    let mut ids = Ids::new(17);
    push(&*s, &mut ids, "q", "p", "x", 0..3).await?;
    let r = s
        .pop_partition(
            PopRequest {
                lease_seconds: Some(5),
                ..pop_req("q", "g", ids.worker(), 10)
            },
            "p".into(),
        )
        .await
        .map_err(e)?;
    let pid = r.claims[0].partition_id.clone();
    let o = s
        .ack("g", vec![ack("x-2", &pid, AckStatus::Completed, None)])
        .await
        .map_err(e)?;
    ensure!(
        o[0].success && o[0].lease_released,
        "ack of the last message commits the batch"
    );
    let o = s
        .ack("g", vec![ack("x-0", &pid, AckStatus::Completed, None)])
        .await
        .map_err(e)?;
    ensure!(
        o[0].success,
        "a late ack of an older message is accepted (idempotent)"
    );
    b.advance_secs(10).await;
    let r = s
        .pop_partition(pop_req("q", "g", ids.worker(), 10), "p".into())
        .await
        .map_err(e)?;
    ensure!(
        r.claims.is_empty(),
        "nothing acknowledged comes back: {:?}",
        r.claims
    );
    Ok(())
}

/// The dead-letter listing: filters, paging, a total, and the message itself.
pub async fn dead_letter_listing(b: &dyn Backend) -> CaseResult {
    let s = b.storage();
    let d = b.storage();
    let mut ids = Ids::new(18);
    dead_letter_two_per_partition(&*s, &mut ids).await?;
    let all = DlqQuery {
        queue: "q".into(),
        limit: 100,
        ..DlqQuery::default()
    };
    let DeadLetterPage {
        entries: rows,
        total,
    } = d.dead_letters(all.clone()).await.map_err(e)?;
    ensure_eq!(total, 4, "total");
    ensure_eq!(
        rows.iter()
            .map(|r| r.transaction_id.clone())
            .collect::<Vec<_>>(),
        vec!["b-1", "b-0", "a-1", "a-0"],
        "newest first"
    );
    ensure_eq!(
        rows[0].error.as_deref(),
        Some("boom b-1"),
        "error text kept"
    );
    let seg = rows[0]
        .segment
        .clone()
        .ok_or("the message is still stored")?;
    let frames = queen_core::frames::slice_blob(
        &seg.blob,
        seg.start_idx as usize,
        1,
        seg.msg_count as usize,
    )
    .map_err(e)?;
    ensure_eq!(
        frames[0].transaction_id.as_str(),
        "b-1",
        "the dead letter's message"
    );
    let DeadLetterPage {
        entries: rows,
        total,
    } = d
        .dead_letters(DlqQuery {
            partition: Some("a".into()),
            ..all.clone()
        })
        .await
        .map_err(e)?;
    ensure!(
        total == 2 && rows.iter().all(|r| r.partition == "a"),
        "partition filter"
    );
    let DeadLetterPage {
        entries: rows,
        total,
    } = d
        .dead_letters(DlqQuery {
            limit: 1,
            offset: 1,
            ..all.clone()
        })
        .await
        .map_err(e)?;
    ensure!(
        total == 4 && rows.len() == 1 && rows[0].transaction_id == "b-0",
        "paging"
    );
    let DeadLetterPage {
        entries: rows,
        total,
    } = d
        .dead_letters(DlqQuery {
            group: Some("other".into()),
            ..all.clone()
        })
        .await
        .map_err(e)?;
    ensure!(total == 0 && rows.is_empty(), "group filter");
    let DeadLetterPage { total, .. } = d
        .dead_letters(DlqQuery {
            offset: 10,
            ..all.clone()
        })
        .await
        .map_err(e)?;
    ensure_eq!(total, 4, "total past the last page");
    requeue_the_newest_dead_letter(&*s, &*d, &mut ids, &all).await
}

/// Queue q with retryLimit 0, two messages in each of partitions a and b, each failed once by
/// group g: four dead letters.
async fn dead_letter_two_per_partition(s: &dyn Storage, ids: &mut Ids) -> CaseResult {
    configure(
        s,
        QueueConfig {
            retry_limit: 0,
            ..QueueConfig::with_defaults("q")
        },
    )
    .await?;
    for p in ["a", "b"] {
        push(s, ids, "q", p, p, 0..2).await?;
    }
    for p in ["a", "b"] {
        for _ in 0..2 {
            let w = ids.worker();
            let r = s
                .pop_partition(pop_req("q", "g", w, 1), p.into())
                .await
                .map_err(e)?;
            let c = &r.claims[0];
            let tx = format!("{p}-{}", c.first_offset);
            let mut item = ack(&tx, &c.partition_id, AckStatus::Failed, Some(w.to_string()));
            item.error = Some(format!("boom {tx}"));
            let o = s.ack("g", vec![item]).await.map_err(e)?;
            ensure!(
                o[0].dlq,
                "retryLimit 0: the first failure dead-letters: {o:?}"
            );
        }
    }
    Ok(())
}

/// The newest dead letter requeued: delivered again as a new message, out of the DLQ, once.
async fn requeue_the_newest_dead_letter(
    s: &dyn Storage,
    d: &dyn Storage,
    ids: &mut Ids,
    all: &DlqQuery,
) -> CaseResult {
    let newest = d
        .dead_letters(all.clone())
        .await
        .map_err(e)?
        .entries
        .remove(0);
    let out = d
        .requeue_dead_letter(newest.id, ids.uuid())
        .await
        .map_err(e)?;
    ensure!(
        matches!(&out, Some(Requeued { queue, partition, outcome: PushOutcome::Queued { offset: 2, .. } })
            if queue == "q" && partition == "b"),
        "requeued at the partition's end: {out:?}"
    );
    ensure_eq!(
        d.dead_letters(all.clone()).await.map_err(e)?.total,
        3,
        "one dead letter fewer"
    );
    ensure!(
        d.requeue_dead_letter(newest.id, ids.uuid())
            .await
            .map_err(e)?
            .is_none(),
        "a dead letter requeues once"
    );
    let r = s
        .pop_partition(pop_req("q", "g", ids.worker(), 10), "b".into())
        .await
        .map_err(e)?;
    ensure_eq!(
        payload_ns(&r),
        vec![1],
        "the requeued message is delivered again"
    );
    Ok(())
}

/// The wildcard scan's two shapes: a window of the candidate cap from a random partition,
/// wrapping (no watermark yet), and the partitions written since the watermark in random order
/// (a caught-up group). Each drains every pending partition exactly once.
pub async fn wildcard_windows(b: &dyn Backend) -> CaseResult {
    const PARTITIONS: usize = 700; // more than the 512-candidate cap
    let s = b.storage();
    let mut ids = Ids::new(23);
    let names: Vec<String> = (0..PARTITIONS).map(|i| format!("p{i:03}")).collect();
    let groups = names
        .iter()
        .map(|p| group(&mut ids, "q", p, "old", 0..1))
        .collect();
    s.push(groups).await.map_err(e)?;
    let auto = |w| PopRequest {
        auto_ack: true,
        max_partitions: 64,
        ..pop_req("q", "g", w, 1000)
    };
    let mut seen: Vec<String> = vec![];
    for _ in 0..PARTITIONS {
        let r = s.pop_wildcard(auto(ids.worker())).await.map_err(e)?;
        if r.claims.is_empty() {
            break;
        }
        seen.extend(r.claims.iter().map(|c| c.partition.clone()));
    }
    seen.sort();
    ensure_eq!(
        seen,
        names,
        "every partition once, through windows that wrap"
    );
    ensure!(
        !backlog(&*s, "q", "g").await?,
        "nothing pending after the drain"
    );
    // The empty scan set the watermark. Past its slack, three partitions are written to: the
    // caught-up group finds exactly those.
    b.advance_secs(200).await;
    let fresh = ["p007", "p350", "p699"];
    for p in fresh {
        push(&*s, &mut ids, "q", p, "new", 0..1).await?;
    }
    let r = s.pop_wildcard(auto(ids.worker())).await.map_err(e)?;
    let mut got: Vec<&str> = r.claims.iter().map(|c| c.partition.as_str()).collect();
    got.sort();
    ensure_eq!(
        got,
        fresh.to_vec(),
        "the written partitions, from the watermark"
    );
    Ok(())
}

/// A batch says whether it drained its partition (the ring then stops offering it): never when it
/// ends inside a segment or when another segment, visible or delayed, lies past it.
pub async fn drained_batches(b: &dyn Backend) -> CaseResult {
    let s = b.storage();
    let mut ids = Ids::new(31);
    let outcome = |r: &queen_core::storage::PopResult, p: &str| match verdict_of(r, p) {
        Some(Verdict::Took { count, drained, .. }) => Ok((count, drained)),
        other => Err(format!("{p}: expected a claim, got {other:?}")),
    };
    let auto = |w, batch| PopRequest {
        auto_ack: true,
        ..pop_req("q", "g", w, batch)
    };
    // (pushes before the pop, its batch, (count, drained), why)
    type Step<'a> = (
        &'a [(&'a str, std::ops::Range<u32>)],
        u32,
        (u32, bool),
        &'a str,
    );
    let steps: [Step; 4] = [
        (
            &[("a", 0..3)],
            2,
            (2, false),
            "a batch ending inside a segment",
        ),
        (&[], 5, (1, true), "the rest of the segment"),
        (
            &[("b", 0..2), ("c", 0..2)],
            2,
            (2, false),
            "a segment lies past the batch",
        ),
        (&[], 10, (2, true), "the last segment"),
    ];
    for (pushes, batch, expected, why) in steps {
        for (prefix, range) in pushes {
            push(&*s, &mut ids, "q", "p", prefix, range.clone()).await?;
        }
        let r = s
            .pop_partition(auto(ids.worker(), batch), "p".into())
            .await
            .map_err(e)?;
        ensure_eq!(outcome(&r, "p")?, expected, "{why}");
    }
    push(&*s, &mut ids, "q", "p2", "d", 0..1).await?;
    let r = s
        .pop_list(pop_req("q", "g", ids.worker(), 10), vec!["p2".into()])
        .await
        .map_err(e)?;
    ensure_eq!(outcome(&r, "p2")?, (1, true), "a leased batch says it too");
    configure(
        &*s,
        QueueConfig {
            delayed_processing_secs: 5,
            ..QueueConfig::with_defaults("d")
        },
    )
    .await?;
    push(&*s, &mut ids, "d", "p", "x", 0..1).await?;
    b.advance_secs(6).await;
    push(&*s, &mut ids, "d", "p", "y", 0..1).await?;
    let r = s
        .pop_list(
            PopRequest {
                auto_ack: true,
                skip_window_debounce: true,
                conflation: false,
                ..pop_req("d", "g", ids.worker(), 10)
            },
            vec!["p".into()],
        )
        .await
        .map_err(e)?;
    ensure_eq!(
        outcome(&r, "p")?,
        (1, false),
        "a delayed segment lies past the batch"
    );
    Ok(())
}

/// The partition walks at their boundaries: a group's first contact seeds every cursor of a queue
/// of FIRST_CONTACT_SEED_CAP partitions and none of a queue of one more, whose cursors are made
/// at their first claim by the same rule: a new-only group skips the backlog and reads each new
/// message once on both sides. The walk pages by bytewise name through pages one short of,
/// exactly at and one past the partition count.
pub async fn windowing_boundaries(b: &dyn Backend) -> CaseResult {
    let cap = queen_core::claim::FIRST_CONTACT_SEED_CAP;
    walk_and_drain_new_only(b, "seeded", cap).await?;
    walk_and_drain_new_only(b, "lazy", cap + 1).await
}

async fn walk_and_drain_new_only(b: &dyn Backend, queue: &str, partitions: usize) -> CaseResult {
    let s = b.storage();
    let mut ids = Ids::new(37);
    // Upper case, punctuation and a multi-byte first letter: bytewise order is not a locale's.
    let mut names: Vec<String> = (0..partitions)
        .map(|i| match i % 4 {
            0 => format!("p{i}"),
            1 => format!("P{i}"),
            2 => format!("p-{i}"),
            _ => format!("\u{e9}{i}"),
        })
        .collect();
    let pushes = |ids: &mut Ids, prefix: &str| {
        names
            .iter()
            .map(|p| group(ids, queue, p, prefix, 0..1))
            .collect::<Vec<_>>()
    };
    s.push(pushes(&mut ids, "old")).await.map_err(e)?;
    b.advance_secs(2).await;
    let new_only = SubscriptionIntent {
        mode: SubscriptionMode::New,
        from: SubscriptionFrom::Unset,
    };
    let auto = |w| PopRequest {
        auto_ack: true,
        max_partitions: 64,
        intent: new_only,
        ..pop_req(queue, "g", w, 1000)
    };
    let r = s.pop_wildcard(auto(ids.worker())).await.map_err(e)?;
    ensure!(
        r.claims.is_empty(),
        "{queue}: first contact of a new-only group skips the backlog: {:?}",
        r.verdicts
    );
    b.advance_secs(2).await;
    s.push(pushes(&mut ids, "new")).await.map_err(e)?;
    names.sort();
    for limit in [partitions - 1, partitions, partitions + 1, 100] {
        let mut walked: Vec<String> = vec![];
        loop {
            let page = s
                .pending_partitions(queue, "g", walked.last().map(String::as_str), limit as u32)
                .await
                .map_err(e)?;
            let full = page.len() == limit;
            walked.extend(page);
            if !full {
                break;
            }
        }
        ensure_eq!(walked, names, "{queue}: the walk in pages of {limit}");
    }
    // Drained as the ring drains it: pending pages, each popped as a list.
    let mut delivered: Vec<(String, String)> = vec![];
    for _ in 0..partitions {
        let page = s
            .pending_partitions(queue, "g", None, 64)
            .await
            .map_err(e)?;
        if page.is_empty() {
            break;
        }
        let r = s.pop_list(auto(ids.worker()), page).await.map_err(e)?;
        ensure!(!r.claims.is_empty(), "a pending page yields claims");
        for c in &r.claims {
            let txids = messages(&queen_core::storage::PopResult {
                claims: vec![c.clone()],
                verdicts: vec![],
                stored_conflation: None,
            });
            delivered.extend(
                txids
                    .into_iter()
                    .map(|m| (c.partition.clone(), m.frame.transaction_id)),
            );
        }
    }
    delivered.sort();
    let expected: Vec<(String, String)> = names
        .iter()
        .map(|p| (p.clone(), "new-0".to_string()))
        .collect();
    ensure_eq!(
        delivered,
        expected,
        "{queue}: every partition's new message once, none of the backlog"
    );
    Ok(())
}

/// Seek to a timestamp replays, seek to the end skips, deleting a group starts it over.
pub async fn seek_and_group_deletion(b: &dyn Backend) -> CaseResult {
    let s = b.storage();
    let d = b.storage();
    let mut ids = Ids::new(19);
    push(&*s, &mut ids, "q", "a", "old", 0..2).await?;
    push(&*s, &mut ids, "q", "b", "old", 0..1).await?;
    b.advance_secs(10).await;
    let auto = |w| PopRequest {
        auto_ack: true,
        max_partitions: 10,
        ..pop_req("q", "g", w, 100)
    };
    let r = s.pop_wildcard(auto(ids.worker())).await.map_err(e)?;
    ensure_eq!(r.message_count(), 3, "consumed everything");
    let before = r
        .claims
        .iter()
        .flat_map(|c| c.rows.iter().map(|x| x.created_at))
        .min()
        .ok_or("rows")?;
    let moved = d
        .seek_group("g", "q", SeekTarget::Timestamp(before.minus_secs(1)))
        .await
        .map_err(e)?;
    ensure_eq!(moved, 2, "both touched partitions move");
    let r = s.pop_wildcard(auto(ids.worker())).await.map_err(e)?;
    ensure_eq!(
        r.message_count(),
        3,
        "a seek back to before the pushes replays them"
    );
    push(&*s, &mut ids, "q", "a", "new", 0..2).await?;
    d.seek_group("g", "q", SeekTarget::End).await.map_err(e)?;
    let r = s.pop_wildcard(auto(ids.worker())).await.map_err(e)?;
    ensure!(
        r.claims.is_empty(),
        "a seek to the end skips what is stored"
    );
    let deleted = d.delete_group("g", Some("q"), true).await.map_err(e)?;
    ensure!(
        deleted.cursors >= 2 && deleted.subscription_records == 1,
        "deleted {deleted:?}"
    );
    let r = s.pop_wildcard(auto(ids.worker())).await.map_err(e)?;
    ensure_eq!(r.message_count(), 5, "a deleted group starts over");
    let n = d.update_subscription("g", before).await.map_err(e)?;
    ensure_eq!(n, 1, "the re-registered group's record");
    Ok(())
}

type CaseFn =
    for<'a> fn(
        &'a dyn Backend,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = CaseResult> + Send + 'a>>;

/// Queen 0.15 stored deadLetterQueue and dlqAfterMaxRetries but never read them. Off,
/// deadLetterQueue discards what would be filed; off, dlqAfterMaxRetries retries until acknowledged.
pub async fn dead_letter_flags_are_enforced(b: &dyn Backend) -> CaseResult {
    let s = b.storage();
    let mut ids = Ids::new(21);
    configure(
        &*s,
        QueueConfig {
            retry_limit: 0,
            retry_delay_ms: 0,
            dead_letter_queue: false,
            ..QueueConfig::with_defaults("nodlq")
        },
    )
    .await?;
    push(&*s, &mut ids, "nodlq", "p", "t", 0..2).await?;
    let w = ids.worker();
    let r = s
        .pop_partition(pop_req("nodlq", "g", w, 1), "p".into())
        .await
        .map_err(e)?;
    let pid = r.claims[0].partition_id.clone();
    let o = s
        .ack(
            "g",
            vec![ack("t-0", &pid, AckStatus::Failed, Some(w.to_string()))],
        )
        .await
        .map_err(e)?;
    ensure!(o[0].success && !o[0].dlq, "exhausted, discarded: {o:?}");
    let r = s
        .pop_partition(pop_req("nodlq", "g", ids.worker(), 10), "p".into())
        .await
        .map_err(e)?;
    ensure_eq!(payload_ns(&r), vec![1], "past the discarded message");
    ensure_eq!(b.filed_dead_letters("nodlq").await, vec![], "nothing filed");

    configure(
        &*s,
        QueueConfig {
            retry_limit: 0,
            retry_delay_ms: 0,
            dlq_after_max_retries: false,
            ..QueueConfig::with_defaults("forever")
        },
    )
    .await?;
    push(&*s, &mut ids, "forever", "p", "t", 0..1).await?;
    let mut pid = String::new();
    for attempt in 1..=4u32 {
        let w = ids.worker();
        let r = s
            .pop_partition(pop_req("forever", "g", w, 10), "p".into())
            .await
            .map_err(e)?;
        ensure_eq!(payload_ns(&r), vec![0], "redelivered, attempt {attempt}");
        ensure_eq!(r.claims[0].attempt_count, attempt, "attempt count");
        pid = r.claims[0].partition_id.clone();
        let o = s
            .ack(
                "g",
                vec![ack("t-0", &pid, AckStatus::Failed, Some(w.to_string()))],
            )
            .await
            .map_err(e)?;
        ensure!(o[0].success && !o[0].dlq, "not dead-lettered: {o:?}");
    }
    ensure_eq!(
        b.filed_dead_letters("forever").await,
        vec![],
        "no dead letter"
    );
    // An explicit `dlq` ack still files it.
    let w = ids.worker();
    s.pop_partition(pop_req("forever", "g", w, 10), "p".into())
        .await
        .map_err(e)?;
    let o = s
        .ack(
            "g",
            vec![ack("t-0", &pid, AckStatus::Dlq, Some(w.to_string()))],
        )
        .await
        .map_err(e)?;
    ensure!(o[0].dlq, "filed on request: {o:?}");
    ensure_eq!(
        b.filed_dead_letters("forever").await,
        vec![(0, "t-0".to_string())],
        "one dead letter"
    );
    Ok(())
}

/// maxSize caps the backlog (stored, never enforced in 0.15): a push past it is refused
/// whole and stores nothing, the backlog shrinks as the slowest group consumes, and a transaction
/// carrying a refused push rolls back.
pub async fn max_size_caps_the_backlog(b: &dyn Backend) -> CaseResult {
    let s = b.storage();
    let d = b.storage();
    let mut ids = Ids::new(22);
    configure(
        &*s,
        QueueConfig {
            max_size: 3,
            ..QueueConfig::with_defaults("cap")
        },
    )
    .await?;
    let first = push(&*s, &mut ids, "cap", "a", "t", 0..2).await?;
    ensure!(
        first
            .iter()
            .all(|o| matches!(o, PushOutcome::Queued { .. })),
        "under the cap: {first:?}"
    );
    let over = push(&*s, &mut ids, "cap", "b", "t", 0..2).await?;
    ensure!(
        over.iter()
            .all(|o| matches!(o, PushOutcome::Rejected { full, .. } if full.max_size == 3)),
        "2 + 2 > 3, refused whole: {over:?}"
    );
    let r = s
        .pop_partition(pop_req("cap", "g", ids.worker(), 10), "b".into())
        .await
        .map_err(e)?;
    ensure!(r.claims.is_empty(), "nothing was stored: {r:?}");
    let fits = push(&*s, &mut ids, "cap", "b", "u", 0..1).await?;
    ensure!(
        matches!(fits[0], PushOutcome::Queued { .. }),
        "exactly at the cap: {fits:?}"
    );
    // Group g consumes partition a: the backlog drops to 1.
    let w = ids.worker();
    let r = s
        .pop_partition(pop_req("cap", "g", w, 10), "a".into())
        .await
        .map_err(e)?;
    let pid = r.claims[0].partition_id.clone();
    s.ack(
        "g",
        vec![ack("t-1", &pid, AckStatus::Completed, Some(w.to_string()))],
    )
    .await
    .map_err(e)?;
    let again = push(&*s, &mut ids, "cap", "a", "v", 0..2).await?;
    ensure!(
        again
            .iter()
            .all(|o| matches!(o, PushOutcome::Queued { .. })),
        "room after consumption: {again:?}"
    );
    // Full again (3): a transaction with a push there and an ack elsewhere commits nothing.
    push(&*s, &mut ids, "free", "p", "t", 0..1).await?;
    let w = ids.worker();
    let r = s
        .pop_partition(pop_req("free", "g", w, 10), "p".into())
        .await
        .map_err(e)?;
    let free_pid = r.claims[0].partition_id.clone();
    let out = d
        .transaction(vec![
            TxOp::Ack {
                group: "g".into(),
                item: ack("t-0", &free_pid, AckStatus::Completed, Some(w.to_string())),
            },
            TxOp::Push(vec![group(&mut ids, "cap", "a", "x", 0..1)]),
        ])
        .await
        .map_err(e)?;
    ensure!(
        !out.committed && out.error.as_deref().is_some_and(|m| m.contains("full")),
        "refused: {out:?}"
    );
    let o = s
        .ack(
            "g",
            vec![ack(
                "t-0",
                &free_pid,
                AckStatus::Completed,
                Some(w.to_string()),
            )],
        )
        .await
        .map_err(e)?;
    ensure!(
        o[0].success && o[0].lease_released,
        "the transaction's ack was rolled back: {o:?}"
    );
    Ok(())
}

/// ttl (stored, never enforced in 0.15): messages older than ttl seconds are skipped by
/// every group, the cursor moves past them, and younger ones are delivered.
pub async fn ttl_expires_messages(b: &dyn Backend) -> CaseResult {
    let s = b.storage();
    let mut ids = Ids::new(23);
    configure(
        &*s,
        QueueConfig {
            ttl_secs: 10,
            ..QueueConfig::with_defaults("ttl")
        },
    )
    .await?;
    push(&*s, &mut ids, "ttl", "p", "t", 0..2).await?;
    b.advance_secs(6).await;
    push(&*s, &mut ids, "ttl", "p", "t", 2..3).await?;
    let r = s
        .pop_partition(pop_req("ttl", "early", ids.worker(), 10), "p".into())
        .await
        .map_err(e)?;
    ensure_eq!(payload_ns(&r), vec![0, 1, 2], "nothing expired yet");
    b.advance_secs(6).await;
    push(&*s, &mut ids, "ttl", "p", "t", 3..4).await?;
    let r = s
        .pop_partition(pop_req("ttl", "g", ids.worker(), 10), "p".into())
        .await
        .map_err(e)?;
    ensure_eq!(payload_ns(&r), vec![2, 3], "the first push expired");
    ensure_eq!(r.claims[0].first_offset, 2, "the cursor moved past it");
    b.advance_secs(30).await;
    let r = s
        .pop_wildcard(pop_req("ttl", "late", ids.worker(), 10))
        .await
        .map_err(e)?;
    ensure!(r.claims.is_empty(), "everything expired: {r:?}");
    ensure!(
        !backlog(&*s, "ttl", "late").await?,
        "nothing pending once expired"
    );
    Ok(())
}

/// Retention removed a prefix a new group's cursor had not reached: its first batch starts at the
/// first remaining segment, with offsets that match its messages, and acks work.
pub async fn retention_gap_starts_at_the_first_segment(b: &dyn Backend) -> CaseResult {
    let s = b.storage();
    let mut ids = Ids::new(24);
    push(&*s, &mut ids, "gap", "p", "t", 0..3).await?;
    push(&*s, &mut ids, "gap", "p", "t", 3..5).await?;
    b.drop_segments("gap", "p", 3).await;
    let w = ids.worker();
    let r = s
        .pop_partition(pop_req("gap", "late", w, 10), "p".into())
        .await
        .map_err(e)?;
    ensure_eq!(payload_ns(&r), vec![3, 4], "the remaining messages");
    ensure_eq!(
        (r.claims[0].first_offset, r.claims[0].last_offset),
        (3, 4),
        "offsets start at the first segment"
    );
    let pid = r.claims[0].partition_id.clone();
    let o = s
        .ack(
            "late",
            vec![ack("t-4", &pid, AckStatus::Completed, Some(w.to_string()))],
        )
        .await
        .map_err(e)?;
    ensure!(o[0].success && o[0].lease_released, "the batch acks: {o:?}");
    ensure!(!backlog(&*s, "gap", "late").await?, "nothing left");
    Ok(())
}

/// A push replayed later (a broker's file buffer draining) keeps the time it was accepted as its
/// `created_at`, unless the partition already holds a newer segment: created_at stays monotone in
/// the offsets, which the window and delay rules rely on.
pub async fn an_accepted_push_keeps_its_time(b: &dyn Backend) -> CaseResult {
    let s = b.storage();
    let mut ids = Ids::new(25);
    push(&*s, &mut ids, "q", "old", "first", 0..1).await?;
    let created = |r: &queen_core::storage::PopResult| {
        r.claims
            .iter()
            .flat_map(|c| c.rows.iter().map(|x| x.created_at))
            .collect::<Vec<_>>()
    };
    let first = s
        .pop_partition(pop_req("q", "g", ids.worker(), 10), "old".into())
        .await
        .map_err(e)?;
    let first_at = *created(&first).first().ok_or("first push not delivered")?;
    b.advance_secs(60).await;
    // Accepted 30 s after the first push, stored 60 s after it: it keeps its time.
    let accepted = first_at.plus_secs(30);
    s.push_accepted_at(
        vec![group(&mut ids, "q", "new", "late", 0..1)],
        Some(accepted),
    )
    .await
    .map_err(e)?;
    let r = s
        .pop_partition(pop_req("q", "g", ids.worker(), 10), "new".into())
        .await
        .map_err(e)?;
    ensure_eq!(created(&r), vec![accepted], "the accepted time is kept");
    // Older than the partition's newest segment: clamped to it.
    s.push_accepted_at(
        vec![group(&mut ids, "q", "old", "older", 0..1)],
        Some(first_at.plus_secs(-10)),
    )
    .await
    .map_err(e)?;
    let r = s
        .pop_partition(pop_req("q", "g2", ids.worker(), 10), "old".into())
        .await
        .map_err(e)?;
    let times = created(&r);
    ensure!(
        times.len() == 2 && times[1] >= times[0],
        "created_at stays monotone in the offsets: {times:?}"
    );
    Ok(())
}

/// `next_pending`: now while something is claimable; the earliest lease end (a retryDelay hold
/// counts as one) while every backlog is leased; nothing once no backlog is left.
pub async fn next_pending_reports_when_leases_end(b: &dyn Backend) -> CaseResult {
    let s = b.storage();
    let mut ids = Ids::new(24);
    let queues = |names: &[&str]| names.iter().map(|n| n.to_string()).collect::<Vec<_>>();
    ensure_eq!(
        s.next_pending(&queues(&["q"]), "g").await.map_err(e)?,
        None,
        "unknown queue"
    );
    push(&*s, &mut ids, "q", "a", "a", 0..2).await?;
    push(&*s, &mut ids, "q", "b", "b", 0..2).await?;
    let claimable_now = s
        .next_pending(&queues(&["q"]), "g")
        .await
        .map_err(e)?
        .ok_or("a backlog is pending")?;
    let (wa, wb) = (ids.worker(), ids.worker());
    let lease = |worker, secs| PopRequest {
        lease_seconds: Some(secs),
        ..pop_req("q", "g", worker, 10)
    };
    let ra = s
        .pop_list(lease(wa, 10), vec!["a".into()])
        .await
        .map_err(e)?;
    let rb = s
        .pop_list(lease(wb, 20), vec!["b".into()])
        .await
        .map_err(e)?;
    let (ca, cb) = match (ra.claims.first(), rb.claims.first()) {
        (Some(a), Some(b)) => (a.clone(), b.clone()),
        _ => return Err(format!("both leased: {ra:?} {rb:?}")),
    };
    let a_ends = ca.lease_expires_at.ok_or("a is leased")?;
    let b_ends = cb.lease_expires_at.ok_or("b is leased")?;
    ensure!(a_ends < b_ends && claimable_now < a_ends, "lease order");
    ensure_eq!(
        s.next_pending(&queues(&["q", "other"]), "g")
            .await
            .map_err(e)?,
        Some(a_ends.just_after()),
        "every backlog leased: just after the earliest lease ends"
    );
    ensure_eq!(
        s.next_pending(&queues(&["q"]), "g2")
            .await
            .map_err(e)?
            .map(|t| t < a_ends),
        Some(true),
        "another group's view is its own"
    );
    let msgs = crate::fixtures::messages(&ra);
    let last = msgs.last().ok_or("a delivered")?;
    let o = s
        .ack(
            "g",
            vec![ack(
                &last.frame.transaction_id,
                &ca.partition_id,
                AckStatus::Completed,
                Some(wa.to_string()),
            )],
        )
        .await
        .map_err(e)?;
    ensure!(o[0].success && o[0].lease_released, "a acked: {o:?}");
    ensure_eq!(
        s.next_pending(&queues(&["q"]), "g").await.map_err(e)?,
        Some(b_ends.just_after()),
        "a has no backlog left: just after b's lease ends"
    );
    b.advance_secs(21).await;
    let now = s
        .next_pending(&queues(&["q"]), "g")
        .await
        .map_err(e)?
        .ok_or("b's lease ended: pending")?;
    ensure!(now > b_ends, "claimable now, not at the old lease end");
    Ok(())
}

/// Runs whole passes as the worker does: every queue of the pass, batch after batch of `limit`
/// partitions, until the mark runs out. Returns what was removed and the batches run.
pub async fn retention_pass(
    s: &dyn Storage,
    pass: RetentionPass,
    limit: u32,
) -> Result<(Removed, u32), String> {
    let mut total = Removed::default();
    let mut batches = 0;
    for queue in s.retention_queues(pass).await.map_err(e)? {
        let mut after = None;
        loop {
            let b = s
                .retention_batch(&queue, pass, after, limit)
                .await
                .map_err(e)?;
            batches += 1;
            total += b.removed;
            match b.next {
                Some(m) => after = Some(m),
                None => break,
            }
        }
    }
    Ok((total, batches))
}

/// Pops the group's whole backlog on the queue (queue-wide) and acks every batch completed.
async fn consume_all(
    s: &dyn Storage,
    ids: &mut Ids,
    queue: &str,
    g: &str,
) -> Result<Vec<u32>, String> {
    let mut seen = vec![];
    for _ in 0..50 {
        let w = ids.worker();
        let r = s.pop_wildcard(pop_req(queue, g, w, 100)).await.map_err(e)?;
        let Some(c) = r.claims.first() else {
            return Ok(seen);
        };
        seen.extend(payload_ns(&r));
        let last = messages(&r)
            .last()
            .map(|m| m.frame.transaction_id.clone())
            .ok_or("a claim without messages")?;
        let o = s
            .ack(
                g,
                vec![ack(
                    &last,
                    &c.partition_id,
                    AckStatus::Completed,
                    Some(w.to_string()),
                )],
            )
            .await
            .map_err(e)?;
        ensure!(o[0].success, "ack of {last}: {o:?}");
    }
    Err("the backlog never ran out".into())
}

fn retained(name: &str, pending: u32, completed: u32) -> QueueConfig {
    QueueConfig {
        retention_enabled: true,
        retention_seconds: pending,
        completed_retention_seconds: completed,
        ..QueueConfig::with_defaults(name)
    }
}

/// Completed retention removes what every group consumed and nothing a lagging group has not,
/// only once it is older than completedRetentionSeconds; a group that first contacts the queue
/// afterwards starts at the first remaining segment.
pub async fn completed_retention_waits_for_every_group(b: &dyn Backend) -> CaseResult {
    let s = b.storage();
    let mut ids = Ids::new(40);
    configure(&*s, retained("ret", 0, 10)).await?;
    push(&*s, &mut ids, "ret", "p", "t", 0..3).await?;
    push(&*s, &mut ids, "ret", "p", "t", 3..5).await?;
    ensure_eq!(
        consume_all(&*s, &mut ids, "ret", "fast").await?,
        vec![0, 1, 2, 3, 4],
        "fast"
    );
    // The lagging group takes the first segment only.
    let w = ids.worker();
    let r = s
        .pop_wildcard(pop_req("ret", "slow", w, 3))
        .await
        .map_err(e)?;
    ensure_eq!(payload_ns(&r), vec![0, 1, 2], "slow's first batch");
    let pid = r.claims[0].partition_id.clone();
    s.ack(
        "slow",
        vec![ack("t-2", &pid, AckStatus::Completed, Some(w.to_string()))],
    )
    .await
    .map_err(e)?;
    let (removed, _) = retention_pass(&*s, RetentionPass::Retention, 10).await?;
    ensure_eq!(removed, Removed::default(), "nothing is old enough yet");
    b.advance_secs(11).await;
    let (removed, _) = retention_pass(&*s, RetentionPass::Retention, 10).await?;
    ensure_eq!(
        (removed.segments, removed.messages, removed.dedup_rows),
        (1, 3, 3),
        "the segment both groups consumed, with its transactionIds"
    );
    ensure_eq!(
        consume_all(&*s, &mut ids, "ret", "slow").await?,
        vec![3, 4],
        "slow loses nothing"
    );
    // A group whose first contact comes after the removal starts where the data starts.
    ensure_eq!(
        consume_all(&*s, &mut ids, "ret", "late").await?,
        vec![3, 4],
        "late"
    );
    let (removed, _) = retention_pass(&*s, RetentionPass::Retention, 10).await?;
    ensure_eq!(removed.messages, 2, "the rest, once all three consumed it");
    // Everything is gone: the next pop seals, and nothing is pending.
    ensure_eq!(
        consume_all(&*s, &mut ids, "ret", "later").await?,
        Vec::<u32>::new(),
        "later"
    );
    ensure!(
        !backlog(&*s, "ret", "later").await?,
        "nothing pending after the seal"
    );
    // A removed transactionId is forgotten: pushing it again stores a new message.
    let out = push(&*s, &mut ids, "ret", "p", "t", 0..1).await?;
    ensure!(
        matches!(out[0], PushOutcome::Queued { offset: 5, .. }),
        "a new message after its original was removed: {out:?}"
    );
    Ok(())
}

/// A group with a subscription record but no cursor row on a partition (the partition came after
/// its first contact) holds back everything it will read there; a group reading partitions by
/// name holds back the partitions it has a cursor on.
pub async fn a_group_without_a_cursor_row_holds_back(b: &dyn Backend) -> CaseResult {
    let s = b.storage();
    let mut ids = Ids::new(41);
    configure(&*s, retained("ret", 0, 10)).await?;
    push(&*s, &mut ids, "ret", "p1", "a", 0..2).await?;
    // `wide` makes first contact (a record reading from the start) and drains p1.
    ensure_eq!(
        consume_all(&*s, &mut ids, "ret", "wide").await?,
        vec![0, 1],
        "wide on p1"
    );
    // p2 comes later; only `named` reads it, by name.
    push(&*s, &mut ids, "ret", "p2", "b", 0..2).await?;
    let w = ids.worker();
    let r = s
        .pop_partition(pop_req("ret", "named", w, 10), "p2".into())
        .await
        .map_err(e)?;
    let pid = r.claims[0].partition_id.clone();
    s.ack(
        "named",
        vec![ack("b-1", &pid, AckStatus::Completed, Some(w.to_string()))],
    )
    .await
    .map_err(e)?;
    b.advance_secs(11).await;
    let (removed, _) = retention_pass(&*s, RetentionPass::Retention, 10).await?;
    ensure_eq!(
        removed.messages,
        2,
        "p1 (every reader done; `named` never read it) goes, p2 (wide has no row yet) stays"
    );
    ensure_eq!(
        consume_all(&*s, &mut ids, "ret", "wide").await?,
        vec![0, 1],
        "wide gets p2 whole"
    );
    let (removed, _) = retention_pass(&*s, RetentionPass::Retention, 10).await?;
    ensure_eq!(removed.messages, 2, "p2 once wide consumed it");
    // A group deleted with its record kept (cursors gone) holds nothing back.
    push(&*s, &mut ids, "ret", "p3", "c", 0..2).await?;
    ensure_eq!(
        consume_all(&*s, &mut ids, "ret", "named").await?,
        vec![0, 1],
        "named on p3"
    );
    s.delete_group("wide", Some("ret"), false)
        .await
        .map_err(e)?;
    b.advance_secs(11).await;
    let (removed, _) = retention_pass(&*s, RetentionPass::Retention, 10).await?;
    ensure_eq!(
        removed.messages,
        2,
        "p3: the deleted group's record pins nothing"
    );
    Ok(())
}

/// retentionSeconds removes consumed and unconsumed messages alike, leased ones included: the
/// lease holder's ack answers that the message is gone, and once the lease runs out the next pop
/// steps over the gap to what came after.
pub async fn pending_retention_removes_unconsumed(b: &dyn Backend) -> CaseResult {
    let s = b.storage();
    let mut ids = Ids::new(42);
    configure(
        &*s,
        QueueConfig {
            lease_time_secs: 30,
            ..retained("ret", 20, 0)
        },
    )
    .await?;
    push(&*s, &mut ids, "ret", "p", "t", 0..3).await?;
    let w = ids.worker();
    let r = s
        .pop_wildcard(pop_req("ret", "g", w, 10))
        .await
        .map_err(e)?;
    ensure_eq!(payload_ns(&r), vec![0, 1, 2], "leased");
    let pid = r.claims[0].partition_id.clone();
    b.advance_secs(15).await;
    push(&*s, &mut ids, "ret", "p", "t", 3..5).await?;
    b.advance_secs(6).await;
    let (removed, _) = retention_pass(&*s, RetentionPass::Retention, 10).await?;
    ensure_eq!(
        (removed.segments, removed.messages),
        (1, 3),
        "the expired, leased segment"
    );
    let o = s
        .ack(
            "g",
            vec![ack("t-2", &pid, AckStatus::Completed, Some(w.to_string()))],
        )
        .await
        .map_err(e)?;
    ensure!(
        !o[0].success,
        "an ack of a removed message is refused: {o:?}"
    );
    b.advance_secs(31).await;
    ensure_eq!(
        consume_all(&*s, &mut ids, "ret", "g").await?,
        vec![3, 4],
        "after the gap"
    );
    Ok(())
}

/// maxWaitTimeSeconds evicts (deletes) what waited longer, consumed or not, on the eviction pass
/// alone and without retention enabled; retention passes ignore a queue without retention.
pub async fn eviction_removes_what_waited_too_long(b: &dyn Backend) -> CaseResult {
    let s = b.storage();
    let mut ids = Ids::new(43);
    configure(
        &*s,
        QueueConfig {
            max_wait_time_seconds: 10,
            ..QueueConfig::with_defaults("evict")
        },
    )
    .await?;
    configure(&*s, QueueConfig::with_defaults("plain")).await?;
    push(&*s, &mut ids, "evict", "p", "t", 0..2).await?;
    push(&*s, &mut ids, "plain", "p", "t", 0..2).await?;
    b.advance_secs(6).await;
    push(&*s, &mut ids, "evict", "p", "t", 2..3).await?;
    b.advance_secs(5).await;
    ensure_eq!(
        s.retention_queues(RetentionPass::Eviction)
            .await
            .map_err(e)?,
        vec!["evict".to_string()],
        "queues with maxWaitTimeSeconds"
    );
    let (removed, _) = retention_pass(&*s, RetentionPass::Eviction, 10).await?;
    ensure_eq!(removed.messages, 2, "the first push waited 11 s");
    ensure_eq!(
        consume_all(&*s, &mut ids, "evict", "g").await?,
        vec![2],
        "the rest"
    );
    ensure_eq!(
        consume_all(&*s, &mut ids, "plain", "g").await?,
        vec![0, 1],
        "plain keeps all"
    );
    Ok(())
}

/// A dead-lettered message keeps its segment against completed retention (a requeue needs it);
/// expiry removes both.
pub async fn dead_letters_pin_their_messages(b: &dyn Backend) -> CaseResult {
    let s = b.storage();
    let mut ids = Ids::new(44);
    configure(&*s, retained("ret", 100, 10)).await?;
    push(&*s, &mut ids, "ret", "p", "t", 0..2).await?;
    push(&*s, &mut ids, "ret", "p", "t", 2..4).await?;
    let w = ids.worker();
    let r = s.pop_wildcard(pop_req("ret", "g", w, 2)).await.map_err(e)?;
    let pid = r.claims[0].partition_id.clone();
    let l = Some(w.to_string());
    let o = s
        .ack(
            "g",
            vec![
                ack("t-0", &pid, AckStatus::Dlq, l.clone()),
                ack("t-1", &pid, AckStatus::Completed, l),
            ],
        )
        .await
        .map_err(e)?;
    ensure!(o.iter().all(|x| x.success), "acked: {o:?}");
    ensure_eq!(
        consume_all(&*s, &mut ids, "ret", "g").await?,
        vec![2, 3],
        "the rest"
    );
    b.advance_secs(11).await;
    let (removed, _) = retention_pass(&*s, RetentionPass::Retention, 10).await?;
    ensure_eq!(
        removed.messages,
        2,
        "the segment without a dead letter only"
    );
    ensure_eq!(
        b.filed_dead_letters("ret").await.len(),
        1,
        "the dead letter stays"
    );
    b.advance_secs(100).await;
    let (removed, _) = retention_pass(&*s, RetentionPass::Retention, 10).await?;
    ensure_eq!(
        (removed.messages, removed.dead_letters),
        (2, 1),
        "expired: the segment and its dead letter"
    );
    ensure!(
        b.filed_dead_letters("ret").await.is_empty(),
        "no dead letter left"
    );
    Ok(())
}

/// Batches walk a queue's candidates in (oldest segment, id) order from the mark: every
/// partition is visited once per pass, however small the batch.
pub async fn retention_batches_continue_from_the_mark(b: &dyn Backend) -> CaseResult {
    let s = b.storage();
    let mut ids = Ids::new(45);
    configure(&*s, retained("ret", 10, 0)).await?;
    for p in 0..5 {
        push(&*s, &mut ids, "ret", &format!("p{p}"), "t", 0..2).await?;
        b.advance_secs(1).await;
    }
    b.advance_secs(10).await;
    let (removed, batches) = retention_pass(&*s, RetentionPass::Retention, 2).await?;
    ensure_eq!(removed.messages, 10, "every partition");
    ensure_eq!(batches, 3, "batches of 2, 2 and 1");
    let (removed, batches) = retention_pass(&*s, RetentionPass::Retention, 2).await?;
    ensure_eq!(
        (removed, batches),
        (Removed::default(), 1),
        "no candidate is left"
    );
    Ok(())
}

/// A partition with no segment, no push for the cleanup period and no live lease is deleted
/// with its cursors; a later push recreates it and every group reads the new messages.
pub async fn inactive_partitions_are_deleted(b: &dyn Backend) -> CaseResult {
    let s = b.storage();
    let mut ids = Ids::new(46);
    configure(&*s, retained("ret", 0, 1)).await?;
    push(&*s, &mut ids, "ret", "idle", "t", 0..2).await?;
    push(&*s, &mut ids, "ret", "busy", "u", 0..2).await?;
    ensure_eq!(
        consume_all(&*s, &mut ids, "ret", "g").await?.len(),
        4,
        "drained"
    );
    b.advance_secs(2).await;
    retention_pass(&*s, RetentionPass::Retention, 10).await?;
    push(&*s, &mut ids, "ret", "busy", "u", 2..3).await?;
    b.advance_secs(3 * 86_400).await;
    // `busy` holds a segment; `Default` (from configure) and `idle` are empty.
    let n = s
        .remove_inactive_partitions(2 * 86_400, 10)
        .await
        .map_err(e)?;
    ensure_eq!(n, 2, "the two empty partitions");
    let n = s
        .remove_inactive_partitions(2 * 86_400, 10)
        .await
        .map_err(e)?;
    ensure_eq!(n, 0, "nothing left to delete");
    push(&*s, &mut ids, "ret", "idle", "t", 5..6).await?;
    let mut got = consume_all(&*s, &mut ids, "ret", "g").await?;
    got.sort();
    ensure_eq!(
        got,
        vec![2, 5],
        "the recreated partition's message reaches the group"
    );
    Ok(())
}

/// The maintenance lease admits one holder at a time; it is renewed by its holder, released
/// early, and lost when it runs out.
pub async fn the_maintenance_lease_admits_one_holder(b: &dyn Backend) -> CaseResult {
    let s = b.storage();
    ensure!(
        s.claim_maintenance("job", "a", 30).await.map_err(e)?,
        "a takes it"
    );
    ensure!(
        !s.claim_maintenance("job", "b", 30).await.map_err(e)?,
        "b is kept out"
    );
    ensure!(
        s.claim_maintenance("job", "a", 30).await.map_err(e)?,
        "a renews"
    );
    ensure!(
        s.claim_maintenance("other", "b", 30).await.map_err(e)?,
        "leases are by name"
    );
    s.release_maintenance("job", "b").await.map_err(e)?;
    ensure!(
        !s.claim_maintenance("job", "b", 30).await.map_err(e)?,
        "only the holder releases"
    );
    s.release_maintenance("job", "a").await.map_err(e)?;
    ensure!(
        s.claim_maintenance("job", "b", 30).await.map_err(e)?,
        "b after a's release"
    );
    b.advance_secs(31).await;
    ensure!(
        s.claim_maintenance("job", "a", 30).await.map_err(e)?,
        "b's lease ran out"
    );
    Ok(())
}

/// Dead letters have a retention of their own: older than the limit, they go (oldest first, a
/// batch at a time); their messages stay for the queue's own rules.
pub async fn old_dead_letters_are_removed(b: &dyn Backend) -> CaseResult {
    let s = b.storage();
    let mut ids = Ids::new(47);
    push(&*s, &mut ids, "q", "p", "t", 0..3).await?;
    let w = ids.worker();
    let r = s.pop_wildcard(pop_req("q", "g", w, 1)).await.map_err(e)?;
    let pid = r.claims[0].partition_id.clone();
    s.ack(
        "g",
        vec![ack("t-0", &pid, AckStatus::Dlq, Some(w.to_string()))],
    )
    .await
    .map_err(e)?;
    b.advance_secs(100).await;
    let w = ids.worker();
    s.pop_wildcard(pop_req("q", "g", w, 1)).await.map_err(e)?;
    s.ack(
        "g",
        vec![ack("t-1", &pid, AckStatus::Dlq, Some(w.to_string()))],
    )
    .await
    .map_err(e)?;
    ensure_eq!(b.filed_dead_letters("q").await.len(), 2, "two dead letters");
    ensure_eq!(
        s.remove_old_dead_letters(50, 10).await.map_err(e)?,
        1,
        "the old one"
    );
    ensure_eq!(
        b.filed_dead_letters("q").await,
        vec![(1, "t-1".to_string())],
        "the recent one stays"
    );
    ensure_eq!(
        consume_all(&*s, &mut ids, "q", "g").await?,
        vec![2],
        "the rest is untouched"
    );
    Ok(())
}

macro_rules! cases {
    ($($name:ident),* $(,)?) => {
        /// Every conformance case, by name.
        pub fn all() -> Vec<(&'static str, CaseFn)> {
            vec![$((stringify!($name), |b| Box::pin($name(b))),)*]
        }
    };
}

cases!(
    leased_pop_delivers_in_order,
    lease_length_coalesces,
    auto_ack_commits,
    expiry_redelivers_and_counts_attempts,
    positional_ack_and_fencing,
    dedup_by_partition_and_transaction_id,
    subscription_seeding,
    durable_subscription_covers_later_partitions,
    visibility_gates,
    seal_guards,
    budgets,
    lease_renewal,
    failed_acks_retry_then_dead_letter,
    a_nack_bounds_its_call_in_any_order,
    discovery,
    pending_and_delete,
    configure_round_trip,
    transactions_are_atomic_and_idempotent,
    the_cursor_never_rewinds,
    dead_letter_listing,
    seek_and_group_deletion,
    wildcard_windows,
    drained_batches,
    windowing_boundaries,
    dead_letter_flags_are_enforced,
    max_size_caps_the_backlog,
    ttl_expires_messages,
    retention_gap_starts_at_the_first_segment,
    next_pending_reports_when_leases_end,
    an_accepted_push_keeps_its_time,
    completed_retention_waits_for_every_group,
    a_group_without_a_cursor_row_holds_back,
    pending_retention_removes_unconsumed,
    eviction_removes_what_waited_too_long,
    dead_letters_pin_their_messages,
    retention_batches_continue_from_the_mark,
    inactive_partitions_are_deleted,
    the_maintenance_lease_admits_one_holder,
    old_dead_letters_are_removed,
    kv_versions_rise_and_preconditions_hold,
    kv_expiry_is_absence,
    kv_prefix_pages_and_get_many,
    kv_required_rolls_back,
    locks_fence_their_holders,
    timers_fire_once_never_early,
    fetch_reads_by_offset,
    partitions_changed_since,
    stream_queries_register_by_hash,
    stream_state_reads_select,
    stream_cycles_commit_all_or_nothing_on_the_lease,
    stream_cycles_end_the_lease_they_own,
    stream_cycles_are_fenced_on_the_state_they_close,
    a_flush_deletes_a_window_only_as_its_ripe_read_saw_it,
    conflation_delivers_the_newest_only,
    conflation_is_fixed_at_registration,
    conflation_respects_visibility,
    push_rounds_answer_each_request,
    push_rounds_answer_duplicates_as_alone,
    push_rounds_to_existing_partitions_chain_offsets,
    ephemeral_declarations_round_trip,
    ephemeral_owners_claim_and_move,
    ephemeral_takeover_waits_for_an_unbroken_liveness,
    partition_views_page_and_by_id,
    messages_created_per_interval,
    stored_totals_keep_the_later_pass,
);
