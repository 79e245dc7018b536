//! Small helpers every part of the server shares (kept here, not on the broker, so that the
//! modules using them need not import the broker).

use std::sync::{Mutex, MutexGuard};
use std::time::{SystemTime, UNIX_EPOCH};

use queen_core::Timestamp;

/// Locks a std mutex, recovering from poisoning: every critical section here leaves its data
/// consistent at each step, so a panic elsewhere must not take the broker down.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The wall clock, read only by the server (the core takes time as an argument).
pub fn wall_now() -> Timestamp {
    let d = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    Timestamp(i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
}
