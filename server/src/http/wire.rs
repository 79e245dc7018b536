//! The request bodies of the JSON routes, typed: serde reads them, and each `into_*` checks what
//! serde cannot (names, ranges) and builds the core's types. A client's mistake is a `Failure`
//! with status 400 naming the field; nothing here touches storage.
//!
//! Payloads stay raw (`RawValue`): stored as the client's JSON text, never parsed into a tree.

use queen_core::frames::Frame;
use queen_core::params::MAX_LEASE_SECONDS;
use queen_core::storage::{AckItem, AckStatus, QueueConfig, SeekTarget};
use queen_core::time::parse_iso;
use queen_core::types::{
    namespace_and_task, validate_name, validate_text, DEFAULT_PARTITION, QUEUE_MODE_GROUP,
};
use queen_core::Timestamp;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer};
use serde_json::value::RawValue;
use serde_json::Value;

use crate::http::Failure;

/// Reads a JSON body as `T`. An empty body is `empty_means` when the route allows one.
pub fn body<'a, T: Deserialize<'a>>(
    bytes: &'a [u8],
    empty_means: Option<&'a str>,
) -> Result<T, Failure> {
    let text: &'a [u8] = if bytes.iter().all(u8::is_ascii_whitespace) {
        empty_means
            .ok_or_else(|| Failure::bad("Empty request body"))?
            .as_bytes()
    } else {
        bytes
    };
    serde_json::from_slice(text).map_err(|e| Failure::bad(format!("Invalid request body: {e}")))
}

/// Reads one element of a list as `T`, with the element's place in the message.
fn element<T: DeserializeOwned>(raw: &RawValue, place: &str) -> Result<T, Failure> {
    if !raw.get().starts_with('{') {
        return Err(Failure::bad(format!("{place} must be an object")));
    }
    serde_json::from_str(raw.get()).map_err(|e| Failure::bad(format!("{place}: {e}")))
}

/// A present key, even with `null`: `Some(raw)` (serde's `Option` would read null as absent).
fn present<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Box<RawValue>>, D::Error> {
    Box::<RawValue>::deserialize(d).map(Some)
}

/// A name or id from a request, or a 400 saying what is wrong with it.
pub fn check_name(what: &'static str, name: &str) -> Result<(), Failure> {
    validate_name(what, name).map_err(|e| Failure::bad(e.to_string()))
}

/// A request's consumer group: absent or empty is queue mode; anything else must be a valid name.
pub fn consumer_group(group: Option<String>) -> Result<String, Failure> {
    match group.filter(|g| !g.is_empty()) {
        None => Ok(QUEUE_MODE_GROUP.to_string()),
        Some(g) => {
            check_name("consumerGroup", &g)?;
            Ok(g)
        }
    }
}

/// An ISO-8601 instant from a request, or a 400 naming the field.
pub fn timestamp(value: &str, what: &str) -> Result<Timestamp, Failure> {
    parse_iso(value).ok_or_else(|| {
        Failure::bad(format!(
            "{what} must be an ISO-8601 timestamp, got {value:?}"
        ))
    })
}

/// `POST /api/v1/push`.
#[derive(Deserialize)]
pub struct PushBody {
    pub items: Vec<Box<RawValue>>,
}

/// The fields of one push item. Unknown fields are ignored: they may be the payload itself.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct PushItemFields {
    queue: Option<String>,
    partition: Option<String>,
    transaction_id: Option<String>,
    trace_id: Option<String>,
    #[serde(default, deserialize_with = "present")]
    data: Option<Box<RawValue>>,
    #[serde(default, deserialize_with = "present")]
    payload: Option<Box<RawValue>>,
}

/// One push item after validation; the message id is the broker's.
pub struct PushItem {
    pub queue: String,
    pub partition: String,
    pub frame: Frame,
}

/// Reads push items; `mint` gives each its message id (and the transactionId when it has none).
pub fn push_items(
    items: &[Box<RawValue>],
    place: &str,
    mut mint: impl FnMut() -> uuid::Uuid,
) -> Result<Vec<PushItem>, Failure> {
    items
        .iter()
        .enumerate()
        .map(|(i, raw)| {
            let place = format!("{place}[{i}]");
            let f: PushItemFields = element(raw, &place)?;
            let queue = f
                .queue
                .ok_or_else(|| Failure::bad(format!("{place}: queue is required")))?;
            check_name("queue", &queue)?;
            let partition = f.partition.unwrap_or_else(|| DEFAULT_PARTITION.to_string());
            check_name("partition", &partition)?;
            let transaction_id = f.transaction_id.filter(|t| !t.is_empty());
            if let Some(t) = &transaction_id {
                validate_name("transactionId", t)
                    .map_err(|e| Failure::bad(format!("{place}: {e}")))?;
            }
            let trace_id = match f.trace_id.filter(|t| !t.is_empty()) {
                None => None,
                Some(t) => Some(
                    uuid::Uuid::parse_str(&t)
                        .map_err(|_| Failure::bad(format!("{place}: traceId must be a UUID")))?,
                ),
            };
            // The payload is `data` if present, else `payload`, else the whole item.
            let payload = f.data.or(f.payload).map_or_else(
                || raw.get().as_bytes().to_vec(),
                |p| p.get().as_bytes().to_vec(),
            );
            let message_id = mint();
            Ok(PushItem {
                queue,
                partition,
                frame: Frame {
                    producer: None,
                    encrypted: false,
                    message_id,
                    transaction_id: transaction_id.unwrap_or_else(|| message_id.to_string()),
                    trace_id,
                    payload,
                },
            })
        })
        .collect()
}

/// The fields of one acknowledgment (also an ack operation of a transaction).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AckFields {
    transaction_id: Option<String>,
    partition_id: Option<String>,
    status: Option<String>,
    lease_id: Option<String>,
    error: Option<Value>,
    pub consumer_group: Option<String>,
}

impl AckFields {
    pub fn into_item(self) -> Result<AckItem, Failure> {
        let transaction_id = self
            .transaction_id
            .filter(|t| !t.is_empty())
            .ok_or_else(|| {
                Failure::bad("Each acknowledgment must have a valid transactionId string")
            })?;
        let partition_id = self
            .partition_id
            .filter(|t| !t.is_empty())
            .ok_or_else(|| Failure::bad("partitionId is required to ensure message uniqueness"))?;
        check_name("transactionId", &transaction_id)?;
        check_name("partitionId", &partition_id)?;
        let lease_id = self.lease_id.filter(|l| !l.is_empty());
        if let Some(l) = &lease_id {
            check_name("leaseId", l)?;
        }
        let error = match self.error {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(s),
            Some(other) => Some(other.to_string()),
        };
        if let Some(e) = &error {
            validate_text("error", e).map_err(|e| Failure::bad(e.to_string()))?;
        }
        let status = match self.status {
            None => AckStatus::Completed,
            Some(s) => AckStatus::parse(&s).ok_or_else(|| {
                Failure::bad(format!(
                    "status must be one of completed, success, failed, retry, dlq; got {s:?}"
                ))
            })?,
        };
        Ok(AckItem {
            transaction_id,
            partition_id,
            status,
            lease_id,
            error,
        })
    }
}

/// `POST /api/v1/ack`: one acknowledgment, its group beside it.
pub fn ack(bytes: &[u8]) -> Result<(String, AckItem), Failure> {
    let raw: Box<RawValue> = body(bytes, None)?;
    let fields: AckFields = element(&raw, "the ack body")?;
    let group = consumer_group(fields.consumer_group.clone())?;
    Ok((group, fields.into_item()?))
}

/// `POST /api/v1/ack/batch`.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AckBatchBody {
    acknowledgments: Vec<Box<RawValue>>,
    consumer_group: Option<String>,
}

impl AckBatchBody {
    pub fn into_items(self) -> Result<(String, Vec<AckItem>), Failure> {
        let items = self
            .acknowledgments
            .iter()
            .enumerate()
            .map(|(i, raw)| {
                element::<AckFields>(raw, &format!("acknowledgments[{i}]"))?.into_item()
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok((consumer_group(self.consumer_group)?, items))
    }
}

/// `POST /api/v1/lease/{id}/extend`; an empty body is `{}` (client 2.6.0 sends none).
#[derive(Deserialize)]
pub struct ExtendBody {
    seconds: Option<u64>,
}

impl ExtendBody {
    /// The extension asked for: 60 s when the body names none, at most a lease's longest.
    pub fn seconds(&self) -> Result<u32, Failure> {
        match self.seconds {
            None => Ok(60),
            Some(s) if (1..=u64::from(MAX_LEASE_SECONDS)).contains(&s) => Ok(s as u32),
            Some(_) => Err(Failure::bad(format!(
                "seconds must be a whole number from 1 to {MAX_LEASE_SECONDS}"
            ))),
        }
    }
}

/// The options of `POST /api/v1/configure`, in the clients' names and units.
#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct QueueOptions {
    lease_time: Option<u32>,
    retry_limit: Option<u32>,
    retry_delay: Option<u32>,
    priority: Option<i32>,
    delayed_processing: Option<u32>,
    window_buffer: Option<u32>,
    max_size: Option<u32>,
    ttl: Option<u32>,
    retention_enabled: Option<bool>,
    retention_seconds: Option<u32>,
    completed_retention_seconds: Option<u32>,
    encryption_enabled: Option<bool>,
    dead_letter_queue: Option<bool>,
    dlq_after_max_retries: Option<bool>,
    max_wait_time_seconds: Option<u32>,
    min_pop_wait_time: Option<u32>,
}

/// `POST /api/v1/configure`.
#[derive(Deserialize)]
pub struct ConfigureBody {
    queue: Option<String>,
    namespace: Option<String>,
    task: Option<String>,
    options: Option<QueueOptions>,
}

impl ConfigureBody {
    /// The queue's whole configuration: reconfiguring overwrites every option, and absent ones
    /// go back to the defaults.
    pub fn into_config(self) -> Result<QueueConfig, Failure> {
        let queue = self
            .queue
            .filter(|q| !q.is_empty())
            .ok_or_else(|| Failure::bad("queue is required"))?;
        check_name("queue", &queue)?;
        let d = QueueConfig::with_defaults(&queue);
        let o = self.options.unwrap_or_default();
        let (namespace, task) = namespace_and_task(&queue);
        for (what, given) in [("namespace", &self.namespace), ("task", &self.task)] {
            if let Some(v) = given.as_deref().filter(|v| !v.is_empty()) {
                check_name(what, v)?;
            }
        }
        Ok(QueueConfig {
            namespace: self.namespace.unwrap_or(namespace),
            task: self.task.unwrap_or(task),
            lease_time_secs: o.lease_time.unwrap_or(d.lease_time_secs),
            retry_limit: o.retry_limit.unwrap_or(d.retry_limit),
            retry_delay_ms: o.retry_delay.unwrap_or(d.retry_delay_ms),
            priority: o.priority.unwrap_or(d.priority),
            delayed_processing_secs: o.delayed_processing.unwrap_or(d.delayed_processing_secs),
            window_buffer_secs: o.window_buffer.unwrap_or(d.window_buffer_secs),
            max_size: o.max_size.unwrap_or(d.max_size),
            ttl_secs: o.ttl.unwrap_or(d.ttl_secs),
            retention_enabled: o.retention_enabled.unwrap_or(d.retention_enabled),
            retention_seconds: o.retention_seconds.unwrap_or(d.retention_seconds),
            completed_retention_seconds: o
                .completed_retention_seconds
                .unwrap_or(d.completed_retention_seconds),
            encryption_enabled: o.encryption_enabled.unwrap_or(d.encryption_enabled),
            dead_letter_queue: o.dead_letter_queue.unwrap_or(d.dead_letter_queue),
            dlq_after_max_retries: o.dlq_after_max_retries.unwrap_or(d.dlq_after_max_retries),
            max_wait_time_seconds: o.max_wait_time_seconds.unwrap_or(d.max_wait_time_seconds),
            min_pop_wait_ms: o.min_pop_wait_time.unwrap_or(d.min_pop_wait_ms),
            name: queue,
        })
    }
}

/// `POST /api/v1/transaction`.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TransactionBody {
    /// Required in a JSON body; a binary body's head may leave it out (pushes only).
    pub operations: Option<Vec<Box<RawValue>>>,
    /// Stands in for acks without their own leaseId when it names exactly one lease.
    #[serde(default)]
    pub required_leases: Option<Vec<String>>,
    /// 2.x KV rider: KV ops (lock guards first) that commit with the transaction.
    #[serde(default)]
    pub kv: Option<Vec<serde_json::Value>>,
    /// 2.x timer rider: timer ops that commit with the transaction.
    #[serde(default)]
    pub timers: Option<Vec<serde_json::Value>>,
}

/// The kind of one transaction operation; the rest of its fields depend on it.
#[derive(Deserialize)]
pub struct OperationKind {
    #[serde(rename = "type")]
    pub kind: Option<String>,
}

/// A push operation's items.
#[derive(Deserialize)]
pub struct PushOperation {
    pub items: Vec<Box<RawValue>>,
}

/// Reads one transaction operation as `T`.
pub fn operation<T: DeserializeOwned>(raw: &RawValue, i: usize) -> Result<T, Failure> {
    element(raw, &format!("operations[{i}]"))
}

/// `POST /api/v1/consumer-groups/{g}/queues/{q}/seek`.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SeekBody {
    #[serde(default)]
    to_end: bool,
    timestamp: Option<String>,
}

impl SeekBody {
    pub fn target(&self) -> Result<SeekTarget, Failure> {
        match (&self.to_end, &self.timestamp) {
            (true, _) => Ok(SeekTarget::End),
            (false, Some(t)) => Ok(SeekTarget::Timestamp(timestamp(t, "timestamp")?)),
            (false, None) => Err(Failure::bad("seek needs toEnd: true or a timestamp")),
        }
    }
}

/// `POST /api/v1/consumer-groups/{g}/subscription`.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SubscriptionBody {
    pub subscription_timestamp: Option<String>,
}

/// `POST /api/v1/system/maintenance/pop`.
#[derive(Deserialize)]
pub struct MaintenanceBody {
    pub enabled: bool,
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use queen_core::types::MAX_NAME_BYTES;

    fn items(json: &str) -> Result<Vec<PushItem>, Failure> {
        let b: PushBody = body(json.as_bytes(), None)?;
        let mut n = 0u128;
        push_items(&b.items, "items", || {
            n += 1;
            uuid::Uuid::from_u128(n)
        })
    }

    #[test]
    fn the_payload_is_data_then_payload_then_the_item() {
        let got = items(
            r#"{"items": [{"queue": "q", "data": {"a": 1}, "payload": 2},
                          {"queue": "q", "payload": [1, 2]},
                          {"queue": "q", "data": null},
                          {"queue": "q", "x": 1}]}"#,
        )
        .unwrap();
        let payloads: Vec<&[u8]> = got.iter().map(|i| i.frame.payload.as_slice()).collect();
        assert_eq!(payloads[0], br#"{"a": 1}"#);
        assert_eq!(payloads[1], b"[1, 2]");
        assert_eq!(payloads[2], b"null", "a present null is the payload");
        assert_eq!(payloads[3], br#"{"queue": "q", "x": 1}"#);
        assert_eq!(got[0].partition, DEFAULT_PARTITION);
        assert_eq!(
            got[0].frame.transaction_id,
            got[0].frame.message_id.to_string()
        );
    }

    #[test]
    fn bad_items_name_their_place() {
        let e = |j: &str| items(j).err().map(|f| f.message).unwrap_or_default();
        assert!(e(r#"{"items": [{"queue": "q"}, 5]}"#).contains("items[1] must be an object"));
        assert!(e(r#"{"items": [{"partition": "p"}]}"#).contains("queue is required"));
        assert!(e(r#"{"items": [{"queue": 5}]}"#).contains("items[0]"));
        assert!(e(r#"{"items": [{"queue": "q", "traceId": "x"}]}"#).contains("traceId"));
        assert!(e(r#"{"items": [{"queue": ""}]}"#).contains("queue"));
        assert!(e(r#"{"itemz": []}"#).contains("items"));
    }

    #[test]
    fn empty_bodies() {
        assert!(body::<ExtendBody>(b"", None).is_err());
        assert_eq!(
            body::<ExtendBody>(b"  ", Some("{}"))
                .unwrap()
                .seconds()
                .unwrap(),
            60
        );
        assert!(body::<ExtendBody>(b"{nope", None).is_err());
    }

    #[test]
    fn groups_are_checked_wherever_they_come_from() {
        assert_eq!(consumer_group(None).unwrap(), QUEUE_MODE_GROUP);
        assert_eq!(
            consumer_group(Some(String::new())).unwrap(),
            QUEUE_MODE_GROUP
        );
        assert!(consumer_group(Some("a\nb".into())).is_err());
        assert!(consumer_group(Some("x".repeat(MAX_NAME_BYTES + 1))).is_err());
    }

    #[test]
    fn configure_overwrites_with_defaults_and_refuses_bad_options() {
        let c: ConfigureBody =
            body(br#"{"queue": "a.b", "options": {"leaseTime": 5}}"#, None).unwrap();
        let c = c.into_config().unwrap();
        assert_eq!(c.lease_time_secs, 5);
        assert_eq!(c.retry_limit, QueueConfig::with_defaults("a.b").retry_limit);
        assert_eq!((c.namespace.as_str(), c.task.as_str()), ("a", "b"));
        assert!(body::<ConfigureBody>(br#"{"queue": "q", "options": {"ttl": -1}}"#, None).is_err());
        assert!(body::<ConfigureBody>(br#"{"queue": "q", "options": 3}"#, None).is_err());
    }
}
