//! The star join: a fact table probed through all of its (small) dimension tables at once,
//! aggregated by dimension attributes, with no intermediate results between the joins
//! (HippogriffDB's query-over-block, Li 2018 ch. 2; Crystal's star join, Shanbhag et al. 2020).
//!
//! The host builds each filtered dimension into a [`KeyLookup`] from foreign key to *group code*
//! (the dimension row's combination of the grouped attributes, numbered densely), and a fact
//! row's group id is the mixed-radix number of its dimensions' codes. [`StarProbeExec`] then
//! runs the fact side: each row is looked up in the dimensions (the most selective first, only
//! rows still alive in the next), and rows that find every partner add their aggregate inputs
//! to their group's states ([`GroupedStates`]). Each partition returns one partial result;
//! the host merges them and turns group ids back into attribute values.
//!
//! `StarProbeExec` runs over any input batches (on the host, or on a node over a Parquet scan);
//! on a node whose segments it can read page by page it is replaced by [`StarScanExec`], which
//! decodes a column only for the rows still alive and evaluates lookups once per dictionary
//! entry. The tables are filled in at run time, once the host has built them, and travel
//! inside the fragment ([`encode_probe`], [`decode_probe`]).

mod accumulate;
mod dimension;
mod key_codes;
mod lookup;
mod scan;
mod wire;

use std::fmt;
use std::sync::{Arc, OnceLock};

use arrow::array::{RecordBatch, UInt32Array};
use arrow::datatypes::{DataType, SchemaRef};
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{DataFusionError, Result, ScalarValue, Statistics, internal_err, plan_err};
use datafusion::execution::TaskContext;
use datafusion::logical_expr::Operator;
use datafusion::physical_expr::{EquivalenceProperties, Partitioning, PhysicalExpr, conjunction_opt};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::expressions::{BinaryExpr, Column, Literal};
use datafusion::physical_plan::metrics::{BaselineMetrics, Count, ExecutionPlanMetricsSet, MetricBuilder, MetricsSet};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties, PlanProperties, SendableRecordBatchStream, StatisticsArgs, apply_expression_roots};
use futures::StreamExt;

pub use accumulate::{AggFunc, Domain, GroupedStates, partial_schema};
pub use dimension::{Assembled, StarDimensionExec, assemble};
pub use lookup::{Built, KeyBounds, KeyLookup, supported_key_type};
use lookup::int_key_range;
pub use scan::StarScanExec;
use wire::{WireReader, WireWriter};

use crate::page_reader::NO_CODE;

/// Group domains (the product of the dimensions' group counts) at most; beyond, group ids would
/// not fit the state tables' `u64`s with room to spare.
pub const MAX_GROUP_DOMAIN: u64 = 1 << 48;

/// One aggregate of the fact rows.
#[derive(Debug, Clone)]
pub struct StarAggregate {
    pub func: AggFunc,
    /// Its input over the probe's input (`None` for `count(*)`).
    pub arg: Option<Arc<dyn PhysicalExpr>>,
    pub domain: Domain,
}

/// A dimension as the fact side sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct StarDimension {
    pub lookup: KeyLookup,
    /// Group codes it produces (1 if it contributes no grouped attribute).
    pub groups: u32,
}

/// The dimensions, built by the host, and the order to probe them in.
#[derive(Debug, Clone, PartialEq)]
pub struct StarTables {
    /// In the order of [`StarProbeExec`]'s keys.
    pub dims: Vec<StarDimension>,
    /// Indices into `dims`, the most selective first.
    pub order: Vec<usize>,
}

impl StarTables {
    /// The number of group ids (the product of the group counts).
    pub fn domain(&self) -> u64 {
        self.dims.iter().map(|d| d.groups as u64).product()
    }

    /// Per dimension, the multiplier of its code in a group id.
    pub fn strides(&self) -> Vec<u64> {
        let mut stride = 1u64;
        self.dims
            .iter()
            .map(|d| {
                let s = stride;
                stride = stride.saturating_mul(d.groups as u64);
                s
            })
            .collect()
    }

    fn encode(&self, out: &mut WireWriter) {
        out.u64(self.dims.len() as u64);
        for dim in &self.dims {
            out.u32(dim.groups);
            dim.lookup.encode(out, dim.groups);
        }
        out.u32s(&self.order.iter().map(|&o| o as u32).collect::<Vec<_>>());
    }

    fn decode(input: &mut WireReader) -> Result<Self> {
        let count = input.len_prefix()?;
        let mut dims = Vec::with_capacity(count);
        for _ in 0..count {
            let groups = input.u32()?;
            if groups == 0 {
                return plan_err!("fragment: a dimension with no groups");
            }
            dims.push(StarDimension { lookup: KeyLookup::decode(input, groups)?, groups });
        }
        let order: Vec<usize> = input.u32s()?.into_iter().map(|o| o as usize).collect();
        let mut sorted = order.clone();
        sorted.sort_unstable();
        if sorted != (0..dims.len()).collect::<Vec<_>>() {
            return plan_err!("fragment: the probe order is not an order of the dimensions");
        }
        let tables = StarTables { dims, order };
        if tables.dims.iter().try_fold(1u64, |acc, d| acc.checked_mul(d.groups as u64)).is_none_or(|d| d > MAX_GROUP_DOMAIN) {
            return plan_err!("fragment: the star join's group domain is too large");
        }
        Ok(tables)
    }
}

/// The tables of a star join, filled in once the host has built them.
pub type TablesCell = Arc<OnceLock<Arc<StarTables>>>;

/// What a star probe computes: fixed when the plan is made.
#[derive(Debug, Clone)]
pub struct StarSpec {
    /// Per dimension, the input column holding its foreign key.
    pub keys: Vec<usize>,
    pub aggregates: Vec<StarAggregate>,
}

/// The fact side of a star join (see the module docs): partial aggregates per group id.
#[derive(Debug)]
pub struct StarProbeExec {
    input: Arc<dyn ExecutionPlan>,
    spec: Arc<StarSpec>,
    tables: TablesCell,
    schema: SchemaRef,
    properties: Arc<PlanProperties>,
    metrics: ExecutionPlanMetricsSet,
}

impl StarProbeExec {
    /// A probe of `input` by `spec`, whose tables will be set in `tables`.
    pub fn try_new(input: Arc<dyn ExecutionPlan>, spec: Arc<StarSpec>, tables: TablesCell) -> Result<Self> {
        let input_schema = input.schema();
        for &key in &spec.keys {
            match input_schema.fields().get(key) {
                Some(field) if supported_key_type(field.data_type()) => {}
                Some(field) => return plan_err!("a star join key of type {}", field.data_type()),
                None => return plan_err!("fragment: star join key column {key} of a {}-column input", input_schema.fields().len()),
            }
        }
        for aggregate in &spec.aggregates {
            let input_type = aggregate.arg.as_ref().map(|a| a.data_type(&input_schema)).transpose()?;
            if Domain::of(aggregate.func, input_type.as_ref()) != Some(aggregate.domain) {
                return plan_err!("fragment: star aggregate {:?} over {input_type:?} is not {:?}", aggregate.func, aggregate.domain);
            }
        }
        let schema = partial_schema(&spec.aggregates.iter().map(|a| (a.func, a.domain)).collect::<Vec<_>>());
        let properties = PlanProperties::new(
            EquivalenceProperties::new(Arc::clone(&schema)),
            Partitioning::UnknownPartitioning(input.output_partitioning().partition_count()),
            EmissionType::Final,
            Boundedness::Bounded,
        );
        Ok(StarProbeExec { input, spec, tables, schema, properties: Arc::new(properties), metrics: ExecutionPlanMetricsSet::new() })
    }

    pub fn spec(&self) -> &Arc<StarSpec> {
        &self.spec
    }

    pub fn input(&self) -> &Arc<dyn ExecutionPlan> {
        &self.input
    }

    /// The tables, once built.
    pub fn tables(&self) -> Option<&Arc<StarTables>> {
        self.tables.get()
    }

    /// The cell the host fills.
    pub fn tables_cell(&self) -> &TablesCell {
        &self.tables
    }

    /// A predicate every fact row that joins satisfies: each integer key within the range of the
    /// keys its dimension kept (`false` if one kept none). A node prunes segments and row groups
    /// by it, so a fact table stored in the order of a dimension's key (a date) is read only over
    /// the range the dimension's filter keeps. `None` before the tables are built, or where no
    /// key is bounded.
    pub fn key_bounds_predicate(&self) -> Result<Option<Arc<dyn PhysicalExpr>>> {
        let Some(tables) = self.tables() else { return Ok(None) };
        let schema = self.input.schema();
        let mut conjuncts: Vec<Arc<dyn PhysicalExpr>> = Vec::new();
        for (&key, dimension) in self.spec.keys.iter().zip(&tables.dims) {
            let field = schema.field(key);
            let Some((type_min, type_max)) = int_key_range(field.data_type()) else { continue };
            let (lo, hi) = match dimension.lookup.bounds() {
                KeyBounds::Any => continue,
                KeyBounds::Empty => return Ok(Some(lit(ScalarValue::Boolean(Some(false))))),
                KeyBounds::Within(lo, hi) if hi < type_min || lo > type_max => return Ok(Some(lit(ScalarValue::Boolean(Some(false))))),
                KeyBounds::Within(lo, hi) => (lo.max(type_min), hi.min(type_max)),
            };
            let column: Arc<dyn PhysicalExpr> = Arc::new(Column::new(field.name(), key));
            let bound = |value: i64| lit(int_scalar(field.data_type(), value));
            conjuncts.push(Arc::new(BinaryExpr::new(Arc::clone(&column), Operator::GtEq, bound(lo))));
            conjuncts.push(Arc::new(BinaryExpr::new(column, Operator::LtEq, bound(hi))));
        }
        Ok(conjunction_opt(conjuncts))
    }
}

/// `value`, within [`int_key_range`] of `data_type`, as a scalar of that type.
fn int_scalar(data_type: &DataType, value: i64) -> ScalarValue {
    match data_type {
        DataType::Int8 => ScalarValue::Int8(Some(value as i8)),
        DataType::Int16 => ScalarValue::Int16(Some(value as i16)),
        DataType::Int32 => ScalarValue::Int32(Some(value as i32)),
        DataType::Date32 => ScalarValue::Date32(Some(value as i32)),
        DataType::UInt8 => ScalarValue::UInt8(Some(value as u8)),
        DataType::UInt16 => ScalarValue::UInt16(Some(value as u16)),
        DataType::UInt32 => ScalarValue::UInt32(Some(value as u32)),
        _ => ScalarValue::Int64(Some(value)),
    }
}

fn lit(value: ScalarValue) -> Arc<dyn PhysicalExpr> {
    Arc::new(Literal::new(value))
}

impl DisplayAs for StarProbeExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        let input = self.input.schema();
        let keys: Vec<&str> = self.spec.keys.iter().map(|&k| input.field(k).name().as_str()).collect();
        let aggregates: Vec<String> = self.spec.aggregates.iter().map(|a| format!("{:?}({})", a.func, a.arg.as_ref().map_or("*".into(), |e| e.to_string()))).collect();
        write!(f, "StarProbeExec: keys=[{}], aggregates=[{}]", keys.join(", "), aggregates.join(", "))?;
        match self.tables.get() {
            Some(tables) => {
                let sizes: Vec<String> = tables.dims.iter().map(|d| format!("{} {} keys/{} groups", d.lookup.len(), d.lookup.kind(), d.groups)).collect();
                write!(f, ", dimensions=[{}], probe order={:?}", sizes.join(", "), tables.order)
            }
            None => write!(f, ", dimensions built at run time"),
        }
    }
}

impl ExecutionPlan for StarProbeExec {
    fn name(&self) -> &str {
        "StarProbeExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn apply_expressions(&self, f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>) -> Result<TreeNodeRecursion> {
        apply_expression_roots(self.spec.aggregates.iter().filter_map(|a| a.arg.as_ref()), f)
    }

    fn with_new_children(self: Arc<Self>, mut children: Vec<Arc<dyn ExecutionPlan>>) -> Result<Arc<dyn ExecutionPlan>> {
        if children.len() != 1 {
            return internal_err!("StarProbeExec has one input");
        }
        Ok(Arc::new(StarProbeExec::try_new(children.remove(0), Arc::clone(&self.spec), Arc::clone(&self.tables))?))
    }

    fn execute(&self, partition: usize, context: Arc<TaskContext>) -> Result<SendableRecordBatchStream> {
        let tables = self.tables.get().cloned().ok_or_else(|| DataFusionError::Internal("StarProbeExec ran before its dimensions were built".into()))?;
        let input = self.input.execute(partition, context)?;
        let probe = Probe::new(Arc::clone(&self.spec), tables, &self.metrics, partition);
        let schema = Arc::clone(&self.schema);
        let output = futures::stream::once(async move {
            let mut probe = probe;
            let mut input = input;
            while let Some(batch) = input.next().await {
                probe.add_batch(&batch?)?;
            }
            probe.finish(&schema)
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

/// The probe of one partition: its group states and counters.
struct Probe {
    spec: Arc<StarSpec>,
    tables: Arc<StarTables>,
    strides: Vec<u64>,
    states: GroupedStates,
    baseline: BaselineMetrics,
    rows_probed: Count,
    rows_matched: Count,
}

impl Probe {
    fn new(spec: Arc<StarSpec>, tables: Arc<StarTables>, metrics: &ExecutionPlanMetricsSet, partition: usize) -> Self {
        let funcs = spec.aggregates.iter().map(|a| (a.func, a.domain)).collect();
        let states = GroupedStates::new(funcs, tables.domain());
        Probe {
            strides: tables.strides(),
            states,
            spec,
            tables,
            baseline: BaselineMetrics::new(metrics, partition),
            rows_probed: MetricBuilder::new(metrics).counter("rows_probed", partition),
            rows_matched: MetricBuilder::new(metrics).counter("rows_matched", partition),
        }
    }

    /// Probes a batch of the input and aggregates the rows that find every dimension.
    fn add_batch(&mut self, batch: &RecordBatch) -> Result<()> {
        let _timer = self.baseline.elapsed_compute().timer();
        self.rows_probed.add(batch.num_rows());
        let mut rows: Vec<u32> = (0..batch.num_rows() as u32).collect();
        let mut gids = vec![0u64; rows.len()];
        for &d in &self.tables.order {
            let (mut kept, mut codes) = (Vec::with_capacity(rows.len()), Vec::with_capacity(rows.len()));
            self.tables.dims[d].lookup.codes_of(batch.column(self.spec.keys[d]), &rows, &mut kept, &mut codes)?;
            let mut next = Vec::with_capacity(kept.len());
            narrow(&rows, &gids, &kept, &codes, self.strides[d], &mut next);
            gids = next;
            rows = kept;
            if rows.is_empty() {
                return Ok(());
            }
        }
        self.rows_matched.add(rows.len());
        let taken = arrow::compute::take_record_batch(batch, &UInt32Array::from(rows))?;
        let args = evaluate_args(&self.spec, &taken)?;
        self.states.update(&gids, &args)
    }

    fn finish(self, schema: &SchemaRef) -> Result<RecordBatch> {
        let _timer = self.baseline.elapsed_compute().timer();
        let partial = self.states.partial(schema)?;
        self.baseline.record_output(partial.num_rows());
        Ok(partial)
    }
}

/// Appends to `out` the group ids of the rows `kept` (a subsequence of `rows`, whose ids are
/// `gids`), each with its new dimension's `codes` added at `stride`.
fn narrow(rows: &[u32], gids: &[u64], kept: &[u32], codes: &[u32], stride: u64, out: &mut Vec<u64>) {
    debug_assert!(codes.iter().all(|&c| c != NO_CODE));
    let mut i = 0usize;
    for (&row, &code) in kept.iter().zip(codes) {
        while rows[i] != row {
            i += 1;
        }
        out.push(gids[i] + code as u64 * stride);
    }
}

/// The aggregates' inputs over the matched rows.
fn evaluate_args(spec: &StarSpec, matched: &RecordBatch) -> Result<Vec<Option<arrow::array::ArrayRef>>> {
    spec.aggregates.iter().map(|a| a.arg.as_ref().map(|e| e.evaluate(matched).and_then(|v| v.into_array(matched.num_rows()))).transpose()).collect()
}

/// The bytes of a probe's spec and tables in a fragment: its keys, aggregates (each argument a
/// DataFusion expression in `encode_expr`'s bytes) and tables. Tables not yet built are an
/// error, unless `planning` (checking that the plan can be shipped): they are then encoded
/// empty.
pub fn encode_probe(probe: &StarProbeExec, planning: bool, encode_expr: &dyn Fn(&Arc<dyn PhysicalExpr>) -> Result<Vec<u8>>) -> Result<Vec<u8>> {
    let placeholder;
    let tables = match probe.tables.get() {
        Some(tables) => tables,
        None if planning => {
            let input = probe.input.schema();
            let empty = |key: usize| {
                let strings = matches!(input.field(key).data_type(), DataType::Utf8 | DataType::Utf8View | DataType::LargeUtf8);
                let lookup = if strings { KeyLookup::Strings(Default::default()) } else { KeyLookup::Ints(Default::default()) };
                StarDimension { lookup, groups: 1 }
            };
            placeholder = Arc::new(StarTables { dims: probe.spec.keys.iter().map(|&k| empty(k)).collect(), order: (0..probe.spec.keys.len()).collect() });
            &placeholder
        }
        None => return Err(DataFusionError::Internal("a star probe was shipped before its dimensions were built".into())),
    };
    let mut out = WireWriter::default();
    out.u32s(&probe.spec.keys.iter().map(|&k| k as u32).collect::<Vec<_>>());
    out.u64(probe.spec.aggregates.len() as u64);
    for aggregate in &probe.spec.aggregates {
        out.u8(aggregate.func.code());
        match aggregate.domain {
            Domain::Exact(scale) => {
                out.u8(0);
                out.u8(scale as u8);
            }
            Domain::Float => out.u8(1),
            Domain::Count => out.u8(2),
        }
        match &aggregate.arg {
            Some(arg) => {
                out.u8(1);
                out.bytes(&encode_expr(arg)?);
            }
            None => out.u8(0),
        }
    }
    tables.encode(&mut out);
    Ok(out.finish())
}

/// A probe decoded from a fragment over `input`; `decode_expr` parses an argument's bytes
/// against the input's schema. Everything is checked: keys, types, codes, the probe order.
pub fn decode_probe(bytes: &[u8], input: Arc<dyn ExecutionPlan>, decode_expr: &dyn Fn(&[u8]) -> Result<Arc<dyn PhysicalExpr>>) -> Result<StarProbeExec> {
    let mut reader = WireReader::new(bytes);
    let keys: Vec<usize> = reader.u32s()?.into_iter().map(|k| k as usize).collect();
    let count = reader.len_prefix()?;
    let mut aggregates = Vec::with_capacity(count);
    for _ in 0..count {
        let func = AggFunc::from_code(reader.u8()?)?;
        let domain = match reader.u8()? {
            0 => Domain::Exact(reader.u8()? as i8),
            1 => Domain::Float,
            2 => Domain::Count,
            other => return plan_err!("fragment: unknown aggregate domain {other}"),
        };
        let arg = match reader.u8()? {
            0 => None,
            1 => Some(decode_expr(reader.bytes()?)?),
            other => return plan_err!("fragment: unknown aggregate argument marker {other}"),
        };
        aggregates.push(StarAggregate { func, arg, domain });
    }
    let tables = StarTables::decode(&mut reader)?;
    if !reader.is_done() {
        return plan_err!("fragment: bytes after the star join tables");
    }
    if tables.dims.len() != keys.len() {
        return plan_err!("fragment: {} star join keys for {} dimensions", keys.len(), tables.dims.len());
    }
    let input_schema = input.schema();
    for (dim, &key) in tables.dims.iter().zip(&keys) {
        let Some(field) = input_schema.fields().get(key) else { return plan_err!("fragment: star join key column {key} does not exist") };
        let strings = matches!(field.data_type(), DataType::Utf8 | DataType::Utf8View | DataType::LargeUtf8);
        if strings != dim.lookup.is_strings() {
            return plan_err!("fragment: star join key '{}' of type {} with a lookup of the other kind", field.name(), field.data_type());
        }
    }
    let cell: TablesCell = Arc::new(OnceLock::new());
    cell.set(Arc::new(tables)).expect("a new cell");
    StarProbeExec::try_new(input, Arc::new(StarSpec { keys, aggregates }), cell)
}

#[cfg(test)]
mod tests {
    use arrow::array::{ArrayRef, AsArray, Date32Array, Int8Array, Int64Array, StringArray};
    use arrow::datatypes::{Field, Schema};
    use datafusion::physical_plan::empty::EmptyExec;

    use super::*;

    fn dimension(keys: ArrayRef) -> StarDimension {
        let codes: Vec<u32> = (0..keys.len() as u32).collect();
        match KeyLookup::build(&keys, &codes).unwrap() {
            Built::Unique(lookup) => StarDimension { lookup, groups: 1 },
            Built::Duplicate(key) => panic!("duplicate {key}"),
        }
    }

    fn probe_of(fields: Vec<Field>, dims: Vec<StarDimension>) -> StarProbeExec {
        let input = Arc::new(EmptyExec::new(Arc::new(Schema::new(fields))));
        let cell: TablesCell = Arc::new(OnceLock::new());
        let order = (0..dims.len()).collect();
        let keys = (0..dims.len()).collect();
        cell.set(Arc::new(StarTables { dims, order })).expect("a new cell");
        StarProbeExec::try_new(input, Arc::new(StarSpec { keys, aggregates: Vec::new() }), cell).unwrap()
    }

    /// Each integer key is bounded by its dimension's keys, in the key column's own type; string
    /// keys are not; a dimension whose keys the column's type cannot hold bounds it to nothing.
    #[test]
    fn key_bounds_hold_the_rows_that_can_join() {
        let dates = dimension(Arc::new(Date32Array::from(vec![19_002, 19_000])));
        let names = dimension(Arc::new(StringArray::from(vec!["a"])));
        let probe = probe_of(vec![Field::new("d", DataType::Date32, true), Field::new("s", DataType::Utf8, false)], vec![dates, names]);
        let predicate = probe.key_bounds_predicate().unwrap().expect("the date is bounded");
        let batch = RecordBatch::try_new(
            probe.input().schema(),
            vec![Arc::new(Date32Array::from(vec![Some(18_999), Some(19_000), Some(19_002), Some(19_003), None])), Arc::new(StringArray::from(vec!["a"; 5]))],
        )
        .unwrap();
        let kept = predicate.evaluate(&batch).unwrap().into_array(5).unwrap();
        assert_eq!(kept.as_boolean().iter().collect::<Vec<_>>(), vec![Some(false), Some(true), Some(true), Some(false), None]);

        let wide = dimension(Arc::new(Int64Array::from(vec![1_000, 2_000])));
        let narrow = probe_of(vec![Field::new("k", DataType::Int8, false)], vec![wide]);
        let nothing = narrow.key_bounds_predicate().unwrap().expect("bounded");
        let batch = RecordBatch::try_new(narrow.input().schema(), vec![Arc::new(Int8Array::from(vec![i8::MAX]))]).unwrap();
        assert!(!nothing.evaluate(&batch).unwrap().into_array(1).unwrap().as_boolean().value(0), "no key of the column joins");

        let only_strings = probe_of(vec![Field::new("s", DataType::Utf8, false)], vec![dimension(Arc::new(StringArray::from(vec!["a"])))]);
        assert!(only_strings.key_bounds_predicate().unwrap().is_none());
    }
}
