//! The client side of Queen 2.x's binary forms, written from the wire reference (§2.4, §2.6,
//! §2.9) as client 2.6.0 speaks them: `QPB1` and `QTB1` bodies, and a reader of `QPF1` answers
//! that keeps what the broker chose per record (codec, base offset), which a test or the
//! benchmark wants to see and a client library hides.

#![allow(clippy::unwrap_used)] // writes into a Vec cannot fail

use std::io::Write;

pub const PUSH_CONTENT_TYPE: &str = "application/x-queen-push";

pub const FLAG_ZSTD: u8 = 1;
pub const FLAG_COUNTS: u8 = 2;
pub const FLAG_TXN: u8 = 4;
pub const FLAG_FRAMES: u8 = 8;

/// One (queue, partition) group of a binary push: payloads (one JSON document each) and, when
/// given, one transactionId per payload ("" lets the broker mint it).
#[derive(Clone, Debug)]
pub struct Batch {
    pub queue: String,
    pub partition: String,
    pub payloads: Vec<Vec<u8>>,
    pub transaction_ids: Option<Vec<String>>,
}

fn str16(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u16).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn u32le(out: &mut Vec<u8>, n: usize) {
    out.extend_from_slice(&(n as u32).to_le_bytes());
}

/// zstd level 1 with the content size written, as the client compresses.
pub fn zstd1(raw: &[u8]) -> Vec<u8> {
    let mut enc = zstd::stream::Encoder::new(Vec::new(), 1).expect("zstd encoder");
    enc.set_pledged_src_size(Some(raw.len() as u64))
        .expect("pledged size");
    enc.include_contentsize(true).expect("content size");
    enc.write_all(raw).expect("compress");
    enc.finish().expect("finish")
}

/// A plain `QPB1` body: `flags` may add FLAG_ZSTD and FLAG_COUNTS; FLAG_TXN is set when the
/// batches carry transactionIds.
pub fn push_plain(batches: &[Batch], flags: u8) -> Vec<u8> {
    let with_txn = batches.iter().any(|b| b.transaction_ids.is_some());
    let mut body = vec![];
    u32le(&mut body, batches.len());
    for b in batches {
        str16(&mut body, &b.queue);
        str16(&mut body, &b.partition);
        u32le(&mut body, b.payloads.len());
        for (i, p) in b.payloads.iter().enumerate() {
            if with_txn {
                let tx = b.transaction_ids.as_ref().map_or("", |t| t[i].as_str());
                str16(&mut body, tx);
            }
            u32le(&mut body, p.len());
            body.extend_from_slice(p);
        }
    }
    let flags = (flags & (FLAG_ZSTD | FLAG_COUNTS)) | if with_txn { FLAG_TXN } else { 0 };
    let mut out = b"QPB1".to_vec();
    out.push(flags);
    if flags & FLAG_ZSTD != 0 {
        u32le(&mut out, body.len());
        out.extend_from_slice(&zstd1(&body));
    } else {
        out.extend_from_slice(&body);
    }
    out
}

/// The frames of one batch as the client writes them: a UUIDv7-shaped id per message (from
/// `id_seed`, so runs are reproducible), the transactionId or the id's text.
pub fn frames_of(batch: &Batch, id_seed: &mut u64) -> Vec<u8> {
    let mut frames = vec![];
    for (i, p) in batch.payloads.iter().enumerate() {
        *id_seed += 1;
        let mut id = [0u8; 16];
        id[..6].copy_from_slice(&1_700_000_000_000u64.to_be_bytes()[2..]);
        id[6..14].copy_from_slice(&id_seed.to_be_bytes());
        id[6] = 0x70 | (id[6] & 0x0F);
        id[8] = 0x80 | (id[8] & 0x3F);
        let txid = match batch.transaction_ids.as_ref().map(|t| t[i].clone()) {
            Some(t) if !t.is_empty() => t,
            _ => uuid::Uuid::from_bytes(id).to_string(),
        };
        u32le(&mut frames, 1 + 16 + 2 + txid.len() + p.len());
        frames.push(0);
        frames.extend_from_slice(&id);
        str16(&mut frames, &txid);
        frames.extend_from_slice(p);
    }
    frames
}

fn frame_groups(out: &mut Vec<u8>, batches: &[Batch], id_seed: &mut u64) -> Vec<Vec<u8>> {
    u32le(out, batches.len());
    let mut blobs = vec![];
    for b in batches {
        let z = zstd1(&frames_of(b, id_seed));
        str16(out, &b.queue);
        str16(out, &b.partition);
        u32le(out, b.payloads.len());
        u32le(out, z.len());
        out.extend_from_slice(&z);
        blobs.push(z);
    }
    blobs
}

/// A framed `QPB1` body (flag 8, as `push_compression=True` sends), and each group's zstd frame.
pub fn push_frames(batches: &[Batch], counts: bool, id_seed: &mut u64) -> (Vec<u8>, Vec<Vec<u8>>) {
    let mut out = b"QPB1".to_vec();
    out.push(FLAG_FRAMES | if counts { FLAG_COUNTS } else { 0 });
    let blobs = frame_groups(&mut out, batches, id_seed);
    (out, blobs)
}

/// A `QTB1` body: the JSON head, then the pushes as framed groups.
pub fn transaction(
    head: &serde_json::Value,
    batches: &[Batch],
    counts: bool,
    id_seed: &mut u64,
) -> Vec<u8> {
    let head = serde_json::to_vec(head).unwrap();
    let mut out = b"QTB1".to_vec();
    out.push(if counts { FLAG_COUNTS } else { 0 });
    u32le(&mut out, head.len());
    out.extend_from_slice(&head);
    frame_groups(&mut out, batches, id_seed);
    out
}

/// One record of a framed pop answer, as sent.
#[derive(Clone, Debug)]
pub struct Record {
    pub base_offset: u64,
    pub created_at_us: i64,
    pub count: u32,
    pub codec: u8,
    pub bytes: Vec<u8>,
}

/// One message of a framed pop answer.
#[derive(Clone, Debug)]
pub struct FramedMessage {
    pub id: uuid::Uuid,
    pub transaction_id: String,
    /// The producer identity (frame flags & 2).
    pub producer: Option<String>,
    pub payload: Vec<u8>,
    pub offset: u64,
}

#[derive(Clone, Debug)]
pub struct FramedClaim {
    pub partition_id: u64,
    pub partition: String,
    pub start: u64,
    pub end: u64,
    pub delivery_attempt: u32,
    pub records: Vec<Record>,
    /// The messages in [start, end], in order.
    pub messages: Vec<FramedMessage>,
}

#[derive(Clone, Debug)]
pub struct FramedAnswer {
    /// Version 1's JSON object of the answer's own keys (e.g. `autopilot`).
    pub own_keys: Option<serde_json::Value>,
    pub queue: String,
    pub lease_id: String,
    pub consumer_group: String,
    pub claims: Vec<FramedClaim>,
}

struct In<'a>(&'a [u8], usize);

impl<'a> In<'a> {
    fn take(&mut self, n: usize) -> &'a [u8] {
        let s = &self.0[self.1..self.1 + n];
        self.1 += n;
        s
    }
    fn u8(&mut self) -> u8 {
        self.take(1)[0]
    }
    fn u16(&mut self) -> usize {
        u16::from_le_bytes(self.take(2).try_into().unwrap()) as usize
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.take(4).try_into().unwrap())
    }
    fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.take(8).try_into().unwrap())
    }
    fn text(&mut self) -> String {
        let n = self.u16();
        String::from_utf8(self.take(n).to_vec()).expect("utf-8")
    }
}

/// Reads a `QPF1` answer (panics on a malformed one: the test fails).
pub fn read_pop_frames(data: &[u8]) -> FramedAnswer {
    assert!(data.starts_with(b"QPF1"), "not a framed pop answer");
    let mut r = In(data, 4);
    let version = r.u8();
    let own_keys = (version == 1).then(|| {
        let n = r.u32() as usize;
        serde_json::from_slice(r.take(n)).expect("version 1's keys are a JSON object")
    });
    let queue = r.text();
    let lease_id = r.text();
    let consumer_group = r.text();
    let n = r.u32();
    let mut claims = vec![];
    for _ in 0..n {
        let partition_id = r.u64();
        let partition = r.text();
        let (start, end) = (r.u64(), r.u64());
        let delivery_attempt = r.u32();
        let mut records = vec![];
        let mut messages = vec![];
        for _ in 0..r.u32() {
            let base_offset = r.u64();
            let created_at_us = r.u64() as i64;
            let count = r.u32();
            let codec = r.u8();
            let len = r.u32() as usize;
            let bytes = r.take(len).to_vec();
            let raw = match codec {
                0 => bytes.clone(),
                1 => zstd::decode_all(&bytes[..]).expect("zstd record"),
                c => panic!("unknown codec {c}"),
            };
            let mut f = In(&raw, 0);
            for i in 0..count {
                let body_len = f.u32() as usize;
                let mut b = In(f.take(body_len), 0);
                let flags = b.u8();
                let id = uuid::Uuid::from_slice(b.take(16)).unwrap();
                if flags & 1 != 0 {
                    b.take(16);
                }
                let transaction_id = b.text();
                let producer = (flags & 2 != 0).then(|| b.text());
                assert!(flags & 4 == 0, "a sealed frame reached the client");
                let payload = b.0[b.1..].to_vec();
                let offset = base_offset + u64::from(i);
                if (start..=end).contains(&offset) {
                    messages.push(FramedMessage {
                        id,
                        transaction_id,
                        producer,
                        payload,
                        offset,
                    });
                }
            }
            records.push(Record {
                base_offset,
                created_at_us,
                count,
                codec,
                bytes,
            });
        }
        claims.push(FramedClaim {
            partition_id,
            partition,
            start,
            end,
            delivery_attempt,
            records,
            messages,
        });
    }
    assert_eq!(r.1, data.len(), "bytes after the framed answer");
    FramedAnswer {
        own_keys,
        queue,
        lease_id,
        consumer_group,
        claims,
    }
}
