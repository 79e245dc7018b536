//! Queue options: maxSize, ttl, the retention gap, an accepted push's time, when leases end.

use queen_core::storage::{AckStatus, PopRequest, PushOutcome, QueueConfig, TxOp};

use super::{ack, backlog, configure, e, push, Backend, CaseResult};
use crate::fixtures::{group, payload_ns, pop_req, Ids};

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
