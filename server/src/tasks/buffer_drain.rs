//! The failover buffer's drain: pushes written to the file buffer while storage was away (or
//! push maintenance was on) are stored, oldest first, once storage answers.

use std::sync::atomic::Ordering;

use crate::broker::Broker;

/// Stores what the file buffer holds, oldest first, whenever there is something and storage
/// answers; sleeps while push maintenance mode is on. A buffered push storage refuses for good
/// (its data, not its availability) is set aside so the rest can go.
pub(crate) async fn buffer_drain(
    broker: std::sync::Weak<Broker>,
    wake: std::sync::Arc<tokio::sync::Notify>,
) {
    const RETRY: std::time::Duration = std::time::Duration::from_millis(500);
    loop {
        let Some(a) = broker.upgrade() else { return };
        if a.is_shutting_down() {
            return;
        }
        let work = !a.push_maintenance.load(Ordering::SeqCst)
            && a.config
                .file_buffer
                .as_ref()
                .is_some_and(|b| b.pending() > 0);
        let stalled = work && !a.drain_step().await;
        let mut shutdown = a.shutting_down.subscribe();
        drop(a);
        if work && !stalled {
            continue;
        }
        tokio::select! {
            _ = shutdown.wait_for(|s| *s) => return,
            () = wake.notified() => {}
            () = tokio::time::sleep(RETRY) => {}
        }
    }
}
