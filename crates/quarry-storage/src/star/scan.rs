//! The star join's fact side over Parquet segments read page by page (see the module docs of
//! `star` and `page_reader`): each row group's steps (dimension lookups and the fact predicate's
//! simple comparisons) run one column at a time, each over the rows still alive, in the order of
//! their measured pass rates; the other columns are decoded only for the rows that pass all.

use std::fmt;
use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{Result, Statistics, internal_err};
use datafusion::execution::TaskContext;
use datafusion::physical_expr::utils::reassign_expr_columns;
use datafusion::physical_expr::{EquivalenceProperties, Partitioning, PhysicalExpr};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::metrics::{BaselineMetrics, Count, ExecutionPlanMetricsSet, MetricBuilder, MetricsSet};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties, SendableRecordBatchStream, StatisticsArgs};
use futures::{StreamExt, stream};

use super::lookup::IntCodeVisitor;
use super::{GroupedStates, StarSpec, StarTables, evaluate_args, narrow, partial_schema};
use crate::page_reader::{ColumnChunk, ValueKind};
use crate::verified_store::VerifiedStore;
use crate::page_select::{Comparison, PagedSegment, Residual, SplitPredicate, Step, gather, group_rows, read_order, split_segments, used_columns};

/// [`super::StarProbeExec`] over a filter over a scan of Parquet segments, run page by page.
#[derive(Debug)]
pub struct StarScanExec {
    partitions: Vec<Vec<PagedSegment>>,
    /// The scanned columns (the probe's input).
    columns: SchemaRef,
    predicate: Option<Arc<dyn PhysicalExpr>>,
    spec: Arc<StarSpec>,
    tables: Arc<StarTables>,
    store: Arc<VerifiedStore>,
    schema: SchemaRef,
    properties: Arc<PlanProperties>,
    metrics: ExecutionPlanMetricsSet,
}

impl StarScanExec {
    /// The probe `spec` (with `tables`) of the rows of `segments` (spread over `partitions`)
    /// whose `predicate` holds, over `columns`.
    pub fn try_new(
        segments: Vec<PagedSegment>,
        partitions: usize,
        columns: SchemaRef,
        predicate: Option<Arc<dyn PhysicalExpr>>,
        spec: Arc<StarSpec>,
        tables: Arc<StarTables>,
        store: Arc<VerifiedStore>,
    ) -> Result<Self> {
        let split = split_segments(segments, partitions);
        let partitions = split.len();
        let schema = partial_schema(&spec.aggregates.iter().map(|a| (a.func, a.domain)).collect::<Vec<_>>());
        let properties = PlanProperties::new(EquivalenceProperties::new(Arc::clone(&schema)), Partitioning::UnknownPartitioning(partitions), EmissionType::Final, Boundedness::Bounded);
        Ok(StarScanExec { partitions: split, columns, predicate, spec, tables, store, schema, properties: Arc::new(properties), metrics: ExecutionPlanMetricsSet::new() })
    }
}

impl DisplayAs for StarScanExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        let segments: usize = self.partitions.iter().map(Vec::len).sum();
        let keys: Vec<&str> = self.spec.keys.iter().map(|&k| self.columns.field(k).name().as_str()).collect();
        write!(f, "StarScanExec: keys=[{}], segments={segments}", keys.join(", "))?;
        if let Some(predicate) = &self.predicate {
            write!(f, ", predicate={predicate}")?;
        }
        Ok(())
    }
}

impl ExecutionPlan for StarScanExec {
    fn name(&self) -> &str {
        "StarScanExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![]
    }

    fn apply_expressions(&self, f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>) -> Result<TreeNodeRecursion> {
        let mut roots: Vec<&Arc<dyn PhysicalExpr>> = self.predicate.iter().collect();
        roots.extend(self.spec.aggregates.iter().filter_map(|a| a.arg.as_ref()));
        datafusion::physical_plan::apply_expression_roots(roots, f)
    }

    fn with_new_children(self: Arc<Self>, children: Vec<Arc<dyn ExecutionPlan>>) -> Result<Arc<dyn ExecutionPlan>> {
        if !children.is_empty() {
            return internal_err!("StarScanExec has no children");
        }
        Ok(self)
    }

    fn execute(&self, partition: usize, _context: Arc<TaskContext>) -> Result<SendableRecordBatchStream> {
        let Some(segments) = self.partitions.get(partition) else {
            return internal_err!("StarScanExec has {} partitions, asked for {partition}", self.partitions.len());
        };
        let mut job = Job::try_new(self, partition)?;
        let groups: Vec<(PagedSegment, usize)> = segments.iter().flat_map(|s| s.row_groups.iter().map(move |&g| (s.clone(), g))).collect();
        let schema = Arc::clone(&self.schema);
        let output = stream::once(async move {
            for (i, (segment, group)) in groups.iter().enumerate() {
                if let Some((next, next_group)) = groups.get(i + 1) {
                    next.read_ahead(&job.store, *next_group, &job.columns);
                }
                job.row_group(segment, *group).await?;
            }
            let _timer = job.baseline.elapsed_compute().timer();
            let partial = job.states.partial(&schema)?;
            job.baseline.record_output(partial.num_rows());
            Ok(partial)
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(Arc::clone(&self.schema), output)))
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }

    fn statistics_from_inputs(&self, _input_stats: &[Arc<Statistics>], _args: &StatisticsArgs) -> Result<Arc<Statistics>> {
        Ok(Arc::new(Statistics::new_unknown(&self.schema)))
    }
}

/// What a step of a row group's probe tests: a dimension's lookup or a comparison.
#[derive(Debug)]
enum Test {
    /// Dimension `d`'s lookup: the code goes into the group id.
    Dimension(usize),
    Compare(Comparison),
}

/// Buffers a partition reuses from one row group to the next.
#[derive(Default)]
struct Scratch {
    alive: Vec<u32>,
    gids: Vec<u64>,
    kept: Vec<u32>,
    codes: Vec<u32>,
    gids_next: Vec<u64>,
}

/// What a partition needs, and its states.
struct Job {
    scratch: Scratch,
    columns: SchemaRef,
    steps: Vec<Step<Test>>,
    /// The rest of the predicate, evaluated over the survivors' values.
    residual: Option<Residual>,
    /// The columns the aggregates read, their schema, and the aggregates' arguments over a
    /// batch of just those.
    arg_columns: Vec<usize>,
    arg_schema: SchemaRef,
    args: StarSpec,
    tables: Arc<StarTables>,
    strides: Vec<u64>,
    states: GroupedStates,
    store: Arc<VerifiedStore>,
    baseline: BaselineMetrics,
    bytes_scanned: Count,
    rows_probed: Count,
    rows_matched: Count,
}

impl Job {
    fn try_new(exec: &StarScanExec, partition: usize) -> Result<Self> {
        let split = SplitPredicate::new(exec.predicate.as_ref(), &exec.columns)?;
        let dimensions = exec.tables.order.iter().map(|&d| Step::new(exec.spec.keys[d], Test::Dimension(d)));
        let steps = dimensions.chain(split.comparisons.into_iter().map(|(column, c)| Step::new(column, Test::Compare(c)))).collect();
        let residual = split.residual;
        let arg_exprs: Vec<Arc<dyn PhysicalExpr>> = exec.spec.aggregates.iter().filter_map(|a| a.arg.clone()).collect();
        let (arg_columns, arg_schema) = used_columns(&arg_exprs, &exec.columns)?;
        let aggregates = exec
            .spec
            .aggregates
            .iter()
            .map(|a| Ok(super::StarAggregate { arg: a.arg.clone().map(|e| reassign_expr_columns(e, &arg_schema)).transpose()?, ..a.clone() }))
            .collect::<Result<Vec<_>>>()?;
        let funcs = aggregates.iter().map(|a| (a.func, a.domain)).collect();
        Ok(Job {
            scratch: Scratch::default(),
            columns: Arc::clone(&exec.columns),
            steps,
            residual,
            arg_columns,
            arg_schema,
            args: StarSpec { keys: Vec::new(), aggregates },
            strides: exec.tables.strides(),
            states: GroupedStates::new(funcs, exec.tables.domain()),
            tables: Arc::clone(&exec.tables),
            store: Arc::clone(&exec.store),
            baseline: BaselineMetrics::new(&exec.metrics, partition),
            bytes_scanned: MetricBuilder::new(&exec.metrics).counter("bytes_scanned", partition),
            rows_probed: MetricBuilder::new(&exec.metrics).counter("rows_probed", partition),
            rows_matched: MetricBuilder::new(&exec.metrics).counter("rows_matched", partition),
        })
    }

    /// Probes and aggregates row group `group` of `segment`.
    async fn row_group(&mut self, segment: &PagedSegment, group: usize) -> Result<()> {
        let rows = group_rows(segment, group)?;
        if rows == 0 {
            return Ok(());
        }
        self.rows_probed.add(rows);
        let order = read_order(&mut self.steps, self.residual.as_ref(), &self.arg_columns);
        let mut chunks: Vec<Option<ColumnChunk>> = (0..self.columns.fields().len()).map(|_| None).collect();
        let mut reads = segment.read_chunks(&self.store, group, &self.columns, &order);

        // The rows still alive (all of them until the first step ran) and their group ids.
        let mut scratch = std::mem::take(&mut self.scratch);
        let mut narrowed = false;
        let mut step = 0usize;
        while let Some(read) = reads.next().await {
            let (c, bytes) = read?;
            self.bytes_scanned.add(bytes.len());
            let _timer = self.baseline.elapsed_compute().timer();
            // Pages without a row still alive are skipped, not decompressed.
            let wanted = narrowed.then_some(scratch.alive.as_slice());
            chunks[c] = Some(segment.chunk(group, self.columns.field(c).name(), bytes, wanted)?);
            // Run every step whose column is now read, in order.
            while step < self.steps.len() && chunks[self.steps[step].column].is_some() {
                let chunk = chunks[self.steps[step].column].as_ref().expect("read");
                let alive = narrowed.then_some(scratch.alive.as_slice());
                self.run_step(step, chunk, alive, &mut scratch.kept, &mut scratch.codes);
                let s = &mut self.steps[step];
                s.seen += alive.map_or(rows, <[u32]>::len) as u64;
                s.kept += scratch.kept.len() as u64;
                let stride = match s.test {
                    Test::Dimension(d) => self.strides[d],
                    _ => 0,
                };
                scratch.gids_next.clear();
                if narrowed {
                    narrow(&scratch.alive, &scratch.gids, &scratch.kept, &scratch.codes, stride, &mut scratch.gids_next);
                } else {
                    scratch.gids_next.extend(scratch.codes.iter().map(|&code| code as u64 * stride));
                }
                std::mem::swap(&mut scratch.alive, &mut scratch.kept);
                std::mem::swap(&mut scratch.gids, &mut scratch.gids_next);
                narrowed = true;
                step += 1;
                if scratch.alive.is_empty() {
                    self.scratch = scratch;
                    return Ok(());
                }
            }
        }
        drop(reads);
        let _timer = self.baseline.elapsed_compute().timer();
        let (mut alive, mut gids) = if narrowed { (scratch.alive.clone(), scratch.gids.clone()) } else { ((0..rows as u32).collect(), vec![0; rows]) };
        self.scratch = scratch;
        if let Some(residual) = &self.residual {
            let keep = residual.passing(&chunks, &alive)?;
            alive = keep.iter().map(|&i| alive[i]).collect();
            gids = keep.iter().map(|&i| gids[i]).collect();
        }
        if alive.is_empty() {
            return Ok(());
        }
        self.rows_matched.add(alive.len());
        let batch = gather(&chunks, &self.arg_columns, &self.arg_schema, &alive)?;
        let args = evaluate_args(&self.args, &batch)?;
        self.states.update(&gids, &args)
    }

    /// Runs step `step` over `chunk`: the rows (of `alive`, or all) it keeps go to `kept`, and
    /// their codes to `codes`.
    fn run_step(&self, step: usize, chunk: &ColumnChunk, alive: Option<&[u32]>, kept: &mut Vec<u32>, codes: &mut Vec<u32>) {
        kept.clear();
        codes.clear();
        match &self.steps[step].test {
            Test::Dimension(d) => {
                let lookup = &self.tables.dims[*d].lookup;
                if chunk.kind() == ValueKind::Bytes {
                    chunk.keep_bytes(alive, |v| lookup.code_bytes(v), kept, codes);
                } else {
                    lookup.with_int_code(KeepInt { chunk, alive, kept, codes });
                }
            }
            Test::Compare(comparison) => comparison.keep(chunk, alive, kept, codes),
        }
    }
}

/// [`ColumnChunk::keep_int`] through a lookup's code function for its form.
struct KeepInt<'a> {
    chunk: &'a ColumnChunk,
    alive: Option<&'a [u32]>,
    kept: &'a mut Vec<u32>,
    codes: &'a mut Vec<u32>,
}

impl IntCodeVisitor for KeepInt<'_> {
    type Output = ();
    fn visit(self, code: impl Fn(i64) -> u32) {
        self.chunk.keep_int(self.alive, code, self.kept, self.codes)
    }
}
