//! Turning streams of batches into segments: sequentially (file loads) or chunk-parallel
//! (generators).

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use arrow::array::RecordBatch;

use crate::error::Result;
use crate::manifest::SegmentMeta;
use crate::segment::{ROW_GROUP_ROWS, SegmentWriter};
use crate::warehouse::TableWriter;

/// Writes `batches` into segments of at most [`ROW_GROUP_ROWS`] rows each (one row group per
/// segment). `progress` is called with the rows written so far. Stops at the first error; the
/// caller then drops the [`TableWriter`], which removes the segments.
pub fn write_batches(
    writer: &TableWriter,
    batches: impl Iterator<Item = Result<RecordBatch>>,
    progress: &dyn Fn(u64),
) -> Result<Vec<SegmentMeta>> {
    let mut segments = Vec::new();
    let mut current: Option<SegmentWriter> = None;
    let mut rows_total = 0u64;
    for batch in batches {
        let mut batch = batch?;
        while batch.num_rows() > 0 {
            let segment = match &mut current {
                Some(segment) => segment,
                None => current.insert(writer.new_segment()?),
            };
            let room = ROW_GROUP_ROWS - segment.rows() as usize;
            let take = room.min(batch.num_rows());
            segment.write(&batch.slice(0, take))?;
            batch = batch.slice(take, batch.num_rows() - take);
            rows_total += take as u64;
            if segment.rows() as usize >= ROW_GROUP_ROWS {
                segments.push(current.take().expect("segment open").finish()?);
            }
        }
        progress(rows_total);
    }
    if let Some(segment) = current {
        segments.push(segment.finish()?);
    }
    Ok(segments)
}

/// Writes chunks `0..chunk_count` on `threads` threads, each chunk into its own segment, and
/// returns the segments in chunk order. `make_chunk(i)` yields chunk `i`'s batches; memory is
/// bounded by one chunk in flight per thread. `progress` receives rows written so far.
pub fn write_chunks_parallel<'a, F, I>(
    writer: &TableWriter,
    chunk_count: usize,
    threads: usize,
    make_chunk: F,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<Vec<SegmentMeta>>
where
    F: Fn(usize) -> I + Sync,
    I: Iterator<Item = RecordBatch> + 'a,
{
    let next = AtomicUsize::new(0);
    let rows = std::sync::atomic::AtomicU64::new(0);
    let results: Mutex<Vec<(usize, SegmentMeta)>> = Mutex::new(Vec::with_capacity(chunk_count));
    let failed: Mutex<Option<crate::error::TableError>> = Mutex::new(None);
    std::thread::scope(|scope| {
        for _ in 0..threads.clamp(1, chunk_count.max(1)) {
            scope.spawn(|| {
                loop {
                    let index = next.fetch_add(1, Ordering::Relaxed);
                    if index >= chunk_count || failed.lock().expect("lock").is_some() {
                        break;
                    }
                    let outcome = (|| -> Result<Option<SegmentMeta>> {
                        let mut segment: Option<SegmentWriter> = None;
                        for batch in make_chunk(index) {
                            if batch.num_rows() == 0 {
                                continue;
                            }
                            let open = match &mut segment {
                                Some(s) => s,
                                None => segment.insert(writer.new_segment()?),
                            };
                            open.write(&batch)?;
                            let total = rows.fetch_add(batch.num_rows() as u64, Ordering::Relaxed) + batch.num_rows() as u64;
                            progress(total);
                        }
                        segment.map(SegmentWriter::finish).transpose()
                    })();
                    match outcome {
                        Ok(Some(meta)) => results.lock().expect("lock").push((index, meta)),
                        Ok(None) => {}
                        Err(e) => {
                            failed.lock().expect("lock").get_or_insert(e);
                        }
                    }
                }
            });
        }
    });
    if let Some(e) = failed.into_inner().expect("lock") {
        return Err(e);
    }
    let mut results = results.into_inner().expect("lock");
    results.sort_by_key(|(index, _)| *index);
    Ok(results.into_iter().map(|(_, meta)| meta).collect())
}
