//! [`SortReducer`] (ingestion, spilling, intermediate merges) and [`SortedRun`] (the lazily
//! streamed final merge).

use std::path::Path;
use std::sync::Arc;

use crate::budget::{MemoryBudget, Reservation};
use crate::codec::{Key, Value};
use crate::config::{Layout, SortReduceConfig};
use crate::error::{Error, Result};
use crate::merge::{Input, Merger};
use crate::run::{RunFile, RunReader, RunWriter, SpillDir};

/// Chunks smaller than this many records per thread are sorted on fewer threads.
const MIN_PART_RECORDS: usize = 1 << 14;

/// Counters of one sort-reduce, from ingestion to the end of the final merge.
///
/// The paper's "fraction of the update stream removed before the first write" (sec. 9.7.7) is
/// [`SortReduceStats::first_reduce_ratio`] = `1 - records_after_first_reduce / updates_in`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SortReduceStats {
    /// Updates pushed.
    pub updates_in: u64,
    /// In-memory chunks sorted and reduced (spilled ones plus the last one, kept in memory).
    pub chunks_sorted: u64,
    /// Records left after the in-memory sort-reduce of each chunk, summed over chunks: what the
    /// first write to storage would hold. For spilled chunks this is exactly the records written;
    /// the last chunk stays in memory and is counted per sorting thread (keys that occur in the
    /// parts of two threads are counted twice and merged only in the final merge).
    pub records_after_first_reduce: u64,
    /// Run files written (spilled chunks and intermediate merge outputs).
    pub runs_written: u64,
    /// Records written to run files.
    pub records_written: u64,
    /// Bytes written to run files (headers included).
    pub bytes_written: u64,
    /// Bytes read back from run files (so far, while the final merge streams).
    pub bytes_read: u64,
    /// Merges that wrote a run file (the final merge streams to the consumer instead).
    pub intermediate_merges: u64,
    /// Merge levels the deepest record passes through, counting the final merge: 0 when the
    /// result comes from memory alone, 1 when the final merge reads spilled chunks directly,
    /// 2 or more when intermediate merges were needed.
    pub merge_passes: u32,
    /// Inputs of the final merge: run files plus in-memory parts of the last chunk.
    pub final_merge_inputs: usize,
    /// Unique keys emitted by the final merge so far.
    pub records_out: u64,
    /// Peak bytes reserved from the memory budget; never above `memory_budget_bytes`.
    pub peak_reserved: usize,
    /// The memory budget.
    pub memory_budget_bytes: usize,
}

impl SortReduceStats {
    /// Fraction of the update stream removed by in-memory reduction before anything is written
    /// (0 when no updates came in).
    pub fn first_reduce_ratio(&self) -> f64 {
        if self.updates_in == 0 {
            return 0.0;
        }
        1.0 - self.records_after_first_reduce as f64 / self.updates_in as f64
    }
}

/// Sort-reduce of a stream of `(key, value)` updates with an associative, commutative `reduce`.
///
/// Updates accumulate in an in-memory chunk sized from the memory budget. A full chunk is
/// sorted and reduced on `threads` threads and written as a run file. [`SortReducer::finish`]
/// sort-reduces the last chunk in memory, merges run files `fan_in` at a time while more remain
/// than one merge can take, and returns a [`SortedRun`] that streams the final merge.
///
/// `reduce(a, b)` must be associative; because chunks are sorted with an unstable sort and parts
/// are merged in an order that depends on the thread count, it must also be commutative (for
/// floating-point sums the result may differ in the last bits between configurations, but is the
/// same for the same input, configuration and thread count).
pub struct SortReducer<K: Key, V: Value, F> {
    config: SortReduceConfig,
    layout: Layout,
    reduce: F,
    budget: MemoryBudget,
    chunk: Vec<(K, V)>,
    chunk_reservation: Option<Reservation>,
    runs: Vec<RunFile>,
    spill_dir: Option<Arc<SpillDir>>,
    stats: SortReduceStats,
    /// Set when a spill failed part-way; every later call fails with [`Error::Poisoned`].
    poisoned: bool,
}

impl<K, V, F> SortReducer<K, V, F>
where
    K: Key,
    V: Value,
    F: Fn(V, V) -> V + Send + Sync,
{
    /// A reducer with its own [`MemoryBudget`] of `config.memory_budget_bytes`. Nothing is
    /// allocated and no directory is created until the first update (respectively spill).
    pub fn new(config: SortReduceConfig, reduce: F) -> Result<Self> {
        let layout = Layout::plan(&config, K::WIDTH + V::WIDTH, std::mem::size_of::<(K, V)>())?;
        let budget = MemoryBudget::new(config.memory_budget_bytes);
        Ok(SortReducer {
            stats: SortReduceStats {
                memory_budget_bytes: config.memory_budget_bytes,
                ..SortReduceStats::default()
            },
            config,
            layout,
            reduce,
            budget,
            chunk: Vec::new(),
            chunk_reservation: None,
            runs: Vec::new(),
            spill_dir: None,
            poisoned: false,
        })
    }

    /// Adds one update.
    #[inline]
    pub fn push(&mut self, key: K, value: V) -> Result<()> {
        if self.chunk.len() == self.chunk.capacity() {
            self.make_room()?;
        }
        self.chunk.push((key, value));
        Ok(())
    }

    /// Adds a batch of updates.
    pub fn push_batch(&mut self, mut batch: &[(K, V)]) -> Result<()> {
        while !batch.is_empty() {
            if self.chunk.len() == self.chunk.capacity() {
                self.make_room()?;
            }
            let n = batch.len().min(self.chunk.capacity() - self.chunk.len());
            self.chunk.extend_from_slice(&batch[..n]);
            batch = &batch[n..];
        }
        Ok(())
    }

    /// Adds every update of `updates`.
    pub fn extend(&mut self, updates: impl IntoIterator<Item = (K, V)>) -> Result<()> {
        for (key, value) in updates {
            self.push(key, value)?;
        }
        Ok(())
    }

    /// Counters so far.
    pub fn stats(&self) -> SortReduceStats {
        SortReduceStats {
            updates_in: self.stats.updates_in + self.chunk.len() as u64,
            peak_reserved: self.budget.peak_reserved(),
            ..self.stats
        }
    }

    /// The configuration.
    pub fn config(&self) -> &SortReduceConfig {
        &self.config
    }

    /// The budget every buffer is reserved from.
    pub fn memory_budget(&self) -> &MemoryBudget {
        &self.budget
    }

    /// Updates the in-memory chunk holds before it is spilled.
    pub fn chunk_capacity(&self) -> usize {
        self.layout.chunk_records
    }

    /// Run files merged at once: the configured fan-in, or less if the budget could not hold that
    /// many read buffers of a useful size.
    pub fn effective_fan_in(&self) -> usize {
        self.layout.fan_in
    }

    /// Bytes of each read buffer and of the write buffer.
    pub fn io_buffer_bytes(&self) -> usize {
        self.layout.io_buffer
    }

    /// The spill directory, once the first run has been written.
    pub fn spill_dir(&self) -> Option<&Path> {
        self.spill_dir.as_deref().map(SpillDir::path)
    }

    /// The chunk is full (or not yet allocated): allocate it or spill it.
    #[cold]
    fn make_room(&mut self) -> Result<()> {
        if self.poisoned {
            Err(Error::Poisoned)
        } else if self.chunk.capacity() == 0 {
            self.chunk_reservation = Some(self.budget.try_reserve(self.layout.chunk_bytes)?);
            self.chunk = Vec::with_capacity(self.layout.chunk_records.max(1));
            Ok(())
        } else {
            let spilled = self.spill();
            self.poisoned = spilled.is_err();
            spilled
        }
    }

    /// Sort-reduces the chunk and writes it as a level-0 run.
    fn spill(&mut self) -> Result<()> {
        let parts = sort_reduce_parts(&mut self.chunk, self.config.threads, &self.reduce);
        self.stats.updates_in += self.chunk.len() as u64;
        self.stats.chunks_sorted += 1;
        let dir = self.dir()?;
        let mut writer =
            RunWriter::create(&dir, self.budget.try_reserve(self.layout.io_buffer)?, 0)?;
        let inputs = parts
            .iter()
            .map(|&(pos, len)| Input::Mem {
                pos,
                end: pos + len,
            })
            .collect();
        let mut merger = Merger::new(inputs, std::mem::take(&mut self.chunk), None)?;
        let written = loop {
            match merger.next_reduced(&self.reduce) {
                Ok(Some((key, value))) => {
                    if let Err(e) = writer.push(key, value) {
                        break Err(e);
                    }
                }
                Ok(None) => break Ok(()),
                Err(e) => break Err(e),
            }
        };
        self.chunk = merger.into_mem().0;
        self.chunk.clear();
        written?;
        let run = writer.finish()?;
        self.stats.records_after_first_reduce += run.records;
        self.record_written(&run);
        self.runs.push(run);
        Ok(())
    }

    fn dir(&mut self) -> Result<Arc<SpillDir>> {
        if self.spill_dir.is_none() {
            self.spill_dir = Some(SpillDir::create(&self.config.temp_dir)?);
        }
        Ok(Arc::clone(self.spill_dir.as_ref().expect("just created")))
    }

    fn record_written(&mut self, run: &RunFile) {
        self.stats.runs_written += 1;
        self.stats.records_written += run.records;
        self.stats.bytes_written += run.bytes;
    }

    /// Merges `inputs` into one run file.
    fn merge_to_run(&mut self, inputs: Vec<RunFile>) -> Result<RunFile> {
        let level = 1 + inputs.iter().map(|r| r.level).max().unwrap_or(0);
        let dir = self.dir()?;
        let mut writer =
            RunWriter::create(&dir, self.budget.try_reserve(self.layout.io_buffer)?, level)?;
        let readers = self.open_runs(inputs)?;
        let mut merger = Merger::new(readers, Vec::new(), None)?;
        while let Some((key, value)) = merger.next_reduced(&self.reduce)? {
            writer.push(key, value)?;
        }
        self.stats.bytes_read += merger.bytes_read();
        // Dropping the merger deletes the inputs before the output is finished.
        drop(merger);
        let run = writer.finish()?;
        self.stats.intermediate_merges += 1;
        self.record_written(&run);
        Ok(run)
    }

    fn open_runs(&self, runs: Vec<RunFile>) -> Result<Vec<Input<K, V>>> {
        runs.into_iter()
            .map(|run| {
                let reservation = self.budget.try_reserve(self.layout.io_buffer)?;
                Ok(Input::Run(RunReader::open(run, reservation)?))
            })
            .collect()
    }

    /// Sort-reduces the last chunk in memory, merges run files until one merge can take them
    /// all, and returns the final merge as a stream.
    ///
    /// Intermediate merges follow the optimal (Huffman) pattern for a `fan_in`-way merge tree:
    /// the smallest runs are merged first, and the first merge takes just enough runs that every
    /// later one, the final merge included, is a full `fan_in`-way merge.
    ///
    /// Fails with [`Error::Poisoned`] if an earlier push failed.
    pub fn finish(mut self) -> Result<SortedRun<K, V, F>> {
        if self.poisoned {
            return Err(Error::Poisoned);
        }
        let mut chunk = std::mem::take(&mut self.chunk);
        let mut chunk_reservation = self.chunk_reservation.take();
        let parts = if chunk.is_empty() {
            // Free the chunk so merges are not charged for it.
            chunk = Vec::new();
            chunk_reservation = None;
            Vec::new()
        } else {
            let parts = sort_reduce_parts(&mut chunk, self.config.threads, &self.reduce);
            self.stats.updates_in += chunk.len() as u64;
            self.stats.chunks_sorted += 1;
            self.stats.records_after_first_reduce += parts.iter().map(|p| p.1 as u64).sum::<u64>();
            parts
        };

        let fan_in = self.layout.fan_in;
        let mut runs = std::mem::take(&mut self.runs);
        let mut first = true;
        while runs.len() > fan_in {
            let take = if first {
                (runs.len() - 2) % (fan_in - 1) + 2
            } else {
                fan_in
            };
            first = false;
            // Largest first, so the smallest `take` runs are at the end.
            runs.sort_unstable_by_key(|r| std::cmp::Reverse(r.bytes));
            let inputs = runs.split_off(runs.len() - take);
            let merged = self.merge_to_run(inputs)?;
            runs.push(merged);
        }

        // A level-L run has been through L merges; the final merge is one more.
        self.stats.merge_passes = runs.iter().map(|r| r.level + 1).max().unwrap_or(0);
        let mut inputs = self.open_runs(runs)?;
        inputs.extend(parts.iter().map(|&(pos, len)| Input::Mem {
            pos,
            end: pos + len,
        }));
        self.stats.final_merge_inputs = inputs.len();
        let merger = Merger::new(inputs, chunk, chunk_reservation)?;
        Ok(SortedRun {
            bytes_read_before: self.stats.bytes_read,
            merger: Some(merger),
            reduce: self.reduce,
            stats: self.stats,
            budget: self.budget,
            spill_dir: self.spill_dir,
        })
    }
}

/// Sorts `data` on up to `threads` threads (one contiguous part each) and reduces equal keys
/// within each part in place. Returns `(start, len)` of each part's reduced prefix.
fn sort_reduce_parts<K: Key, V: Value, F: Fn(V, V) -> V + Sync>(
    data: &mut [(K, V)],
    threads: usize,
    reduce: &F,
) -> Vec<(usize, usize)> {
    let n = data.len();
    if n == 0 {
        return Vec::new();
    }
    let parts = threads.min(n.div_ceil(MIN_PART_RECORDS)).max(1);
    let part_len = n.div_ceil(parts);
    let sort_one = |part: &mut [(K, V)]| {
        part.sort_unstable_by_key(|e| e.0);
        reduce_sorted(part, reduce)
    };
    let lens: Vec<usize> = if parts == 1 {
        vec![sort_one(data)]
    } else {
        std::thread::scope(|s| {
            let mut chunks = data.chunks_mut(part_len);
            let first = chunks.next().expect("n > 0");
            let handles: Vec<_> = chunks.map(|c| s.spawn(move || sort_one(c))).collect();
            let mut lens = vec![sort_one(first)];
            lens.extend(
                handles
                    .into_iter()
                    .map(|h| h.join().expect("sort thread panicked")),
            );
            lens
        })
    };
    lens.into_iter()
        .enumerate()
        .map(|(i, len)| (i * part_len, len))
        .collect()
}

/// Combines runs of equal keys in the sorted `data` into their first slot, moving the survivors
/// to the front. Returns how many remain.
fn reduce_sorted<K: Key, V: Value, F: Fn(V, V) -> V>(data: &mut [(K, V)], reduce: &F) -> usize {
    if data.is_empty() {
        return 0;
    }
    let mut w = 0;
    for r in 1..data.len() {
        let (key, value) = data[r];
        if key == data[w].0 {
            data[w].1 = reduce(data[w].1, value);
        } else {
            w += 1;
            data[w] = (key, value);
        }
    }
    w + 1
}

/// The result of a sort-reduce: unique keys in ascending order with their reduced values,
/// produced lazily by the final merge.
///
/// Iterate it (items are `Result<(K, V)>`; iteration stops after the first error) or call
/// [`SortedRun::next_record`]. When the last record has been read, or when the `SortedRun` is
/// dropped part-way, every buffer is released and the spill directory is removed.
pub struct SortedRun<K: Key, V: Value, F> {
    // Field order: the merger (run files) goes before the directory that holds them.
    merger: Option<Merger<K, V>>,
    reduce: F,
    stats: SortReduceStats,
    bytes_read_before: u64,
    budget: MemoryBudget,
    spill_dir: Option<Arc<SpillDir>>,
}

impl<K, V, F> SortedRun<K, V, F>
where
    K: Key,
    V: Value,
    F: Fn(V, V) -> V,
{
    /// The next key and its reduced value; `None` at the end.
    #[inline]
    pub fn next_record(&mut self) -> Result<Option<(K, V)>> {
        let Some(merger) = self.merger.as_mut() else {
            return Ok(None);
        };
        match merger.next_reduced(&self.reduce) {
            Ok(Some(item)) => {
                self.stats.records_out += 1;
                Ok(Some(item))
            }
            Ok(None) => {
                self.close();
                Ok(None)
            }
            Err(e) => {
                self.close();
                Err(e)
            }
        }
    }

    /// Releases memory and deletes every temporary file and the spill directory.
    fn close(&mut self) {
        if let Some(merger) = self.merger.take() {
            self.stats.bytes_read = self.bytes_read_before + merger.bytes_read();
        }
        self.spill_dir = None;
    }

    /// Reads everything that is left into a vector.
    pub fn into_vec(mut self) -> Result<Vec<(K, V)>> {
        let mut out = Vec::new();
        while let Some(item) = self.next_record()? {
            out.push(item);
        }
        Ok(out)
    }

    /// Calls `f` on every remaining record, then returns the final statistics.
    pub fn for_each_record(mut self, mut f: impl FnMut(K, V)) -> Result<SortReduceStats> {
        while let Some((key, value)) = self.next_record()? {
            f(key, value);
        }
        Ok(self.stats())
    }

    /// Counters so far (`records_out` and `bytes_read` grow as the run is read).
    pub fn stats(&self) -> SortReduceStats {
        let bytes_read = match &self.merger {
            Some(merger) => self.bytes_read_before + merger.bytes_read(),
            None => self.stats.bytes_read,
        };
        SortReduceStats {
            bytes_read,
            peak_reserved: self.budget.peak_reserved(),
            ..self.stats
        }
    }

    /// The budget the reducer reserved from (its peak covers the whole sort-reduce).
    pub fn memory_budget(&self) -> &MemoryBudget {
        &self.budget
    }

    /// The spill directory while it exists (`None` if nothing was spilled or after the end).
    pub fn spill_dir(&self) -> Option<&Path> {
        self.spill_dir.as_deref().map(SpillDir::path)
    }
}

impl<K, V, F> Iterator for SortedRun<K, V, F>
where
    K: Key,
    V: Value,
    F: Fn(V, V) -> V,
{
    type Item = Result<(K, V)>;

    #[inline]
    fn next(&mut self) -> Option<Self::Item> {
        self.next_record().transpose()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reduce_sorted_in_place() {
        let add = |a: u32, b: u32| a + b;
        let mut data = vec![(1u32, 1u32), (1, 2), (2, 3), (3, 1), (3, 1), (3, 1)];
        let n = reduce_sorted(&mut data, &add);
        assert_eq!(&data[..n], &[(1, 3), (2, 3), (3, 3)]);
        assert_eq!(reduce_sorted::<u32, u32, _>(&mut [], &add), 0);
        let mut one = [(7u32, 9u32)];
        assert_eq!(reduce_sorted(&mut one, &add), 1);
    }

    #[test]
    fn parts_are_sorted_reduced_and_disjoint() {
        let add = |a: u64, b: u64| a + b;
        let mut data: Vec<(u32, u64)> = (0..100_000u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) % 5000, 1))
            .collect();
        let parts = sort_reduce_parts(&mut data, 4, &add);
        assert_eq!(parts.len(), 4);
        let mut total = 0;
        for &(start, len) in &parts {
            let part = &data[start..start + len];
            assert!(part.windows(2).all(|w| w[0].0 < w[1].0));
            total += part.iter().map(|e| e.1).sum::<u64>();
        }
        assert_eq!(total, 100_000);
        // Few records: one part whatever the thread count.
        let mut small = vec![(3u32, 1u64), (1, 1), (3, 1)];
        assert_eq!(sort_reduce_parts(&mut small, 8, &add), vec![(0, 2)]);
        assert_eq!(&small[..2], &[(1, 1), (3, 2)]);
    }
}
