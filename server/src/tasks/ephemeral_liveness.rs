//! The ephemeral owners' liveness: a broker that shares ephemeral queues with others renews its
//! row every `HEARTBEAT_MS` (`queen_core::ephemeral::ownership`), and removes it when it shuts
//! down, so its queues can be claimed at once rather than after `ALIVE_MS`.

use std::sync::Weak;
use std::time::Duration;

use queen_core::ephemeral::ownership::{ALIVE_MS, HEARTBEAT_MS};

use crate::broker::Broker;

/// Renews this broker's liveness once; answers whether storage took it.
pub(crate) async fn beat(broker: &Broker) -> bool {
    let Some(address) = broker.ephemeral.address() else {
        return true;
    };
    if *broker.shutting_down.borrow() {
        return false;
    }
    let sent = broker.now();
    match broker
        .storage
        .ephemeral_owners
        .ephemeral_heartbeat(broker.ephemeral.incarnation(), address, ALIVE_MS)
        .await
    {
        Ok(()) => {
            broker.ephemeral.beat_stored(sent);
            true
        }
        Err(e) => {
            broker.note_storage_error("ephemeral", &e);
            false
        }
    }
}

pub(crate) async fn liveness(broker: Weak<Broker>) {
    let mut shutdown = match broker.upgrade() {
        Some(b) => b.shutting_down.subscribe(),
        None => return,
    };
    loop {
        let Some(b) = broker.upgrade() else { return };
        if *b.shutting_down.borrow() {
            b.ephemeral.resign();
            let _ = b
                .storage
                .ephemeral_owners
                .ephemeral_leave(b.ephemeral.incarnation())
                .await;
            return;
        }
        beat(&b).await;
        drop(b);
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(HEARTBEAT_MS)) => {}
            _ = shutdown.changed() => {}
        }
    }
}
