//! The long-poll re-check pacing: the correctness floor under lost wakes.

/// POP_WAIT_* settings. Defaults: 100 ms for the first 3 empty checks, then initial x attempt x
/// multiplier, capped at 1000 ms.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct WaitBackoff {
    pub initial_ms: u64,
    pub threshold: u32,
    pub multiplier: f64,
    pub max_ms: u64,
}

impl Default for WaitBackoff {
    fn default() -> Self {
        WaitBackoff {
            initial_ms: 100,
            threshold: 3,
            multiplier: 2.0,
            max_ms: 1000,
        }
    }
}

impl WaitBackoff {
    /// The wait before re-check number `attempt` (1-based count of empty checks so far).
    pub fn interval_ms(&self, attempt: u32) -> u64 {
        if attempt <= self.threshold {
            return self.initial_ms.min(self.max_ms);
        }
        let grown = self.initial_ms as f64 * f64::from(attempt) * self.multiplier;
        if !grown.is_finite() || grown >= self.max_ms as f64 {
            self.max_ms
        } else {
            (grown as u64).max(1)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_sequence_is_the_seeds() {
        let b = WaitBackoff::default();
        let seq: Vec<u64> = (1..=7).map(|a| b.interval_ms(a)).collect();
        assert_eq!(seq, vec![100, 100, 100, 800, 1000, 1000, 1000]);
    }

    #[test]
    fn never_exceeds_the_cap() {
        let b = WaitBackoff {
            initial_ms: 50,
            threshold: 1,
            multiplier: 3.0,
            max_ms: 400,
        };
        assert_eq!(b.interval_ms(1), 50);
        assert_eq!(b.interval_ms(2), 300);
        assert_eq!(b.interval_ms(3), 400);
        assert_eq!(b.interval_ms(u32::MAX), 400);
    }
}
