//! Applying a deliverability event to the broker's pop context: the hot-list rings, the cached
//! queue configs and the legacy path's probe answers learn of it, and the caller is told which
//! wake gates to open. Apart from `events` (the vocabulary) and `pop` (the context itself) so
//! that neither of those needs the other.

use crate::events::{DeliveryEvent, Wake};
use crate::pop::{CachedConfig, PopContext};
use crate::types::Timestamp;

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
