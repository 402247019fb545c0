//! Aggregation by group id, into dense arrays where the group domain is small (Crystal's
//! aggregation into a directly indexed array), a hash table otherwise.
//!
//! Integers and decimals accumulate exactly in `i128` at their own scale, floats in `f64`. A
//! partial result is a batch of `gid` and one state column per aggregate; merging partial
//! results and finishing them gives the values DataFusion's own aggregates would.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, Decimal128Array, Float64Array, Int64Array, RecordBatch, UInt64Array, new_null_array};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::common::{DataFusionError, HashMap, Result, exec_err, plan_err};

/// Group domains up to this size use dense arrays; larger ones a hash table.
const DENSE_GROUPS_MAX: u64 = 1 << 16;

/// An aggregate function the star join computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd)]
pub enum AggFunc {
    Sum,
    Count,
    Min,
    Max,
}

impl AggFunc {
    /// The function named `name` (DataFusion's names), if the star join computes it.
    pub fn from_name(name: &str) -> Option<Self> {
        Some(match name {
            "sum" => AggFunc::Sum,
            "count" => AggFunc::Count,
            "min" => AggFunc::Min,
            "max" => AggFunc::Max,
            _ => return None,
        })
    }

    pub(super) fn code(self) -> u8 {
        self as u8
    }

    pub(super) fn from_code(code: u8) -> Result<Self> {
        Ok(match code {
            0 => AggFunc::Sum,
            1 => AggFunc::Count,
            2 => AggFunc::Min,
            3 => AggFunc::Max,
            other => return plan_err!("fragment: unknown star aggregate {other}"),
        })
    }
}

/// How an aggregate's input accumulates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Domain {
    /// Integers, dates and decimals: exactly, at this scale.
    Exact(i8),
    /// Floating point.
    Float,
    /// Counting rows or non-NULL values.
    Count,
}

impl Domain {
    /// The domain of `func` over values of `input` (`None` for `count(*)`); `None` if the star
    /// join does not aggregate that type.
    pub fn of(func: AggFunc, input: Option<&DataType>) -> Option<Domain> {
        use DataType::*;
        if func == AggFunc::Count {
            return Some(Domain::Count);
        }
        match input? {
            Int8 | Int16 | Int32 | Int64 | UInt8 | UInt16 | UInt32 => Some(Domain::Exact(0)),
            Date32 if func != AggFunc::Sum => Some(Domain::Exact(0)),
            Decimal128(_, scale) => Some(Domain::Exact(*scale)),
            Float32 | Float64 => Some(Domain::Float),
            _ => None,
        }
    }

    /// The partial state's column type.
    fn state_type(self) -> DataType {
        match self {
            Domain::Exact(scale) => DataType::Decimal128(38, scale),
            Domain::Float => DataType::Float64,
            Domain::Count => DataType::Int64,
        }
    }
}

/// The schema of partial results: `gid` and one state column per aggregate.
pub fn partial_schema(aggregates: &[(AggFunc, Domain)]) -> SchemaRef {
    let mut fields = vec![Field::new("gid", DataType::UInt64, false)];
    for (i, (_, domain)) in aggregates.iter().enumerate() {
        fields.push(Field::new(format!("state{i}"), domain.state_type(), *domain != Domain::Count));
    }
    Arc::new(Schema::new(fields))
}

/// One aggregate's values per group slot.
#[derive(Debug)]
enum States {
    Exact { values: Vec<i128>, present: Vec<bool> },
    Float { values: Vec<f64>, present: Vec<bool> },
    Count(Vec<i64>),
}

/// Where a group's states live.
#[derive(Debug)]
enum Slots {
    /// Slot = gid.
    Dense { seen: Vec<bool> },
    /// Slot by gid, in first-seen order.
    Hashed { slots: HashMap<u64, u32>, gids: Vec<u64> },
}

/// The aggregates of a star join, per group.
#[derive(Debug)]
pub struct GroupedStates {
    funcs: Vec<(AggFunc, Domain)>,
    slots: Slots,
    states: Vec<States>,
}

impl GroupedStates {
    /// States for groups `0..domain`.
    pub fn new(funcs: Vec<(AggFunc, Domain)>, domain: u64) -> Self {
        let dense = domain <= DENSE_GROUPS_MAX;
        let len = if dense { domain as usize } else { 0 };
        let states = funcs
            .iter()
            .map(|(_, domain)| match domain {
                Domain::Exact(_) => States::Exact { values: vec![0; len], present: vec![false; len] },
                Domain::Float => States::Float { values: vec![0.0; len], present: vec![false; len] },
                Domain::Count => States::Count(vec![0; len]),
            })
            .collect();
        let slots = if dense { Slots::Dense { seen: vec![false; len] } } else { Slots::Hashed { slots: HashMap::new(), gids: Vec::new() } };
        GroupedStates { funcs, slots, states }
    }

    /// The slot of `gid`, made if new.
    #[inline]
    fn slot(&mut self, gid: u64) -> usize {
        match &mut self.slots {
            Slots::Dense { seen } => {
                seen[gid as usize] = true;
                gid as usize
            }
            Slots::Hashed { slots, gids } => {
                let next = gids.len() as u32;
                let slot = *slots.entry(gid).or_insert(next);
                if slot == next {
                    gids.push(gid);
                    for states in &mut self.states {
                        match states {
                            States::Exact { values, present } => {
                                values.push(0);
                                present.push(false);
                            }
                            States::Float { values, present } => {
                                values.push(0.0);
                                present.push(false);
                            }
                            States::Count(counts) => counts.push(0),
                        }
                    }
                }
                slot as usize
            }
        }
    }

    /// Adds rows: `gids[i]` is row `i`'s group; `args[a]` aggregate `a`'s input values (`None`
    /// for `count(*)`).
    pub fn update(&mut self, gids: &[u64], args: &[Option<ArrayRef>]) -> Result<()> {
        let slots: Vec<usize> = gids.iter().map(|&g| self.slot(g)).collect();
        for ((state, (func, domain)), arg) in self.states.iter_mut().zip(&self.funcs).zip(args) {
            match (state, arg) {
                (States::Count(counts), None) => slots.iter().for_each(|&s| counts[s] += 1),
                (States::Count(counts), Some(values)) => {
                    for (i, &s) in slots.iter().enumerate() {
                        counts[s] += values.is_valid(i) as i64;
                    }
                }
                (States::Exact { values, present }, Some(input)) => {
                    let exact = exact_values(input, *domain)?;
                    for (i, &s) in slots.iter().enumerate() {
                        if let Some(v) = exact[i] {
                            values[s] = combine_exact(*func, present[s], values[s], v)?;
                            present[s] = true;
                        }
                    }
                }
                (States::Float { values, present }, Some(input)) => {
                    let floats = arrow::compute::cast(input, &DataType::Float64)?;
                    let floats = floats.as_primitive::<arrow::datatypes::Float64Type>();
                    for (i, &s) in slots.iter().enumerate() {
                        if floats.is_valid(i) {
                            values[s] = combine_float(*func, present[s], values[s], floats.value(i));
                            present[s] = true;
                        }
                    }
                }
                (_, None) => return exec_err!("star join: {func:?} needs an argument"),
            }
        }
        Ok(())
    }

    /// Adds a partial result (a batch of [`partial_schema`]).
    pub fn merge(&mut self, partial: &RecordBatch) -> Result<()> {
        if partial.num_columns() != self.funcs.len() + 1 {
            return exec_err!("star join: a partial result with {} columns for {} aggregates", partial.num_columns(), self.funcs.len());
        }
        let gids = partial.column(0).as_primitive_opt::<arrow::datatypes::UInt64Type>().ok_or_else(|| DataFusionError::Execution("star join: partial group ids are not UInt64".into()))?;
        let slots: Vec<usize> = gids.values().iter().map(|&g| self.check_gid(g).map(|g| self.slot(g))).collect::<Result<_>>()?;
        for (a, (state, (func, _))) in self.states.iter_mut().zip(&self.funcs).enumerate() {
            let column = partial.column(a + 1);
            match state {
                States::Count(counts) => {
                    let c = column.as_primitive_opt::<arrow::datatypes::Int64Type>().ok_or_else(|| bad_state(a))?;
                    slots.iter().enumerate().for_each(|(i, &s)| counts[s] += c.value(i));
                }
                States::Exact { values, present } => {
                    let c = column.as_primitive_opt::<arrow::datatypes::Decimal128Type>().ok_or_else(|| bad_state(a))?;
                    for (i, &s) in slots.iter().enumerate() {
                        if c.is_valid(i) {
                            values[s] = combine_exact(*func, present[s], values[s], c.value(i))?;
                            present[s] = true;
                        }
                    }
                }
                States::Float { values, present } => {
                    let c = column.as_primitive_opt::<arrow::datatypes::Float64Type>().ok_or_else(|| bad_state(a))?;
                    for (i, &s) in slots.iter().enumerate() {
                        if c.is_valid(i) {
                            values[s] = combine_float(*func, present[s], values[s], c.value(i));
                            present[s] = true;
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// A gid a partial result may carry: within the dense domain.
    fn check_gid(&self, gid: u64) -> Result<u64> {
        match &self.slots {
            Slots::Dense { seen } if gid as usize >= seen.len() => exec_err!("star join: group {gid} outside its {} groups", seen.len()),
            _ => Ok(gid),
        }
    }

    /// The groups that saw rows: (gid, slot), in gid order for a dense domain.
    pub fn groups(&self) -> Vec<(u64, usize)> {
        match &self.slots {
            Slots::Dense { seen } => seen.iter().enumerate().filter(|(_, s)| **s).map(|(g, _)| (g as u64, g)).collect(),
            Slots::Hashed { gids, .. } => gids.iter().enumerate().map(|(s, &g)| (g, s)).collect(),
        }
    }

    /// The partial result: every group that saw rows.
    pub fn partial(&self, schema: &SchemaRef) -> Result<RecordBatch> {
        let groups = self.groups();
        let mut columns: Vec<ArrayRef> = vec![Arc::new(UInt64Array::from_iter_values(groups.iter().map(|(g, _)| *g)))];
        for (state, (_, domain)) in self.states.iter().zip(&self.funcs) {
            columns.push(match state {
                States::Count(counts) => Arc::new(Int64Array::from_iter_values(groups.iter().map(|&(_, s)| counts[s]))),
                States::Exact { values, present } => Arc::new(
                    Decimal128Array::from_iter(groups.iter().map(|&(_, s)| present[s].then_some(values[s]))).with_data_type(domain.state_type()),
                ),
                States::Float { values, present } => Arc::new(Float64Array::from_iter(groups.iter().map(|&(_, s)| present[s].then_some(values[s])))),
            });
        }
        Ok(RecordBatch::try_new(Arc::clone(schema), columns)?)
    }

    /// Aggregate `a`'s final values for `slots`, as `output` (the type DataFusion's aggregate
    /// returns).
    pub fn finish(&self, a: usize, slots: &[usize], output: &DataType) -> Result<ArrayRef> {
        let overflow = |v: i128| DataFusionError::Execution(format!("star join: aggregate value {v} does not fit {output}"));
        Ok(match &self.states[a] {
            States::Count(counts) => Arc::new(Int64Array::from_iter_values(slots.iter().map(|&s| counts[s]))),
            States::Float { values, present } => {
                let floats: ArrayRef = Arc::new(Float64Array::from_iter(slots.iter().map(|&s| present[s].then_some(values[s]))));
                arrow::compute::cast(&floats, output)?
            }
            States::Exact { values, present } => match output {
                DataType::Decimal128(p, s) => {
                    let array = Decimal128Array::from_iter(slots.iter().map(|&s| present[s].then_some(values[s]))).with_precision_and_scale(*p, *s)?;
                    array.validate_decimal_precision(*p).map_err(|e| DataFusionError::Execution(format!("star join: {e}")))?;
                    Arc::new(array)
                }
                DataType::Float32 | DataType::Float64 => unreachable!("floats accumulate as floats"),
                int_like => {
                    let wide: Vec<Option<i64>> = slots.iter().map(|&s| present[s].then(|| i64::try_from(values[s]).map_err(|_| overflow(values[s]))).transpose()).collect::<Result<_>>()?;
                    let array: ArrayRef = Arc::new(Int64Array::from(wide));
                    if int_like == &DataType::Int64 { array } else { arrow::compute::cast(&array, int_like)? }
                }
            },
        })
    }

    /// A single row of NULL (or zero count) values, for an aggregate without groups over no rows.
    pub fn empty_row(funcs: &[(AggFunc, Domain)], outputs: &[DataType]) -> Vec<ArrayRef> {
        funcs
            .iter()
            .zip(outputs)
            .map(|((func, _), output)| if *func == AggFunc::Count { Arc::new(Int64Array::from(vec![0])) as ArrayRef } else { new_null_array(output, 1) })
            .collect()
    }
}

fn bad_state(a: usize) -> DataFusionError {
    DataFusionError::Execution(format!("star join: partial state {a} has the wrong type"))
}

fn combine_exact(func: AggFunc, present: bool, current: i128, value: i128) -> Result<i128> {
    Ok(match (func, present) {
        (_, false) => value,
        (AggFunc::Sum, true) => current.checked_add(value).ok_or_else(|| DataFusionError::Execution("star join: sum overflows".into()))?,
        (AggFunc::Min, true) => current.min(value),
        (AggFunc::Max, true) => current.max(value),
        (AggFunc::Count, true) => unreachable!("counts are not exact values"),
    })
}

fn combine_float(func: AggFunc, present: bool, current: f64, value: f64) -> f64 {
    match (func, present) {
        (_, false) => value,
        (AggFunc::Sum, true) => current + value,
        (AggFunc::Min, true) => current.min(value),
        (AggFunc::Max, true) => current.max(value),
        (AggFunc::Count, true) => unreachable!("counts are not floats"),
    }
}

/// The values of an integer, date or decimal array as `i128` at the domain's scale.
fn exact_values(input: &ArrayRef, domain: Domain) -> Result<Vec<Option<i128>>> {
    use DataType::*;
    Ok(match (input.data_type(), domain) {
        (Decimal128(_, s), Domain::Exact(scale)) if *s == scale => input.as_primitive::<arrow::datatypes::Decimal128Type>().iter().collect(),
        (Int64, Domain::Exact(0)) => input.as_primitive::<arrow::datatypes::Int64Type>().iter().map(|v| v.map(i128::from)).collect(),
        (Int32, Domain::Exact(0)) => input.as_primitive::<arrow::datatypes::Int32Type>().iter().map(|v| v.map(i128::from)).collect(),
        (Date32, Domain::Exact(0)) => input.as_primitive::<arrow::datatypes::Date32Type>().iter().map(|v| v.map(i128::from)).collect(),
        (Int8 | Int16 | UInt8 | UInt16 | UInt32, Domain::Exact(0)) => {
            let wide = arrow::compute::cast(input, &Int64)?;
            wide.as_primitive::<arrow::datatypes::Int64Type>().iter().map(|v| v.map(i128::from)).collect()
        }
        (other, domain) => return exec_err!("star join: {other} values in a {domain:?} aggregate"),
    })
}

#[cfg(test)]
mod tests {
    use arrow::array::{Decimal128Array, Int32Array};

    use super::*;

    #[test]
    fn partial_results_merge_into_the_same_totals() {
        let funcs = vec![(AggFunc::Sum, Domain::Exact(2)), (AggFunc::Count, Domain::Count), (AggFunc::Min, Domain::Exact(0)), (AggFunc::Max, Domain::Float)];
        let schema = partial_schema(&funcs);
        let decimals: ArrayRef = Arc::new(Decimal128Array::from(vec![Some(150), None, Some(-25), Some(1000)]).with_precision_and_scale(15, 2).unwrap());
        let ints: ArrayRef = Arc::new(Int32Array::from(vec![7, 3, 9, -1]));
        let floats: ArrayRef = Arc::new(arrow::array::Float32Array::from(vec![1.5, 2.5, -3.0, 0.0]));
        let args = vec![Some(Arc::clone(&decimals)), None, Some(Arc::clone(&ints)), Some(Arc::clone(&floats))];
        for domain in [4u64, 1 << 20] {
            // All rows at once, or split over two partial results.
            let mut whole = GroupedStates::new(funcs.clone(), domain);
            whole.update(&[1, 3, 1, 3], &args).unwrap();
            let mut merged = GroupedStates::new(funcs.clone(), domain);
            for range in [0..1, 1..4] {
                let mut part = GroupedStates::new(funcs.clone(), domain);
                let gids = &[1u64, 3, 1, 3][range.clone()];
                let sliced: Vec<Option<ArrayRef>> = args.iter().map(|a| a.as_ref().map(|a| a.slice(range.start, range.len()))).collect();
                part.update(gids, &sliced).unwrap();
                merged.merge(&part.partial(&schema).unwrap()).unwrap();
            }
            for states in [&whole, &merged] {
                let mut groups = states.groups();
                groups.sort();
                assert_eq!(groups.iter().map(|g| g.0).collect::<Vec<_>>(), vec![1, 3]);
                let slots: Vec<usize> = groups.iter().map(|g| g.1).collect();
                let sums = states.finish(0, &slots, &DataType::Decimal128(25, 2)).unwrap();
                assert_eq!(sums.as_primitive::<arrow::datatypes::Decimal128Type>().iter().collect::<Vec<_>>(), vec![Some(125), Some(1000)]);
                let counts = states.finish(1, &slots, &DataType::Int64).unwrap();
                assert_eq!(counts.as_primitive::<arrow::datatypes::Int64Type>().values().to_vec(), vec![2, 2]);
                let mins = states.finish(2, &slots, &DataType::Int32).unwrap();
                assert_eq!(mins.as_primitive::<arrow::datatypes::Int32Type>().values().to_vec(), vec![7, -1]);
                let maxes = states.finish(3, &slots, &DataType::Float32).unwrap();
                assert_eq!(maxes.as_primitive::<arrow::datatypes::Float32Type>().values().to_vec(), vec![1.5, 2.5]);
            }
        }
    }

    #[test]
    fn a_group_with_only_nulls_has_a_null_sum_and_bad_partials_are_refused() {
        let funcs = vec![(AggFunc::Sum, Domain::Exact(0))];
        let mut states = GroupedStates::new(funcs.clone(), 8);
        states.update(&[5], &[Some(Arc::new(Int32Array::from(vec![None])) as ArrayRef)]).unwrap();
        let slots: Vec<usize> = states.groups().iter().map(|g| g.1).collect();
        assert!(states.finish(0, &slots, &DataType::Int64).unwrap().is_null(0));
        let partial = RecordBatch::try_new(partial_schema(&funcs), vec![Arc::new(UInt64Array::from(vec![9])), Arc::new(Decimal128Array::from(vec![1]).with_data_type(DataType::Decimal128(38, 0)))]).unwrap();
        assert!(states.merge(&partial).is_err(), "group 9 of 8");
    }
}
