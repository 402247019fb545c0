//! A hash join's build-side keys as a filter for its probe side's scan (a runtime join filter).
//!
//! DataFusion hands a scan below a hash join the join's key set only while it is small (an
//! `IN` list of up to 16K keys); beyond that its dynamic filter is a lookup into the join's own
//! hash table, which cannot leave the process. A [`KeySet`] is the same keys in a form that
//! travels: sorted and delta-coded on the wire (TPC-H Q03's 1.46M order keys take 1.5 MB), a
//! bitmap over their range on the node, where the page reader tests each probe row's key
//! before it decodes the row's other columns. A key set only drops rows the join would drop.

use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, OnceLock};

use arrow::array::{Array, ArrayRef, AsArray, BooleanArray, RecordBatch};
use arrow::buffer::BooleanBuffer;
use arrow::datatypes::{DataType, Date32Type, Int32Type, Int64Type, Schema};
use datafusion::common::{Result, ScalarValue, plan_err};
use datafusion::logical_expr::{ColumnarValue, Operator};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::expressions::{BinaryExpr, Column, InListExpr, Literal};

/// Widest key range a key set covers (its node-side bitmap is at most 32 MB).
pub const MAX_RANGE: u64 = 1 << 28;
/// Most keys a key set holds (its wire form is about a byte per key when dense).
pub const MAX_KEYS: usize = 16 << 20;

/// Whether a key column of this type can be filtered by a key set.
pub fn supports(data_type: &DataType) -> bool {
    // The types the page reader compares as integers.
    matches!(data_type, DataType::Int32 | DataType::Int64 | DataType::Date32)
}

/// Distinct integer keys, sorted.
#[derive(Clone)]
pub struct KeySet {
    keys: Vec<i64>,
    /// Built on first use and kept: a filter tests every batch of a scan against the same set,
    /// and building the bitmap per batch (7.5 MB for TPC-H's order keys) made Q04's scans over
    /// three nodes take 23x the CPU of one.
    bitmap: OnceLock<Bitmap>,
}

impl PartialEq for KeySet {
    fn eq(&self, other: &Self) -> bool {
        self.keys == other.keys
    }
}

impl Eq for KeySet {}

impl fmt::Debug for KeySet {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "KeySet({} keys in [{:?}, {:?}])", self.keys.len(), self.keys.first(), self.keys.last())
    }
}

impl KeySet {
    /// The set of `keys` (any order, repeats allowed); `None` when they exceed [`MAX_KEYS`] or
    /// span more than [`MAX_RANGE`].
    pub fn new(mut keys: Vec<i64>) -> Option<KeySet> {
        keys.sort_unstable();
        keys.dedup();
        let set = KeySet { keys, bitmap: OnceLock::new() };
        (set.keys.len() <= MAX_KEYS && set.range() <= MAX_RANGE).then_some(set)
    }

    /// The keys, sorted, without repeats.
    pub fn keys(&self) -> &[i64] {
        &self.keys
    }

    /// Values from the smallest key to the largest (0 when empty).
    pub fn range(&self) -> u64 {
        match (self.keys.first(), self.keys.last()) {
            (Some(min), Some(max)) => max.abs_diff(*min) + 1,
            _ => 0,
        }
    }

    /// The wire form: the key count, the first key, then each gap to the next as a LEB128
    /// varint.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(16 + self.keys.len() + self.keys.len() / 4);
        out.extend((self.keys.len() as u64).to_le_bytes());
        out.extend(self.keys.first().copied().unwrap_or(0).to_le_bytes());
        for pair in self.keys.windows(2) {
            let mut gap = pair[1].abs_diff(pair[0]);
            while gap >= 0x80 {
                out.push(gap as u8 | 0x80);
                gap >>= 7;
            }
            out.push(gap as u8);
        }
        out
    }

    /// Reads [`Self::encode`]'s form from untrusted bytes: every key count, gap and range is
    /// checked before anything is allocated for it.
    pub fn decode(bytes: &[u8]) -> Result<KeySet> {
        let Some((count, rest)) = bytes.split_first_chunk::<8>() else { return plan_err!("key set: truncated header") };
        let Some((first, mut rest)) = rest.split_first_chunk::<8>() else { return plan_err!("key set: truncated header") };
        let count = u64::from_le_bytes(*count);
        // Each key after the first takes at least one byte.
        if count > MAX_KEYS as u64 || count.saturating_sub(1) > rest.len() as u64 {
            return plan_err!("key set: {count} keys do not fit {} bytes (at most {MAX_KEYS} keys)", rest.len());
        }
        let mut keys = Vec::with_capacity(count as usize);
        if count > 0 {
            keys.push(i64::from_le_bytes(*first));
        }
        let mut span = 0u64;
        while (keys.len() as u64) < count {
            let (mut gap, mut shift) = (0u64, 0u32);
            loop {
                let Some((&byte, tail)) = rest.split_first() else { return plan_err!("key set: truncated after {} keys", keys.len()) };
                rest = tail;
                if shift > 56 {
                    return plan_err!("key set: a gap's varint is too long");
                }
                gap |= u64::from(byte & 0x7f) << shift;
                shift += 7;
                if byte & 0x80 == 0 {
                    break;
                }
            }
            span = span.saturating_add(gap);
            if gap == 0 || span >= MAX_RANGE {
                return plan_err!("key set: keys must ascend without repeats within a range of {MAX_RANGE}");
            }
            let previous = *keys.last().expect("the first key is pushed");
            keys.push(previous.checked_add(gap as i64).ok_or_else(|| datafusion::common::plan_datafusion_err!("key set: key overflows"))?);
        }
        if !rest.is_empty() {
            return plan_err!("key set: {} bytes after the last key", rest.len());
        }
        Ok(KeySet { keys, bitmap: OnceLock::new() })
    }

    /// The keys as a bitmap over their range.
    pub fn bitmap(&self) -> &Bitmap {
        self.bitmap.get_or_init(|| Bitmap::of(&self.keys))
    }

    /// Per row of `array` (a column of a type [`supports`] accepts), whether its value is a key; NULL is none.
    pub fn contains_array(&self, array: &ArrayRef) -> Result<BooleanArray> {
        self.bitmap().contains_array(array)
    }
}

impl Bitmap {
    /// Per row of `array` (a column of a type [`supports`] accepts), whether its value is a key; NULL is none.
    pub fn contains_array(&self, array: &ArrayRef) -> Result<BooleanArray> {
        // One loop per type, each over a slice: this runs on every probe row in process.
        fn test<T: Copy + Into<i64>>(bitmap: &Bitmap, values: &[T]) -> BooleanBuffer {
            BooleanBuffer::collect_bool(values.len(), |i| bitmap.contains(values[i].into()))
        }
        let buffer = match array.data_type() {
            DataType::Int32 => test(self, array.as_primitive::<Int32Type>().values()),
            DataType::Date32 => test(self, array.as_primitive::<Date32Type>().values()),
            DataType::Int64 => test(self, array.as_primitive::<Int64Type>().values()),
            other => return plan_err!("key set over a column of type {other}"),
        };
        let passed = match array.nulls() {
            Some(nulls) => &buffer & nulls.inner(),
            None => buffer,
        };
        Ok(BooleanArray::new(passed, None))
    }
}

/// Bit `key - min` set for each key: a key set as the page reader tests it.
#[derive(Debug, Clone, PartialEq)]
pub struct Bitmap {
    min: i64,
    words: Arc<Vec<u64>>,
}

impl Bitmap {
    /// The bitmap of sorted `keys` spanning at most [`MAX_RANGE`] values.
    pub fn of(keys: &[i64]) -> Bitmap {
        Self::within(keys.iter().copied(), keys.first().copied(), keys.last().copied())
    }

    /// The bitmap of the keys of `chunks`, each in any order, repeats allowed; `None` if they
    /// span more than [`MAX_RANGE`] values.
    pub fn of_unsorted(chunks: &[impl AsRef<[i64]>]) -> Option<Bitmap> {
        let keys = || chunks.iter().flat_map(|c| c.as_ref().iter().copied());
        let (min, max) = keys().fold((None, None), |(min, max): (Option<i64>, Option<i64>), k| (Some(min.map_or(k, |m| m.min(k))), Some(max.map_or(k, |m| m.max(k)))));
        let span = min.zip(max).map_or(0, |(min, max)| max.abs_diff(min));
        (span < MAX_RANGE).then(|| Self::within(keys(), min, max))
    }

    /// The bitmap of `keys`, which lie in `[min, max]` (both `None` when there are none).
    fn within(keys: impl Iterator<Item = i64>, min: Option<i64>, max: Option<i64>) -> Bitmap {
        let span = min.zip(max).map(|(min, max)| max.abs_diff(min));
        debug_assert!(span.is_none_or(|span| span < MAX_RANGE), "a key set spans at most MAX_RANGE values");
        let min = min.unwrap_or(0);
        let mut words = vec![0u64; span.map_or(0, |span| (span >> 6) as usize + 1)];
        for key in keys {
            let offset = key.abs_diff(min);
            words[(offset >> 6) as usize] |= 1 << (offset & 63);
        }
        Bitmap { min, words: Arc::new(words) }
    }

    /// Bytes the bitmap holds.
    pub fn bytes(&self) -> usize {
        self.words.len() * size_of::<u64>()
    }

    #[inline]
    pub fn contains(&self, value: i64) -> bool {
        // Below `min` the wrapped offset is beyond the bitmap.
        let offset = value.wrapping_sub(self.min) as u64;
        self.words.get((offset >> 6) as usize).is_some_and(|word| word >> (offset & 63) & 1 == 1)
    }
}

/// `column IN key set`: a join's key set applied to its probe side's scan.
#[derive(Debug, Clone)]
pub struct KeySetExpr {
    column: Arc<dyn PhysicalExpr>,
    set: Arc<KeySet>,
}

impl KeySetExpr {
    /// `column` (a [`Column`] of an integer type) filtered by `set`.
    pub fn new(column: Arc<dyn PhysicalExpr>, set: Arc<KeySet>) -> Self {
        KeySetExpr { column, set }
    }

    /// The column it tests.
    pub fn column(&self) -> Option<&Column> {
        self.column.downcast_ref::<Column>()
    }

    /// The keys.
    pub fn set(&self) -> &Arc<KeySet> {
        &self.set
    }
}

impl fmt::Display for KeySetExpr {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "{} IN key set ({} keys)", self.column, self.set.keys.len())
    }
}

impl PartialEq for KeySetExpr {
    fn eq(&self, other: &Self) -> bool {
        self.column.eq(&other.column) && (Arc::ptr_eq(&self.set, &other.set) || self.set == other.set)
    }
}

impl Eq for KeySetExpr {}

impl Hash for KeySetExpr {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.column.hash(state);
        self.set.keys.len().hash(state);
        self.set.keys.first().hash(state);
        self.set.keys.last().hash(state);
    }
}

impl PhysicalExpr for KeySetExpr {
    fn data_type(&self, _input_schema: &Schema) -> Result<DataType> {
        Ok(DataType::Boolean)
    }

    fn nullable(&self, _input_schema: &Schema) -> Result<bool> {
        Ok(false)
    }

    fn evaluate(&self, batch: &RecordBatch) -> Result<ColumnarValue> {
        let values = self.column.evaluate(batch)?.into_array(batch.num_rows())?;
        Ok(ColumnarValue::Array(Arc::new(self.set.contains_array(&values)?)))
    }

    fn children(&self) -> Vec<&Arc<dyn PhysicalExpr>> {
        vec![&self.column]
    }

    fn with_new_children(self: Arc<Self>, children: Vec<Arc<dyn PhysicalExpr>>) -> Result<Arc<dyn PhysicalExpr>> {
        match <[_; 1]>::try_from(children) {
            Ok([column]) => Ok(Arc::new(KeySetExpr { column, set: Arc::clone(&self.set) })),
            Err(children) => plan_err!("a key set tests one column, not {}", children.len()),
        }
    }

    fn fmt_sql(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.column.fmt_sql(f)?;
        write!(f, " IN key set ({} keys)", self.set.keys.len())
    }
}

/// The bounds the key tests among `predicate`'s conjuncts imply: for each `column IN (literals)`
/// and `column IN key set`, `column >= smallest AND column <= largest`. Only for pruning by
/// statistics (segments, row groups, pages): a key list prunes nothing by itself (DataFusion's
/// pruning takes lists of at most 20 values, and a key set is ours), yet a join's keys often fall
/// in a narrow range of a column the data is clustered by (TPC-DS's fact tables by date), and
/// testing the bounds on every row would only repeat the key test.
pub fn key_bounds(predicate: &Arc<dyn PhysicalExpr>, schema: &Schema) -> Vec<Arc<dyn PhysicalExpr>> {
    let mut bounds = Vec::new();
    for conjunct in datafusion::physical_expr::split_conjunction(predicate) {
        let (column, min, max) = if let Some(list) = conjunct.downcast_ref::<InListExpr>() {
            let Some(column) = list.expr().downcast_ref::<Column>().filter(|_| !list.negated()) else { continue };
            let values: Option<Vec<&ScalarValue>> = list.list().iter().map(|e| e.downcast_ref::<Literal>().map(Literal::value).filter(|v| !v.is_null())).collect();
            let Some(values) = values else { continue };
            let min = values.iter().copied().reduce(|a, b| if b.partial_cmp(a) == Some(std::cmp::Ordering::Less) { b } else { a });
            let max = values.iter().copied().reduce(|a, b| if b.partial_cmp(a) == Some(std::cmp::Ordering::Greater) { b } else { a });
            let (Some(min), Some(max)) = (min, max) else { continue };
            (column, min.clone(), max.clone())
        } else if let Some(set) = conjunct.downcast_ref::<KeySetExpr>() {
            let (Some(column), Some(&min), Some(&max)) = (set.column(), set.set().keys().first(), set.set().keys().last()) else { continue };
            let Ok(field) = schema.field_with_name(column.name()) else { continue };
            let scalar = |key: i64| match field.data_type() {
                DataType::Int32 => i32::try_from(key).ok().map(|k| ScalarValue::Int32(Some(k))),
                DataType::Date32 => i32::try_from(key).ok().map(|k| ScalarValue::Date32(Some(k))),
                DataType::Int64 => Some(ScalarValue::Int64(Some(key))),
                _ => None,
            };
            let (Some(min), Some(max)) = (scalar(min), scalar(max)) else { continue };
            (column, min, max)
        } else {
            continue;
        };
        let column: Arc<dyn PhysicalExpr> = Arc::new(column.clone());
        bounds.push(Arc::new(BinaryExpr::new(Arc::clone(&column), Operator::GtEq, Arc::new(Literal::new(min)))) as Arc<dyn PhysicalExpr>);
        bounds.push(Arc::new(BinaryExpr::new(column, Operator::LtEq, Arc::new(Literal::new(max)))));
    }
    bounds
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Int32Array, Int64Array};

    #[test]
    fn keys_survive_the_wire_and_bad_bytes_are_refused() {
        let set = KeySet::new(vec![40, 7, 7, -3, 1 << 20, 41]).expect("small set");
        assert_eq!(set.keys(), &[-3, 7, 40, 41, 1 << 20]);
        let wire = set.encode();
        assert_eq!(KeySet::decode(&wire).expect("decodes"), set);
        assert_eq!(KeySet::decode(&KeySet::new(vec![]).unwrap().encode()).unwrap().keys(), &[] as &[i64]);
        // Truncated, trailing bytes, a repeat (gap 0), a count beyond the bytes.
        assert!(KeySet::decode(&wire[..wire.len() - 1]).is_err());
        assert!(KeySet::decode(&[wire.as_slice(), &[1]].concat()).is_err());
        let mut repeat = wire.clone();
        repeat[16] = 0;
        assert!(KeySet::decode(&repeat).is_err());
        let mut huge = wire.clone();
        huge[..8].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(KeySet::decode(&huge).is_err());
        // A range beyond MAX_RANGE is refused on both ends.
        assert!(KeySet::new(vec![0, MAX_RANGE as i64]).is_none());
        let wide = [2u64.to_le_bytes(), 0i64.to_le_bytes()].concat().into_iter().chain([0x80, 0x80, 0x80, 0x80, 0x01]).collect::<Vec<u8>>();
        assert!(KeySet::decode(&wide).is_err(), "a gap of 2^28");
    }

    #[test]
    fn rows_pass_when_their_key_is_in_the_set() {
        let set = KeySet::new(vec![5, 9, 200]).unwrap();
        let ints: ArrayRef = Arc::new(Int64Array::from(vec![Some(5), None, Some(6), Some(200), Some(-1), Some(i64::MAX)]));
        assert_eq!(set.contains_array(&ints).unwrap(), BooleanArray::from(vec![true, false, false, true, false, false]));
        let narrow: ArrayRef = Arc::new(Int32Array::from(vec![9, 10, 5]).slice(1, 2));
        assert_eq!(set.contains_array(&narrow).unwrap(), BooleanArray::from(vec![false, true]));
        // Every batch is tested against the one bitmap, built once.
        let built = Arc::as_ptr(&set.bitmap.get().expect("built by the first test").words);
        set.contains_array(&ints).unwrap();
        assert_eq!(Arc::as_ptr(&set.bitmap().words), built, "the bitmap was built again");
    }
}
