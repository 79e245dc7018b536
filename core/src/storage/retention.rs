//! Retention and eviction: what storage may remove, and the worker's batches.
//!
//! The rules, one place (the model follows them literally; `retention_batch_v1.sql` is the same
//! rule in SQL, and the conformance suite holds the two equal). A segment is removed whole:
//! - **expired** (`retentionSeconds`, when retention is enabled, or `maxWaitTimeSeconds`): created
//!   before the cutoff, consumed or not. A dead letter pointing into it goes with it;
//! - **completed** (`completedRetentionSeconds`, when retention is enabled): created before the
//!   cutoff, and consumed by every group that reads the partition: every cursor row on it, and
//!   every group with a subscription record on the queue and a cursor row on some partition of
//!   it but not on this one yet (it will start at its subscription timestamp, so it holds back
//!   what was created from then on; everything when it has none). A record without any cursor
//!   row on the queue is a deleted group's (its cursors were deleted, its record kept): it holds
//!   nothing back, or one deleted group would pin the queue forever. A segment holding a
//!   dead-lettered message stays while its dead letter does (a requeue needs the payload).
//!
//! A removed message's transactionId is forgotten with it: pushing it again stores a new
//! message. What retention removed below a cursor is a gap the pop steps over (seed step 5); a
//! partition left with no segment is sealed by the next pop (the empty-partition seal).

use super::queue::QueueConfig;
use crate::types::{Offset, Timestamp};

/// Why a segment may be removed now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Removal {
    /// Older than the queue's retentionSeconds or maxWaitTimeSeconds.
    Expired,
    /// Consumed by every group that reads the partition, and older than completedRetentionSeconds.
    Completed,
}

/// Which of a queue's removal rules a pass applies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RetentionPass {
    /// retentionSeconds, completedRetentionSeconds and maxWaitTimeSeconds.
    Retention,
    /// maxWaitTimeSeconds only (the eviction interval).
    Eviction,
}

/// A queue's removal cutoffs at one instant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cutoffs {
    /// Segments created before this are removed whatever was consumed.
    pub expire_before: Option<Timestamp>,
    /// Segments created before this are removed once every group consumed them.
    pub completed_before: Option<Timestamp>,
}

impl Cutoffs {
    pub fn of(config: &QueueConfig, pass: RetentionPass, now: Timestamp) -> Cutoffs {
        let retention = pass == RetentionPass::Retention && config.retention_enabled;
        let before = |secs: u32| (secs > 0).then(|| now.minus_secs(i64::from(secs)));
        let pending = before(config.retention_seconds).filter(|_| retention);
        let evict = before(config.max_wait_time_seconds);
        Cutoffs {
            expire_before: pending.max(evict),
            completed_before: before(config.completed_retention_seconds).filter(|_| retention),
        }
    }

    /// Whether the pass can remove anything from this queue.
    pub fn any(&self) -> bool {
        self.expire_before.is_some() || self.completed_before.is_some()
    }

    /// Partitions whose oldest segment is older than this are the candidates.
    pub fn scan_before(&self) -> Option<Timestamp> {
        self.expire_before.max(self.completed_before)
    }
}

/// What holds a partition's segments back from completed retention.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConsumedFloor {
    /// Every message at or below this offset is consumed by every cursor row (-1: none).
    pub committed: Offset,
    /// A group without a cursor row here holds back what was created at or after this
    /// (`Some(None)`: everything).
    pub held_from: Option<Option<Timestamp>>,
}

impl ConsumedFloor {
    /// The floor of a partition: the smallest committed offset of its cursor rows (`None`: no
    /// rows, nothing consumed), and the subscription timestamps of the groups with a record on
    /// the queue and no row here (`None` for a group that reads everything).
    pub fn of(
        min_committed: Option<Offset>,
        groups_without_row: impl IntoIterator<Item = Option<Timestamp>>,
    ) -> ConsumedFloor {
        let mut held_from: Option<Option<Timestamp>> = None;
        for ts in groups_without_row {
            held_from = Some(match (held_from, ts) {
                (Some(None), _) | (_, None) => None,
                (Some(Some(a)), Some(b)) => Some(a.min(b)),
                (None, Some(b)) => Some(b),
            });
        }
        ConsumedFloor {
            committed: min_committed.unwrap_or(-1),
            held_from,
        }
    }
}

/// The one removal rule: whether the segment [.., `end_offset`] created at `created_at` may be
/// removed, and why. `dead_lettered`: a dead letter points into it.
pub fn removal(
    cutoffs: &Cutoffs,
    floor: &ConsumedFloor,
    created_at: Timestamp,
    end_offset: Offset,
    dead_lettered: bool,
) -> Option<Removal> {
    if cutoffs.expire_before.is_some_and(|c| created_at < c) {
        return Some(Removal::Expired);
    }
    let old_enough = cutoffs.completed_before.is_some_and(|c| created_at < c);
    let not_held = match floor.held_from {
        None => true,
        Some(None) => false,
        Some(Some(from)) => created_at < from,
    };
    (old_enough && not_held && end_offset <= floor.committed && !dead_lettered)
        .then_some(Removal::Completed)
}

/// What a group with a subscription record but no cursor row on a partition will read there:
/// from its subscription timestamp (`None`: everything). Queue mode never skips backlog,
/// whatever its record says (`claim::seed_rule`).
pub fn reads_from(group: &str, subscription_timestamp: Option<Timestamp>) -> Option<Timestamp> {
    if group == crate::types::QUEUE_MODE_GROUP {
        None
    } else {
        subscription_timestamp
    }
}

/// Where a queue's retention pass continues: the partition after (oldest segment time, id).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RetentionMark {
    pub oldest_at: Timestamp,
    pub partition_id: String,
}

/// What one retention batch removed, and where the next continues (`None`: the queue is done).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RetentionBatch {
    pub partitions_visited: u32,
    pub removed: Removed,
    pub next: Option<RetentionMark>,
}

/// Rows removed, by kind.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Removed {
    pub segments: u64,
    pub messages: u64,
    /// transactionId de-duplication rows of removed messages.
    pub dedup_rows: u64,
    pub dead_letters: u64,
}

impl std::ops::AddAssign for Removed {
    fn add_assign(&mut self, o: Removed) {
        self.segments += o.segments;
        self.messages += o.messages;
        self.dedup_rows += o.dedup_rows;
        self.dead_letters += o.dead_letters;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(enabled: bool, pending: u32, completed: u32, max_wait: u32) -> QueueConfig {
        QueueConfig {
            retention_enabled: enabled,
            retention_seconds: pending,
            completed_retention_seconds: completed,
            max_wait_time_seconds: max_wait,
            ..QueueConfig::with_defaults("q")
        }
    }

    const NOW: Timestamp = Timestamp(1_000_000_000);

    #[test]
    fn cutoffs_follow_the_options() {
        let none = Cutoffs::of(&cfg(false, 10, 10, 0), RetentionPass::Retention, NOW);
        assert!(!none.any(), "retention disabled removes nothing");
        let c = Cutoffs::of(&cfg(true, 100, 10, 0), RetentionPass::Retention, NOW);
        assert_eq!(c.expire_before, Some(NOW.minus_secs(100)));
        assert_eq!(c.completed_before, Some(NOW.minus_secs(10)));
        // Eviction applies without retention, and the stricter cutoff wins.
        let e = Cutoffs::of(&cfg(true, 100, 10, 50), RetentionPass::Eviction, NOW);
        assert_eq!(e.expire_before, Some(NOW.minus_secs(50)));
        assert_eq!(e.completed_before, None);
    }

    #[test]
    fn a_group_without_a_row_holds_back_what_it_will_read() {
        let c = Cutoffs::of(&cfg(true, 0, 10, 0), RetentionPass::Retention, NOW);
        let old = NOW.minus_secs(60);
        let all = ConsumedFloor::of(Some(100), [Some(NOW), None]);
        assert_eq!(removal(&c, &all, old, 5, false), None);
        let from_now = ConsumedFloor::of(Some(100), [Some(old.plus_secs(1))]);
        assert_eq!(
            removal(&c, &from_now, old, 5, false),
            Some(Removal::Completed)
        );
        let from_old = ConsumedFloor::of(Some(100), [Some(old)]);
        assert_eq!(removal(&c, &from_old, old, 5, false), None);
        // No cursor row at all: nothing is consumed.
        assert_eq!(
            removal(&c, &ConsumedFloor::of(None, []), old, 5, false),
            None
        );
    }

    #[test]
    fn the_slowest_cursor_and_dead_letters_hold_back_completed_only() {
        let c = Cutoffs::of(&cfg(true, 100, 10, 0), RetentionPass::Retention, NOW);
        let floor = ConsumedFloor::of(Some(9), []);
        let old = NOW.minus_secs(60);
        assert_eq!(removal(&c, &floor, old, 9, false), Some(Removal::Completed));
        assert_eq!(removal(&c, &floor, old, 10, false), None);
        assert_eq!(removal(&c, &floor, old, 9, true), None);
        let ancient = NOW.minus_secs(200);
        assert_eq!(
            removal(&c, &floor, ancient, 50, true),
            Some(Removal::Expired)
        );
        assert_eq!(removal(&c, &floor, NOW.minus_secs(5), 5, false), None);
    }
}
