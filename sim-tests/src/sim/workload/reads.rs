//! The reader by offset.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use queen_core::rng::SeededRng;
use serde_json::json;

use super::RETENTION_QUEUE;
use crate::sim::http::request;
use crate::sim::Shared;

/// Lists the retention queue's partitions (`partitions/changed`) and reads some of them by
/// offset (`fetch`) through either broker: from the start kept, from inside the range, or from
/// below it (out of range once retention moved the start), every 100-400 ms.
pub(super) async fn read_by_offset(shared: Arc<Shared>, mut rng: SeededRng) {
    use crate::sim::reads_check::FetchSeen;
    let timeout = Duration::from_secs(2);
    while !shared.draining.load(Ordering::SeqCst) {
        tokio::time::sleep(Duration::from_millis(100 + rng.below(300))).await;
        let broker = &shared.brokers[rng.below(shared.brokers.len() as u64) as usize];
        let list = json!({"entries": [{"queue": RETENTION_QUEUE}]});
        let Ok((200, listed)) = request(
            broker,
            "POST",
            "/api/v1/partitions/changed",
            Some(&list),
            timeout,
        )
        .await
        else {
            shared.bump("fault: request without an answer (reads)");
            continue;
        };
        let parts = listed["entries"][0]["partitions"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        if parts.is_empty() {
            continue;
        }
        let mut entries = vec![];
        for _ in 0..3 {
            let p = &parts[rng.below(parts.len() as u64) as usize];
            let (start, end) = (
                p["logStart"].as_i64().unwrap_or(0),
                p["lastOffset"].as_i64().unwrap_or(-1) + 1,
            );
            let from = match rng.below(3) {
                0 => start,
                1 => start + rng.below((end - start + 1).max(1) as u64) as i64,
                _ => rng.below((end + 1).max(1) as u64) as i64,
            };
            entries.push(json!({"queue": RETENTION_QUEUE, "partition": p["name"], "offset": from}));
        }
        let call = json!({ "entries": entries });
        let Ok((200, answer)) =
            request(broker, "POST", "/api/v1/fetch", Some(&call), timeout).await
        else {
            shared.bump("fault: request without an answer (reads)");
            continue;
        };
        let got = answer["entries"].as_array().cloned().unwrap_or_default();
        let Ok(mut fetches) = shared.fetches.lock() else {
            return;
        };
        for (asked, e) in entries.iter().zip(got) {
            shared.bump(if e["error"].is_string() {
                "reads: entries answered with an error"
            } else {
                "reads: entries read"
            });
            fetches.push(FetchSeen {
                partition: asked["partition"].as_str().unwrap_or_default().to_string(),
                from: asked["offset"].as_i64().unwrap_or(0),
                high_watermark: e["highWatermark"].as_i64().unwrap_or(0),
                log_start: e["logStartOffset"].as_i64().unwrap_or(0),
                records: e["records"]
                    .as_array()
                    .map(|rs| {
                        rs.iter()
                            .map(|r| {
                                (
                                    r["offset"].as_i64().unwrap_or(-1),
                                    r["transactionId"].as_str().unwrap_or_default().to_string(),
                                )
                            })
                            .collect()
                    })
                    .unwrap_or_default(),
                error: e["error"].as_str().map(str::to_string),
            });
        }
    }
}
