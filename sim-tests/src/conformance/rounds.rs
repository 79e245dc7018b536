//! Conformance cases of push rounds: several push requests sent together, each answered as if
//! it had been sent alone, whatever the others meet.

use queen_core::storage::{PushOutcome, QueueConfig};

use super::{configure, e, Backend, CaseResult};
use crate::fixtures::{group, payload_ns, pop_req, Ids};

fn queued_offsets(answer: &[Vec<PushOutcome>]) -> Vec<Option<i64>> {
    answer
        .iter()
        .flatten()
        .map(|o| match o {
            PushOutcome::Queued { offset, .. } => Some(*offset),
            _ => None,
        })
        .collect()
}

/// Each request's answer, or the first failure.
fn every_answer(
    answers: Vec<queen_core::storage::StorageResult<Vec<Vec<PushOutcome>>>>,
) -> Result<Vec<Vec<Vec<PushOutcome>>>, String> {
    answers.into_iter().map(|a| a.map_err(e)).collect()
}

/// A round without duplicates is one transaction: requests of one partition take offsets in the
/// round's order, requests of others keep theirs, and a capped queue refuses only its request.
pub async fn push_rounds_answer_each_request(b: &dyn Backend) -> CaseResult {
    let s = b.storage();
    let mut ids = Ids::new(90);
    configure(
        &*s,
        QueueConfig {
            max_size: 2,
            ..QueueConfig::with_defaults("rcap")
        },
    )
    .await?;
    let answers = s
        .push_round(vec![
            vec![group(&mut ids, "rq", "p", "a", 0..2)],
            vec![group(&mut ids, "rq", "p", "b", 2..3)],
            vec![group(&mut ids, "rcap", "p", "c", 0..3)],
            vec![
                group(&mut ids, "rq", "other", "d", 0..1),
                group(&mut ids, "rq", "p", "d", 3..4),
            ],
        ])
        .await;
    ensure_eq!(answers.len(), 4, "an answer per request");
    let answers = every_answer(answers)?;
    ensure_eq!(
        queued_offsets(&answers[0]),
        vec![Some(0), Some(1)],
        "first request"
    );
    ensure_eq!(
        queued_offsets(&answers[1]),
        vec![Some(2)],
        "second, after the first"
    );
    ensure!(
        answers[2]
            .iter()
            .flatten()
            .all(|o| matches!(o, PushOutcome::Rejected { .. })),
        "the capped queue refuses its request whole: {:?}",
        answers[2]
    );
    ensure_eq!(
        queued_offsets(&answers[3]),
        vec![Some(0), Some(3)],
        "a request of two partitions"
    );
    let r = s
        .pop_partition(pop_req("rq", "g", ids.worker(), 10), "p".into())
        .await
        .map_err(e)?;
    ensure_eq!(
        payload_ns(&r),
        vec![0, 1, 2, 3],
        "stored in the round's order"
    );
    let r = s
        .pop_partition(pop_req("rcap", "g", ids.worker(), 10), "p".into())
        .await
        .map_err(e)?;
    ensure!(r.claims.is_empty(), "nothing of the refused request stored");
    Ok(())
}

/// A duplicate in a round (of a stored message, or of another request of the round) is answered
/// as it would be alone: the original's id, the rest of its request stored.
pub async fn push_rounds_answer_duplicates_as_alone(b: &dyn Backend) -> CaseResult {
    let s = b.storage();
    let mut ids = Ids::new(91);
    s.push(vec![group(&mut ids, "dq", "p", "t", 0..1)])
        .await
        .map_err(e)?;
    let first = group(&mut ids, "dq", "p", "t", 1..2);
    let mut again = group(&mut ids, "dq", "p", "t", 1..3);
    // `again` repeats t-1 of `first` (same transactionId, another message id).
    again.frames[0].transaction_id = first.frames[0].transaction_id.clone();
    let answers = s
        .push_round(vec![
            vec![group(&mut ids, "dq", "p", "t", 0..1)],
            vec![first.clone()],
            vec![again],
        ])
        .await;
    let answers = every_answer(answers)?;
    ensure!(
        matches!(answers[0][0][0], PushOutcome::Duplicate { .. }),
        "a stored transactionId: {:?}",
        answers[0]
    );
    ensure_eq!(queued_offsets(&answers[1]), vec![Some(1)], "the first t-1");
    match (&answers[1][0][0], &answers[2][0][0]) {
        (PushOutcome::Queued { message_id, .. }, PushOutcome::Duplicate { message_id: d, .. }) => {
            ensure_eq!(message_id, d, "the repeat answers the original's id")
        }
        other => return Err(format!("the repeat within the round: {other:?}")),
    }
    ensure_eq!(
        queued_offsets(&answers[2])[1],
        Some(2),
        "the rest of the repeating request is stored"
    );
    Ok(())
}

/// A round whose queues and partitions all exist (the common case, one set-based statement on
/// PostgreSQL): requests of one partition take consecutive offsets in the round's order across
/// requests, other partitions keep their own, a repeat within a request answers its first, and
/// a later push follows on.
pub async fn push_rounds_to_existing_partitions_chain_offsets(b: &dyn Backend) -> CaseResult {
    let s = b.storage();
    let mut ids = Ids::new(92);
    s.push(vec![
        group(&mut ids, "xq", "p", "x", 0..1),
        group(&mut ids, "xq", "o", "x", 0..1),
    ])
    .await
    .map_err(e)?;
    let mut repeating = group(&mut ids, "xq", "p", "y", 3..5);
    repeating.frames[1].transaction_id = repeating.frames[0].transaction_id.clone();
    let answers = s
        .push_round(vec![
            vec![group(&mut ids, "xq", "p", "a", 1..3)],
            vec![group(&mut ids, "xq", "o", "b", 1..2), repeating],
            vec![group(&mut ids, "xq", "p", "c", 5..6)],
        ])
        .await;
    let answers = every_answer(answers)?;
    ensure_eq!(
        queued_offsets(&answers[0]),
        vec![Some(1), Some(2)],
        "first request"
    );
    match &answers[1][1][..] {
        [PushOutcome::Queued {
            offset: 3,
            message_id,
            ..
        }, PushOutcome::Duplicate { message_id: d, .. }] => {
            ensure_eq!(message_id, d, "the repeat answers its first")
        }
        other => return Err(format!("the repeating request: {other:?}")),
    }
    ensure_eq!(
        queued_offsets(&answers[1])[0],
        Some(1),
        "the other partition"
    );
    ensure_eq!(
        queued_offsets(&answers[2]),
        vec![Some(4)],
        "the third, after the second"
    );
    s.push(vec![group(&mut ids, "xq", "p", "z", 6..7)])
        .await
        .map_err(e)?;
    let r = s
        .pop_partition(pop_req("xq", "g", ids.worker(), 10), "p".into())
        .await
        .map_err(e)?;
    ensure_eq!(
        payload_ns(&r),
        vec![0, 1, 2, 3, 5, 6],
        "stored in the round's order"
    );
    Ok(())
}
