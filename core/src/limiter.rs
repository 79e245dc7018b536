//! The adaptive serving limiter ("Vegas permit"): a TCP-Vegas style concurrency limit over
//! storage work, as a pure state machine fed with latency samples.
//!
//! Vegas estimates the queue it is building: queue = limit x (1 - min_rtt / rtt). Below `alpha`
//! the limit grows, above `beta` it shrinks, so storage latency stays near its uncontended floor.

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct VegasConfig {
    pub initial_limit: u32,
    pub min_limit: u32,
    pub max_limit: u32,
    pub alpha: f64,
    pub beta: f64,
}

impl Default for VegasConfig {
    fn default() -> Self {
        VegasConfig {
            initial_limit: 16,
            min_limit: 1,
            max_limit: 32,
            alpha: 3.0,
            beta: 12.0,
        }
    }
}

#[derive(Clone, Debug)]
pub struct VegasLimiter {
    config: VegasConfig,
    limit: u32,
    in_flight: u32,
    /// Smallest latency seen (microseconds): the uncontended floor.
    min_rtt_us: Option<u64>,
}

impl VegasLimiter {
    pub fn new(config: VegasConfig) -> Self {
        let limit = config
            .initial_limit
            .clamp(config.min_limit.max(1), config.max_limit.max(1));
        VegasLimiter {
            config,
            limit,
            in_flight: 0,
            min_rtt_us: None,
        }
    }

    pub fn limit(&self) -> u32 {
        self.limit
    }

    pub fn in_flight(&self) -> u32 {
        self.in_flight
    }

    pub fn try_acquire(&mut self) -> bool {
        if self.in_flight < self.limit {
            self.in_flight += 1;
            true
        } else {
            false
        }
    }

    /// Returns a permit. `rtt_us` is the storage latency of the work done under it, or `None`
    /// when no storage work completed under it (abandoned, or nothing to do): a near-zero sample
    /// would become the floor, and every real latency after it would read as congestion
    /// (measured in docs/benchmarks.md, "The serving limiter").
    pub fn release(&mut self, rtt_us: Option<u64>) {
        debug_assert!(self.in_flight > 0, "release without acquire");
        self.in_flight = self.in_flight.saturating_sub(1);
        let Some(rtt) = rtt_us.map(|r| r.max(1)) else {
            return;
        };
        let min_rtt = *self.min_rtt_us.get_or_insert(rtt);
        let min_rtt = if rtt < min_rtt {
            self.min_rtt_us = Some(rtt);
            rtt
        } else {
            min_rtt
        };
        let queue = f64::from(self.limit) * (1.0 - min_rtt as f64 / rtt as f64);
        if queue < self.config.alpha {
            self.limit = (self.limit + 1).min(self.config.max_limit);
        } else if queue > self.config.beta {
            self.limit = self
                .limit
                .saturating_sub(1)
                .max(self.config.min_limit.max(1));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permits_are_bounded_by_the_limit() {
        let mut l = VegasLimiter::new(VegasConfig {
            initial_limit: 2,
            ..VegasConfig::default()
        });
        assert!(l.try_acquire());
        assert!(l.try_acquire());
        assert!(!l.try_acquire());
        l.release(None);
        assert!(l.try_acquire());
    }

    /// Why a permit that ran no storage work must report no sample: one near-zero sample pins
    /// the floor, and from then on every real latency reads as a deep queue.
    #[test]
    fn one_near_zero_sample_makes_every_real_sample_read_as_congestion() {
        let mut l = VegasLimiter::new(VegasConfig::default());
        for _ in 0..8 {
            assert!(l.try_acquire());
            l.release(Some(1000));
        }
        let healthy = l.limit();
        assert!(healthy > 16, "flat latency grows: {healthy}");
        assert!(l.try_acquire());
        l.release(Some(1));
        for _ in 0..8 {
            assert!(l.try_acquire());
            l.release(Some(1000));
        }
        assert!(
            l.limit() < healthy,
            "the same healthy latency now shrinks the limit: {} < {healthy}",
            l.limit()
        );
    }

    #[test]
    fn grows_when_uncontended_and_shrinks_under_queueing() {
        let mut l = VegasLimiter::new(VegasConfig::default());
        for _ in 0..40 {
            assert!(l.try_acquire());
            l.release(Some(1000));
        }
        assert_eq!(l.limit(), 32, "flat latency grows to the cap");
        for _ in 0..40 {
            assert!(l.try_acquire());
            l.release(Some(10_000));
        }
        assert!(
            l.limit() < 32,
            "10x latency means a queue: shrink, got {}",
            l.limit()
        );
        assert!(l.limit() >= 1);
    }
}
