//! A query's stop signal: set when its client cancels it or goes away.
//!
//! Aborting a query's task stops it only where the task next yields, and only after the
//! runtime polls the aborted task again; operators that compute long between yields (a
//! nested-loop join, `probe_yield.rs`) read this flag from the task context's session config
//! and end the query with an error instead.

use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::Notify;

#[derive(Debug, Default)]
pub struct QueryStop {
    stopped: AtomicBool,
    waiters: Notify,
}

impl QueryStop {
    /// Stops the query: operators that check see it from now on, and [`Self::wait`] returns.
    pub fn stop(&self) {
        self.stopped.store(true, Ordering::Release);
        self.waiters.notify_waiters();
    }

    pub fn is_stopped(&self) -> bool {
        self.stopped.load(Ordering::Acquire)
    }

    /// Returns once the query is stopped.
    pub async fn wait(&self) {
        loop {
            // Created before the check: a stop between the two still wakes it.
            let notified = self.waiters.notified();
            if self.is_stopped() {
                return;
            }
            notified.await;
        }
    }
}
