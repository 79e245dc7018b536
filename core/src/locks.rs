//! Locks and semaphores, sans-IO: a permit is a KV row `name#slot` in namespace `queen-locks`
//! whose value names its owner, and its fencing token is the row's version. Versions come from
//! the one KV counter that never repeats, so a lock's token only rises, across holders, slots,
//! expiries and brokers: a resource that keeps the highest token it saw refuses a replaced holder.
//!
//! Each op runs in its own transaction; an acquire serializes the callers of one name (an
//! advisory lock on [`advisory_key`]) so that "is there a free slot?" and taking it are one step.

use serde_json::{json, Map, Value};

use crate::kv::{KvRow, LOCKS_NAMESPACE};
use crate::time::format_iso_micros;
use crate::types::Timestamp;

pub const MAX_NAME_BYTES: usize = 256;
pub const MAX_OWNER_BYTES: usize = 256;
pub const MAX_LIMIT: u32 = 1024;
/// A permit's longest lifetime: a holder that needs longer renews.
pub const MAX_TTL_SECONDS: u64 = 86_400;

/// One lock operation, validated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LockOp {
    Acquire {
        name: String,
        ttl_seconds: u64,
        /// `None`: the broker mints one (the answer names it).
        owner: Option<String>,
        limit: u32,
    },
    Renew {
        name: String,
        token: i64,
        slot: u32,
        ttl_seconds: u64,
        /// The holder renewing, when it says: a renew whose answer was lost is sent again with
        /// the token before it, and the permit still names this owner (`renew_holds`).
        owner: Option<String>,
    },
    Release {
        name: String,
        token: i64,
        slot: u32,
    },
    Get {
        name: String,
    },
}

impl LockOp {
    pub fn name(&self) -> &str {
        match self {
            LockOp::Acquire { name, .. }
            | LockOp::Renew { name, .. }
            | LockOp::Release { name, .. }
            | LockOp::Get { name } => name,
        }
    }
}

/// The KV key of a permit.
pub fn permit_key(name: &str, slot: u32) -> String {
    format!("{name}#{slot}")
}

/// The slot of a permit's KV key of lock `name`, if it is one.
pub fn slot_of(name: &str, key: &str) -> Option<u32> {
    key.strip_prefix(name)?.strip_prefix('#')?.parse().ok()
}

/// The transaction-scoped advisory lock that serializes acquires of one name (FNV-1a of the
/// name, so both backends and every broker compute the same number).
pub fn advisory_key(name: &str) -> i64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in b"queen-locks/".iter().chain(name.as_bytes()) {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h as i64
}

/// Parses one op; the error is the 400's message.
pub fn parse_op(raw: &Value) -> Result<LockOp, String> {
    let obj = raw
        .as_object()
        .ok_or_else(|| "an operation is an object".to_string())?;
    let name = name(obj)?;
    match obj.get("op").and_then(Value::as_str) {
        Some("acquire") => {
            let owner = optional_owner(obj)?;
            let limit = match obj.get("limit") {
                None | Some(Value::Null) => 1,
                Some(v) => v
                    .as_u64()
                    .filter(|l| (1..=u64::from(MAX_LIMIT)).contains(l))
                    .ok_or_else(|| format!("limit is a whole number from 1 to {MAX_LIMIT}"))?
                    as u32,
            };
            Ok(LockOp::Acquire {
                name,
                ttl_seconds: ttl(obj)?,
                owner,
                limit,
            })
        }
        Some("renew") => Ok(LockOp::Renew {
            name,
            token: token(obj)?,
            slot: slot(obj)?,
            ttl_seconds: ttl(obj)?,
            owner: optional_owner(obj)?,
        }),
        Some("release") => Ok(LockOp::Release {
            name,
            token: token(obj)?,
            slot: slot(obj)?,
        }),
        Some("get") => Ok(LockOp::Get { name }),
        _ => Err("op must be acquire, renew, release or get".into()),
    }
}

fn name(obj: &Map<String, Value>) -> Result<String, String> {
    match obj.get("name").and_then(Value::as_str) {
        Some(n)
            if !n.is_empty()
                && n.len() <= MAX_NAME_BYTES
                && !n.chars().any(|c| c.is_control() || c == '#') =>
        {
            Ok(n.to_string())
        }
        _ => Err(format!(
            "name is a non-empty string of at most {MAX_NAME_BYTES} bytes, without control characters and without '#'"
        )),
    }
}

fn optional_owner(obj: &Map<String, Value>) -> Result<Option<String>, String> {
    match obj.get("owner") {
        None | Some(Value::Null) => Ok(None),
        Some(v) => owner(v).map(Some),
    }
}

fn owner(v: &Value) -> Result<String, String> {
    match v.as_str() {
        Some(o) if !o.is_empty() && o.len() <= MAX_OWNER_BYTES && !o.chars().any(char::is_control) => {
            Ok(o.to_string())
        }
        _ => Err(format!(
            "owner is a non-empty string of at most {MAX_OWNER_BYTES} bytes, without control characters"
        )),
    }
}

fn ttl(obj: &Map<String, Value>) -> Result<u64, String> {
    obj.get("ttlSeconds")
        .and_then(Value::as_u64)
        .filter(|s| (1..=MAX_TTL_SECONDS).contains(s))
        .ok_or_else(|| {
            format!(
                "ttlSeconds is a whole number from 1 to {MAX_TTL_SECONDS}: a lock has no forever"
            )
        })
}

fn token(obj: &Map<String, Value>) -> Result<i64, String> {
    obj.get("token")
        .and_then(Value::as_i64)
        .filter(|t| *t > 0)
        .ok_or_else(|| "token is required: the one the last acquire or renew answered".into())
}

fn slot(obj: &Map<String, Value>) -> Result<u32, String> {
    match obj.get("slot") {
        None | Some(Value::Null) => Ok(0),
        Some(v) => v
            .as_u64()
            .filter(|s| *s < u64::from(MAX_LIMIT))
            .map(|s| s as u32)
            .ok_or_else(|| format!("slot is a whole number below {MAX_LIMIT}")),
    }
}

/// The value stored in a permit's row.
pub fn permit_value(owner: &str, since: Timestamp) -> Value {
    json!({"owner": owner, "since": format_iso_micros(since)})
}

fn owner_of(row: &KvRow) -> Option<&str> {
    row.value.get("owner").and_then(Value::as_str)
}

/// The `check` op a transaction carries to commit only while the permit is this holder's.
pub fn guard(name: &str, slot: u32, token: i64) -> Value {
    json!({"op": "check", "ns": LOCKS_NAMESPACE, "key": permit_key(name, slot),
           "expect": token, "required": true})
}

/// One live permit as `get` and refusals list it.
pub fn holder(slot: u32, row: &KvRow) -> Value {
    json!({"slot": slot, "owner": owner_of(row), "token": row.version,
           "since": row.value.get("since").cloned().unwrap_or(Value::Null),
           "expiresAt": row.expires_at.map(format_iso_micros),
           "renewedAt": format_iso_micros(row.updated_at)})
}

/// The live permits among `(slot, row)`, in slot order.
pub fn holders(rows: &[(u32, KvRow)], now: Timestamp) -> Vec<Value> {
    let mut live: Vec<&(u32, KvRow)> = rows.iter().filter(|(_, r)| r.live(now)).collect();
    live.sort_by_key(|(s, _)| *s);
    live.into_iter().map(|(s, r)| holder(*s, r)).collect()
}

/// What an acquire does, given the rows of slots `0..limit`.
#[derive(Clone, Debug, PartialEq)]
pub enum AcquireDecision {
    /// The owner already holds this slot (a resent acquire): answer it unchanged.
    Already { slot: u32, row: KvRow },
    /// Write a permit into this free slot (absent or expired).
    Take { slot: u32 },
    /// Every permit is live and another owner's.
    Refuse { holders: Vec<Value> },
}

pub fn decide_acquire(
    slots: &[(u32, Option<KvRow>)],
    owner: &str,
    limit: u32,
    now: Timestamp,
) -> AcquireDecision {
    let in_limit = || slots.iter().filter(|(s, _)| *s < limit);
    if let Some((slot, Some(row))) = in_limit().find(|(_, r)| {
        r.as_ref()
            .is_some_and(|r| r.live(now) && owner_of(r) == Some(owner))
    }) {
        return AcquireDecision::Already {
            slot: *slot,
            row: row.clone(),
        };
    }
    if let Some((slot, _)) = (0..limit)
        .map(|s| {
            (
                s,
                slots
                    .iter()
                    .find(|(k, _)| *k == s)
                    .and_then(|(_, r)| r.as_ref()),
            )
        })
        .find(|(_, r)| r.is_none_or(|r| !r.live(now)))
    {
        return AcquireDecision::Take { slot };
    }
    let rows: Vec<(u32, KvRow)> = in_limit()
        .filter_map(|(s, r)| r.clone().map(|r| (*s, r)))
        .collect();
    AcquireDecision::Refuse {
        holders: holders(&rows, now),
    }
}

/// The answer of an acquire that holds `slot` with `row`.
pub fn acquired(name: &str, slot: u32, row: &KvRow, already: bool) -> Value {
    let mut answer = json!({"acquired": true, "slot": slot, "token": row.version,
                            "owner": owner_of(row), "guard": guard(name, slot, row.version),
                            "expiresAt": row.expires_at.map(format_iso_micros)});
    if already {
        answer["already"] = json!(true);
    }
    answer
}

pub fn refused_acquire(holders: Vec<Value>) -> Value {
    json!({"acquired": false, "reason": "held", "holders": holders})
}

/// Whether a renew or release names the permit as it stands: live and at the token.
pub fn token_holds(row: Option<&KvRow>, token: i64, now: Timestamp) -> bool {
    row.is_some_and(|r| r.live(now) && r.version == token)
}

/// Whether a renew extends the permit as it stands: live, and at the token or, when the renew
/// names its owner, still that owner's. The owner makes a renew safe to send again when its
/// answer was lost: the first attempt moved the token, and the resent one carries the old one
/// (Queen's clients resend with the token they hold). A permit another owner took is lost.
pub fn renew_holds(row: &KvRow, token: i64, owner: Option<&str>, now: Timestamp) -> bool {
    row.live(now) && (row.version == token || owner.is_some_and(|o| owner_of(row) == Some(o)))
}

pub fn renewed(name: &str, slot: u32, row: &KvRow) -> Value {
    json!({"renewed": true, "slot": slot, "token": row.version,
           "guard": guard(name, slot, row.version),
           "expiresAt": row.expires_at.map(format_iso_micros)})
}

pub fn lost_renew(holders: Vec<Value>) -> Value {
    json!({"renewed": false, "reason": "lost", "holders": holders})
}

pub fn released(done: bool) -> Value {
    if done {
        json!({"released": true})
    } else {
        json!({"released": false, "reason": "lost"})
    }
}

pub fn got(holders: Vec<Value>) -> Value {
    json!({"held": !holders.is_empty(), "holders": holders})
}

/// The value a renew writes: the owner and `since` of the permit it extends.
pub fn renewed_value(row: &KvRow) -> Value {
    row.value.clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn permit(owner: &str, version: i64, expires: i64) -> KvRow {
        KvRow {
            value: permit_value(owner, Timestamp::from_secs(1)),
            version,
            expires_at: Some(Timestamp::from_secs(expires)),
            updated_at: Timestamp::from_secs(1),
        }
    }

    #[test]
    fn acquire_resends_free_slots_and_refusals() {
        let now = Timestamp::from_secs(10);
        let slots = vec![(0, Some(permit("a", 5, 20))), (1, Some(permit("b", 6, 5)))];
        // a resent acquire by the holder answers its permit.
        assert!(matches!(
            decide_acquire(&slots, "a", 2, now),
            AcquireDecision::Already { slot: 0, .. }
        ));
        // slot 1 expired: free.
        assert_eq!(
            decide_acquire(&slots, "c", 2, now),
            AcquireDecision::Take { slot: 1 }
        );
        match decide_acquire(&slots, "c", 1, now) {
            AcquireDecision::Refuse { holders } => assert_eq!(holders.len(), 1),
            other => panic!("{other:?}"),
        }
        assert!(token_holds(slots[0].1.as_ref(), 5, now));
        assert!(!token_holds(slots[1].1.as_ref(), 6, now));
        assert_eq!(slot_of("x", "x#3"), Some(3));
        assert_eq!(slot_of("x", "xy#3"), None);
    }

    #[test]
    fn a_renew_holds_at_its_token_or_for_its_owner() {
        let now = Timestamp::from_secs(10);
        let live = permit("a", 5, 20);
        assert!(renew_holds(&live, 5, None, now));
        // Sent again after a lost answer: the token before, the same owner.
        assert!(!renew_holds(&live, 4, None, now));
        assert!(renew_holds(&live, 4, Some("a"), now));
        // Another owner with a stale token has lost it; an expired permit is nobody's.
        assert!(!renew_holds(&live, 4, Some("b"), now));
        assert!(!renew_holds(&permit("a", 5, 5), 5, Some("a"), now));
    }
}
