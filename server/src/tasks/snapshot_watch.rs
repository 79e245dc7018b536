//! Tells the operator when a transaction or snapshot left open in the database holds back
//! PostgreSQL's cleanup of the broker's tables (`PgStorage::oldest_snapshot` says why that
//! matters): the age of the oldest one as a gauge, and a warning naming it once it is older than
//! `WARN_AFTER`, repeated every `WARN_AGAIN_AFTER` while it lasts. The broker cannot end another
//! session; the operator can (`pg_terminate_backend`, `ROLLBACK PREPARED`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::broker::Broker;

/// How often the database is asked.
pub const LOOK_EVERY: Duration = Duration::from_secs(10);
/// An age past which a holder is worth a warning: the broker's own transactions last
/// milliseconds, an admin pass over a million partitions about 15 s; in the soak, latency had
/// doubled within the first minute of a held snapshot.
pub const WARN_AFTER: Duration = Duration::from_secs(60);
pub const WARN_AGAIN_AFTER: Duration = Duration::from_secs(300);

/// The last warning: about which holder, and when.
#[derive(Default)]
struct Warned {
    last: Option<(String, Instant)>,
}

impl Warned {
    /// Whether `holder` (its pid or name: its state changes while it lasts), open for `age`,
    /// gets a warning at `now` (and records it if so): once it is past `WARN_AFTER`, at once
    /// for a holder not warned about yet, else every `WARN_AGAIN_AFTER`.
    fn due(&mut self, holder: &str, age: Duration, now: Instant) -> bool {
        if age < WARN_AFTER {
            return false;
        }
        let due = match &self.last {
            Some((warned, at)) if warned == holder => now.duration_since(*at) >= WARN_AGAIN_AFTER,
            _ => true,
        };
        if due {
            self.last = Some((holder.to_string(), now));
        }
        due
    }
}

/// Starts the watch; it ends with the broker.
pub fn spawn_snapshot_watch(
    broker: &Arc<Broker>,
    pg: &queen_storage_pg::PgStorage,
) -> tokio::task::JoinHandle<()> {
    let mut turns = super::Turns::new(broker, LOOK_EVERY);
    let pg = pg.clone();
    tokio::spawn(async move {
        let mut warned = Warned::default();
        while let Some(b) = turns.next().await {
            match pg.oldest_snapshot().await {
                Ok(oldest) => {
                    let age = oldest.as_ref().map_or(0.0, |o| o.age_secs);
                    b.metrics.database_oldest_snapshot_seconds.set(age);
                    if let Some(o) = oldest {
                        if warned.due(&o.holder, Duration::from_secs_f64(age), Instant::now()) {
                            tracing::warn!(
                                holder = %o.holder,
                                detail = %o.detail,
                                open_seconds = age.round(),
                                "a transaction open this long in the database holds back PostgreSQL's cleanup of the broker's tables: they grow and latency climbs until it ends"
                            );
                        }
                    }
                }
                // Storage failures are the event path's to report.
                Err(e) => tracing::debug!(error = %e, "cannot read the oldest snapshot"),
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_holder_is_warned_about_once_old_then_every_few_minutes() {
        let mut w = Warned::default();
        let t0 = Instant::now();
        let secs = Duration::from_secs;
        assert!(!w.due("pid 1", secs(59), t0), "too young");
        assert!(w.due("pid 1", secs(60), t0));
        assert!(!w.due("pid 1", secs(70), t0 + secs(10)));
        assert!(!w.due("pid 1", secs(359), t0 + secs(299)));
        assert!(w.due("pid 1", secs(360), t0 + secs(300)), "again");
        assert!(
            w.due("pid 2", secs(61), t0 + secs(301)),
            "another holder at once"
        );
        assert!(
            w.due("pid 1", secs(400), t0 + secs(302)),
            "the first one again after it"
        );
    }
}
