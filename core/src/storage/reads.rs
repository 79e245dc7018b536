//! Reads by offset and partition discovery: no lease, no cursor, nothing written.
use async_trait::async_trait;

use super::{SegmentRow, StorageResult};
use crate::reads::{ChangedPage, ChangedQuery, Retained};
use crate::types::Offset;

/// What storage read of one partition from an offset, in one snapshot: every offset below
/// `range.high_watermark` is committed (offsets are assigned under the partition row's lock,
/// held to commit), and `segments` are the retained ones holding offsets from the one asked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PartitionRead {
    /// No such queue or partition.
    Unknown,
    Found {
        range: Retained,
        /// In offset order, each sliced to start at the offset asked (`start_idx`); their
        /// blobs add up to at most the byte hint, but at least one is read when any is left.
        segments: Vec<SegmentRow>,
    },
}

#[async_trait]
pub trait ReadStorage: Send + Sync {
    /// Segments of `queue`/`partition` from `offset`, blobs adding up to about `byte_hint`
    /// (`0`: the range alone). An offset outside the retained range reads no segment.
    async fn read_partition(
        &self,
        queue: &str,
        partition: &str,
        offset: Offset,
        byte_hint: u64,
    ) -> StorageResult<PartitionRead>;

    /// One page of the partitions of a queue written since a time, by name, with the answer's
    /// `safeTime` (see `crate::reads::safe_time`).
    async fn changed_partitions(&self, query: &ChangedQuery) -> StorageResult<ChangedPage>;
}
