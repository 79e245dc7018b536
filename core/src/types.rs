//! Domain types shared by the broker, the storage backends and the tests.

use std::fmt;

/// Wall-clock instant in microseconds since the Unix epoch.
///
/// The core never reads a clock: every timestamp arrives as an argument. Microseconds match
/// PostgreSQL's `timestamptz` resolution, so the model and the database compare equal.
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Default,
    serde::Serialize,
    serde::Deserialize,
)]
pub struct Timestamp(pub i64);

impl Timestamp {
    pub const EPOCH: Timestamp = Timestamp(0);

    pub fn from_millis(ms: i64) -> Self {
        Timestamp(ms.saturating_mul(1000))
    }
    pub fn from_secs(s: i64) -> Self {
        Timestamp(s.saturating_mul(1_000_000))
    }
    pub fn as_millis(self) -> i64 {
        self.0.div_euclid(1000)
    }
    /// The next representable instant (a lease held until `t` is free from `t.just_after()`).
    pub fn just_after(self) -> Self {
        Timestamp(self.0.saturating_add(1))
    }

    pub fn plus_millis(self, ms: i64) -> Self {
        Timestamp(self.0.saturating_add(ms.saturating_mul(1000)))
    }
    pub fn plus_secs(self, s: i64) -> Self {
        Timestamp(self.0.saturating_add(s.saturating_mul(1_000_000)))
    }
    pub fn minus_secs(self, s: i64) -> Self {
        Timestamp(self.0.saturating_sub(s.saturating_mul(1_000_000)))
    }
    /// Milliseconds from `self` until `later` (0 when `later` is not after `self`).
    pub fn micros_until(self, later: Timestamp) -> u64 {
        u64::try_from((later.0 - self.0).max(0)).unwrap_or(0)
    }
    pub fn millis_until(self, later: Timestamp) -> u64 {
        u64::try_from((later.0 - self.0).max(0) / 1000).unwrap_or(0)
    }
    /// Truncated to the whole second, as `log_partitions.last_write_at` is stored.
    pub fn quantize_to_second(self) -> Self {
        Timestamp(self.0 - self.0.rem_euclid(1_000_000))
    }
}

/// A per-partition message offset. Offsets start at 0; a cursor of -1 means "nothing consumed".
pub type Offset = i64;

/// The sentinel consumer group used when a pop names none (queue mode).
pub const QUEUE_MODE_GROUP: &str = "__QUEUE_MODE__";
/// The partition a push lands in when it names none.
pub const DEFAULT_PARTITION: &str = "Default";
/// Longest queue, partition, group or transaction id accepted, in bytes.
pub const MAX_NAME_BYTES: usize = 255;

/// The id of one pop claim: a UUIDv7 minted per request. On a leased pop it is the `leaseId`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct WorkerId(pub uuid::Uuid);

impl WorkerId {
    /// The holder of a retry-delay hold: a `failed` ack keeps the partition from every consumer
    /// of the group until the delay ends. No pop mints it and no renewal extends it.
    pub const RETRY_HOLD: WorkerId = WorkerId(uuid::Uuid::nil());
}

impl fmt::Display for WorkerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.hyphenated().fmt(f)
    }
}

/// Namespace and task derived from a queue name: text before the first `.`, and the second
/// `.`-separated segment (empty when there is none).
pub fn namespace_and_task(queue: &str) -> (String, String) {
    let mut parts = queue.split('.');
    let namespace = parts.next().unwrap_or_default().to_string();
    let task = parts.next().unwrap_or_default().to_string();
    (namespace, task)
}

/// Why a name was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NameError {
    Empty(&'static str),
    TooLong(&'static str),
    ControlCharacter(&'static str),
    NulCharacter(&'static str),
}

impl fmt::Display for NameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NameError::Empty(what) => write!(f, "{what} must not be empty"),
            NameError::TooLong(what) => write!(f, "{what} is longer than {MAX_NAME_BYTES} bytes"),
            NameError::ControlCharacter(what) => write!(f, "{what} contains a control character"),
            NameError::NulCharacter(what) => {
                write!(
                    f,
                    "{what} contains a NUL character, which storage cannot hold"
                )
            }
        }
    }
}

/// Validates a name or an id a client sends (queue, partition, consumer group, namespace, task,
/// transactionId, partitionId, leaseId). NUL and other control characters are refused because
/// PostgreSQL text cannot hold NUL and such names are always a client bug; both backends refuse
/// alike, since the check runs before either sees the request.
pub fn validate_name(what: &'static str, name: &str) -> Result<(), NameError> {
    if name.is_empty() {
        return Err(NameError::Empty(what));
    }
    if name.len() > MAX_NAME_BYTES {
        return Err(NameError::TooLong(what));
    }
    if name.chars().any(char::is_control) {
        return Err(NameError::ControlCharacter(what));
    }
    Ok(())
}

/// Validates a free text a client sends (an ack's error message): anything but NUL, which
/// PostgreSQL text cannot hold.
pub fn validate_text(what: &'static str, text: &str) -> Result<(), NameError> {
    if text.contains('\0') {
        return Err(NameError::NulCharacter(what));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_texts_refuse_what_storage_cannot_hold() {
        assert!(validate_name("queue", "a\0b").is_err());
        assert!(validate_name("queue", "a\nb").is_err());
        assert!(validate_name("queue", &"x".repeat(MAX_NAME_BYTES + 1)).is_err());
        assert!(validate_name("queue", "").is_err());
        assert!(validate_name("queue", "billing.invoice").is_ok());
        assert!(validate_text("error", "line 1\nline 2").is_ok());
        assert_eq!(
            validate_text("error", "a\0"),
            Err(NameError::NulCharacter("error"))
        );
    }

    #[test]
    fn namespace_and_task_follow_the_dots() {
        assert_eq!(
            namespace_and_task("billing.invoice.v2"),
            ("billing".into(), "invoice".into())
        );
        assert_eq!(namespace_and_task("orders"), ("orders".into(), "".into()));
        assert_eq!(namespace_and_task("a.b"), ("a".into(), "b".into()));
    }

    #[test]
    fn names_are_bounded() {
        assert!(validate_name("queue", "q").is_ok());
        assert_eq!(validate_name("queue", ""), Err(NameError::Empty("queue")));
        assert_eq!(
            validate_name("queue", &"x".repeat(256)),
            Err(NameError::TooLong("queue"))
        );
        assert!(validate_name("queue", &"x".repeat(255)).is_ok());
        assert_eq!(
            validate_name("queue", "a\0b"),
            Err(NameError::ControlCharacter("queue"))
        );
    }

    #[test]
    fn timestamp_quantizes_down() {
        assert_eq!(
            Timestamp(1_999_999).quantize_to_second(),
            Timestamp(1_000_000)
        );
        assert_eq!(Timestamp(5).millis_until(Timestamp(2005)), 2);
        assert_eq!(Timestamp(5000).millis_until(Timestamp(0)), 0);
    }
}
