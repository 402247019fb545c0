//! A byte budget that hands out reservations and remembers its peak.
//!
//! Every buffer whose size depends on the data or the configuration (the in-memory chunk, each
//! run's read buffer, the write buffer) is reserved here *before* it is allocated and released
//! when it is freed, so [`MemoryBudget::peak_reserved`] is an upper bound of the library's
//! large allocations. Bookkeeping proportional to the fan-in or the thread count (a few words per
//! input) is not counted.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::error::{Error, Result};

#[derive(Debug)]
struct Inner {
    limit: usize,
    reserved: AtomicUsize,
    peak: AtomicUsize,
}

/// A shared memory budget (cheap to clone; clones share the same counters).
#[derive(Debug, Clone)]
pub struct MemoryBudget {
    inner: Arc<Inner>,
}

impl MemoryBudget {
    /// A budget of `limit` bytes with nothing reserved.
    pub fn new(limit: usize) -> Self {
        MemoryBudget {
            inner: Arc::new(Inner {
                limit,
                reserved: AtomicUsize::new(0),
                peak: AtomicUsize::new(0),
            }),
        }
    }

    /// The limit in bytes.
    pub fn limit(&self) -> usize {
        self.inner.limit
    }

    /// Bytes reserved right now.
    pub fn reserved(&self) -> usize {
        self.inner.reserved.load(Ordering::Relaxed)
    }

    /// Bytes still available.
    pub fn available(&self) -> usize {
        self.limit().saturating_sub(self.reserved())
    }

    /// The most bytes ever reserved at once; never above [`Self::limit`].
    pub fn peak_reserved(&self) -> usize {
        self.inner.peak.load(Ordering::Relaxed)
    }

    /// Reserves `bytes`, or fails with [`Error::Budget`] if that would exceed the limit.
    /// The reservation is returned to the budget when the [`Reservation`] is dropped.
    pub fn try_reserve(&self, bytes: usize) -> Result<Reservation> {
        self.acquire(bytes)?;
        Ok(Reservation {
            budget: self.clone(),
            bytes,
        })
    }

    fn acquire(&self, bytes: usize) -> Result<()> {
        let inner = &self.inner;
        let mut current = inner.reserved.load(Ordering::Relaxed);
        loop {
            let next = current
                .checked_add(bytes)
                .filter(|&n| n <= inner.limit)
                .ok_or(Error::Budget {
                    requested: bytes,
                    reserved: current,
                    limit: inner.limit,
                })?;
            match inner.reserved.compare_exchange_weak(
                current,
                next,
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => {
                    inner.peak.fetch_max(next, Ordering::Relaxed);
                    return Ok(());
                }
                Err(actual) => current = actual,
            }
        }
    }

    fn release(&self, bytes: usize) {
        self.inner.reserved.fetch_sub(bytes, Ordering::AcqRel);
    }
}

/// Bytes held from a [`MemoryBudget`]; released on drop.
#[derive(Debug)]
pub struct Reservation {
    budget: MemoryBudget,
    bytes: usize,
}

impl Reservation {
    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Grows the reservation by `extra` bytes, or fails leaving it unchanged.
    pub fn try_grow(&mut self, extra: usize) -> Result<()> {
        self.budget.acquire(extra)?;
        self.bytes += extra;
        Ok(())
    }

    /// Shrinks the reservation to `bytes` (no-op if it already holds less).
    pub fn shrink_to(&mut self, bytes: usize) {
        if bytes < self.bytes {
            self.budget.release(self.bytes - bytes);
            self.bytes = bytes;
        }
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.budget.release(self.bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserve_release_and_peak() {
        let budget = MemoryBudget::new(1000);
        let a = budget.try_reserve(600).unwrap();
        assert_eq!(budget.reserved(), 600);
        let err = budget.try_reserve(401).unwrap_err();
        assert!(matches!(
            err,
            Error::Budget {
                requested: 401,
                reserved: 600,
                limit: 1000
            }
        ));
        let mut b = budget.try_reserve(400).unwrap();
        assert_eq!(budget.available(), 0);
        assert!(b.try_grow(1).is_err());
        b.shrink_to(100);
        assert_eq!(budget.reserved(), 700);
        b.try_grow(300).unwrap();
        assert_eq!(b.bytes(), 400);
        drop(a);
        drop(b);
        assert_eq!(budget.reserved(), 0);
        assert_eq!(budget.peak_reserved(), 1000);
        assert!(budget.try_reserve(usize::MAX).is_err());
    }

    #[test]
    fn concurrent_reservations_never_exceed_limit() {
        let budget = MemoryBudget::new(10_000);
        std::thread::scope(|s| {
            for _ in 0..4 {
                let budget = budget.clone();
                s.spawn(move || {
                    for i in 0..10_000 {
                        if let Ok(r) = budget.try_reserve(1 + i % 3000) {
                            assert!(budget.reserved() <= budget.limit());
                            drop(r);
                        }
                    }
                });
            }
        });
        assert_eq!(budget.reserved(), 0);
        assert!(budget.peak_reserved() <= 10_000);
    }
}
