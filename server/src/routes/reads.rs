//! Reads by offset (`POST /api/v1/fetch`) and partition discovery
//! (`POST /api/v1/partitions/changed`): no lease, no cursor, no ack. The rules are
//! `queen_core::reads`; storage reads one partition per entry in one snapshot.

use std::sync::Arc;

use hyper::StatusCode;
use queen_core::frames::slice_blob;
use queen_core::reads::{self, Budget, FetchEntry, Retained};
use queen_core::storage::PartitionRead;
use queen_core::time::format_iso_micros;
use serde::Serialize;
use serde_json::value::RawValue;
use serde_json::{json, Value};

use crate::broker::Broker;
use crate::http::{self, Failure, Reply};

fn parse_body(body: &[u8]) -> Result<Value, Failure> {
    serde_json::from_slice(body)
        .map_err(|e| Failure::coded("read_invalid", format!("body is not JSON: {e}")))
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Record {
    offset: i64,
    transaction_id: String,
    /// The payload as stored: the client's JSON text, never parsed into a tree here.
    payload: Box<RawValue>,
    ts: String,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Entry<'a> {
    queue: &'a str,
    partition: &'a str,
    records: Vec<Record>,
    high_watermark: i64,
    log_start_offset: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<&'static str>,
}

impl<'a> Entry<'a> {
    fn of(
        e: &'a FetchEntry,
        range: Retained,
        records: Vec<Record>,
        error: Option<&'static str>,
    ) -> Self {
        Entry {
            queue: &e.queue,
            partition: &e.partition,
            records,
            high_watermark: range.high_watermark,
            log_start_offset: range.log_start,
            error,
        }
    }
}

/// `POST /api/v1/fetch`: each entry's records from its offset, within the entry's and the
/// call's byte budgets (payload bytes), with the partition's retained range.
pub async fn fetch(broker: &Arc<Broker>, body: &[u8]) -> Result<Reply, Failure> {
    let call =
        reads::parse_fetch(&parse_body(body)?).map_err(|e| Failure::coded("read_invalid", e.0))?;
    let cipher = broker.config.cipher.as_deref();
    let mut budget = Budget::new(call.max_bytes);
    let mut out = Vec::with_capacity(call.entries.len());
    for e in &call.entries {
        let read = broker
            .storage
            .reads
            .read_partition(&e.queue, &e.partition, e.offset, budget.hint(e.max_bytes))
            .await?;
        let (range, segments) = match read {
            PartitionRead::Unknown => {
                let none = Retained::of(-1, None);
                out.push(Entry::of(
                    e,
                    none,
                    vec![],
                    Some(reads::UNKNOWN_TOPIC_OR_PARTITION),
                ));
                continue;
            }
            PartitionRead::Found { range, segments } => (range, segments),
        };
        if range.out_of_range(e.offset) {
            out.push(Entry::of(
                e,
                range,
                vec![],
                Some(reads::OFFSET_OUT_OF_RANGE),
            ));
            continue;
        }
        let mut records = vec![];
        let mut used = 0u64;
        'segments: for s in &segments {
            let frames = slice_blob(
                &s.blob,
                s.start_idx as usize,
                s.take as usize,
                s.msg_count as usize,
            )
            .map_err(|err| Failure::server(format!("corrupt segment: {err}")))?;
            for (i, f) in frames.into_iter().enumerate() {
                let payload = crate::sealing::plaintext(cipher, &f).map_err(Failure::server)?;
                let size = payload.len() as u64;
                if !budget.admit(used, e.max_bytes, size) {
                    break 'segments;
                }
                used += size;
                let text = String::from_utf8(payload.into_owned())
                    .map_err(|_| Failure::server("stored payload is not UTF-8"))?;
                records.push(Record {
                    offset: s.base_offset + i64::from(s.start_idx) + i as i64,
                    transaction_id: f.transaction_id,
                    payload: RawValue::from_string(text).map_err(|err| {
                        Failure::server(format!("stored payload is not JSON: {err}"))
                    })?,
                    ts: format_iso_micros(s.created_at),
                });
            }
        }
        out.push(Entry::of(e, range, records, None));
    }
    #[derive(Serialize)]
    struct Answer<'a> {
        entries: Vec<Entry<'a>>,
    }
    let answer = serde_json::to_vec(&Answer { entries: out })
        .map_err(|err| Failure::server(format!("fetch answer: {err}")))?;
    Ok(http::json_bytes(StatusCode::OK, answer))
}

/// `POST /api/v1/partitions/changed`: a page of each queue's partitions written since a time,
/// and the smallest `safeTime` of the pages.
pub async fn changed(broker: &Arc<Broker>, body: &[u8]) -> Result<Reply, Failure> {
    let queries = reads::parse_changed(&parse_body(body)?)
        .map_err(|e| Failure::coded("read_invalid", e.0))?;
    let mut entries = Vec::with_capacity(queries.len());
    let mut safe_time = None;
    for q in &queries {
        let page = broker.storage.reads.changed_partitions(q).await?;
        safe_time = Some(
            safe_time.map_or(page.safe_time, |t: queen_core::Timestamp| {
                t.min(page.safe_time)
            }),
        );
        entries.push(reads::changed_entry(&page));
    }
    let safe_time = match safe_time {
        Some(t) => Value::String(format_iso_micros(t)),
        None => Value::Null,
    };
    Ok(http::json(
        StatusCode::OK,
        &json!({"safeTime": safe_time, "entries": entries}),
    ))
}
