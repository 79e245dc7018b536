//! Timers, sans-IO: a timer is an upsert on (queue, timerKey) holding a message that is pushed
//! to its queue exactly once and never before `deliverAt`, in the same transaction that removes
//! the timer row. Here: what a well-formed op is, the statuses, and the answers.
//!
//! A firing takes the timer's row lock and removes it with the push, so a schedule or cancel that
//! meets a firing waits for it and then finds the key absent: this broker answers `absent` (the
//! message was delivered) where a broker that claims before it commits would say `too_late`.

use base64::Engine;
use serde_json::{json, Map, Value};

use crate::time::format_iso_micros;
use crate::types::{validate_name, Timestamp};

/// The furthest a timer may be scheduled ahead.
pub const HORIZON_MS: i64 = 90 * 86_400 * 1000;
pub const MAX_KEY_BYTES: usize = 1024;
pub const MAX_PAYLOAD_BYTES: usize = 1024 * 1024;
/// Rows of one `GET /api/v1/timers/{queue}` page when no `limit` is named, and the clamp.
pub const LIST_DEFAULT_LIMIT: u32 = 100;
pub const LIST_MAX_LIMIT: u32 = 1000;

/// The longest a broker's timer worker sleeps without reading the earliest due time again (a
/// simulation sets one longer than its delivery bound, so only the event path can keep it).
pub const RESCAN_MS: u64 = 1000;

/// Bugs a simulation can re-introduce into the timer worker.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TimerBugs {
    /// The worker ignores its broker's schedules and finds due timers only at its re-scan: a due
    /// timer waits for the sweep.
    pub wait_for_rescan: bool,
}

/// Fields the broker owns: present in an op they are refused, never dropped in silence.
const SERVER_OWNED: &[&str] = &[
    "producerSub",
    "producer_sub",
    "messageId",
    "message_id",
    "tenant",
    "tenantId",
    "tenant_id",
    "deliverAt",
    "deliver_at",
    "delaySeconds",
    "delay_seconds",
    "attempts",
    "claimToken",
    "claim_token",
    "claimedUntil",
];

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TimerOp {
    /// `schedule` and `reschedule`: the same upsert.
    Schedule {
        queue: String,
        key: String,
        partition: String,
        /// The message's JSON payload.
        payload: Vec<u8>,
        delay_ms: i64,
        txn: String,
        /// Minted by the broker at schedule time: the delivered message's id.
        message_id: uuid::Uuid,
    },
    Cancel {
        queue: String,
        key: String,
        txn: Option<String>,
    },
}

impl TimerOp {
    /// The queue and timer key the op names.
    pub fn timer(&self) -> (&str, &str) {
        match self {
            TimerOp::Schedule { queue, key, .. } | TimerOp::Cancel { queue, key, .. } => {
                (queue, key)
            }
        }
    }

    /// The pending row a schedule stores when it runs at `now` (`None` for a cancel).
    pub fn scheduled_row(&self, now: Timestamp) -> Option<TimerRow> {
        match self {
            TimerOp::Schedule {
                partition,
                payload,
                delay_ms,
                txn,
                message_id,
                ..
            } => Some(TimerRow {
                partition: partition.clone(),
                payload: payload.clone(),
                txn: txn.clone(),
                message_id: *message_id,
                deliver_at: deliver_at(now, *delay_ms),
                created_at: now,
            }),
            TimerOp::Cancel { .. } => None,
        }
    }
}

/// A refused op: the client's error code and what is wrong, for a 400.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TimerInvalid {
    pub code: &'static str,
    pub message: String,
}

fn invalid(code: &'static str, message: impl Into<String>) -> TimerInvalid {
    TimerInvalid {
        code,
        message: message.into(),
    }
}

/// A stored timer, as both backends hold it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TimerRow {
    pub partition: String,
    pub payload: Vec<u8>,
    pub txn: String,
    pub message_id: uuid::Uuid,
    pub deliver_at: Timestamp,
    pub created_at: Timestamp,
}

/// A due timer, read for firing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DueTimer {
    pub queue: String,
    pub key: String,
    pub row: TimerRow,
}

/// Parses a call's ops; `mint` gives each schedule its message id. Any invalid op refuses the
/// whole call.
pub fn parse_ops(
    raw: &[Value],
    max_ops: usize,
    mut mint: impl FnMut() -> uuid::Uuid,
) -> Result<Vec<TimerOp>, TimerInvalid> {
    if raw.len() > max_ops {
        return Err(invalid(
            "timers_too_many_operations",
            format!(
                "{} operations in one call; the limit is {max_ops}",
                raw.len()
            ),
        ));
    }
    let ops = raw
        .iter()
        .enumerate()
        .map(|(i, op)| {
            parse_op(op, &mut mint).map_err(|e| TimerInvalid {
                code: e.code,
                message: format!("operations[{i}]: {}", e.message),
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    // One timer at most once per call (Queen's rule, which its clients rely on: a call's
    // outcome per timer is then one op's, whatever order the ops are applied in).
    let mut seen = std::collections::BTreeMap::new();
    for (i, op) in ops.iter().enumerate() {
        if let Some(first) = seen.insert(op.timer(), i) {
            let (queue, key) = op.timer();
            return Err(invalid(
                "timers_duplicate_key",
                format!(
                    "operations[{i}]: timer {key:?} of queue {queue:?} is also operations[{first}]: \
                     a timer may appear at most once per call"
                ),
            ));
        }
    }
    Ok(ops)
}

fn parse_op(raw: &Value, mint: &mut impl FnMut() -> uuid::Uuid) -> Result<TimerOp, TimerInvalid> {
    let obj = raw
        .as_object()
        .ok_or_else(|| invalid("timers_invalid_operation", "an operation is an object"))?;
    if let Some(field) = obj
        .keys()
        .find(|f| SERVER_OWNED.contains(&f.as_str()) || f.starts_with('_'))
    {
        return Err(invalid(
            "timers_server_owned_field",
            format!("{field} is the broker's to set; the wire carries only the relative delayMs"),
        ));
    }
    let queue = text(obj, "queue")?;
    validate_name("queue", &queue)
        .map_err(|e| invalid("timers_invalid_operation", e.to_string()))?;
    let key = timer_key(obj.get("timerKey"))?;
    match obj.get("op").and_then(Value::as_str) {
        Some("schedule" | "reschedule") => {
            let partition = match obj.get("partition") {
                None | Some(Value::Null) => "Default".to_string(),
                Some(_) => text(obj, "partition")?,
            };
            validate_name("partition", &partition)
                .map_err(|e| invalid("timers_invalid_operation", e.to_string()))?;
            let delay_ms = obj.get("delayMs").and_then(Value::as_i64).ok_or_else(|| {
                invalid(
                    "timers_invalid_operation",
                    "delayMs is required: a whole number of milliseconds",
                )
            })?;
            if delay_ms > HORIZON_MS {
                return Err(invalid(
                    "timers_delay_beyond_horizon",
                    format!("delayMs {delay_ms} is past the horizon of {HORIZON_MS} ms (90 days)"),
                ));
            }
            let txn = text(obj, "txn")?;
            Ok(TimerOp::Schedule {
                queue,
                key,
                partition,
                payload: payload(obj)?,
                delay_ms,
                txn,
                message_id: mint(),
            })
        }
        Some("cancel") => Ok(TimerOp::Cancel {
            queue,
            key,
            txn: match obj.get("txn") {
                None | Some(Value::Null) => None,
                Some(_) => Some(text(obj, "txn")?),
            },
        }),
        _ => Err(invalid(
            "timers_invalid_operation",
            "op must be schedule, reschedule or cancel",
        )),
    }
}

fn text(obj: &Map<String, Value>, field: &str) -> Result<String, TimerInvalid> {
    match obj.get(field) {
        Some(Value::String(s))
            if !s.is_empty() && s.len() <= MAX_KEY_BYTES && !s.chars().any(char::is_control) =>
        {
            Ok(s.clone())
        }
        _ => Err(invalid(
            "timers_invalid_operation",
            format!("{field} must be a non-empty string of at most {MAX_KEY_BYTES} bytes, without control characters"),
        )),
    }
}

/// A timer key from a body or a path.
pub fn timer_key(v: Option<&Value>) -> Result<String, TimerInvalid> {
    match v.and_then(Value::as_str) {
        Some(k) if !k.is_empty() && k.len() <= MAX_KEY_BYTES && !k.chars().any(char::is_control) => {
            Ok(k.to_string())
        }
        _ => Err(invalid(
            "timers_invalid_operation",
            format!("timerKey must be a non-empty string of at most {MAX_KEY_BYTES} bytes, without control characters"),
        )),
    }
}

/// The payload: base64 of the message's JSON (zstd-compressed first when `payloadZstd`).
fn payload(obj: &Map<String, Value>) -> Result<Vec<u8>, TimerInvalid> {
    let encoded = obj.get("payload").and_then(Value::as_str).ok_or_else(|| {
        invalid(
            "timers_invalid_payload",
            "payload is required: base64 of the message's JSON",
        )
    })?;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .map_err(|e| {
            invalid(
                "timers_invalid_payload",
                format!("payload is not base64: {e}"),
            )
        })?;
    let bytes = if obj.get("payloadZstd") == Some(&Value::Bool(true)) {
        zstd::bulk::decompress(&bytes, MAX_PAYLOAD_BYTES).map_err(|e| {
            invalid(
                "timers_invalid_payload",
                format!("payloadZstd: not a zstd frame within {MAX_PAYLOAD_BYTES} bytes: {e}"),
            )
        })?
    } else {
        bytes
    };
    if bytes.len() > MAX_PAYLOAD_BYTES {
        return Err(invalid(
            "timers_invalid_payload",
            format!(
                "payload of {} bytes; the limit is {MAX_PAYLOAD_BYTES}",
                bytes.len()
            ),
        ));
    }
    // A timer becomes a message, and a message's body is JSON.
    serde_json::from_slice::<&serde_json::value::RawValue>(&bytes).map_err(|e| {
        invalid(
            "timers_invalid_payload",
            format!("payload is not JSON: {e}"),
        )
    })?;
    Ok(bytes)
}

/// When a timer scheduled at `now` with `delay_ms` is due (a delay in the past is due at once).
pub fn deliver_at(now: Timestamp, delay_ms: i64) -> Timestamp {
    now.plus_millis(delay_ms.max(0))
}

/// The answer of a schedule: `scheduled`, or `rescheduled` when it replaced a pending timer.
pub fn scheduled(queue: &str, key: &str, row: &TimerRow, replaced: bool) -> Value {
    json!({"ok": true, "status": if replaced { "rescheduled" } else { "scheduled" },
           "queue": queue, "timerKey": key, "txn": row.txn, "messageId": row.message_id.to_string(),
           "deliverAt": format_iso_micros(row.deliver_at)})
}

/// The answer of a cancel: `cancelled`, or `absent` (no longer pending: it may have been
/// delivered; the caller's `txn` is echoed so it can look for it in the queue).
pub fn cancelled(queue: &str, key: &str, removed: Option<&TimerRow>, txn: Option<&str>) -> Value {
    match removed {
        Some(row) => json!({"ok": true, "status": "cancelled", "queue": queue, "timerKey": key,
                            "txn": row.txn, "messageId": row.message_id.to_string(),
                            "deliverAt": format_iso_micros(row.deliver_at)}),
        None => {
            json!({"ok": false, "status": "absent", "queue": queue, "timerKey": key, "txn": txn})
        }
    }
}

/// `GET /api/v1/timers/{queue}/{timerKey}`.
pub fn peek(queue: &str, key: &str, row: Option<&TimerRow>) -> Value {
    match row {
        Some(r) => json!({"found": true, "queue": queue, "timerKey": key, "partition": r.partition,
                          "txn": r.txn, "messageId": r.message_id.to_string(),
                          "deliverAt": format_iso_micros(r.deliver_at),
                          "createdAt": format_iso_micros(r.created_at),
                          "payload": base64::engine::general_purpose::STANDARD.encode(&r.payload),
                          "encrypted": false}),
        None => json!({"found": false}),
    }
}

/// One page of a queue's pending timers: `rows` holds up to `limit + 1` (the extra one says
/// there is more), in key order after the cursor.
pub fn page(queue: &str, rows: &[(String, TimerRow)], limit: u32) -> Value {
    let truncated = rows.len() > limit as usize;
    let out: Vec<Value> = rows
        .iter()
        .take(limit as usize)
        .map(|(k, r)| {
            json!({"queue": queue, "timerKey": k, "partition": r.partition, "txn": r.txn,
                   "messageId": r.message_id.to_string(), "deliverAt": format_iso_micros(r.deliver_at)})
        })
        .collect();
    let next_after = if truncated {
        out.last()
            .map(|r| r["timerKey"].clone())
            .unwrap_or(Value::Null)
    } else {
        Value::Null
    };
    json!({"rows": out, "truncated": truncated, "nextAfter": next_after})
}

/// A list page's limit: clamped, never refused.
pub fn list_limit(requested: Option<i64>) -> u32 {
    requested.map_or(LIST_DEFAULT_LIMIT, |n| {
        n.clamp(1, i64::from(LIST_MAX_LIMIT)) as u32
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(v: Value) -> Result<TimerOp, &'static str> {
        parse_ops(&[v], 256, uuid::Uuid::nil)
            .map(|mut ops| ops.remove(0))
            .map_err(|e| e.code)
    }

    #[test]
    fn a_timer_appears_at_most_once_per_call() {
        let b64 = base64::engine::general_purpose::STANDARD.encode(b"{}");
        let schedule = |key: &str| json!({"op":"schedule","queue":"q","timerKey":key,"payload":b64,"delayMs":5,"txn":"t"});
        let cancel = json!({"op":"cancel","queue":"q","timerKey":"k"});
        let codes = |ops: &[Value]| {
            parse_ops(ops, 256, uuid::Uuid::nil)
                .map(|o| o.len())
                .map_err(|e| e.code)
        };
        assert_eq!(codes(&[schedule("k"), schedule("j")]), Ok(2));
        assert_eq!(
            codes(&[schedule("k"), schedule("k")]),
            Err("timers_duplicate_key")
        );
        assert_eq!(codes(&[schedule("k"), cancel]), Err("timers_duplicate_key"));
        let other_queue = json!({"op":"cancel","queue":"r","timerKey":"k"});
        assert_eq!(codes(&[schedule("k"), other_queue]), Ok(2));
    }

    #[test]
    fn ops_are_validated_whole() {
        let b64 = base64::engine::general_purpose::STANDARD.encode(b"{\"a\":1}");
        assert!(parse(
            json!({"op":"schedule","queue":"q","timerKey":"k","payload":b64,"delayMs":5,"txn":"t"})
        )
        .is_ok());
        assert_eq!(
            parse(
                json!({"op":"schedule","queue":"q","timerKey":"k","payload":b64,"delayMs":HORIZON_MS + 1,"txn":"t"})
            ),
            Err("timers_delay_beyond_horizon")
        );
        assert_eq!(
            parse(
                json!({"op":"schedule","queue":"q","timerKey":"k","payload":b64,"delayMs":5,"txn":"t","deliverAt":"x"})
            ),
            Err("timers_server_owned_field")
        );
        let not_json = base64::engine::general_purpose::STANDARD.encode(b"{nope");
        assert_eq!(
            parse(
                json!({"op":"schedule","queue":"q","timerKey":"k","payload":not_json,"delayMs":5,"txn":"t"})
            ),
            Err("timers_invalid_payload")
        );
        assert!(matches!(
            parse(json!({"op":"cancel","queue":"q","timerKey":"k"})),
            Ok(TimerOp::Cancel { txn: None, .. })
        ));
        assert_eq!(deliver_at(Timestamp(0), -5), Timestamp(0));
    }
}
