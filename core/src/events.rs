//! Deliverability events: every state change that can make a message deliverable, named once.
//!
//! A broker learns of an event in one of two ways: it made the change itself (a route handler),
//! or another broker on the same database did and storage told it (PostgreSQL's NOTIFY, sent at
//! commit by the procedures and the cursor trigger; the model sends the same at its commits).
//! Both go through `PopContext::apply`, which updates the hot-list rings and says which wake
//! gates to open. Time-based events (a lease expiring, delayedProcessing maturing, a windowBuffer
//! quiet period or a retryDelay hold ending) are not events here: they become scheduled revisits,
//! on the ring's wheel (queue-wide pops with the hot-list) or on the parked pop itself (every
//! other shape), from the time storage reported with its verdict.

use crate::pop::{CachedConfig, PopContext};
use crate::types::Timestamp;

/// A committed change that may make data deliverable.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum DeliveryEvent {
    /// Messages were appended to a partition (a push, a transaction's push, a dead-letter
    /// requeue).
    Pushed {
        queue: String,
        partition: String,
        count: u64,
    },
    /// A group's lease on a partition ended or changed before its expiry: an ack, a nack, a
    /// failed ack that starts a retryDelay hold, or the release of a batch nobody received. The
    /// partition may be deliverable now, or at a new time storage will report.
    /// `batch_committed`: the release committed the cursor through the lease's batch end (every
    /// message of the batch acked), so the partition holds nothing past it but what was pushed
    /// after the batch was read, which those pushes announce themselves.
    Released {
        queue: String,
        partition: String,
        group: String,
        batch_committed: bool,
    },
    /// A group's cursors moved or were deleted, or its subscription changed (seek, consumer-group
    /// delete, subscription update): every belief about the group is stale. `queue: None` means
    /// every queue.
    GroupReset {
        queue: Option<String>,
        group: String,
    },
    /// A queue was configured (its visibility options may have changed) or deleted.
    QueueChanged { queue: String },
    /// Events may have been missed (a broker's start, a reconnected notification channel): every
    /// belief is stale.
    Resync,
}

impl DeliveryEvent {
    /// A short name for metrics and logs.
    pub fn kind(&self) -> &'static str {
        match self {
            DeliveryEvent::Pushed { .. } => "push",
            DeliveryEvent::Released { .. } => "release",
            DeliveryEvent::GroupReset { .. } => "group_reset",
            DeliveryEvent::QueueChanged { .. } => "queue_changed",
            DeliveryEvent::Resync => "resync",
        }
    }

    /// The notification payload storage sends for this event (one line per field). The same text
    /// is written by the PostgreSQL procedures and parsed by `parse`.
    pub fn to_payload(&self) -> String {
        match self {
            DeliveryEvent::Pushed {
                queue,
                partition,
                count,
            } => format!("push\n{queue}\n{partition}\n{count}"),
            DeliveryEvent::Released {
                queue,
                partition,
                group,
                batch_committed,
            } => {
                let committed = if *batch_committed { "\ncommitted" } else { "" };
                format!("release\n{queue}\n{partition}\n{group}{committed}")
            }
            DeliveryEvent::GroupReset { queue, group } => {
                format!("group\n{}\n{group}", queue.as_deref().unwrap_or(""))
            }
            DeliveryEvent::QueueChanged { queue } => format!("queue\n{queue}"),
            DeliveryEvent::Resync => "resync".to_string(),
        }
    }

    /// Parses a notification payload. Names never contain a newline (they are validated at every
    /// route), so the fields split cleanly; `None` for anything else.
    pub fn parse(payload: &str) -> Option<DeliveryEvent> {
        let fields: Vec<&str> = payload.split('\n').collect();
        let event = match fields.as_slice() {
            ["push", queue, partition, count] => DeliveryEvent::Pushed {
                queue: queue.to_string(),
                partition: partition.to_string(),
                count: count.parse().ok()?,
            },
            ["release", queue, partition, group, flag @ ..] => DeliveryEvent::Released {
                queue: queue.to_string(),
                partition: partition.to_string(),
                group: group.to_string(),
                batch_committed: match flag {
                    [] => false,
                    ["committed"] => true,
                    _ => return None,
                },
            },
            ["group", queue, group] => DeliveryEvent::GroupReset {
                queue: (!queue.is_empty()).then(|| queue.to_string()),
                group: group.to_string(),
            },
            ["queue", queue] => DeliveryEvent::QueueChanged {
                queue: queue.to_string(),
            },
            ["resync"] => DeliveryEvent::Resync,
            _ => return None,
        };
        Some(event)
    }
}

/// Which wake gates an applied event opens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Wake {
    Nothing,
    Queue(String),
    /// Every gate (an event about every queue).
    All,
}

/// Switches that re-introduce bugs the simulation suite must catch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EventBugs {
    /// A consumer-group delete (or seek) updates the rings but opens no gate: parked consumers
    /// find out at their next re-check.
    pub group_reset_without_wake: bool,
    /// Events leave the legacy path's shared probe answers in place: a woken pop takes the
    /// answer read before the event and parks again.
    pub events_keep_probe_answers: bool,
}

impl PopContext {
    /// Applies one event to the rings and cached configs; the caller opens the gates returned.
    pub fn apply(&mut self, event: &DeliveryEvent, now: Timestamp) -> Wake {
        let concerns = match event {
            DeliveryEvent::Pushed { queue, .. }
            | DeliveryEvent::Released { queue, .. }
            | DeliveryEvent::QueueChanged { queue } => Some(queue.as_str()),
            DeliveryEvent::GroupReset { queue, .. } => queue.as_deref(),
            DeliveryEvent::Resync => None,
        };
        if !self.event_bugs.events_keep_probe_answers {
            self.probes.note_event(concerns);
        }
        match event {
            DeliveryEvent::Pushed {
                queue,
                partition,
                count,
            } => {
                self.note_push(queue, partition, *count, now);
                Wake::Queue(queue.clone())
            }
            DeliveryEvent::Released {
                queue,
                partition,
                group,
                batch_committed,
            } => {
                self.rings
                    .note_freed(queue, group, partition, *batch_committed);
                Wake::Queue(queue.clone())
            }
            DeliveryEvent::GroupReset { queue, group } => {
                self.rings.forget_group(queue.as_deref(), group);
                if self.event_bugs.group_reset_without_wake {
                    return Wake::Nothing;
                }
                match queue {
                    Some(q) => Wake::Queue(q.clone()),
                    None => Wake::All,
                }
            }
            DeliveryEvent::QueueChanged { queue } => {
                self.configs.remove(queue);
                self.rings.forget_queue(queue);
                Wake::Queue(queue.clone())
            }
            DeliveryEvent::Resync => {
                self.configs.clear();
                self.rings.resync();
                Wake::All
            }
        }
    }

    /// The cached windowBuffer of a queue (0 when unknown).
    pub(crate) fn window_buffer(&self, queue: &str) -> u32 {
        match self.configs.get(queue) {
            Some(CachedConfig {
                config: Some(c), ..
            }) => c.window_buffer_secs,
            _ => 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_round_trip() {
        let events = [
            DeliveryEvent::Pushed {
                queue: "q".into(),
                partition: "p 1".into(),
                count: 3,
            },
            DeliveryEvent::Released {
                queue: "q".into(),
                partition: "p".into(),
                group: "g".into(),
                batch_committed: false,
            },
            DeliveryEvent::Released {
                queue: "q".into(),
                partition: "p".into(),
                group: "g".into(),
                batch_committed: true,
            },
            DeliveryEvent::GroupReset {
                queue: Some("q".into()),
                group: "g".into(),
            },
            DeliveryEvent::GroupReset {
                queue: None,
                group: "g".into(),
            },
            DeliveryEvent::QueueChanged { queue: "q".into() },
            DeliveryEvent::Resync,
        ];
        for e in events {
            assert_eq!(DeliveryEvent::parse(&e.to_payload()), Some(e));
        }
        assert_eq!(DeliveryEvent::parse("push\nq\np\nx"), None);
        assert_eq!(DeliveryEvent::parse("release\nq\np\ng\nx"), None);
        assert_eq!(DeliveryEvent::parse("bogus"), None);
    }

    const T0: Timestamp = Timestamp(1_000_000);

    #[test]
    fn a_group_reset_wakes_its_queue_and_forgets_the_group() {
        let mut ctx = PopContext::default();
        ctx.rings.ring("q", "g").mark_first_contact_done();
        let reset = DeliveryEvent::GroupReset {
            queue: Some("q".into()),
            group: "g".into(),
        };
        let before = ctx.rings.resets();
        assert_eq!(ctx.apply(&reset, T0), Wake::Queue("q".into()));
        assert!(!ctx.rings.ring("q", "g").first_contact_done());
        assert!(ctx.rings.resets() > before);
    }

    #[test]
    fn the_bug_switch_drops_the_group_reset_wake() {
        let mut ctx = PopContext::default();
        ctx.event_bugs.group_reset_without_wake = true;
        let reset = DeliveryEvent::GroupReset {
            queue: None,
            group: "g".into(),
        };
        assert_eq!(ctx.apply(&reset, T0), Wake::Nothing);
    }

    #[test]
    fn a_release_makes_a_leased_partition_ready() {
        let mut ctx = PopContext::default();
        let ring = ctx.rings.ring("q", "g");
        ring.note_push("p", 2);
        let _ = ring.take_candidates(16, T0);
        ring.check_in(
            "p",
            crate::storage::Verdict::LeasedUntil(T0.plus_secs(300)),
            Some(1),
            T0,
        );
        assert!(!ctx.rings.ring("q", "g").has_ready(T0));
        let released = DeliveryEvent::Released {
            queue: "q".into(),
            partition: "p".into(),
            group: "g".into(),
            batch_committed: true,
        };
        assert_eq!(ctx.apply(&released, T0), Wake::Queue("q".into()));
        assert!(ctx.rings.ring("q", "g").has_ready(T0));
    }

    #[test]
    fn resync_makes_every_reseed_due_and_wakes_all() {
        let mut ctx = PopContext::default();
        ctx.rings.ring("q", "g").apply_reseed(&[], false, T0);
        assert!(!ctx.rings.ring("q", "g").reseed_due(T0));
        assert_eq!(ctx.apply(&DeliveryEvent::Resync, T0), Wake::All);
        assert!(ctx.rings.ring("q", "g").reseed_due(T0));
    }
}
