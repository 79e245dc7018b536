//! The background work of a running broker: the wheel ticker, the per-minute sampler, the
//! retention worker, the timer worker, the failover buffer's drain, the ephemeral owners' liveness (with peers), (with PostgreSQL) the
//! cross-broker event listener and the database clock's alignment, and the admin totals' refresher (started by the first slow pass,
//! not here). `Broker::new` starts none of them; `start` starts the ones its settings ask for.

pub(crate) mod admin_totals;
pub(crate) mod buffer_drain;
pub mod db_clock;
pub mod ephemeral_liveness;
pub mod events;
pub mod retention;
pub mod sampler;
pub mod snapshot_watch;
pub(crate) mod ticker;
pub mod timers;

use std::sync::{Arc, Weak};
use std::time::Duration;

use crate::broker::Broker;

/// The turns of a periodic task (the database clock's alignment, the snapshot watch): the first
/// at once, each later one `period` after the last ended, none once the broker shuts down or is
/// dropped. Between turns the task holds only a weak reference.
pub(crate) struct Turns {
    broker: Weak<Broker>,
    period: Duration,
    first: bool,
}

impl Turns {
    pub(crate) fn new(broker: &Arc<Broker>, period: Duration) -> Turns {
        Turns {
            broker: Arc::downgrade(broker),
            period,
            first: true,
        }
    }

    /// The broker for the next turn; `None`: the task ends.
    pub(crate) async fn next(&mut self) -> Option<Arc<Broker>> {
        if !std::mem::take(&mut self.first) {
            let mut shutdown = self.broker.upgrade()?.shutting_down.subscribe();
            tokio::select! {
                _ = shutdown.wait_for(|s| *s) => return None,
                () = tokio::time::sleep(self.period) => {}
            }
        }
        let b = self.broker.upgrade()?;
        (!b.is_shutting_down()).then_some(b)
    }
}

/// Starts the broker's background tasks on the current tokio runtime. Each holds only a weak
/// reference and ends when the broker shuts down or is dropped.
pub fn start(broker: &Arc<Broker>) {
    sampler::start(broker);
    tokio::spawn(ticker::wheel_ticker(
        Arc::downgrade(broker),
        broker.ticker_rearm.clone(),
    ));
    tokio::spawn(timers::timer_worker(
        Arc::downgrade(broker),
        broker.timer_wake.clone(),
    ));
    if broker.config.retention.enabled() {
        tokio::spawn(retention::retention_worker(
            Arc::downgrade(broker),
            broker.config.retention,
            broker.seed,
        ));
    }
    if broker.ephemeral.address().is_some() {
        tokio::spawn(ephemeral_liveness::liveness(Arc::downgrade(broker)));
    }
    if broker.config.file_buffer.is_some() {
        tokio::spawn(buffer_drain::buffer_drain(
            Arc::downgrade(broker),
            broker.drain_wake.clone(),
        ));
    }
}
