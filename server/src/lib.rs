//! `queen-server`: the Queen broker over HTTP/1.1, wire-compatible with Queen's clients.
//!
//! - `broker`: the broker's shared state (storage, pop context, wake gates, limiter, metrics);
//!   building one starts nothing.
//! - `operations`, `rounds`, `buffer`, `sealing`: what the routes ask of the broker (pushes, acks,
//!   storage rounds, the failover buffer, payload encryption).
//! - `views`: the admin plane's read models, computed from storage's inventory;
//!   `storage_reads`: every read a route makes of storage.
//! - `routes`: one file per surface, and the route table (`routes::ROUTES`); `http`: replies,
//!   errors, auth, wire.
//! - `serve`: connections and the listener; `tasks`: the background work a running broker needs.

pub mod broker;
pub mod buffer;
pub mod config;
pub mod ephemeral;
mod helpers;
pub mod http;
pub mod metrics;
mod operations;
pub mod peers;
pub mod rounds;
pub mod routes;
pub mod sealing;
mod serve;
mod stats;
mod storage_reads;
pub mod tasks;
mod views;

pub use helpers::{lock, wall_now};
pub use serve::{handle, serve_connection, serve_listener};
pub use tasks::db_clock::spawn_clock_alignment;
pub use tasks::events::{forward_events, spawn_event_listener};
pub use tasks::snapshot_watch::spawn_snapshot_watch;
