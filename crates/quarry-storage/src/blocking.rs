//! Blocking file work (spill files, segment writes and their fsyncs, commits, aborts) runs on
//! tokio's blocking threads, never on the async workers that serve other requests or on the
//! device's worker threads.

use datafusion::error::{DataFusionError, Result};

/// Runs `work` on a blocking thread; `what` names it if the thread itself fails (a panic).
pub async fn blocking<T: Send + 'static>(what: &str, work: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(work).await.map_err(|e| DataFusionError::Execution(format!("{what} failed: {e}")))?
}
