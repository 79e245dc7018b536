//! The broker keeps the database's time. PostgreSQL stamps leases, delays and timers with its
//! own clock, and the broker schedules revisits and wakes by them: on a host whose clock was 3 s
//! ahead, a lease's end was revisited 3 s early and again at every millisecond until it came
//! (1,338 storage calls for one lease); 3 s behind, a redelivery came 3 s late, past the 1 s
//! bound. This task measures the offset at start and every `ALIGN_EVERY` after
//! (`PgStorage::clock_offset`), and `Broker::now` adds it.

use std::sync::Arc;
use std::time::Duration;

use crate::broker::Broker;

/// How often the offset is measured again: hosts' clocks drift by milliseconds a day, and NTP
/// steps them now and then.
pub const ALIGN_EVERY: Duration = Duration::from_secs(10);

/// An offset past this is logged as a warning (once per start): the broker follows the
/// database, but other clients of this host's clock (logs, tokens) do not.
const SKEW_WORTH_A_WARNING_US: i64 = 1_000_000;

/// Starts the measurement; it ends with the broker.
pub fn spawn_clock_alignment(
    broker: &Arc<Broker>,
    pg: &queen_storage_pg::PgStorage,
) -> tokio::task::JoinHandle<()> {
    let mut turns = super::Turns::new(broker, ALIGN_EVERY);
    let pg = pg.clone();
    tokio::spawn(async move {
        let mut warned = false;
        while let Some(b) = turns.next().await {
            let host = b.host_clock();
            match pg.clock_offset(&*host).await {
                Ok(offset) => {
                    b.set_clock_offset_us(offset);
                    if offset.abs() > SKEW_WORTH_A_WARNING_US && !warned {
                        warned = true;
                        tracing::warn!(
                            database_ahead_ms = offset / 1_000,
                            "this host's clock differs from the database's; the broker keeps the database's time"
                        );
                    }
                }
                // The last offset stands; storage failures are the event path's to report.
                Err(e) => tracing::debug!(error = %e, "cannot read the database's clock"),
            }
        }
    })
}
