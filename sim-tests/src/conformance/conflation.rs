//! Conformance cases of conflation (last-value delivery): a stored policy of (queue, group), fixed
//! at the group's registration; a conflating pop takes each partition's newest visible message
//! and retires those behind it.

use queen_core::storage::{AckStatus, PopRequest, QueueConfig, Storage, Verdict};
use queen_core::types::QUEUE_MODE_GROUP;

use super::{ack, configure, e, push, verdict_of, Backend, CaseResult};
use crate::fixtures::{payload_ns, pop_req, Ids};

fn conflating(queue: &str, group: &str, worker: queen_core::WorkerId) -> PopRequest {
    PopRequest {
        conflation: true,
        ..pop_req(queue, group, worker, 10)
    }
}

/// Acks a pop's one message with `status`, under the pop's lease (`worker`).
async fn ack_one(
    s: &dyn Storage,
    group: &str,
    r: &queen_core::storage::PopResult,
    worker: queen_core::WorkerId,
    status: AckStatus,
) -> CaseResult {
    let m = crate::fixtures::messages(r);
    let m = m.first().ok_or("nothing to ack")?;
    s.ack(
        group,
        vec![ack(
            &m.frame.transaction_id,
            &m.partition_id,
            status,
            Some(worker.to_string()),
        )],
    )
    .await
    .map_err(e)?;
    Ok(())
}

/// A backlog of 100 is one delivery of the newest; afterwards only newer messages come, one a
/// partition, whatever later pops ask; a failed delivery comes back (the newest is never retired
/// by its own delivery).
pub async fn conflation_delivers_the_newest_only(b: &dyn Backend) -> CaseResult {
    let s = b.storage();
    let mut ids = Ids::new(80);
    // No retryDelay hold: a failed delivery is claimable again at once.
    configure(
        &*s,
        QueueConfig {
            retry_delay_ms: 0,
            ..QueueConfig::with_defaults("cq")
        },
    )
    .await?;
    // Two segments, so the newest is found past a segment boundary.
    push(&*s, &mut ids, "cq", "p", "a", 0..40).await?;
    push(&*s, &mut ids, "cq", "p", "b", 40..100).await?;
    let w = ids.worker();
    let r = s
        .pop_partition(conflating("cq", "g", w), "p".into())
        .await
        .map_err(e)?;
    ensure_eq!(payload_ns(&r), vec![99], "the newest alone");
    ensure_eq!(r.stored_conflation, Some(true), "registered conflating");
    let c = &r.claims[0];
    ensure_eq!((c.first_offset, c.last_offset), (99, 99), "claim span");
    ensure!(c.lease_expires_at.is_some(), "leased");
    // Failed: the newest comes back, not the retired ones.
    ack_one(&*s, "g", &r, w, AckStatus::Failed).await?;
    let w = ids.worker();
    let r = s
        .pop_partition(conflating("cq", "g", w), "p".into())
        .await
        .map_err(e)?;
    ensure_eq!(payload_ns(&r), vec![99], "the failed newest is redelivered");
    ensure_eq!(r.claims[0].attempt_count, 2, "second attempt");
    ack_one(&*s, "g", &r, w, AckStatus::Completed).await?;
    // Nothing newer: empty, and the policy is still said.
    let r = s
        .pop_partition(conflating("cq", "g", ids.worker()), "p".into())
        .await
        .map_err(e)?;
    ensure!(r.claims.is_empty(), "nothing newer: {:?}", r.claims);
    ensure_eq!(r.stored_conflation, Some(true), "policy on an empty pop");
    // Newer pushes: only the newest of them, for a pop that did not ask (the stored policy wins).
    push(&*s, &mut ids, "cq", "p", "c", 100..103).await?;
    push(&*s, &mut ids, "cq", "p2", "d", 0..5).await?;
    let r = s
        .pop_list(
            PopRequest {
                max_partitions: 2,
                ..pop_req("cq", "g", ids.worker(), 10)
            },
            vec!["p".into(), "p2".into()],
        )
        .await
        .map_err(e)?;
    let mut got = payload_ns(&r);
    got.sort_unstable();
    ensure_eq!(got, vec![4, 102], "the newest of each partition");
    ensure_eq!(r.stored_conflation, Some(true), "stored policy wins");
    Ok(())
}

/// The first registration fixes the policy: a group registered plain stays plain for a pop that
/// asks for conflation (and hears so), queue mode never registers, and a deleted group comes back
/// with the policy of its next registration.
pub async fn conflation_is_fixed_at_registration(b: &dyn Backend) -> CaseResult {
    let s = b.storage();
    let mut ids = Ids::new(81);
    push(&*s, &mut ids, "cr", "p", "a", 0..5).await?;
    // The wildcard's first contact registers the group, without conflation.
    let r = s
        .pop_wildcard(pop_req("cr", "plain", ids.worker(), 2))
        .await
        .map_err(e)?;
    ensure_eq!(payload_ns(&r), vec![0, 1], "a plain batch");
    ensure_eq!(r.stored_conflation, Some(false), "registered plain");
    let r = s
        .pop_list(conflating("cr", "plain", ids.worker()), vec!["p".into()])
        .await
        .map_err(e)?;
    ensure!(
        matches!(verdict_of(&r, "p"), Some(Verdict::LeasedUntil(_))),
        "still leased: {:?}",
        r.verdicts
    );
    ensure_eq!(
        r.stored_conflation,
        Some(false),
        "conflict: the stored policy"
    );
    // Queue mode has no policy.
    let r = s
        .pop_partition(pop_req("cr", QUEUE_MODE_GROUP, ids.worker(), 1), "p".into())
        .await
        .map_err(e)?;
    ensure_eq!(r.stored_conflation, None, "queue mode");
    ensure_eq!(payload_ns(&r), vec![0], "queue mode delivers in order");
    // Registered conflating by its first pop through the wildcard.
    let r = s
        .pop_wildcard(conflating("cr", "last", ids.worker()))
        .await
        .map_err(e)?;
    ensure_eq!(payload_ns(&r), vec![4], "the newest");
    ensure_eq!(r.stored_conflation, Some(true), "registered conflating");
    // Deleted and registered again, plain.
    s.delete_group("last", Some("cr"), true).await.map_err(e)?;
    let r = s
        .pop_wildcard(pop_req("cr", "last", ids.worker(), 10))
        .await
        .map_err(e)?;
    ensure_eq!(r.stored_conflation, Some(false), "re-registered plain");
    ensure_eq!(payload_ns(&r), vec![0, 1, 2, 3, 4], "a plain backlog");
    Ok(())
}

/// delayedProcessing: the newest *visible* message is the one taken, and a partition with
/// nothing visible past the cursor says when it will have.
pub async fn conflation_respects_visibility(b: &dyn Backend) -> CaseResult {
    let s = b.storage();
    let mut ids = Ids::new(82);
    configure(
        &*s,
        QueueConfig {
            delayed_processing_secs: 10,
            ..QueueConfig::with_defaults("cv")
        },
    )
    .await?;
    push(&*s, &mut ids, "cv", "p", "a", 0..3).await?;
    b.advance_secs(20).await;
    push(&*s, &mut ids, "cv", "p", "b", 3..6).await?;
    let w = ids.worker();
    let r = s
        .pop_partition(conflating("cv", "g", w), "p".into())
        .await
        .map_err(e)?;
    ensure_eq!(payload_ns(&r), vec![2], "the newest visible");
    ack_one(&*s, "g", &r, w, AckStatus::Completed).await?;
    // Nothing visible past the cursor: deferred until the next push becomes visible.
    let r = s
        .pop_partition(conflating("cv", "g", ids.worker()), "p".into())
        .await
        .map_err(e)?;
    ensure!(
        matches!(verdict_of(&r, "p"), Some(Verdict::DeferredUntil(_))),
        "deferred: {:?}",
        r.verdicts
    );
    b.advance_secs(20).await;
    let r = s
        .pop_partition(conflating("cv", "g", ids.worker()), "p".into())
        .await
        .map_err(e)?;
    ensure_eq!(payload_ns(&r), vec![5], "the newest, once visible");
    Ok(())
}
