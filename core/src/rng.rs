//! Owned, seeded randomness. The core never touches a global RNG; every consumer of randomness
//! holds a `SeededRng` derived from a configured seed, with a child stream per subsystem so one
//! subsystem's draws never reshuffle another's.

/// SplitMix64: tiny, fast, and good enough for scheduling and id entropy. Hand-written rather than
/// `rand`'s: its output is fixed forever here, so a recorded `SIM_SEED` replays the same run after
/// any dependency upgrade, and the sans-IO core carries no RNG crate.
#[derive(Clone, Debug)]
pub struct SeededRng {
    state: u64,
}

impl SeededRng {
    pub fn new(seed: u64) -> Self {
        SeededRng { state: seed }
    }

    /// A child stream for a named subsystem, independent of the parent's later draws.
    pub fn child(&self, label: &str) -> SeededRng {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in label.bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        let mut c = SeededRng::new(self.state ^ h);
        c.next_u64();
        c
    }

    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            return 0;
        }
        self.next_u64() % n
    }

    pub fn chance(&mut self, numerator: u64, denominator: u64) -> bool {
        self.below(denominator) < numerator
    }

    pub fn fill(&mut self, out: &mut [u8]) {
        for chunk in out.chunks_mut(8) {
            let v = self.next_u64().to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
    }

    /// Fisher-Yates shuffle.
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = self.below(i as u64 + 1) as usize;
            items.swap(i, j);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_stream_and_children_are_independent() {
        let mut a = SeededRng::new(7);
        let mut b = SeededRng::new(7);
        assert_eq!(a.next_u64(), b.next_u64());
        let mut c1 = a.child("ids");
        let mut c2 = b.child("ids");
        assert_eq!(c1.next_u64(), c2.next_u64());
        let mut d = a.child("ring");
        assert_ne!(a.child("ids").next_u64(), d.next_u64());
    }
}
