//! Where a group starts (subscriptions, durable and pop-carried), the visibility gates, the
//! empty-partition seal, and a pop's budgets.

use queen_core::claim::SubscriptionIntent;
use queen_core::params::{SubscriptionFrom, SubscriptionMode};
use queen_core::storage::{PopRequest, QueueConfig, Verdict};
use queen_core::types::QUEUE_MODE_GROUP;

use super::{backlog, configure, e, push, verdict_of, Backend, CaseResult};
use crate::fixtures::{payload_ns, pop_req, Ids};

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
