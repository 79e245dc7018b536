//! `log_pop_v2`'s three callers: the ring's candidates in one transaction (`log_pop_loop_v2`),
//! a named partition (`log_pop_specific_v2`), and the wildcard scan.

use std::sync::Arc;

use queen_core::claim::{policy_step, PolicyStep};
use queen_core::storage::{PopRequest, PopResult, StorageError, Verdict};
use queen_core::Timestamp;

use crate::state::{advisory_key, DbState, MetaRow};
use crate::table::Insert;
use crate::tx::{in_tx, lock, Shared, StmtError, TaskCell, Tx, TxHandle};

use super::scan::{advance_watermark, candidate_scan, first_contact};
use super::{load_gates, log_pop_v2, resolve_pid, QueueGates, FIRST_CONTACT_SEED};

/// Runs `log_pop_v2` over named candidates while budgets last (shared by list and wildcard).
async fn pop_candidates(
    shared: &Arc<Shared>,
    tx: &TxHandle,
    req: &PopRequest,
    gates: &QueueGates,
    candidates: Vec<(String, Option<String>)>,
    stored: Option<Option<bool>>,
) -> Result<PopResult, StorageError> {
    let mut result = PopResult::default();
    let Some(conflate) = stored.map(|s| s.unwrap_or(false)) else {
        // Another pop is registering the group: its policy is not known yet, so nothing is
        // claimed this time (a conflating group must never get a plain batch, nor a plain group
        // a conflated one).
        result.verdicts = candidates
            .into_iter()
            .map(|(name, _)| (name, Verdict::Busy))
            .collect();
        return Ok(result);
    };
    result.stored_conflation = stored.flatten();
    let mut budget = req.batch;
    for (name, pid) in candidates {
        if budget == 0 || result.claims.len() as u32 >= req.max_partitions.max(1) {
            result.verdicts.push((name, Verdict::NotEvaluated));
            continue;
        }
        let pid = match pid {
            Some(p) => Some(p),
            None => {
                tx.stmt("resolve partition", |st, t| {
                    Ok(resolve_pid(st, &req.queue, &name, t.id))
                })
                .await?
            }
        };
        let Some(pid) = pid else {
            result.verdicts.push((name, Verdict::Missing));
            continue;
        };
        let (claim, verdict) =
            log_pop_v2(shared, tx, req, gates, &name, &pid, budget, conflate).await?;
        if let Some(c) = claim {
            budget = budget.saturating_sub(c.message_count());
            result.claims.push(c);
        }
        result.verdicts.push((name, verdict));
    }
    Ok(result)
}

/// The loop's first statement: the group's stored conflation policy, registering the group as
/// conflating when the pop asks for it and the group is not registered yet. `Some(stored)` to go
/// on (`stored` is `None` for an unregistered group, which does not conflate); `None` when the
/// registration's try-lock is held by another pop (which is registering the group right now).
fn group_policy(
    st: &mut DbState,
    t: &Tx,
    req: &PopRequest,
    now: Timestamp,
) -> Result<Option<Option<bool>>, StmtError> {
    let mkey = (req.queue.clone(), req.group.clone());
    let stored = st.metadata.get(&mkey, t.id).map(|m| m.conflation);
    match policy_step(&req.group, stored, req.conflation) {
        PolicyStep::Stored(conflating) => Ok(Some(Some(conflating))),
        PolicyStep::Unregistered => Ok(Some(None)),
        PolicyStep::Register => {
            if !st.try_advisory(
                advisory_key(&req.queue, &req.group, FIRST_CONTACT_SEED),
                t.id,
            ) {
                return Ok(None);
            }
            let row = MetaRow {
                subscription_timestamp: queen_core::claim::registration_timestamp(req.intent, now),
                created_at: now,
                conflation: true,
            };
            match st.metadata.insert(mkey.clone(), row, t.id) {
                Insert::Inserted => Ok(Some(Some(true))),
                // ON CONFLICT DO NOTHING, then the stored row is read again.
                Insert::Exists => Ok(Some(st.metadata.get(&mkey, t.id).map(|m| m.conflation))),
                // A group deletion in flight: the insert waits for it, as PostgreSQL's does.
                Insert::WaitFor(holder) => Err(StmtError::Blocked(holder)),
            }
        }
    }
}

/// The queue's gates and, when the queue exists, the group's policy (see `group_policy`).
#[allow(clippy::type_complexity)]
fn queue_and_policy(
    st: &mut DbState,
    t: &Tx,
    req: &PopRequest,
    now: Timestamp,
) -> Result<(Option<QueueGates>, Option<Option<bool>>), StmtError> {
    let gates = load_gates(st, &req.queue, t.id);
    let stored = if gates.is_some() {
        group_policy(st, t, req, now)?
    } else {
        Some(None)
    };
    Ok((gates, stored))
}

/// Candidate names from the broker's ring, one transaction (PostgreSQL: `log_pop_loop_v2`).
pub(crate) async fn pop_list(
    shared: Arc<Shared>,
    cell: Arc<TaskCell>,
    req: PopRequest,
    candidates: Vec<String>,
) -> Result<PopResult, StorageError> {
    in_tx(&shared, "log_pop_loop_v2", cell, |tx| {
        let shared = shared.clone();
        async move {
            // The queue's row and the group's policy (the loop's first statements).
            let now = tx.now();
            let (gates, stored) = tx
                .stmt("queue config", |st, t| queue_and_policy(st, t, &req, now))
                .await?;
            let Some(gates) = gates else {
                return Ok(PopResult {
                    claims: vec![],
                    verdicts: candidates
                        .into_iter()
                        .map(|c| (c, Verdict::Missing))
                        .collect(),
                    stored_conflation: None,
                });
            };
            pop_candidates(
                &shared,
                &tx,
                &req,
                &gates,
                candidates.into_iter().map(|c| (c, None)).collect(),
                stored,
            )
            .await
        }
    })
    .await
}

/// `log_pop_specific_v2`: one named partition. The partitionId in the answer is resolved after
/// the claim, inside the function, so its snapshot is at least as new as the claim's.
pub(crate) async fn pop_partition(
    shared: Arc<Shared>,
    cell: Arc<TaskCell>,
    req: PopRequest,
    partition: String,
) -> Result<PopResult, StorageError> {
    in_tx(&shared, "log_pop_specific_v2", cell, |tx| {
        let shared = shared.clone();
        async move {
            // The historical shape resolved the reported partitionId in the outer statement,
            // under a snapshot taken before the claim ran.
            let outer_pid = tx
                .stmt("outer snapshot", |st, t| {
                    Ok(resolve_pid(st, &req.queue, &partition, t.id))
                })
                .await?;
            let now = tx.now();
            let (gates, stored) = tx
                .stmt("queue config", |st, t| queue_and_policy(st, t, &req, now))
                .await?;
            let Some(gates) = gates else {
                return Ok(PopResult {
                    claims: vec![],
                    verdicts: vec![(partition, Verdict::Missing)],
                    stored_conflation: None,
                });
            };
            let mut result = pop_candidates(
                &shared,
                &tx,
                &req,
                &gates,
                vec![(partition.clone(), None)],
                stored,
            )
            .await?;
            if !result.claims.is_empty() {
                if outer_pid.is_none() {
                    lock(&shared.events).creation_races += 1;
                }
                let reported = if shared.bugs.partition_id_outside_function {
                    outer_pid.unwrap_or_default()
                } else {
                    tx.stmt("resolve partitionId", |st, t| {
                        Ok(resolve_pid(st, &req.queue, &partition, t.id).unwrap_or_default())
                    })
                    .await?
                };
                for c in &mut result.claims {
                    c.partition_id = reported.clone();
                }
                if reported.is_empty() {
                    lock(&shared.events).empty_partition_ids += 1;
                }
            }
            Ok(result)
        }
    })
    .await
}

/// The wildcard scan (QUEEN_HOTLIST=0, and every first contact of a (queue, group)).
pub(crate) async fn pop_wildcard(
    shared: Arc<Shared>,
    cell: Arc<TaskCell>,
    req: PopRequest,
) -> Result<PopResult, StorageError> {
    in_tx(&shared, "log_pop_wildcard_v2", cell, |tx| {
        let shared = shared.clone();
        async move {
            let now = tx.now();
            let Some(gates) = tx
                .stmt("queue config", |st, t| Ok(load_gates(st, &req.queue, t.id)))
                .await?
            else {
                return Ok(PopResult::default());
            };
            let mkey = (req.queue.clone(), req.group.clone());
            let stored = tx
                .stmt("first contact", |st, t| {
                    first_contact(st, t, &req, &mkey, now)?;
                    group_policy(st, t, &req, now)
                })
                .await?;
            let need_a_cursor = shared.bugs.pending_scans_need_a_cursor;
            let candidates = tx
                .stmt("candidate scan", |st, t| {
                    candidate_scan(st, t, &req, &mkey, now, need_a_cursor)
                })
                .await?;
            let result = pop_candidates(&shared, &tx, &req, &gates, candidates, stored).await?;
            if result.claims.is_empty() {
                tx.stmt("watermark", |st, t| {
                    advance_watermark(st, t, &req, &mkey, now)
                })
                .await?;
            }
            Ok(result)
        }
    })
    .await
}
