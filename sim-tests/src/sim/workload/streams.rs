//! The stream workers: SDK-shaped cycles over the source queue, and the idle flush that races
//! them.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use queen_core::rng::SeededRng;
use serde_json::{json, Value};

use super::{
    feed, until_answered, STREAM_GROUP, STREAM_QUERY, STREAM_SINK, STREAM_SOURCE, STREAM_WINDOWS,
    WINDOW_PREFIX,
};
use crate::sim::http::request;
use crate::sim::Shared;

/// Configures the source queue's lease (as the other queues', through a broker, so the other
/// scenarios start from the state they always had) and registers the stream query: its id.
async fn register_query(shared: &Shared, k: &mut usize) -> Option<String> {
    let register = json!({"name": STREAM_QUERY, "source_queue": STREAM_SOURCE,
                          "sink_queue": STREAM_SINK, "config_hash": "sim"});
    let configure =
        json!({"queue": STREAM_SOURCE, "options": {"leaseTime": crate::sim::LEASE_SECS}});
    let lost = "fault: request without an answer (streams)";
    until_answered(shared, k, "/api/v1/configure", &configure, lost).await?;
    let registered = until_answered(shared, k, "/streams/v1/queries", &register, lost).await?;
    registered["query_id"].as_str().map(str::to_string)
}

/// Sends a regular cycle once (a cycle without an answer is never resent): what became of it.
async fn send_cycle(
    shared: &Shared,
    broker: &str,
    cycle: &Value,
    timeout: Duration,
) -> crate::sim::streams_check::CycleOutcome {
    use crate::sim::streams_check::CycleOutcome;
    match request(broker, "POST", "/streams/v1/cycle", Some(cycle), timeout).await {
        Ok((200, body)) if body["success"] == true => {
            shared.bump("streams: cycles committed");
            CycleOutcome::Committed
        }
        Ok((status, _)) => {
            shared.bump("streams: cycles refused (the lease fence, mostly)");
            if status != 200 {
                shared.bump("streams: cycles answered 4xx/5xx");
            }
            CycleOutcome::Refused
        }
        Err(_) => {
            shared.bump("streams: cycles without an answer");
            CycleOutcome::Unknown
        }
    }
}

/// A long-poll of the source, as the SDKs' source pops are (`wait(True)`, up to a second): the
/// batch, empty when none came.
async fn pop_source(shared: &Shared, broker: &str, timeout: Duration) -> Vec<Value> {
    let pop = format!(
        "/api/v1/pop/queue/{STREAM_SOURCE}?batch=3&consumerGroup={STREAM_GROUP}&wait=true&timeout=1000"
    );
    match request(broker, "GET", &pop, None, timeout).await {
        Ok((200, body)) => body["messages"].as_array().cloned().unwrap_or_default(),
        Ok(_) => vec![],
        Err(_) => {
            shared.bump("fault: request without an answer (streams)");
            vec![]
        }
    }
}

/// The worker's count row as read: (messages counted, the last offset counted).
fn count_of(rows: &[Value]) -> (i64, Option<i64>) {
    match rows.iter().find(|r| r["key"] == "count") {
        Some(r) => (
            r["value"]["count"].as_i64().unwrap_or(0),
            r["value"]["last"].as_i64(),
        ),
        None => (0, None),
    }
}

/// One stream worker: feeds its own source partition, long-polls a batch of either partition, reads
/// the partition's state and commits a cycle, as the SDKs' windowed workers do: the `count` row
/// moved on by the batch, one sink message naming the batch, a window row opened for the batch,
/// every window row it read closed (deleted, and emitted to `STREAM_WINDOWS`), and the ack of the
/// batch's last message, fenced on the lease. Now and then it dawdles past the lease between the
/// pop and the cycle, so the other worker re-claims the batch and the late cycle must be fenced
/// out. Beside it runs its idle flush (`flush_windows`), which closes the ripe windows of the
/// partitions the worker has seen and races both workers' cycles. A cycle without an answer is
/// never resent.
pub(super) async fn run_stream(shared: Arc<Shared>, who: usize, name: String, mut rng: SeededRng) {
    use crate::sim::streams_check::{StreamCycle, WindowClose};
    let timeout = Duration::from_secs(2);
    let brokers = shared.brokers.len();
    let mut k = who;
    let Some(query_id) = register_query(&shared, &mut k).await else {
        return;
    };
    let seen: Arc<std::sync::Mutex<std::collections::BTreeSet<String>>> = Arc::default();
    tokio::spawn(flush_windows(
        shared.clone(),
        who,
        format!("{name}-flush"),
        query_id.clone(),
        seen.clone(),
        rng.child("flush"),
    ));
    let partition = format!("s{who}");
    let mut fed = 0u64;
    while !shared.draining.load(Ordering::SeqCst) {
        k += 1;
        let broker = &shared.brokers[k % brokers];
        // Feed, every other turn or so (so the workers' long-polls also find the source empty
        // and park).
        let feeds = if rng.below(2) == 0 {
            1 + rng.below(3)
        } else {
            0
        };
        feed(
            &shared,
            k,
            STREAM_SOURCE,
            &partition,
            &name,
            &mut fed,
            feeds,
        )
        .await;
        let messages = pop_source(&shared, broker, timeout).await;
        let (Some(first), Some(last)) = (messages.first(), messages.last()) else {
            tokio::time::sleep(Duration::from_millis(50 + rng.below(200))).await;
            continue;
        };
        let pid = first["partitionId"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        if let Ok(mut seen) = seen.lock() {
            seen.insert(pid.clone());
        }
        let part = first["partition"].as_str().unwrap_or_default().to_string();
        let (from, to) = (
            first["offset"].as_i64().unwrap_or(-1),
            last["offset"].as_i64().unwrap_or(-1),
        );
        let read = json!({"query_id": query_id, "partition_id": pid, "keys": []});
        let Some(rows) = read_state(&shared, broker, &read).await else {
            // The lease ends and the batch comes back.
            continue;
        };
        let (count, read_last) = count_of(&rows);
        if rng.below(5) == 0 {
            // Past the lease (2 s), now and then.
            tokio::time::sleep(Duration::from_millis(1_000 + rng.below(2_500))).await;
        }
        let nonce = format!("{name}-c{k}");
        let (mut state_ops, mut push_items, closed) = close_windows(&rows, &pid, &nonce);
        state_ops.push(json!({"type": "upsert", "key": "count",
                              "value": {"count": count + (to - from + 1), "last": to}}));
        state_ops.push(
            json!({"type": "upsert", "key": format!("{WINDOW_PREFIX}{from}"),
                              "value": {"windowEnd": 0, "from": from}}),
        );
        push_items.push(json!({"queue": STREAM_SINK, "partition": "out",
                               "payload": {"pid": pid, "from": from, "to": to, "nonce": nonce}}));
        let cycle = json!({
            "query_id": query_id,
            "partition_id": pid,
            "consumer_group": STREAM_GROUP,
            "state_ops": state_ops,
            "push_items": push_items,
            "ack": {"transactionId": last["transactionId"], "leaseId": last["leaseId"],
                    "status": "completed"},
        });
        let outcome = send_cycle(&shared, broker, &cycle, timeout).await;
        if let Ok(mut closes) = shared.window_closes.lock() {
            closes.push(WindowClose {
                nonce: nonce.clone(),
                windows: closed,
                flush: false,
                outcome,
            });
        }
        if let Ok(mut cycles) = shared.stream_cycles.lock() {
            cycles.push(StreamCycle {
                partition_id: pid,
                partition: part,
                read_last,
                from,
                to,
                nonce,
                outcome,
            });
        }
    }
}

/// A state read's rows (`None`: no answer, counted as a fault).
async fn read_state(shared: &Shared, broker: &str, read: &Value) -> Option<Vec<Value>> {
    match request(
        broker,
        "POST",
        "/streams/v1/state/get",
        Some(read),
        Duration::from_secs(2),
    )
    .await
    {
        Ok((200, body)) => Some(body["rows"].as_array().cloned().unwrap_or_default()),
        _ => {
            shared.bump("fault: request without an answer (streams)");
            None
        }
    }
}

/// The state ops and window emits that close every window row of `rows` (a cycle's or a
/// flush's read), and the (partition id, from) of each.
fn close_windows(
    rows: &[Value],
    pid: &str,
    nonce: &str,
) -> (Vec<Value>, Vec<Value>, Vec<(String, i64)>) {
    let mut ops = vec![];
    let mut emits = vec![];
    let mut closed = vec![];
    for row in rows {
        let Some(key) = row["key"].as_str().filter(|k| k.starts_with(WINDOW_PREFIX)) else {
            continue;
        };
        let from = row["value"]["from"].as_i64().unwrap_or(-1);
        ops.push(json!({"type": "delete", "key": key}));
        emits.push(json!({"queue": STREAM_WINDOWS, "partition": "out",
                          "payload": {"pid": pid, "from": from, "closer": nonce}}));
        closed.push((pid.to_string(), from));
    }
    (ops, emits, closed)
}

/// A stream worker's idle flush, beside its cycles (as the SDKs' flush timer runs): now and then
/// it reads the ripe windows of a partition the worker has seen and closes them in a cycle
/// without an ack, through either broker. It races its own worker's cycles and the other
/// worker's, and the other worker's flush.
async fn flush_windows(
    shared: Arc<Shared>,
    who: usize,
    name: String,
    query_id: String,
    seen: Arc<std::sync::Mutex<std::collections::BTreeSet<String>>>,
    mut rng: SeededRng,
) {
    use crate::sim::streams_check::{CycleOutcome, WindowClose};
    let timeout = Duration::from_secs(2);
    let brokers = shared.brokers.len();
    let mut k = who;
    while !shared.draining.load(Ordering::SeqCst) {
        tokio::time::sleep(Duration::from_millis(100 + rng.below(300))).await;
        k += 1;
        let pids: Vec<String> = seen
            .lock()
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default();
        if pids.is_empty() {
            continue;
        }
        let pid = &pids[rng.below(pids.len() as u64) as usize];
        let broker = &shared.brokers[k % brokers];
        let read = json!({"query_id": query_id, "partition_id": pid, "keys": [],
                          "key_prefix": WINDOW_PREFIX, "ripe_at_or_before": 0});
        let Some(rows) = read_state(&shared, broker, &read).await else {
            continue;
        };
        let nonce = format!("{name}-f{k}");
        let (state_ops, push_items, closed) = close_windows(&rows, pid, &nonce);
        if closed.is_empty() {
            continue;
        }
        // Now and then the flush's commit comes late (its read goes stale meanwhile).
        if rng.below(3) == 0 {
            tokio::time::sleep(Duration::from_millis(rng.below(600))).await;
        }
        let broker = &shared.brokers[(k + rng.below(2) as usize) % brokers];
        let cycle = json!({"query_id": query_id, "partition_id": pid,
                           "consumer_group": STREAM_GROUP, "state_ops": state_ops,
                           "push_items": push_items, "ack": null});
        let outcome =
            match request(broker, "POST", "/streams/v1/cycle", Some(&cycle), timeout).await {
                Ok((200, body)) if body["success"] == true => {
                    shared.bump("streams: flushes committed");
                    CycleOutcome::Committed
                }
                Ok((409, body)) => {
                    if body["error"]
                        .as_str()
                        .is_some_and(|e| e.starts_with("stream state changed"))
                    {
                        shared.bump("streams: flushes refused (a window another cycle closed)");
                    } else {
                        shared.bump("streams: flushes refused (the source leased)");
                    }
                    CycleOutcome::Refused
                }
                Ok(_) => {
                    shared.bump("streams: flushes refused (other)");
                    CycleOutcome::Refused
                }
                Err(_) => {
                    shared.bump("streams: flushes without an answer");
                    CycleOutcome::Unknown
                }
            };
        if let Ok(mut closes) = shared.window_closes.lock() {
            closes.push(WindowClose {
                nonce,
                windows: closed,
                flush: true,
                outcome,
            });
        }
    }
}
