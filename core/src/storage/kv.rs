//! The key/value store and the locks built on it.
use async_trait::async_trait;
use serde_json::Value;

use super::StorageResult;
use crate::kv::{KvBatch, KvOp};
use crate::locks::LockOp;

#[async_trait]
pub trait KvStorage: Send + Sync {
    /// Runs the ops in one transaction, in order, each under its key's row lock. A refused
    /// `required` op rolls the whole call back (`failed` names it).
    async fn kv_batch(&self, ops: Vec<KvOp>) -> StorageResult<KvBatch>;
    /// One lock operation in its own transaction. `minted_owner` is the owner of an acquire that
    /// names none.
    async fn lock_op(&self, op: LockOp, minted_owner: String) -> StorageResult<Value>;
    /// Removes up to `limit` rows past their expiry (already absent to every reader); how many.
    async fn sweep_expired_kv(&self, limit: u32) -> StorageResult<u64>;
}
