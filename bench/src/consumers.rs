//! Scenario 12: many concurrent consumers. One 1,000-partition backlog drained by 16 consumers,
//! then by many (1,000 in the full plan), each on its own connection and its own broker (a fresh
//! limiter), leased JSON pops of batch 100 acked whole, each pop a 200 ms long-poll (a consumer
//! with nothing to take parks on the broker rather than polling it). The
//! many-consumer rate is read against the 16-consumer rate, and the serving limiter's limit is
//! traced over both runs (every 100 ms, with the machine's idle share).

use std::time::Duration;

use crate::consume::{broker_rate, Consume};
use crate::limiter::{trace_json, trace_rows, LimitTrace};
use crate::util::{Endpoint, Row};

const PARTITIONS: usize = 1_000;
/// The baseline's consumers.
const FEW: usize = 16;

pub async fn consumers_scenario(
    pg: &queen_storage_pg::PgStorage,
    total: usize,
    many: usize,
    series: &mut Vec<serde_json::Value>,
) -> Vec<Row> {
    let mut rows = vec![];
    let mut few_rate = f64::NAN;
    for (k, consumers) in [FEW, many].into_iter().enumerate() {
        let (app, addr) = crate::start_with(pg, crate::bench_config(), 31 + k as u64).await;
        let trace = LimitTrace::start(&app, Duration::from_millis(100));
        let queue = format!("consumers-{PARTITIONS}-{consumers}");
        let rate = broker_rate(
            &app,
            &Endpoint::open(addr),
            &queue,
            PARTITIONS,
            consumers,
            Consume::LeasedLongPoll,
            total,
        )
        .await;
        let samples = trace.stop().await;
        app.shutting_down.send_replace(true);
        let label = format!(
            "consume leased, batch 100, {PARTITIONS} partitions, {consumers} concurrent consumers"
        );
        if k == 0 {
            few_rate = rate;
        }
        rows.push(Row::new(
            label.clone(),
            "msg/s",
            rate,
            format!("{FEW} consumers"),
            few_rate,
        ));
        rows.extend(trace_rows(&label, &samples));
        series.push(trace_json(&label, &samples));
    }
    rows
}
