//! Reads by offset (`POST /api/v1/fetch`) and partition discovery
//! (`POST /api/v1/partitions/changed`): no lease, no cursor, no ack. The rules are
//! `queen_core::reads`; storage reads one partition per entry in one snapshot.

use std::sync::Arc;

use hyper::StatusCode;
use queen_core::frames::{decompress_blob, frame_views, FrameError};
use queen_core::reads::{self, Budget, FetchCall, FetchEntry, Retained};
use queen_core::storage::PartitionRead;
use queen_core::time::format_iso_micros;
use queen_core::types::Timestamp;
use queen_core::wire::{FetchFramesWriter, WireError, FETCH_FRAMES_CONTENT_TYPE};
use serde_json::{json, Value};

use crate::broker::Broker;
use crate::http::{self, Failure, Reply};

fn parse_body(body: &[u8]) -> Result<Value, Failure> {
    serde_json::from_slice(body)
        .map_err(|e| Failure::coded("read_invalid", format!("body is not JSON: {e}")))
}

/// Where a fetch's entries and records are written as the segments decode: the JSON answer, or
/// the framed one (`QRF1`) a client asks for with `?frames=true`.
trait FetchAnswer {
    fn open_entry(&mut self, e: &FetchEntry) -> Result<(), Failure>;
    /// One record; `ts` is `created_at` as the JSON answer writes it (formatted once a segment).
    fn record(
        &mut self,
        offset: i64,
        txid: &str,
        payload: &[u8],
        created_at: Timestamp,
        ts: &str,
    ) -> Result<(), Failure>;
    fn close_entry(&mut self, range: Retained, error: Option<&str>) -> Result<(), Failure>;
    fn finish(self) -> Result<Reply, Failure>;
}

/// The JSON answer, written straight into its bytes: a record's payload is the stored JSON text
/// as it is (a tree per record, or a validating copy, cost more than the rest of the answer
/// together: see docs/benchmarks.md, scenario 14).
struct JsonAnswer {
    out: Vec<u8>,
    entries: usize,
    records: usize,
}

impl JsonAnswer {
    fn new() -> Self {
        let mut out = Vec::with_capacity(4096);
        out.extend_from_slice(b"{\"entries\":[");
        JsonAnswer {
            out,
            entries: 0,
            records: 0,
        }
    }
}

impl FetchAnswer for JsonAnswer {
    fn open_entry(&mut self, e: &FetchEntry) -> Result<(), Failure> {
        if self.entries > 0 {
            self.out.push(b',');
        }
        self.entries += 1;
        self.records = 0;
        self.out.extend_from_slice(b"{\"queue\":");
        write_json(&mut self.out, &e.queue)?;
        self.out.extend_from_slice(b",\"partition\":");
        write_json(&mut self.out, &e.partition)?;
        self.out.extend_from_slice(b",\"records\":[");
        Ok(())
    }

    fn record(
        &mut self,
        offset: i64,
        txid: &str,
        payload: &[u8],
        _created_at: Timestamp,
        ts: &str,
    ) -> Result<(), Failure> {
        if self.records > 0 {
            self.out.push(b',');
        }
        self.records += 1;
        self.out.extend_from_slice(b"{\"offset\":");
        self.out.extend_from_slice(offset.to_string().as_bytes());
        self.out.extend_from_slice(b",\"transactionId\":");
        write_json(&mut self.out, txid)?;
        self.out.extend_from_slice(b",\"payload\":");
        self.out.extend_from_slice(payload);
        self.out.extend_from_slice(b",\"ts\":\"");
        self.out.extend_from_slice(ts.as_bytes());
        self.out.extend_from_slice(b"\"}");
        Ok(())
    }

    fn close_entry(&mut self, range: Retained, error: Option<&str>) -> Result<(), Failure> {
        self.out.extend_from_slice(b"],\"highWatermark\":");
        self.out
            .extend_from_slice(range.high_watermark.to_string().as_bytes());
        self.out.extend_from_slice(b",\"logStartOffset\":");
        self.out
            .extend_from_slice(range.log_start.to_string().as_bytes());
        if let Some(error) = error {
            self.out.extend_from_slice(b",\"error\":");
            write_json(&mut self.out, error)?;
        }
        self.out.push(b'}');
        Ok(())
    }

    fn finish(mut self) -> Result<Reply, Failure> {
        self.out.extend_from_slice(b"]}");
        Ok(http::json_bytes(StatusCode::OK, self.out))
    }
}

fn wire_failure(e: WireError) -> Failure {
    Failure::server(format!("framed fetch answer: {e}"))
}

impl FetchAnswer for FetchFramesWriter {
    fn open_entry(&mut self, e: &FetchEntry) -> Result<(), Failure> {
        FetchFramesWriter::open_entry(self, &e.queue, &e.partition).map_err(wire_failure)
    }

    fn record(
        &mut self,
        offset: i64,
        txid: &str,
        payload: &[u8],
        created_at: Timestamp,
        _ts: &str,
    ) -> Result<(), Failure> {
        FetchFramesWriter::record(self, offset, created_at.0, txid, payload).map_err(wire_failure)
    }

    fn close_entry(&mut self, range: Retained, error: Option<&str>) -> Result<(), Failure> {
        FetchFramesWriter::close_entry(self, range.high_watermark, range.log_start, error)
            .map_err(wire_failure)
    }

    fn finish(self) -> Result<Reply, Failure> {
        let body = FetchFramesWriter::finish(self).map_err(wire_failure)?;
        Ok(http::bytes(StatusCode::OK, body, FETCH_FRAMES_CONTENT_TYPE))
    }
}

fn write_json(out: &mut Vec<u8>, text: &str) -> Result<(), Failure> {
    serde_json::to_writer(out, text).map_err(|e| Failure::server(format!("fetch answer: {e}")))
}

/// `POST /api/v1/fetch[?frames=true]`: each entry's records from its offset, within the
/// entry's and the call's byte budgets (payload bytes), with the partition's retained range; as
/// JSON, or framed (`QRF1`).
pub async fn fetch(
    broker: &Arc<Broker>,
    query: &[(String, String)],
    body: &[u8],
) -> Result<Reply, Failure> {
    let frames =
        reads::fetch_wants_frames(query).map_err(|e| Failure::coded("read_invalid", e.0))?;
    let call =
        reads::parse_fetch(&parse_body(body)?).map_err(|e| Failure::coded("read_invalid", e.0))?;
    if frames {
        answer_fetch(broker, &call, FetchFramesWriter::new()).await
    } else {
        answer_fetch(broker, &call, JsonAnswer::new()).await
    }
}

async fn answer_fetch<A: FetchAnswer>(
    broker: &Arc<Broker>,
    call: &FetchCall,
    mut answer: A,
) -> Result<Reply, Failure> {
    let cipher = broker.config.cipher.as_deref();
    let mut budget = Budget::new(call.max_bytes);
    for e in &call.entries {
        let read = crate::storage_reads::read_partition(
            broker,
            &e.queue,
            &e.partition,
            e.offset,
            budget.hint(e.max_bytes),
        )
        .await?;
        answer.open_entry(e)?;
        let (range, segments) = match read {
            PartitionRead::Unknown => {
                answer.close_entry(
                    Retained::of(-1, None),
                    Some(reads::UNKNOWN_TOPIC_OR_PARTITION),
                )?;
                continue;
            }
            PartitionRead::Found { range, segments } => (range, segments),
        };
        if range.out_of_range(e.offset) {
            answer.close_entry(range, Some(reads::OFFSET_OUT_OF_RANGE))?;
            continue;
        }
        let mut used = 0u64;
        'segments: for s in &segments {
            let corrupt = |err: FrameError| Failure::server(format!("corrupt segment: {err}"));
            // Read in place: each record is written out at once, so no frame is copied.
            let raw = decompress_blob(&s.blob).map_err(corrupt)?;
            let frames = frame_views(
                &raw,
                s.start_idx as usize,
                s.take as usize,
                s.msg_count as usize,
            )
            .map_err(corrupt)?;
            let ts = format_iso_micros(s.created_at);
            for (k, f) in frames.iter().enumerate() {
                let payload =
                    crate::sealing::plaintext_of_view(cipher, f).map_err(Failure::server)?;
                let size = payload.len() as u64;
                if !budget.admit(used, e.max_bytes, size) {
                    break 'segments;
                }
                used += size;
                let offset = s.base_offset + i64::from(s.start_idx) + k as i64;
                answer.record(offset, &f.transaction_id, &payload, s.created_at, &ts)?;
            }
        }
        answer.close_entry(range, None)?;
    }
    answer.finish()
}

/// `POST /api/v1/partitions/changed`: a page of each queue's partitions written since a time,
/// and the smallest `safeTime` of the pages.
pub async fn changed(broker: &Arc<Broker>, body: &[u8]) -> Result<Reply, Failure> {
    let queries = reads::parse_changed(&parse_body(body)?)
        .map_err(|e| Failure::coded("read_invalid", e.0))?;
    let mut entries = Vec::with_capacity(queries.len());
    let mut safe_time = None;
    for q in &queries {
        let page = crate::storage_reads::changed_partitions(broker, q).await?;
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
