//! The dead-letter listing, requeues, and the dead-letter options.

use queen_core::storage::{
    AckStatus, DeadLetterPage, DlqQuery, PushOutcome, QueueConfig, Requeued, Storage,
};

use super::{ack, configure, e, push, Backend, CaseResult};
use crate::fixtures::{payload_ns, pop_req, Ids};

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
