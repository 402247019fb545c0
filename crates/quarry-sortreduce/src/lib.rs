//! Sort-reduce: GraFBoost's method for turning a stream of fine-grained random updates into one
//! sequential pass (Jun 2018, ch. 9, sec. 9.3-9.6, Algorithm 2).
//!
//! # The problem
//!
//! A vertex program's superstep produces updates `(k, v)` meaning `x[k] = f(x[k], v)` for an
//! array `x` far larger than memory, with keys in no useful order (Algorithm 1). Applied
//! directly they are random read-modify-writes; sort-reduce sorts them by key so the array is
//! updated in one sequential sweep, and because `f` is associative it also *reduces* equal keys
//! at every sorting step, so each step moves less data than the one before (Algorithm 3: the
//! result is `newV`, one value per updated vertex).
//!
//! # The algorithm here (GraFSoft's software sort-reduce, sec. 9.6)
//!
//! 1. **In-memory sort-reduce.** Updates fill a chunk sized from the memory budget. A full chunk
//!    is split into one part per thread; every part is sorted (`sort_unstable_by_key`) and reduced
//!    in place (adjacent equal keys are combined) on its own thread. The parts are then merged
//!    and reduced once more while being written, sequentially through one large buffer, as a
//!    *run* file of fixed-width little-endian records (see [`SortReducer`]).
//! 2. **External merge-reduce.** When `finish` is called the last chunk is sort-reduced but
//!    stays in memory. While more run files exist than one merge may take (the fan-in, 16 by
//!    default as in the paper), the smallest runs are merged `fan_in` ways into a new run,
//!    reducing equal keys as they leave the merger, and the inputs are deleted. The first such
//!    merge takes just enough runs that all later merges are full (the optimal merge pattern).
//! 3. **Final merge.** The remaining runs and the last chunk's in-memory parts are merged by a
//!    [`SortedRun`] that streams unique keys with their reduced values to the caller without
//!    writing one more file.
//!
//! The merger is a loser tree; it reduces every key as it
//! leaves the tree, so a key's values are combined across all inputs before it is emitted.
//!
//! # Memory
//!
//! Every buffer (the chunk, each read buffer, the write buffer) is reserved from a
//! [`MemoryBudget`] before it is allocated. The budget is split once, up front: at most half
//! for `(fan_in + 1)` I/O buffers (1 MiB each by default; smaller, down to 64 KiB, or a smaller
//! effective fan-in when the budget is small), the rest for the chunk. That split lets the last
//! chunk stay in memory through every merge, saving one write and one read of it.
//! [`MemoryBudget::peak_reserved`] never exceeds the budget.
//!
//! # Temporary files
//!
//! Runs are written under `<temp_dir>/quarry-sortreduce-<pid>-<n>/`, one directory per
//! reducer, created at the first spill. Each run file is deleted as soon as the merge that read
//! it is done (the final merge deletes each input when it is exhausted), and the directory is
//! removed once the result has been read or dropped, or when a reducer is dropped unfinished.
//! [`clean_stale_temp_dirs`] removes directories left by killed processes.
//!
//! # Errata of the paper, and how they are resolved
//!
//! - *"Flushes without comparison when one input ends"* (sec. 7.2.2) is unsafe: the merge
//!   tree here treats an exhausted input as +infinity and keeps comparing, ending only when every
//!   input is exhausted, so no input is ever drained without comparison.
//! - *`vertex_update` must be associative, and with parallel ingestion also commutative.* The
//!   reduce function is applied in an order that depends on the unstable sort, on how the chunk
//!   was split between threads and on which runs are merged together, so it must be associative
//!   **and** commutative. Integer sums, `min`, `max`, bitwise or are exact and independent of the
//!   configuration; floating-point sums can differ in the last bits between thread counts or
//!   budgets (they are repeatable for the same input and configuration).
//!
//! # Example
//!
//! ```
//! use quarry_sortreduce::{SortReduceConfig, SortReducer};
//!
//! # fn main() -> quarry_sortreduce::Result<()> {
//! let config = SortReduceConfig::new(64 << 20).with_temp_dir(std::env::temp_dir());
//! let mut reducer = SortReducer::new(config, |a: u64, b: u64| a + b)?;
//! for (dst, contribution) in [(7u32, 1u64), (3, 2), (7, 5)] {
//!     reducer.push(dst, contribution)?;
//! }
//! let result = reducer.finish()?.into_vec()?;
//! assert_eq!(result, vec![(3, 2), (7, 6)]);
//! # Ok(())
//! # }
//! ```

mod budget;
mod codec;
mod config;
mod error;
mod merge;
mod reducer;
mod run;

pub use budget::{MemoryBudget, Reservation};
pub use codec::{Key, Value};
pub use config::{
    DEFAULT_FAN_IN, DEFAULT_IO_BUFFER_BYTES, DEFAULT_MEMORY_BUDGET_BYTES, MIN_IO_BUFFER_BYTES,
    MIN_MEMORY_BUDGET_BYTES, PREFERRED_MIN_IO_BUFFER_BYTES, SortReduceConfig,
};
pub use error::{Error, Result};
pub use reducer::{SortReduceStats, SortReducer, SortedRun};
pub use run::{TEMP_DIR_PREFIX, clean_stale_temp_dirs, remove_dead_process_dirs};
