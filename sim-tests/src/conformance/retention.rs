//! Retention and eviction passes, inactive partitions, the maintenance lease, old dead letters.

use queen_core::storage::{AckStatus, PushOutcome, QueueConfig, Removed, RetentionPass, Storage};

use super::{ack, backlog, configure, e, push, Backend, CaseResult};
use crate::fixtures::{messages, payload_ns, pop_req, Ids};

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
