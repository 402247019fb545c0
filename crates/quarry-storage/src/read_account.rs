//! What a fragment's reads of segment files cost: how many requests, how many of their bytes
//! the device had to deliver (the rest were in the page cache), and how long the fragment
//! waited for them. The store records each read into the account of the task that made it (a
//! task-local the node sets around a fragment's binding and its workers), so fragments running
//! at once keep their reads apart; a read outside any fragment (a passthrough read, a scrub)
//! counts in no account.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

tokio::task_local! {
    static ACCOUNT: Arc<ReadAccount>;
}

/// One fragment's reads.
#[derive(Debug, Default)]
pub struct ReadAccount {
    requests: AtomicU64,
    device_bytes: AtomicU64,
    wait_ns: AtomicU64,
}

impl ReadAccount {
    /// Runs `work` with its reads (and those of the futures it awaits, not of tasks it spawns)
    /// counted in `account`.
    pub async fn scope<F: Future>(account: Arc<ReadAccount>, work: F) -> F::Output {
        ACCOUNT.scope(account, work).await
    }

    /// The calling task's account, if it has one.
    pub fn current() -> Option<Arc<ReadAccount>> {
        ACCOUNT.try_with(Arc::clone).ok()
    }

    /// Counts, in the account of the calling task if it has one, `requests` reads of which
    /// `device_bytes` were not in the page cache, that took `waited`.
    pub fn record(requests: u64, device_bytes: u64, waited: Duration) {
        let _ = ACCOUNT.try_with(|account| account.add(requests, device_bytes, waited));
    }

    /// Counts `requests` reads of which `device_bytes` were not in the page cache, that took
    /// `waited`.
    pub fn add(&self, requests: u64, device_bytes: u64, waited: Duration) {
        self.requests.fetch_add(requests, Ordering::Relaxed);
        self.device_bytes.fetch_add(device_bytes, Ordering::Relaxed);
        self.wait_ns.fetch_add(waited.as_nanos() as u64, Ordering::Relaxed);
    }

    /// Read requests so far.
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

    /// Bytes the device delivered so far (reads whose pages the page cache did not hold).
    pub fn device_bytes(&self) -> u64 {
        self.device_bytes.load(Ordering::Relaxed)
    }

    /// Time spent waiting for reads so far, nanoseconds (summed over the reads in flight).
    pub fn wait_ns(&self) -> u64 {
        self.wait_ns.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reads count in the account of the task that made them, and nowhere outside one.
    #[tokio::test]
    async fn reads_count_in_their_tasks_account() {
        let (a, b) = (Arc::new(ReadAccount::default()), Arc::new(ReadAccount::default()));
        ReadAccount::scope(Arc::clone(&a), async { ReadAccount::record(2, 100, Duration::from_nanos(7)) }).await;
        ReadAccount::scope(Arc::clone(&b), async { ReadAccount::record(1, 0, Duration::from_nanos(3)) }).await;
        ReadAccount::record(5, 5, Duration::from_nanos(5));
        assert_eq!((a.requests(), a.device_bytes(), a.wait_ns()), (2, 100, 7));
        assert_eq!((b.requests(), b.device_bytes(), b.wait_ns()), (1, 0, 3));
    }
}
