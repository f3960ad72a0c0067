//! The lock word of a segment (seed 003 sec. 2.2.2, lines ~567-569: one
//! 64-bit word per allocation unit, taken with compare-and-swap) with what
//! the seed leaves out: a lease and a fencing token.
//!
//! - Lease: a lock is granted for `lease_ms` of the home's clock; the
//!   holder renews it by locking again. A holder that dies (daemon killed,
//!   link lost) stops renewing and the lock frees itself when the lease
//!   runs out: no failure detector is needed at the home.
//! - Fencing: every grant carries a token one larger than any before on
//!   this segment. A put that names a token is refused unless that token is
//!   the current, unexpired one, so a holder that paused past its lease
//!   (and whose lock another holder now has) cannot overwrite the data.

/// Who asks: a random 64-bit id per requester (a daemon, or a client of
/// one), never 0.
pub type Holder = u64;

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LockWord {
    /// Current holder (0: free).
    holder: Holder,
    /// Token of the latest grant (0: never granted).
    token: u64,
    /// Home clock (ms) at which the lease runs out.
    expires_ms: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockError {
    /// Held by `holder` for `remaining_ms` more.
    Busy { holder: Holder, remaining_ms: u64 },
    /// The token is not the current grant (stale or expired holder).
    Fenced,
}

impl LockWord {
    /// The holder of a live lease at `now`, if any.
    pub fn holder(&self, now_ms: u64) -> Option<Holder> {
        (self.holder != 0 && now_ms < self.expires_ms).then_some(self.holder)
    }

    /// Is the segment locked by someone other than `who` at `now`?
    pub fn excludes(&self, who: Holder, now_ms: u64) -> bool {
        self.holder(now_ms).is_some_and(|h| h != who)
    }

    /// Compare-and-swap: free (or expired, or ours) -> ours. Returns the
    /// fencing token; re-locking by the holder renews the lease and keeps
    /// the token.
    pub fn acquire(&mut self, who: Holder, lease_ms: u64, now_ms: u64) -> Result<u64, LockError> {
        match self.holder(now_ms) {
            Some(h) if h != who => Err(LockError::Busy {
                holder: h,
                remaining_ms: self.expires_ms - now_ms,
            }),
            Some(_) => {
                self.expires_ms = now_ms.saturating_add(lease_ms);
                Ok(self.token)
            }
            None => {
                self.holder = who;
                self.token += 1;
                self.expires_ms = now_ms.saturating_add(lease_ms);
                Ok(self.token)
            }
        }
    }

    /// Release with the grant's token; an expired or superseded token is
    /// refused (the lock is no longer the caller's to release).
    pub fn release(&mut self, token: u64, now_ms: u64) -> Result<(), LockError> {
        self.check(token, now_ms)?;
        self.holder = 0;
        self.expires_ms = 0;
        Ok(())
    }

    /// A put carrying `token`: valid only for the current live grant.
    pub fn check(&self, token: u64, now_ms: u64) -> Result<(), LockError> {
        if token != 0 && token == self.token && self.holder(now_ms).is_some() {
            Ok(())
        } else {
            Err(LockError::Fenced)
        }
    }

    /// Holder of the current grant with `token` (for implicit exclusion).
    pub fn holder_of(&self, token: u64) -> Option<Holder> {
        (token != 0 && token == self.token && self.holder != 0).then_some(self.holder)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_expires_and_fences_the_old_holder() {
        let mut w = LockWord::default();
        let t1 = w.acquire(1, 100, 0).unwrap();
        assert!(matches!(
            w.acquire(2, 100, 50),
            Err(LockError::Busy {
                holder: 1,
                remaining_ms: 50
            })
        ));
        // Holder 1 dies; at 100 the lease has run out.
        let t2 = w.acquire(2, 100, 100).unwrap();
        assert!(t2 > t1);
        assert_eq!(w.check(t1, 120), Err(LockError::Fenced));
        assert_eq!(w.check(t2, 120), Ok(()));
        assert_eq!(w.release(t1, 120), Err(LockError::Fenced));
        w.release(t2, 130).unwrap();
        assert_eq!(w.holder(130), None);
        // An expired grant is fenced even if nobody took the lock since.
        let t3 = w.acquire(3, 10, 200).unwrap();
        assert_eq!(w.check(t3, 210), Err(LockError::Fenced));
    }

    #[test]
    fn relock_renews_and_keeps_the_token() {
        let mut w = LockWord::default();
        let t = w.acquire(1, 100, 0).unwrap();
        assert_eq!(w.acquire(1, 100, 90), Ok(t));
        assert!(w.excludes(2, 150));
        assert!(!w.excludes(1, 150));
        assert!(!w.excludes(2, 190));
    }
}
