//! The random source: proptest's seeded RNG, one per case, so any case can
//! be replayed alone from the seed and its number.

use proptest::prelude::{Rng, RngExt};
use proptest::test_runner::{RngAlgorithm, TestRng};

/// A case's random choices.
pub struct Gen {
    rng: TestRng,
}

impl Gen {
    /// The generator of case `case` of target `target` under `seed`.
    pub fn for_case(seed: u64, target: u64, case: u64) -> Self {
        let a = splitmix(seed ^ splitmix(target.wrapping_add(0x9e37)));
        let b = splitmix(a ^ case);
        let mut bytes = [0u8; 16];
        bytes[..8].copy_from_slice(&b.to_le_bytes());
        bytes[8..].copy_from_slice(&splitmix(b).to_le_bytes());
        Self {
            rng: TestRng::from_seed(RngAlgorithm::XorShift, &bytes),
        }
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        self.rng.random_bool(p)
    }

    /// A number in `low..high`.
    pub fn below(&mut self, high: usize) -> usize {
        if high == 0 {
            0
        } else {
            self.rng.random_range(0..high)
        }
    }

    /// A number in `low..=high`.
    pub fn between(&mut self, low: i64, high: i64) -> i64 {
        self.rng.random_range(low..=high)
    }

    /// One of `items`.
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }

    /// `len` random bytes.
    pub fn bytes(&mut self, len: usize) -> Vec<u8> {
        let mut bytes = vec![0u8; len];
        self.rng.fill_bytes(&mut bytes);
        bytes
    }
}

fn splitmix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}
