//! The ephemeral owners' liveness: a broker that shares ephemeral queues with others renews its
//! row every `HEARTBEAT_MS` (`queen_core::ephemeral::ownership`), and removes it when it shuts
//! down, so its queues can be claimed at once rather than after `ALIVE_MS`. After a lapse it
//! claims again the queues whose rings it kept, so the ring of a queue that moved is dropped.

use std::sync::Weak;
use std::time::Duration;

use queen_core::ephemeral::ownership::{ALIVE_MS, HEARTBEAT_MS};
use queen_core::storage::StorageResult;

use crate::broker::Broker;
use crate::ephemeral::Owner;

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
            broker.ephemeral.beat_stored(sent, broker.now());
            true
        }
        Err(e) => {
            broker.note_storage_error("ephemeral", &e);
            false
        }
    }
}

/// One round of the liveness task: renews this broker's liveness and, if storage took it,
/// settles the rings a lapse left unresolved. Answers whether the renewal was stored.
pub async fn renew(broker: &Broker) -> bool {
    let stored = beat(broker).await;
    if stored {
        settle_rings(broker).await;
    }
    stored
}

/// Claims again each queue whose ring this broker kept through a lapse and that no call has
/// resolved since (`Ephemeral::unresolved_rings`): a ring of a queue that moved meanwhile is
/// dropped now, not when a call for it happens to come.
async fn settle_rings(broker: &Broker) {
    for queue in broker.ephemeral.unresolved_rings() {
        if let Err(e) = claim(broker, &queue).await {
            broker.note_storage_error("ephemeral", &e);
            return;
        }
    }
}

/// Claims `queue` through storage (this broker, unless a live one already owns it) and records
/// the answer: where the queue's ring is now.
pub(crate) async fn claim(broker: &Broker, queue: &str) -> StorageResult<Owner> {
    let claim = broker
        .storage
        .ephemeral_owners
        .ephemeral_claim(
            queue,
            broker.ephemeral.incarnation(),
            broker.ephemeral.takeover_after_ms(),
        )
        .await?;
    Ok(broker.ephemeral.claimed(queue, &claim))
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
        renew(&b).await;
        drop(b);
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(HEARTBEAT_MS)) => {}
            _ = shutdown.changed() => {}
        }
    }
}
