//! Discovery, pending probes and queue deletion, configuration, transactions.

use queen_core::storage::{AckStatus, PushOutcome, QueueConfig, TxOp, TxOpResult};

use super::{ack, backlog, configure, e, push, Backend, CaseResult};
use crate::fixtures::{group, pop_req, Ids};

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
