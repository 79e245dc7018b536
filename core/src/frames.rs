//! Messages as frames inside a segment blob.
//!
//! A segment holds the messages of one push to one partition as back-to-back frames, compressed
//! with zstd by the broker. Storage never looks inside a blob: it returns `(start_idx, take)` and
//! the broker slices. The frame layout is the one of Queen 2.x's framed records, so a framed pop
//! answer can later ship stored blobs as they are:
//! `u32 body_len | u8 flags | 16 B message id | [16 B trace id if flags & 1] | str16 transactionId
//! | [str16 producer if flags & 2] | payload` (flags & 4: the payload is sealed, see `Frame::encrypted`).
//! Hand-written because the layout is the wire's, byte for byte, and slicing without copying
//! payloads is on the measured hot path; zstd (the crate) does the compression.

use std::borrow::Cow;
use std::fmt;

const FLAG_TRACE: u8 = 1;
const FLAG_PRODUCER: u8 = 2;
const FLAG_ENCRYPTED: u8 = 4;

/// One message as stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    pub message_id: uuid::Uuid,
    pub transaction_id: String,
    pub trace_id: Option<uuid::Uuid>,
    /// The producer's identity (the `sub` of the token that pushed it), when auth is on.
    pub producer: Option<String>,
    /// `payload` is sealed (the broker's payload encryption): not JSON until opened.
    pub encrypted: bool,
    /// The JSON payload, as UTF-8 text (or, when `encrypted`, its sealed form).
    pub payload: Vec<u8>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FrameError {
    Truncated {
        at: usize,
    },
    TransactionIdTooLong(usize),
    ProducerTooLong(usize),
    Compression(String),
    SliceOutOfRange {
        start: usize,
        take: usize,
        count: usize,
    },
}

impl fmt::Display for FrameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FrameError::Truncated { at } => write!(f, "segment blob truncated at byte {at}"),
            FrameError::TransactionIdTooLong(n) => {
                write!(f, "transactionId of {n} bytes does not fit a frame")
            }
            FrameError::ProducerTooLong(n) => {
                write!(f, "producer identity of {n} bytes does not fit a frame")
            }
            FrameError::Compression(e) => write!(f, "segment blob codec: {e}"),
            FrameError::SliceOutOfRange { start, take, count } => {
                write!(
                    f,
                    "slice [{start}, {start}+{take}) outside a segment of {count} frames"
                )
            }
        }
    }
}

impl std::error::Error for FrameError {}

pub fn encode_frames(frames: &[Frame]) -> Result<Vec<u8>, FrameError> {
    let mut out = Vec::with_capacity(
        frames
            .iter()
            .map(|f| 40 + f.payload.len() + f.transaction_id.len())
            .sum(),
    );
    for f in frames {
        let txid = f.transaction_id.as_bytes();
        let txid_len =
            u16::try_from(txid.len()).map_err(|_| FrameError::TransactionIdTooLong(txid.len()))?;
        let producer = f.producer.as_deref().map(str::as_bytes);
        let producer_len = producer
            .map(|p| u16::try_from(p.len()).map_err(|_| FrameError::ProducerTooLong(p.len())))
            .transpose()?;
        let trace_len = if f.trace_id.is_some() { 16 } else { 0 };
        let body_len = 1
            + 16
            + trace_len
            + 2
            + txid.len()
            + producer.map_or(0, |p| 2 + p.len())
            + f.payload.len();
        let body_len =
            u32::try_from(body_len).map_err(|_| FrameError::TransactionIdTooLong(body_len))?;
        let mut flags = 0;
        if f.trace_id.is_some() {
            flags |= FLAG_TRACE;
        }
        if producer.is_some() {
            flags |= FLAG_PRODUCER;
        }
        if f.encrypted {
            flags |= FLAG_ENCRYPTED;
        }
        out.extend_from_slice(&body_len.to_le_bytes());
        out.push(flags);
        out.extend_from_slice(f.message_id.as_bytes());
        if let Some(t) = f.trace_id {
            out.extend_from_slice(t.as_bytes());
        }
        out.extend_from_slice(&txid_len.to_le_bytes());
        out.extend_from_slice(txid);
        if let (Some(p), Some(n)) = (producer, producer_len) {
            out.extend_from_slice(&n.to_le_bytes());
            out.extend_from_slice(p);
        }
        out.extend_from_slice(&f.payload);
    }
    Ok(out)
}

fn take<'a>(buf: &'a [u8], pos: &mut usize, n: usize) -> Result<&'a [u8], FrameError> {
    let end = pos
        .checked_add(n)
        .filter(|e| *e <= buf.len())
        .ok_or(FrameError::Truncated { at: *pos })?;
    let s = &buf[*pos..end];
    *pos = end;
    Ok(s)
}

fn uuid_at(buf: &[u8], pos: &mut usize) -> Result<uuid::Uuid, FrameError> {
    let b = take(buf, pos, 16)?;
    let mut a = [0u8; 16];
    a.copy_from_slice(b);
    Ok(uuid::Uuid::from_bytes(a))
}

/// A frame read in place from an uncompressed frame buffer: what `Frame` holds, borrowed (a
/// reader that writes each record out at once, as a fetch does, allocates nothing per frame).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FrameView<'a> {
    pub message_id: uuid::Uuid,
    pub transaction_id: Cow<'a, str>,
    pub trace_id: Option<uuid::Uuid>,
    pub producer: Option<Cow<'a, str>>,
    pub encrypted: bool,
    pub payload: &'a [u8],
}

impl FrameView<'_> {
    pub fn to_frame(&self) -> Frame {
        Frame {
            message_id: self.message_id,
            transaction_id: self.transaction_id.clone().into_owned(),
            trace_id: self.trace_id,
            producer: self.producer.clone().map(Cow::into_owned),
            encrypted: self.encrypted,
            payload: self.payload.to_vec(),
        }
    }
}

/// Reads frames `[start, start + take)` of an uncompressed frame buffer holding `count` frames,
/// in place.
pub fn frame_views(
    raw: &[u8],
    start: usize,
    take_n: usize,
    count: usize,
) -> Result<Vec<FrameView<'_>>, FrameError> {
    let slice = raw_frames(raw, start, take_n, count)?;
    let mut pos = 0usize;
    let mut out = Vec::with_capacity(take_n);
    for _ in 0..take_n {
        let len_bytes = take(slice, &mut pos, 4)?;
        let body_len =
            u32::from_le_bytes([len_bytes[0], len_bytes[1], len_bytes[2], len_bytes[3]]) as usize;
        let body = take(slice, &mut pos, body_len)?;
        let mut p = 0usize;
        let flags = take(body, &mut p, 1)?[0];
        let message_id = uuid_at(body, &mut p)?;
        let trace_id = if flags & FLAG_TRACE != 0 {
            Some(uuid_at(body, &mut p)?)
        } else {
            None
        };
        let l = take(body, &mut p, 2)?;
        let txid_len = u16::from_le_bytes([l[0], l[1]]) as usize;
        let transaction_id = String::from_utf8_lossy(take(body, &mut p, txid_len)?);
        let producer = if flags & FLAG_PRODUCER != 0 {
            let l = take(body, &mut p, 2)?;
            let n = u16::from_le_bytes([l[0], l[1]]) as usize;
            Some(String::from_utf8_lossy(take(body, &mut p, n)?))
        } else {
            None
        };
        out.push(FrameView {
            message_id,
            transaction_id,
            trace_id,
            producer,
            encrypted: flags & FLAG_ENCRYPTED != 0,
            payload: &body[p..],
        });
    }
    Ok(out)
}

/// Decodes frames `[start, start + take)` of an uncompressed frame buffer holding `count` frames.
pub fn decode_frames(
    raw: &[u8],
    start: usize,
    take_n: usize,
    count: usize,
) -> Result<Vec<Frame>, FrameError> {
    Ok(frame_views(raw, start, take_n, count)?
        .iter()
        .map(FrameView::to_frame)
        .collect())
}

/// The bytes of frames `[start, start + take)` of an uncompressed frame buffer holding `count`
/// frames, as they are (a framed pop answer ships them without decoding).
pub fn raw_frames(
    raw: &[u8],
    start: usize,
    take_n: usize,
    count: usize,
) -> Result<&[u8], FrameError> {
    if start.checked_add(take_n).is_none_or(|e| e > count) {
        return Err(FrameError::SliceOutOfRange {
            start,
            take: take_n,
            count,
        });
    }
    let mut pos = 0usize;
    let mut from = 0usize;
    for idx in 0..start + take_n {
        if idx == start {
            from = pos;
        }
        let len_bytes = take(raw, &mut pos, 4)?;
        let body_len =
            u32::from_le_bytes([len_bytes[0], len_bytes[1], len_bytes[2], len_bytes[3]]) as usize;
        take(raw, &mut pos, body_len)?;
    }
    Ok(&raw[from..pos])
}

/// Compresses encoded frames into a segment blob (zstd level 1 with the content size, like the
/// 2.x client's pre-framed pushes).
pub fn compress_blob(raw: &[u8]) -> Result<Vec<u8>, FrameError> {
    ZSTD_CONTEXTS.with(|cell| {
        let mut contexts = cell.borrow_mut();
        let compressor = match &mut contexts.compressor {
            Some(c) => c,
            empty => empty.insert(
                zstd::bulk::Compressor::new(1)
                    .map_err(|e| FrameError::Compression(e.to_string()))?,
            ),
        };
        compressor
            .compress(raw)
            .map_err(|e| FrameError::Compression(e.to_string()))
    })
}

/// One zstd compression and one decompression context per thread. A context is hundreds of KiB
/// of tables; `zstd::bulk::{compress, decompress}` allocated and freed one per call, which was
/// the broker's largest cost in a leased-consume profile (malloc). Reuse does not change output.
#[derive(Default)]
struct ZstdContexts {
    compressor: Option<zstd::bulk::Compressor<'static>>,
    decompressor: Option<zstd::bulk::Decompressor<'static>>,
}

thread_local! {
    static ZSTD_CONTEXTS: std::cell::RefCell<ZstdContexts> = std::cell::RefCell::default();
}

/// Decompresses `blob` into at most `capacity` bytes with this thread's context.
pub(crate) fn zstd_decompress(blob: &[u8], capacity: usize) -> std::io::Result<Vec<u8>> {
    ZSTD_CONTEXTS.with(|cell| {
        let mut contexts = cell.borrow_mut();
        let decompressor = match &mut contexts.decompressor {
            Some(d) => d,
            empty => empty.insert(zstd::bulk::Decompressor::new()?),
        };
        decompressor.decompress(blob, capacity)
    })
}

/// Largest decompressed segment accepted; bounds memory on a corrupt or hostile blob.
pub const MAX_SEGMENT_BYTES: usize = 256 * 1024 * 1024;

pub fn decompress_blob(blob: &[u8]) -> Result<Vec<u8>, FrameError> {
    let size = zstd::zstd_safe::get_frame_content_size(blob)
        .ok()
        .flatten()
        .map(|s| s as usize)
        .unwrap_or(MAX_SEGMENT_BYTES);
    zstd_decompress(blob, size.min(MAX_SEGMENT_BYTES))
        .map_err(|e| FrameError::Compression(e.to_string()))
}

/// Encode and compress in one step (what a push does per (queue, partition) group).
pub fn build_blob(frames: &[Frame]) -> Result<Vec<u8>, FrameError> {
    compress_blob(&encode_frames(frames)?)
}

/// Decompress a blob and slice frames `[start, start + take)`: the broker side of a pop.
pub fn slice_blob(
    blob: &[u8],
    start: usize,
    take_n: usize,
    count: usize,
) -> Result<Vec<Frame>, FrameError> {
    decode_frames(&decompress_blob(blob)?, start, take_n, count)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(i: u8, trace: bool) -> Frame {
        Frame {
            message_id: uuid::Uuid::from_bytes([i; 16]),
            transaction_id: format!("tx-{i}"),
            trace_id: trace.then(|| uuid::Uuid::from_bytes([i + 100; 16])),
            producer: (i % 3 == 1).then(|| format!("svc-{i}")),
            encrypted: i % 4 == 3,
            payload: format!("{{\"n\":{i}}}").into_bytes(),
        }
    }

    #[test]
    fn round_trip_and_slice() {
        // Every combination of the optional parts: trace id, producer, sealed payload.
        let frames: Vec<Frame> = (0..5).map(|i| frame(i, i % 2 == 0)).collect();
        assert!(frames
            .iter()
            .any(|f| f.producer.is_some() && f.trace_id.is_none()));
        assert!(frames.iter().any(|f| f.encrypted));
        let blob = build_blob(&frames).expect("encode");
        assert_eq!(slice_blob(&blob, 0, 5, 5).expect("all"), frames);
        assert_eq!(
            slice_blob(&blob, 2, 2, 5).expect("mid"),
            frames[2..4].to_vec()
        );
        assert!(matches!(
            slice_blob(&blob, 4, 2, 5),
            Err(FrameError::SliceOutOfRange { .. })
        ));
    }

    #[test]
    fn corrupt_blobs_are_errors_not_panics() {
        assert!(decompress_blob(b"not zstd").is_err());
        let raw = encode_frames(&[frame(1, false)]).expect("encode");
        assert!(decode_frames(&raw[..raw.len() - 3], 0, 1, 1).is_err());
    }
}
