//! Lease renewal, failed acks (retries, dead letters), a nack's bound on its call, and a
//! cursor that never rewinds.

use queen_core::storage::{AckStatus, PopRequest, QueueConfig};

use super::{ack, configure, e, push, Backend, CaseResult};
use crate::fixtures::{payload_ns, pop_req, Ids};

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
