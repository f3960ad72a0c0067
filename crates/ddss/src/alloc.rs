//! The home node's pool and its first-fit allocator (seed 003 sec. 2.2.1,
//! lines ~554-556: "we get the first-fit free block which can accommodate
//! the allocation unit"). Offsets only: the bytes live in the store's pool.

/// Free ranges of a fixed-size pool, sorted by offset, merged on release.
#[derive(Debug, Clone)]
pub struct FirstFit {
    free: Vec<(u64, u64)>,
    size: u64,
}

impl FirstFit {
    pub fn new(size: u64) -> FirstFit {
        FirstFit {
            free: if size > 0 { vec![(0, size)] } else { vec![] },
            size,
        }
    }

    /// Offset of the first free range of at least `len` bytes.
    pub fn alloc(&mut self, len: u64) -> Option<u64> {
        let len = len.max(1);
        let i = self.free.iter().position(|&(_, l)| l >= len)?;
        let (off, l) = self.free[i];
        if l == len {
            self.free.remove(i);
        } else {
            self.free[i] = (off + len, l - len);
        }
        Some(off)
    }

    /// Return `[off, off+len)` (as allocated) to the pool.
    pub fn release(&mut self, off: u64, len: u64) {
        let len = len.max(1);
        let i = self.free.partition_point(|&(o, _)| o < off);
        self.free.insert(i, (off, len));
        // Merge with the next, then with the previous range.
        if i + 1 < self.free.len() && self.free[i].0 + self.free[i].1 == self.free[i + 1].0 {
            self.free[i].1 += self.free[i + 1].1;
            self.free.remove(i + 1);
        }
        if i > 0 && self.free[i - 1].0 + self.free[i - 1].1 == self.free[i].0 {
            self.free[i - 1].1 += self.free[i].1;
            self.free.remove(i);
        }
    }

    pub fn free_bytes(&self) -> u64 {
        self.free.iter().map(|&(_, l)| l).sum()
    }

    pub fn size(&self) -> u64 {
        self.size
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn first_fit_reuses_the_first_hole() {
        let mut a = FirstFit::new(100);
        let x = a.alloc(10).unwrap();
        let y = a.alloc(20).unwrap();
        let _z = a.alloc(30).unwrap();
        a.release(x, 10);
        a.release(y, 20);
        // The merged hole [0,30) comes first and fits.
        assert_eq!(a.alloc(25), Some(0));
        assert_eq!(a.alloc(60), None);
    }

    proptest! {
        #[test]
        fn never_overlaps_and_frees_everything(ops in proptest::collection::vec((1u64..40, any::<bool>()), 1..60)) {
            let mut a = FirstFit::new(512);
            let mut live: Vec<(u64, u64)> = vec![];
            for (len, free) in ops {
                if free && !live.is_empty() {
                    let (o, l) = live.remove(0);
                    a.release(o, l);
                } else if let Some(o) = a.alloc(len) {
                    for &(p, q) in &live {
                        prop_assert!(o + len <= p || p + q <= o);
                    }
                    prop_assert!(o + len <= 512);
                    live.push((o, len));
                }
            }
            for (o, l) in live.drain(..) {
                a.release(o, l);
            }
            prop_assert_eq!(a.free_bytes(), 512);
            prop_assert_eq!(a.alloc(512), Some(0));
        }
    }
}
