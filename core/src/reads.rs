//! Reads by offset (`POST /api/v1/fetch`) and partition discovery
//! (`POST /api/v1/partitions/changed`): no lease, no cursor, no ack. The rules: what a call may
//! ask, where an offset stands against a partition's retained range, how the byte budgets of a
//! call and of each entry admit records, and the `safeTime` of a discovery answer.

use serde_json::{json, Value};

use crate::time::{format_iso_micros, parse_iso};
use crate::types::{Offset, Timestamp};

/// Entries in one fetch or discovery call (the client sends at most 1000).
pub const MAX_ENTRIES: usize = 1024;
/// The most one entry may read, and its budget when it names none.
pub const MAX_ENTRY_BYTES: u64 = 8 * 1024 * 1024;
/// The most one call may read, and its budget when it names none.
pub const MAX_CALL_BYTES: u64 = 64 * 1024 * 1024;
/// Partitions per discovery page: the default and the ceiling.
pub const CHANGED_PAGE: u32 = 1000;

pub const OFFSET_OUT_OF_RANGE: &str = "OFFSET_OUT_OF_RANGE";
pub const UNKNOWN_TOPIC_OR_PARTITION: &str = "UNKNOWN_TOPIC_OR_PARTITION";

/// A call the broker refuses whole (400).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReadInvalid(pub String);

/// One partition to read, from `offset`, at most `max_bytes` of payload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FetchEntry {
    pub queue: String,
    pub partition: String,
    pub offset: Offset,
    pub max_bytes: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FetchCall {
    pub entries: Vec<FetchEntry>,
    pub max_bytes: u64,
}

fn text_field(e: &Value, i: usize, name: &str) -> Result<String, ReadInvalid> {
    match e.get(name) {
        Some(Value::String(s)) if !s.is_empty() => {
            crate::types::validate_name(
                if name == "queue" {
                    "queue"
                } else {
                    "partition"
                },
                s,
            )
            .map_err(|err| ReadInvalid(format!("entries[{i}].{name}: {err}")))?;
            Ok(s.clone())
        }
        _ => Err(ReadInvalid(format!(
            "entries[{i}].{name} must be a non-empty string"
        ))),
    }
}

/// A byte budget: a positive integer up to `ceiling`; `default` when absent.
fn budget(v: Option<&Value>, what: &str, default: u64, ceiling: u64) -> Result<u64, ReadInvalid> {
    match v {
        None | Some(Value::Null) => Ok(default),
        Some(v) => match v.as_u64() {
            Some(n) if (1..=ceiling).contains(&n) => Ok(n),
            _ => Err(ReadInvalid(format!(
                "{what} must be an integer from 1 to {ceiling}, got {v}"
            ))),
        },
    }
}

fn entries(body: &Value) -> Result<&Vec<Value>, ReadInvalid> {
    let entries = match body.get("entries") {
        Some(Value::Array(a)) => a,
        _ => return Err(ReadInvalid("entries array required".into())),
    };
    if entries.len() > MAX_ENTRIES {
        return Err(ReadInvalid(format!(
            "{} entries in one call; at most {MAX_ENTRIES}",
            entries.len()
        )));
    }
    Ok(entries)
}

/// Parses a fetch call; any malformed entry refuses the whole call.
/// Whether a fetch asks for the framed answer (`?frames=true`, the pop's flag; `QRF1`,
/// `crate::wire::FetchFramesWriter`). Other query parameters are not the fetch's and are
/// ignored.
pub fn fetch_wants_frames(pairs: &[(String, String)]) -> Result<bool, ReadInvalid> {
    let mut frames = false;
    for (k, v) in pairs {
        if k == "frames" {
            frames =
                crate::params::parse_bool("frames", v).map_err(|e| ReadInvalid(e.to_string()))?;
        }
    }
    Ok(frames)
}

pub fn parse_fetch(body: &Value) -> Result<FetchCall, ReadInvalid> {
    let max_bytes = budget(
        body.get("maxBytes"),
        "maxBytes",
        MAX_CALL_BYTES,
        MAX_CALL_BYTES,
    )?;
    let mut out = Vec::new();
    for (i, e) in entries(body)?.iter().enumerate() {
        if !e.is_object() {
            return Err(ReadInvalid(format!("entries[{i}] must be an object")));
        }
        let offset = match e.get("offset") {
            None | Some(Value::Null) => 0,
            Some(v) => v.as_i64().filter(|o| *o >= 0).ok_or_else(|| {
                ReadInvalid(format!(
                    "entries[{i}].offset must be a non-negative integer, got {v}"
                ))
            })?,
        };
        out.push(FetchEntry {
            queue: text_field(e, i, "queue")?,
            partition: text_field(e, i, "partition")?,
            offset,
            max_bytes: budget(
                e.get("maxBytes"),
                &format!("entries[{i}].maxBytes"),
                MAX_ENTRY_BYTES,
                MAX_ENTRY_BYTES,
            )?,
        });
    }
    Ok(FetchCall {
        entries: out,
        max_bytes,
    })
}

/// A partition's retained range: offsets `[log_start, high_watermark)` are readable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Retained {
    /// The next offset the partition will assign.
    pub high_watermark: Offset,
    /// The oldest offset retention kept (`high_watermark` when nothing is kept).
    pub log_start: Offset,
}

impl Retained {
    /// From the partition's last assigned offset and its oldest kept segment's base.
    pub fn of(last_offset: Offset, oldest_base: Option<Offset>) -> Retained {
        let high_watermark = last_offset + 1;
        Retained {
            high_watermark,
            log_start: oldest_base.unwrap_or(high_watermark).min(high_watermark),
        }
    }

    /// Whether a read from `offset` is outside the range (below what retention kept, or past
    /// the end; the end itself is a read of nothing yet).
    pub fn out_of_range(&self, offset: Offset) -> bool {
        offset < self.log_start || offset > self.high_watermark
    }
}

/// The byte budgets of one call: each entry's own, and the call's across its entries. A call
/// that has delivered nothing yet takes its next record whatever its size, so that one record
/// larger than every budget is still read (a reader would otherwise stop there for good).
#[derive(Clone, Copy, Debug)]
pub struct Budget {
    call_left: u64,
    delivered: bool,
}

impl Budget {
    pub fn new(call: u64) -> Budget {
        Budget {
            call_left: call,
            delivered: false,
        }
    }

    /// What an entry with budget `entry_max` may still ask storage to read.
    pub fn hint(&self, entry_max: u64) -> u64 {
        if self.delivered {
            entry_max.min(self.call_left)
        } else {
            entry_max.max(1)
        }
    }

    /// Whether a record of `size` bytes fits, given `entry_used` bytes of the entry already
    /// taken; takes it from the budgets when it does.
    pub fn admit(&mut self, entry_used: u64, entry_max: u64, size: u64) -> bool {
        let fits = entry_used.saturating_add(size) <= entry_max && size <= self.call_left;
        if fits || !self.delivered {
            self.call_left = self.call_left.saturating_sub(size);
            self.delivered = true;
            return true;
        }
        false
    }
}

/// One discovery question: the partitions of `queue` written after `since` (all when `None`),
/// by name after `after`, at most `limit`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChangedQuery {
    pub queue: String,
    pub since: Option<Timestamp>,
    pub after: Option<String>,
    pub limit: u32,
}

/// Parses a discovery call; any malformed entry refuses the whole call.
pub fn parse_changed(body: &Value) -> Result<Vec<ChangedQuery>, ReadInvalid> {
    let mut out = Vec::new();
    for (i, e) in entries(body)?.iter().enumerate() {
        if !e.is_object() {
            return Err(ReadInvalid(format!("entries[{i}] must be an object")));
        }
        let since = match e.get("since") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(parse_iso(s).ok_or_else(|| {
                ReadInvalid(format!("entries[{i}].since is not an ISO-8601 time: {s}"))
            })?),
            Some(v) => {
                return Err(ReadInvalid(format!(
                    "entries[{i}].since must be an ISO-8601 string, got {v}"
                )))
            }
        };
        let after = match e.get("after") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(s.clone()),
            Some(v) => {
                return Err(ReadInvalid(format!(
                    "entries[{i}].after must be a string, got {v}"
                )))
            }
        };
        let limit = budget(
            e.get("limit"),
            &format!("entries[{i}].limit"),
            u64::from(CHANGED_PAGE),
            u64::from(CHANGED_PAGE),
        )? as u32;
        out.push(ChangedQuery {
            queue: text_field(e, i, "queue")?,
            since,
            after,
            limit,
        });
    }
    Ok(out)
}

/// A partition as discovery lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChangedPartition {
    pub name: String,
    pub id: String,
    pub range: Retained,
    /// Quantized to the second, as stored.
    pub last_write_at: Timestamp,
}

/// One page of a discovery answer. `partitions` is `None` for a queue that does not exist.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChangedPage {
    pub partitions: Option<Vec<ChangedPartition>>,
    /// Whether partitions after the page's last one remain.
    pub more: bool,
    pub safe_time: Timestamp,
}

/// The lower bound a `since` filter compares stored write times with: they are quantized down
/// to the second, so a partition written after `since` within the same second is still listed
/// (a write at `w > since` is stored as `floor(w) >= floor(since + 1 us)`). A `safeTime`
/// (one microsecond below a second) passed back as `since` lists exactly what was written
/// after it: nothing of the second it closes.
pub fn since_floor(since: Timestamp) -> Timestamp {
    Timestamp(since.0.saturating_add(1)).quantize_to_second()
}

/// The `safeTime` of an answer read after `sampled_at`, when the oldest transaction open at
/// that instant began at `oldest_open` (every stored write time is at or after its
/// transaction's start, and quantized down to the second): no write committed later carries a
/// write time at or before it.
pub fn safe_time(sampled_at: Timestamp, oldest_open: Option<Timestamp>) -> Timestamp {
    let floor = oldest_open.map_or(sampled_at, |o| o.min(sampled_at));
    Timestamp(floor.quantize_to_second().0 - 1)
}

/// One entry of a discovery answer.
pub fn changed_entry(page: &ChangedPage) -> Value {
    match &page.partitions {
        None => json!({"partitions": [], "error": UNKNOWN_TOPIC_OR_PARTITION}),
        Some(parts) => {
            let list: Vec<Value> = parts
                .iter()
                .map(|p| {
                    json!({"name": p.name, "id": p.id,
                           "lastOffset": p.range.high_watermark - 1,
                           "logStart": p.range.log_start,
                           "lastWriteAt": format_iso_micros(p.last_write_at)})
                })
                .collect();
            let mut entry = json!({ "partitions": list });
            if page.more {
                if let Some(last) = parts.last() {
                    entry["next"] = json!(last.name);
                }
            }
            entry
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_retained_range_bounds_offsets() {
        let r = Retained::of(9, Some(4));
        assert_eq!((r.high_watermark, r.log_start), (10, 4));
        assert!(r.out_of_range(3));
        assert!(!r.out_of_range(4));
        assert!(!r.out_of_range(10), "the end reads nothing yet");
        assert!(r.out_of_range(11));
        let emptied = Retained::of(9, None);
        assert_eq!(
            emptied.log_start, 10,
            "nothing kept: the range starts at the end"
        );
        let never = Retained::of(-1, None);
        assert_eq!((never.high_watermark, never.log_start), (0, 0));
    }

    #[test]
    fn budgets_admit_within_both_and_always_the_first_record() {
        let mut b = Budget::new(100);
        assert!(
            b.admit(0, 10, 500),
            "the call's first record, whatever its size"
        );
        assert!(!b.admit(0, 1000, 1), "the call's budget is spent");
        let mut b = Budget::new(100);
        assert!(b.admit(0, 50, 30));
        assert!(b.admit(30, 50, 20));
        assert!(!b.admit(50, 50, 1), "the entry's budget is spent");
        assert!(b.admit(0, 60, 50), "the next entry has its own");
        assert!(!b.admit(0, 60, 1), "the call's is spent");
    }

    #[test]
    fn fetch_calls_are_refused_whole() {
        let ok = json!({"entries": [{"queue": "q", "partition": "p", "offset": 3, "maxBytes": 10}],
                        "maxBytes": 100});
        let call = parse_fetch(&ok).unwrap();
        assert_eq!(call.entries[0].offset, 3);
        for bad in [
            json!({}),
            json!({"entries": [{"queue": "q", "partition": "p", "offset": -1}]}),
            json!({"entries": [{"queue": "", "partition": "p"}]}),
            json!({"entries": [{"queue": "q", "partition": "p", "maxBytes": 0}]}),
            json!({"entries": [{"queue": "q", "partition": "p", "maxBytes": MAX_ENTRY_BYTES + 1}]}),
            json!({"entries": [], "maxBytes": MAX_CALL_BYTES + 1}),
            json!({"entries": ["q"]}),
            json!({"entries": vec![json!({"queue": "q", "partition": "p"}); MAX_ENTRIES + 1]}),
        ] {
            assert!(parse_fetch(&bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn since_lists_what_was_written_after_it() {
        let second = Timestamp::from_secs(100);
        let safe = Timestamp(second.0 - 1);
        assert_eq!(since_floor(safe), second, "a safeTime closes its second");
        let mid = second.plus_millis(500);
        assert_eq!(
            since_floor(mid),
            second,
            "a write later in the same second is stored as the second itself"
        );
    }

    #[test]
    fn safe_time_is_below_every_later_write_time() {
        let sampled = Timestamp::from_secs(100).plus_millis(700);
        assert_eq!(
            safe_time(sampled, None),
            Timestamp(Timestamp::from_secs(100).0 - 1)
        );
        let older = Timestamp::from_secs(90).plus_millis(200);
        assert_eq!(
            safe_time(sampled, Some(older)),
            Timestamp(Timestamp::from_secs(90).0 - 1)
        );
    }
}
