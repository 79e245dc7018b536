//! Reads by offset and partition discovery in the model: one atomic look at committed state.

use queen_core::reads::{self, ChangedPage, ChangedPartition, ChangedQuery, Retained};
use queen_core::storage::{PartitionRead, SegmentRow};
use queen_core::{Offset, Timestamp};

use crate::state::DbState;

fn retained(st: &DbState, pid: &str, last_offset: Offset, view: u64) -> Retained {
    let oldest = st
        .segments
        .range(
            (pid.to_string(), Offset::MIN)..=(pid.to_string(), Offset::MAX),
            view,
        )
        .next()
        .map(|((_, base), _)| *base);
    Retained::of(last_offset, oldest)
}

/// `view`: the transaction whose view is read (0: what is committed, as every read must).
pub(crate) fn read_partition(
    st: &DbState,
    queue: &str,
    partition: &str,
    offset: Offset,
    byte_hint: u64,
    from_segment_base: bool,
    view: u64,
) -> PartitionRead {
    let Some(p) = st
        .partitions
        .get(&(queue.to_string(), partition.to_string()), view)
    else {
        return PartitionRead::Unknown;
    };
    let range = retained(st, &p.id, p.last_offset, view);
    let mut segments = vec![];
    if !range.out_of_range(offset) && byte_hint > 0 {
        let mut bytes = 0u64;
        // The segment holding `offset` starts at or before it: walk from the last such one.
        let first = st
            .segments
            .range((p.id.clone(), Offset::MIN)..=(p.id.clone(), offset), view)
            .next_back()
            .map_or(offset, |((_, base), _)| *base);
        for ((_, base), s) in st
            .segments
            .range((p.id.clone(), first)..=(p.id.clone(), Offset::MAX), view)
        {
            if s.end_offset < offset {
                continue;
            }
            if !segments.is_empty() && bytes + s.blob.len() as u64 > byte_hint {
                break;
            }
            bytes += s.blob.len() as u64;
            let msg_count = s.message_count(*base);
            // SimBugs::fetch_from_segment_base: the slice ignores where in the segment the
            // offset is.
            let start_idx = if from_segment_base {
                0
            } else {
                (offset - base).max(0) as u32
            };
            segments.push(SegmentRow {
                base_offset: *base,
                start_idx,
                take: msg_count - start_idx,
                msg_count,
                created_at: s.created_at,
                blob: s.blob.clone(),
            });
        }
    }
    PartitionRead::Found { range, segments }
}

/// `sampled_at` and `oldest_open` were taken before this look at the state (see
/// `reads::safe_time`).
pub(crate) fn changed(
    st: &DbState,
    q: &ChangedQuery,
    sampled_at: Timestamp,
    oldest_open: Option<Timestamp>,
) -> ChangedPage {
    let safe_time = reads::safe_time(sampled_at, oldest_open);
    if st.queues.get(&q.queue, 0).is_none() {
        return ChangedPage {
            partitions: None,
            more: false,
            safe_time,
        };
    }
    let floor = q.since.map(reads::since_floor);
    let mut list: Vec<ChangedPartition> = st
        .partitions
        .range((q.queue.clone(), q.after.clone().unwrap_or_default()).., 0)
        .take_while(|((queue, _), _)| *queue == q.queue)
        .filter(|((_, name), _)| q.after.as_ref().is_none_or(|a| name > a))
        .filter(|(_, p)| floor.is_none_or(|f| p.last_write_at >= f))
        .take(q.limit as usize + 1)
        .map(|((_, name), p)| ChangedPartition {
            name: name.clone(),
            id: p.id.clone(),
            range: retained(st, &p.id, p.last_offset, 0),
            last_write_at: p.last_write_at,
        })
        .collect();
    let more = list.len() > q.limit as usize;
    list.truncate(q.limit as usize);
    ChangedPage {
        partitions: Some(list),
        more,
        safe_time,
    }
}
