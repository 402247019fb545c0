//! How far a running query has got: the stored bytes its fragments have read, of those they
//! plan to read. Nodes report their fragments' reads as they go ([`FragmentProgress`]); a
//! partition that ends counts as done even where its node pruned what it planned to read.

use std::sync::Arc;

use datafusion::physical_plan::ExecutionPlan;
use quarry_storage::FragmentProgress;

use crate::scan::FragmentExec;
use crate::star_exec::StarAggregateExec;

/// The progress of one query's plan, readable while it runs.
#[derive(Debug, Clone, Default)]
pub struct QueryProgress {
    /// Each partition of each fragment: its progress and the bytes it plans to read.
    partitions: Vec<(FragmentProgress, u64)>,
}

impl QueryProgress {
    /// The progress of `plan`'s fragments (a star join's fallback aside: it runs only when the
    /// star join cannot). A fragment reached twice (a shared subplan) counts once.
    pub fn of(plan: &Arc<dyn ExecutionPlan>) -> Self {
        let mut progress = QueryProgress::default();
        progress.collect(plan);
        progress
    }

    fn collect(&mut self, plan: &Arc<dyn ExecutionPlan>) {
        if let Some(fragment) = plan.downcast_ref::<FragmentExec>() {
            for (partition, planned) in fragment.progress() {
                if !self.partitions.iter().any(|(seen, _)| seen.same(&partition)) {
                    self.partitions.push((partition, planned));
                }
            }
            return;
        }
        let fallback = plan.downcast_ref::<StarAggregateExec>().map(|star| Arc::clone(star.fallback()));
        for child in plan.children() {
            if !fallback.as_ref().is_some_and(|f| Arc::ptr_eq(f, child)) {
                self.collect(child);
            }
        }
    }

    /// The stored bytes the query plans to read.
    pub fn total_bytes(&self) -> u64 {
        self.partitions.iter().map(|(_, planned)| planned).sum()
    }

    /// The stored bytes read so far, at most [`Self::total_bytes`].
    pub fn bytes_read(&self) -> u64 {
        self.partitions.iter().map(|(progress, planned)| progress.bytes_read().min(*planned)).sum()
    }
}
