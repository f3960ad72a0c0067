//! One seeded RNG for the engine's tests (issue 37: it replaces three
//! hand-written xorshift generators). Reproducible from its seed, which is
//! printed when a test panics while it is alive: rerun with that seed.

use rand::rngs::StdRng;
use rand::{Rng as _, RngCore, SeedableRng};

pub struct Rng {
    seed: u64,
    inner: StdRng,
}

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng {
            seed,
            inner: StdRng::seed_from_u64(seed),
        }
    }

    pub fn next(&mut self) -> u64 {
        self.inner.next_u64()
    }

    /// Uniform in 0..n (0 when n is 0).
    pub fn below(&mut self, n: usize) -> usize {
        self.inner.gen_range(0..n.max(1))
    }

    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        let mut v = vec![0u8; n];
        self.inner.fill_bytes(&mut v);
        v
    }
}

impl Drop for Rng {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("test RNG seed: {:#x}", self.seed);
        }
    }
}
