//! The conflating consumers: each feeds its own partition and long-polls the newest message.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use queen_core::rng::SeededRng;
use serde_json::json;

use super::{feed, until_answered, CONFLATION_GROUP, CONFLATION_QUEUE};
use crate::sim::http::request;
use crate::sim::Shared;

/// One conflating consumer: feeds its own partition (until the drain), long-polls the newest of
/// either partition with `conflation=true`, and acks it, except now and then when it dies with
/// the delivery in hand (the lease must bring it back). It keeps consuming through the drain,
/// until the run is over.
pub(super) async fn consume_newest(
    shared: Arc<Shared>,
    who: usize,
    name: String,
    mut rng: SeededRng,
) {
    use crate::sim::conflation_check::ConflationSeen;
    let timeout = Duration::from_secs(2);
    let brokers = shared.brokers.len();
    let mut k = who;
    let configure =
        json!({"queue": CONFLATION_QUEUE, "options": {"leaseTime": crate::sim::LEASE_SECS}});
    let lost = "fault: request without an answer (conflation)";
    if until_answered(&shared, &mut k, "/api/v1/configure", &configure, lost)
        .await
        .is_none()
    {
        return;
    }
    let partition = format!("l{who}");
    let mut fed = 0u64;
    let record = |seen: ConflationSeen| {
        if let Ok(mut all) = shared.conflation_seen.lock() {
            all.push(seen);
        }
    };
    while !shared.done.load(Ordering::SeqCst) {
        k += 1;
        let broker = &shared.brokers[k % brokers];
        let feeds = if shared.draining.load(Ordering::SeqCst) || rng.below(2) == 1 {
            0
        } else {
            1 + rng.below(3)
        };
        feed(
            &shared,
            k,
            CONFLATION_QUEUE,
            &partition,
            &name,
            &mut fed,
            feeds,
        )
        .await;
        let pop = format!(
            "/api/v1/pop/queue/{CONFLATION_QUEUE}?batch=3&partitions=2&consumerGroup={CONFLATION_GROUP}\
             &conflation=true&wait=true&timeout=1000"
        );
        let messages = match request(broker, "GET", &pop, None, timeout).await {
            Ok((200, body)) => {
                let messages = body["messages"].as_array().cloned().unwrap_or_default();
                record(ConflationSeen::Answer {
                    messages: messages
                        .iter()
                        .map(|m| {
                            (
                                m["partition"].as_str().unwrap_or_default().to_string(),
                                m["offset"].as_i64().unwrap_or(-1),
                            )
                        })
                        .collect(),
                    echoed: body["conflation"] == true,
                });
                messages
            }
            Ok(_) => vec![],
            Err(_) => {
                shared.bump(lost);
                vec![]
            }
        };
        if messages.is_empty() {
            tokio::time::sleep(Duration::from_millis(50 + rng.below(200))).await;
            continue;
        }
        shared.bump("conflation: newest messages delivered");
        if rng.below(5) == 0 {
            // Dies with the delivery in hand: no ack, the lease ends it.
            shared.bump("conflation: deliveries abandoned");
            continue;
        }
        for m in &messages {
            record(ConflationSeen::AckSent {
                partition: m["partition"].as_str().unwrap_or_default().to_string(),
                offset: m["offset"].as_i64().unwrap_or(-1),
            });
            let ack = json!({"transactionId": m["transactionId"], "partitionId": m["partitionId"],
                             "leaseId": m["leaseId"], "consumerGroup": CONFLATION_GROUP,
                             "status": "completed"});
            if request(broker, "POST", "/api/v1/ack", Some(&ack), timeout)
                .await
                .is_err()
            {
                shared.bump(lost);
            }
        }
    }
}
