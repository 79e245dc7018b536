//! `queen-core`: the sans-IO heart of the Queen broker.
//!
//! No tokio, no sockets, no clock reads, no global RNG: time arrives as an argument, randomness
//! from an injected seed, and effects leave as data. The pop state machine (`pop`) is driven by
//! `handle(input, now, ctx)` and drained with `poll()`.

pub mod apply;
pub mod autopilot;
pub mod backoff;
pub mod claim;
pub mod dedup;
pub mod delivery;
pub mod ephemeral;
pub mod events;
pub mod frames;
pub mod ids;
pub mod kv;
pub mod ledger;
pub mod limiter;
pub mod locks;
pub mod params;
pub mod pop;
pub mod reads;
pub mod ring;
pub mod rng;
pub mod storage;
pub mod streams;
pub mod time;
pub mod timers;
pub mod types;
pub mod wire;

pub use storage::Storage;
pub use types::{Offset, Timestamp, WorkerId};
