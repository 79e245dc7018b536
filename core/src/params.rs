//! Pop request parameters, their defaults, and parsing from a query string.

use std::fmt;

use crate::time::parse_iso;
use crate::types::{validate_name, NameError, Timestamp, QUEUE_MODE_GROUP};

/// Seed defaults.
pub const DEFAULT_BATCH: u32 = 200;
pub const DEFAULT_PARTITIONS: u32 = 1;
pub const DEFAULT_TIMEOUT_MS: u64 = 30_000;
pub const DEFAULT_LEASE_SECONDS: u32 = 60;
/// Upper bounds: anything above is a client bug, refused with 400 rather than served.
pub const MAX_BATCH: u32 = 10_000;
pub const MAX_PARTITIONS: u32 = 1_000;
pub const MAX_TIMEOUT_MS: u64 = 3_600_000;
pub const MAX_LEASE_SECONDS: u32 = 7 * 24 * 3600;

/// Where a consumer group starts on a partition it has never seen.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum SubscriptionMode {
    #[default]
    All,
    /// `new` / `new-only`: skip the existing backlog.
    New,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum SubscriptionFrom {
    #[default]
    Unset,
    Now,
    At(Timestamp),
}

/// The three shapes of a pop; they differ only in candidate selection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PopShape {
    Partition {
        queue: String,
        partition: String,
    },
    Queue {
        queue: String,
    },
    Discovery {
        namespace: Option<String>,
        task: Option<String>,
    },
}

/// Which knobs the broker's autopilot chooses for one pop (`autopilot=true` and the knob absent;
/// the rule is `autopilot::size`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Chosen {
    pub batch: bool,
    pub partitions: bool,
}

#[derive(Clone, Debug, PartialEq)]
pub struct PopParams {
    pub shape: PopShape,
    pub batch: u32,
    pub partitions: u32,
    pub auto_ack: bool,
    pub wait: bool,
    pub timeout_ms: u64,
    pub consumer_group: String,
    pub subscription_mode: SubscriptionMode,
    pub subscription_from: SubscriptionFrom,
    /// `None` means COALESCE(queue lease_time, 60), resolved by storage.
    pub lease_seconds: Option<u32>,
    /// `frames=true`: answer with Queen 2.x's framed pop answer (`QPF1`) where one can carry it.
    pub frames: bool,
    /// `conflation=true`: the consumer asks for last-value delivery (see `claim::policy_step`).
    pub conflation: bool,
    /// `autopilot=true`: which of `batch` and `partitions` the broker chooses (the ones the
    /// request left out; see `autopilot`). `None`: the request did not ask, and gets no echo.
    pub autopilot: Option<Chosen>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ParamError {
    DiscoveryNeedsNamespaceOrTask,
    NotANumber {
        name: &'static str,
        value: String,
    },
    OutOfRange {
        name: &'static str,
        min: u64,
        max: u64,
    },
    NotABool {
        name: &'static str,
        value: String,
    },
    BadTimestamp(String),
    Name(NameError),
    /// Conflation is a policy of a consumer group: queue mode has none.
    ConflationNeedsGroup,
    /// autoAck retires a batch as it is delivered; conflation retires what is behind the newest
    /// message: together a consumer could never see a retired message again, and Queen refuses it.
    ConflationWithAutoAck,
}

impl fmt::Display for ParamError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ParamError::DiscoveryNeedsNamespaceOrTask => {
                write!(f, "a pop without a queue needs a namespace or a task")
            }
            ParamError::NotANumber { name, value } => {
                write!(f, "{name} must be a whole number, got {value:?}")
            }
            ParamError::OutOfRange { name, min, max } => {
                write!(f, "{name} must be between {min} and {max}")
            }
            ParamError::NotABool { name, value } => {
                write!(f, "{name} must be true or false, got {value:?}")
            }
            ParamError::BadTimestamp(v) => {
                write!(
                    f,
                    "subscriptionFrom must be 'now' or an ISO-8601 timestamp, got {v:?}"
                )
            }
            ParamError::Name(e) => e.fmt(f),
            ParamError::ConflationNeedsGroup => {
                write!(f, "conflation=true needs a consumerGroup")
            }
            ParamError::ConflationWithAutoAck => {
                write!(f, "conflation=true cannot be combined with autoAck=true")
            }
        }
    }
}

impl std::error::Error for ParamError {}

impl From<NameError> for ParamError {
    fn from(e: NameError) -> Self {
        ParamError::Name(e)
    }
}

fn parse_u64(name: &'static str, v: &str, min: u64, max: u64) -> Result<u64, ParamError> {
    let n: u64 = v.trim().parse().map_err(|_| ParamError::NotANumber {
        name,
        value: v.to_string(),
    })?;
    if n < min || n > max {
        return Err(ParamError::OutOfRange { name, min, max });
    }
    Ok(n)
}

pub(crate) fn parse_bool(name: &'static str, v: &str) -> Result<bool, ParamError> {
    match v {
        "true" | "1" | "" => Ok(true),
        "false" | "0" => Ok(false),
        _ => Err(ParamError::NotABool {
            name,
            value: v.to_string(),
        }),
    }
}

impl PopParams {
    /// Builds the parameters from decoded query pairs. `default_timeout_ms` is DEFAULT_TIMEOUT.
    /// Unknown keys are ignored: clients send them freely.
    pub fn from_query<'a>(
        shape: PopShape,
        pairs: impl IntoIterator<Item = (&'a str, &'a str)>,
        default_timeout_ms: u64,
    ) -> Result<PopParams, ParamError> {
        let mut p = PopParams {
            shape,
            batch: DEFAULT_BATCH,
            partitions: DEFAULT_PARTITIONS,
            auto_ack: false,
            wait: false,
            timeout_ms: default_timeout_ms,
            consumer_group: QUEUE_MODE_GROUP.to_string(),
            subscription_mode: SubscriptionMode::All,
            subscription_from: SubscriptionFrom::Unset,
            lease_seconds: None,
            frames: false,
            conflation: false,
            autopilot: None,
        };
        let (mut namespace, mut task) = (None, None);
        let (mut autopilot, mut batch_sent, mut partitions_sent) = (false, false, false);
        for (k, v) in pairs {
            match k {
                "batch" => {
                    p.batch = parse_u64("batch", v, 1, MAX_BATCH.into())? as u32;
                    batch_sent = true;
                }
                "partitions" => {
                    p.partitions = parse_u64("partitions", v, 1, MAX_PARTITIONS.into())? as u32;
                    partitions_sent = true;
                }
                "autopilot" => autopilot = parse_bool("autopilot", v)?,
                "autoAck" => p.auto_ack = parse_bool("autoAck", v)?,
                "wait" => p.wait = parse_bool("wait", v)?,
                "frames" => p.frames = parse_bool("frames", v)?,
                "conflation" => p.conflation = parse_bool("conflation", v)?,
                "timeout" => p.timeout_ms = parse_u64("timeout", v, 0, MAX_TIMEOUT_MS)?,
                "leaseSeconds" | "leaseTime" => {
                    p.lease_seconds =
                        Some(parse_u64("leaseSeconds", v, 1, MAX_LEASE_SECONDS.into())? as u32)
                }
                "consumerGroup" if !v.is_empty() => {
                    validate_name("consumerGroup", v)?;
                    p.consumer_group = v.to_string();
                }
                "subscriptionMode" => {
                    // Anything but new / new-only behaves as `all`, as in Queen 0.15.
                    p.subscription_mode = match v {
                        "new" | "new-only" => SubscriptionMode::New,
                        _ => SubscriptionMode::All,
                    }
                }
                "subscriptionFrom" => {
                    p.subscription_from = match v {
                        "" => SubscriptionFrom::Unset,
                        "now" => SubscriptionFrom::Now,
                        ts => SubscriptionFrom::At(
                            parse_iso(ts)
                                .ok_or_else(|| ParamError::BadTimestamp(ts.to_string()))?,
                        ),
                    }
                }
                "namespace" if !v.is_empty() => {
                    validate_name("namespace", v)?;
                    namespace = Some(v.to_string())
                }
                "task" if !v.is_empty() => {
                    validate_name("task", v)?;
                    task = Some(v.to_string())
                }
                _ => {}
            }
        }
        match &mut p.shape {
            PopShape::Discovery {
                namespace: ns,
                task: t,
            } => {
                *ns = ns.take().or(namespace);
                *t = t.take().or(task);
                if ns.is_none() && t.is_none() {
                    return Err(ParamError::DiscoveryNeedsNamespaceOrTask);
                }
            }
            PopShape::Partition { queue, partition } => {
                validate_name("queue", queue)?;
                validate_name("partition", partition)?;
                p.partitions = 1;
                // A named partition is a width of one, whatever the request says.
                partitions_sent = true;
            }
            PopShape::Queue { queue } => validate_name("queue", queue)?,
        }
        if autopilot {
            p.autopilot = Some(Chosen {
                batch: !batch_sent,
                partitions: !partitions_sent,
            });
        }
        if p.conflation && p.consumer_group == QUEUE_MODE_GROUP {
            return Err(ParamError::ConflationNeedsGroup);
        }
        if p.conflation && p.auto_ack {
            return Err(ParamError::ConflationWithAutoAck);
        }
        Ok(p)
    }

    pub fn deadline(&self, started: Timestamp) -> Timestamp {
        started.plus_millis(i64::try_from(self.timeout_ms).unwrap_or(i64::MAX))
    }

    pub fn queue_name(&self) -> Option<&str> {
        match &self.shape {
            PopShape::Partition { queue, .. } | PopShape::Queue { queue } => Some(queue),
            PopShape::Discovery { .. } => None,
        }
    }
}

/// COALESCE(leaseSeconds, queue lease_time, 60); a stored lease_time of 0 means unset.
pub fn effective_lease_seconds(requested: Option<u32>, queue_lease_time: Option<u32>) -> u32 {
    requested
        .filter(|s| *s > 0)
        .or(queue_lease_time.filter(|s| *s > 0))
        .unwrap_or(DEFAULT_LEASE_SECONDS)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q() -> PopShape {
        PopShape::Queue {
            queue: "orders".into(),
        }
    }

    #[test]
    fn defaults_are_the_seeds() {
        let p = PopParams::from_query(q(), [], DEFAULT_TIMEOUT_MS).expect("valid");
        assert_eq!(p.batch, 200);
        assert_eq!(p.partitions, 1);
        assert!(!p.auto_ack);
        assert!(!p.wait);
        assert_eq!(p.timeout_ms, 30_000);
        assert_eq!(p.consumer_group, "__QUEUE_MODE__");
        assert_eq!(p.subscription_mode, SubscriptionMode::All);
        assert_eq!(p.subscription_from, SubscriptionFrom::Unset);
        assert_eq!(p.lease_seconds, None);
        assert_eq!(
            PopParams::from_query(q(), [], 5000)
                .expect("valid")
                .timeout_ms,
            5000
        );
    }

    #[test]
    fn autopilot_chooses_only_the_knobs_the_request_left_out() {
        let chosen = |pairs: &[(&str, &str)]| {
            PopParams::from_query(q(), pairs.iter().copied(), 1)
                .expect("valid")
                .autopilot
        };
        let pick = |batch, partitions| Some(Chosen { batch, partitions });
        assert_eq!(chosen(&[]), None, "no autopilot=true: no echo");
        assert_eq!(chosen(&[("autopilot", "false")]), None);
        assert_eq!(chosen(&[("autopilot", "true")]), pick(true, true));
        assert_eq!(
            chosen(&[("autopilot", "true"), ("batch", "10")]),
            pick(false, true)
        );
        // The key order of the query does not matter.
        assert_eq!(
            chosen(&[("partitions", "1"), ("autopilot", "true")]),
            pick(true, false)
        );
        assert_eq!(
            chosen(&[("autopilot", "true"), ("batch", "5"), ("partitions", "2")]),
            pick(false, false)
        );
        let named = PopShape::Partition {
            queue: "q".into(),
            partition: "p".into(),
        };
        let p = PopParams::from_query(named, [("autopilot", "true")], 1).expect("valid");
        assert_eq!(
            p.autopilot,
            pick(true, false),
            "a named partition is one wide"
        );
        assert!(PopParams::from_query(q(), [("autopilot", "maybe")], 1).is_err());
    }

    #[test]
    fn lease_coalesces() {
        assert_eq!(effective_lease_seconds(Some(5), Some(300)), 5);
        assert_eq!(effective_lease_seconds(None, Some(300)), 300);
        assert_eq!(effective_lease_seconds(None, Some(0)), 60);
        assert_eq!(effective_lease_seconds(None, None), 60);
    }

    #[test]
    fn parses_client_queries() {
        let pairs = [
            ("autopilot", "true"),
            ("batch", "10"),
            ("wait", "true"),
            ("timeout", "1000"),
            ("consumerGroup", "g"),
            ("subscriptionMode", "new-only"),
            ("subscriptionFrom", "now"),
            ("partitions", "3"),
            ("autoAck", "true"),
        ];
        let p = PopParams::from_query(q(), pairs, 30_000).expect("valid");
        assert_eq!(
            (p.batch, p.partitions, p.wait, p.auto_ack, p.timeout_ms),
            (10, 3, true, true, 1000)
        );
        assert_eq!(p.consumer_group, "g");
        assert_eq!(p.subscription_mode, SubscriptionMode::New);
        assert_eq!(p.subscription_from, SubscriptionFrom::Now);
        let p =
            PopParams::from_query(q(), [("subscriptionMode", "from_beginning")], 1).expect("valid");
        assert_eq!(p.subscription_mode, SubscriptionMode::All);
    }

    #[test]
    fn single_partition_pop_ignores_partitions() {
        let shape = PopShape::Partition {
            queue: "q".into(),
            partition: "p".into(),
        };
        let p = PopParams::from_query(shape, [("partitions", "5")], 1).expect("valid");
        assert_eq!(p.partitions, 1);
    }

    #[test]
    fn rejects_bad_values() {
        let bad = [
            ("batch", "0"),
            ("batch", "-1"),
            ("batch", "100001"),
            ("batch", "ten"),
            ("timeout", "-5"),
            ("timeout", "99999999999"),
            ("wait", "maybe"),
            ("subscriptionFrom", "yesterday"),
            ("partitions", "0"),
        ];
        for (k, v) in bad {
            assert!(
                PopParams::from_query(q(), [(k, v)], 1).is_err(),
                "{k}={v} accepted"
            );
        }
        let long = "g".repeat(300);
        assert!(PopParams::from_query(q(), [("consumerGroup", long.as_str())], 1).is_err());
    }

    #[test]
    fn discovery_needs_namespace_or_task() {
        let shape = || PopShape::Discovery {
            namespace: None,
            task: None,
        };
        assert_eq!(
            PopParams::from_query(shape(), [], 1),
            Err(ParamError::DiscoveryNeedsNamespaceOrTask)
        );
        let p = PopParams::from_query(shape(), [("task", "inv")], 1).expect("valid");
        assert_eq!(
            p.shape,
            PopShape::Discovery {
                namespace: None,
                task: Some("inv".into())
            }
        );
    }

    #[test]
    fn conflation_needs_a_group_and_no_auto_ack() {
        let p = PopParams::from_query(q(), [("consumerGroup", "g"), ("conflation", "true")], 1)
            .expect("valid");
        assert!(p.conflation);
        assert_eq!(
            PopParams::from_query(q(), [("conflation", "true")], 1),
            Err(ParamError::ConflationNeedsGroup)
        );
        assert_eq!(
            PopParams::from_query(
                q(),
                [
                    ("consumerGroup", "g"),
                    ("conflation", "true"),
                    ("autoAck", "true")
                ],
                1
            ),
            Err(ParamError::ConflationWithAutoAck)
        );
        assert!(PopParams::from_query(q(), [("conflation", "maybe")], 1).is_err());
    }
}
