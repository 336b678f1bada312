//! A small seeded PRNG (xorshift64*, seeded through splitmix64): the chaos schedule and the
//! clients' choices replay exactly from one seed, without a dependency.

use std::time::Duration;

#[derive(Debug, Clone)]
pub struct Rng(u64);

/// splitmix64: spreads any seed (0, 1, 2, ...) over the whole state space.
fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl Rng {
    pub fn new(seed: u64) -> Rng {
        // xorshift's state must never be zero.
        Rng(splitmix(seed).max(1))
    }

    /// An independent stream for `stream` (a server, a client), fixed by the seed alone.
    pub fn fork(seed: u64, stream: u64) -> Rng {
        Rng::new(splitmix(seed) ^ splitmix(stream.wrapping_add(0x5eed)))
    }

    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        // The bias of a modulo over 64 bits is negligible for the small n used here.
        self.next_u64() % n.max(1)
    }

    /// Uniform in `lo..=hi` milliseconds.
    pub fn millis(&mut self, lo: u64, hi: u64) -> Duration {
        Duration::from_millis(lo + self.below(hi.saturating_sub(lo) + 1))
    }

    /// An index chosen with the given weights (at least one positive).
    pub fn weighted(&mut self, weights: &[u32]) -> usize {
        let total: u64 = weights.iter().map(|&w| u64::from(w)).sum();
        let mut pick = self.below(total);
        for (i, &w) in weights.iter().enumerate() {
            if pick < u64::from(w) {
                return i;
            }
            pick -= u64::from(w);
        }
        weights.len() - 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_replays_and_streams_differ() {
        let a: Vec<u64> = (0..5).map(|_| Rng::new(7).next_u64()).collect();
        assert!(a.windows(2).all(|w| w[0] == w[1]));
        let mut x = Rng::fork(7, 1);
        let mut y = Rng::fork(7, 2);
        assert_ne!(x.next_u64(), y.next_u64());
        let mut r = Rng::new(0);
        for _ in 0..1000 {
            assert!(r.below(3) < 3);
            let d = r.millis(10, 20);
            assert!(d >= Duration::from_millis(10) && d <= Duration::from_millis(20));
            assert!(r.weighted(&[0, 5, 0]) == 1);
        }
    }
}
