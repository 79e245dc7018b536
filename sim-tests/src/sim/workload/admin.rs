//! The prompt scenario's operator: seeks, group deletes, dead-letter requeues.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use queen_core::rng::SeededRng;
use serde_json::json;

use super::{DELETED_GROUP, PROMPT_RESET, PROMPT_RETRY, SEEK_GROUP};
use crate::sim::http::request;
use crate::sim::Shared;

/// The prompt scenario's operator: seeks, group deletes and dead-letter requeues.
pub const ADMIN: &str = "admin";

/// Every 1.5-3 s, through the broker the affected consumers are not parked on: seeks the seek
/// group 3 s back, deletes the deleted group's cursors, or requeues a dead letter.
pub(super) async fn administer(shared: Arc<Shared>, mut rng: SeededRng) {
    let Some(broker) = shared.brokers.last().cloned() else {
        return;
    };
    let timeout = Duration::from_secs(2);
    loop {
        tokio::time::sleep(Duration::from_millis(1_500 + rng.below(1_500))).await;
        if shared.draining.load(Ordering::SeqCst) {
            return;
        }
        match rng.below(3) {
            0 => {
                let at = crate::sim::sim_timestamp(shared.now()).minus_secs(3);
                let body = json!({ "timestamp": queen_core::time::format_iso_micros(at) });
                let path =
                    format!("/api/v1/consumer-groups/{SEEK_GROUP}/queues/{PROMPT_RESET}/seek");
                if let Ok((200, _)) = request(&broker, "POST", &path, Some(&body), timeout).await {
                    shared.bump("event: seek through the other broker");
                }
            }
            1 => {
                let path = format!("/api/v1/consumer-groups/{DELETED_GROUP}/queues/{PROMPT_RESET}");
                if let Ok((200, _)) = request(&broker, "DELETE", &path, None, timeout).await {
                    shared.bump("event: group delete through the other broker");
                }
            }
            _ => {
                let path = format!("/api/v1/dlq?queue={PROMPT_RETRY}&limit=1");
                let Ok((200, body)) = request(&broker, "GET", &path, None, timeout).await else {
                    continue;
                };
                let Some(id) = body["messages"][0]["dlqId"].as_i64() else {
                    continue;
                };
                let path = format!("/api/v1/dlq/{id}/requeue");
                if let Ok((200, _)) = request(&broker, "POST", &path, None, timeout).await {
                    shared.bump("event: dead letter requeued through the other broker");
                }
            }
        }
    }
}
