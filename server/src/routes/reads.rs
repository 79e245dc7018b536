//! Reads by offset (`POST /api/v1/fetch`) and partition discovery
//! (`POST /api/v1/partitions/changed`): no lease, no cursor, no ack. The rules are
//! `queen_core::reads`; storage reads one partition per entry in one snapshot.

use std::sync::Arc;

use hyper::StatusCode;
use queen_core::frames::slice_blob;
use queen_core::reads::{self, Budget, FetchEntry, Retained};
use queen_core::storage::PartitionRead;
use queen_core::time::format_iso_micros;
use serde_json::{json, Value};

use crate::broker::Broker;
use crate::http::{self, Failure, Reply};

fn parse_body(body: &[u8]) -> Result<Value, Failure> {
    serde_json::from_slice(body)
        .map_err(|e| Failure::coded("read_invalid", format!("body is not JSON: {e}")))
}

/// One entry of a fetch answer, written straight into the answer's bytes: a record's payload is
/// the stored JSON text as it is (a tree per record, or a validating copy, cost more than the
/// rest of the answer together: see docs/benchmarks.md, scenario 14).
struct EntryWriter<'a> {
    out: &'a mut Vec<u8>,
    records: usize,
}

impl<'a> EntryWriter<'a> {
    fn open(out: &'a mut Vec<u8>, first: bool, e: &FetchEntry) -> Result<Self, Failure> {
        if !first {
            out.push(b',');
        }
        out.extend_from_slice(b"{\"queue\":");
        write_json(out, &e.queue)?;
        out.extend_from_slice(b",\"partition\":");
        write_json(out, &e.partition)?;
        out.extend_from_slice(b",\"records\":[");
        Ok(EntryWriter { out, records: 0 })
    }

    fn record(&mut self, offset: i64, txid: &str, payload: &[u8], ts: &str) -> Result<(), Failure> {
        if self.records > 0 {
            self.out.push(b',');
        }
        self.records += 1;
        self.out.extend_from_slice(b"{\"offset\":");
        self.out.extend_from_slice(offset.to_string().as_bytes());
        self.out.extend_from_slice(b",\"transactionId\":");
        write_json(self.out, txid)?;
        self.out.extend_from_slice(b",\"payload\":");
        self.out.extend_from_slice(payload);
        self.out.extend_from_slice(b",\"ts\":\"");
        self.out.extend_from_slice(ts.as_bytes());
        self.out.extend_from_slice(b"\"}");
        Ok(())
    }

    fn close(self, range: Retained, error: Option<&str>) {
        self.out.extend_from_slice(b"],\"highWatermark\":");
        self.out
            .extend_from_slice(range.high_watermark.to_string().as_bytes());
        self.out.extend_from_slice(b",\"logStartOffset\":");
        self.out
            .extend_from_slice(range.log_start.to_string().as_bytes());
        if let Some(error) = error {
            self.out.extend_from_slice(b",\"error\":\"");
            self.out.extend_from_slice(error.as_bytes());
            self.out.push(b'"');
        }
        self.out.push(b'}');
    }
}

fn write_json(out: &mut Vec<u8>, text: &str) -> Result<(), Failure> {
    serde_json::to_writer(out, text).map_err(|e| Failure::server(format!("fetch answer: {e}")))
}

/// `POST /api/v1/fetch`: each entry's records from its offset, within the entry's and the
/// call's byte budgets (payload bytes), with the partition's retained range.
pub async fn fetch(broker: &Arc<Broker>, body: &[u8]) -> Result<Reply, Failure> {
    let call =
        reads::parse_fetch(&parse_body(body)?).map_err(|e| Failure::coded("read_invalid", e.0))?;
    let cipher = broker.config.cipher.as_deref();
    let mut budget = Budget::new(call.max_bytes);
    let mut out = Vec::with_capacity(4096);
    out.extend_from_slice(b"{\"entries\":[");
    for (i, e) in call.entries.iter().enumerate() {
        let read = broker
            .storage
            .reads
            .read_partition(&e.queue, &e.partition, e.offset, budget.hint(e.max_bytes))
            .await?;
        let mut entry = EntryWriter::open(&mut out, i == 0, e)?;
        let (range, segments) = match read {
            PartitionRead::Unknown => {
                entry.close(
                    Retained::of(-1, None),
                    Some(reads::UNKNOWN_TOPIC_OR_PARTITION),
                );
                continue;
            }
            PartitionRead::Found { range, segments } => (range, segments),
        };
        if range.out_of_range(e.offset) {
            entry.close(range, Some(reads::OFFSET_OUT_OF_RANGE));
            continue;
        }
        let mut used = 0u64;
        'segments: for s in &segments {
            let frames = slice_blob(
                &s.blob,
                s.start_idx as usize,
                s.take as usize,
                s.msg_count as usize,
            )
            .map_err(|err| Failure::server(format!("corrupt segment: {err}")))?;
            let ts = format_iso_micros(s.created_at);
            for (k, f) in frames.iter().enumerate() {
                let payload = crate::sealing::plaintext(cipher, f).map_err(Failure::server)?;
                let size = payload.len() as u64;
                if !budget.admit(used, e.max_bytes, size) {
                    break 'segments;
                }
                used += size;
                let offset = s.base_offset + i64::from(s.start_idx) + k as i64;
                entry.record(offset, &f.transaction_id, &payload, &ts)?;
            }
        }
        entry.close(range, None);
    }
    out.extend_from_slice(b"]}");
    Ok(http::json_bytes(StatusCode::OK, out))
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
