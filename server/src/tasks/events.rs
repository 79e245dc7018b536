//! The cross-broker event feed: deliverability events committed through any broker on the same
//! PostgreSQL reach this broker's one event path.

use std::sync::Arc;

use crate::broker::Broker;

/// Feeds the deliverability events committed through any broker on the same PostgreSQL (LISTEN
/// queen_push and queen_event) into this broker's one event path, so parked consumers wake at
/// once, not at the next reseed. A (re)connected listener publishes a `Resync` first.
pub fn spawn_event_listener(
    broker: Arc<Broker>,
    pg: &queen_storage_pg::PgStorage,
) -> tokio::task::JoinHandle<()> {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(pg.listen_events(tx));
    tokio::spawn(forward_events(broker, rx))
}

/// Publishes every event from another broker (or storage's echo of this one's: applying an
/// event twice costs one extra look, never a wrong answer).
pub async fn forward_events(
    broker: Arc<Broker>,
    mut events: tokio::sync::mpsc::UnboundedReceiver<queen_core::events::DeliveryEvent>,
) {
    while let Some(event) = events.recv().await {
        broker.publish(&event);
    }
}
