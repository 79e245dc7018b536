//! Decoding the rows of the pop procedures into claims and verdicts.
//!
//! A first row of kind `policy` carries the group's stored conflation policy (none for an
//! unregistered group). Each candidate yields zero or more `row` rows (segment slices) followed
//! by one summary row whose kind is the verdict: took | took_all | empty | leased | busy |
//! deferred | missing | not_evaluated (took_all: took, and the batch drained the partition).

use std::sync::Arc;
use std::time::SystemTime;

use queen_core::storage::{Claim, PopResult, SegmentRow, StorageError, StorageResult, Verdict};
use tokio_postgres::Row;

use crate::from_system_time;

fn bad(context: &str, what: &str) -> StorageError {
    StorageError::Internal(format!("{context}: malformed answer: {what}"))
}

/// The rows of one pop, its columns starting at column `at` (a statement of several pops puts
/// the pop's number before them).
pub fn decode(rows: &[Row], at: usize, context: &str) -> StorageResult<PopResult> {
    let mut result = PopResult::default();
    let mut slices: Vec<SegmentRow> = vec![];
    for r in rows {
        let kind: String = r.try_get(at + 2).map_err(|_| bad(context, "kind"))?;
        if kind == "policy" {
            // The group's stored conflation policy, before any candidate (log_pop_loop_v2).
            let conflating: i32 = r.try_get(at + 6).map_err(|_| bad(context, "policy"))?;
            result.stored_conflation = Some(conflating == 1);
            continue;
        }
        let partition: String = r.try_get(at).map_err(|_| bad(context, "partition"))?;
        let partition_id: Option<uuid::Uuid> = r
            .try_get(at + 1)
            .map_err(|_| bad(context, "partition id"))?;
        let until: Option<SystemTime> = r.try_get(at + 3).map_err(|_| bad(context, "until"))?;
        let until = until.map(from_system_time);
        let verdict = match kind.as_str() {
            "row" => {
                let u = |v: i32| u32::try_from(v).unwrap_or(0);
                let created: SystemTime =
                    r.try_get(at + 12).map_err(|_| bad(context, "created_at"))?;
                slices.push(SegmentRow {
                    base_offset: r.try_get(at + 8).map_err(|_| bad(context, "base offset"))?,
                    start_idx: u(r.try_get(at + 9).map_err(|_| bad(context, "start"))?),
                    take: u(r.try_get(at + 10).map_err(|_| bad(context, "take"))?),
                    msg_count: u(r.try_get(at + 11).map_err(|_| bad(context, "count"))?),
                    created_at: from_system_time(created),
                    blob: Arc::new(
                        r.try_get::<_, Vec<u8>>(at + 13)
                            .map_err(|_| bad(context, "blob"))?,
                    ),
                });
                continue;
            }
            kind @ ("took" | "took_all") => {
                let first: i64 = r.try_get(at + 4).map_err(|_| bad(context, "first"))?;
                let last: i64 = r.try_get(at + 5).map_err(|_| bad(context, "last"))?;
                let attempt: i32 = r.try_get(at + 6).map_err(|_| bad(context, "attempt"))?;
                let lease: Option<SystemTime> =
                    r.try_get(at + 7).map_err(|_| bad(context, "lease"))?;
                let lease = lease.map(from_system_time);
                let rows = std::mem::take(&mut slices);
                let count: u32 = rows.iter().map(|s| s.take).sum();
                if i64::from(count) != last - first + 1 {
                    return Err(bad(context, "slices do not cover the claimed span"));
                }
                let partition_id = partition_id.map(|p| p.to_string()).unwrap_or_default();
                result.claims.push(Claim {
                    queue: String::new(),
                    partition: partition.clone(),
                    partition_id,
                    first_offset: first,
                    last_offset: last,
                    attempt_count: u32::try_from(attempt).unwrap_or(0),
                    lease_expires_at: lease,
                    rows,
                });
                Verdict::Took {
                    count,
                    leased_until: lease,
                    drained: kind == "took_all",
                }
            }
            "empty" => Verdict::Empty,
            "leased" => {
                Verdict::LeasedUntil(until.ok_or_else(|| bad(context, "leased without expiry"))?)
            }
            "busy" => Verdict::Busy,
            "deferred" => {
                Verdict::DeferredUntil(until.ok_or_else(|| bad(context, "deferred without time"))?)
            }
            "missing" => Verdict::Missing,
            "not_evaluated" => Verdict::NotEvaluated,
            other => return Err(bad(context, &format!("unknown kind {other:?}"))),
        };
        if !slices.is_empty() {
            return Err(bad(context, "segment rows without a claim"));
        }
        result.verdicts.push((partition, verdict));
    }
    if !slices.is_empty() {
        return Err(bad(context, "trailing segment rows"));
    }
    Ok(result)
}
