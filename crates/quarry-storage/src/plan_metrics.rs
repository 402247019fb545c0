//! Reading an executed plan's metrics: what each operator took in and gave out. The node reports
//! its operators with these, and the host's accounting uses the same for its own.

use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::metrics::{MetricValue, MetricsSet};

/// One operator's input and output, from its metrics (0 where it records none).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OperatorIo {
    /// Rows its children produced.
    pub rows_in: u64,
    /// Rows it produced.
    pub rows_out: u64,
    /// Bytes of the batches it produced.
    pub bytes_out: u64,
    /// CPU time it reports, nanoseconds.
    pub elapsed_ns: u64,
}

/// `plan`'s own input and output.
pub fn operator_io(plan: &dyn ExecutionPlan) -> OperatorIo {
    let rows = |p: &dyn ExecutionPlan| p.metrics().and_then(|m| m.output_rows()).unwrap_or(0) as u64;
    let metrics = plan.metrics();
    OperatorIo {
        rows_in: plan.children().iter().map(|c| rows(c.as_ref())).sum(),
        rows_out: rows(plan),
        bytes_out: metrics.as_ref().map_or(0, output_bytes),
        elapsed_ns: metrics.as_ref().and_then(|m| m.elapsed_compute()).unwrap_or(0) as u64,
    }
}

fn output_bytes(metrics: &MetricsSet) -> u64 {
    metrics.sum(|m| matches!(m.value(), MetricValue::OutputBytes(_))).map_or(0, |v| v.as_usize() as u64)
}

/// A metric summed over all operators of an executed plan; `metric` reads it from one
/// operator's metrics (e.g. the `bytes_scanned` of Parquet scans, or spilled bytes).
pub fn plan_metric_sum(plan: &dyn ExecutionPlan, metric: &dyn Fn(&MetricsSet) -> Option<usize>) -> u64 {
    let own = plan.metrics().and_then(|m| metric(&m)).unwrap_or(0) as u64;
    own + plan.children().iter().map(|c| plan_metric_sum(c.as_ref(), metric)).sum::<u64>()
}
