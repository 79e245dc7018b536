//! Turning claims into delivered messages: decompress each blob once, slice the frames.

use crate::frames::{slice_blob, FrameError};
use crate::storage::Claim;
use crate::types::{Offset, Timestamp};

/// One message as a pop delivers it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeliveredMessage {
    pub queue: String,
    pub partition: String,
    pub partition_id: String,
    pub offset: Offset,
    pub created_at: Timestamp,
    pub attempt_count: u32,
    pub frame: crate::frames::Frame,
}

/// Slices every claim's rows into messages, in partition order then offset order.
pub fn claims_to_messages(claims: &[Claim]) -> Result<Vec<DeliveredMessage>, FrameError> {
    let mut out = Vec::with_capacity(claims.iter().map(|c| c.message_count() as usize).sum());
    for c in claims {
        for row in &c.rows {
            let frames = slice_blob(
                &row.blob,
                row.start_idx as usize,
                row.take as usize,
                row.msg_count as usize,
            )?;
            for (i, frame) in frames.into_iter().enumerate() {
                out.push(DeliveredMessage {
                    queue: c.queue.clone(),
                    partition: c.partition.clone(),
                    partition_id: c.partition_id.clone(),
                    offset: row.base_offset + i64::from(row.start_idx) + i as i64,
                    created_at: row.created_at,
                    attempt_count: c.attempt_count,
                    frame,
                });
            }
        }
    }
    Ok(out)
}
