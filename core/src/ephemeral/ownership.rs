//! Which broker holds a queue's ring when several share one database. Each broker renews its
//! liveness every [`HEARTBEAT_MS`] for [`ALIVE_MS`] on storage's clock, and
//! a queue whose owner is not alive may be claimed by another. An owner serves only while its
//! last renewal *sent* is younger than [`FENCE_MS`]: a renewal sent at `t` lands at or
//! after `t`, so its row lives until at least `t + ALIVE_MS`, and nobody can claim the queue until
//! the owner has stopped serving it, with `ALIVE_MS - FENCE_MS` to spare for the clocks' rates.

use super::EphemeralBugs;
use crate::types::Timestamp;

pub const HEARTBEAT_MS: u64 = 1000;
pub const ALIVE_MS: u64 = 5000;
pub const FENCE_MS: u64 = 3500;
/// A broker takes over the queues of an owner whose liveness ran out only once it has itself
/// been alive without a break for this long (storage's clock). A database outage longer than
/// `ALIVE_MS` runs every broker's liveness out; when the database is back, each renews within
/// `HEARTBEAT_MS`, so an owner that is still there renews before anyone may take its queues,
/// and keeps their rings (`keeps_ring`). An owner that crashed is taken over once a broker
/// alive throughout sees its liveness run out, as before; one that shut down left and is
/// taken over at once.
pub const TAKEOVER_AFTER_MS: u64 = ALIVE_MS;

/// How long a broker must have been alive to take over a lapsed owner's queues.
pub fn takeover_after_ms(bugs: EphemeralBugs) -> u64 {
    if bugs.take_over_at_once {
        0
    } else {
        TAKEOVER_AFTER_MS
    }
}

/// Whether an owner that held a queue's ring under epoch `held` keeps it once a claim answers
/// it the owner under `claimed`: only if nobody held the queue in between (the same epoch).
/// Otherwise the ring is dropped and the queue starts empty.
pub fn keeps_ring(held: Option<i64>, claimed: i64, bugs: EphemeralBugs) -> bool {
    held == Some(claimed) || (bugs.keep_ring_across_epochs && held.is_some())
}

/// Whether a broker whose last successful renewal was sent at `last_sent` may serve as an
/// owner at `now`.
pub fn serving(last_sent: Option<Timestamp>, now: Timestamp, bugs: EphemeralBugs) -> bool {
    match last_sent {
        None => false,
        Some(_) if bugs.serve_past_fence => true,
        Some(t) => now.0 - t.0 < (FENCE_MS as i64) * 1000,
    }
}
