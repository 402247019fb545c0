//! Admission by weighted memory demand (Hetero-DB, Zhang et al. 2015, sec. 3.2, eq. (2)).
//!
//! A fragment or graph job asks to run with its *weighted demand*: the memory its operators
//! take, each weighted by its share of the run's time, m = Σ tᵢ·mᵢ / Σ tᵢ. An operator that
//! holds much memory briefly counts for little; one that holds it throughout counts fully. Work
//! is admitted while the demands of everything admitted fit in the device's memory, and, when it
//! asks to hold memory from the node's pool while it runs (a fragment's scans: their row groups
//! decode outside the operators' reservations), once the pool grants it. The rest waits and is
//! reconsidered whenever admitted work finishes (and every few milliseconds, for the pool). Work
//! whose demand alone exceeds the device is admitted when nothing else runs, so it cannot starve.
//!
//! Waiting is bounded. The host may be waiting for a fragment that is itself waiting (a merge
//! that needs every partition's first rows while the admitted ones are blocked on it), so work is
//! admitted anyway once nothing admitted has made progress for the patience, or once it has
//! waited [`Patience::limit`] in all. Admitted work reports progress (a batch made) with
//! [`MemoryAdmission::progressed`]; while it does, the memory it holds will come back, and the
//! node keeps to its budget by waiting for it (the soak's 512 MB node overshot its budget when
//! work was admitted after a fixed 2 s under load).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use datafusion::execution::memory_pool::MemoryReservation;
use tokio::sync::Notify;
use tokio::time::Instant;

/// How often waiting work asks the pool again: operators give memory back without telling
/// admission.
const POOL_RECHECK: Duration = Duration::from_millis(20);

/// How long work waits to be admitted.
#[derive(Debug, Clone, Copy)]
pub struct Patience {
    /// Admitted anyway once nothing admitted made progress for this long.
    pub stalled: Duration,
    /// Admitted anyway after this long in all.
    pub limit: Duration,
}

/// Eq. (2): the time-weighted average of the operators' memory, from (time, bytes) per operator.
/// No time at all (nothing estimated) weighs the operators equally.
pub fn weighted_demand(operators: &[(f64, u64)]) -> u64 {
    let total: f64 = operators.iter().map(|(t, _)| t.max(0.0)).sum();
    if operators.is_empty() {
        return 0;
    }
    if total <= 0.0 {
        return operators.iter().map(|(_, m)| m).sum::<u64>() / operators.len() as u64;
    }
    (operators.iter().map(|(t, m)| t.max(0.0) * *m as f64).sum::<f64>() / total).round() as u64
}

/// The node's admission controller over `capacity` bytes of device memory.
#[derive(Debug)]
pub struct MemoryAdmission {
    capacity: u64,
    /// The summed demands of the admitted work.
    admitted: Mutex<Admitted>,
    released: Notify,
    /// Batches made by admitted work, for telling a wait from a stall.
    progress: AtomicU64,
    /// Work admitted although it did not fit (a stall or the limit), for the metrics.
    overcommitted: AtomicU64,
}

#[derive(Debug, Default)]
struct Admitted {
    bytes: u64,
    count: usize,
}

/// An admission: its demand counts against the device, and its reservation (if it asked to
/// hold memory from the pool) is held, until it is dropped.
#[derive(Debug)]
pub struct Admission {
    controller: Arc<MemoryAdmission>,
    demand: u64,
    _held: Option<MemoryReservation>,
}

/// Memory an admission holds from the node's pool while the work runs: `bytes` grown on
/// `reservation` when admitted.
#[derive(Debug)]
pub struct PoolHold {
    pub reservation: MemoryReservation,
    pub bytes: usize,
}

impl MemoryAdmission {
    /// A controller over `capacity` bytes.
    pub fn new(capacity: u64) -> Arc<Self> {
        Arc::new(MemoryAdmission { capacity, admitted: Mutex::default(), released: Notify::new(), progress: AtomicU64::new(0), overcommitted: AtomicU64::new(0) })
    }

    /// Waits until `demand` fits beside the admitted work (or nothing else is admitted) and the
    /// pool grants `hold`, within `patience` (see the module docs); then admits it anyway, with
    /// whatever part of `hold` the pool still grants.
    pub async fn admit(self: &Arc<Self>, demand: u64, mut hold: Option<PoolHold>, patience: Patience) -> Admission {
        let started = Instant::now();
        let (mut progress_seen, mut progress_at) = (self.progress.load(Ordering::Relaxed), started);
        loop {
            // Registered before checking, so a release between the check and the wait wakes it.
            let released = self.released.notified();
            match self.try_admit_holding(demand, hold) {
                Ok(admission) => return admission,
                Err(back) => hold = back,
            }
            let now = Instant::now();
            let progress = self.progress.load(Ordering::Relaxed);
            if progress != progress_seen {
                (progress_seen, progress_at) = (progress, now);
            }
            if now >= progress_at + patience.stalled || now >= started + patience.limit {
                self.overcommitted.fetch_add(1, Ordering::Relaxed);
                return self.admit_now(demand, hold.map(|h| grow_what_fits(h.reservation, h.bytes)));
            }
            let wake = (now + POOL_RECHECK).min(progress_at + patience.stalled).min(started + patience.limit);
            let _ = tokio::time::timeout_at(wake, released).await;
        }
    }

    /// Admits `demand` now if it fits (and holds nothing from the pool).
    pub fn try_admit(self: &Arc<Self>, demand: u64) -> Option<Admission> {
        self.try_admit_holding(demand, None).ok()
    }

    /// Admits `demand` now if it fits and the pool grants `hold`; else gives `hold` back.
    fn try_admit_holding(self: &Arc<Self>, demand: u64, hold: Option<PoolHold>) -> Result<Admission, Option<PoolHold>> {
        let mut admitted = self.admitted.lock().expect("admission lock");
        let alone = admitted.count == 0;
        if !alone && admitted.bytes.saturating_add(demand) > self.capacity {
            return Err(hold);
        }
        let held = match hold {
            Some(h) if h.reservation.try_grow(h.bytes).is_ok() => Some(h.reservation),
            // Alone, it runs with what the pool has: nothing admitted will give more back.
            Some(h) if alone => Some(grow_what_fits(h.reservation, h.bytes)),
            Some(h) => return Err(Some(h)),
            None => None,
        };
        Ok(self.record(&mut admitted, demand, held))
    }

    /// Admits `demand` whether it fits or not.
    fn admit_now(self: &Arc<Self>, demand: u64, held: Option<MemoryReservation>) -> Admission {
        let mut admitted = self.admitted.lock().expect("admission lock");
        self.record(&mut admitted, demand, held)
    }

    /// Counts `demand` as admitted (under the lock) and returns its admission.
    fn record(self: &Arc<Self>, admitted: &mut Admitted, demand: u64, held: Option<MemoryReservation>) -> Admission {
        admitted.bytes += demand;
        admitted.count += 1;
        Admission { controller: Arc::clone(self), demand, _held: held }
    }

    /// Admitted work made progress (a batch): memory it holds will come back.
    pub fn progressed(&self) {
        self.progress.fetch_add(1, Ordering::Relaxed);
    }

    /// The summed demand of the admitted work.
    pub fn admitted_bytes(&self) -> u64 {
        self.admitted.lock().expect("admission lock").bytes
    }

    /// How much work was admitted though it did not fit (stalled or waited its limit).
    pub fn overcommitted(&self) -> u64 {
        self.overcommitted.load(Ordering::Relaxed)
    }
}

/// `reservation` grown by as much of `bytes` as the pool still has, halving what it asks for.
fn grow_what_fits(reservation: MemoryReservation, bytes: usize) -> MemoryReservation {
    let mut asked = bytes;
    while asked > 0 && reservation.try_grow(asked).is_err() {
        asked /= 2;
    }
    reservation
}

impl Drop for Admission {
    fn drop(&mut self) {
        let mut admitted = self.controller.admitted.lock().expect("admission lock");
        admitted.bytes -= self.demand;
        admitted.count -= 1;
        drop(admitted);
        self.controller.released.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_weighted_demand_weighs_memory_by_time() {
        // A scan holding 10 MB for 9 s and a join holding 100 MB for 1 s: 19 MB, not 110 or 55.
        assert_eq!(weighted_demand(&[(9.0, 10_000_000), (1.0, 100_000_000)]), 19_000_000);
        assert_eq!(weighted_demand(&[(0.0, 10), (0.0, 30)]), 20, "no time estimates: the plain mean");
        assert_eq!(weighted_demand(&[]), 0);
    }

    fn patient(stalled: Duration) -> Patience {
        Patience { stalled, limit: Duration::from_secs(3600) }
    }

    #[tokio::test]
    async fn work_waits_until_its_demand_fits_and_oversized_work_runs_alone() {
        let admission = MemoryAdmission::new(100);
        let forever = patient(Duration::from_secs(3600));
        let first = admission.admit(60, None, forever).await;
        assert!(admission.try_admit(50).is_none(), "60 + 50 > 100");
        let small = admission.admit(40, None, forever).await;
        assert_eq!(admission.admitted_bytes(), 100);
        let waiting = {
            let admission = Arc::clone(&admission);
            tokio::spawn(async move { admission.admit(50, None, forever).await })
        };
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        drop(first);
        let third = waiting.await.unwrap();
        assert_eq!(admission.admitted_bytes(), 90);
        drop((small, third));
        // Larger than the device: admitted once nothing else runs.
        let other = admission.admit(10, None, forever).await;
        assert!(admission.try_admit(500).is_none());
        drop(other);
        let huge = admission.admit(500, None, forever).await;
        assert_eq!(admission.admitted_bytes(), 500);
        // Once nothing admitted makes progress for its patience, work is admitted though it does not fit.
        let impatient = admission.admit(10, None, patient(Duration::from_millis(20))).await;
        assert_eq!(admission.admitted_bytes(), 510);
        assert_eq!(admission.overcommitted(), 1);
        drop((huge, impatient));
        assert_eq!(admission.admitted_bytes(), 0);
    }

    /// While admitted work reports progress, waiting work keeps waiting past its patience (the
    /// memory will come back); once progress stops, it is admitted; and never later than the limit.
    #[tokio::test]
    async fn a_wait_outlasts_the_patience_while_admitted_work_progresses() {
        let admission = MemoryAdmission::new(100);
        let second_long = patient(Duration::from_secs(1));
        let running = admission.admit(100, None, second_long).await;
        let waiting = {
            let admission = Arc::clone(&admission);
            tokio::spawn(async move { admission.admit(50, None, second_long).await })
        };
        for _ in 0..20 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            admission.progressed();
            assert!(!waiting.is_finished(), "admitted while the running work progressed");
        }
        let stalled_at = Instant::now();
        let second = waiting.await.unwrap();
        let waited = stalled_at.elapsed();
        assert!(waited >= Duration::from_millis(800) && waited < Duration::from_secs(5), "admitted {waited:?} after the last progress");
        assert_eq!((admission.admitted_bytes(), admission.overcommitted()), (150, 1));
        // The limit admits work however much progress there is.
        let started = Instant::now();
        let limited = {
            let admission = Arc::clone(&admission);
            tokio::spawn(async move { admission.admit(50, None, Patience { stalled: Duration::from_secs(1), limit: Duration::from_secs(2) }).await })
        };
        while !limited.is_finished() && started.elapsed() < Duration::from_secs(10) {
            tokio::time::sleep(Duration::from_millis(100)).await;
            admission.progressed();
        }
        let waited = started.elapsed();
        assert!(waited >= Duration::from_secs(2) && waited < Duration::from_secs(5), "admitted after {waited:?}, its limit 2 s");
        drop((running, second, limited.await.unwrap()));
    }

    /// Work that asks to hold memory from the pool waits until the pool grants it, and holds it
    /// until it ends.
    #[tokio::test]
    async fn work_holding_pool_memory_waits_for_the_pool() {
        use datafusion::execution::memory_pool::{GreedyMemoryPool, MemoryConsumer, MemoryPool};
        let pool: Arc<dyn MemoryPool> = Arc::new(GreedyMemoryPool::new(1000));
        let hold = |bytes| Some(PoolHold { reservation: MemoryConsumer::new("scans").register(&pool), bytes });
        let admission = MemoryAdmission::new(1_000_000);
        let forever = patient(Duration::from_secs(3600));
        let first = admission.admit(1, hold(700), forever).await;
        assert_eq!(pool.reserved(), 700);
        // An operator of the admitted work takes more of the pool.
        let operator = MemoryConsumer::new("join").register(&pool);
        operator.try_grow(200).unwrap();
        let waiting = {
            let admission = Arc::clone(&admission);
            let hold = hold(300);
            tokio::spawn(async move { admission.admit(1, hold, forever).await })
        };
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!waiting.is_finished(), "admitted though the pool has 100 of the 300 bytes it asks for");
        // The operator gives its memory back without telling admission: the pool is asked again.
        drop(operator);
        let second = tokio::time::timeout(Duration::from_secs(5), waiting).await.expect("admitted once the pool has room").unwrap();
        assert_eq!(pool.reserved(), 1000);
        drop(first);
        assert_eq!(pool.reserved(), 300, "each admission holds its own until it ends");
        drop(second);
        assert_eq!(pool.reserved(), 0);
        // Alone, work runs with what the pool has.
        let operator = MemoryConsumer::new("join").register(&pool);
        operator.try_grow(900).unwrap();
        let alone = admission.admit(1, hold(500), forever).await;
        assert!(pool.reserved() <= 1000 && pool.reserved() > 900, "the part of 500 that fits: {}", pool.reserved());
        drop((alone, operator));
    }
}
