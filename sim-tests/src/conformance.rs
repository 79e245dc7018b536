//! Conformance cases: written once against the storage traits, run on every backend (the
//! in-memory model in tests/conformance_sim.rs, PostgreSQL in tests/conformance_pg.rs), so the model is held to the truth.
//!
//! Each case gets a fresh backend and a clock it may advance. A case returns `Err(description)`
//! on the first divergence, so a runner can report which backend failed which rule.

use std::sync::Arc;

use async_trait::async_trait;
use queen_core::storage::{AckItem, AckStatus, PushOutcome, QueueConfig, Storage, Verdict};

use crate::fixtures::{group, Ids};

/// A backend under test: its storage plus control of the clock storage reads.
#[async_trait]
pub trait Backend: Send + Sync {
    fn storage(&self) -> Arc<dyn Storage>;
    /// Moves storage's now() forward.
    async fn advance_secs(&self, secs: i64);
    /// Retention: removes a partition's segments below `before`.
    async fn drop_segments(&self, queue: &str, partition: &str, before: i64);
    /// (offset, transactionId) of a queue's dead letters, in filing order.
    async fn filed_dead_letters(&self, queue: &str) -> Vec<(i64, String)>;
}

pub type CaseResult = Result<(), String>;

macro_rules! ensure {
    ($cond:expr, $($fmt:tt)*) => {
        if !$cond {
            return Err(format!("{}:{}: {}", file!(), line!(), format!($($fmt)*)));
        }
    };
}

macro_rules! ensure_eq {
    ($a:expr, $b:expr, $($fmt:tt)*) => {{
        let (a, b) = (&$a, &$b);
        if a != b {
            return Err(format!("{}:{}: {}: {:?} != {:?}", file!(), line!(), format!($($fmt)*), a, b));
        }
    }};
}

mod acks;
mod admin_reads;
mod claims;
mod conflation;
mod dead_letters;
mod ephemeral;
mod kv;
mod options;
mod queues;
mod reads;
mod retention;
mod rounds;
mod scans;
mod seeding;
mod streams;
pub use acks::*;
pub use admin_reads::*;
pub use claims::*;
pub use conflation::*;
pub use dead_letters::*;
pub use ephemeral::*;
pub use kv::*;
pub use options::*;
pub use queues::*;
pub use reads::*;
pub use retention::*;
pub use rounds::*;
pub use scans::*;
pub use seeding::*;
pub use streams::*;

/// Whether the group has any backlog in the queue, claimable or leased.
async fn backlog(s: &dyn Storage, queue: &str, group: &str) -> Result<bool, String> {
    Ok(s.next_pending(&[queue.to_string()], group)
        .await
        .map_err(e)?
        .is_some())
}

fn e(err: impl std::fmt::Display) -> String {
    err.to_string()
}

fn verdict_of(r: &queen_core::storage::PopResult, p: &str) -> Option<Verdict> {
    r.verdicts.iter().find(|(n, _)| n == p).map(|(_, v)| *v)
}

async fn push(
    s: &dyn Storage,
    ids: &mut Ids,
    q: &str,
    p: &str,
    prefix: &str,
    range: std::ops::Range<u32>,
) -> Result<Vec<PushOutcome>, String> {
    let mut r = s
        .push(vec![group(ids, q, p, prefix, range)])
        .await
        .map_err(e)?;
    r.pop().ok_or_else(|| "push returned no group".to_string())
}

async fn configure(s: &dyn Storage, config: QueueConfig) -> CaseResult {
    s.configure_queue(config).await.map(|_| ()).map_err(e)
}

fn ack(tx: &str, pid: &str, status: AckStatus, lease: Option<String>) -> AckItem {
    AckItem {
        transaction_id: tx.into(),
        partition_id: pid.into(),
        status,
        lease_id: lease,
        error: None,
    }
}

type CaseFn =
    for<'a> fn(
        &'a dyn Backend,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = CaseResult> + Send + 'a>>;

macro_rules! cases {
    ($($name:ident),* $(,)?) => {
        /// Every conformance case, by name.
        pub fn all() -> Vec<(&'static str, CaseFn)> {
            vec![$((stringify!($name), |b| Box::pin($name(b))),)*]
        }
    };
}

cases!(
    leased_pop_delivers_in_order,
    lease_length_coalesces,
    auto_ack_commits,
    expiry_redelivers_and_counts_attempts,
    positional_ack_and_fencing,
    dedup_by_partition_and_transaction_id,
    subscription_seeding,
    durable_subscription_covers_later_partitions,
    visibility_gates,
    seal_guards,
    budgets,
    lease_renewal,
    failed_acks_retry_then_dead_letter,
    a_nack_bounds_its_call_in_any_order,
    discovery,
    pending_and_delete,
    configure_round_trip,
    transactions_are_atomic_and_idempotent,
    the_cursor_never_rewinds,
    dead_letter_listing,
    seek_and_group_deletion,
    wildcard_windows,
    drained_batches,
    windowing_boundaries,
    dead_letter_flags_are_enforced,
    max_size_caps_the_backlog,
    ttl_expires_messages,
    retention_gap_starts_at_the_first_segment,
    next_pending_reports_when_leases_end,
    an_accepted_push_keeps_its_time,
    completed_retention_waits_for_every_group,
    a_group_without_a_cursor_row_holds_back,
    pending_retention_removes_unconsumed,
    eviction_removes_what_waited_too_long,
    dead_letters_pin_their_messages,
    retention_batches_continue_from_the_mark,
    inactive_partitions_are_deleted,
    the_maintenance_lease_admits_one_holder,
    old_dead_letters_are_removed,
    kv_versions_rise_and_preconditions_hold,
    kv_expiry_is_absence,
    kv_prefix_pages_and_get_many,
    kv_required_rolls_back,
    locks_fence_their_holders,
    timers_fire_once_never_early,
    fetch_reads_by_offset,
    partitions_changed_since,
    stream_queries_register_by_hash,
    stream_state_reads_select,
    stream_cycles_commit_all_or_nothing_on_the_lease,
    stream_cycles_end_the_lease_they_own,
    stream_cycles_are_fenced_on_the_state_they_close,
    a_flush_deletes_a_window_only_as_its_ripe_read_saw_it,
    conflation_delivers_the_newest_only,
    conflation_is_fixed_at_registration,
    conflation_respects_visibility,
    push_rounds_answer_each_request,
    push_rounds_answer_duplicates_as_alone,
    push_rounds_to_existing_partitions_chain_offsets,
    ephemeral_declarations_round_trip,
    ephemeral_owners_claim_and_move,
    ephemeral_takeover_waits_for_an_unbroken_liveness,
    partition_views_page_and_by_id,
    messages_created_per_interval,
    stored_totals_keep_the_later_pass,
);
