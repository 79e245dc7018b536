//! Leased and autoAck pops, lease lengths and expiries, positional acks and their fencing,
//! de-duplication.

use queen_core::storage::{AckStatus, PopRequest, PushOutcome, QueueConfig, Verdict};
use queen_core::types::QUEUE_MODE_GROUP;

use super::{ack, configure, e, push, verdict_of, Backend, CaseResult};
use crate::fixtures::{group, payload_ns, pop_req, Ids};

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
