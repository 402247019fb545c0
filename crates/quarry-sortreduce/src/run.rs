//! Run files and the per-reducer spill directory.
//!
//! A *run* is a sorted, reduced sequence of records written sequentially through one large
//! buffer. Layout (all integers little-endian):
//!
//! ```text
//! offset 0   8 bytes  magic "QSRTRUN1"
//! offset 8   u16      key width in bytes
//! offset 10  u16      value width in bytes
//! offset 12  u32      reserved (0)
//! offset 16  u64      record count (patched when the run is finished)
//! offset 24  records, each key bytes ++ value bytes, in ascending key order, keys unique
//! ```
//!
//! A reader checks the magic, both widths and that the file length is exactly
//! `24 + count * width`, so a truncated or foreign file is an error, never a short result.
//!
//! Files live in a per-reducer directory `<temp_dir>/quarry-sortreduce-<pid>-<n>`. Each
//! [`RunFile`] deletes its file when dropped (a merge drops its inputs as soon as it has read
//! them), and the directory is removed when the reducer and its result are gone. A process that
//! is killed cannot clean up; [`clean_stale_temp_dirs`] removes directories whose pid no longer
//! exists.

use std::fs::{self, File};
use std::io::{Read, Seek, SeekFrom, Write};
use std::marker::PhantomData;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::budget::Reservation;
use crate::codec::{Key, Value};
use crate::error::{Error, Result};

/// Prefix of every spill directory this crate creates under a temp dir.
pub const TEMP_DIR_PREFIX: &str = "quarry-sortreduce-";

const MAGIC: &[u8; 8] = b"QSRTRUN1";
/// Bytes before the first record of a run file.
pub(crate) const HEADER_BYTES: usize = 24;

/// Distinguishes the spill directories of several reducers in one process.
static NEXT_DIR: AtomicU64 = AtomicU64::new(0);

/// A per-reducer directory of run files, removed (with anything left in it) on drop.
#[derive(Debug)]
pub(crate) struct SpillDir {
    path: PathBuf,
    next_file: AtomicU64,
}

impl SpillDir {
    /// Creates `<parent>/quarry-sortreduce-<pid>-<n>` (creating `parent` if needed).
    pub(crate) fn create(parent: &Path) -> Result<Arc<SpillDir>> {
        fs::create_dir_all(parent).map_err(|e| Error::io("creating temp directory", parent, e))?;
        let pid = std::process::id();
        loop {
            let n = NEXT_DIR.fetch_add(1, Ordering::Relaxed);
            let path = parent.join(format!("{TEMP_DIR_PREFIX}{pid}-{n}"));
            match fs::create_dir(&path) {
                Ok(()) => {
                    return Ok(Arc::new(SpillDir {
                        path,
                        next_file: AtomicU64::new(0),
                    }));
                }
                // Left behind by an earlier process that had the same pid: pick another name.
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(Error::io("creating spill directory", path, e)),
            }
        }
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    fn new_file_path(&self) -> PathBuf {
        let n = self.next_file.fetch_add(1, Ordering::Relaxed);
        self.path.join(format!("run-{n:06}.bin"))
    }
}

impl Drop for SpillDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.path);
    }
}

/// Removes spill directories under `temp_dir` left by processes that no longer run.
///
/// A directory is removed when its name is `quarry-sortreduce-<pid>-<n>`, it is a real directory
/// (not a symlink), `<pid>` is not this process and `/proc/<pid>` does not exist. Where `/proc`
/// is not mounted nothing is removed (liveness cannot be told). A directory whose pid has been
/// reused by an unrelated live process stays until that process exits. Returns the number of
/// directories removed; a missing `temp_dir` is not an error.
pub fn clean_stale_temp_dirs(temp_dir: impl AsRef<Path>) -> Result<usize> {
    remove_dead_process_dirs(temp_dir.as_ref(), parse_dir_pid)
}

/// Removes the directories directly under `dir` whose name `pid_of` maps to the pid of a process
/// that no longer runs (not this process, no `/proc/<pid>`); symlinks and files are left alone.
/// Where `/proc` is not mounted nothing is removed, since liveness cannot be told. Returns the
/// number removed; a missing `dir` is not an error. Shared by every crate that names scratch
/// directories after their owner's pid.
pub fn remove_dead_process_dirs(dir: &Path, pid_of: impl Fn(&str) -> Option<u32>) -> Result<usize> {
    if !Path::new("/proc/self").exists() {
        return Ok(0);
    }
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(Error::io("listing directory", dir, e)),
    };
    let own_pid = std::process::id();
    let mut removed = 0;
    for entry in entries {
        let entry = entry.map_err(|e| Error::io("listing directory", dir, e))?;
        let Some(pid) = entry.file_name().to_str().and_then(&pid_of) else {
            continue;
        };
        if pid == own_pid || Path::new("/proc").join(pid.to_string()).exists() {
            continue;
        }
        let path = entry.path();
        if !fs::symlink_metadata(&path).is_ok_and(|m| m.is_dir()) {
            continue;
        }
        match fs::remove_dir_all(&path) {
            Ok(()) => removed += 1,
            // Another process cleaning at the same time got there first.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(Error::io("removing stale directory", path, e)),
        }
    }
    Ok(removed)
}

/// `quarry-sortreduce-<pid>-<n>` -> `pid`.
fn parse_dir_pid(name: &str) -> Option<u32> {
    let rest = name.strip_prefix(TEMP_DIR_PREFIX)?;
    let (pid, n) = rest.split_once('-')?;
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(pid) || !digits(n) {
        return None;
    }
    pid.parse().ok()
}

/// A finished run on disk. Dropping it deletes the file.
#[derive(Debug)]
pub(crate) struct RunFile {
    pub(crate) path: PathBuf,
    pub(crate) records: u64,
    /// File size including the header.
    pub(crate) bytes: u64,
    /// 0 for a run written from the in-memory chunk, 1 + the deepest input for a merged run.
    pub(crate) level: u32,
    /// Keeps the directory alive while the file exists.
    _dir: Arc<SpillDir>,
}

impl Drop for RunFile {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.path);
    }
}

/// Writes one run sequentially through a reserved buffer.
pub(crate) struct RunWriter<K, V> {
    file: File,
    buf: Vec<u8>,
    len: usize,
    /// Owns the file until `finish`, so an abandoned writer deletes what it wrote.
    run: RunFile,
    _reservation: Reservation,
    _types: PhantomData<(K, V)>,
}

impl<K: Key, V: Value> RunWriter<K, V> {
    const WIDTH: usize = K::WIDTH + V::WIDTH;

    /// A new run file in `dir`, buffered with `reservation.bytes()` bytes.
    pub(crate) fn create(
        dir: &Arc<SpillDir>,
        reservation: Reservation,
        level: u32,
    ) -> Result<Self> {
        let buf_bytes = reservation.bytes();
        assert!(
            buf_bytes >= HEADER_BYTES.max(Self::WIDTH),
            "write buffer too small"
        );
        let path = dir.new_file_path();
        let file = File::create_new(&path).map_err(|e| Error::io("creating run", &path, e))?;
        let run = RunFile {
            path,
            records: 0,
            bytes: 0,
            level,
            _dir: Arc::clone(dir),
        };
        let mut buf = vec![0u8; buf_bytes];
        buf[..8].copy_from_slice(MAGIC);
        buf[8..10].copy_from_slice(&(K::WIDTH as u16).to_le_bytes());
        buf[10..12].copy_from_slice(&(V::WIDTH as u16).to_le_bytes());
        // bytes 12..24 stay zero: reserved word and the record count, patched in `finish`.
        Ok(RunWriter {
            file,
            buf,
            len: HEADER_BYTES,
            run,
            _reservation: reservation,
            _types: PhantomData,
        })
    }

    /// Appends one record (the caller supplies keys in ascending order).
    #[inline]
    pub(crate) fn push(&mut self, key: K, value: V) -> Result<()> {
        if self.len + Self::WIDTH > self.buf.len() {
            self.flush()?;
        }
        let rec = &mut self.buf[self.len..self.len + Self::WIDTH];
        key.encode(&mut rec[..K::WIDTH]);
        value.encode(&mut rec[K::WIDTH..]);
        self.len += Self::WIDTH;
        self.run.records += 1;
        Ok(())
    }

    fn flush(&mut self) -> Result<()> {
        self.file
            .write_all(&self.buf[..self.len])
            .map_err(|e| Error::io("writing run", &self.run.path, e))?;
        self.len = 0;
        Ok(())
    }

    /// Flushes, records the count in the header and hands the file over.
    pub(crate) fn finish(mut self) -> Result<RunFile> {
        self.flush()?;
        let path = &self.run.path;
        self.file
            .seek(SeekFrom::Start(16))
            .and_then(|_| self.file.write_all(&self.run.records.to_le_bytes()))
            .map_err(|e| Error::io("writing run header", path, e))?;
        self.run.bytes = HEADER_BYTES as u64 + self.run.records * Self::WIDTH as u64;
        let RunWriter { file, run, .. } = self;
        drop(file);
        Ok(run)
    }
}

/// Streams the records of a run through a reserved buffer; deletes the file when dropped.
pub(crate) struct RunReader<K, V> {
    // Field order matters: the file is closed before `run` deletes it.
    file: File,
    buf: Vec<u8>,
    pos: usize,
    filled: usize,
    /// Records not yet loaded into `buf`.
    unread: u64,
    bytes_read: u64,
    run: RunFile,
    _reservation: Reservation,
    _types: PhantomData<(K, V)>,
}

impl<K: Key, V: Value> RunReader<K, V> {
    const WIDTH: usize = K::WIDTH + V::WIDTH;

    /// Opens `run`, buffered with `reservation.bytes()` bytes, and validates its header.
    pub(crate) fn open(run: RunFile, reservation: Reservation) -> Result<Self> {
        let buf_records = reservation.bytes() / Self::WIDTH;
        assert!(buf_records > 0, "read buffer smaller than one record");
        let path = &run.path;
        let mut file = File::open(path).map_err(|e| Error::io("opening run", path, e))?;
        let mut header = [0u8; HEADER_BYTES];
        file.read_exact(&mut header)
            .map_err(|e| Error::io("reading run header", path, e))?;
        let corrupt = |detail: String| Error::Corrupt {
            path: path.clone(),
            detail,
        };
        if &header[..8] != MAGIC {
            return Err(corrupt("bad magic".into()));
        }
        let key_width = u16::from_le_bytes([header[8], header[9]]) as usize;
        let value_width = u16::from_le_bytes([header[10], header[11]]) as usize;
        if key_width != K::WIDTH || value_width != V::WIDTH {
            return Err(corrupt(format!(
                "record layout {key_width}+{value_width} bytes, expected {}+{}",
                K::WIDTH,
                V::WIDTH
            )));
        }
        let count = u64::from_le_bytes(header[16..24].try_into().expect("8 bytes"));
        let len = file
            .metadata()
            .map_err(|e| Error::io("reading run metadata", path, e))?
            .len();
        let expected = count
            .checked_mul(Self::WIDTH as u64)
            .and_then(|n| n.checked_add(HEADER_BYTES as u64));
        if expected != Some(len) {
            return Err(corrupt(format!("{len} bytes on disk for {count} records")));
        }
        Ok(RunReader {
            file,
            buf: vec![0u8; buf_records * Self::WIDTH],
            pos: 0,
            filled: 0,
            unread: count,
            bytes_read: HEADER_BYTES as u64,
            run,
            _reservation: reservation,
            _types: PhantomData,
        })
    }

    /// The next record, or `None` at the end of the run.
    #[inline]
    pub(crate) fn next(&mut self) -> Result<Option<(K, V)>> {
        if self.pos >= self.filled && !self.refill()? {
            return Ok(None);
        }
        let rec = &self.buf[self.pos..self.pos + Self::WIDTH];
        let item = (K::decode(&rec[..K::WIDTH]), V::decode(&rec[K::WIDTH..]));
        self.pos += Self::WIDTH;
        Ok(Some(item))
    }

    #[cold]
    fn refill(&mut self) -> Result<bool> {
        if self.unread == 0 {
            return Ok(false);
        }
        let records = self.unread.min((self.buf.len() / Self::WIDTH) as u64) as usize;
        let bytes = records * Self::WIDTH;
        self.file
            .read_exact(&mut self.buf[..bytes])
            .map_err(|e| Error::io("reading run", &self.run.path, e))?;
        self.unread -= records as u64;
        self.bytes_read += bytes as u64;
        self.pos = 0;
        self.filled = bytes;
        Ok(true)
    }

    /// Bytes read from the file so far (header included).
    pub(crate) fn bytes_read(&self) -> u64 {
        self.bytes_read
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::budget::MemoryBudget;

    #[test]
    fn write_read_roundtrip_and_delete() {
        let tmp = tempfile::tempdir().unwrap();
        let budget = MemoryBudget::new(1 << 20);
        let dir = SpillDir::create(tmp.path()).unwrap();
        let dir_path = dir.path().to_path_buf();
        assert!(
            dir_path
                .file_name()
                .unwrap()
                .to_str()
                .unwrap()
                .starts_with(TEMP_DIR_PREFIX)
        );
        // A 4 KiB buffer holds 341 records of 12 bytes: 1000 records need several flushes.
        let mut writer =
            RunWriter::<u64, u32>::create(&dir, budget.try_reserve(4096).unwrap(), 0).unwrap();
        for i in 0..1000u64 {
            writer.push(i * 3, i as u32).unwrap();
        }
        let run = writer.finish().unwrap();
        assert_eq!(run.records, 1000);
        assert_eq!(run.bytes, 24 + 12 * 1000);
        assert_eq!(fs::metadata(&run.path).unwrap().len(), run.bytes);
        let path = run.path.clone();
        // A read buffer that is not a multiple of the record width.
        let mut reader =
            RunReader::<u64, u32>::open(run, budget.try_reserve(100).unwrap()).unwrap();
        for i in 0..1000u64 {
            assert_eq!(reader.next().unwrap(), Some((i * 3, i as u32)));
        }
        assert_eq!(reader.next().unwrap(), None);
        assert_eq!(reader.next().unwrap(), None);
        assert_eq!(reader.bytes_read(), 24 + 12 * 1000);
        drop(reader);
        assert!(!path.exists());
        assert_eq!(budget.reserved(), 0);
        drop(dir);
        assert!(!dir_path.exists());
    }

    #[test]
    fn truncated_or_mismatched_runs_are_errors() {
        let tmp = tempfile::tempdir().unwrap();
        let budget = MemoryBudget::new(1 << 20);
        let dir = SpillDir::create(tmp.path()).unwrap();
        let mut writer =
            RunWriter::<u32, u32>::create(&dir, budget.try_reserve(4096).unwrap(), 0).unwrap();
        for i in 0..10 {
            writer.push(i, i).unwrap();
        }
        let run = writer.finish().unwrap();
        let path = run.path.clone();
        let file = fs::OpenOptions::new().write(true).open(&path).unwrap();
        file.set_len(24 + 8 * 9 + 3).unwrap();
        let err = RunReader::<u32, u32>::open(run, budget.try_reserve(4096).unwrap())
            .err()
            .unwrap();
        assert!(matches!(err, Error::Corrupt { .. }), "{err}");
        assert!(err.to_string().contains("corrupt run file"), "{err}");
        // The failed open dropped the run, which deleted the file.
        assert!(!path.exists());

        let mut writer =
            RunWriter::<u32, u32>::create(&dir, budget.try_reserve(4096).unwrap(), 0).unwrap();
        writer.push(1, 1).unwrap();
        let run = writer.finish().unwrap();
        let err = RunReader::<u64, u32>::open(run, budget.try_reserve(4096).unwrap())
            .err()
            .unwrap();
        assert!(err.to_string().contains("record layout 4+4"), "{err}");
    }

    #[test]
    fn abandoned_writer_deletes_its_file() {
        let tmp = tempfile::tempdir().unwrap();
        let budget = MemoryBudget::new(1 << 20);
        let dir = SpillDir::create(tmp.path()).unwrap();
        let mut writer =
            RunWriter::<u32, ()>::create(&dir, budget.try_reserve(4096).unwrap(), 0).unwrap();
        writer.push(5, ()).unwrap();
        drop(writer);
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn parse_dir_names() {
        assert_eq!(parse_dir_pid("quarry-sortreduce-123-0"), Some(123));
        assert_eq!(parse_dir_pid("quarry-sortreduce-123-"), None);
        assert_eq!(parse_dir_pid("quarry-sortreduce-abc-1"), None);
        assert_eq!(parse_dir_pid("quarry-sortreduce-12-3-4"), None);
        assert_eq!(parse_dir_pid("other-123-0"), None);
    }

    /// The pid of a child that has exited and been reaped.
    fn dead_pid() -> u32 {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        pid
    }

    #[test]
    fn clean_stale_removes_only_dead_processes_dirs() {
        let tmp = tempfile::tempdir().unwrap();
        let dead = dead_pid();
        let stale = tmp.path().join(format!("{TEMP_DIR_PREFIX}{dead}-7"));
        fs::create_dir(&stale).unwrap();
        fs::write(stale.join("run-000000.bin"), b"junk").unwrap();
        let own = SpillDir::create(tmp.path()).unwrap();
        let unrelated = tmp.path().join("quarry-sortreduce-notapid");
        fs::create_dir(&unrelated).unwrap();
        let stale_file = tmp.path().join(format!("{TEMP_DIR_PREFIX}{dead}-8"));
        fs::write(&stale_file, b"a file, not a directory").unwrap();
        // pid 1 always exists.
        let live = tmp.path().join(format!("{TEMP_DIR_PREFIX}1-0"));
        fs::create_dir(&live).unwrap();

        assert_eq!(clean_stale_temp_dirs(tmp.path()).unwrap(), 1);
        assert!(!stale.exists());
        assert!(own.path().exists());
        assert!(unrelated.exists());
        assert!(stale_file.exists());
        assert!(live.exists());
        assert_eq!(
            clean_stale_temp_dirs(tmp.path().join("missing")).unwrap(),
            0
        );
    }
}
