//! The conformance cases on the in-memory model.

#![allow(clippy::expect_used, clippy::unwrap_used)] // test code: a failed expectation is the test failing

use std::sync::Arc;

use async_trait::async_trait;
use queen_core::storage::Storage;
use queen_core::Timestamp;
use queen_sim_tests::conformance::{self, Backend};
use queen_sim_tests::fixtures::block_on;
use queen_storage_sim::{ManualClock, SimBugs, SimDb};

struct Model {
    db: Arc<SimDb>,
    clock: ManualClock,
}

#[async_trait]
impl Backend for Model {
    fn storage(&self) -> Arc<dyn Storage> {
        self.db.clone()
    }
    async fn advance_secs(&self, secs: i64) {
        self.clock.advance_millis(secs * 1000);
    }
    async fn drop_segments(&self, queue: &str, partition: &str, before: i64) {
        if let Err(e) = self.db.drop_segments(queue, partition, before) {
            panic!("retention failed: {e}");
        }
    }
    async fn filed_dead_letters(&self, queue: &str) -> Vec<(i64, String)> {
        self.db
            .filed_dead_letters(queue)
            .into_iter()
            .map(|d| (d.offset, d.transaction_id))
            .collect()
    }
}

#[test]
fn every_case_passes_on_the_model() {
    let mut failures = vec![];
    for (name, case) in conformance::all() {
        let clock = ManualClock::new(Timestamp::from_secs(1_700_000_000));
        let model = Model {
            db: SimDb::new(7, clock.as_sim_clock(), SimBugs::default()),
            clock,
        };
        if let Err(e) = block_on(case(&model)) {
            failures.push(format!("{name}: {e}"));
        }
        assert_eq!(
            model.db.open_transactions(),
            0,
            "{name} left a transaction open"
        );
    }
    assert!(
        failures.is_empty(),
        "conformance failures on the model:\n{}",
        failures.join("\n")
    );
}

/// The switch "a flush deletes a window changed since its read" is proven here, not by the
/// simulation: the simulation's stream workers never add to a window they did not open, because
/// with two workers' flushes racing, a window added to between two flushes' reads is the gap
/// docs/streams.md names (the SDKs send no version with a cycle) and its checker would flag it.
/// This case, which holds the rule on both backends, fails with the rule switched off.
#[test]
fn a_flush_that_ignores_its_ripe_read_fails_the_conformance_case() {
    let clock = ManualClock::new(Timestamp::from_secs(1_700_000_000));
    let bugs = SimBugs {
        flush_ignores_its_ripe_read: true,
        ..SimBugs::default()
    };
    let model = Model {
        db: SimDb::new(7, clock.as_sim_clock(), bugs),
        clock,
    };
    let found =
        block_on(conformance::a_flush_deletes_a_window_only_as_its_ripe_read_saw_it(&model));
    assert!(
        found
            .as_ref()
            .is_err_and(|e| e.contains("written since its ripe read")),
        "the switch went unnoticed: {found:?}"
    );
}
