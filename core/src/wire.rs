//! Queen 2.x's binary bodies (docs/operations.md, "Queen 2.x's binary wire"): `QPB1` push and
//! `QTB1` transaction requests, decoded and validated here, and `QPF1` framed pop answers,
//! encoded here; and this broker's own framed fetch answer (`QRF1`, docs/reads.md), encoded and
//! decoded here. Hand-written: each layout is the wire's, byte for byte, and a framed push's
//! zstd frame is kept as it came (it is already the stored segment format of `frames`).

use std::fmt;

use crate::frames::{self, Frame, FrameError};
use crate::storage::{Claim, SegmentRow};
use crate::types::validate_name;

pub const PUSH_CONTENT_TYPE: &str = "application/x-queen-push";
pub const POP_FRAMES_CONTENT_TYPE: &str = "application/x-queen-pop";
pub const FETCH_FRAMES_CONTENT_TYPE: &str = "application/x-queen-fetch";

const PUSH_MAGIC: &[u8; 4] = b"QPB1";
const TRANSACTION_MAGIC: &[u8; 4] = b"QTB1";
const POP_MAGIC: &[u8; 4] = b"QPF1";
const FETCH_MAGIC: &[u8; 4] = b"QRF1";

const FLAG_ZSTD: u8 = 1;
const FLAG_COUNTS: u8 = 2;
const FLAG_TXN: u8 = 4;
const FLAG_FRAMES: u8 = 8;
const PUSH_FLAGS: u8 = FLAG_ZSTD | FLAG_COUNTS | FLAG_TXN | FLAG_FRAMES;

const CODEC_RAW: u8 = 0;
const CODEC_ZSTD: u8 = 1;

/// A binary body the broker refuses, with what is wrong and where.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WireError(pub String);

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for WireError {}

fn bad(msg: impl Into<String>) -> WireError {
    WireError(msg.into())
}

/// Whether a request body is a binary push (`QPB1`).
pub fn is_binary_push(body: &[u8]) -> bool {
    body.starts_with(PUSH_MAGIC)
}

/// Whether a request body is a binary transaction (`QTB1`).
pub fn is_binary_transaction(body: &[u8]) -> bool {
    body.starts_with(TRANSACTION_MAGIC)
}

/// The messages of one (queue, partition) group of a binary body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WireGroup {
    pub queue: String,
    pub partition: String,
    pub frames: Vec<Frame>,
    /// A framed group's zstd frame as the client sent it: exactly `frames`, in order, in the
    /// stored segment format, so storage may keep it instead of compressing again.
    pub blob: Option<Vec<u8>>,
}

/// A decoded `QPB1` body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BinaryPush {
    /// Answer with counts instead of one object per item (flag 2).
    pub counts: bool,
    pub groups: Vec<WireGroup>,
}

/// A decoded `QTB1` body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BinaryTransaction {
    /// Answer with counts instead of the pushes' and acks' results (flag 2).
    pub counts: bool,
    /// The JSON transaction body without its push operations (may be empty).
    pub head: Vec<u8>,
    pub groups: Vec<WireGroup>,
}

/// Little-endian reads off a body; a read past the end names what was being read.
struct Reader<'a> {
    buf: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn new(buf: &'a [u8]) -> Self {
        Reader { buf, at: 0 }
    }
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], WireError> {
        let end = self
            .at
            .checked_add(n)
            .filter(|e| *e <= self.buf.len())
            .ok_or_else(|| bad(format!("truncated at byte {} reading {what}", self.at)))?;
        let s = &self.buf[self.at..end];
        self.at = end;
        Ok(s)
    }
    fn u8(&mut self, what: &str) -> Result<u8, WireError> {
        Ok(self.take(1, what)?[0])
    }
    fn u16(&mut self, what: &str) -> Result<u16, WireError> {
        let b = self.take(2, what)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }
    fn u32(&mut self, what: &str) -> Result<u32, WireError> {
        let b = self.take(4, what)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn str16(&mut self, what: &str) -> Result<&'a str, WireError> {
        let n = self.u16(what)? as usize;
        std::str::from_utf8(self.take(n, what)?).map_err(|_| bad(format!("{what} is not UTF-8")))
    }
    fn rest(&self) -> &'a [u8] {
        &self.buf[self.at..]
    }
    fn done(&self, what: &str) -> Result<(), WireError> {
        if self.at == self.buf.len() {
            Ok(())
        } else {
            Err(bad(format!(
                "{} bytes after the end of {what}",
                self.buf.len() - self.at
            )))
        }
    }
}

/// A payload must be one JSON document: it is served inside JSON answers as it is.
fn check_payload(payload: &[u8], place: &str) -> Result<(), WireError> {
    serde_json::from_slice::<&serde_json::value::RawValue>(payload)
        .map(|_| ())
        .map_err(|e| {
            bad(format!(
                "{place}: the payload is not one JSON document: {e}"
            ))
        })
}

fn check_name(what: &'static str, name: &str, place: &str) -> Result<(), WireError> {
    validate_name(what, name).map_err(|e| bad(format!("{place}: {e}")))
}

/// Decompresses one zstd frame that declares its size, at most `max_raw` bytes.
fn zstd_frame(z: &[u8], max_raw: usize, what: &str) -> Result<Vec<u8>, WireError> {
    let whole = zstd::zstd_safe::find_frame_compressed_size(z)
        .map_err(|_| bad(format!("{what} is not a zstd frame")))?;
    if whole != z.len() {
        return Err(bad(format!("{what} is not exactly one zstd frame")));
    }
    let size = zstd::zstd_safe::get_frame_content_size(z)
        .ok()
        .flatten()
        .ok_or_else(|| {
            bad(format!(
                "{what}: the zstd frame must declare its content size"
            ))
        })?;
    let size = usize::try_from(size)
        .ok()
        .filter(|s| *s <= max_raw)
        .ok_or_else(|| bad(format!("{what} decompresses to more than {max_raw} bytes")))?;
    let raw =
        crate::frames::zstd_decompress(z, size).map_err(|e| bad(format!("{what}: zstd: {e}")))?;
    if raw.len() != size {
        return Err(bad(format!(
            "{what}: the zstd frame is shorter than it declares"
        )));
    }
    Ok(raw)
}

/// Reads `count` groups; `framed`: each group is one client-compressed zstd frame of frames.
fn groups(
    r: &mut Reader<'_>,
    framed: bool,
    with_txn: bool,
    max_raw: usize,
    mint: &mut impl FnMut() -> uuid::Uuid,
) -> Result<Vec<WireGroup>, WireError> {
    let count = r.u32("the group count")?;
    let mut out = Vec::new();
    for g in 0..count {
        let place = format!("group {g}");
        let queue = r.str16("a queue name")?.to_string();
        check_name("queue", &queue, &place)?;
        let partition = r.str16("a partition name")?.to_string();
        check_name("partition", &partition, &place)?;
        let n = r.u32("a message count")? as usize;
        let group = if framed {
            let z_len = r.u32("a frame length")? as usize;
            let z = r.take(z_len, "a group's zstd frame")?;
            let raw = zstd_frame(z, max_raw, &place)?;
            let frames = client_frames(&raw, n, &place)?;
            WireGroup {
                queue,
                partition,
                frames,
                blob: Some(z.to_vec()),
            }
        } else {
            // Each item is at least its 4-byte length: bounds the allocation by the body.
            let mut frames = Vec::with_capacity(n.min(r.rest().len() / 4));
            for i in 0..n {
                let place = format!("{place} item {i}");
                let txid = if with_txn {
                    Some(r.str16("a transactionId")?.to_string())
                } else {
                    None
                };
                let len = r.u32("a payload length")? as usize;
                let payload = r.take(len, "a payload")?;
                check_payload(payload, &place)?;
                let message_id = mint();
                let transaction_id = match txid.filter(|t| !t.is_empty()) {
                    Some(t) => {
                        check_name("transactionId", &t, &place)?;
                        t
                    }
                    None => message_id.to_string(),
                };
                frames.push(Frame {
                    producer: None,
                    encrypted: false,
                    message_id,
                    transaction_id,
                    trace_id: None,
                    payload: payload.to_vec(),
                });
            }
            WireGroup {
                queue,
                partition,
                frames,
                blob: None,
            }
        };
        out.push(group);
    }
    Ok(out)
}

/// The frames of a client-compressed group, every one checked: exactly `n` frames with flags 0,
/// a message id that is not nil, a valid transactionId, one JSON document each.
fn client_frames(raw: &[u8], n: usize, place: &str) -> Result<Vec<Frame>, WireError> {
    let mut r = Reader::new(raw);
    // A frame is at least 23 bytes: bounds the allocation by the data.
    let mut out = Vec::with_capacity(n.min(raw.len() / 23));
    for i in 0..n {
        let place = format!("{place} frame {i}");
        let body_len = r.u32("a frame length")? as usize;
        let mut body = Reader::new(r.take(body_len, "a frame")?);
        let flags = body.u8("frame flags")?;
        if flags != 0 {
            return Err(bad(format!("{place}: frame flags must be 0, got {flags}")));
        }
        let id = body.take(16, "a message id")?;
        let message_id = uuid::Uuid::from_slice(id).map_err(|e| bad(format!("{place}: {e}")))?;
        if message_id.is_nil() {
            return Err(bad(format!("{place}: the message id is nil")));
        }
        let transaction_id = body.str16("a transactionId")?.to_string();
        check_name("transactionId", &transaction_id, &place)?;
        let payload = body.rest();
        check_payload(payload, &place)?;
        out.push(Frame {
            producer: None,
            encrypted: false,
            message_id,
            transaction_id,
            trace_id: None,
            payload: payload.to_vec(),
        });
    }
    r.done(&format!("{place}'s {n} frames"))?;
    Ok(out)
}

/// Decodes a `QPB1` body. `max_raw` bounds every decompressed size (the request body limit);
/// `mint` gives each message of a plain group its id.
pub fn decode_push(
    body: &[u8],
    max_raw: usize,
    mut mint: impl FnMut() -> uuid::Uuid,
) -> Result<BinaryPush, WireError> {
    let mut r = Reader::new(body);
    if r.take(4, "the magic")? != PUSH_MAGIC {
        return Err(bad("not a QPB1 body"));
    }
    let flags = r.u8("the flags")?;
    if flags & !PUSH_FLAGS != 0 {
        return Err(bad(format!("unknown QPB1 flags {flags:#04x}")));
    }
    let framed = flags & FLAG_FRAMES != 0;
    let inflated;
    let mut body = if flags & FLAG_ZSTD != 0 {
        let raw_len = r.u32("the raw length")? as usize;
        inflated = zstd_frame(r.rest(), max_raw.min(raw_len), "the QPB1 body")?;
        if inflated.len() != raw_len {
            return Err(bad(
                "the QPB1 body's raw length does not match its zstd frame",
            ));
        }
        Reader::new(&inflated)
    } else {
        r
    };
    let groups = groups(&mut body, framed, flags & FLAG_TXN != 0, max_raw, &mut mint)?;
    body.done("the QPB1 body")?;
    Ok(BinaryPush {
        counts: flags & FLAG_COUNTS != 0,
        groups,
    })
}

/// Decodes a `QTB1` body: flags, the JSON head, then framed groups as in `QPB1` flag 8.
pub fn decode_transaction(body: &[u8], max_raw: usize) -> Result<BinaryTransaction, WireError> {
    let mut r = Reader::new(body);
    if r.take(4, "the magic")? != TRANSACTION_MAGIC {
        return Err(bad("not a QTB1 body"));
    }
    let flags = r.u8("the flags")?;
    if flags & !FLAG_COUNTS != 0 {
        return Err(bad(format!("unknown QTB1 flags {flags:#04x}")));
    }
    let head_len = r.u32("the head length")? as usize;
    let head = r.take(head_len, "the head")?.to_vec();
    let mut no_mint = || uuid::Uuid::nil();
    let groups = groups(&mut r, true, true, max_raw, &mut no_mint)?;
    r.done("the QTB1 body")?;
    Ok(BinaryTransaction {
        counts: flags & FLAG_COUNTS != 0,
        head,
        groups,
    })
}

/// One claim of a framed pop answer.
pub struct FramedClaim<'a> {
    pub claim: &'a Claim,
    /// The partition's number: the wire's `partitionId` is a u64, and acks may name it.
    pub partition_number: u64,
}

/// What a framed pop answer carries besides its claims.
pub struct FramedAnswer<'a> {
    pub queue: &'a str,
    pub lease_id: &'a str,
    pub consumer_group: &'a str,
    /// The answer's own keys as one JSON object (version 1), e.g. the autopilot echo.
    pub extra: Option<&'a [u8]>,
    pub claims: Vec<FramedClaim<'a>>,
}

fn put_str16(out: &mut Vec<u8>, s: &str, what: &str) -> Result<(), WireError> {
    let n = u16::try_from(s.len()).map_err(|_| bad(format!("{what} is too long for a frame")))?;
    out.extend_from_slice(&n.to_le_bytes());
    out.extend_from_slice(s.as_bytes());
    Ok(())
}

fn put_u64(out: &mut Vec<u8>, v: i64, what: &str) -> Result<(), WireError> {
    let v = u64::try_from(v).map_err(|_| bad(format!("{what} {v} is negative")))?;
    out.extend_from_slice(&v.to_le_bytes());
    Ok(())
}

fn put_len(out: &mut Vec<u8>, n: usize, what: &str) -> Result<(), WireError> {
    let n = u32::try_from(n).map_err(|_| bad(format!("{what} does not fit a u32")))?;
    out.extend_from_slice(&n.to_le_bytes());
    Ok(())
}

/// A segment row as a record: the stored zstd frame untouched when the answer delivers at least
/// half of it (the client skips frames outside the claim's range), else only the delivered frames,
/// uncompressed, so a small slice of a large segment does not ship the whole segment.
fn put_record(out: &mut Vec<u8>, row: &SegmentRow) -> Result<(), WireError> {
    let created_at_us: i64 = row.created_at.0;
    if u64::from(row.take) * 2 >= u64::from(row.msg_count) {
        put_u64(out, row.base_offset, "a base offset")?;
        out.extend_from_slice(&created_at_us.to_le_bytes());
        out.extend_from_slice(&row.msg_count.to_le_bytes());
        out.push(CODEC_ZSTD);
        put_len(out, row.blob.len(), "a segment")?;
        out.extend_from_slice(&row.blob);
        return Ok(());
    }
    let raw = frames::decompress_blob(&row.blob).map_err(frame_error)?;
    let slice = frames::raw_frames(
        &raw,
        row.start_idx as usize,
        row.take as usize,
        row.msg_count as usize,
    )
    .map_err(frame_error)?;
    put_u64(
        out,
        row.base_offset + i64::from(row.start_idx),
        "a base offset",
    )?;
    out.extend_from_slice(&created_at_us.to_le_bytes());
    out.extend_from_slice(&row.take.to_le_bytes());
    out.push(CODEC_RAW);
    put_len(out, slice.len(), "a slice")?;
    out.extend_from_slice(slice);
    Ok(())
}

fn frame_error(e: FrameError) -> WireError {
    bad(format!("corrupt segment: {e}"))
}

/// Encodes a framed pop answer (`QPF1`: version 0 when the JSON answer has no keys beyond the
/// ones the frames carry, version 1 with the others as one JSON object).
pub fn encode_pop_frames(answer: &FramedAnswer<'_>) -> Result<Vec<u8>, WireError> {
    let size: usize = answer
        .claims
        .iter()
        .flat_map(|c| c.claim.rows.iter().map(|r| r.blob.len() + 32))
        .sum();
    let mut out = Vec::with_capacity(64 + size);
    out.extend_from_slice(POP_MAGIC);
    match answer.extra {
        None => out.push(0),
        Some(keys) => {
            out.push(1);
            put_len(&mut out, keys.len(), "the answer's own keys")?;
            out.extend_from_slice(keys);
        }
    }
    put_str16(&mut out, answer.queue, "the queue name")?;
    put_str16(&mut out, answer.lease_id, "the leaseId")?;
    put_str16(&mut out, answer.consumer_group, "the consumer group")?;
    put_len(&mut out, answer.claims.len(), "the claim count")?;
    for fc in &answer.claims {
        let c = fc.claim;
        out.extend_from_slice(&fc.partition_number.to_le_bytes());
        put_str16(&mut out, &c.partition, "a partition name")?;
        put_u64(&mut out, c.first_offset, "a first offset")?;
        put_u64(&mut out, c.last_offset, "a last offset")?;
        out.extend_from_slice(&c.attempt_count.max(1).to_le_bytes());
        put_len(&mut out, c.rows.len(), "the record count")?;
        for row in &c.rows {
            put_record(&mut out, row)?;
        }
    }
    Ok(out)
}

/// A framed fetch answer (`QRF1`), written entry by entry as the records decode: what the JSON
/// answer carries, with lengths instead of quoting, so neither side escapes, scans or parses
/// the payloads. Little-endian, as the other frames:
///
/// ```text
/// "QRF1" u32 entries
/// entry:  str16 queue, str16 partition, u32 records, record*, i64 highWatermark,
///         i64 logStartOffset, str16 error ("" when none)
/// record: i64 offset, i64 ts (microseconds since the epoch), str16 transactionId,
///         u32 payload length, the payload (its stored JSON text)
/// ```
pub struct FetchFramesWriter {
    out: Vec<u8>,
    entries: u32,
    /// Where the open entry's record count goes, and its records so far.
    open: Option<(usize, u32)>,
}

impl Default for FetchFramesWriter {
    fn default() -> Self {
        Self::new()
    }
}

impl FetchFramesWriter {
    pub fn new() -> Self {
        let mut out = Vec::with_capacity(4096);
        out.extend_from_slice(FETCH_MAGIC);
        out.extend_from_slice(&0u32.to_le_bytes());
        FetchFramesWriter {
            out,
            entries: 0,
            open: None,
        }
    }

    pub fn open_entry(&mut self, queue: &str, partition: &str) -> Result<(), WireError> {
        if self.open.is_some() {
            return Err(bad("a fetch entry opened inside another"));
        }
        put_str16(&mut self.out, queue, "the queue name")?;
        put_str16(&mut self.out, partition, "a partition name")?;
        self.open = Some((self.out.len(), 0));
        self.out.extend_from_slice(&0u32.to_le_bytes());
        Ok(())
    }

    pub fn record(
        &mut self,
        offset: i64,
        ts_us: i64,
        transaction_id: &str,
        payload: &[u8],
    ) -> Result<(), WireError> {
        let Some((_, records)) = self.open.as_mut() else {
            return Err(bad("a fetch record outside an entry"));
        };
        *records = records
            .checked_add(1)
            .ok_or_else(|| bad("too many records in one entry"))?;
        self.out.extend_from_slice(&offset.to_le_bytes());
        self.out.extend_from_slice(&ts_us.to_le_bytes());
        put_str16(&mut self.out, transaction_id, "a transactionId")?;
        put_len(&mut self.out, payload.len(), "a payload")?;
        self.out.extend_from_slice(payload);
        Ok(())
    }

    pub fn close_entry(
        &mut self,
        high_watermark: i64,
        log_start: i64,
        error: Option<&str>,
    ) -> Result<(), WireError> {
        let Some((at, records)) = self.open.take() else {
            return Err(bad("a fetch entry closed without being opened"));
        };
        self.out[at..at + 4].copy_from_slice(&records.to_le_bytes());
        self.out.extend_from_slice(&high_watermark.to_le_bytes());
        self.out.extend_from_slice(&log_start.to_le_bytes());
        put_str16(&mut self.out, error.unwrap_or(""), "an entry's error")?;
        self.entries = self
            .entries
            .checked_add(1)
            .ok_or_else(|| bad("too many fetch entries"))?;
        Ok(())
    }

    pub fn finish(mut self) -> Result<Vec<u8>, WireError> {
        if self.open.is_some() {
            return Err(bad("a fetch answer finished inside an entry"));
        }
        self.out[4..8].copy_from_slice(&self.entries.to_le_bytes());
        Ok(self.out)
    }
}

/// One record of a decoded `QRF1` answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FetchedRecord<'a> {
    pub offset: i64,
    pub ts_us: i64,
    pub transaction_id: &'a str,
    pub payload: &'a [u8],
}

/// One entry of a decoded `QRF1` answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FetchedEntry<'a> {
    pub queue: &'a str,
    pub partition: &'a str,
    pub records: Vec<FetchedRecord<'a>>,
    pub high_watermark: i64,
    pub log_start: i64,
    pub error: Option<&'a str>,
}

fn read_i64(r: &mut Reader<'_>, what: &str) -> Result<i64, WireError> {
    let b = r.take(8, what)?;
    let mut a = [0u8; 8];
    a.copy_from_slice(b);
    Ok(i64::from_le_bytes(a))
}

/// Decodes a `QRF1` answer (a client's side; the broker's tests and benchmark read with it).
pub fn decode_fetch_frames(body: &[u8]) -> Result<Vec<FetchedEntry<'_>>, WireError> {
    let mut r = Reader::new(body);
    if r.take(4, "the magic")? != FETCH_MAGIC {
        return Err(bad("not a QRF1 answer"));
    }
    let entries = r.u32("the entry count")?;
    let mut out = Vec::with_capacity(entries.min(1024) as usize);
    for _ in 0..entries {
        let queue = r.str16("the queue name")?;
        let partition = r.str16("a partition name")?;
        let n = r.u32("the record count")?;
        let mut records = Vec::with_capacity(n.min(65_536) as usize);
        for _ in 0..n {
            let offset = read_i64(&mut r, "an offset")?;
            let ts_us = read_i64(&mut r, "a ts")?;
            let transaction_id = r.str16("a transactionId")?;
            let len = r.u32("a payload length")? as usize;
            let payload = r.take(len, "a payload")?;
            records.push(FetchedRecord {
                offset,
                ts_us,
                transaction_id,
                payload,
            });
        }
        let high_watermark = read_i64(&mut r, "a highWatermark")?;
        let log_start = read_i64(&mut r, "a logStartOffset")?;
        let error = Some(r.str16("an entry's error")?).filter(|e| !e.is_empty());
        out.push(FetchedEntry {
            queue,
            partition,
            records,
            high_watermark,
            log_start,
            error,
        });
    }
    r.done("a QRF1 answer")?;
    Ok(out)
}

#[cfg(test)]
mod fetch_frames_tests {
    use super::*;

    #[test]
    fn a_framed_fetch_answer_reads_back_as_written() {
        let mut w = FetchFramesWriter::new();
        w.open_entry("q", "p").unwrap();
        w.record(4, 1_700_000_000_000_000, "t-4", br#"{"n":4}"#)
            .unwrap();
        w.record(5, 1_700_000_000_000_001, "t-\"5\"", b"[1,2]")
            .unwrap();
        w.close_entry(9, 0, None).unwrap();
        w.open_entry("q", "gone").unwrap();
        w.close_entry(-1, -1, Some("UNKNOWN_TOPIC_OR_PARTITION"))
            .unwrap();
        let body = w.finish().unwrap();
        let e = decode_fetch_frames(&body).unwrap();
        assert_eq!(e.len(), 2);
        assert_eq!((e[0].queue, e[0].partition), ("q", "p"));
        assert_eq!(
            e[0].records,
            vec![
                FetchedRecord {
                    offset: 4,
                    ts_us: 1_700_000_000_000_000,
                    transaction_id: "t-4",
                    payload: br#"{"n":4}"#
                },
                FetchedRecord {
                    offset: 5,
                    ts_us: 1_700_000_000_000_001,
                    transaction_id: "t-\"5\"",
                    payload: b"[1,2]"
                },
            ]
        );
        assert_eq!(
            (e[0].high_watermark, e[0].log_start, e[0].error),
            (9, 0, None)
        );
        assert!(e[1].records.is_empty());
        assert_eq!(e[1].error, Some("UNKNOWN_TOPIC_OR_PARTITION"));
        // Every cut of the body is refused, never misread.
        for cut in 0..body.len() {
            assert!(decode_fetch_frames(&body[..cut]).is_err(), "cut at {cut}");
        }
    }

    #[test]
    fn a_writer_refuses_records_outside_an_entry() {
        let mut w = FetchFramesWriter::new();
        assert!(w.record(0, 0, "t", b"1").is_err());
        assert!(w.close_entry(0, 0, None).is_err());
        w.open_entry("q", "p").unwrap();
        assert!(w.open_entry("q", "p").is_err());
    }
}
