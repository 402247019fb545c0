//! File primitives shared by the graph files, the import, and the engine's value file and active
//! lists: forward-only buffered positional reads, counted buffered writes, a one-block cache over
//! a dense array of fixed-width values, self-removing temporary directories and fsync helpers.
//!
//! Every reader and writer here owns exactly one buffer whose size the caller chooses (the
//! engine and the import carve these buffers out of their memory budget), and counts the bytes
//! it moves so supersteps can report their I/O.

use std::fs::{self, File, OpenOptions};
use std::io::{BufWriter, Write};
use std::marker::PhantomData;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use quarry_sortreduce::Value;

use crate::error::{Error, Result};

/// Prefix of every temporary or staging directory this crate creates.
///
/// Engine scratch directories are `<temp_dir>/quarry-graph-<pid>-<n>`; import staging
/// directories are `<parent of the graph>/.quarry-graph-<pid>-<n>.staging`; an overwritten
/// graph is briefly `<parent>/.quarry-graph-<pid>-<n>.old`. [`clean_stale_temp_dirs`] removes
/// any of them whose process is gone.
pub const TEMP_DIR_PREFIX: &str = "quarry-graph-";

static NEXT_NAME: AtomicU64 = AtomicU64::new(0);

/// `quarry-graph-<pid>-<n>`, unique within this process.
pub(crate) fn unique_name() -> String {
    let n = NEXT_NAME.fetch_add(1, Ordering::Relaxed);
    format!("{TEMP_DIR_PREFIX}{}-{n}", std::process::id())
}

/// A scratch directory removed, with everything in it, when the last handle is dropped.
#[derive(Debug)]
pub(crate) struct TempDir {
    path: PathBuf,
}

impl TempDir {
    /// Creates `<parent>/quarry-graph-<pid>-<n>` (and `parent` if needed).
    pub(crate) fn create(parent: &Path) -> Result<Arc<TempDir>> {
        fs::create_dir_all(parent).map_err(|e| Error::io("creating temp directory", parent, e))?;
        loop {
            let path = parent.join(unique_name());
            match fs::create_dir(&path) {
                Ok(()) => return Ok(Arc::new(TempDir { path })),
                // Left by an earlier process with the same pid: take the next name.
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(Error::io("creating temp directory", path, e)),
            }
        }
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.path);
    }
}

/// Removes directories under `dir` left by killed processes: engine scratch directories
/// (`quarry-graph-<pid>-<n>`) and import staging or replaced-graph directories
/// (`.quarry-graph-<pid>-<n>.staging`, `.quarry-graph-<pid>-<n>.old`), also inside a graph
/// directory (an interrupted [`Graph::build_reverse`](crate::Graph::build_reverse) leaves
/// `.quarry-graph-<pid>-<n>.reverse` there).
///
/// A directory is removed only when its pid is not this process and `/proc/<pid>` does not
/// exist; where `/proc` is not mounted nothing is removed. Returns how many were removed; a
/// missing `dir` is not an error.
pub fn clean_stale_temp_dirs(dir: impl AsRef<Path>) -> Result<usize> {
    Ok(quarry_sortreduce::remove_dead_process_dirs(dir.as_ref(), parse_pid)?)
}

/// `[.]quarry-graph-<pid>-<n>[.<suffix>]` -> pid.
fn parse_pid(name: &str) -> Option<u32> {
    let name = name.strip_prefix('.').unwrap_or(name);
    let rest = name.strip_prefix(TEMP_DIR_PREFIX)?;
    let rest = rest.split('.').next()?;
    let (pid, n) = rest.split_once('-')?;
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(pid) || !digits(n) {
        return None;
    }
    pid.parse().ok()
}

/// fsyncs a directory so that renames and creations inside it are durable.
pub(crate) fn sync_dir(path: &Path) -> Result<()> {
    File::open(path)
        .and_then(|d| d.sync_all())
        .map_err(|e| Error::io("syncing directory", path, e))
}

/// The smallest read: one page. Sparse accesses (a BFS frontier of a few vertices) read this
/// much per jump instead of a whole buffer.
pub(crate) const MIN_READ_BYTES: usize = 4 << 10;

/// Reads a file front to back by positional reads into one buffer.
///
/// Requests must (for efficiency, not correctness) come in ascending offset order: a request
/// that is not inside the buffer refills it starting at the requested offset. The refill size
/// adapts like an OS readahead window: it doubles (up to the buffer size) while requests
/// continue where the buffer ends, and drops to [`MIN_READ_BYTES`] after a jump. A dense sweep
/// thus reads in whole buffers, a sparse one a page per gap.
#[derive(Debug)]
pub(crate) struct ForwardReader {
    file: File,
    path: PathBuf,
    buf: Vec<u8>,
    /// File offset of `buf[0]`.
    start: u64,
    /// Valid bytes in `buf`.
    len: usize,
    /// Current refill size.
    window: usize,
    file_len: u64,
    bytes_read: u64,
}

impl ForwardReader {
    pub(crate) fn open(path: &Path, capacity: usize) -> Result<Self> {
        let file = File::open(path).map_err(|e| Error::io("opening", path, e))?;
        let file_len = file
            .metadata()
            .map_err(|e| Error::io("reading metadata of", path, e))?
            .len();
        Ok(ForwardReader {
            file,
            path: path.to_path_buf(),
            buf: vec![0; capacity.max(16)],
            start: 0,
            len: 0,
            window: MIN_READ_BYTES / 2,
            file_len,
            bytes_read: 0,
        })
    }

    /// Largest request [`Self::slice`] accepts.
    pub(crate) fn capacity(&self) -> usize {
        self.buf.len()
    }

    pub(crate) fn file_len(&self) -> u64 {
        self.file_len
    }

    pub(crate) fn bytes_read(&self) -> u64 {
        self.bytes_read
    }

    /// The bytes `[offset, offset + len)`; `len` must not exceed [`Self::capacity`].
    pub(crate) fn slice(&mut self, offset: u64, len: usize) -> Result<&[u8]> {
        debug_assert!(len <= self.buf.len());
        let end = offset + len as u64;
        if offset < self.start || end > self.start + self.len as u64 {
            if end > self.file_len {
                return Err(Error::corrupt(
                    &self.path,
                    format!(
                        "needs bytes up to {end} but the file has {} bytes",
                        self.file_len
                    ),
                ));
            }
            let buffered_end = self.start + self.len as u64;
            let continues = self.len > 0 && offset >= self.start && offset <= buffered_end;
            self.window = if continues {
                (self.window * 2).min(self.buf.len())
            } else {
                MIN_READ_BYTES.min(self.buf.len())
            };
            let want = self.window.max(len) as u64;
            let n = want.min(self.file_len - offset) as usize;
            self.file
                .read_exact_at(&mut self.buf[..n], offset)
                .map_err(|e| Error::io("reading", &self.path, e))?;
            self.bytes_read += n as u64;
            self.start = offset;
            self.len = n;
        }
        let from = (offset - self.start) as usize;
        Ok(&self.buf[from..from + len])
    }

    /// Little-endian u64 at `offset`.
    #[cfg(test)]
    pub(crate) fn u64_at(&mut self, offset: u64) -> Result<u64> {
        let b = self.slice(offset, 8)?;
        Ok(u64::from_le_bytes(b.try_into().expect("8 bytes")))
    }
}

/// A buffered, counted writer of a new file.
#[derive(Debug)]
pub(crate) struct RecordWriter {
    out: BufWriter<File>,
    path: PathBuf,
    bytes: u64,
}

impl RecordWriter {
    pub(crate) fn create(path: &Path, capacity: usize) -> Result<Self> {
        let file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(path)
            .map_err(|e| Error::io("creating", path, e))?;
        Ok(RecordWriter {
            out: BufWriter::with_capacity(capacity.max(16), file),
            path: path.to_path_buf(),
            bytes: 0,
        })
    }

    #[inline]
    pub(crate) fn write(&mut self, bytes: &[u8]) -> Result<()> {
        self.bytes += bytes.len() as u64;
        self.out
            .write_all(bytes)
            .map_err(|e| Error::io("writing", &self.path, e))
    }

    /// Flushes; with `sync`, also fsyncs the file (graph files are synced, scratch files not).
    pub(crate) fn finish(self, sync: bool) -> Result<u64> {
        let file = self
            .out
            .into_inner()
            .map_err(|e| Error::io("writing", &self.path, e.into_error()))?;
        if sync {
            file.sync_all()
                .map_err(|e| Error::io("syncing", &self.path, e))?;
        }
        Ok(self.bytes)
    }
}

/// A dense on-disk array of `count` fixed-width values with a one-block cache.
///
/// Accesses in ascending index order touch every block at most once (the engine's accesses are
/// always in key order, which is the point of sort-reduce). Like [`ForwardReader`], the block
/// loaded grows while accesses continue where the last one ended and shrinks to a page after a
/// jump, and only the modified range of a block is written back (when the cache moves on and on
/// [`Self::flush`]): a sparse update touches a page, not a whole buffer.
#[derive(Debug)]
pub(crate) struct ValueStore<V> {
    file: File,
    path: PathBuf,
    count: u64,
    block: Vec<u8>,
    /// Values the buffer holds at most.
    per_block: u64,
    /// Values per page: the load size after a jump, and the load alignment.
    per_page: u64,
    /// Values the next load reads (adapts between `per_page` and `per_block`).
    window: u64,
    /// First index held by `block`, or `u64::MAX` when nothing is loaded.
    block_first: u64,
    block_items: u64,
    /// Modified range `[lo, hi)` of the block, relative to `block_first`.
    dirty: Option<(u64, u64)>,
    bytes_read: u64,
    bytes_written: u64,
    _values: PhantomData<V>,
}

impl<V: Value> ValueStore<V> {
    /// Creates the file with `init(i)` at every index, written sequentially.
    pub(crate) fn create(
        path: &Path,
        count: u64,
        block_bytes: usize,
        mut init: impl FnMut(u64) -> V,
    ) -> Result<Self> {
        assert!(V::WIDTH > 0, "vertex values must have a non-zero width");
        let mut writer = RecordWriter::create(path, block_bytes)?;
        let mut buf = vec![0u8; V::WIDTH];
        for i in 0..count {
            init(i).encode(&mut buf);
            writer.write(&buf)?;
        }
        let written = writer.finish(false)?;
        let mut store = Self::open(path, count, block_bytes, true)?;
        store.bytes_written = written;
        Ok(store)
    }

    /// Opens an existing file of `count` values.
    pub(crate) fn open(path: &Path, count: u64, block_bytes: usize, write: bool) -> Result<Self> {
        let file = OpenOptions::new()
            .read(true)
            .write(write)
            .open(path)
            .map_err(|e| Error::io("opening", path, e))?;
        let len = file
            .metadata()
            .map_err(|e| Error::io("reading metadata of", path, e))?
            .len();
        if len != count * V::WIDTH as u64 {
            return Err(Error::corrupt(
                path,
                format!("{len} bytes, expected {count} values of {} bytes", V::WIDTH),
            ));
        }
        let per_block = (block_bytes / V::WIDTH).max(1) as u64;
        let per_page = ((MIN_READ_BYTES / V::WIDTH).max(1) as u64).min(per_block);
        Ok(ValueStore {
            file,
            path: path.to_path_buf(),
            count,
            block: vec![0; per_block as usize * V::WIDTH],
            per_block,
            per_page,
            window: per_page,
            block_first: u64::MAX,
            block_items: 0,
            dirty: None,
            bytes_read: 0,
            bytes_written: 0,
            _values: PhantomData,
        })
    }

    pub(crate) fn count(&self) -> u64 {
        self.count
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    pub(crate) fn bytes_read(&self) -> u64 {
        self.bytes_read
    }

    pub(crate) fn bytes_written(&self) -> u64 {
        self.bytes_written
    }

    /// Loads a block holding `index` (writing back the current one's changes); returns the
    /// index's position in the block.
    #[inline]
    fn load(&mut self, index: u64) -> Result<u64> {
        if index >= self.count {
            return Err(Error::corrupt(
                &self.path,
                format!("vertex {index} is beyond the {} vertices", self.count),
            ));
        }
        let loaded = self.block_first != u64::MAX;
        if loaded && index >= self.block_first && index < self.block_first + self.block_items {
            return Ok(index - self.block_first);
        }
        self.flush()?;
        let first = index - index % self.per_page;
        let continues =
            loaded && first >= self.block_first && first <= self.block_first + self.block_items;
        self.window = if continues {
            (self.window * 2).min(self.per_block)
        } else {
            self.per_page
        };
        // `index - first < per_page <= window`, so the block holds `index`.
        let items = self.window.min(self.count - first);
        let bytes = items as usize * V::WIDTH;
        self.file
            .read_exact_at(&mut self.block[..bytes], first * V::WIDTH as u64)
            .map_err(|e| Error::io("reading", &self.path, e))?;
        self.bytes_read += bytes as u64;
        self.block_first = first;
        self.block_items = items;
        Ok(index - first)
    }

    #[inline]
    pub(crate) fn get(&mut self, index: u64) -> Result<V> {
        let at = self.load(index)? as usize * V::WIDTH;
        Ok(V::decode(&self.block[at..at + V::WIDTH]))
    }

    #[inline]
    pub(crate) fn set(&mut self, index: u64, value: V) -> Result<()> {
        let slot = self.load(index)?;
        let at = slot as usize * V::WIDTH;
        value.encode(&mut self.block[at..at + V::WIDTH]);
        self.dirty = Some(match self.dirty {
            Some((lo, hi)) => (lo.min(slot), hi.max(slot + 1)),
            None => (slot, slot + 1),
        });
        Ok(())
    }

    /// Writes the modified range of the cached block back.
    pub(crate) fn flush(&mut self) -> Result<()> {
        if let Some((lo, hi)) = self.dirty.take() {
            let bytes = &self.block[lo as usize * V::WIDTH..hi as usize * V::WIDTH];
            self.file
                .write_all_at(bytes, (self.block_first + lo) * V::WIDTH as u64)
                .map_err(|e| Error::io("writing", &self.path, e))?;
            self.bytes_written += bytes.len() as u64;
        }
        Ok(())
    }
}

/// How a memory budget is split between fixed I/O buffers and a sort-reducer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct MemoryPlan {
    /// Bytes of each file buffer.
    pub(crate) io_buffer: usize,
    /// Bytes of all file buffers (and any extra reservation) together.
    pub(crate) buffer_bytes: usize,
    /// Budget handed to the sort-reducer.
    pub(crate) sort_reduce_bytes: usize,
}

/// Smallest and largest file buffer.
const MIN_IO_BUFFER: usize = 4 << 10;
const MAX_IO_BUFFER: usize = 1 << 20;

/// Splits `memory_bytes` into `buffers` file buffers of `memory_bytes / 32` (4 KiB to 1 MiB
/// each, so a handful of them never take more than a fraction of the budget), `extra` bytes
/// the caller needs for itself, and the rest for the sort-reducer.
pub(crate) fn plan_memory(memory_bytes: usize, buffers: usize, extra: usize) -> Result<MemoryPlan> {
    let io_buffer = (memory_bytes / 32).clamp(MIN_IO_BUFFER, MAX_IO_BUFFER);
    let buffer_bytes = buffers * io_buffer + extra;
    let needed = buffer_bytes + quarry_sortreduce::MIN_MEMORY_BUDGET_BYTES;
    if memory_bytes < needed {
        return Err(Error::invalid(format!(
            "memory budget of {memory_bytes} bytes is too small: at least {needed} bytes are needed"
        )));
    }
    Ok(MemoryPlan {
        io_buffer,
        buffer_bytes,
        sort_reduce_bytes: memory_bytes - buffer_bytes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pid_names() {
        assert_eq!(parse_pid("quarry-graph-12-3"), Some(12));
        assert_eq!(parse_pid(".quarry-graph-12-3.staging"), Some(12));
        assert_eq!(parse_pid(".quarry-graph-7-0.old"), Some(7));
        assert_eq!(parse_pid("quarry-graph-x-3"), None);
        assert_eq!(parse_pid("quarry-graph-12"), None);
        assert_eq!(parse_pid("graph"), None);
    }

    #[test]
    fn stale_directories_of_dead_processes_are_removed() {
        let dir = tempfile::tempdir().unwrap();
        // No process has a pid this large (pid_max is at most 2^22).
        let dead = dir.path().join(".quarry-graph-4000000000-1.staging");
        let live = dir.path().join(unique_name());
        let other = dir.path().join("quarry-graph-data");
        for d in [&dead, &live, &other] {
            fs::create_dir(d).unwrap();
        }
        fs::write(dead.join("out.edges"), b"partial").unwrap();
        assert_eq!(clean_stale_temp_dirs(dir.path()).unwrap(), 1);
        assert!(!dead.exists() && live.exists() && other.exists());
        assert_eq!(
            clean_stale_temp_dirs(dir.path().join("missing")).unwrap(),
            0
        );
    }

    #[test]
    fn value_store_blocks_and_forward_reader() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("values");
        let mut store = ValueStore::<u64>::create(&path, 1000, 64, |i| i * 3).unwrap();
        for i in (0..1000).step_by(7) {
            assert_eq!(store.get(i).unwrap(), i * 3);
            store.set(i, i + 1).unwrap();
        }
        store.set(999, 5).unwrap();
        // Going backwards works too (it only costs reloads).
        assert_eq!(store.get(0).unwrap(), 1);
        store.flush().unwrap();
        assert!(store.get(1000).is_err());
        let mut reader = ForwardReader::open(&path, 80).unwrap();
        for i in 0..1000u64 {
            let expected = if i == 999 {
                5
            } else if i % 7 == 0 {
                i + 1
            } else {
                i * 3
            };
            assert_eq!(reader.u64_at(i * 8).unwrap(), expected);
        }
        assert!(reader.slice(7999, 2).is_err());
        assert!(ValueStore::<u32>::open(&path, 1000, 64, false).is_err());
    }
}
