//! A star join's dimension, built where its rows are: [`StarDimensionExec`] numbers the
//! dimension's groups and encodes its keys with their group codes compactly (`key_codes`), so
//! a node that holds the dimension sends the host bits and codes instead of rows (SSB q4.1's
//! 320K part keys: 100 KB instead of 874 KB of compressed `Int32`s). On the host it runs the
//! same way over the dimension's rows; [`assemble`] turns its output back into the keys, codes
//! and group values a [`super::KeyLookup`] is built from.
//!
//! Each partition's output is a *piece*: one row per group the partition's rows hold, each row
//! naming its piece and its code, so rows may arrive split into batches and interleaved with
//! other pieces'. The row of code 0 also holds the piece's keys and codes. Pieces number their
//! groups on their own; [`assemble`] numbers them again over all pieces.

use std::fmt;
use std::hash::BuildHasher;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, BinaryArray, Int64Array, RecordBatch, StringArray, UInt32Array, UInt64Array, new_null_array};
use arrow::compute::concat_batches;
use arrow::datatypes::{DataType, Field, Schema, SchemaRef, UInt32Type, UInt64Type};
use arrow::row::{RowConverter, SortField};
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{HashMap, Result, Statistics, internal_err, plan_err};
use datafusion::execution::TaskContext;
use datafusion::execution::memory_pool::MemoryConsumer;
use datafusion::physical_expr::{EquivalenceProperties, Partitioning, PhysicalExpr};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::metrics::{BaselineMetrics, ExecutionPlanMetricsSet, MetricsSet};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties, PlanProperties, SendableRecordBatchStream, StatisticsArgs, apply_expression_roots};
use futures::StreamExt;

use super::key_codes;
use crate::view_compaction::compact_views;
use super::lookup::{int_values, is_string, supported_key_type};
use super::wire::{WireReader, WireWriter};

/// The output's last three columns: the piece, the row's group code, the piece's keys (in the
/// row of code 0).
const PIECE: &str = "star_piece";
const CODE: &str = "star_code";
const KEYS: &str = "star_keys";

/// How a piece's keys travel.
const INT_KEYS: u8 = 0;
const STRING_KEYS: u8 = 1;
/// A key repeated within the piece: the star join does not apply.
const DUPLICATE_KEY: u8 = 2;

/// Predicted output bytes per dimension row, for placement: the key as at most a byte of
/// bitmap (the keys fill an eighth of their range), and a byte of code where it groups.
const KEY_BYTES: f64 = 1.0;
const CODE_BYTES: f64 = 1.0;

/// See the module docs. One input; grouped expressions and the key over its rows.
#[derive(Debug)]
pub struct StarDimensionExec {
    input: Arc<dyn ExecutionPlan>,
    key: Arc<dyn PhysicalExpr>,
    groups: Vec<Arc<dyn PhysicalExpr>>,
    schema: SchemaRef,
    properties: Arc<PlanProperties>,
    metrics: ExecutionPlanMetricsSet,
}

impl StarDimensionExec {
    pub fn try_new(input: Arc<dyn ExecutionPlan>, key: Arc<dyn PhysicalExpr>, groups: Vec<Arc<dyn PhysicalExpr>>) -> Result<Self> {
        let input_schema = input.schema();
        let key_type = key.data_type(&input_schema)?;
        if !supported_key_type(&key_type) {
            return plan_err!("a star join dimension key of type {key_type}");
        }
        let mut fields = groups.iter().enumerate().map(|(i, g)| Ok(Field::new(format!("star_group_{i}"), g.data_type(&input_schema)?, true))).collect::<Result<Vec<_>>>()?;
        fields.extend([Field::new(PIECE, DataType::UInt64, false), Field::new(CODE, DataType::UInt32, false), Field::new(KEYS, DataType::Binary, true)]);
        let schema = Arc::new(Schema::new(fields));
        let properties = PlanProperties::new(
            EquivalenceProperties::new(Arc::clone(&schema)),
            Partitioning::UnknownPartitioning(input.output_partitioning().partition_count()),
            EmissionType::Final,
            Boundedness::Bounded,
        );
        Ok(StarDimensionExec { input, key, groups, schema, properties: Arc::new(properties), metrics: ExecutionPlanMetricsSet::new() })
    }

    pub fn input(&self) -> &Arc<dyn ExecutionPlan> {
        &self.input
    }

    pub fn key(&self) -> &Arc<dyn PhysicalExpr> {
        &self.key
    }

    pub fn groups(&self) -> &[Arc<dyn PhysicalExpr>] {
        &self.groups
    }

    /// Its output's predicted bytes for `rows` dimension rows (the group values left out: a
    /// dimension has few groups where it has many rows).
    pub fn predicted_bytes(&self, rows: f64) -> f64 {
        rows * (KEY_BYTES + if self.groups.is_empty() { 0.0 } else { CODE_BYTES })
    }

    /// Encodes the expressions, in `encode_expr`'s bytes, for a fragment.
    pub fn encode(&self, encode_expr: &dyn Fn(&Arc<dyn PhysicalExpr>) -> Result<Vec<u8>>) -> Result<Vec<u8>> {
        let mut out = WireWriter::default();
        out.bytes(&encode_expr(&self.key)?);
        out.u64(self.groups.len() as u64);
        for group in &self.groups {
            out.bytes(&encode_expr(group)?);
        }
        Ok(out.finish())
    }

    /// What [`Self::encode`] wrote, over `input`.
    pub fn decode(bytes: &[u8], input: Arc<dyn ExecutionPlan>, decode_expr: &dyn Fn(&[u8]) -> Result<Arc<dyn PhysicalExpr>>) -> Result<Self> {
        let mut reader = WireReader::new(bytes);
        let key = decode_expr(reader.bytes()?)?;
        let count = reader.len_prefix()?;
        let groups = (0..count).map(|_| decode_expr(reader.bytes()?)).collect::<Result<Vec<_>>>()?;
        if !reader.is_done() {
            return plan_err!("fragment: bytes after a star dimension's expressions");
        }
        Self::try_new(input, key, groups)
    }
}

impl DisplayAs for StarDimensionExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        let groups: Vec<String> = self.groups.iter().map(|g| g.to_string()).collect();
        write!(f, "StarDimensionExec: key={}, groups=[{}]", self.key, groups.join(", "))
    }
}

impl ExecutionPlan for StarDimensionExec {
    fn name(&self) -> &str {
        "StarDimensionExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    /// A dimension is small: splitting its rows over more partitions only makes more pieces.
    fn benefits_from_input_partitioning(&self) -> Vec<bool> {
        vec![false]
    }

    fn apply_expressions(&self, f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>) -> Result<TreeNodeRecursion> {
        apply_expression_roots(std::iter::once(&self.key).chain(&self.groups), f)
    }

    fn with_new_children(self: Arc<Self>, mut children: Vec<Arc<dyn ExecutionPlan>>) -> Result<Arc<dyn ExecutionPlan>> {
        if children.len() != 1 {
            return internal_err!("StarDimensionExec has one input");
        }
        Ok(Arc::new(StarDimensionExec::try_new(children.remove(0), Arc::clone(&self.key), self.groups.clone())?))
    }

    fn execute(&self, partition: usize, context: Arc<TaskContext>) -> Result<SendableRecordBatchStream> {
        let mut input = self.input.execute(partition, Arc::clone(&context))?;
        let reservation = MemoryConsumer::new(format!("StarDimensionExec[{partition}]")).register(context.memory_pool());
        let baseline = BaselineMetrics::new(&self.metrics, partition);
        let (key, groups, schema, input_schema) = (Arc::clone(&self.key), self.groups.clone(), Arc::clone(&self.schema), self.input.schema());
        let output = futures::stream::once(async move {
            // The dimension's rows are held until all have come: reserved before they are kept,
            // at the bytes they address (batches sliced from one buffer would count it each).
            let mut batches = Vec::new();
            while let Some(batch) = input.next().await {
                // A join's output points into its inputs' string buffers: TPC-H Q10's customer
                // dimension, joined on a node, concatenated 184 batches' references into 24 GB.
                let batch = compact_views(batch?)?;
                reservation.try_grow(crate::api::batch_wire_bytes(&batch) as usize)?;
                batches.push(batch);
            }
            let _timer = baseline.elapsed_compute().timer();
            let rows = concat_batches(&input_schema, &batches)?;
            drop(batches);
            let piece = build_piece(&rows, &key, &groups, &schema)?;
            baseline.record_output(piece.num_rows());
            Ok(piece)
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

/// A piece of `rows`: its groups numbered, one output row each (one, without values, where
/// there are none), and its keys with their codes in the row of code 0.
fn build_piece(rows: &RecordBatch, key: &Arc<dyn PhysicalExpr>, groups: &[Arc<dyn PhysicalExpr>], schema: &SchemaRef) -> Result<RecordBatch> {
    let n = rows.num_rows();
    let keys = key.evaluate(rows)?.into_array(n)?;
    let grouped: Vec<ArrayRef> = groups.iter().map(|g| g.evaluate(rows).and_then(|v| v.into_array(n))).collect::<Result<_>>()?;
    let (codes, representatives) = number_groups(&grouped, n)?;
    // Codes in use: one group where nothing is grouped.
    let group_count = if grouped.is_empty() { 1 } else { representatives.len() as u32 };
    let mut out = WireWriter::default();
    out.u32(group_count);
    if is_string(keys.data_type()) {
        let strings = arrow::compute::cast(&keys, &DataType::Utf8View)?;
        let strings = strings.as_string_view();
        let present: Vec<usize> = (0..n).filter(|&i| strings.is_valid(i)).collect();
        out.u8(STRING_KEYS);
        out.u64(present.len() as u64);
        for i in present {
            out.bytes(strings.value(i).as_bytes());
            out.u32(codes[i]);
        }
    } else {
        let mut pairs: Vec<(i64, u32)> = int_values(&keys)?.into_iter().zip(&codes).filter_map(|(k, &c)| k.map(|k| (k, c))).collect();
        pairs.sort_unstable_by_key(|&(k, _)| k);
        match pairs.windows(2).find(|w| w[0].0 == w[1].0) {
            Some(w) => {
                out = WireWriter::default();
                out.u32(group_count);
                out.u8(DUPLICATE_KEY);
                out.bytes(w[0].0.to_string().as_bytes());
            }
            None => {
                out.u8(INT_KEYS);
                key_codes::encode(&mut out, &pairs, group_count);
            }
        }
    }
    let rows_out = representatives.len().max(1);
    let mut columns: Vec<ArrayRef> = if representatives.is_empty() {
        grouped.iter().map(|g| new_null_array(g.data_type(), 1)).collect()
    } else {
        let picks = UInt32Array::from(representatives);
        grouped.iter().map(|g| arrow::compute::take(g.as_ref(), &picks, None)).collect::<std::result::Result<_, _>>()?
    };
    let piece = piece_id();
    columns.push(Arc::new(UInt64Array::from(vec![piece; rows_out])));
    columns.push(Arc::new(UInt32Array::from_iter_values(0..rows_out as u32)));
    let payload = out.finish();
    columns.push(Arc::new(BinaryArray::from_iter((0..rows_out).map(|r| (r == 0).then_some(payload.as_slice())))));
    Ok(RecordBatch::try_new(Arc::clone(schema), columns)?)
}

/// A number for a piece that no other piece of the query shares: random (each `RandomState`
/// is seeded afresh), as pieces come from partitions on different nodes.
fn piece_id() -> u64 {
    std::collections::hash_map::RandomState::new().hash_one(0u8)
}

/// A dimension assembled from its pieces.
#[derive(Debug)]
pub enum Assembled {
    /// The keys (NULLs left out) and each key's group code; per grouped expression, its value
    /// for each code (the first code's row where the dimension is empty).
    Rows { keys: ArrayRef, codes: Vec<u32>, values: Vec<ArrayRef>, groups: u32 },
    /// A key that appears twice: the star join does not apply.
    Duplicate(String),
}

/// The dimension whose pieces are `batches` (a [`StarDimensionExec`]'s output, in any order),
/// with `group_exprs` grouped expressions. Pieces come from the wire: each is checked to be
/// whole, its codes within its groups.
pub fn assemble(batches: &[RecordBatch], group_exprs: usize) -> Result<Assembled> {
    let Some(first) = batches.first() else { return plan_err!("a star dimension returned no piece") };
    let all = concat_batches(&first.schema(), batches)?;
    if all.num_columns() != group_exprs + 3 {
        return plan_err!("a star dimension's pieces have {} columns for {group_exprs} grouped expressions", all.num_columns());
    }
    let (pieces, codes, payloads) = (&all.columns()[group_exprs], &all.columns()[group_exprs + 1], &all.columns()[group_exprs + 2]);
    let (Some(pieces), Some(codes), Some(payloads)) = (pieces.as_primitive_opt::<UInt64Type>(), codes.as_primitive_opt::<UInt32Type>(), payloads.as_binary_opt::<i32>()) else {
        return plan_err!("a star dimension's pieces have the wrong types");
    };
    // Per piece (in id order, so the result does not depend on arrival), its rows by code.
    let mut by_piece: std::collections::BTreeMap<u64, Vec<Option<usize>>> = Default::default();
    for row in 0..all.num_rows() {
        let slots = by_piece.entry(pieces.value(row)).or_default();
        let code = codes.value(row) as usize;
        if code >= all.num_rows() {
            return plan_err!("a star dimension piece's code {code} is past its rows");
        }
        if slots.len() <= code {
            slots.resize(code + 1, None);
        }
        if slots[code].replace(row).is_some() {
            return plan_err!("a star dimension piece repeats code {code}");
        }
    }
    // Every piece's keys with its codes; the rows of its groups' values, in code order.
    let mut value_rows: Vec<u32> = Vec::new();
    let mut int_keys: Vec<i64> = Vec::new();
    let mut string_keys: Vec<String> = Vec::new();
    let mut key_codes: Vec<u32> = Vec::new();
    let mut strings = None;
    for slots in by_piece.values() {
        let Some(Some(head)) = slots.first() else { return plan_err!("a star dimension piece without its code 0") };
        if slots.iter().any(Option::is_none) || payloads.is_null(*head) {
            return plan_err!("a star dimension piece arrived incomplete");
        }
        let mut reader = WireReader::new(payloads.value(*head));
        let groups = reader.u32()?;
        if groups as usize > slots.len() || (groups as usize) < slots.len() && !(groups == 0 && slots.len() == 1) {
            return plan_err!("a star dimension piece of {groups} groups in {} rows", slots.len());
        }
        let offset = value_rows.len() as u32;
        value_rows.extend(slots.iter().take(groups as usize).map(|r| r.expect("checked") as u32));
        let kind = reader.u8()?;
        if strings.is_some_and(|s| s != (kind == STRING_KEYS)) {
            return plan_err!("a star dimension's pieces disagree on their keys' type");
        }
        match kind {
            DUPLICATE_KEY => return Ok(Assembled::Duplicate(String::from_utf8_lossy(reader.bytes()?).into_owned())),
            INT_KEYS => {
                for (key, code) in key_codes::decode(&mut reader, groups)? {
                    int_keys.push(key);
                    key_codes.push(offset + code);
                }
            }
            STRING_KEYS => {
                let count = reader.len_prefix()?;
                for _ in 0..count {
                    let key = std::str::from_utf8(reader.bytes()?).map_err(|e| datafusion::error::DataFusionError::Plan(format!("a star dimension's string key is not UTF-8: {e}")))?;
                    let code = reader.u32()?;
                    if code >= groups {
                        return plan_err!("a star dimension code {code} of {groups} groups");
                    }
                    string_keys.push(key.to_string());
                    key_codes.push(offset + code);
                }
            }
            other => return plan_err!("a star dimension piece of unknown kind {other}"),
        }
        strings = Some(kind == STRING_KEYS);
        if !reader.is_done() {
            return plan_err!("bytes after a star dimension piece's keys");
        }
    }
    let keys: ArrayRef = if strings == Some(true) { Arc::new(StringArray::from(string_keys)) } else { Arc::new(Int64Array::from(int_keys)) };
    // A piece that arrived whole, in code order (on the host, always), is its own values: TPC-H
    // Q10's 1.5M customers grouped with their names and addresses are not copied again.
    let in_order = value_rows.len() == all.num_rows() && value_rows.iter().enumerate().all(|(i, &r)| r as usize == i);
    let piece_values: Vec<ArrayRef> = if in_order {
        all.columns()[..group_exprs].to_vec()
    } else {
        let picks = UInt32Array::from(value_rows);
        all.columns()[..group_exprs].iter().map(|c| arrow::compute::take(c.as_ref(), &picks, None)).collect::<std::result::Result<_, _>>()?
    };
    if group_exprs == 0 {
        // Every code is 0 (one group per piece, the pieces' codes offset): one group.
        return Ok(Assembled::Rows { keys, codes: vec![0; key_codes.len()], values: Vec::new(), groups: 1 });
    }
    if by_piece.len() == 1 {
        let groups = piece_values.first().map_or(0, |v| v.len()).max(1) as u32;
        return Ok(Assembled::Rows { keys, codes: key_codes, values: piece_values, groups });
    }
    // The pieces' groups numbered again over all pieces.
    let rows = piece_values.first().map_or(0, |v| v.len());
    let (global, representatives) = number_groups(&piece_values, rows)?;
    let codes = key_codes.iter().map(|&c| global[c as usize]).collect();
    let picks = UInt32Array::from(representatives);
    let values: Vec<ArrayRef> = piece_values.iter().map(|v| arrow::compute::take(v.as_ref(), &picks, None)).collect::<std::result::Result<_, _>>()?;
    let groups = picks.len().max(1) as u32;
    Ok(Assembled::Rows { keys, codes, values, groups })
}

/// Numbers the distinct combinations of `grouped` (each `rows` long) in first-seen order: the
/// code of each row, and the first row of each code.
pub fn number_groups(grouped: &[ArrayRef], rows: usize) -> Result<(Vec<u32>, Vec<u32>)> {
    if grouped.is_empty() {
        return Ok((vec![0u32; rows], vec![0u32]));
    }
    match number_by_determining_column(grouped) {
        Some(numbered) => Ok(numbered),
        None => number_by_rows(grouped),
    }
}

/// Numbering by all the grouped values, encoded as rows.
fn number_by_rows(grouped: &[ArrayRef]) -> Result<(Vec<u32>, Vec<u32>)> {
    let converter = RowConverter::new(grouped.iter().map(|a| SortField::new(a.data_type().clone())).collect())?;
    let converted = converter.convert_columns(grouped)?;
    Ok(number_first_seen(converted.iter()))
}

/// The code of each key, numbering distinct keys in first-seen order, and the first position
/// of each code.
fn number_first_seen<K: std::hash::Hash + Eq>(keys: impl Iterator<Item = K>) -> (Vec<u32>, Vec<u32>) {
    let mut seen: HashMap<K, u32> = HashMap::with_capacity(keys.size_hint().0);
    let mut representatives = Vec::new();
    let codes = keys
        .enumerate()
        .map(|(i, key)| {
            let next = seen.len() as u32;
            *seen.entry(key).or_insert_with(|| {
                representatives.push(i as u32);
                next
            })
        })
        .collect();
    (codes, representatives)
}

/// Numbering by one integer column alone, when its value determines every other grouped
/// column's (a key beside its attributes, as TPC-H Q10 groups by `c_custkey` and the customer's
/// name, address and comment): checked row by row against the first row of the group, so it
/// holds in these rows whatever the schema declares. It spares encoding and hashing long
/// strings, which took a third of Q10's dimension build on one thread. `None` where no integer
/// column without NULLs determines the others.
fn number_by_determining_column(grouped: &[ArrayRef]) -> Option<(Vec<u32>, Vec<u32>)> {
    use arrow::datatypes::{Int32Type, Int64Type};
    let candidate = grouped.iter().position(|a| matches!(a.data_type(), DataType::Int32 | DataType::Int64) && a.null_count() == 0)?;
    let column = &grouped[candidate];
    let (codes, representatives) = match column.data_type() {
        DataType::Int32 => number_first_seen(column.as_primitive::<Int32Type>().values().iter()),
        _ => number_first_seen(column.as_primitive::<Int64Type>().values().iter()),
    };
    for other in grouped.iter().enumerate().filter_map(|(c, other)| (c != candidate).then_some(other)) {
        // Equal as grouping sees it: NULL equals NULL, floats by their total order. A type
        // arrow cannot compare is left to the row encoding.
        let compare = arrow::array::make_comparator(other.as_ref(), other.as_ref(), arrow::compute::SortOptions::default()).ok()?;
        if codes.iter().enumerate().any(|(row, code)| compare(row, representatives[*code as usize] as usize).is_ne()) {
            return None;
        }
    }
    Some((codes, representatives))
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Float64Array, Int32Array};
    use datafusion::physical_plan::expressions::Column;
    use datafusion::datasource::memory::MemorySourceConfig;

    fn columns(ids: Vec<Option<i64>>, names: Vec<Option<&str>>) -> Vec<ArrayRef> {
        vec![Arc::new(Int64Array::from(ids)), Arc::new(StringArray::from(names))]
    }

    /// Where the integer column determines the others, it alone numbers the groups, and the
    /// numbering is the one the encoded rows give; where it does not (one key with two names,
    /// a NULL key), the rows number them.
    #[test]
    fn a_determining_integer_column_numbers_the_groups_alone() {
        let determined = [
            columns(vec![Some(7), Some(3), Some(7), Some(9), Some(3)], vec![Some("a"), Some("b"), Some("a"), None, Some("b")]),
            columns(vec![Some(1), Some(1)], vec![None, None]),
            vec![Arc::new(Int32Array::from(vec![5, 6, 5])) as ArrayRef, Arc::new(Float64Array::from(vec![f64::NAN, 0.5, f64::NAN]))],
        ];
        for grouped in &determined {
            let rows = grouped[0].len();
            let by_column = number_by_determining_column(grouped);
            assert!(by_column.is_some(), "{grouped:?}");
            assert_eq!(by_column.unwrap(), number_by_rows(grouped).unwrap(), "{grouped:?}");
            assert_eq!(number_groups(grouped, rows).unwrap(), number_by_rows(grouped).unwrap());
        }
        let not_determined = [
            columns(vec![Some(7), Some(3), Some(7)], vec![Some("a"), Some("b"), Some("z")]),
            columns(vec![Some(1), Some(1)], vec![None, Some("a")]),
            columns(vec![Some(1), None, Some(1)], vec![Some("a"), Some("b"), Some("a")]),
            vec![Arc::new(Float64Array::from(vec![0.0, -0.0])) as ArrayRef, Arc::new(StringArray::from(vec!["a", "a"]))],
        ];
        for grouped in &not_determined {
            let rows = grouped[0].len();
            assert!(number_by_determining_column(grouped).is_none(), "{grouped:?}");
            assert_eq!(number_groups(grouped, rows).unwrap(), number_by_rows(grouped).unwrap());
        }
        let (codes, representatives) = number_groups(&not_determined[0], 3).unwrap();
        assert_eq!((codes, representatives), (vec![0, 1, 2], vec![0, 1, 2]), "7/a and 7/z are two groups");
    }

    /// A dimension of (key, name) rows over `partitions`, grouped by name.
    fn dimension(partitions: Vec<Vec<(Option<i32>, &str)>>) -> StarDimensionExec {
        let schema = Arc::new(Schema::new(vec![Field::new("k", DataType::Int32, true), Field::new("name", DataType::Utf8, false)]));
        let batches = partitions
            .into_iter()
            .map(|rows| {
                let (keys, names): (Vec<Option<i32>>, Vec<&str>) = rows.into_iter().unzip();
                vec![RecordBatch::try_new(Arc::clone(&schema), vec![Arc::new(Int32Array::from(keys)), Arc::new(StringArray::from(names))]).unwrap()]
            })
            .collect::<Vec<_>>();
        let input = MemorySourceConfig::try_new_exec(&batches, Arc::clone(&schema), None).unwrap();
        StarDimensionExec::try_new(input, Arc::new(Column::new("k", 0)), vec![Arc::new(Column::new("name", 1))]).unwrap()
    }

    /// Each partition's pieces, interleaved and split into one-row batches as a wire may
    /// deliver them.
    async fn pieces(dimension: &StarDimensionExec) -> Vec<RecordBatch> {
        let mut batches = Vec::new();
        for p in (0..dimension.properties().output_partitioning().partition_count()).rev() {
            let out = datafusion::physical_plan::common::collect(dimension.execute(p, Arc::new(TaskContext::default())).unwrap()).await.unwrap();
            batches.extend(out.iter().flat_map(|b| (0..b.num_rows()).rev().map(|r| b.slice(r, 1))));
        }
        batches
    }

    fn name_of(assembled: &Assembled, key: i64) -> Option<String> {
        let Assembled::Rows { keys, codes, values, .. } = assembled else { panic!("{assembled:?}") };
        let keys = keys.as_primitive::<arrow::datatypes::Int64Type>();
        let at = (0..keys.len()).find(|&i| keys.value(i) == key)?;
        Some(values[0].as_string::<i32>().value(codes[at] as usize).to_string())
    }

    /// Pieces from several partitions, arriving split and out of order, assemble into one
    /// numbering of the groups; NULL keys join nothing; a key repeated within a piece or across
    /// pieces is found.
    #[tokio::test]
    async fn pieces_assemble_whatever_order_they_arrive_in() {
        let spread = dimension(vec![vec![(Some(10), "x"), (Some(12), "y"), (None, "z")], vec![], vec![(Some(500_000), "y"), (Some(11), "w")]]);
        let assembled = assemble(&pieces(&spread).await, 1).unwrap();
        let Assembled::Rows { keys, groups, .. } = &assembled else { panic!("{assembled:?}") };
        assert_eq!((keys.len(), *groups), (4, 4), "x, y, w and z's group, met in its piece");
        for (key, name) in [(10, "x"), (12, "y"), (500_000, "y"), (11, "w")] {
            assert_eq!(name_of(&assembled, key).as_deref(), Some(name), "key {key}");
        }
        let Assembled::Rows { codes, .. } = &assembled else { unreachable!() };
        let keys = keys.as_primitive::<arrow::datatypes::Int64Type>();
        let code = |k: i64| codes[(0..keys.len()).find(|&i| keys.value(i) == k).unwrap()];
        assert_eq!(code(12), code(500_000), "one group for y across pieces");

        let within = dimension(vec![vec![(Some(3), "a"), (Some(3), "b")]]);
        assert!(matches!(assemble(&pieces(&within).await, 1).unwrap(), Assembled::Duplicate(k) if k == "3"));
        // Across pieces the keys are listed, and building the lookup finds the repeat.
        let across = dimension(vec![vec![(Some(3), "a")], vec![(Some(3), "b")]]);
        let Assembled::Rows { keys, codes, .. } = assemble(&pieces(&across).await, 1).unwrap() else { panic!() };
        assert!(matches!(super::super::KeyLookup::build(&keys, &codes).unwrap(), super::super::Built::Duplicate(k) if k == "3"));
    }

    #[tokio::test]
    async fn damaged_pieces_are_rejected() {
        let whole = pieces(&dimension(vec![vec![(Some(1), "a"), (Some(2), "b")]])).await;
        assert!(assemble(&whole, 1).is_ok());
        // A row lost, a row repeated, the keys' row lost.
        let (code0, code1) = (whole.iter().find(|b| !b.column(3).is_null(0)).unwrap(), whole.iter().find(|b| b.column(3).is_null(0)).unwrap());
        for damaged in [vec![code0.clone()], vec![code0.clone(), code1.clone(), code1.clone()], vec![code1.clone()]] {
            assert!(assemble(&damaged, 1).is_err(), "{damaged:?}");
        }
        assert!(assemble(&whole, 2).is_err(), "the wrong number of grouped expressions");
    }
}
