//! One broker's reach to the model's ephemeral owner rows, which a test or the simulation can
//! cut: the broker's liveness renewals and claims fail as they would for a broker that lost
//! PostgreSQL, while its other storage and its peers' reach stay up.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use queen_core::storage::{
    EphemeralBroker, EphemeralClaim, EphemeralOwnerStorage, StorageError, StorageResult,
};

use crate::SimDb;

pub struct OwnerReach {
    db: Arc<SimDb>,
    cut: AtomicBool,
}

impl OwnerReach {
    pub fn new(db: Arc<SimDb>) -> Arc<OwnerReach> {
        Arc::new(OwnerReach {
            db,
            cut: AtomicBool::new(false),
        })
    }

    /// Cuts (`true`) or heals (`false`) the reach.
    pub fn set_cut(&self, cut: bool) {
        self.cut.store(cut, Ordering::SeqCst);
    }

    pub fn is_cut(&self) -> bool {
        self.cut.load(Ordering::SeqCst)
    }

    fn check(&self) -> StorageResult<()> {
        if self.is_cut() {
            return Err(StorageError::Unavailable(
                "cut off from the database".into(),
            ));
        }
        Ok(())
    }
}

#[async_trait]
impl EphemeralOwnerStorage for OwnerReach {
    async fn ephemeral_heartbeat(&self, inc: u64, address: &str, alive: u64) -> StorageResult<()> {
        self.check()?;
        self.db.ephemeral_heartbeat(inc, address, alive).await
    }
    async fn ephemeral_claim(
        &self,
        queue: &str,
        inc: u64,
        takeover_after_ms: u64,
    ) -> StorageResult<EphemeralClaim> {
        self.check()?;
        self.db.ephemeral_claim(queue, inc, takeover_after_ms).await
    }
    async fn ephemeral_brokers(&self) -> StorageResult<Vec<EphemeralBroker>> {
        self.check()?;
        self.db.ephemeral_brokers().await
    }
    async fn ephemeral_leave(&self, inc: u64) -> StorageResult<()> {
        self.check()?;
        self.db.ephemeral_leave(inc).await
    }
}
