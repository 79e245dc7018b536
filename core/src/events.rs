//! Deliverability events: every state change that can make a message deliverable, named once.
//!
//! A broker learns of an event in one of two ways: it made the change itself (a route handler),
//! or another broker on the same database did and storage told it (PostgreSQL's NOTIFY, sent at
//! commit by the procedures and the cursor trigger; the model sends the same at its commits).
//! Both go through `PopContext::apply` (in `apply`), which updates the hot-list rings and says which wake
//! gates to open. Time-based events (a lease expiring, delayedProcessing maturing, a windowBuffer
//! quiet period or a retryDelay hold ending) are not events here: they become scheduled revisits,
//! on the ring's wheel (queue-wide pops with the hot-list) or on the parked pop itself (every
//! other shape), from the time storage reported with its verdict.

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
}
