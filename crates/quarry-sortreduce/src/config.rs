//! Configuration and the memory layout derived from it.

use std::path::PathBuf;

use crate::error::{Error, Result};
use crate::run::HEADER_BYTES;

/// Default memory budget: 512 MiB, GraFSoft's default in-memory buffer per sort-reducer.
pub const DEFAULT_MEMORY_BUDGET_BYTES: usize = 512 << 20;
/// Default merge fan-in: 16, as in GraFBoost's hardware and software mergers.
pub const DEFAULT_FAN_IN: usize = 16;
/// Default size of each run's read buffer and of the write buffer: 1 MiB.
pub const DEFAULT_IO_BUFFER_BYTES: usize = 1 << 20;
/// The size below which buffers are not shrunk to keep the full fan-in (the effective fan-in is
/// reduced instead), unless `io_buffer_bytes` asks for smaller buffers.
pub const PREFERRED_MIN_IO_BUFFER_BYTES: usize = 64 << 10;
/// The smallest I/O buffer ever used (and the smallest `io_buffer_bytes` accepted).
pub const MIN_IO_BUFFER_BYTES: usize = 4 << 10;
/// The smallest memory budget accepted.
pub const MIN_MEMORY_BUDGET_BYTES: usize = 32 << 10;

/// How a [`SortReducer`](crate::SortReducer) may use memory, threads and disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SortReduceConfig {
    /// Upper bound of the bytes the reducer reserves at any time (see [`crate::MemoryBudget`]).
    pub memory_budget_bytes: usize,
    /// The most run files merged at once (at least 2). Reduced automatically when the read buffers
    /// of that many runs would not fit in the budget.
    pub fan_in: usize,
    /// Threads used to sort and reduce each in-memory chunk (at least 1).
    pub threads: usize,
    /// Parent of the per-reducer spill directory.
    pub temp_dir: PathBuf,
    /// Preferred size of each read buffer and of the write buffer (at least 4 KiB).
    pub io_buffer_bytes: usize,
}

impl Default for SortReduceConfig {
    fn default() -> Self {
        SortReduceConfig {
            memory_budget_bytes: DEFAULT_MEMORY_BUDGET_BYTES,
            fan_in: DEFAULT_FAN_IN,
            threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
            temp_dir: std::env::temp_dir(),
            io_buffer_bytes: DEFAULT_IO_BUFFER_BYTES,
        }
    }
}

impl SortReduceConfig {
    /// The defaults with the given memory budget.
    pub fn new(memory_budget_bytes: usize) -> Self {
        SortReduceConfig {
            memory_budget_bytes,
            ..Self::default()
        }
    }

    /// Sets [`Self::fan_in`].
    pub fn with_fan_in(mut self, fan_in: usize) -> Self {
        self.fan_in = fan_in;
        self
    }

    /// Sets [`Self::threads`].
    pub fn with_threads(mut self, threads: usize) -> Self {
        self.threads = threads;
        self
    }

    /// Sets [`Self::temp_dir`].
    pub fn with_temp_dir(mut self, temp_dir: impl Into<PathBuf>) -> Self {
        self.temp_dir = temp_dir.into();
        self
    }

    /// Sets [`Self::io_buffer_bytes`].
    pub fn with_io_buffer_bytes(mut self, bytes: usize) -> Self {
        self.io_buffer_bytes = bytes;
        self
    }
}

/// How the budget is split.
///
/// `(fan_in + 1) * io_buffer` bytes (at most half the budget) are set aside for I/O buffers: the
/// write buffer while spilling, `fan_in` read buffers plus one write buffer during an intermediate
/// merge, up to `fan_in` read buffers during the final merge. The rest holds the in-memory chunk,
/// which therefore can stay allocated through every merge: the last chunk is never written to disk
/// but joins the final merge from memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Layout {
    /// Effective fan-in (≤ the configured one).
    pub(crate) fan_in: usize,
    /// Bytes of each read buffer and of the write buffer.
    pub(crate) io_buffer: usize,
    /// Records the in-memory chunk holds.
    pub(crate) chunk_records: usize,
    /// Bytes reserved for the chunk.
    pub(crate) chunk_bytes: usize,
}

impl Layout {
    /// Validates `config` and splits its budget for records of `record_width` bytes on disk and
    /// `mem_record_bytes` bytes in memory.
    pub(crate) fn plan(
        config: &SortReduceConfig,
        record_width: usize,
        mem_record_bytes: usize,
    ) -> Result<Layout> {
        let budget = config.memory_budget_bytes;
        if config.fan_in < 2 {
            return Err(Error::Config(format!(
                "fan-in {} is below 2",
                config.fan_in
            )));
        }
        if config.threads == 0 {
            return Err(Error::Config("threads must be at least 1".into()));
        }
        if config.io_buffer_bytes < MIN_IO_BUFFER_BYTES {
            return Err(Error::Config(format!(
                "io_buffer_bytes {} is below {MIN_IO_BUFFER_BYTES}",
                config.io_buffer_bytes
            )));
        }
        if budget < MIN_MEMORY_BUDGET_BYTES {
            return Err(Error::Config(format!(
                "memory budget {budget} bytes is below {MIN_MEMORY_BUDGET_BYTES}"
            )));
        }
        let io_share = budget / 2;
        let floor = PREFERRED_MIN_IO_BUFFER_BYTES.min(config.io_buffer_bytes);
        let mut fan_in = config.fan_in;
        let mut io_buffer = config.io_buffer_bytes.min(io_share / (fan_in + 1));
        if io_buffer < floor {
            // Keep buffers useful: fewer runs per merge rather than tiny reads.
            io_buffer = floor;
            fan_in = fan_in.min((io_share / io_buffer).saturating_sub(1));
            if fan_in < 2 {
                fan_in = 2;
                io_buffer = io_share / 3;
            }
        }
        if io_buffer < MIN_IO_BUFFER_BYTES {
            return Err(Error::Config(format!(
                "memory budget {budget} bytes leaves {io_buffer}-byte I/O buffers"
            )));
        }
        // Whole records per buffer (the header must fit in a write buffer too).
        io_buffer -= io_buffer % record_width;
        if io_buffer < HEADER_BYTES.max(record_width) {
            return Err(Error::Config(format!(
                "{record_width}-byte records are too wide"
            )));
        }
        let chunk_records = (budget - (fan_in + 1) * io_buffer) / mem_record_bytes.max(1);
        Ok(Layout {
            fan_in,
            io_buffer,
            chunk_records,
            chunk_bytes: chunk_records * mem_record_bytes,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn large_budget_keeps_fan_in_and_buffers() {
        let config = SortReduceConfig::new(1 << 30);
        let layout = Layout::plan(&config, 16, 16).unwrap();
        assert_eq!(layout.fan_in, 16);
        assert_eq!(layout.io_buffer, 1 << 20);
        assert_eq!(layout.chunk_bytes, (1 << 30) - 17 * (1 << 20));
        assert_eq!(layout.chunk_records, layout.chunk_bytes / 16);
    }

    #[test]
    fn small_budget_shrinks_buffers_then_fan_in() {
        // 4 MiB: 2 MiB / 17 = 123 KiB buffers, still above the 64 KiB floor.
        let layout = Layout::plan(&SortReduceConfig::new(4 << 20), 12, 16).unwrap();
        assert_eq!(layout.fan_in, 16);
        assert!(layout.io_buffer >= 64 << 10 && layout.io_buffer.is_multiple_of(12));
        // 1 MiB: buffers stay at 64 KiB and the fan-in drops to 512 KiB / 64 KiB - 1 = 7.
        let layout = Layout::plan(&SortReduceConfig::new(1 << 20), 16, 16).unwrap();
        assert_eq!((layout.fan_in, layout.io_buffer), (7, 64 << 10));
        // Explicitly small buffers keep the fan-in.
        let config = SortReduceConfig::new(256 << 10).with_io_buffer_bytes(4096);
        let layout = Layout::plan(&config, 8, 8).unwrap();
        assert_eq!((layout.fan_in, layout.io_buffer), (16, 4096));
        for budget in [32 << 10, 100_000, 1 << 20, 3 << 20, 1 << 30] {
            for fan_in in [2, 3, 16, 64, 1000] {
                let config = SortReduceConfig::new(budget).with_fan_in(fan_in);
                let l = Layout::plan(&config, 12, 16).unwrap();
                assert!(l.fan_in >= 2 && l.fan_in <= fan_in);
                assert!(l.chunk_bytes + (l.fan_in + 1) * l.io_buffer <= budget);
                assert!(l.chunk_records * 16 >= budget / 2 - 16);
            }
        }
    }

    #[test]
    fn invalid_configs_are_rejected() {
        let plan = |c: SortReduceConfig| Layout::plan(&c, 8, 8).unwrap_err().to_string();
        assert!(plan(SortReduceConfig::new(1 << 20).with_fan_in(1)).contains("fan-in 1"));
        assert!(plan(SortReduceConfig::new(1 << 20).with_threads(0)).contains("threads"));
        assert!(plan(SortReduceConfig::new(1000)).contains("below"));
        assert!(
            plan(SortReduceConfig::new(1 << 20).with_io_buffer_bytes(100)).contains("io_buffer")
        );
    }
}
