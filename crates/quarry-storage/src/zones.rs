//! Zone maps of sorted copies (SoftFlash's skipping by per-zone bounds, HippogriffDB's
//! query-adaptive versions): which row groups of a segment can hold fact rows a star probe
//! keeps, from the manifest's [`Zones`] and the kept keys of the dimension joined on the zones'
//! column. A node skips the others; the host prices each sorted copy by the same test, so it
//! knows exactly which row groups the node will read.

use arrow::datatypes::{DataType, Schema};
use datafusion::common::ScalarValue;
use quarry_table::Zones;

use crate::star::{KeyBounds, KeyLookup, StarSpec, StarTables};

/// The dimensions' kept keys by the fact column joined on them.
#[derive(Debug, Clone, Copy)]
pub struct ProbeKeys<'a> {
    keys: &'a [usize],
    tables: &'a StarTables,
    schema: &'a Schema,
}

impl<'a> ProbeKeys<'a> {
    /// The keys of a probe of `schema` (the fact input's) by `spec`, once `tables` are built.
    pub fn new(spec: &'a StarSpec, tables: &'a StarTables, schema: &'a Schema) -> Self {
        ProbeKeys { keys: &spec.keys, tables, schema }
    }

    /// The lookup of the dimension joined on fact column `column`, with the column's type.
    fn lookup(&self, column: &str) -> Option<(&'a KeyLookup, &'a DataType)> {
        self.keys.iter().zip(&self.tables.dims).find_map(|(&key, dimension)| {
            let field = self.schema.field(key);
            (field.name() == column).then_some((&dimension.lookup, field.data_type()))
        })
    }

    /// Per row group of `zones`, how many of the joined dimension's kept keys lie within its
    /// bounds (`None` for a row group whose bounds are unknown or too wide to count); `None`
    /// if no dimension is joined on the zones' column.
    pub fn keys_per_zone(&self, zones: &Zones) -> Option<Vec<Option<u64>>> {
        let (lookup, data_type) = self.lookup(&zones.column)?;
        let bound = |text: &Option<String>| text.as_ref().and_then(|t| ScalarValue::try_from_string(t.clone(), data_type).ok()).and_then(|v| as_i64(&v));
        Some(zones.min.iter().zip(&zones.max).map(|(lo, hi)| lookup.count_in(bound(lo)?, bound(hi)?)).collect())
    }

    /// Whether a segment whose fact column `column` lies in `lo..=hi` (canonical text) may hold
    /// a row the probe keeps, by the range of the joined dimension's keys (as a node prunes
    /// segments, `StarProbeExec::key_bounds_predicate`); `None` if no dimension is joined on
    /// the column or the bounds do not parse.
    pub fn range_may_hold(&self, column: &str, lo: &str, hi: &str) -> Option<bool> {
        let (lookup, data_type) = self.lookup(column)?;
        let parse = |text: &str| ScalarValue::try_from_string(text.to_string(), data_type).ok().and_then(|v| as_i64(&v));
        let (lo, hi) = (parse(lo)?, parse(hi)?);
        Some(match lookup.bounds() {
            KeyBounds::Any => true,
            KeyBounds::Empty => false,
            KeyBounds::Within(a, b) => hi >= a && lo <= b,
        })
    }

    /// The fact columns a dimension is joined on.
    pub fn columns(&self) -> impl Iterator<Item = &'a str> + '_ {
        self.keys.iter().map(|&key| self.schema.field(key).name().as_str())
    }

    /// Per row group of `zones`, whether it may hold a row the probe keeps; `None` if no
    /// dimension is joined on the zones' column.
    pub fn kept_row_groups(&self, zones: &Zones) -> Option<Vec<bool>> {
        Some(self.keys_per_zone(zones)?.into_iter().map(|keys| keys != Some(0)).collect())
    }
}

/// An integer or date value as the `i64` star lookups take.
fn as_i64(value: &ScalarValue) -> Option<i64> {
    Some(match value {
        ScalarValue::Int8(Some(v)) => *v as i64,
        ScalarValue::Int16(Some(v)) => *v as i64,
        ScalarValue::Int32(Some(v)) => *v as i64,
        ScalarValue::Int64(Some(v)) => *v,
        ScalarValue::UInt8(Some(v)) => *v as i64,
        ScalarValue::UInt16(Some(v)) => *v as i64,
        ScalarValue::UInt32(Some(v)) => *v as i64,
        ScalarValue::Date32(Some(v)) => *v as i64,
        _ => return None,
    })
}
