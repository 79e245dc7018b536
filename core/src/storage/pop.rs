//! A pop's request and answer: claims with their raw segment rows, and a verdict per candidate.
use crate::claim::SubscriptionIntent;
use crate::types::{Offset, Timestamp, WorkerId};

/// Parameters every pop shape shares.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PopRequest {
    pub queue: String,
    pub group: String,
    pub worker: WorkerId,
    /// Global message cap across partitions.
    pub batch: u32,
    /// How many partitions one call may claim.
    pub max_partitions: u32,
    pub auto_ack: bool,
    pub lease_seconds: Option<u32>,
    pub intent: SubscriptionIntent,
    /// Storage skips the windowBuffer debounce (for a caller that owns the hold itself). The
    /// broker passes false: the debounce's verdict carries the exact end of the hold.
    pub skip_window_debounce: bool,
    /// The pop asked for conflation (last-value delivery): a group it registers is stored
    /// conflating. What is applied is always the stored policy (`claim::policy_step`).
    pub conflation: bool,
}

/// A raw segment row of a pop answer: frames [start_idx, start_idx + take) of `blob`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentRow {
    pub base_offset: Offset,
    pub start_idx: u32,
    pub take: u32,
    pub msg_count: u32,
    pub created_at: Timestamp,
    pub blob: std::sync::Arc<Vec<u8>>,
}

/// One partition claimed by a pop.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Claim {
    pub queue: String,
    pub partition: String,
    /// Never empty: resolved after the claim, inside the same function (see log_pop_specific_v2).
    pub partition_id: String,
    pub first_offset: Offset,
    pub last_offset: Offset,
    pub attempt_count: u32,
    /// `None` for autoAck.
    pub lease_expires_at: Option<Timestamp>,
    pub rows: Vec<SegmentRow>,
}

impl Claim {
    pub fn message_count(&self) -> u32 {
        self.rows.iter().map(|r| r.take).sum()
    }
}

/// The per-candidate verdict a pop checks back into the hot-list ring.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Delivered `count` messages; `leased_until` is the new lease (None for autoAck).
    /// `drained`: the batch ended where the partition's segments visible to the pop end, so
    /// nothing is left for the group unless a push lands (and reports itself) after it.
    Took {
        count: u32,
        leased_until: Option<Timestamp>,
        drained: bool,
    },
    /// Nothing deliverable for this group.
    Empty,
    /// Another consumer holds a live lease until then.
    LeasedUntil(Timestamp),
    /// A concurrent pop holds the row, or another pop is creating it: skip for one cycle.
    Busy,
    /// windowBuffer or delayedProcessing defers delivery until then.
    DeferredUntil(Timestamp),
    /// The partition does not exist.
    Missing,
    /// The budget (batch or partitions) was spent before this candidate was tried.
    NotEvaluated,
}

impl Verdict {
    /// The first instant the partition may be deliverable again, for a revisit: a lease holds
    /// while `lease_expires_at >= now` (storage's claim tests `<`), so it ends just after its
    /// expiry; a deferral ends at its instant; a busy row is tried again shortly. `None`: no
    /// revisit (taken, empty, missing, or not evaluated).
    pub fn revisit_at(&self, now: Timestamp) -> Option<Timestamp> {
        match self {
            Verdict::LeasedUntil(t) => Some(t.just_after()),
            Verdict::DeferredUntil(t) => Some(*t),
            Verdict::Busy => Some(now.plus_millis(crate::ring::BUSY_REVISIT_MS)),
            Verdict::Took { .. } | Verdict::Empty | Verdict::Missing | Verdict::NotEvaluated => {
                None
            }
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct PopResult {
    pub claims: Vec<Claim>,
    /// (partition name, verdict) for every candidate considered.
    pub verdicts: Vec<(String, Verdict)>,
    /// The group's stored conflation policy as the pop read it (`None`: not registered).
    pub stored_conflation: Option<bool>,
}

impl PopResult {
    pub fn message_count(&self) -> u32 {
        self.claims.iter().map(Claim::message_count).sum()
    }
}
