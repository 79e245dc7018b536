//! Scenario 14: reads by offset. One partition of `messages` (1M in the full run) read from
//! offset 0 to its end by `POST /api/v1/fetch` (8 MiB per call, each call from one past the
//! last record), as JSON and framed (`?frames=true`, `QRF1`), against a raw segment scan in
//! the same run on the same rows: the segments by primary key, 100 at a time, each blob
//! decompressed and its frames decoded (what the broker does, without HTTP and JSON).

use std::time::Instant;

use serde_json::json;

use crate::util::{payload, pg_connect, Row};

const QUEUE: &str = "bench-fetch";
const PARTITION: &str = "p";

/// Pushes `n` messages into the partition, 1,000 per request.
async fn fill(addr: std::net::SocketAddr, n: u64) {
    let mut c = queen_raw_client::Client::connect(addr).await;
    let mut i = 0;
    while i < n {
        let items: Vec<_> = (i..(i + 1000).min(n))
            .map(|k| json!({"queue": QUEUE, "partition": PARTITION, "payload": payload(k)}))
            .collect();
        i += items.len() as u64;
        let body = serde_json::to_vec(&json!({ "items": items })).expect("json");
        let r = c.send("POST", "/api/v1/push", Some(&body)).await;
        assert_eq!(r.status, 201, "fill: {}", String::from_utf8_lossy(&r.body));
    }
}

#[derive(serde::Deserialize)]
struct Answer<'a> {
    #[serde(borrow)]
    entries: Vec<Entry<'a>>,
}

#[derive(serde::Deserialize)]
struct Entry<'a> {
    #[serde(borrow)]
    records: Vec<Record<'a>>,
}

#[derive(serde::Deserialize)]
struct Record<'a> {
    offset: i64,
    #[serde(borrow)]
    payload: &'a serde_json::value::RawValue,
}

/// (records/s, payload MiB/s) of reading the partition whole through the broker, answers framed
/// (`?frames=true`, `QRF1`) or in JSON.
async fn broker_read(addr: std::net::SocketAddr, n: u64, framed: bool) -> (f64, f64) {
    if framed {
        return broker_read_framed(addr, n).await;
    }
    let mut c = queen_raw_client::Client::connect(addr).await;
    let (mut offset, mut records, mut bytes) = (0i64, 0u64, 0u64);
    let started = Instant::now();
    while (records as i64) < n as i64 {
        let body = serde_json::to_vec(&json!({"entries": [
            {"queue": QUEUE, "partition": PARTITION, "offset": offset, "maxBytes": 8_388_608}],
            "maxBytes": 8_388_608}))
        .expect("json");
        let r = c.send("POST", "/api/v1/fetch", Some(&body)).await;
        assert_eq!(r.status, 200, "fetch: {}", String::from_utf8_lossy(&r.body));
        // As a typed reader would: payloads kept raw, not parsed into trees.
        let answer: Answer = serde_json::from_slice(&r.body).expect("fetch answer");
        let got = &answer.entries[0].records;
        let Some(last) = got.last() else {
            panic!("fetch stopped at offset {offset}");
        };
        offset = last.offset + 1;
        records += got.len() as u64;
        bytes += got
            .iter()
            .map(|r| r.payload.get().len() as u64)
            .sum::<u64>();
    }
    let secs = started.elapsed().as_secs_f64();
    (
        records as f64 / secs,
        bytes as f64 / secs / (1024.0 * 1024.0),
    )
}

async fn broker_read_framed(addr: std::net::SocketAddr, n: u64) -> (f64, f64) {
    let mut c = queen_raw_client::Client::connect(addr).await;
    let (mut offset, mut records, mut bytes) = (0i64, 0u64, 0u64);
    let started = Instant::now();
    while records < n {
        let body = serde_json::to_vec(&json!({"entries": [
            {"queue": QUEUE, "partition": PARTITION, "offset": offset, "maxBytes": 8_388_608}],
            "maxBytes": 8_388_608}))
        .expect("json");
        let r = c
            .send("POST", "/api/v1/fetch?frames=true", Some(&body))
            .await;
        assert_eq!(r.status, 200, "fetch: {}", String::from_utf8_lossy(&r.body));
        let entries = queen_core::wire::decode_fetch_frames(&r.body).expect("QRF1 answer");
        let got = &entries[0].records;
        let Some(last) = got.last() else {
            panic!("framed fetch stopped at offset {offset}");
        };
        offset = last.offset + 1;
        records += got.len() as u64;
        bytes += got.iter().map(|r| r.payload.len() as u64).sum::<u64>();
    }
    let secs = started.elapsed().as_secs_f64();
    (
        records as f64 / secs,
        bytes as f64 / secs / (1024.0 * 1024.0),
    )
}

/// The same through a raw segment scan: records/s and payload MiB/s.
async fn raw_read(cfg: &tokio_postgres::Config, n: u64) -> (f64, f64) {
    let c = pg_connect(cfg).await;
    let pid: uuid::Uuid = c
        .query_one(
            "SELECT p.id FROM queen.log_partitions p JOIN queen.queues q ON q.id = p.queue_id
              WHERE q.name = $1 AND p.name = $2",
            &[&QUEUE, &PARTITION],
        )
        .await
        .expect("partition id")
        .get(0);
    let scan = c
        .prepare(
            "SELECT base_offset, msg_count, blob FROM queen.log_segments
              WHERE partition_id = $1 AND base_offset >= $2 ORDER BY base_offset LIMIT 100",
        )
        .await
        .expect("prepare");
    let (mut from, mut records, mut bytes) = (0i64, 0u64, 0u64);
    let started = Instant::now();
    while records < n {
        let rows = c.query(&scan, &[&pid, &from]).await.expect("scan");
        assert!(!rows.is_empty(), "raw scan stopped at offset {from}");
        for r in &rows {
            let (base, count, blob): (i64, i32, Vec<u8>) = (r.get(0), r.get(1), r.get(2));
            let frames = queen_core::frames::slice_blob(&blob, 0, count as usize, count as usize)
                .expect("frames");
            records += frames.len() as u64;
            bytes += frames.iter().map(|f| f.payload.len() as u64).sum::<u64>();
            from = base + i64::from(count);
        }
    }
    let secs = started.elapsed().as_secs_f64();
    (
        records as f64 / secs,
        bytes as f64 / secs / (1024.0 * 1024.0),
    )
}

pub async fn reads_scenario(
    addr: std::net::SocketAddr,
    cfg: &tokio_postgres::Config,
    messages: u64,
) -> Vec<Row> {
    fill(addr, messages).await;
    eprintln!("filled a partition with {messages} messages");
    // Warm both paths once (the table's pages into shared buffers), then measure.
    raw_read(cfg, messages).await;
    let (raw_records, raw_mib) = raw_read(cfg, messages).await;
    let mut rows = vec![];
    for (framed, tag) in [(false, "fetch"), (true, "fetch framed (QRF1)")] {
        let (records, mib) = broker_read(addr, messages, framed).await;
        let scenario = format!("{tag}, one partition of {messages} messages from offset 0");
        rows.push(Row::new(
            scenario.clone(),
            "records/s",
            records,
            "raw segment scan",
            raw_records,
        ));
        rows.push(Row::new(
            scenario,
            "MiB/s",
            mib,
            "raw segment scan",
            raw_mib,
        ));
    }
    rows
}
