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
