//! Sums, averages and counts over few groups, for [`crate::small_group_aggregate`].
//!
//! DataFusion's `GroupsAccumulator` for `sum` adds each row into its group's slot. With four
//! groups (TPC-H Q01), consecutive rows of one group wait for each other's store to that slot,
//! and `avg` and `count` each walk the rows again beside it: Q01's aggregation took half of its
//! CPU time. [`FewGroupSums`] keeps [`LANES`] interleaved copies of every group's sum (row `i`
//! adds into copy `i % LANES`), so those adds are independent, and folds the copies together
//! only when the partial state is emitted; a batch's rows per group are counted once for all
//! aggregates ([`rows_per_group`]), so a column without NULLs is not counted again. Integer and
//! decimal sums wrap on overflow as DataFusion's do, so the order of the adds does not change the
//! result; the partial states are
//! exactly DataFusion's (same types, NULL for a group that saw no value), so the final aggregate
//! above is DataFusion's own.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, Int64Array, PrimitiveArray, UInt64Array};
use arrow::buffer::NullBuffer;
use arrow::datatypes::{DataType, Decimal128Type, Int64Type, Schema};
use datafusion::common::{Result, internal_err};
use datafusion::physical_expr::aggregate::AggregateFunctionExpr;
use datafusion::physical_expr::expressions::Literal;

/// Interleaved copies of each group's sums and counts.
const LANES: usize = 4;

/// What an aggregate computes, and so what partial state it emits.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    /// `sum` of `Decimal128` values: state `[sum: Decimal128]`.
    SumDecimal,
    /// `sum` of `Int64` values: state `[sum: Int64]`.
    SumInt64,
    /// `avg` of `Decimal128` values: state `[count: UInt64, sum: Decimal128]`.
    AvgDecimal,
    /// `count` of non-NULL values: state `[count: Int64]`.
    Count,
}

/// One aggregate's sums and counts per group (see the module docs).
#[derive(Debug)]
pub struct FewGroupSums {
    kind: Kind,
    /// The partial state's fields' types, as DataFusion declares them.
    state_types: Vec<DataType>,
    /// Whether the argument is a literal that is never NULL (`count(*)`): rows are counted
    /// without evaluating it.
    constant: bool,
    /// `sums[group * LANES + lane]` (empty for `count`).
    sums: Vec<i128>,
    /// Non-NULL values per group and lane.
    counts: Vec<u64>,
}

impl FewGroupSums {
    /// The accumulator for `aggregate` over rows of `input`, if it is one this module computes.
    pub fn for_aggregate(aggregate: &AggregateFunctionExpr, input: &Schema) -> Result<Option<FewGroupSums>> {
        let arguments = aggregate.expressions();
        let [argument] = arguments.as_slice() else { return Ok(None) };
        if aggregate.is_distinct() || aggregate.ignore_nulls() {
            return Ok(None);
        }
        let state_types: Vec<DataType> = aggregate.state_fields()?.iter().map(|f| f.data_type().clone()).collect();
        let argument_type = argument.data_type(input)?;
        let kind = match (aggregate.fun().name(), &argument_type, state_types.as_slice()) {
            ("sum", DataType::Decimal128(_, s), [DataType::Decimal128(_, t)]) if s == t => Kind::SumDecimal,
            ("sum", DataType::Int64, [DataType::Int64]) => Kind::SumInt64,
            ("avg", DataType::Decimal128(_, s), [DataType::UInt64, DataType::Decimal128(_, t)]) if s == t => Kind::AvgDecimal,
            ("count", _, [DataType::Int64]) => Kind::Count,
            _ => return Ok(None),
        };
        let constant = kind == Kind::Count && argument.downcast_ref::<Literal>().is_some_and(|l| !l.value().is_null());
        Ok(Some(FewGroupSums { kind, state_types, constant, sums: Vec::new(), counts: Vec::new() }))
    }

    /// Whether the argument need not be evaluated (its value never changes the result).
    pub fn ignores_argument(&self) -> bool {
        self.constant
    }

    /// The scale of the decimal values this accumulator adds, if it adds decimals: such values
    /// may come as 64-bit unscaled integers ([`Self::update_narrow`]).
    pub fn decimal_scale(&self) -> Option<i8> {
        match (self.kind, self.state_types.last()) {
            (Kind::SumDecimal | Kind::AvgDecimal, Some(DataType::Decimal128(_, scale))) => Some(*scale),
            _ => None,
        }
    }

    /// [`Self::update`] with decimal values given as their unscaled 64-bit integers (at
    /// [`Self::decimal_scale`]), as narrow decimal arithmetic computes them: no `i128` array is
    /// made only to be read back.
    pub fn update_narrow(&mut self, values: &[i64], nulls: Option<&NullBuffer>, group_ids: &[usize], groups: usize, rows: &[u64]) -> Result<()> {
        if self.decimal_scale().is_none() || values.len() != group_ids.len() || rows.len() > groups {
            return internal_err!("FewGroupSums: {} 64-bit values for {} rows of a {:?} aggregate", values.len(), group_ids.len(), self.kind);
        }
        let nulls = nulls.filter(|n| n.null_count() > 0);
        self.count(nulls, group_ids, groups, rows);
        add_values(&mut self.sums, group_ids, values, nulls, i128::from);
        Ok(())
    }

    /// Sizes the slots for `groups` and counts each group's non-NULL values.
    fn count(&mut self, nulls: Option<&NullBuffer>, group_ids: &[usize], groups: usize, rows: &[u64]) {
        self.counts.resize(groups * LANES, 0);
        if self.kind != Kind::Count {
            self.sums.resize(groups * LANES, 0);
        }
        match nulls {
            None => self.counts.iter_mut().step_by(LANES).zip(rows).for_each(|(c, &n)| *c += n),
            Some(nulls) => nulls.valid_indices().for_each(|row| self.counts[group_ids[row] * LANES] += 1),
        }
    }

    /// Adds each row's value (`values`; unused if [`Self::ignores_argument`]) to the group of
    /// `group_ids`, for groups `0..groups`; `rows` has each group's rows in this batch
    /// ([`rows_per_group`]), which are its values' count when none is NULL.
    pub fn update(&mut self, values: Option<&ArrayRef>, group_ids: &[usize], groups: usize, rows: &[u64]) -> Result<()> {
        let values = match values {
            _ if self.constant => {
                self.count(None, group_ids, groups, rows);
                return Ok(());
            }
            Some(values) => values,
            None => return internal_err!("FewGroupSums: no argument values"),
        };
        if values.len() != group_ids.len() || rows.len() > groups {
            return internal_err!("FewGroupSums: {} values for {} rows", values.len(), group_ids.len());
        }
        let nulls = values.logical_nulls();
        let nulls = nulls.as_ref().filter(|n| n.null_count() > 0);
        self.count(nulls, group_ids, groups, rows);
        match self.kind {
            Kind::Count => {}
            Kind::SumDecimal | Kind::AvgDecimal => {
                let Some(values) = values.as_primitive_opt::<Decimal128Type>() else { return internal_err!("FewGroupSums: {} values", values.data_type()) };
                add_values(&mut self.sums, group_ids, values.values(), nulls, |v| v);
            }
            Kind::SumInt64 => {
                let Some(values) = values.as_primitive_opt::<Int64Type>() else { return internal_err!("FewGroupSums: {} values", values.data_type()) };
                add_values(&mut self.sums, group_ids, values.values(), nulls, i128::from);
            }
        }
        Ok(())
    }

    /// The partial state of groups `0..groups`, typed as DataFusion's accumulator's.
    pub fn state(&self, groups: usize) -> Result<Vec<ArrayRef>> {
        let fold = |group: usize| -> (i128, u64) {
            let lanes = group * LANES..(group + 1) * LANES;
            let sum = self.sums.get(lanes.clone()).map_or(0, |s| s.iter().fold(0i128, |a, &b| a.wrapping_add(b)));
            (sum, self.counts.get(lanes).map_or(0, |c| c.iter().sum()))
        };
        let (sums, counts): (Vec<i128>, Vec<u64>) = (0..groups).map(fold).unzip();
        let seen = NullBuffer::from(counts.iter().map(|&c| c > 0).collect::<Vec<bool>>());
        let seen = Some(seen).filter(|n| n.null_count() > 0);
        let decimal_sums = |data_type: &DataType| -> Result<ArrayRef> {
            Ok(Arc::new(PrimitiveArray::<Decimal128Type>::new(sums.clone().into(), seen.clone()).with_data_type(data_type.clone())))
        };
        Ok(match (self.kind, self.state_types.as_slice()) {
            (Kind::SumDecimal, [sum]) => vec![decimal_sums(sum)?],
            // An `Int64` sum wraps, as DataFusion's does: the low 64 bits of the wrapped i128.
            (Kind::SumInt64, [_]) => vec![Arc::new(Int64Array::new(sums.iter().map(|&s| s as i64).collect(), seen.clone()))],
            (Kind::AvgDecimal, [_, sum]) => vec![Arc::new(UInt64Array::new(counts.clone().into(), seen.clone())), decimal_sums(sum)?],
            (Kind::Count, [_]) => vec![Arc::new(Int64Array::from_iter_values(counts.iter().map(|&c| c as i64)))],
            (kind, types) => return internal_err!("FewGroupSums: {kind:?} with state {types:?}"),
        })
    }

    /// Bytes held.
    pub fn size(&self) -> usize {
        self.sums.capacity() * 16 + self.counts.capacity() * 8
    }
}

/// Rows per group of `group_ids` (groups `0..groups`), into `rows`.
pub fn rows_per_group(group_ids: &[usize], groups: usize, rows: &mut Vec<u64>) {
    let mut lanes = vec![0u64; groups * LANES];
    let mut chunks = group_ids.chunks_exact(LANES);
    for ids in &mut chunks {
        for (lane, &g) in ids.iter().enumerate() {
            lanes[g * LANES + lane] += 1;
        }
    }
    for &g in chunks.remainder() {
        lanes[g * LANES] += 1;
    }
    rows.clear();
    rows.extend(lanes.chunks_exact(LANES).map(|l| l.iter().sum::<u64>()));
}

/// Adds each row's value into its group's sum (the non-NULL ones, if `nulls`).
fn add_values<T: Copy>(sums: &mut [i128], group_ids: &[usize], values: &[T], nulls: Option<&NullBuffer>, widen: impl Fn(T) -> i128) {
    match nulls {
        None => {
            let mut ids = group_ids.chunks_exact(LANES);
            let mut chunks = values.chunks_exact(LANES);
            for (ids, values) in (&mut ids).zip(&mut chunks) {
                for lane in 0..LANES {
                    let slot = ids[lane] * LANES + lane;
                    sums[slot] = sums[slot].wrapping_add(widen(values[lane]));
                }
            }
            for (&g, &v) in ids.remainder().iter().zip(chunks.remainder()) {
                sums[g * LANES] = sums[g * LANES].wrapping_add(widen(v));
            }
        }
        Some(nulls) => {
            for row in nulls.valid_indices() {
                let slot = group_ids[row] * LANES;
                sums[slot] = sums[slot].wrapping_add(widen(values[row]));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use arrow::array::{Decimal128Array, Int32Array};
    use arrow::datatypes::Field;
    use datafusion::functions_aggregate::average::avg_udaf;
    use datafusion::functions_aggregate::count::count_udaf;
    use datafusion::functions_aggregate::sum::sum_udaf;
    use datafusion::logical_expr::{AggregateUDF, EmitTo};
    use datafusion::physical_expr::aggregate::AggregateExprBuilder;
    use datafusion::physical_expr::expressions::{Column, lit};
    use datafusion::physical_expr::PhysicalExpr;

    use super::*;

    /// Each aggregate's partial state equals DataFusion's own accumulator's over the same rows:
    /// decimals and integers with NULLs, a group whose values are all NULL, an `Int64` sum that
    /// wraps, a `count(*)` whose argument is not evaluated, batches that add groups.
    #[test]
    fn states_equal_datafusions() {
        let schema = Schema::new(vec![
            Field::new("price", DataType::Decimal128(15, 2), true),
            Field::new("big", DataType::Int64, true),
            Field::new("small", DataType::Int32, false),
        ]);
        let column = |name: &str| -> Arc<dyn PhysicalExpr> { Arc::new(Column::new_with_schema(name, &schema).unwrap()) };
        let aggregates: Vec<(Arc<AggregateUDF>, Arc<dyn PhysicalExpr>)> = vec![
            (sum_udaf(), column("price")),
            (avg_udaf(), column("price")),
            (sum_udaf(), column("big")),
            (count_udaf(), column("big")),
            (count_udaf(), lit(1i64)),
        ];
        for (function, argument) in aggregates {
            let aggregate = AggregateExprBuilder::new(Arc::clone(&function), vec![Arc::clone(&argument)]).schema(Arc::new(schema.clone())).alias("a").build().unwrap();
            let mut ours = FewGroupSums::for_aggregate(&aggregate, &schema).unwrap().unwrap_or_else(|| panic!("{} is computed here", aggregate.name()));
            assert_eq!(ours.ignores_argument(), function.name() == "count" && argument.downcast_ref::<Literal>().is_some());
            let mut theirs = aggregate.create_groups_accumulator().unwrap();
            let mut groups = 0;
            for batch in 0..3usize {
                let rows = 1000 + batch * 7;
                groups = 3 + 2 * batch;
                // Group 2 sees only NULLs of `price` and `big`.
                let ids: Vec<usize> = (0..rows).map(|i| (i * 7 + i / 3 + batch) % groups).collect();
                let price = Decimal128Array::from_iter((0..rows).map(|i| (ids[i] != 2 && i % 11 != 0).then_some(i as i128 * 1234 - 50_000))).with_precision_and_scale(15, 2).unwrap();
                let big = arrow::array::Int64Array::from_iter((0..rows).map(|i| (ids[i] != 2 && i % 13 != 0).then_some(i64::MAX / 3 + i as i64)));
                let small = Int32Array::from_iter_values((0..rows).map(|i| i as i32));
                let input = arrow::record_batch::RecordBatch::try_new(Arc::new(schema.clone()), vec![Arc::new(price), Arc::new(big), Arc::new(small)]).unwrap();
                let values = argument.evaluate(&input).unwrap().into_array(rows).unwrap();
                let mut per_group = Vec::new();
                rows_per_group(&ids, groups, &mut per_group);
                ours.update((!ours.ignores_argument()).then_some(&values), &ids, groups, &per_group).unwrap();
                theirs.update_batch(&[values], &ids, None, groups).unwrap();
            }
            let (ours, theirs) = (ours.state(groups).unwrap(), theirs.state(EmitTo::All).unwrap());
            assert_eq!(ours.len(), theirs.len(), "{}", aggregate.name());
            for (o, t) in ours.iter().zip(&theirs) {
                assert_eq!(o.as_ref(), t.as_ref(), "{}({argument})", aggregate.name());
            }
        }
    }
}
