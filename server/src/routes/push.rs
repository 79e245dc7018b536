//! `POST /api/v1/push`: JSON or framed (`QPB1`) pushes, stored (or buffered) and answered item by
//! item in the client's order.

use std::collections::BTreeMap;
use std::sync::Arc;

use hyper::StatusCode;
use queen_core::storage::{PushGroup, PushOutcome};
use queen_core::wire::{self, WireGroup};
use serde_json::{json, Value};

use crate::broker::Broker;
use crate::http::wire::{self as requests, PushItem};
use crate::http::{self, Failure, Reply};
use crate::operations::Pushed;

/// Items grouped by (queue, partition) in first-appearance order, remembering each item's slot.
pub(crate) fn group_items(items: Vec<PushItem>) -> (Vec<PushGroup>, Vec<(usize, usize)>) {
    let mut index: BTreeMap<(String, String), usize> = BTreeMap::new();
    let mut groups: Vec<PushGroup> = vec![];
    let mut slots = Vec::with_capacity(items.len());
    for it in items {
        let key = (it.queue.clone(), it.partition.clone());
        let g = *index.entry(key).or_insert_with(|| {
            groups.push(PushGroup {
                queue: it.queue.clone(),
                partition: it.partition.clone(),
                frames: vec![],
                blob: None,
            });
            groups.len() - 1
        });
        slots.push((g, groups[g].frames.len()));
        groups[g].frames.push(it.frame);
    }
    (groups, slots)
}

/// Binary groups merged by (queue, partition) in first-appearance order, remembering each
/// message's slot. A merged group loses its client blob: storage builds the segment.
pub(crate) fn merge_wire_groups(wire: Vec<WireGroup>) -> (Vec<PushGroup>, Vec<(usize, usize)>) {
    let mut index: BTreeMap<(String, String), usize> = BTreeMap::new();
    let mut groups: Vec<PushGroup> = vec![];
    let mut slots = vec![];
    for w in wire {
        match index.entry((w.queue.clone(), w.partition.clone())) {
            std::collections::btree_map::Entry::Vacant(e) => {
                e.insert(groups.len());
                slots.extend((0..w.frames.len()).map(|k| (groups.len(), k)));
                groups.push(PushGroup {
                    queue: w.queue,
                    partition: w.partition,
                    frames: w.frames,
                    blob: w.blob,
                });
            }
            std::collections::btree_map::Entry::Occupied(e) => {
                let g = *e.get();
                let group = &mut groups[g];
                slots.extend((0..w.frames.len()).map(|k| (g, group.frames.len() + k)));
                group.frames.extend(w.frames);
                group.blob = None;
            }
        }
    }
    (groups, slots)
}

/// What one push item's answer names besides its outcome.
struct ItemHead {
    queue: String,
    transaction_id: String,
    trace_id: Option<uuid::Uuid>,
}

/// `POST /api/v1/push`: a JSON body, or Queen 2.x's binary one (`QPB1`, told by its magic).
pub async fn push(
    broker: &Arc<Broker>,
    body: &[u8],
    producer: Option<&str>,
) -> Result<Reply, Failure> {
    if wire::is_binary_push(body) {
        let decoded = wire::decode_push(body, broker.config.max_body_bytes, || broker.mint_uuid())
            .map_err(|e| Failure::bad(format!("binary push: {e}")))?;
        broker.metrics.binary_pushes.inc();
        let (groups, slots) = merge_wire_groups(decoded.groups);
        return store_and_answer(broker, groups, slots, decoded.counts, producer).await;
    }
    let request: requests::PushBody = requests::body(body, None)?;
    let items = requests::push_items(&request.items, "items", || broker.mint_uuid())?;
    let (groups, slots) = group_items(items);
    store_and_answer(broker, groups, slots, false, producer).await
}

/// Stores a push and answers one object per item in request order (`slots`: each item's group
/// and place in it), or, for a binary push with flag 2, the counts.
async fn store_and_answer(
    broker: &Arc<Broker>,
    groups: Vec<PushGroup>,
    slots: Vec<(usize, usize)>,
    counts: bool,
    producer: Option<&str>,
) -> Result<Reply, Failure> {
    if slots.is_empty() {
        let answer = if counts {
            json!({"count": 0, "queued": 0, "duplicate": 0, "error": 0})
        } else {
            json!([])
        };
        return Ok(http::json(StatusCode::CREATED, &answer));
    }
    // Kept aside so the payloads move into storage uncopied.
    let heads: Vec<ItemHead> = slots
        .iter()
        .map(|(g, k)| {
            let (group, frame) = (&groups[*g], &groups[*g].frames[*k]);
            ItemHead {
                queue: group.queue.clone(),
                transaction_id: frame.transaction_id.clone(),
                trace_id: frame.trace_id,
            }
        })
        .collect();
    let outcomes = match broker.push(groups, producer).await? {
        Pushed::Stored(outcomes) => outcomes,
        Pushed::Buffered(groups) => {
            if counts {
                let n = slots.len();
                let answer =
                    json!({"count": n, "queued": 0, "buffered": n, "duplicate": 0, "error": 0});
                return Ok(http::json(StatusCode::CREATED, &answer));
            }
            // Stored later, in order; Queen's shape: no message id is promised yet.
            let answer: Vec<Value> = slots
                .iter()
                .zip(&heads)
                .enumerate()
                .map(|(index, ((g, _), head))| {
                    let (tx, queue) = (&head.transaction_id, &head.queue);
                    let partition = groups.get(*g).map(|g| g.partition.as_str());
                    json!({"index": index, "transaction_id": tx, "transactionId": tx,
                           "status": "buffered", "queue": queue, "queueName": queue,
                           "partition": partition})
                })
                .collect();
            return Ok(http::json(StatusCode::CREATED, &Value::Array(answer)));
        }
    };
    let mut found = Vec::with_capacity(slots.len());
    for (g, k) in &slots {
        found.push(
            outcomes
                .get(*g)
                .and_then(|o| o.get(*k))
                .ok_or_else(|| Failure::server("push outcome missing"))?,
        );
    }
    if counts {
        let count = |f: fn(&PushOutcome) -> bool| found.iter().filter(|o| f(o)).count();
        let answer = json!({"count": found.len(),
            "queued": count(|o| matches!(o, PushOutcome::Queued { .. })),
            "duplicate": count(|o| matches!(o, PushOutcome::Duplicate { .. })),
            "error": count(|o| matches!(o, PushOutcome::Rejected { .. }))});
        return Ok(http::json(StatusCode::CREATED, &answer));
    }
    // About 330 bytes an item in the common case.
    let mut bytes = Vec::with_capacity(2 + found.len() * 340);
    bytes.push(b'[');
    for (index, (outcome, head)) in found.into_iter().zip(&heads).enumerate() {
        if index > 0 {
            bytes.push(b',');
        }
        PushAnswer {
            index,
            head,
            outcome,
        }
        .write_to(&mut bytes)
        .map_err(|e| Failure::server(format!("push answer not rendered: {e}")))?;
    }
    bytes.push(b']');
    Ok(http::json_bytes(StatusCode::CREATED, bytes))
}

/// One item of a push's answer, in Queen's shape (both spellings of each id). Written straight
/// to the body, keys in the order a `Value` map had (sorted), so the bytes are what the `Value`
/// form gave. Only the client's strings go through the JSON escaper, each once: at batch 1000
/// the escaper was a ninth of the broker's push CPU when every key and id went through it
/// (`perf`, docs/benchmarks.md "Push answers, and the first contact").
struct PushAnswer<'a> {
    index: usize,
    head: &'a ItemHead,
    outcome: &'a PushOutcome,
}

impl PushAnswer<'_> {
    fn write_to(&self, out: &mut Vec<u8>) -> Result<(), serde_json::Error> {
        let (status, message_id, partition_id, error) = outcome_fields(self.outcome);
        out.push(b'{');
        if let Some(error) = &error {
            out.extend_from_slice(b"\"error\":");
            serde_json::to_writer(&mut *out, error)?;
            out.push(b',');
        }
        out.extend_from_slice(b"\"index\":");
        out.extend_from_slice(self.index.to_string().as_bytes());
        let mut uuid_text: QuotedUuid = [0; uuid::fmt::Hyphenated::LENGTH + 2];
        let message_id: &[u8] = match message_id {
            Some(id) => format_uuid(id, &mut uuid_text),
            None => b"null",
        };
        for key in [&b",\"messageId\":"[..], b",\"message_id\":"] {
            out.extend_from_slice(key);
            out.extend_from_slice(message_id);
        }
        let mut escaped = Vec::with_capacity(partition_id.len() + 2);
        serde_json::to_writer(&mut escaped, partition_id)?;
        for key in [&b",\"partitionId\":"[..], b",\"partition_id\":"] {
            out.extend_from_slice(key);
            out.extend_from_slice(&escaped);
        }
        out.extend_from_slice(b",\"queueName\":");
        serde_json::to_writer(&mut *out, &self.head.queue)?;
        out.extend_from_slice(b",\"status\":\"");
        out.extend_from_slice(status.as_bytes());
        out.push(b'"');
        if status == "queued" {
            out.extend_from_slice(b",\"trace_id\":");
            let mut trace_text: QuotedUuid = [0; uuid::fmt::Hyphenated::LENGTH + 2];
            match &self.head.trace_id {
                Some(t) => out.extend_from_slice(format_uuid(t, &mut trace_text)),
                None => out.extend_from_slice(b"null"),
            }
        }
        escaped.clear();
        serde_json::to_writer(&mut escaped, &self.head.transaction_id)?;
        for key in [&b",\"transactionId\":"[..], b",\"transaction_id\":"] {
            out.extend_from_slice(key);
            out.extend_from_slice(&escaped);
        }
        out.push(b'}');
        Ok(())
    }
}

/// A UUID as a JSON string, quotes included; hex and hyphens need no escaping.
fn format_uuid<'b>(id: &uuid::Uuid, buf: &'b mut QuotedUuid) -> &'b [u8] {
    let inner = uuid::fmt::Hyphenated::LENGTH;
    buf[0] = b'"';
    id.hyphenated().encode_lower(&mut buf[1..=inner]);
    buf[inner + 1] = b'"';
    &buf[..]
}

type QuotedUuid = [u8; uuid::fmt::Hyphenated::LENGTH + 2];

/// An outcome as a push answer's item says it: (status, messageId, partitionId, error). The push
/// and the stream cycle answers both say it so.
pub(super) fn outcome_fields(
    outcome: &PushOutcome,
) -> (&'static str, Option<&uuid::Uuid>, &String, Option<String>) {
    match outcome {
        PushOutcome::Queued {
            message_id,
            partition_id,
            ..
        } => ("queued", Some(message_id), partition_id, None),
        PushOutcome::Duplicate {
            message_id,
            partition_id,
        } => ("duplicate", Some(message_id), partition_id, None),
        PushOutcome::Rejected {
            partition_id, full, ..
        } => ("failed", None, partition_id, Some(full.to_string())),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // test code
    use super::*;
    use queen_core::storage::QueueFull;

    /// The answer is written without a `Value`, byte for byte as the `Value` form was.
    #[test]
    fn push_answers_render_as_the_value_form_did() {
        let mid = uuid::Uuid::from_u128(7);
        let head = |trace_id| ItemHead {
            queue: "q".into(),
            transaction_id: "t\"1".into(),
            trace_id,
        };
        let pid = "p-1".to_string();
        let cases = [
            (
                head(Some(uuid::Uuid::from_u128(9))),
                PushOutcome::Queued {
                    message_id: mid,
                    partition_id: pid.clone(),
                    offset: 3,
                },
                json!({"index": 4, "transaction_id": "t\"1", "transactionId": "t\"1", "status": "queued",
                       "message_id": mid.to_string(), "messageId": mid.to_string(),
                       "partition_id": pid, "partitionId": pid,
                       "trace_id": uuid::Uuid::from_u128(9).to_string(), "queueName": "q"}),
            ),
            (
                head(None),
                PushOutcome::Queued {
                    message_id: mid,
                    partition_id: pid.clone(),
                    offset: 3,
                },
                json!({"index": 4, "transaction_id": "t\"1", "transactionId": "t\"1", "status": "queued",
                       "message_id": mid.to_string(), "messageId": mid.to_string(),
                       "partition_id": pid, "partitionId": pid, "trace_id": null, "queueName": "q"}),
            ),
            (
                head(None),
                PushOutcome::Duplicate {
                    message_id: mid,
                    partition_id: pid.clone(),
                },
                json!({"index": 4, "transaction_id": "t\"1", "transactionId": "t\"1", "status": "duplicate",
                       "message_id": mid.to_string(), "messageId": mid.to_string(),
                       "partition_id": pid, "partitionId": pid, "queueName": "q"}),
            ),
        ];
        let full = QueueFull {
            queue: "q".into(),
            max_size: 2,
            backlog: 2,
        };
        let rejected = (
            head(None),
            PushOutcome::Rejected {
                message_id: mid,
                partition_id: pid.clone(),
                full: full.clone(),
            },
            json!({"index": 4, "transaction_id": "t\"1", "transactionId": "t\"1", "status": "failed",
                   "error": full.to_string(), "message_id": null, "messageId": null,
                   "partition_id": pid, "partitionId": pid, "queueName": "q"}),
        );
        for (head, outcome, value) in cases.iter().chain(std::iter::once(&rejected)) {
            let answer = PushAnswer {
                index: 4,
                head,
                outcome,
            };
            let mut written = vec![];
            answer.write_to(&mut written).unwrap();
            assert_eq!(
                String::from_utf8(written).unwrap(),
                serde_json::to_string(value).unwrap()
            );
        }
    }
}
