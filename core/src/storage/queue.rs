//! A queue's configuration.

/// A queue's configuration row (`queen.queues`), with the options of the configure endpoint.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct QueueConfig {
    pub name: String,
    pub namespace: String,
    pub task: String,
    pub lease_time_secs: u32,
    pub retry_limit: u32,
    /// Milliseconds a `failed` ack holds the partition (for that group) before the redelivery.
    pub retry_delay_ms: u32,
    /// Order of queues in a namespace/task pop: higher first.
    pub priority: i32,
    pub delayed_processing_secs: u32,
    pub window_buffer_secs: u32,
    /// Cap on the queue's backlog (messages some consumer group has not passed; all messages
    /// while no group has a cursor). A push that would exceed it is refused. 0 = no cap.
    pub max_size: u32,
    /// Seconds a message stays deliverable; older messages are skipped. 0 = forever (0.15 stored
    /// 3600 but never enforced it, so enforcing that default would silently drop old backlogs).
    pub ttl_secs: u32,
    pub retention_enabled: bool,
    pub retention_seconds: u32,
    pub completed_retention_seconds: u32,
    pub encryption_enabled: bool,
    /// Keep dead letters. Off: a message that exhausts its retries or is acked `dlq` is
    /// discarded. On by default (0.15 always kept them; clients never send the flag).
    pub dead_letter_queue: bool,
    /// Dead-letter a message after `retry_limit` failed retries. Off: retried until acknowledged.
    pub dlq_after_max_retries: bool,
    pub max_wait_time_seconds: u32,
    /// Milliseconds an under-full claim may be held back (0 = off).
    pub min_pop_wait_ms: u32,
}

impl QueueConfig {
    /// The server defaults of a queue created by configure without options, or by a first push.
    pub fn with_defaults(name: &str) -> Self {
        let (namespace, task) = crate::types::namespace_and_task(name);
        QueueConfig {
            name: name.to_string(),
            namespace,
            task,
            lease_time_secs: 300,
            retry_limit: 3,
            retry_delay_ms: 1000,
            priority: 0,
            delayed_processing_secs: 0,
            window_buffer_secs: 0,
            max_size: 0,
            ttl_secs: 0,
            retention_enabled: false,
            retention_seconds: 0,
            completed_retention_seconds: 0,
            encryption_enabled: false,
            dead_letter_queue: true,
            dlq_after_max_retries: true,
            max_wait_time_seconds: 0,
            min_pop_wait_ms: 0,
        }
    }
}

/// The ids of a configured queue and of its `Default` partition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfiguredQueue {
    pub queue_id: String,
    pub default_partition_id: String,
}
