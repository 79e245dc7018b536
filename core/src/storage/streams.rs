//! Stream queries and their state rows (a cycle's state ops run as `TxOp::Stream`).
use async_trait::async_trait;

use super::StorageResult;
use crate::streams::{QueryRegistration, Registration, StateQuery, StateRow};

#[async_trait]
pub trait StreamStorage: Send + Sync {
    /// Registers `req` under its name (`minted_id`: the id a new query gets), in one
    /// transaction under the name's row lock (see `crate::streams::registration_step`).
    async fn register_stream_query(
        &self,
        req: &QueryRegistration,
        minted_id: uuid::Uuid,
    ) -> StorageResult<Registration>;
    /// The rows of one (query, partition) shard the read selects, by key; `None` when no
    /// query has that id.
    async fn stream_state(&self, query: &StateQuery) -> StorageResult<Option<Vec<StateRow>>>;
}
