//! Pop autopilot (Queen 2.x, client 2.6.0's default): the broker sizes the knobs a pop leaves
//! unset (`autopilot=true` with `batch` and/or `partitions` absent) and echoes its choice.
//!
//! The rule, one place for it:
//! - A knob the client sent is never touched.
//! - The width (`partitions`) of a queue-wide pop on the hot-list ring is half the group's ready
//!   partitions on this broker, rounded up, from 1 to `MAX_WIDTH`: one consumer of a queue with
//!   many lightly filled partitions drains a sweep per round trip instead of one partition, and
//!   half, as the ring's own share rule, so a second consumer of the group still finds work.
//! - The budget (`batch`) is `BUDGET_PER_PARTITION` messages per partition of the width, from
//!   the default batch (200, what the broker answers a pop without the knob) to `MAX_BUDGET`: a
//!   wider sweep needs a larger budget to take more than a message or two per partition, and the
//!   cap bounds how much one lease holds.
//! - Where the broker keeps no ring for the pop (a named partition, discovery, the legacy scan,
//!   a group's first contact) it knows nothing ready, and a chosen knob takes its default.
//! - `waitMs` is always 0 (no advice): a waiting pop parks in the broker until a push wakes it,
//!   and a non-waiting pop that finds nothing answers 204, which has no body to carry advice.

pub use crate::params::Chosen;
use crate::params::{DEFAULT_BATCH, DEFAULT_PARTITIONS};

/// The widest sweep the autopilot chooses.
pub const MAX_WIDTH: u32 = 32;
/// Messages of budget per partition of the chosen width.
pub const BUDGET_PER_PARTITION: u32 = 50;
/// The largest budget the autopilot chooses.
pub const MAX_BUDGET: u32 = 1_000;

/// The two knobs one storage call of a pop uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sizing {
    pub partitions: u32,
    pub batch: u32,
}

/// What the answer echoes under `autopilot` (wire names `partitions`, `batch`, `waitMs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Echo {
    pub partitions: u32,
    pub batch: u32,
    pub wait_ms: u64,
}

impl Echo {
    pub fn of(sizing: Sizing) -> Echo {
        Echo {
            partitions: sizing.partitions,
            batch: sizing.batch,
            wait_ms: 0,
        }
    }
}

impl Sizing {
    /// The knobs as the request has them (a left-out knob at its default).
    pub fn sent(params: &crate::params::PopParams) -> Sizing {
        Sizing {
            partitions: params.partitions,
            batch: params.batch,
        }
    }
}

/// The sizing of a pop's call: the client's knobs where it sent them, the autopilot's where it
/// left them to the broker. `ready`: the group's ready partitions on this broker's ring, `None`
/// where the pop is not served from a ring.
pub fn size(chosen: Chosen, sent: Sizing, ready: Option<usize>) -> Sizing {
    let partitions = if chosen.partitions {
        match ready {
            Some(ready) => {
                let half = u32::try_from(ready.div_ceil(2)).unwrap_or(u32::MAX);
                half.clamp(1, MAX_WIDTH)
            }
            None => DEFAULT_PARTITIONS,
        }
    } else {
        sent.partitions
    };
    let batch = if chosen.batch {
        partitions
            .saturating_mul(BUDGET_PER_PARTITION)
            .clamp(DEFAULT_BATCH, MAX_BUDGET)
    } else {
        sent.batch
    };
    Sizing { partitions, batch }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SENT: Sizing = Sizing {
        partitions: 3,
        batch: 7,
    };

    #[test]
    fn knobs_the_client_sent_are_never_touched() {
        for ready in [None, Some(0), Some(1), Some(10_000)] {
            assert_eq!(size(Chosen::default(), SENT, ready), SENT);
            let only_batch = Chosen {
                batch: true,
                partitions: false,
            };
            assert_eq!(size(only_batch, SENT, ready).partitions, 3);
            let only_width = Chosen {
                batch: false,
                partitions: true,
            };
            assert_eq!(size(only_width, SENT, ready).batch, 7);
        }
    }

    #[test]
    fn the_width_is_half_the_ready_partitions_within_its_bounds() {
        let both = Chosen {
            batch: true,
            partitions: true,
        };
        let width = |ready| size(both, SENT, ready).partitions;
        assert_eq!(width(None), 1, "no ring: the default");
        assert_eq!(width(Some(0)), 1);
        assert_eq!(width(Some(1)), 1);
        assert_eq!(width(Some(3)), 2);
        assert_eq!(width(Some(20)), 10);
        assert_eq!(width(Some(64)), MAX_WIDTH);
        assert_eq!(width(Some(1_000_000)), MAX_WIDTH);
    }

    #[test]
    fn the_budget_follows_the_width_from_the_default_to_its_cap() {
        let both = Chosen {
            batch: true,
            partitions: true,
        };
        let batch = |ready| size(both, SENT, ready).batch;
        assert_eq!(batch(None), DEFAULT_BATCH);
        assert_eq!(batch(Some(2)), DEFAULT_BATCH);
        assert_eq!(batch(Some(20)), 10 * BUDGET_PER_PARTITION);
        assert_eq!(batch(Some(1_000)), MAX_BUDGET);
        // A pinned width of one partition still gets the default budget.
        let only_batch = Chosen {
            batch: true,
            partitions: false,
        };
        let one = Sizing {
            partitions: 1,
            batch: 1,
        };
        assert_eq!(size(only_batch, one, Some(500)).batch, DEFAULT_BATCH);
    }

    #[test]
    fn every_choice_is_within_the_request_bounds() {
        let both = Chosen {
            batch: true,
            partitions: true,
        };
        for ready in (0..200).chain([usize::MAX]) {
            let s = size(both, SENT, Some(ready));
            assert!((1..=MAX_WIDTH).contains(&s.partitions));
            assert!((DEFAULT_BATCH..=MAX_BUDGET).contains(&s.batch));
            assert!(
                s.batch >= s.partitions,
                "a budget of at least one per partition"
            );
        }
    }
}
