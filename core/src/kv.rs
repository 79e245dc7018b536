//! The key/value store's rules, sans-IO: what a well-formed op is, when a key is live, which
//! verdict an op gets against a key's current row, and how answers look on the wire. Both
//! backends read the row under its lock, ask [`decide`], and carry out the write it names; the
//! version of a write comes from one counter that never repeats (PostgreSQL: a sequence), so a
//! key's version rises with every write of it, across deletes and expiries, and a
//! compare-and-set can never succeed against a recycled version.

use serde_json::{json, Map, Value};

use crate::time::format_iso_micros;
use crate::types::Timestamp;

/// The namespace of lock and semaphore permits: written only by `POST /api/v1/locks`.
pub const LOCKS_NAMESPACE: &str = "queen-locks";

/// Size limits of the KV surface (settings; these are the defaults).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvLimits {
    /// Operations per call (a batch, or a transaction's `kv` rider).
    pub max_ops: usize,
    pub max_namespace_bytes: usize,
    pub max_key_bytes: usize,
    /// A value's JSON text.
    pub max_value_bytes: usize,
    /// Keys of one `getMany`.
    pub max_keys: usize,
    /// `getPrefix` rows when the op names no `limit`, and the ceiling a larger one is clamped to.
    pub prefix_default_limit: u32,
    pub prefix_max_limit: u32,
    /// Value bytes one `getMany` or `getPrefix` answer carries before it says `truncated`.
    pub answer_budget_bytes: usize,
    /// The longest `ttlSeconds`.
    pub max_ttl_seconds: u64,
}

impl Default for KvLimits {
    fn default() -> Self {
        KvLimits {
            max_ops: 256,
            max_namespace_bytes: 128,
            max_key_bytes: 1024,
            max_value_bytes: 256 * 1024,
            max_keys: 256,
            prefix_default_limit: 100,
            prefix_max_limit: 1000,
            answer_budget_bytes: 4 * 1024 * 1024,
            max_ttl_seconds: 10 * 366 * 86_400,
        }
    }
}

/// How long a written key lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expiry {
    Ttl(u64),
    Forever,
}

impl Expiry {
    pub fn at(self, now: Timestamp) -> Option<Timestamp> {
        match self {
            // Bounded by `max_ttl_seconds`, so this cannot overflow.
            Expiry::Ttl(s) => Some(Timestamp(now.0 + (s as i64) * 1_000_000)),
            Expiry::Forever => None,
        }
    }
}

/// One KV operation, validated.
#[derive(Clone, Debug, PartialEq)]
pub enum KvOp {
    Get {
        ns: String,
        key: String,
    },
    GetMany {
        ns: String,
        keys: Vec<String>,
    },
    GetPrefix {
        ns: String,
        prefix: String,
        after: Option<String>,
        limit: u32,
        keys_only: bool,
    },
    /// `put` and `putIfAbsent` (which is `put` with `expect: 0`, kept apart for its name).
    Put {
        ns: String,
        key: String,
        value: Value,
        expiry: Expiry,
        expect: Option<i64>,
        required: bool,
    },
    Delete {
        ns: String,
        key: String,
        expect: Option<i64>,
        required: bool,
    },
    Check {
        ns: String,
        key: String,
        expect: i64,
        required: bool,
    },
    Incr {
        ns: String,
        key: String,
        delta: i64,
        min: Option<i64>,
        max: Option<i64>,
        expiry: Expiry,
        required: bool,
    },
}

impl KvOp {
    pub fn namespace(&self) -> &str {
        match self {
            KvOp::Get { ns, .. }
            | KvOp::GetMany { ns, .. }
            | KvOp::GetPrefix { ns, .. }
            | KvOp::Put { ns, .. }
            | KvOp::Delete { ns, .. }
            | KvOp::Check { ns, .. }
            | KvOp::Incr { ns, .. } => ns,
        }
    }

    /// The one key a single-key op reads or writes.
    pub fn key(&self) -> Option<&str> {
        match self {
            KvOp::Get { key, .. }
            | KvOp::Put { key, .. }
            | KvOp::Delete { key, .. }
            | KvOp::Check { key, .. }
            | KvOp::Incr { key, .. } => Some(key),
            KvOp::GetMany { .. } | KvOp::GetPrefix { .. } => None,
        }
    }

    /// Whether a verdict of `applied: false` rolls back the whole call.
    pub fn required(&self) -> bool {
        match self {
            KvOp::Put { required, .. }
            | KvOp::Delete { required, .. }
            | KvOp::Check { required, .. }
            | KvOp::Incr { required, .. } => *required,
            _ => false,
        }
    }

    /// Whether the op can write: it takes the key's row lock.
    pub fn writes(&self) -> bool {
        matches!(
            self,
            KvOp::Put { .. } | KvOp::Delete { .. } | KvOp::Incr { .. }
        )
    }

    /// Whether the op reads its key under the row lock (a write, or a check that must still
    /// hold when its transaction commits).
    pub fn locks_row(&self) -> bool {
        self.writes() || matches!(self, KvOp::Check { .. })
    }
}

/// A refused op: the client's error code and what is wrong, for a 400.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KvInvalid {
    pub code: &'static str,
    pub message: String,
}

fn invalid(code: &'static str, message: impl Into<String>) -> KvInvalid {
    KvInvalid {
        code,
        message: message.into(),
    }
}

/// A key's stored row, as both backends hold it.
#[derive(Clone, Debug, PartialEq)]
pub struct KvRow {
    pub value: Value,
    pub version: i64,
    pub expires_at: Option<Timestamp>,
    pub updated_at: Timestamp,
}

impl KvRow {
    /// A key is absent from the instant it expires, whether or not its row was swept.
    pub fn live(&self, now: Timestamp) -> bool {
        self.expires_at.is_none_or(|at| at > now)
    }
}

/// What a single-key op does to its key, given the key's row.
#[derive(Clone, Debug, PartialEq)]
pub enum Decision {
    /// Nothing to write: the answer is final. `refused` is an `applied: false` verdict.
    Answer { answer: Value, refused: bool },
    /// Write the key; the answer is [`written`] once the storage has minted the version.
    Write {
        value: Value,
        expires_at: Option<Timestamp>,
    },
    /// Remove the key's row; the answer is final.
    Delete { answer: Value },
}

/// Parses and validates a call's `operations`. Any invalid op refuses the whole call.
pub fn parse_ops(raw: &[Value], limits: &KvLimits) -> Result<Vec<KvOp>, KvInvalid> {
    if raw.len() > limits.max_ops {
        return Err(invalid(
            "kv_too_many_operations",
            format!(
                "{} operations in one call; the limit is {}",
                raw.len(),
                limits.max_ops
            ),
        ));
    }
    raw.iter()
        .enumerate()
        .map(|(i, op)| {
            parse_op(op, limits).map_err(|e| KvInvalid {
                code: e.code,
                message: format!("operations[{i}]: {}", e.message),
            })
        })
        .collect()
}

/// Parses one op.
pub fn parse_op(raw: &Value, limits: &KvLimits) -> Result<KvOp, KvInvalid> {
    let Some(obj) = raw.as_object() else {
        return Err(invalid("kv_invalid_operation", "an operation is an object"));
    };
    let op = obj
        .get("op")
        .and_then(Value::as_str)
        .ok_or_else(|| invalid("kv_invalid_operation", "op is required"))?;
    let ns = namespace(obj, limits)?;
    let required = flag(obj, "required")?;
    let parsed = match op {
        "get" => KvOp::Get {
            ns,
            key: key(obj, "key", limits)?,
        },
        "getMany" => get_many(obj, ns, limits)?,
        "getPrefix" => get_prefix(obj, ns, limits)?,
        "put" | "putIfAbsent" => put(obj, op, ns, required, limits)?,
        "delete" => KvOp::Delete {
            key: key(obj, "key", limits)?,
            ns,
            expect: expect(obj)?,
            required,
        },
        "check" => KvOp::Check {
            key: key(obj, "key", limits)?,
            ns,
            expect: expect(obj)?.ok_or_else(|| {
                invalid(
                    "kv_invalid_operation",
                    "check needs expect: the version the key must be at, or 0 for absent",
                )
            })?,
            required,
        },
        "incr" => incr(obj, ns, required, limits)?,
        other => {
            return Err(invalid(
                "kv_invalid_operation",
                format!(
                    "unknown op {other:?} (get, getMany, getPrefix, put, putIfAbsent, delete, check, incr)"
                ),
            ))
        }
    };
    Ok(parsed)
}

/// `getMany`: 1 to `max_keys` keys.
fn get_many(obj: &Map<String, Value>, ns: String, limits: &KvLimits) -> Result<KvOp, KvInvalid> {
    let keys = obj
        .get("keys")
        .and_then(Value::as_array)
        .ok_or_else(|| invalid("kv_invalid_operation", "getMany needs keys: [..]"))?;
    if keys.is_empty() || keys.len() > limits.max_keys {
        return Err(invalid(
            "kv_invalid_operation",
            format!("getMany takes 1 to {} keys", limits.max_keys),
        ));
    }
    let keys = keys
        .iter()
        .map(|k| key_text(k, "keys[]", limits))
        .collect::<Result<_, _>>()?;
    Ok(KvOp::GetMany { ns, keys })
}

/// `getPrefix`: a non-empty prefix, a page after a key, a clamped limit.
fn get_prefix(obj: &Map<String, Value>, ns: String, limits: &KvLimits) -> Result<KvOp, KvInvalid> {
    let prefix = match obj.get("prefix") {
        Some(Value::String(p)) if !p.is_empty() => p.clone(),
        _ => {
            return Err(invalid(
                "kv_prefix_required",
                "getPrefix needs a non-empty prefix: a namespace is not a table to enumerate",
            ))
        }
    };
    if prefix.len() > limits.max_key_bytes {
        return Err(invalid(
            "kv_key_too_long",
            format!("prefix longer than {} bytes", limits.max_key_bytes),
        ));
    }
    let after = match obj.get("after") {
        None | Some(Value::Null) => None,
        Some(v) => Some(key_text(v, "after", limits)?),
    };
    // Clamped, never refused: a too-high limit is not the caller's error to fix.
    let limit = match obj.get("limit") {
        None | Some(Value::Null) => limits.prefix_default_limit,
        Some(v) => {
            let n = v
                .as_i64()
                .ok_or_else(|| invalid("kv_invalid_operation", "limit must be an integer"))?;
            n.clamp(1, i64::from(limits.prefix_max_limit)) as u32
        }
    };
    Ok(KvOp::GetPrefix {
        ns,
        prefix,
        after,
        limit,
        keys_only: flag(obj, "keysOnly")?,
    })
}

/// `put` and `putIfAbsent` (put with expect 0): a value within the size limit, without NUL.
fn put(
    obj: &Map<String, Value>,
    op: &str,
    ns: String,
    required: bool,
    limits: &KvLimits,
) -> Result<KvOp, KvInvalid> {
    let value = obj
        .get("value")
        .cloned()
        .ok_or_else(|| invalid("kv_invalid_operation", format!("{op} needs a value")))?;
    let text = value.to_string();
    if text.contains("\\u0000") {
        return Err(invalid(
            "kv_invalid_value",
            "a value's strings cannot hold the NUL character",
        ));
    }
    let size = text.len();
    if size > limits.max_value_bytes {
        return Err(invalid(
            "kv_value_too_large",
            format!(
                "value of {size} bytes; the limit is {}",
                limits.max_value_bytes
            ),
        ));
    }
    let mut expect = expect(obj)?;
    if op == "putIfAbsent" {
        if expect.is_some_and(|e| e != 0) {
            return Err(invalid(
                "kv_invalid_operation",
                "putIfAbsent is put with expect 0; a different expect contradicts it",
            ));
        }
        expect = Some(0);
    }
    Ok(KvOp::Put {
        key: key(obj, "key", limits)?,
        ns,
        value,
        expiry: expiry(obj, limits)?,
        expect,
        required,
    })
}

/// `incr`: a delta (default 1), optional bounds, no expect.
fn incr(
    obj: &Map<String, Value>,
    ns: String,
    required: bool,
    limits: &KvLimits,
) -> Result<KvOp, KvInvalid> {
    if obj.contains_key("expect") {
        return Err(invalid(
            "kv_invalid_operation",
            "incr takes no expect: it is the atomic way out of a compare-and-set loop",
        ));
    }
    let delta = match obj.get("delta") {
        None => 1,
        Some(v) => integer(v, "delta")?,
    };
    let bound = |name: &str| match obj.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => integer(v, name).map(Some),
    };
    let (min, max) = (bound("min")?, bound("max")?);
    if let (Some(lo), Some(hi)) = (min, max) {
        if lo > hi {
            return Err(invalid("kv_invalid_operation", "min is above max"));
        }
    }
    Ok(KvOp::Incr {
        key: key(obj, "key", limits)?,
        ns,
        delta,
        min,
        max,
        expiry: expiry(obj, limits)?,
        required,
    })
}

fn namespace(obj: &Map<String, Value>, limits: &KvLimits) -> Result<String, KvInvalid> {
    let ns = match obj.get("ns") {
        Some(Value::String(s)) if !s.is_empty() => s,
        _ => {
            return Err(invalid(
                "kv_invalid_namespace",
                "ns must be a non-empty string",
            ))
        }
    };
    if ns.len() > limits.max_namespace_bytes {
        return Err(invalid(
            "kv_invalid_namespace",
            format!("ns longer than {} bytes", limits.max_namespace_bytes),
        ));
    }
    if !ns
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':' | '/'))
    {
        return Err(invalid(
            "kv_invalid_namespace",
            "ns may hold letters, digits and - _ . : / only",
        ));
    }
    Ok(ns.clone())
}

fn key(obj: &Map<String, Value>, field: &str, limits: &KvLimits) -> Result<String, KvInvalid> {
    match obj.get(field) {
        Some(v) => key_text(v, field, limits),
        None => Err(invalid("kv_invalid_key", format!("{field} is required"))),
    }
}

fn key_text(v: &Value, field: &str, limits: &KvLimits) -> Result<String, KvInvalid> {
    let Some(k) = v.as_str().filter(|k| !k.is_empty()) else {
        return Err(invalid(
            "kv_invalid_key",
            format!("{field} must be a non-empty string"),
        ));
    };
    if k.len() > limits.max_key_bytes {
        return Err(invalid(
            "kv_key_too_long",
            format!("{field} longer than {} bytes", limits.max_key_bytes),
        ));
    }
    if k.chars().any(char::is_control) {
        return Err(invalid(
            "kv_invalid_key",
            format!("{field} holds a control character"),
        ));
    }
    Ok(k.to_string())
}

fn flag(obj: &Map<String, Value>, field: &str) -> Result<bool, KvInvalid> {
    match obj.get(field) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(invalid(
            "kv_invalid_operation",
            format!("{field} must be a boolean"),
        )),
    }
}

fn integer(v: &Value, field: &str) -> Result<i64, KvInvalid> {
    v.as_i64().ok_or_else(|| {
        invalid(
            "kv_invalid_operation",
            format!("{field} must be a whole number"),
        )
    })
}

fn expect(obj: &Map<String, Value>) -> Result<Option<i64>, KvInvalid> {
    match obj.get("expect") {
        None => Ok(None),
        Some(Value::Null) => Err(invalid(
            "kv_invalid_operation",
            "expect: null is not an unconditional write; omit it, or send 0 for \"must not exist\"",
        )),
        Some(v) => match v.as_i64() {
            Some(e) if e >= 0 => Ok(Some(e)),
            _ => Err(invalid(
                "kv_invalid_operation",
                "expect must be a version (a whole number, 0 for \"must not exist\")",
            )),
        },
    }
}

/// Exactly one of `ttlSeconds` (a positive whole number) and `forever: true`.
fn expiry(obj: &Map<String, Value>, limits: &KvLimits) -> Result<Expiry, KvInvalid> {
    let ttl = obj.get("ttlSeconds").filter(|v| !v.is_null());
    let forever = obj.get("forever").filter(|v| !v.is_null());
    match (ttl, forever) {
        (Some(t), None) => match t.as_u64() {
            Some(s) if s > 0 && s <= limits.max_ttl_seconds => Ok(Expiry::Ttl(s)),
            Some(s) if s > limits.max_ttl_seconds => Err(invalid(
                "kv_invalid_ttl",
                format!("ttlSeconds above {}", limits.max_ttl_seconds),
            )),
            _ => Err(invalid(
                "kv_invalid_ttl",
                "ttlSeconds must be a whole number above zero",
            )),
        },
        (None, Some(Value::Bool(true))) => Ok(Expiry::Forever),
        (None, Some(_)) => Err(invalid(
            "kv_invalid_ttl",
            "forever must be true when given; omit it otherwise",
        )),
        _ => Err(invalid(
            "kv_expiry_not_specified",
            "every write declares exactly one expiry: ttlSeconds or forever: true",
        )),
    }
}

fn iso(t: Option<Timestamp>) -> Value {
    t.map_or(Value::Null, |t| Value::String(format_iso_micros(t)))
}

/// A found key as `get`, `getMany` and `getPrefix` render it.
pub fn row_answer(key: &str, row: &KvRow) -> Value {
    json!({"key": key, "value": row.value, "version": row.version,
           "expiresAt": iso(row.expires_at), "updatedAt": iso(Some(row.updated_at))})
}

/// An `applied: false` verdict, with what a reader would see of the key.
fn refused(key: &str, reason: &str, live: Option<&KvRow>) -> Decision {
    let mut answer = json!({"applied": false, "reason": reason, "key": key});
    match live {
        Some(row) => {
            answer["value"] = row.value.clone();
            answer["version"] = json!(row.version);
            answer["expiresAt"] = iso(row.expires_at);
        }
        // No row: version 0, what `expect` names an absent key by.
        None if reason == "absent" => answer["version"] = json!(0),
        None => {}
    }
    Decision::Answer {
        answer,
        refused: true,
    }
}

/// An `expect` precondition against the key's live row: `None` when it holds, else the reason.
fn precondition(expect: i64, live: Option<&KvRow>) -> Option<&'static str> {
    match (expect, live) {
        (0, None) => None,
        (0, Some(_)) => Some("exists"),
        (_, None) => Some("absent"),
        (e, Some(row)) if row.version == e => None,
        (_, Some(_)) => Some("version"),
    }
}

/// Whether `decide` answers a write of the op's value whatever the key holds (a put without a
/// precondition): a backend may then write without reading the row first.
pub fn writes_whatever_the_row(op: &KvOp) -> bool {
    matches!(op, KvOp::Put { expect: None, .. })
}

/// The verdict of a single-key op, given the key's row (live or not) at `now`.
pub fn decide(op: &KvOp, row: Option<&KvRow>, now: Timestamp) -> Decision {
    let live = row.filter(|r| r.live(now));
    match op {
        KvOp::Get { key, .. } => Decision::Answer {
            answer: match live {
                Some(r) => {
                    let mut a = row_answer(key, r);
                    a["found"] = json!(true);
                    a
                }
                None => json!({"found": false, "key": key}),
            },
            refused: false,
        },
        KvOp::Put {
            key,
            value,
            expiry,
            expect,
            ..
        } => match expect.and_then(|e| precondition(e, live)) {
            Some(reason) => refused(key, reason, live),
            None => Decision::Write {
                value: value.clone(),
                expires_at: expiry.at(now),
            },
        },
        KvOp::Delete { key, expect, .. } => {
            if let Some(reason) = expect.and_then(|e| precondition(e, live)) {
                return refused(key, reason, live);
            }
            match live {
                Some(r) => Decision::Delete {
                    answer: json!({"applied": true, "key": key, "version": r.version}),
                },
                None => refused(key, "absent", None),
            }
        }
        KvOp::Check { key, expect, .. } => match precondition(*expect, live) {
            Some(reason) => refused(key, reason, live),
            None => {
                let mut answer = json!({"applied": true, "key": key});
                if let Some(r) = live {
                    answer["value"] = r.value.clone();
                    answer["version"] = json!(r.version);
                }
                Decision::Answer {
                    answer,
                    refused: false,
                }
            }
        },
        KvOp::Incr {
            key,
            delta,
            min,
            max,
            expiry,
            ..
        } => {
            // An absent or expired key counts as zero and starts a new window with the op's
            // expiry; a live one keeps its expiry, or a fixed-window limiter on a busy key
            // would never close its window.
            let (current, expires_at) = match live {
                Some(r) => match r.value.as_i64() {
                    Some(n) => (n, r.expires_at),
                    None => return refused(key, "type", live),
                },
                None => (0, expiry.at(now)),
            };
            match current.checked_add(*delta) {
                Some(next)
                    if min.is_none_or(|lo| next >= lo) && max.is_none_or(|hi| next <= hi) =>
                {
                    Decision::Write {
                        value: json!(next),
                        expires_at,
                    }
                }
                _ => refused(key, "limit", live),
            }
        }
        KvOp::GetMany { .. } | KvOp::GetPrefix { .. } => {
            unreachable!("decide takes single-key ops; multi-key reads use the answer builders")
        }
    }
}

/// The answer of a write once the storage has stored `row`.
pub fn written(key: &str, row: &KvRow) -> Value {
    json!({"applied": true, "key": key, "value": row.value, "version": row.version,
           "expiresAt": iso(row.expires_at)})
}

/// `getMany`: the live rows in the order asked, the keys without one, and `truncated` when the
/// answer budget ran out (keys past it appear in neither list).
pub fn get_many_answer(
    keys: &[String],
    rows: &[Option<KvRow>],
    now: Timestamp,
    limits: &KvLimits,
) -> Value {
    let (mut found, mut missing, mut spent) = (vec![], vec![], 0usize);
    for (key, row) in keys.iter().zip(rows) {
        match row.as_ref().filter(|r| r.live(now)) {
            Some(r) => {
                spent += r.value.to_string().len();
                if spent > limits.answer_budget_bytes && !found.is_empty() {
                    return json!({"rows": found, "missing": missing, "truncated": true});
                }
                found.push(row_answer(key, r));
            }
            None => missing.push(json!(key)),
        }
    }
    json!({"rows": found, "missing": missing, "truncated": false})
}

/// `getPrefix`: `rows` are the live rows after the cursor in key order, at most `limit + 1`
/// (the extra one says there is more).
pub fn prefix_answer(
    rows: &[(String, KvRow)],
    limit: u32,
    keys_only: bool,
    limits: &KvLimits,
) -> Value {
    let (mut out, mut spent) = (vec![], 0usize);
    let mut truncated = rows.len() > limit as usize;
    for (key, row) in rows.iter().take(limit as usize) {
        if !keys_only {
            spent += row.value.to_string().len();
            if spent > limits.answer_budget_bytes && !out.is_empty() {
                truncated = true;
                break;
            }
        }
        out.push(if keys_only {
            json!({"key": key, "version": row.version})
        } else {
            row_answer(key, row)
        });
    }
    let next_after = if truncated {
        out.last().map(|r| r["key"].clone()).unwrap_or(Value::Null)
    } else {
        Value::Null
    };
    json!({"rows": out, "truncated": truncated, "nextAfter": next_after})
}

/// The smallest string above every string that starts with `prefix` (in byte order, which is
/// code-point order in UTF-8), or `None` when there is none: a range scan's upper bound.
pub fn prefix_upper_bound(prefix: &str) -> Option<String> {
    let mut chars: Vec<char> = prefix.chars().collect();
    while let Some(last) = chars.pop() {
        let mut next = last as u32 + 1;
        if (0xD800..=0xDFFF).contains(&next) {
            next = 0xE000;
        }
        if let Some(c) = char::from_u32(next) {
            chars.push(c);
            return Some(chars.into_iter().collect());
        }
    }
    None
}

/// Whether the `getPrefix` cursor and prefix admit `key`.
pub fn in_prefix_page(key: &str, prefix: &str, after: Option<&str>) -> bool {
    key.starts_with(prefix) && after.is_none_or(|a| key > a)
}

/// The outcome of a KV batch: index-aligned answers, or the first required op that was refused
/// (everything then rolled back).
#[derive(Clone, Debug, PartialEq)]
pub struct KvBatch {
    pub results: Vec<Value>,
    pub failed: Option<usize>,
}

/// The answers of a rolled-back batch: the refused op's own verdict, and every other write
/// marked as not applied (nothing of the call was stored).
pub fn rolled_back(results: Vec<Value>, ops: &[KvOp], failed: usize) -> Vec<Value> {
    results
        .into_iter()
        .zip(ops)
        .enumerate()
        .map(|(i, (answer, op))| {
            if i != failed && op.writes() && answer["applied"] == true {
                json!({"applied": false, "reason": "rolled_back", "key": answer["key"]})
            } else {
                answer
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(v: Value) -> KvOp {
        parse_op(&v, &KvLimits::default()).expect("valid op")
    }

    fn row(value: Value, version: i64, expires_at: Option<i64>) -> KvRow {
        KvRow {
            value,
            version,
            expires_at: expires_at.map(Timestamp::from_secs),
            updated_at: Timestamp::from_secs(1),
        }
    }

    #[test]
    fn every_write_declares_exactly_one_expiry() {
        let l = KvLimits::default();
        let code = |v: Value| parse_op(&v, &l).map(|_| ()).map_err(|e| e.code);
        assert_eq!(
            code(json!({"op":"put","ns":"a","key":"k","value":1})),
            Err("kv_expiry_not_specified")
        );
        assert_eq!(
            code(json!({"op":"put","ns":"a","key":"k","value":1,"ttlSeconds":5,"forever":true})),
            Err("kv_expiry_not_specified")
        );
        assert_eq!(
            code(json!({"op":"put","ns":"a","key":"k","value":1,"ttlSeconds":0})),
            Err("kv_invalid_ttl")
        );
        assert_eq!(
            code(json!({"op":"getPrefix","ns":"a","prefix":""})),
            Err("kv_prefix_required")
        );
        assert_eq!(
            code(json!({"op":"put","ns":"a","key":"k","value":1,"forever":true,"expect":null})),
            Err("kv_invalid_operation")
        );
        assert!(code(json!({"op":"put","ns":"a","key":"k","value":1,"forever":true})).is_ok());
    }

    #[test]
    fn a_put_without_precondition_writes_whatever_the_row() {
        let now = Timestamp(100);
        let put = op(json!({"op":"put","ns":"a","key":"k","value":2,"ttlSeconds":9}));
        assert!(writes_whatever_the_row(&put));
        for r in [
            None,
            Some(row(json!(1), 3, Some(50))),
            Some(row(json!(1), 3, None)),
        ] {
            assert_eq!(
                decide(&put, r.as_ref(), now),
                Decision::Write {
                    value: json!(2),
                    expires_at: Some(Timestamp(100 + 9_000_000))
                }
            );
        }
        let guarded =
            op(json!({"op":"put","ns":"a","key":"k","value":2,"ttlSeconds":9,"expect":3}));
        assert!(!writes_whatever_the_row(&guarded));
    }

    #[test]
    fn preconditions_follow_the_live_row() {
        let now = Timestamp::from_secs(100);
        let put0 = op(json!({"op":"putIfAbsent","ns":"a","key":"k","value":2,"forever":true}));
        // An expired row is absent: putIfAbsent wins against it.
        assert!(matches!(
            decide(&put0, Some(&row(json!(1), 3, Some(50))), now),
            Decision::Write { .. }
        ));
        match decide(&put0, Some(&row(json!(1), 3, Some(500))), now) {
            Decision::Answer { answer, refused } => {
                assert!(refused);
                assert_eq!(answer["reason"], "exists");
                assert_eq!(answer["version"], 3);
            }
            other => panic!("{other:?}"),
        }
        let put3 = op(json!({"op":"put","ns":"a","key":"k","value":2,"ttlSeconds":9,"expect":3}));
        assert!(matches!(
            decide(&put3, Some(&row(json!(1), 4, None)), now),
            Decision::Answer { refused: true, .. }
        ));
        assert!(matches!(
            decide(&put3, None, now),
            Decision::Answer { refused: true, .. }
        ));
    }

    #[test]
    fn incr_with_max_admits_or_refuses_without_spending() {
        let now = Timestamp::from_secs(100);
        let incr = op(json!({"op":"incr","ns":"a","key":"k","max":2,"ttlSeconds":60}));
        // Absent: starts the window with the op's expiry.
        assert_eq!(
            decide(&incr, None, now),
            Decision::Write {
                value: json!(1),
                expires_at: Some(Timestamp::from_secs(160))
            }
        );
        // Live: keeps its expiry.
        assert_eq!(
            decide(&incr, Some(&row(json!(1), 5, Some(130))), now),
            Decision::Write {
                value: json!(2),
                expires_at: Some(Timestamp::from_secs(130))
            }
        );
        match decide(&incr, Some(&row(json!(2), 6, Some(130))), now) {
            Decision::Answer { answer, refused } => {
                assert!(refused);
                assert_eq!(answer["reason"], "limit");
                assert_eq!(answer["value"], 2);
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            decide(&incr, Some(&row(json!("x"), 6, None)), now),
            Decision::Answer { refused: true, .. }
        ));
    }

    #[test]
    fn prefix_bounds_cover_exactly_the_prefix() {
        assert_eq!(prefix_upper_bound("ab").as_deref(), Some("ac"));
        assert_eq!(prefix_upper_bound("a\u{10FFFF}").as_deref(), Some("b"));
        assert_eq!(prefix_upper_bound("\u{10FFFF}"), None);
        assert_eq!(prefix_upper_bound("\u{D7FF}").as_deref(), Some("\u{E000}"));
    }
}
