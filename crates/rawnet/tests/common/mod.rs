//! Helpers shared by rawnet's integration tests (issue 37: one generator
//! instead of a copy in each test file).

#![allow(dead_code)]

/// A deterministic byte stream (xorshift64, one byte per step), so both
/// ends of a link can regenerate what was sent and compare.
pub struct XorShift(pub u64);

impl XorShift {
    pub fn fill(&mut self, b: &mut [u8]) {
        for x in b.iter_mut() {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            *x = self.0 as u8;
        }
    }
}

/// `len` bytes of the stream seeded with `seed` (made odd: never zero).
pub fn stream(len: usize, seed: u64) -> Vec<u8> {
    let mut v = vec![0u8; len];
    XorShift(seed | 1).fill(&mut v);
    v
}
