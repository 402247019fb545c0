//! String and binary view columns that hold only their own bytes.
//!
//! A view array's rows point into shared data buffers, so a `take`, `filter` or `slice` keeps
//! every buffer its input held. In memory that pins bytes; written out it copies them: Arrow
//! IPC writes a view column's data buffers whole, for every batch, and arrow-flight splits a
//! batch over 2 MB into slices that each carry them all. A node's filtered customer rows
//! (TPC-H Q10, 427K of 1.5M) sent 687 MB over loopback for 14.5 MB of Arrow.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, RecordBatch};
use arrow::datatypes::DataType;
use datafusion::common::Result;

fn is_view(data_type: &DataType) -> bool {
    matches!(data_type, DataType::Utf8View | DataType::BinaryView)
}

/// A view column's (views, bytes its data buffers hold); `None` for any other column.
fn view_parts(array: &ArrayRef) -> Option<(&[u128], usize)> {
    let (views, buffers) = match array.data_type() {
        DataType::Utf8View => (array.as_string_view().views().as_ref(), array.as_string_view().data_buffers()),
        DataType::BinaryView => (array.as_binary_view().views().as_ref(), array.as_binary_view().data_buffers()),
        _ => return None,
    };
    Some((views, buffers.iter().map(|b| b.len()).sum()))
}

/// The bytes of a view column's values kept out of line (those over 12 bytes).
fn out_of_line_bytes(views: &[u128]) -> usize {
    views.iter().map(|&v| v as u32 as usize).filter(|&len| len > 12).sum()
}

/// A string or binary view array copied out of the buffers it points into, holding only its
/// own bytes; any other array as it is.
pub fn gc_views(array: &ArrayRef) -> ArrayRef {
    match array.data_type() {
        DataType::Utf8View => Arc::new(array.as_string_view().gc()),
        DataType::BinaryView => Arc::new(array.as_binary_view().gc()),
        _ => Arc::clone(array),
    }
}

/// `batch` with each view column copied out of its buffers where they hold over twice its
/// bytes (small waste is cheaper to keep than to copy).
pub fn compact_views(batch: RecordBatch) -> Result<RecordBatch> {
    let wasteful = |array: &ArrayRef| view_parts(array).is_some_and(|(views, held)| held > 2 * out_of_line_bytes(views) + (64 << 10));
    if !batch.columns().iter().any(wasteful) {
        return Ok(batch);
    }
    let columns = batch.columns().iter().map(|c| if wasteful(c) { gc_views(c) } else { Arc::clone(c) }).collect();
    Ok(RecordBatch::try_new(batch.schema(), columns)?)
}

/// `batch` as batches to encode for the link: with view columns, pieces of at most about
/// `max_bytes` each, every view column holding exactly its piece's bytes, so that neither IPC
/// nor the Flight encoder's own split (at `2 * max_bytes`) sends a byte twice; without, as it
/// is (IPC writes the sliced part of other columns' buffers).
pub fn link_batches(batch: RecordBatch, max_bytes: usize) -> Result<Vec<RecordBatch>> {
    if !batch.schema().fields().iter().any(|f| is_view(f.data_type())) {
        return Ok(vec![batch]);
    }
    let bytes: usize = batch
        .columns()
        .iter()
        .map(|c| match view_parts(c) {
            Some((views, _)) => views.len() * size_of::<u128>() + out_of_line_bytes(views),
            None => c.to_data().get_slice_memory_size().unwrap_or(c.get_array_memory_size()),
        })
        .sum();
    let rows = batch.num_rows();
    let per_piece = rows.div_ceil(bytes.div_ceil(max_bytes.max(1)).max(1)).max(1);
    (0..rows.max(1))
        .step_by(per_piece)
        .map(|offset| {
            let piece = batch.slice(offset, per_piece.min(rows - offset));
            let columns = piece.columns().iter().map(gc_views).collect();
            Ok(RecordBatch::try_new(piece.schema(), columns)?)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Int64Array, StringViewArray};
    use arrow::datatypes::{Field, Schema};

    fn strings(rows: usize) -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, false), Field::new("s", DataType::Utf8View, false)]));
        let ids: ArrayRef = Arc::new(Int64Array::from_iter_values(0..rows as i64));
        let strings: ArrayRef = Arc::new(StringViewArray::from_iter_values((0..rows).map(|i| format!("a string longer than twelve bytes, number {i}"))));
        RecordBatch::try_new(schema, vec![ids, strings]).unwrap()
    }

    fn held(batch: &RecordBatch) -> usize {
        batch.column(1).as_string_view().data_buffers().iter().map(|b| b.len()).sum()
    }

    /// Rows that point into a larger batch's strings are kept at their own bytes; rows that use
    /// their buffers are kept as they are.
    #[test]
    fn rows_pointing_into_larger_buffers_are_compacted() {
        let whole = strings(10_000);
        assert_eq!(held(&compact_views(whole.clone()).unwrap()), held(&whole), "a batch using its buffers is kept");
        let few = whole.slice(100, 10);
        let compacted = compact_views(few.clone()).unwrap();
        assert!(held(&few) > 400_000 && held(&compacted) < 1_000, "{} bytes held for 10 strings", held(&compacted));
        assert_eq!(compacted.column(1).as_string_view().value(3), few.column(1).as_string_view().value(3));
    }

    /// Encoded for the link, a batch of strings costs its own bytes once: pieces within the
    /// limit, together holding each string once, in order.
    #[test]
    fn link_batches_carry_each_string_once() {
        let whole = strings(100_000);
        let own = held(&whole);
        for batch in [whole.clone(), whole.slice(40_000, 30_000)] {
            let pieces = link_batches(batch.clone(), 1 << 20).unwrap();
            assert!(pieces.len() > 1, "{} rows in one piece", batch.num_rows());
            let sent: usize = pieces.iter().map(held).sum();
            let expected = own * batch.num_rows() / whole.num_rows();
            assert!(sent <= expected + expected / 50, "{sent} string bytes sent for {expected}");
            assert!(pieces.iter().all(|p| held(p) + 16 * p.num_rows() <= 1 << 20), "a piece over the limit");
            assert_eq!(arrow::compute::concat_batches(&batch.schema(), &pieces).unwrap(), batch);
        }
        let numbers = whole.project(&[0]).unwrap();
        assert_eq!(link_batches(numbers.clone(), 1 << 10).unwrap(), vec![numbers], "no view column: as it is");
        assert_eq!(link_batches(whole.slice(0, 0), 1 << 20).unwrap().iter().map(|b| b.num_rows()).sum::<usize>(), 0);
    }
}
