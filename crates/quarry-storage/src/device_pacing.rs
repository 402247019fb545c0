//! A device profile's compute on a node: a fragment's work runs on the device's threads, and
//! each step of it is paid for `compute_slowdown` times (a pause after it) and counted as
//! device CPU.
//!
//! A step is one poll of a stream, measured on the thread that ran it. The fragment's workers
//! poll its output partitions ([`PacedSteps`]). Operators that hand their inputs to tasks of
//! their own (DataFusion's `RepartitionExec`, `CoalescePartitionsExec`,
//! `SortPreservingMergeExec`) run that work where no worker's poll sees it, so each such input is
//! wrapped in a [`PacedExec`] ([`pace_task_inputs`]) whose task polls it the same way. Each poll
//! is measured once: a task's poll runs only its own subtree, down to the next such input.
//! Without the wrapper, a node plan with a repartition under a pushed join ran at this
//! machine's speed: TPC-DS q15 at SF 1 under smartssd-2013 (2 device threads, 12x slowdown),
//! `--pushdown on`: device CPU 0.2 ms, pause 2.4 ms, 77 ms in all; with 1 device thread (no
//! repartition) 39 ms of CPU and a 434 ms pause.
//!
//! Work an operator spawns inside itself (a full sort's per-batch sorts) is still unmeasured.

use std::fmt;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use arrow::array::RecordBatch;
use datafusion::common::internal_err;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::error::Result;
use datafusion::execution::TaskContext;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use datafusion::physical_plan::execution_plan::replace_children_if_necessary;
use datafusion::physical_plan::repartition::RepartitionExec;
use datafusion::physical_plan::sorts::sort_preserving_merge::SortPreservingMergeExec;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties, PlanProperties, SendableRecordBatchStream};
use futures::StreamExt;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::profile::{MIN_WAIT, thread_cpu_ns};

/// Device limits a fragment's work runs under.
#[derive(Clone)]
pub(crate) struct Pacing {
    pub threads: Arc<Semaphore>,
    pub slowdown: f64,
}

/// The longest a worker pauses on a device thread while others wait for one: about a
/// scheduler's time slice (Linux EEVDF's base slice is 3 ms).
const DEVICE_TIME_SLICE: Duration = Duration::from_millis(3);

/// A fragment's device time, over all the tasks that run it.
#[derive(Default)]
pub(crate) struct WorkerTimes {
    pub cpu_ns: AtomicU64,
    pub pause_ns: AtomicU64,
    pub thread_wait_ns: AtomicU64,
}

/// The steps of one stream under a device profile (or, without one, only measured). Each poll
/// that computes holds one of the device's threads (a poll waiting for a read gives it back:
/// the device's flash channels read while its cores compute) and, after it, the stream's task
/// pauses, holding the thread, for the time the slower device CPU would have needed beyond
/// ours, in slices of [`DEVICE_TIME_SLICE`] between which the tasks take turns.
pub(crate) struct PacedSteps {
    pacing: Option<Pacing>,
    times: Arc<WorkerTimes>,
    /// Pause time owed, nanoseconds (negative: overslept). Owed time is paid in precise sleeps
    /// of at least MIN_WAIT, so a step of a few microseconds adds to the next one's pause.
    owed_ns: i64,
}

impl PacedSteps {
    pub fn new(pacing: Option<Pacing>, times: Arc<WorkerTimes>) -> Self {
        PacedSteps { pacing, times, owed_ns: 0 }
    }

    /// The next item of `stream`, computed on a device thread and paid for.
    pub async fn next(&mut self, stream: &mut SendableRecordBatchStream) -> Option<Result<RecordBatch>> {
        let threads = self.pacing.as_ref().map(|p| Arc::clone(&p.threads));
        let polled = DevicePoll { inner: stream.next(), threads, acquiring: None, cpu_ns: 0, thread_wait: Duration::ZERO }.await;
        let (item, cpu_ns, mut permit) = (polled.output, polled.cpu_ns, polled.permit);
        self.times.cpu_ns.fetch_add(cpu_ns, Ordering::Relaxed);
        self.times.thread_wait_ns.fetch_add(polled.thread_wait.as_nanos() as u64, Ordering::Relaxed);
        if let Some(p) = &self.pacing {
            self.owed_ns += (cpu_ns as f64 * (p.slowdown - 1.0)) as i64;
            // The last step pays all that is owed, so the fragment's time includes it.
            while self.owed_ns >= MIN_WAIT.as_nanos() as i64 || (item.is_none() && self.owed_ns > 0) {
                let started = Instant::now();
                crate::precise_sleep::sleep(Duration::from_nanos(self.owed_ns.min(DEVICE_TIME_SLICE.as_nanos() as i64) as u64)).await;
                let slept = started.elapsed().as_nanos() as i64;
                self.owed_ns -= slept;
                self.times.pause_ns.fetch_add(slept as u64, Ordering::Relaxed);
                if self.owed_ns >= MIN_WAIT.as_nanos() as i64 {
                    // The slice is over: the thread goes to the next task waiting for one (the
                    // semaphore queues them in order), as a scheduler ends a time slice, so a
                    // small fragment does not wait for a long pause of another's.
                    drop(permit.take());
                    let asked = Instant::now();
                    permit = Arc::clone(&p.threads).acquire_owned().await.ok();
                    self.times.thread_wait_ns.fetch_add(asked.elapsed().as_nanos() as u64, Ordering::Relaxed);
                }
            }
        }
        drop::<Option<OwnedSemaphorePermit>>(permit);
        item
    }
}

/// `plan` with each input that an operator runs in a task of its own wrapped in a
/// [`PacedExec`].
pub(crate) fn pace_task_inputs(plan: Arc<dyn ExecutionPlan>, pacing: Option<&Pacing>, times: &Arc<WorkerTimes>) -> Result<Arc<dyn ExecutionPlan>> {
    plan.transform_up(|node| {
        let spawns = node.is::<RepartitionExec>()
            || (node.is::<CoalescePartitionsExec>() || node.is::<SortPreservingMergeExec>()) && node.children().iter().any(|c| c.output_partitioning().partition_count() > 1);
        if !spawns {
            return Ok(Transformed::no(node));
        }
        let children =
            node.children().into_iter().map(|child| Arc::new(PacedExec { input: Arc::clone(child), pacing: pacing.cloned(), times: Arc::clone(times) }) as Arc<dyn ExecutionPlan>).collect();
        Ok(Transformed::yes(replace_children_if_necessary(node, children)?))
    })
    .map(|t| t.data)
}

/// Its input, each partition's stream polled as [`PacedSteps`]. No metrics of its own, so the
/// node's per-operator statistics do not list it.
pub(crate) struct PacedExec {
    input: Arc<dyn ExecutionPlan>,
    pacing: Option<Pacing>,
    times: Arc<WorkerTimes>,
}

impl fmt::Debug for PacedExec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PacedExec").finish_non_exhaustive()
    }
}

impl DisplayAs for PacedExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "PacedExec")
    }
}

impl ExecutionPlan for PacedExec {
    fn name(&self) -> &str {
        "PacedExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        self.input.properties()
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn apply_expressions(&self, _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>) -> Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn maintains_input_order(&self) -> Vec<bool> {
        vec![true]
    }

    fn with_new_children(self: Arc<Self>, children: Vec<Arc<dyn ExecutionPlan>>) -> Result<Arc<dyn ExecutionPlan>> {
        match <[_; 1]>::try_from(children) {
            Ok([input]) => Ok(Arc::new(PacedExec { input, pacing: self.pacing.clone(), times: Arc::clone(&self.times) })),
            Err(_) => internal_err!("PacedExec has one input"),
        }
    }

    fn execute(&self, partition: usize, context: Arc<TaskContext>) -> Result<SendableRecordBatchStream> {
        let input = self.input.execute(partition, context)?;
        let schema = input.schema();
        let steps = PacedSteps::new(self.pacing.clone(), Arc::clone(&self.times));
        let stream = futures::stream::unfold((input, steps), |(mut input, mut steps)| async move {
            let item = steps.next(&mut input).await?;
            Some((item, (input, steps)))
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, stream)))
    }
}

type Acquiring = (Instant, Pin<Box<dyn Future<Output = std::result::Result<OwnedSemaphorePermit, tokio::sync::AcquireError>> + Send>>);

/// Polls `inner` holding a permit of `threads` (when given) and measures the CPU time of its
/// polls on the threads that ran them, and the time it waited for a thread (held by this or
/// another fragment's tasks). A poll that returns pending gives the permit back; the permit of
/// the poll that completes is returned with the output, for the pause after it.
struct DevicePoll<F> {
    inner: F,
    threads: Option<Arc<Semaphore>>,
    acquiring: Option<Acquiring>,
    cpu_ns: u64,
    thread_wait: Duration,
}

/// What a [`DevicePoll`] gives: the output, the CPU time it took, the time it waited for a
/// device thread, and the thread it holds.
struct DevicePolled<T> {
    output: T,
    cpu_ns: u64,
    thread_wait: Duration,
    permit: Option<OwnedSemaphorePermit>,
}

impl<F: Future + Unpin> Future for DevicePoll<F> {
    type Output = DevicePolled<F::Output>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        let permit = match &this.threads {
            Some(threads) => {
                let (asked, acquiring) = this.acquiring.get_or_insert_with(|| (Instant::now(), Box::pin(Arc::clone(threads).acquire_owned())));
                match acquiring.as_mut().poll(cx) {
                    Poll::Pending => return Poll::Pending,
                    // The semaphore is never closed; were it, the worker would run unpaced.
                    Poll::Ready(permit) => {
                        this.thread_wait += asked.elapsed();
                        this.acquiring = None;
                        permit.ok()
                    }
                }
            }
            None => None,
        };
        let before = thread_cpu_ns();
        let polled = Pin::new(&mut this.inner).poll(cx);
        this.cpu_ns += thread_cpu_ns().saturating_sub(before);
        // Pending: `permit` drops here, and the device thread is free while the read runs.
        polled.map(|output| DevicePolled { output, cpu_ns: this.cpu_ns, thread_wait: this.thread_wait, permit })
    }
}
