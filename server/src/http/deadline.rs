//! A request's storage deadline, which the body's arrival does not count against.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// When a request's own work is past the storage deadline: counted from the end of its body, as
/// the body's arrival is the client's part (a stalled body is the client-idle timeout's, 408, and
/// a slow one that keeps arriving is no failure of storage). `serve::answer` waits for it beside
/// the route, and puts it in the request's extensions for `routes::body`, which moves it. Its
/// timer wakes nothing before the first deadline, so a request served within it is polled
/// exactly as under a plain timeout.
#[derive(Clone)]
pub(crate) struct WorkDeadline(Arc<DeadlineState>);

struct DeadlineState {
    started: tokio::time::Instant,
    limit: Duration,
    /// Milliseconds after `started` that the deadline falls at; `READING_BODY`: none yet.
    at_ms: AtomicU64,
}

const READING_BODY: u64 = u64::MAX;

impl WorkDeadline {
    pub(crate) fn new(limit: Duration) -> Self {
        WorkDeadline(Arc::new(DeadlineState {
            started: tokio::time::Instant::now(),
            limit,
            at_ms: AtomicU64::new(Self::ms(limit)),
        }))
    }

    fn ms(after_start: Duration) -> u64 {
        u64::try_from(after_start.as_millis()).unwrap_or(READING_BODY - 1)
    }

    /// Ends once the deadline has passed. Looked at when the timer fires: a body that ended
    /// since moved the deadline later, and one still arriving puts it off by a whole deadline.
    pub(crate) async fn passed(&self) {
        let mut at = self.0.started + self.0.limit;
        loop {
            tokio::time::sleep_until(at).await;
            at = match self.0.at_ms.load(Ordering::Acquire) {
                READING_BODY => tokio::time::Instant::now() + self.0.limit,
                ms => {
                    let moved = self.0.started + Duration::from_millis(ms);
                    if moved <= at {
                        return;
                    }
                    moved
                }
            };
        }
    }

    /// The body is being read: no deadline until it has arrived.
    pub(crate) fn body_started(&self) {
        self.0.at_ms.store(READING_BODY, Ordering::Release);
    }

    /// The body has arrived (or failed to): the whole deadline from now.
    pub(crate) fn body_ended(&self) {
        let at = Self::ms(self.0.started.elapsed() + self.0.limit);
        self.0.at_ms.store(at, Ordering::Release);
    }
}
