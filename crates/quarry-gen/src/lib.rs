//! Data generators: the Star Schema Benchmark, TPC-H (via the tpchgen crate) and the Smart SSD
//! paper's Synthetic4/16/64 tables.
//!
//! Every generator splits its table into independent *chunks*. A chunk is a pure function of
//! `(generator parameters, seed, chunk index)`, so chunks can be produced on any number of threads
//! in any order and the table is still deterministic; the caller writes each chunk to its own
//! segment, which bounds memory to roughly one chunk per worker whatever the scale factor.

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

pub mod ssb;
pub mod synthetic;
pub mod tpch;

/// Rows per chunk a generator aims for: one chunk becomes one segment (one ~1M-row row group).
pub const CHUNK_ROWS_TARGET: u64 = 1 << 20;
/// Rows per Arrow batch inside a chunk; keeps a worker's memory small.
pub const BATCH_ROWS: usize = 64 * 1024;

/// A table that can be generated chunk by chunk.
pub trait TableGenerator: Send + Sync {
    /// Table name in the warehouse (e.g. `lineorder`).
    fn name(&self) -> &str;
    /// Arrow schema of every batch (strings as `Utf8`).
    fn schema(&self) -> SchemaRef;
    /// Exact number of rows the whole table will have, when known up front (used for progress).
    fn estimated_rows(&self) -> u64;
    /// Number of chunks; chunk indexes are `0..chunk_count()`.
    fn chunk_count(&self) -> usize;
    /// The batches of chunk `index`, lazily generated, at most [`BATCH_ROWS`] rows each.
    /// Deterministic: the same generator and index always yield the same rows.
    fn chunk(&self, index: usize) -> Box<dyn Iterator<Item = RecordBatch> + Send + '_>;
    /// Columns worth a Parquet Bloom filter (high-cardinality keys that queries probe by equality).
    fn bloom_filter_columns(&self) -> Vec<String> {
        Vec::new()
    }
    /// Columns the rows are (weakly) ordered by, recorded in the manifest as the sort key.
    fn sort_key(&self) -> Vec<String> {
        Vec::new()
    }
}

/// The random stream of one chunk: a ChaCha8 generator keyed by `(seed, table)` and switched
/// to stream `chunk`.
///
/// ChaCha streams with distinct stream numbers are independent, so every chunk draws from its
/// own sequence and can be produced alone, in any order, on any thread; `table` keeps tables
/// generated from the same seed from sharing values.
pub(crate) fn chunk_rng(seed: u64, table: u64, chunk: usize) -> ChaCha8Rng {
    let mut key = [0u8; 32];
    key[..8].copy_from_slice(&seed.to_le_bytes());
    key[8..16].copy_from_slice(&table.to_le_bytes());
    let mut rng = ChaCha8Rng::from_seed(key);
    rng.set_stream(chunk as u64);
    rng
}

/// Number of chunks of at most `per_chunk` units that `units` needs (at least one, so that
/// even an empty table has a chunk to write).
pub(crate) fn chunks_for(units: u64, per_chunk: u64) -> usize {
    units.div_ceil(per_chunk.max(1)).max(1) as usize
}

/// Helpers shared by the generators' tests.
#[cfg(test)]
pub(crate) mod test_util {
    use arrow::array::{AsArray, RecordBatch};
    use arrow::compute::concat_batches;
    use arrow::datatypes::ArrowPrimitiveType;

    use crate::{BATCH_ROWS, TableGenerator};

    /// Every chunk of `table`, generated in index order (or reversed) and put back in index
    /// order, as one batch; checks each batch's schema and size on the way.
    pub fn generate_all(table: &dyn TableGenerator, reverse: bool) -> RecordBatch {
        let mut order: Vec<usize> = (0..table.chunk_count()).collect();
        if reverse {
            order.reverse();
        }
        let mut chunks: Vec<(usize, Vec<RecordBatch>)> = order.into_iter().map(|i| (i, table.chunk(i).collect())).collect();
        chunks.sort_by_key(|(i, _)| *i);
        let batches: Vec<RecordBatch> = chunks.into_iter().flat_map(|(_, b)| b).collect();
        for b in &batches {
            assert_eq!(b.schema(), table.schema(), "{}: batch schema", table.name());
            assert!(b.num_rows() <= BATCH_ROWS);
        }
        concat_batches(&table.schema(), &batches).expect("same schema")
    }

    /// The values of a primitive column.
    pub fn values<T: ArrowPrimitiveType>(batch: &RecordBatch, name: &str) -> Vec<T::Native> {
        batch.column_by_name(name).expect("column exists").as_primitive::<T>().values().to_vec()
    }
}
