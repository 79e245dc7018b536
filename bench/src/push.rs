//! Scenario 1: push throughput against (a) one row per message (multi-row INSERT) and (b) one
//! zstd segment row per batch with offsets from the partition row.

use std::sync::atomic::Ordering;

use queen_core::frames::{build_blob, Frame};
use queen_raw_client::wire;
use serde_json::{json, Value};

use crate::util::{measure_with_cpu, payload, pg_connect, Row};

pub const PRODUCERS: usize = 8;
pub const PARTITIONS: usize = 10;

pub async fn push_scenario(
    addr: std::net::SocketAddr,
    cfg: &tokio_postgres::Config,
    batch: usize,
    secs: u64,
) -> Vec<Row> {
    let broker = broker_push(addr, batch, secs, PushForm::Json, None).await;
    // Queen 2.x's binary push where batches are large enough for it to matter.
    let binary = if batch >= 100 {
        vec![
            (
                PushForm::Binary,
                broker_push(addr, batch, secs, PushForm::Binary, None).await,
            ),
            (
                PushForm::Framed,
                broker_push(addr, batch, secs, PushForm::Framed, None).await,
            ),
        ]
    } else {
        vec![]
    };
    let (rows, (_, rows_pg_cpu)) = raw_rows(cfg, batch, secs).await;
    let (segs, (_, segs_pg_cpu)) = raw_segments(cfg, batch, secs).await;
    let baselines = Baselines {
        rows,
        rows_pg_cpu,
        segs,
        segs_pg_cpu,
    };
    let forms = std::iter::once((PushForm::Json, broker)).chain(binary);
    forms
        .flat_map(|(form, measured)| push_rows(batch, form, measured, &baselines))
        .collect()
}

/// The raw baselines' rates and PostgreSQL CPU per message.
struct Baselines {
    rows: f64,
    rows_pg_cpu: f64,
    segs: f64,
    segs_pg_cpu: f64,
}

/// (a) one row per message, multi-row INSERT: (msg/s, (broker CPU, msg per PostgreSQL CPU-s)).
pub(crate) async fn raw_rows(
    cfg: &tokio_postgres::Config,
    batch: usize,
    secs: u64,
) -> (f64, (f64, f64)) {
    let cfg_a = cfg.clone();
    measure_with_cpu(PRODUCERS, secs, move |t, stop, count| {
        let cfg = cfg_a.clone();
        async move {
            let c = pg_connect(&cfg).await;
            let values: Vec<String> = (0..batch)
                .map(|k| {
                    format!(
                        "(${}, ${}, ${}::text::jsonb)",
                        k * 3 + 1,
                        k * 3 + 2,
                        k * 3 + 3
                    )
                })
                .collect();
            let sql = format!(
                "INSERT INTO bench.rows (partition, txid, payload) VALUES {}",
                values.join(",")
            );
            let stmt = c.prepare(&sql).await.expect("prepare");
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let mut owned: Vec<(String, String, String)> = vec![];
                let partition = format!("p{}", (t + i as usize) % PARTITIONS);
                for _ in 0..batch {
                    i += 1;
                    owned.push((
                        partition.clone(),
                        format!("{batch}-{t}-{i}"),
                        payload(i).to_string(),
                    ));
                }
                let mut params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = vec![];
                for (p, x, d) in &owned {
                    params.push(p);
                    params.push(x);
                    params.push(d);
                }
                c.execute(&stmt, &params).await.expect("insert rows");
                count.fetch_add(batch as u64, Ordering::Relaxed);
            }
        }
    })
    .await
}

/// (b) one segment row per batch, offsets from the partition row.
async fn raw_segments(cfg: &tokio_postgres::Config, batch: usize, secs: u64) -> (f64, (f64, f64)) {
    let cfg_b = cfg.clone();
    measure_with_cpu(PRODUCERS, secs, move |t, stop, count| {
        let cfg = cfg_b.clone();
        async move {
            let mut c = pg_connect(&cfg).await;
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let p = ((t + i as usize) % PARTITIONS) as i32;
                let frames: Vec<Frame> = (0..batch)
                    .map(|_| {
                        i += 1;
                        Frame { producer: None, encrypted: false, message_id: uuid::Uuid::from_u128(u128::from(i)), transaction_id: format!("{t}-{i}"), trace_id: None, payload: payload(i).to_string().into_bytes() }
                    })
                    .collect();
                let blob = build_blob(&frames).expect("blob");
                let tx = c.transaction().await.expect("begin");
                let last: i64 = tx.query_one("SELECT last_offset FROM bench.parts WHERE id = $1 FOR NO KEY UPDATE", &[&p]).await.expect("lock").get(0);
                tx.execute(
                    "INSERT INTO bench.segments (pid, base_offset, end_offset, blob) VALUES ($1, $2, $3, $4)",
                    &[&p, &(last + 1), &(last + batch as i64), &blob],
                )
                .await
                .expect("segment");
                tx.execute("UPDATE bench.parts SET last_offset = $2 WHERE id = $1", &[&p, &(last + batch as i64)]).await.expect("advance");
                tx.commit().await.expect("commit");
                count.fetch_add(batch as u64, Ordering::Relaxed);
            }
        }
    })
    .await
}

/// One push form's rows against both baselines, by rate and per CPU-second.
fn push_rows(
    batch: usize,
    form: PushForm,
    (rate, (broker_cpu, pg_cpu)): (f64, (f64, f64)),
    b: &Baselines,
) -> Vec<Row> {
    let scenario = format!("push, batch {batch}, {PRODUCERS} producers, {PARTITIONS} partitions");
    let scenario = match form {
        PushForm::Json => scenario,
        _ => format!("{scenario}, {}", form.name()),
    };
    // Per CPU-second (from /proc): steadier than rates on a machine the load shares.
    let metric = "msg per PostgreSQL CPU-s";
    vec![
        Row::new(scenario.clone(), "msg/s", rate, "(a) rows", b.rows),
        Row::new(scenario.clone(), "msg/s", rate, "(b) segments", b.segs),
        Row::new(scenario.clone(), metric, pg_cpu, "(a) rows", b.rows_pg_cpu),
        Row::new(
            scenario.clone(),
            metric,
            pg_cpu,
            "(b) segments",
            b.segs_pg_cpu,
        ),
        Row::new(scenario, "msg per broker CPU-s", broker_cpu, "-", f64::NAN),
    ]
}

/// How the benchmark's producers send a push.
#[derive(Clone, Copy)]
pub(crate) enum PushForm {
    Json,
    /// QPB1 with transactionIds (flag 4), as `binary_push=True` sends.
    Binary,
    /// QPB1 with client-compressed frames (flag 8), as `push_compression=True` sends.
    Framed,
}

impl PushForm {
    fn name(self) -> &'static str {
        match self {
            PushForm::Json => "JSON",
            PushForm::Binary => "QPB1",
            PushForm::Framed => "QPB1 compressed frames",
        }
    }
}

/// JSON pushes of `batch`, each carrying `token` when given (the auth scenario).
pub(crate) async fn json_push_rate(
    addr: std::net::SocketAddr,
    batch: usize,
    secs: u64,
    token: Option<String>,
) -> f64 {
    broker_push(addr, batch, secs, PushForm::Json, token)
        .await
        .0
}

/// Messages per second the broker stores from `PRODUCERS` producers pushing `batch` at a time,
/// and the messages per CPU-second of the broker and of PostgreSQL meanwhile.
pub(crate) async fn broker_push(
    addr: std::net::SocketAddr,
    batch: usize,
    secs: u64,
    form: PushForm,
    token: Option<String>,
) -> (f64, (f64, f64)) {
    // Marks the window's start for a profiler attached from outside.
    eprintln!("measuring push, batch {batch}, {}", form.name());
    measure_with_cpu(PRODUCERS, secs, move |t, stop, count| {
        let token = token.clone();
        async move {
        let mut c = crate::util::Endpoint { addr, token }.client().await;
        let mut i = 0u64;
        let mut ids = (t as u64) << 40;
        let queue = format!("push{batch}-{}", form.name().replace(' ', "-"));
        while !stop.load(Ordering::Relaxed) {
            // One partition per request, rotating, as the segment baseline writes.
            let partition = format!("p{}", (t + i as usize) % PARTITIONS);
            let start = i;
            i += batch as u64;
            let r = match form {
                PushForm::Json => {
                    let items: Vec<Value> = (start + 1..=i)
                        .map(|k| json!({"queue": queue, "partition": partition, "payload": payload(k), "transactionId": format!("{t}-{k}")}))
                        .collect();
                    c.post("/api/v1/push", &json!({ "items": items })).await
                }
                PushForm::Binary | PushForm::Framed => {
                    let b = wire::Batch {
                        queue: queue.clone(),
                        partition,
                        payloads: (start + 1..=i).map(|k| payload(k).to_string().into_bytes()).collect(),
                        transaction_ids: Some((start + 1..=i).map(|k| format!("{t}-{k}")).collect()),
                    };
                    let body = match form {
                        PushForm::Framed => wire::push_frames(&[b], false, &mut ids).0,
                        _ => wire::push_plain(&[b], 0),
                    };
                    c.post_bytes("/api/v1/push", wire::PUSH_CONTENT_TYPE, &body).await
                }
            };
            assert_eq!(r.status, 201, "push failed: {}", String::from_utf8_lossy(&r.body));
            count.fetch_add(batch as u64, Ordering::Relaxed);
        }
        }
    })
    .await
}
