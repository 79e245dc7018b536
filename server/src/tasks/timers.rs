//! The timer worker: fires due timers. Each broker runs one and none leads: a firing is one
//! transaction that removes the timer (this incarnation, if still pending and due) and pushes its
//! message, so when two brokers fire one timer the second removes nothing and rolls back.
//!
//! It sleeps until the earliest due time it read, and reads it again when this broker schedules a
//! timer (`Broker::timer_wake`), so a timer fires at its due time by an event. Timers other
//! brokers scheduled are fired by them the same way; the re-scan every `TIMER_RESCAN_MS` only
//! covers a broker that died holding the next due time in memory.

use std::sync::{Arc, Weak};
use std::time::Duration;

use queen_core::storage::firing;
use queen_core::storage::{StorageResult, TxOpResult, TxOutcome};

use crate::broker::Broker;

/// Timers fired per transaction.
const FIRE_BATCH: u32 = 100;
/// After a storage error.
const ERROR_PAUSE: Duration = Duration::from_millis(500);

pub async fn timer_worker(broker: Weak<Broker>, wake: Arc<tokio::sync::Notify>) {
    loop {
        let Some(b) = broker.upgrade() else { return };
        if *b.shutting_down.borrow() {
            return;
        }
        let (rescan_ms, bugs) = b.timer_hooks();
        let rescan = Duration::from_millis(rescan_ms);
        let pause = match fire_due(&b).await {
            Ok(()) => match b.storage.timers.next_timer_due().await {
                Ok(Some(at)) => {
                    let wait_ms = (at.0 - b.now().0).div_euclid(1000).max(0) as u64;
                    // Due by this clock but not by the database's: come back shortly.
                    if bugs.wait_for_rescan {
                        rescan
                    } else {
                        Duration::from_millis(wait_ms.max(5)).min(rescan)
                    }
                }
                Ok(None) => rescan,
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

/// Fires every timer due now, a batch per transaction. A batch refused because another
/// broker fired (or a cancel removed) one of its timers is read again: the timer is gone from
/// the due set, and the rest still fire together. A batch refused for anything else (its
/// push) is fired one timer at a time, so one timer that cannot fire does not hold up the others.
pub async fn fire_due(broker: &Arc<Broker>) -> StorageResult<()> {
    loop {
        let due = broker.storage.timers.due_timers(FIRE_BATCH).await?;
        if due.is_empty() {
            return Ok(());
        }
        let full = due.len() == FIRE_BATCH as usize;
        let out = broker.transaction(firing(&due), None).await?;
        if out.committed {
            broker.metrics.timers_fired.inc_by(due.len() as u64);
        } else if lost_a_timer(&out) {
            // Someone else made progress on this set: read it again.
            continue;
        } else {
            for timer in &due {
                let one = broker
                    .transaction(firing(std::slice::from_ref(timer)), None)
                    .await?;
                if one.committed {
                    broker.metrics.timers_fired.inc();
                }
            }
        }
        if !full {
            return Ok(());
        }
    }
}

/// Whether a refused firing lost one of its timers (fired elsewhere, cancelled or
/// rescheduled since it was read), rather than failing in its push.
fn lost_a_timer(out: &TxOutcome) -> bool {
    out.results
        .iter()
        .any(|r| matches!(r, TxOpResult::Fired(false)))
}
