//! Push, ack and lease renewal on PostgreSQL (push_v6, ack_v3, renew_lease_v1).

use async_trait::async_trait;
use queen_core::dedup::FirstOccurrences;
use queen_core::frames::Frame;
use queen_core::storage::{
    partition_number, AckItem, AckOutcome, AckStatus, LeaseBatchEnds, MessageStorage, PushGroup,
    PushGroupResult, PushOutcome, QueueFull, RenewOutcome, SealCheck, StorageError, StorageResult,
};
use std::time::SystemTime;

use queen_core::Timestamp;

use crate::error::{pg_err, pool_err, retry_contention};
use crate::{from_system_time, int, to_system_time, PgStorage};

fn status_text(s: AckStatus) -> &'static str {
    match s {
        AckStatus::Completed => "completed",
        AckStatus::Failed => "failed",
        AckStatus::Retry => "retry",
        AckStatus::Dlq => "dlq",
    }
}

/// How push_v6 writes a push's transactionId rows.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Dedup {
    /// Plainly: a duplicate fails the statement (and the transaction) with
    /// `PushFailure::DuplicateMet`, and the caller pushes again with `Answer`. No duplicate is
    /// the common case, and it skips a conflict check per row.
    ExpectNew,
    /// `ON CONFLICT DO NOTHING`: duplicates are answered with the original message ids.
    Answer,
}

/// Why push_groups stored nothing.
#[derive(Debug)]
pub(crate) enum PushFailure {
    /// `Dedup::ExpectNew` met a stored transactionId: everything rolled back.
    DuplicateMet,
    Storage(StorageError),
}

impl From<StorageError> for PushFailure {
    fn from(e: StorageError) -> Self {
        PushFailure::Storage(e)
    }
}

impl PushFailure {
    /// For callers that push with `Dedup::Answer`, where a duplicate is an answer, not a failure.
    pub(crate) fn into_storage(self) -> StorageError {
        match self {
            PushFailure::Storage(e) => e,
            PushFailure::DuplicateMet => {
                StorageError::Internal("push_v6 failed on a duplicate it should answer".into())
            }
        }
    }
}

fn is_duplicate_txid(e: &tokio_postgres::Error) -> bool {
    e.as_db_error().is_some_and(|db| {
        db.code() == &tokio_postgres::error::SqlState::UNIQUE_VIOLATION
            && db.constraint() == Some("log_txids_pkey")
    })
}

/// The push of a request: inside a caller's transaction (a push of several partitions, or a
/// transaction op), or, for one partition, as a single statement (its own transaction: one round
/// trip instead of BEGIN, the call and COMMIT).
pub(crate) async fn push_groups(
    tx: &impl deadpool_postgres::GenericClient,
    groups: &[PushGroup],
    accepted_at: Option<SystemTime>,
    seal: SealCheck,
    dedup: Dedup,
) -> Result<Vec<PushGroupResult>, PushFailure> {
    let stmt = tx
        .prepare_cached(
            "SELECT o_status, o_message_id, o_partition_id, o_offset, o_max_size, o_backlog
               FROM queen.push_v6($1, $2, $3, $4, $5, $6, $7, $8)",
        )
        .await
        .map_err(pg_err("push"))?;
    // Partition locks are taken in one global order, so concurrent multi-partition pushes
    // never deadlock.
    let mut order: Vec<usize> = (0..groups.len()).collect();
    order.sort_by(|a, b| {
        (&groups[*a].queue, &groups[*a].partition).cmp(&(&groups[*b].queue, &groups[*b].partition))
    });
    let mut results: Vec<PushGroupResult> = vec![Vec::new(); groups.len()];
    for i in order {
        results[i] = push_group(tx, &stmt, &groups[i], accepted_at, seal, dedup).await?;
    }
    Ok(results)
}

/// One group's push: its first occurrences in rounds of `push_v6` until every item has an
/// outcome (each round that meets duplicates answers them and retries the rest).
async fn push_group(
    tx: &impl deadpool_postgres::GenericClient,
    stmt: &tokio_postgres::Statement,
    g: &PushGroup,
    accepted_at: Option<SystemTime>,
    seal: SealCheck,
    dedup: Dedup,
) -> Result<PushGroupResult, PushFailure> {
    let sealed = (seal == SealCheck::Enforce).then(|| g.is_sealed());
    let firsts = FirstOccurrences::of(&g.frames);
    let mut outcome: Vec<Option<PushOutcome>> = vec![None; g.frames.len()];
    let mut candidates: Vec<usize> = firsts.firsts().collect();
    // Each round that meets duplicates answers them and retries the rest, so every round has
    // fewer items: at most one round per item, plus one. Inside a transaction the second
    // round has none (the partition lock is held); as single statements another push may
    // commit one in between, which this round then answers as a duplicate.
    for _ in 0..=g.frames.len() {
        if candidates.is_empty() {
            break;
        }
        let frames: Vec<_> = candidates.iter().map(|k| g.frames[*k].clone()).collect();
        let blob = g
            .segment_blob(&frames)
            .map_err(|e| StorageError::Invalid(e.to_string()))?;
        let txids: Vec<&str> = frames.iter().map(|f| f.transaction_id.as_str()).collect();
        let ids: Vec<uuid::Uuid> = frames.iter().map(|f| f.message_id).collect();
        let rows = tx
            .query(
                stmt,
                &[
                    &g.queue,
                    &g.partition,
                    &txids,
                    &ids,
                    &blob,
                    &accepted_at,
                    &sealed,
                    &(dedup == Dedup::ExpectNew),
                ],
            )
            .await
            .map_err(|e| {
                if dedup == Dedup::ExpectNew && is_duplicate_txid(&e) {
                    PushFailure::DuplicateMet
                } else {
                    PushFailure::Storage(pg_err("push")(e))
                }
            })?;
        // Stored whole: one row, the first offset and the count.
        if let [row] = rows.as_slice() {
            if row.get::<_, &str>(0) == "queued" && row.get::<_, Option<i64>>(5).is_some() {
                let first: i64 = row.get(3);
                let count: i64 = row.get(5);
                if count != candidates.len() as i64 {
                    return Err(PushFailure::Storage(StorageError::Internal(format!(
                        "push_v6 stored {count} items of {}",
                        candidates.len()
                    ))));
                }
                let partition_id = row.get::<_, uuid::Uuid>(2).to_string();
                for ((k, frame), offset) in candidates.iter().zip(&frames).zip(first..) {
                    outcome[*k] = Some(PushOutcome::Queued {
                        message_id: frame.message_id,
                        partition_id: partition_id.clone(),
                        offset,
                    });
                }
                candidates.clear();
                continue;
            }
        }
        if rows.len() != candidates.len() {
            return Err(PushFailure::Storage(StorageError::Internal(format!(
                "push_v6 answered {} rows for {} items",
                rows.len(),
                candidates.len()
            ))));
        }
        candidates = row_outcomes(g, &rows, &candidates, &mut outcome)?;
    }
    if !candidates.is_empty() {
        return Err(PushFailure::Storage(StorageError::Internal(
            "push_v6 kept asking to retry".into(),
        )));
    }
    Ok(firsts
        .resolve(outcome)
        .ok_or_else(|| StorageError::Internal("push outcome missing".into()))?)
}

impl PgStorage {
    /// A round of push requests as one statement, every transactionId expected new: set-based
    /// (`push_round_v1`) when every queue and partition exists and none is capped or refuses
    /// plaintext, else `push_v6` per group, laterally, in the partitions' global lock order.
    /// `None`: the statement did not answer every group whole (a duplicate met, whose answers
    /// the requests get alone).
    async fn push_round_statement(
        &self,
        requests: &[Vec<PushGroup>],
    ) -> StorageResult<Option<Vec<Vec<PushGroupResult>>>> {
        let RoundArrays {
            order,
            queues,
            partitions,
            blobs,
            sealed,
            starts,
            ends,
            txids,
            ids,
            firsts_of,
        } = RoundArrays::of(requests)?;
        let client = self.pool.get().await.map_err(pool_err)?;
        let context = "push round";
        // The common case set-based (push_round_v1); it answers no row for a round it leaves to
        // push_v6 per group (a new queue or partition, a capped or encrypting queue).
        let set_based = client
            .prepare_cached(
                "SELECT o_i, o_partition_id, o_offset, o_count
                   FROM queen.push_round_v1($1, $2, $3, $4, $5, $6, $7, $8)",
            )
            .await
            .map_err(pg_err(context))?;
        let args: [&(dyn tokio_postgres::types::ToSql + Sync); 8] = [
            &queues,
            &partitions,
            &blobs,
            &sealed,
            &starts,
            &ends,
            &txids,
            &ids,
        ];
        let rows = match client.query(&set_based, &args).await {
            Ok(rows) => rows,
            Err(e) if is_duplicate_txid(&e) => return Ok(None),
            Err(e) => return Err(pg_err(context)(e)),
        };
        if !rows.is_empty() {
            if rows.len() != order.len() {
                return Err(StorageError::Internal(format!(
                    "{context}: push_round_v1 answered {} rows for {} groups",
                    rows.len(),
                    order.len()
                )));
            }
            let mut answers: Vec<Vec<PushGroupResult>> =
                requests.iter().map(|g| vec![Vec::new(); g.len()]).collect();
            for ((row, &(r, k)), (firsts, candidates, frames)) in
                rows.iter().zip(&order).zip(&firsts_of)
            {
                let bad = |what: &str| StorageError::Internal(format!("{context}: {what}"));
                let count: i64 = row.try_get(3).map_err(|_| bad("count"))?;
                let stored = Stored {
                    partition_id: row.try_get(1).map_err(|_| bad("partition id"))?,
                    first: row.try_get(2).map_err(|_| bad("offset"))?,
                };
                if count != candidates.len() as i64 {
                    return Err(bad("a group stored in part"));
                }
                answers[r][k] = stored
                    .outcomes(firsts, requests[r][k].frames.len(), candidates, frames)
                    .ok_or_else(|| bad("an outcome missing"))?;
            }
            return Ok(Some(answers));
        }
        let stmt = client
            .prepare_cached(
                "SELECT g.i, r.o_status, r.o_message_id, r.o_partition_id, r.o_offset,
                        r.o_max_size, r.o_backlog
                   FROM unnest($1::text[], $2::text[], $3::bytea[], $4::bool[], $5::int[],
                               $6::int[])
                        WITH ORDINALITY AS g(queue, partition, blob, sealed, s, e, i)
                  CROSS JOIN LATERAL queen.push_v6(g.queue, g.partition, ($7::text[])[g.s:g.e],
                        ($8::uuid[])[g.s:g.e], g.blob, NULL, g.sealed, true)
                        WITH ORDINALITY AS r
                  ORDER BY g.i, r.ordinality",
            )
            .await
            .map_err(pg_err(context))?;
        let rows = match client.query(&stmt, &args).await {
            Ok(rows) => rows,
            Err(e) if is_duplicate_txid(&e) => return Ok(None),
            Err(e) => return Err(pg_err(context)(e)),
        };
        let mut answers: Vec<Vec<PushGroupResult>> =
            requests.iter().map(|g| vec![Vec::new(); g.len()]).collect();
        let mut at = 0;
        for (n, (&(r, k), (firsts, candidates, frames))) in order.iter().zip(&firsts_of).enumerate()
        {
            let number = i64::try_from(n + 1).unwrap_or(i64::MAX);
            let end = at
                + rows[at..]
                    .iter()
                    .take_while(|row| row.try_get::<_, i64>(0).ok() == Some(number))
                    .count();
            let g = &requests[r][k];
            let Some(result) = round_group(g, &rows[at..end], firsts, candidates, frames)? else {
                return Ok(None);
            };
            answers[r][k] = result;
            at = end;
        }
        if at != rows.len() {
            return Err(StorageError::Internal(format!(
                "{context}: rows of no group"
            )));
        }
        Ok(Some(answers))
    }
}

/// A round's groups as the statements' arrays, in the partitions' global lock order (queue,
/// partition, then request order): one element per group, its candidates' transaction ids and
/// message ids in `txids`/`ids` between `starts` and `ends` (1-based, inclusive).
struct RoundArrays<'a> {
    /// (request, group) of each element.
    order: Vec<(usize, usize)>,
    queues: Vec<&'a str>,
    partitions: Vec<&'a str>,
    blobs: Vec<Vec<u8>>,
    sealed: Vec<Option<bool>>,
    starts: Vec<i32>,
    ends: Vec<i32>,
    txids: Vec<&'a str>,
    ids: Vec<uuid::Uuid>,
    /// Each element's first occurrences, its candidates and their frames.
    firsts_of: Vec<(FirstOccurrences, Vec<usize>, Vec<Frame>)>,
}

impl<'a> RoundArrays<'a> {
    fn of(requests: &'a [Vec<PushGroup>]) -> StorageResult<Self> {
        let mut order: Vec<(usize, usize)> = requests
            .iter()
            .enumerate()
            .flat_map(|(r, groups)| (0..groups.len()).map(move |g| (r, g)))
            .collect();
        order.sort_by(|a, b| {
            let (ga, gb) = (&requests[a.0][a.1], &requests[b.0][b.1]);
            (&ga.queue, &ga.partition, a).cmp(&(&gb.queue, &gb.partition, b))
        });
        let (mut queues, mut partitions, mut blobs, mut sealed) = (vec![], vec![], vec![], vec![]);
        let (mut starts, mut ends, mut txids, mut ids) = (vec![], vec![], vec![], vec![]);
        let mut firsts_of = Vec::with_capacity(order.len());
        for &(r, k) in &order {
            let g = &requests[r][k];
            let firsts = FirstOccurrences::of(&g.frames);
            let candidates: Vec<usize> = firsts.firsts().collect();
            let frames: Vec<_> = candidates.iter().map(|c| g.frames[*c].clone()).collect();
            blobs.push(
                g.segment_blob(&frames)
                    .map_err(|e| StorageError::Invalid(e.to_string()))?,
            );
            queues.push(g.queue.as_str());
            partitions.push(g.partition.as_str());
            sealed.push(Some(g.is_sealed()));
            starts.push(i32::try_from(txids.len() + 1).unwrap_or(i32::MAX));
            for c in &candidates {
                txids.push(g.frames[*c].transaction_id.as_str());
                ids.push(g.frames[*c].message_id);
            }
            ends.push(i32::try_from(txids.len()).unwrap_or(i32::MAX));
            firsts_of.push((firsts, candidates, frames));
        }
        Ok(RoundArrays {
            order,
            queues,
            partitions,
            blobs,
            sealed,
            starts,
            ends,
            txids,
            ids,
            firsts_of,
        })
    }
}

/// A group stored whole: its partition and first offset (its items take the offsets on from it,
/// in order).
struct Stored {
    partition_id: uuid::Uuid,
    first: i64,
}

impl Stored {
    /// Every item's outcome: each stored candidate queued at its offset, each repeat of a
    /// transactionId within the group answered as its first.
    fn outcomes(
        &self,
        firsts: &FirstOccurrences,
        items: usize,
        candidates: &[usize],
        frames: &[queen_core::frames::Frame],
    ) -> Option<PushGroupResult> {
        let mut outcome: Vec<Option<PushOutcome>> = vec![None; items];
        let partition_id = self.partition_id.to_string();
        for ((k, frame), offset) in candidates.iter().zip(frames).zip(self.first..) {
            outcome[*k] = Some(PushOutcome::Queued {
                message_id: frame.message_id,
                partition_id: partition_id.clone(),
                offset,
            });
        }
        firsts.resolve(outcome)
    }
}

/// One group's rows of a round (columns shifted by the group number before them): its outcomes,
/// or `None` when they are not a whole answer.
fn round_group(
    g: &PushGroup,
    rows: &[tokio_postgres::Row],
    firsts: &FirstOccurrences,
    candidates: &[usize],
    frames: &[queen_core::frames::Frame],
) -> StorageResult<Option<PushGroupResult>> {
    let mut outcome: Vec<Option<PushOutcome>> = vec![None; g.frames.len()];
    let bad = |what: &str| StorageError::Internal(format!("push round: {what}"));
    if let [row] = rows {
        let status: &str = row.try_get(1).map_err(|_| bad("status"))?;
        let count: Option<i64> = row.try_get(6).map_err(|_| bad("count"))?;
        if status == "queued" && count.is_some() {
            if count != Some(candidates.len() as i64) {
                return Err(bad("a group stored in part"));
            }
            let stored = Stored {
                partition_id: row.try_get(3).map_err(|_| bad("partition id"))?,
                first: row.try_get(4).map_err(|_| bad("offset"))?,
            };
            return Ok(stored.outcomes(firsts, g.frames.len(), candidates, frames));
        }
    }
    if rows.len() != candidates.len() {
        return Ok(None);
    }
    for (k, row) in candidates.iter().zip(rows) {
        let status: &str = row.try_get(1).map_err(|_| bad("status"))?;
        let message_id: uuid::Uuid = row.try_get(2).map_err(|_| bad("message id"))?;
        let partition_id = row
            .try_get::<_, uuid::Uuid>(3)
            .map_err(|_| bad("partition id"))?
            .to_string();
        outcome[*k] = match status {
            "full" => Some(PushOutcome::Rejected {
                message_id,
                partition_id,
                full: QueueFull {
                    queue: g.queue.clone(),
                    max_size: u32::try_from(row.try_get::<_, i32>(5).unwrap_or(0)).unwrap_or(0),
                    backlog: u64::try_from(row.try_get::<_, i64>(6).unwrap_or(0)).unwrap_or(0),
                },
            }),
            // Anything else (a duplicate answered, a retry) is a group to push alone.
            _ => return Ok(None),
        };
    }
    Ok(firsts.resolve(outcome))
}

/// One round's rows, an outcome per candidate (in order); the candidates to retry.
fn row_outcomes(
    g: &PushGroup,
    rows: &[tokio_postgres::Row],
    candidates: &[usize],
    outcome: &mut [Option<PushOutcome>],
) -> Result<Vec<usize>, PushFailure> {
    let mut retry = vec![];
    for (k, row) in candidates.iter().zip(rows.iter()) {
        let message_id: uuid::Uuid = row.get(1);
        let partition_id = row.get::<_, uuid::Uuid>(2).to_string();
        outcome[*k] = match row.get::<_, &str>(0) {
            "queued" => Some(PushOutcome::Queued {
                message_id,
                partition_id,
                offset: row.get(3),
            }),
            "duplicate" => Some(PushOutcome::Duplicate {
                message_id,
                partition_id,
            }),
            "full" => Some(PushOutcome::Rejected {
                message_id,
                partition_id,
                full: QueueFull {
                    queue: g.queue.clone(),
                    max_size: u32::try_from(row.get::<_, i32>(4)).unwrap_or(0),
                    backlog: u64::try_from(row.get::<_, i64>(5)).unwrap_or(0),
                },
            }),
            "retry" => {
                retry.push(*k);
                None
            }
            other => {
                return Err(PushFailure::Storage(StorageError::Internal(format!(
                    "push_v6 answered the unknown status {other:?}"
                ))))
            }
        };
    }
    if !retry.is_empty() && retry.len() == candidates.len() {
        return Err(PushFailure::Storage(StorageError::Internal(
            "push_v6 asked to retry every item of a push".into(),
        )));
    }
    Ok(retry)
}

/// Runs ack_v3 on a client or a transaction.
pub(crate) async fn ack_items(
    client: &impl deadpool_postgres::GenericClient,
    group: &str,
    items: &[AckItem],
) -> StorageResult<Vec<AckOutcome>> {
    let stmt = client
        .prepare_cached("SELECT o_success, o_error, o_queue, o_partition, o_lease_released, o_dlq, o_noop FROM queen.ack_v3($1, $2, $3, $4, $5, $6, $7)")
        .await
        .map_err(pg_err("ack"))?;
    // A partition is named by its id or its number; anything else is neither (not found).
    let (ids, numbers): (Vec<Option<uuid::Uuid>>, Vec<Option<i64>>) = items
        .iter()
        .map(|i| {
            let r = i.partition_id.as_str();
            let id = (r.len() == 36)
                .then(|| uuid::Uuid::try_parse(r).ok())
                .flatten();
            let number = partition_number(r).and_then(|n| i64::try_from(n).ok());
            (id, number)
        })
        .unzip();
    let txids: Vec<&str> = items.iter().map(|i| i.transaction_id.as_str()).collect();
    let statuses: Vec<&str> = items.iter().map(|i| status_text(i.status)).collect();
    let leases: Vec<Option<&str>> = items.iter().map(|i| i.lease_id.as_deref()).collect();
    let errors: Vec<Option<&str>> = items.iter().map(|i| i.error.as_deref()).collect();
    let rows = client
        .query(
            &stmt,
            &[&group, &ids, &numbers, &txids, &statuses, &leases, &errors],
        )
        .await
        .map_err(pg_err("ack"))?;
    Ok(rows
        .iter()
        .map(|r| AckOutcome {
            success: r.get(0),
            error: r.get(1),
            queue: r.get(2),
            partition: r.get(3),
            lease_released: r.get(4),
            dlq: r.get(5),
            noop: r.get(6),
        })
        .collect())
}

#[async_trait]
impl MessageStorage for PgStorage {
    async fn push_round(
        &self,
        requests: Vec<Vec<PushGroup>>,
    ) -> Vec<StorageResult<Vec<PushGroupResult>>> {
        if requests.len() > 1 {
            // Otherwise not a whole answer (a duplicate met, a queue that must encrypt, a
            // failure): each request alone, as it came.
            if let Ok(Some(answers)) = self.push_round_statement(&requests).await {
                return answers.into_iter().map(Ok).collect();
            }
        }
        let mut answers = Vec::with_capacity(requests.len());
        for groups in requests {
            answers.push(self.push(groups).await);
        }
        answers
    }

    async fn push_accepted_at(
        &self,
        groups: Vec<PushGroup>,
        accepted_at: Option<Timestamp>,
    ) -> StorageResult<Vec<PushGroupResult>> {
        let (this, groups) = (self, &groups);
        let accepted_at = accepted_at.map(to_system_time);
        retry_contention(move || async move {
            let mut client = this.pool.get().await.map_err(pool_err)?;
            let mut dedup = Dedup::ExpectNew;
            loop {
                let attempt = if groups.len() == 1 {
                    push_groups(&client, groups, accepted_at, SealCheck::Enforce, dedup).await
                } else {
                    let tx = client.transaction().await.map_err(pg_err("push: begin"))?;
                    match push_groups(&tx, groups, accepted_at, SealCheck::Enforce, dedup).await {
                        Ok(results) => {
                            tx.commit().await.map_err(pg_err("push: commit"))?;
                            Ok(results)
                        }
                        // Dropping the transaction rolls it back.
                        Err(e) => Err(e),
                    }
                };
                match attempt {
                    Ok(results) => return Ok(results),
                    Err(PushFailure::DuplicateMet) if dedup == Dedup::ExpectNew => {
                        dedup = Dedup::Answer;
                    }
                    Err(e) => return Err(e.into_storage()),
                }
            }
        })
        .await
    }

    async fn ack(&self, group: &str, items: Vec<AckItem>) -> StorageResult<Vec<AckOutcome>> {
        let (this, items) = (self, &items);
        retry_contention(move || async move {
            let client = this.pool.get().await.map_err(pool_err)?;
            ack_items(&client, group, items).await
        })
        .await
    }

    async fn ack_batch_ends_many(
        &self,
        leases: &[LeaseBatchEnds],
    ) -> StorageResult<Vec<Vec<String>>> {
        // One array entry per batch; `at` maps a batch's 1-based position back to its lease. A
        // batch whose partition id is not an id cannot be under a lease: nothing to commit.
        let mut at: Vec<(usize, &str)> = vec![];
        let (mut groups, mut lease_ids, mut ids, mut ends, mut firsts) =
            (vec![], vec![], vec![], vec![], vec![]);
        for (k, l) in leases.iter().enumerate() {
            for b in &l.batches {
                let Ok(id) = uuid::Uuid::try_parse(&b.partition_id) else {
                    continue;
                };
                at.push((k, b.partition_id.as_str()));
                groups.push(l.group.as_str());
                lease_ids.push(l.lease.0);
                ids.push(id);
                ends.push(b.end_offset);
                firsts.push(b.first_transaction_id.as_str());
            }
        }
        let (this, groups, lease_ids, ids, ends, firsts) =
            (self, &groups, &lease_ids, &ids, &ends, &firsts);
        let rows = retry_contention(move || async move {
            let client = this.pool.get().await.map_err(pool_err)?;
            let stmt = client
                .prepare_cached("SELECT queen.ack_batch_ends_v2($1, $2, $3, $4, $5)")
                .await
                .map_err(pg_err("ack whole batches"))?;
            client
                .query(&stmt, &[groups, lease_ids, ids, ends, firsts])
                .await
                .map_err(pg_err("ack whole batches"))
        })
        .await?;
        let mut committed = vec![vec![]; leases.len()];
        for r in &rows {
            let position: i32 = r.get(0);
            let (k, partition) = usize::try_from(position)
                .ok()
                .and_then(|p| at.get(p.checked_sub(1)?))
                .ok_or_else(|| {
                    StorageError::Internal(format!(
                        "ack_batch_ends_v2 answered position {position} of {} batches",
                        at.len()
                    ))
                })?;
            committed[*k].push(partition.to_string());
        }
        Ok(committed)
    }

    async fn renew_lease(&self, lease_id: &str, seconds: u32) -> StorageResult<RenewOutcome> {
        let client = self.pool.get().await.map_err(pool_err)?;
        let row = client
            .query_one(
                "SELECT o_renewed, o_expires FROM queen.renew_lease_v1($1, $2)",
                &[&lease_id, &int(seconds)],
            )
            .await
            .map_err(pg_err("renew lease"))?;
        let renewed: i32 = row.get(0);
        let expires: Option<SystemTime> = row.get(1);
        Ok(RenewOutcome {
            renewed: u32::try_from(renewed).unwrap_or(0),
            expires_at: expires.map(from_system_time),
        })
    }
}
