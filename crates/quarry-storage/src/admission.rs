//! Admission by weighted memory demand (Hetero-DB, Zhang et al. 2015, sec. 3.2, eq. (2)).
//!
//! A fragment or graph job asks to run with its *weighted demand*: the memory its operators
//! take, each weighted by its share of the run's time, m = Σ tᵢ·mᵢ / Σ tᵢ. An operator that
//! holds much memory briefly counts for little; one that holds it throughout counts fully. Work
//! is admitted while the demands of everything admitted fit in the device's memory; the rest
//! waits and is reconsidered whenever admitted work finishes. Work whose demand alone exceeds
//! the device is admitted when nothing else runs, so it cannot starve (its operators spill or
//! wait for the pool as they go). Waiting is bounded: the host may be waiting for a fragment
//! that is itself waiting (a merge that needs every partition's first rows while the admitted
//! ones are blocked on it), so past its patience work is admitted anyway: the memory pool,
//! which every operator reserves from, still bounds what it takes.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;

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
}

#[derive(Debug, Default)]
struct Admitted {
    bytes: u64,
    count: usize,
}

/// An admission: its demand counts against the device until it is dropped.
#[derive(Debug)]
pub struct Admission {
    controller: Arc<MemoryAdmission>,
    demand: u64,
}

impl MemoryAdmission {
    /// A controller over `capacity` bytes.
    pub fn new(capacity: u64) -> Arc<Self> {
        Arc::new(MemoryAdmission { capacity, admitted: Mutex::default(), released: Notify::new() })
    }

    /// Waits until `demand` fits beside the admitted work (or nothing else is admitted), for at
    /// most `patience`; then admits it anyway.
    pub async fn admit(self: &Arc<Self>, demand: u64, patience: Duration) -> Admission {
        let deadline = tokio::time::Instant::now() + patience;
        loop {
            // Registered before checking, so a release between the check and the wait wakes it.
            let released = self.released.notified();
            if let Some(admission) = self.try_admit(demand) {
                return admission;
            }
            if tokio::time::timeout_at(deadline, released).await.is_err() {
                return self.admit_now(demand);
            }
        }
    }

    /// Admits `demand` now if it fits.
    pub fn try_admit(self: &Arc<Self>, demand: u64) -> Option<Admission> {
        let fits = {
            let admitted = self.admitted.lock().expect("admission lock");
            admitted.count == 0 || admitted.bytes.saturating_add(demand) <= self.capacity
        };
        fits.then(|| self.admit_now(demand))
    }

    /// Admits `demand` whether it fits or not.
    fn admit_now(self: &Arc<Self>, demand: u64) -> Admission {
        let mut admitted = self.admitted.lock().expect("admission lock");
        admitted.bytes += demand;
        admitted.count += 1;
        Admission { controller: Arc::clone(self), demand }
    }

    /// The summed demand of the admitted work.
    pub fn admitted_bytes(&self) -> u64 {
        self.admitted.lock().expect("admission lock").bytes
    }
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

    #[tokio::test]
    async fn work_waits_until_its_demand_fits_and_oversized_work_runs_alone() {
        let admission = MemoryAdmission::new(100);
        let forever = Duration::from_secs(3600);
        let first = admission.admit(60, forever).await;
        assert!(admission.try_admit(50).is_none(), "60 + 50 > 100");
        let small = admission.admit(40, forever).await;
        assert_eq!(admission.admitted_bytes(), 100);
        let waiting = {
            let admission = Arc::clone(&admission);
            tokio::spawn(async move { admission.admit(50, forever).await })
        };
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        drop(first);
        let third = waiting.await.unwrap();
        assert_eq!(admission.admitted_bytes(), 90);
        drop((small, third));
        // Larger than the device: admitted once nothing else runs.
        let other = admission.admit(10, forever).await;
        assert!(admission.try_admit(500).is_none());
        drop(other);
        let huge = admission.admit(500, forever).await;
        assert_eq!(admission.admitted_bytes(), 500);
        // Past its patience, work is admitted even though it does not fit.
        let impatient = admission.admit(10, Duration::from_millis(20)).await;
        assert_eq!(admission.admitted_bytes(), 510);
        drop((huge, impatient));
        assert_eq!(admission.admitted_bytes(), 0);
    }
}
