//! Brokers sharing ephemeral queues on one model database with a manual clock, each over real
//! HTTP, whose reach to the database's owner rows can be cut (a broker that lost PostgreSQL).
//! No background tasks run: liveness is renewed only when a call finds it lapsed, so the clock
//! alone decides who is alive, and a test's steps replay exactly.

use std::net::SocketAddr;
use std::sync::Arc;

use queen_core::storage::StorageSet;
use queen_core::Timestamp;
use queen_server::broker::{Broker, Hooks};
use queen_server::config::ServerConfig;
use queen_storage_sim::reach::OwnerReach;
use queen_storage_sim::{ManualClock, SimBugs, SimDb};

pub struct Member {
    pub broker: Arc<Broker>,
    pub addr: SocketAddr,
    pub reach: Arc<OwnerReach>,
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
        let reach = OwnerReach::new(self.db.clone());
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
