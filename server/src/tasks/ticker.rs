//! The wheel ticker: the one task that turns scheduled revisits into wakes.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;

use crate::broker::Broker;
use crate::helpers::lock;

/// The revisit ticker: sleeps until the earliest revisit any ring holds (a lease expiring, a
/// delay maturing, a windowBuffer or retryDelay hold ending, a busy partition's retry) or a
/// legacy probe said (`ProbeMemos::note_revisit`), then moves what came due to the ready queues
/// and opens those queues' gates. Parked queue-wide pops therefore wake at the revisit itself,
/// whatever their backoff timer says.
pub(crate) async fn wheel_ticker(broker: std::sync::Weak<Broker>, rearm: Arc<Notify>) {
    // At most one tick per millisecond: a revisit due this very microsecond (a lease ending now,
    // still held under storage's strict `<`) would otherwise be retried in a hot loop until the
    // clock moved on (in a simulation the clock only moves when every task is idle).
    const FLOOR: Duration = Duration::from_millis(1);
    loop {
        let Some(a) = broker.upgrade() else { return };
        if a.is_shutting_down() {
            return;
        }
        let next = lock(&a.pop_ctx).arm_ticker();
        let now = a.now();
        let sleep =
            next.map(|t| Duration::from_micros(u64::try_from(t.0 - now.0).unwrap_or(0)).max(FLOOR));
        let mut shutdown = a.shutting_down.subscribe();
        // Not holding the broker while asleep: a dropped broker ends its ticker.
        drop(a);
        let due = async {
            match sleep {
                Some(d) => tokio::time::sleep(d).await,
                None => std::future::pending().await,
            }
        };
        let fired = tokio::select! {
            biased;
            _ = shutdown.wait_for(|s| *s) => return,
            () = rearm.notified() => false,
            () = due => true,
        };
        if !fired {
            continue;
        }
        let Some(a) = broker.upgrade() else { return };
        let queues = lock(&a.pop_ctx).advance_due(a.now());
        for q in &queues {
            a.metrics.count_event("revisit");
            a.wake(q);
        }
    }
}
