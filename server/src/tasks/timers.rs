//! The timer worker: fires due timers. Each broker runs one and none leads: a firing is one
//! transaction that removes the timer (this incarnation, if still pending and due) and pushes its
//! message, so when two brokers fire one timer the second removes nothing and rolls back.
//!
//! It sleeps until the earliest due time it read, and reads it again when this broker schedules a
//! timer (`Broker::timer_wake`), so a timer fires at its due time by an event. Timers other
//! brokers scheduled are fired by them the same way; the re-scan every `TIMER_RESCAN_MS` only
//! covers a broker that died holding the next due time in memory.

use std::collections::BTreeMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

use queen_core::storage::firing;
use queen_core::storage::{StorageResult, TxOpResult, TxOutcome};

use queen_core::types::Timestamp;

use crate::broker::Broker;

/// Timers fired per transaction: a burst of timers due at one instant fires in sets this
/// large (at 100 a set, 10,000 due at once took 5x the raw poller's lateness).
const FIRE_BATCH: u32 = 1000;
/// How long a queue that refused a timer's push at its maxSize is left alone.
const FULL_QUEUE_RETRY_MS: i64 = 1000;
/// After a storage error.
const ERROR_PAUSE: Duration = Duration::from_millis(500);

pub async fn timer_worker(broker: Weak<Broker>, wake: Arc<tokio::sync::Notify>) {
    let mut full_queues = FullQueues::default();
    loop {
        let Some(b) = broker.upgrade() else { return };
        if *b.shutting_down.borrow() {
            return;
        }
        let (rescan_ms, bugs) = b.timer_hooks();
        let rescan = Duration::from_millis(rescan_ms);
        let until_ms = |at: Timestamp| (at.0 - b.now().0).div_euclid(1000).max(0) as u64;
        full_queues.forget_retried(b.now());
        let pause = match fire_due(&b, &mut full_queues).await {
            Ok(()) => match b.storage.timers.next_timer_due(&full_queues.names()).await {
                Ok(next) => {
                    // A full queue's timers are tried again at its retry time.
                    let next = next.into_iter().chain(full_queues.next_retry()).min();
                    match next {
                        // Due by this clock but not by the database's: come back shortly.
                        Some(at) if !bugs.wait_for_rescan => {
                            Duration::from_millis(until_ms(at).max(5)).min(rescan)
                        }
                        _ => rescan,
                    }
                }
                Err(e) => {
                    b.note_storage_error("timers", &e);
                    ERROR_PAUSE
                }
            },
            Err(e) => {
                b.note_storage_error("timers", &e);
                ERROR_PAUSE
            }
        };
        drop(b);
        if bugs.wait_for_rescan {
            tokio::time::sleep(pause).await;
            continue;
        }
        tokio::select! {
            _ = tokio::time::sleep(pause) => {}
            _ = wake.notified() => {}
        }
    }
}

/// Queues whose timer pushes were refused at their maxSize, each with when to try it again.
/// Their timers stay pending (a timer never fires early, and fires once it can); meanwhile the
/// worker's reads pass them over, so a full queue's timers neither keep the worker busy
/// refiring them nor stand in front of other queues' due timers.
#[derive(Default)]
pub struct FullQueues(BTreeMap<String, Timestamp>);

impl FullQueues {
    fn note_full(&mut self, queue: &str, now: Timestamp) {
        self.0
            .insert(queue.to_string(), now.plus_millis(FULL_QUEUE_RETRY_MS));
    }

    fn forget_retried(&mut self, now: Timestamp) {
        self.0.retain(|_, retry_at| *retry_at > now);
    }

    fn names(&self) -> Vec<String> {
        self.0.keys().cloned().collect()
    }

    fn next_retry(&self) -> Option<Timestamp> {
        self.0.values().min().copied()
    }
}

/// Fires every timer due now, a batch per transaction. A batch refused because another
/// broker fired (or a cancel removed) one of its timers is read again: the timer is gone from
/// the due set, and the rest still fire together. A batch refused for anything else (a push
/// into a queue at its maxSize) is fired one timer at a time up to the first timer refused:
/// its queue is noted full and left out until its retry time, and the set is read again
/// without it.
pub async fn fire_due(broker: &Arc<Broker>, full_queues: &mut FullQueues) -> StorageResult<()> {
    loop {
        let due = broker
            .storage
            .timers
            .due_timers(FIRE_BATCH, &full_queues.names())
            .await?;
        if due.is_empty() {
            return Ok(());
        }
        let full = due.len() == FIRE_BATCH as usize;
        let out = broker.transaction(firing(&due), None).await?;
        if out.committed {
            broker.metrics.timers_fired.inc_by(due.len() as u64);
        } else if lost_a_timer(&out) {
            // Someone else made progress on this set: read it again.
            tokio::task::yield_now().await;
            continue;
        } else {
            let mut newly_full = false;
            for timer in &due {
                let one = broker
                    .transaction(firing(std::slice::from_ref(timer)), None)
                    .await?;
                if one.committed {
                    broker.metrics.timers_fired.inc();
                } else if !lost_a_timer(&one) {
                    full_queues.note_full(&timer.queue, broker.now());
                    newly_full = true;
                    break;
                }
            }
            if newly_full {
                // The rest fire together once the full queue is left out. Each pass here
                // adds a queue to the set, so this ends.
                tokio::task::yield_now().await;
                continue;
            }
        }
        if !full {
            return Ok(());
        }
        // The in-memory backend answers without ever pending: a long due set must not keep
        // this worker on its thread from one set to the next.
        tokio::task::yield_now().await;
    }
}

/// Whether a refused firing lost one of its timers (fired elsewhere, cancelled or
/// rescheduled since it was read), rather than failing in its push.
fn lost_a_timer(out: &TxOutcome) -> bool {
    out.results
        .iter()
        .any(|r| matches!(r, TxOpResult::Fired(false)))
}
