//! The adaptive serving limiter: a concurrency limit over storage work, as a pure state machine
//! fed with latency samples (a gradient limit, after Netflix's `Gradient2Limit`).
//!
//! The recent average latency (the last few samples) is compared with the long-run average. While
//! it stays within `tolerance` of the long-run one the limit grows; when it runs past it (work
//! queueing in the database) the limit shrinks in proportion, by at most half a step. Averages on
//! both sides, not single samples against the smallest latency ever seen: a permit's storage work
//! varies (a ring pop of one partition, a first contact, a reseed page), and measured against its
//! all-time minimum every ordinary pop read as a deep queue. The TCP-Vegas rule this replaced
//! sat at 12 permits in every benchmark load, a fixed point of its arithmetic rather than of the
//! database, with every permit taken while a quarter of the cores idled (docs/benchmarks.md,
//! "the limiter's fixed point").

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LimiterConfig {
    pub initial_limit: u32,
    pub min_limit: u32,
    pub max_limit: u32,
    /// A sample slower than the long-run average by more than this factor counts as queueing.
    pub tolerance: f64,
    /// Weight of each step's new estimate against the current limit.
    pub smoothing: f64,
    /// Samples the long-run average spans (an exponential average over about this many).
    pub long_window: u32,
    /// Samples the recent average spans.
    pub short_window: u32,
    /// Permits added at each step beyond what the gradient keeps: how far the limit probes past
    /// the concurrency it measured, so that an idle database is found.
    pub headroom: f64,
}

impl Default for LimiterConfig {
    fn default() -> Self {
        LimiterConfig {
            initial_limit: 16,
            min_limit: 1,
            max_limit: 32,
            tolerance: 1.5,
            smoothing: 0.2,
            long_window: 600,
            short_window: 10,
            headroom: 4.0,
        }
    }
}

/// Samples averaged plainly before the averages turn exponential.
const WARMUP_SAMPLES: u32 = 10;

#[derive(Clone, Debug)]
pub struct GradientLimiter {
    config: LimiterConfig,
    /// The limit as a real number; permits are its floor.
    estimate: f64,
    in_flight: u32,
    /// Long-run and recent average latency (microseconds), and the samples they have seen.
    long_rtt_us: f64,
    short_rtt_us: f64,
    samples: u32,
}

impl GradientLimiter {
    pub fn new(config: LimiterConfig) -> Self {
        let (min, max) = bounds(&config);
        GradientLimiter {
            config,
            estimate: f64::from(config.initial_limit.clamp(min, max)),
            in_flight: 0,
            long_rtt_us: 0.0,
            short_rtt_us: 0.0,
            samples: 0,
        }
    }

    pub fn limit(&self) -> u32 {
        // The estimate stays within [min, max] (both u32), so the cast cannot truncate.
        self.estimate.floor() as u32
    }

    pub fn in_flight(&self) -> u32 {
        self.in_flight
    }

    pub fn try_acquire(&mut self) -> bool {
        if self.in_flight < self.limit() {
            self.in_flight += 1;
            true
        } else {
            false
        }
    }

    /// Returns a permit. `rtt_us` is the storage latency of the work done under it, or `None`
    /// when no storage work completed under it (abandoned, or nothing to do): a near-zero sample
    /// reads as an idle database and would grow the limit while the database is loaded.
    pub fn release(&mut self, rtt_us: Option<u64>) {
        debug_assert!(self.in_flight > 0, "release without acquire");
        // Permits in use when this work finished, itself included.
        let busy = self.in_flight;
        self.in_flight = self.in_flight.saturating_sub(1);
        let Some(rtt) = rtt_us.map(|r| r.max(1) as f64) else {
            return;
        };
        let c = &self.config;
        self.samples = self.samples.saturating_add(1);
        // Exponential averages; over the first few samples a plain one, so the first sample
        // does not stand for the long run.
        let average = |avg: &mut f64, window: u32, n: u32| {
            let weight = if n <= WARMUP_SAMPLES {
                1.0 / f64::from(n)
            } else {
                2.0 / (f64::from(window) + 1.0)
            };
            *avg += (rtt - *avg) * weight;
        };
        average(&mut self.long_rtt_us, c.long_window, self.samples);
        average(&mut self.short_rtt_us, c.short_window, self.samples);
        // After a long overload the long-run average lags far above what samples read now: let it
        // come down faster, or the limit would grow on the old, slower average.
        if self.long_rtt_us > 2.0 * self.short_rtt_us {
            self.long_rtt_us *= 0.95;
        }
        // Not using half its permits, the broker learns nothing about more of them.
        if f64::from(busy) < self.estimate / 2.0 {
            return;
        }
        let gradient = (c.tolerance * self.long_rtt_us / self.short_rtt_us).clamp(0.5, 1.0);
        let next = self.estimate * gradient + c.headroom;
        let (min, max) = bounds(c);
        self.estimate = (self.estimate * (1.0 - c.smoothing) + next * c.smoothing)
            .clamp(f64::from(min), f64::from(max));
    }
}

fn bounds(config: &LimiterConfig) -> (u32, u32) {
    let min = config.min_limit.max(1);
    (min, config.max_limit.max(min))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn serve(l: &mut GradientLimiter, rtt_us: u64, n: usize) {
        for _ in 0..n {
            // A loaded broker: every permit taken when a sample comes back.
            while l.try_acquire() {}
            l.release(Some(rtt_us));
        }
    }

    #[test]
    fn permits_are_bounded_by_the_limit() {
        let mut l = GradientLimiter::new(LimiterConfig {
            initial_limit: 2,
            ..LimiterConfig::default()
        });
        assert!(l.try_acquire());
        assert!(l.try_acquire());
        assert!(!l.try_acquire());
        l.release(None);
        assert!(l.try_acquire());
    }

    #[test]
    fn grows_to_the_cap_when_latency_holds_and_shrinks_when_it_climbs() {
        let mut l = GradientLimiter::new(LimiterConfig::default());
        serve(&mut l, 1000, 200);
        assert_eq!(l.limit(), 32, "flat latency grows to the cap");
        serve(&mut l, 10_000, 30);
        assert!(
            l.limit() < 16,
            "10x latency means a queue: shrink, got {}",
            l.limit()
        );
        assert!(l.limit() >= 1);
    }

    #[test]
    fn comes_back_after_an_overload_ends() {
        let mut l = GradientLimiter::new(LimiterConfig::default());
        serve(&mut l, 1000, 200);
        serve(&mut l, 20_000, 50);
        let during = l.limit();
        assert!(during < 16, "an overload shrinks the limit, got {during}");
        serve(&mut l, 1000, 300);
        assert_eq!(
            l.limit(),
            32,
            "back to the cap from {during} once latency is back"
        );
    }

    /// The fixed point the Vegas rule had: work of different sizes (a cheap pop beside pops ten
    /// times dearer, the mix unchanged, so nothing queues more) read as congestion against the
    /// cheapest latency ever seen, and the limit sat where its arithmetic stopped moving. Against
    /// the long-run average the same mix leaves the limit at the cap.
    #[test]
    fn a_steady_mix_of_cheap_and_dear_work_is_not_congestion() {
        let mut l = GradientLimiter::new(LimiterConfig::default());
        for i in 0..3000 {
            serve(&mut l, if i % 4 == 0 { 150 } else { 1500 }, 1);
        }
        assert!(
            l.limit() >= 24,
            "a steady mix keeps the limit high, got {}",
            l.limit()
        );
    }

    /// Why a permit that ran no storage work reports no sample: near-zero samples read as an
    /// idle database, and the limit would grow while every real sample says it is queueing.
    #[test]
    fn samples_of_no_work_would_grow_the_limit_under_load() {
        let loaded = |near_zero: bool| {
            let mut l = GradientLimiter::new(LimiterConfig::default());
            serve(&mut l, 1000, 100);
            for i in 0..200 {
                serve(&mut l, if near_zero && i % 2 == 0 { 1 } else { 8000 }, 1);
            }
            l.limit()
        };
        assert!(
            loaded(true) > loaded(false),
            "empty samples mask the queue: {} against {}",
            loaded(true),
            loaded(false)
        );
    }

    #[test]
    fn an_idle_broker_keeps_its_limit() {
        let mut l = GradientLimiter::new(LimiterConfig::default());
        // One permit at a time, whatever its latency: too few in use to learn from.
        for i in 0..100 {
            assert!(l.try_acquire());
            l.release(Some(if i % 2 == 0 { 100 } else { 50_000 }));
        }
        assert_eq!(l.limit(), 16);
    }
}
