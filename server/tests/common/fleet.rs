//! Brokers sharing ephemeral queues on one model database with a manual clock, each over real
//! HTTP, whose reach to the database's owner rows can be cut (a broker that lost PostgreSQL).
//! No background tasks run: liveness is renewed only when a call finds it lapsed, so the clock
//! alone decides who is alive, and a test's steps replay exactly.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use queen_core::storage::{
    EphemeralBroker, EphemeralClaim, EphemeralOwnerStorage, StorageError, StorageResult, StorageSet,
};
use queen_core::Timestamp;
use queen_server::broker::{Broker, Hooks};
use queen_server::config::ServerConfig;
use queen_storage_sim::{ManualClock, SimBugs, SimDb};

/// The shared database's owners capability as one broker reaches it.
pub struct Reach {
    db: Arc<SimDb>,
    pub cut: AtomicBool,
}

impl Reach {
    fn check(&self) -> StorageResult<()> {
        if self.cut.load(Ordering::SeqCst) {
            return Err(StorageError::Unavailable(
                "cut off from the database".into(),
            ));
        }
        Ok(())
    }
}

#[async_trait]
impl EphemeralOwnerStorage for Reach {
    async fn ephemeral_heartbeat(&self, inc: u64, address: &str, alive: u64) -> StorageResult<()> {
        self.check()?;
        self.db.ephemeral_heartbeat(inc, address, alive).await
    }
    async fn ephemeral_claim(&self, queue: &str, inc: u64) -> StorageResult<EphemeralClaim> {
        self.check()?;
        self.db.ephemeral_claim(queue, inc).await
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

pub struct Member {
    pub broker: Arc<Broker>,
    pub addr: SocketAddr,
    pub reach: Arc<Reach>,
}

pub struct Fleet {
    pub clock: ManualClock,
    pub db: Arc<SimDb>,
}

impl Fleet {
    pub fn new() -> Fleet {
        let clock = ManualClock::new(Timestamp::from_secs(1_000_000));
        let db = SimDb::new(1, clock.as_sim_clock(), SimBugs::default());
        Fleet { clock, db }
    }

    /// A broker on the fleet's database, serving on a port of its own (`seed` draws its
    /// incarnation).
    pub async fn member(&self, seed: u64) -> Member {
        let reach = Arc::new(Reach {
            db: self.db.clone(),
            cut: AtomicBool::new(false),
        });
        let mut storage = StorageSet::of(self.db.clone());
        storage.ephemeral_owners = reach.clone();
        let (listener, addr, config) = super::bind_peer(ServerConfig::default()).await;
        let hooks = Hooks {
            clock: self.clock.as_sim_clock(),
            ..Hooks::default()
        };
        let broker = Broker::with_hooks(config, storage, seed, hooks);
        tokio::spawn(queen_server::serve_listener(broker.clone(), listener));
        Member {
            broker,
            addr,
            reach,
        }
    }
}
