//! Ephemeral queues' declared configuration: the one part of an ephemeral queue storage keeps
//! (the contents live in a broker's memory, `crate::ephemeral`).
use async_trait::async_trait;
use serde_json::Value;

use super::StorageResult;

#[async_trait]
pub trait EphemeralConfigStorage: Send + Sync {
    /// A declared queue's options (the wire's `options`, every one resolved).
    async fn ephemeral_config(&self, queue: &str) -> StorageResult<Option<Value>>;
    /// Every declared queue, by name.
    async fn ephemeral_configs(&self) -> StorageResult<Vec<(String, Value)>>;
    /// Declares or re-declares a queue.
    async fn save_ephemeral_config(&self, queue: &str, options: &Value) -> StorageResult<()>;
    /// Forgets a declaration; answers whether there was one.
    async fn remove_ephemeral_config(&self, queue: &str) -> StorageResult<bool>;
}

/// A broker that owns ephemeral queues: its incarnation and the address its peers forward to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EphemeralBroker {
    pub incarnation: u64,
    pub address: String,
}

/// A queue's owner as a claim answers it. `epoch` counts the queue's changes of hands: an owner
/// that finds the same epoch after an interruption (its liveness lapsed, nobody took the queue)
/// may keep the ring it held.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EphemeralClaim {
    pub owner: EphemeralBroker,
    pub epoch: i64,
}

/// Which broker holds each ephemeral queue's ring, when several share one database: one owner a
/// queue, chosen here and fenced by liveness (`crate::ephemeral::ownership`).
#[async_trait]
pub trait EphemeralOwnerStorage: Send + Sync {
    /// Says this broker is alive for `alive_ms` more (storage's clock), reachable at `address`.
    async fn ephemeral_heartbeat(
        &self,
        incarnation: u64,
        address: &str,
        alive_ms: u64,
    ) -> StorageResult<()>;
    /// Claims `queue` for `incarnation` when no live broker owns it, and answers the owner (this
    /// broker, or the one that keeps it). A queue whose owner left (or never had a row) is taken
    /// at once; one whose owner's liveness ran out only by a claimer alive without a break for
    /// at least `takeover_after_ms` (`ownership::TAKEOVER_AFTER_MS`): a heartbeat that finds its
    /// broker's row run out (or absent) starts that span again.
    async fn ephemeral_claim(
        &self,
        queue: &str,
        incarnation: u64,
        takeover_after_ms: u64,
    ) -> StorageResult<EphemeralClaim>;
    /// The brokers alive now.
    async fn ephemeral_brokers(&self) -> StorageResult<Vec<EphemeralBroker>>;
    /// A broker shutting down: its queues are free to claim at once.
    async fn ephemeral_leave(&self, incarnation: u64) -> StorageResult<()>;
}
