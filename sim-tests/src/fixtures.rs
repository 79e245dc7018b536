//! Building blocks for tests: pushes, pop requests, a blocking executor for the model.

use std::future::Future;
use std::task::{Context, Poll, Waker};

use queen_core::claim::SubscriptionIntent;
use queen_core::delivery::{claims_to_messages, DeliveredMessage};
use queen_core::frames::Frame;
use queen_core::ids::IdMinter;
use queen_core::rng::SeededRng;
use queen_core::storage::{PopRequest, PopResult, PushGroup};
use queen_core::{Timestamp, WorkerId};

/// Runs a future that never waits on I/O (the model in free-run mode) to completion.
pub fn block_on<F: Future>(fut: F) -> F::Output {
    let mut fut = std::pin::pin!(fut);
    let mut cx = Context::from_waker(Waker::noop());
    loop {
        if let Poll::Ready(v) = fut.as_mut().poll(&mut cx) {
            return v;
        }
    }
}

/// Mints message and worker ids deterministically.
pub struct Ids(IdMinter, Timestamp);

impl Ids {
    pub fn new(seed: u64) -> Self {
        Ids(
            IdMinter::new(SeededRng::new(seed).child("test-ids")),
            Timestamp::from_secs(1_700_000_000),
        )
    }
    pub fn uuid(&mut self) -> uuid::Uuid {
        self.1 = self.1.plus_millis(1);
        self.0.mint(self.1)
    }
    pub fn worker(&mut self) -> WorkerId {
        WorkerId(self.uuid())
    }
}

/// A push group of JSON payloads `{"n": i}` with transaction ids `{prefix}-{i}`.
pub fn group(
    ids: &mut Ids,
    queue: &str,
    partition: &str,
    prefix: &str,
    range: std::ops::Range<u32>,
) -> PushGroup {
    PushGroup {
        queue: queue.into(),
        partition: partition.into(),
        frames: range
            .map(|i| Frame {
                producer: None,
                encrypted: false,
                message_id: ids.uuid(),
                transaction_id: format!("{prefix}-{i}"),
                trace_id: None,
                payload: format!("{{\"n\":{i}}}").into_bytes(),
            })
            .collect(),
        blob: None,
    }
}

pub fn pop_req(queue: &str, group: &str, worker: WorkerId, batch: u32) -> PopRequest {
    PopRequest {
        queue: queue.into(),
        group: group.into(),
        worker,
        batch,
        max_partitions: 1,
        auto_ack: false,
        lease_seconds: None,
        intent: SubscriptionIntent::default(),
        skip_window_debounce: false,
        conflation: false,
    }
}

/// Delivered messages of a pop, sliced from the blobs.
pub fn messages(r: &PopResult) -> Vec<DeliveredMessage> {
    claims_to_messages(&r.claims).unwrap_or_else(|e| panic!("blob slicing failed: {e}"))
}

/// The `n` field of each delivered payload.
pub fn payload_ns(r: &PopResult) -> Vec<u32> {
    messages(r)
        .iter()
        .map(|m| {
            let s = String::from_utf8_lossy(&m.frame.payload);
            s.trim_start_matches("{\"n\":")
                .trim_end_matches('}')
                .parse()
                .unwrap_or(u32::MAX)
        })
        .collect()
}
