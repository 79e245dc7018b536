//! UUIDv7 minting from an injected clock and seeded bytes (never `Uuid::now_v7`, which reads the
//! wall clock and the OS RNG: a simulation's ids must follow its virtual time and its seed). The
//! `uuid` crate still builds and formats the ids.

use crate::rng::SeededRng;
use crate::types::{Timestamp, WorkerId};

/// Mints UUIDv7 ids: 48-bit Unix milliseconds from the caller's `now`, the rest from a seeded RNG.
/// Ids minted within one millisecond carry a rising 12-bit counter in `rand_a`, so they sort in
/// minting order as the previous broker's ids did.
#[derive(Clone, Debug)]
pub struct IdMinter {
    rng: SeededRng,
    last_ms: u64,
    counter: u16,
}

impl IdMinter {
    pub fn new(rng: SeededRng) -> Self {
        IdMinter {
            rng,
            last_ms: 0,
            counter: 0,
        }
    }

    pub fn mint(&mut self, now: Timestamp) -> uuid::Uuid {
        let mut ms = u64::try_from(now.as_millis()).unwrap_or(0);
        if ms <= self.last_ms {
            // Same millisecond, or the clock went backwards: keep ids rising.
            ms = self.last_ms;
            self.counter = self.counter.wrapping_add(1) & 0x0fff;
            if self.counter == 0 {
                ms += 1;
            }
        } else {
            self.counter = (self.rng.next_u64() & 0x01ff) as u16;
        }
        self.last_ms = ms;
        let mut bytes = [0u8; 10];
        self.rng.fill(&mut bytes);
        let counter = self.counter.to_be_bytes();
        bytes[0] = counter[0];
        bytes[1] = counter[1];
        uuid::Builder::from_unix_timestamp_millis(ms, &bytes).into_uuid()
    }

    pub fn mint_worker(&mut self, now: Timestamp) -> WorkerId {
        WorkerId(self.mint(now))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_v7_and_rising() {
        let mut m = IdMinter::new(SeededRng::new(1));
        let a = m.mint(Timestamp::from_millis(1_700_000_000_000));
        let b = m.mint(Timestamp::from_millis(1_700_000_000_000));
        let c = m.mint(Timestamp::from_millis(1_699_999_999_000));
        assert_eq!(a.get_version_num(), 7);
        assert!(a < b && b < c, "{a} {b} {c}");
        let (secs, _) = a.get_timestamp().expect("v7 carries a timestamp").to_unix();
        assert_eq!(secs, 1_700_000_000);
    }

    #[test]
    fn ids_are_deterministic_per_seed() {
        let now = Timestamp::from_millis(1_700_000_000_000);
        let a = IdMinter::new(SeededRng::new(9)).mint(now);
        let b = IdMinter::new(SeededRng::new(9)).mint(now);
        assert_eq!(a, b);
    }
}
