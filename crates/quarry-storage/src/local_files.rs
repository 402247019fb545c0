//! Reads of the node's local files for `ThrottledStore`: object_store's `LocalFileSystem`, but
//! with ranged reads that copy less. `LocalFileSystem` zeroes each buffer before reading into
//! it; on a scan of cached segments that zeroing was nearly as large as the kernel's copy (perf,
//! SSB q1.1 at SF 10: `memset` 3.5% of the samples, `_copy_to_iter` 5%). Here a short range is
//! read into a buffer that is not zeroed, and a long one (a column chunk) is mapped, so neither
//! the copy nor the fresh buffer's page faults remain (TPC-H SF 10, interleaved, best of 3:
//! Q01 1799 -> 1648 ms, Q03 1235 -> 1108 ms, Q05 1650 -> 1469 ms; SSB q4.1 939 -> 863 ms).
//!
//! The map is not populated up front: its pages are mapped as the checksum check first touches
//! them, the kernel mapping the cached pages around each fault in one go. Populating at `mmap`
//! (page by page) took 10% of SSB q4.1's CPU samples, the faults now 7%; SSB
//! SF 10 (3 interleaved runs, best) q1.3 200 -> 170 ms, q2.2 300 -> 270 ms, q4.2 540 -> 490 ms.
//!
//! Cold, a range is first asked of the device whole (`POSIX_FADV_WILLNEED`), which reads just
//! its pages, many requests in flight. Left to faults on the map, each missing page made the
//! kernel read a window around it (the device's readahead, 8 MB here) of which a column chunk
//! is often half: SSB q2.1 at SF 10 read 2,287 MiB from the device for 976 MB of chunks (DuckDB
//! 1,255 MiB), one window at a time. Scans also tell the store what they will read next
//! ([`read_ahead`]), so the device reads the next row group while they decode this one.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::os::fd::AsRawFd;
use std::ops::Range;
use std::path::Path as FsPath;
use std::sync::Arc;

use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::StreamExt;
use object_store::local::LocalFileSystem;
use object_store::path::Path;
use object_store::{GetOptions, GetResult, GetResultPayload, ObjectStore};

use crate::read_account::ReadAccount;

/// Ranges at least this long are mapped rather than read: for them, the map's page-table setup
/// costs less than the kernel's copy into a freshly faulted buffer. Shorter chunks (a sorted
/// copy's row groups of 16,384 rows: 64-128 KB a column) are read: unmapping each flushed the
/// other threads' TLBs, 11% of SSB q2.1's samples on such a copy at 64 KB.
const MAP_MIN_BYTES: u64 = 256 * 1024;

/// `range` of `file`: mapped when it is long (the bytes are the page cache's own, never
/// copied), else read into a buffer that is not initialized first; an error, as
/// `LocalFileSystem` gives, where the file ends first.
///
/// Mapping is safe because a node's segment files are immutable: each is written once, under a
/// new name, before the commit that makes it visible, and nothing truncates or rewrites it
/// afterwards (a file removed while mapped stays readable until unmapped). A flipped bit in a
/// mapped file is caught, as in a read one, by the checksums `VerifiedStore` checks.
///
/// A `cold` range (asked of the device by `start_reading`) is read, not mapped, however long:
/// the wait for the device is then this blocking thread's (left to the checksum check's faults,
/// it stalled the async worker that ran the check, one of the few that decode), and copying the
/// pages costs less than mapping them one by one as they arrive (a scan of four columns of SSB
/// lineorder at SF 10, cold, median of 3 interleaved: 1,078 ms mapped and populated, 962 ms
/// read).
fn read_range(file: &File, path: &FsPath, range: Range<u64>, cold: bool) -> object_store::Result<Bytes> {
    let failed = |source: std::io::Error| object_store::Error::Generic { store: "local files", source: format!("reading {}: {source}", path.display()).into() };
    let wanted = range.end - range.start;
    if wanted >= MAP_MIN_BYTES && !cold {
        let length = file.metadata().map_err(failed)?.len();
        if range.end > length {
            return Err(past_end(path, &range, length.saturating_sub(range.start)));
        }
        let page = page_size();
        let start = range.start / page * page;
        // SAFETY: the file is not modified while mapped (see above).
        let map = unsafe { memmap2::MmapOptions::new().offset(start).len((range.end - start) as usize).map(file) }.map_err(failed)?;
        return Ok(Bytes::from_owner(map).slice((range.start - start) as usize..));
    }
    let mut buffer = Vec::with_capacity(wanted as usize);
    let mut file = file;
    file.seek(SeekFrom::Start(range.start)).map_err(failed)?;
    file.take(wanted).read_to_end(&mut buffer).map_err(failed)?;
    if buffer.len() as u64 != wanted {
        return Err(past_end(path, &range, buffer.len() as u64));
    }
    Ok(buffer.into())
}

/// Bytes asked of the kernel per `POSIX_FADV_WILLNEED`: it reads at most the larger of the
/// device's readahead window and its largest request per call (8 MB and 4 MB here; 128 KB and
/// a few hundred KB on many machines), so a long range is asked for in steps.
const WILLNEED_STEP: u64 = 512 * 1024;

/// Bytes of `range` of `file` in the page cache, pages being read included: `cachestat`
/// (Linux 6.5), which, unlike a read that may not wait (`RWF_NOWAIT`), starts no readahead of
/// its own (such a probe of a chunk after one just read made the kernel read up to 8 MB past
/// it: TPC-H Q12 read 1,281 MiB from the device for 784 MB). `None` where the kernel cannot tell.
fn cached_bytes(file: &File, range: &Range<u64>) -> Option<u64> {
    #[repr(C)]
    struct CachestatRange {
        off: u64,
        len: u64,
    }
    #[repr(C)]
    #[derive(Default)]
    struct Cachestat {
        nr_cache: u64,
        nr_dirty: u64,
        nr_writeback: u64,
        nr_evicted: u64,
        nr_recently_evicted: u64,
    }
    /// The same number on every architecture (system calls added since 5.1 share one table).
    const SYS_CACHESTAT: libc::c_long = 451;
    let page = page_size();
    let first = range.start / page * page;
    let asked = CachestatRange { off: first, len: range.end - first };
    let mut stat = Cachestat::default();
    // SAFETY: both structs are the kernel's layout and live for the call; no memory of ours
    // is written but `stat`.
    let done = unsafe { libc::syscall(SYS_CACHESTAT, file.as_raw_fd(), &raw const asked, &raw mut stat, 0u32) };
    (done == 0).then(|| (stat.nr_cache * page).min(range.end - range.start))
}

/// Asks the device for the pages of `range` of `file` that the page cache lacks; the bytes it
/// asked for. The kernel starts the reads and returns: the pages arrive while the caller goes
/// on. Where the kernel cannot tell what is cached, the whole range is asked for (cached pages
/// cost a lookup each) and none of it counted (0: it may all have been in memory).
fn start_reading(file: &File, range: &Range<u64>) -> u64 {
    if range.start >= range.end {
        return 0;
    }
    let cached = cached_bytes(file, range);
    let missing = range.end - range.start - cached.unwrap_or(0);
    if missing == 0 {
        return 0;
    }
    let mut at = range.start;
    while at < range.end {
        let step = WILLNEED_STEP.min(range.end - at);
        // SAFETY: posix_fadvise on an open descriptor has no memory effects; a hint that fails
        // only leaves the pages to be read when touched.
        unsafe { libc::posix_fadvise(file.as_raw_fd(), at as libc::off_t, step as libc::off_t, libc::POSIX_FADV_WILLNEED) };
        at += step;
    }
    if cached.is_some() { missing } else { 0 }
}

/// Starts reading `ranges` of the file at `location` into the page cache, those not there
/// already, without waiting for them: what a scan will read next, so that the device reads it
/// while the scan decodes what it has. A file that cannot be opened is left alone (its read
/// will fail and say why).
/// The bytes asked of the device count in `account`.
pub fn read_ahead(files: &LocalFileSystem, location: &Path, ranges: Vec<Range<u64>>, account: Option<Arc<ReadAccount>>) {
    let Ok(path) = files.path_to_filesystem(location) else { return };
    tokio::task::spawn_blocking(move || {
        let Ok(file) = File::open(&path) else { return };
        let asked: u64 = ranges.iter().map(|range| start_reading(&file, range)).sum();
        if let Some(account) = account {
            account.add(0, asked, Duration::ZERO);
        }
    });
}

/// Drops `path`'s pages from the page cache, writing them first (only clean pages are dropped).
/// A hint: the kernel may keep some.
pub fn evict_from_page_cache(path: &FsPath) -> std::io::Result<()> {
    let file = File::open(path)?;
    file.sync_all()?;
    // SAFETY: posix_fadvise on an open descriptor has no memory effects.
    match unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) } {
        0 => Ok(()),
        errno => Err(std::io::Error::from_raw_os_error(errno)),
    }
}

fn past_end(path: &FsPath, range: &Range<u64>, available: u64) -> object_store::Error {
    let reason = format!("{}: asked for bytes {}..{}, the file ends at byte {}", path.display(), range.start, range.end, range.start + available);
    object_store::Error::Generic { store: "local files", source: reason.into() }
}

fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if size > 0 { size as u64 } else { 4096 }
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> object_store::Result<T> + Send + 'static) -> object_store::Result<T> {
    tokio::task::spawn_blocking(f).await.map_err(|e| object_store::Error::Generic { store: "local files", source: Box::new(e) })?
}

/// `LocalFileSystem::get_opts` (metadata, preconditions, range checks), a ranged read's bytes
/// read here; a whole file is left to stream as `LocalFileSystem` streams it. A ranged read
/// counts in the calling fragment's [`ReadAccount`].
pub async fn get_opts(files: &LocalFileSystem, location: &Path, options: GetOptions) -> object_store::Result<GetResult> {
    let ranged = options.range.is_some() && !options.head;
    let GetResult { payload, meta, range, attributes } = files.get_opts(location, options).await?;
    let payload = match payload {
        GetResultPayload::File(file, path) if ranged => {
            let wanted = range.clone();
            let data = blocking(move || {
                let started = Instant::now();
                let asked = start_reading(&file, &wanted);
                let data = read_range(&file, &path, wanted.clone(), asked > 0)?;
                Ok((data, asked, started.elapsed()))
            })
            .await
            .map(|(data, asked, took)| {
                ReadAccount::record(1, asked, took);
                data
            })?;
            GetResultPayload::Stream(futures::stream::once(async move { Ok(data) }).boxed())
        }
        other => other,
    };
    Ok(GetResult { payload, meta, range, attributes })
}

/// `LocalFileSystem::get_ranges`, the file read here; counted in the calling fragment's
/// [`ReadAccount`].
pub async fn get_ranges(files: &LocalFileSystem, location: &Path, ranges: &[Range<u64>]) -> object_store::Result<Vec<Bytes>> {
    let path = files.path_to_filesystem(location)?;
    let ranges = ranges.to_vec();
    let requests = ranges.len() as u64;
    let (data, asked, took) = blocking(move || {
        let started = Instant::now();
        let file = File::open(&path).map_err(|source| match source.kind() {
            std::io::ErrorKind::NotFound => object_store::Error::NotFound { path: path.display().to_string(), source: Box::new(source) },
            _ => object_store::Error::Generic { store: "local files", source: format!("opening {}: {source}", path.display()).into() },
        })?;
        // Every range is asked of the device before the first is read, so they are read at once.
        let asked: Vec<u64> = ranges.iter().map(|range| start_reading(&file, range)).collect();
        let data = ranges.into_iter().zip(&asked).map(|(range, &asked)| read_range(&file, &path, range, asked > 0)).collect::<object_store::Result<Vec<_>>>()?;
        Ok((data, asked.iter().sum(), started.elapsed()))
    })
    .await?;
    ReadAccount::record(requests, asked, took);
    Ok(data)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ranged reads return the file's bytes, through both paths; a range past the end fails.
    #[tokio::test]
    async fn ranged_reads_return_the_files_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let data: Vec<u8> = (0..400_000u32).map(|i| (i * 7 % 251) as u8).collect();
        std::fs::write(dir.path().join("f.bin"), &data).unwrap();
        let files = LocalFileSystem::new();
        let path = Path::from_filesystem_path(dir.path().join("f.bin")).unwrap();
        let ranged = |range: Range<u64>| GetOptions { range: Some(range.into()), ..Default::default() };
        let read = get_opts(&files, &path, ranged(5..70_000)).await.unwrap();
        assert!(matches!(read.payload, GetResultPayload::Stream(_)), "read here, not by object_store");
        assert_eq!(read.bytes().await.unwrap().as_ref(), &data[5..70_000]);
        assert_eq!(get_opts(&files, &path, GetOptions::default()).await.unwrap().bytes().await.unwrap().as_ref(), &data[..]);
        let ranges = get_ranges(&files, &path, &[0..1, 399_000..400_000, 10..10]).await.unwrap();
        assert_eq!(ranges.iter().map(|b| b.to_vec()).collect::<Vec<_>>(), vec![data[0..1].to_vec(), data[399_000..].to_vec(), vec![]]);
        assert!(get_ranges(&files, &path, &[399_000..400_001]).await.is_err(), "a range past the end");
        assert!(get_ranges(&files, &path, &[0..400_001]).await.is_err(), "a mapped range past the end");
        let mapped = get_ranges(&files, &path, &[4_097..4_097 + MAP_MIN_BYTES]).await.unwrap();
        assert_eq!(mapped[0].as_ref(), &data[4_097..4_097 + MAP_MIN_BYTES as usize], "a mapped range not on a page boundary");
        let missing = Path::from_filesystem_path(dir.path()).unwrap().join("missing");
        assert!(get_ranges(&files, &missing, &[0..1]).await.is_err());
    }

    /// Cold, a read's bytes are the device's and a read ahead brings pages into the page
    /// cache without being waited for; warm, a read's bytes are the cache's. (On the disk the
    /// warehouse lives on, as below.)
    #[tokio::test(flavor = "multi_thread")]
    async fn cold_reads_are_the_devices_and_read_ahead_fills_the_cache() {
        let dir = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();
        let file = dir.path().join("segment.bin");
        std::fs::write(&file, vec![3u8; 4 << 20]).unwrap();
        evict_from_page_cache(&file).unwrap();
        if cached_bytes(&File::open(&file).unwrap(), &(0..1)).is_none() {
            eprintln!("skipped: this kernel has no cachestat (Linux 6.5), so reads are not told apart");
            return;
        }
        let (files, path) = (LocalFileSystem::new(), Path::from_filesystem_path(&file).unwrap());
        let read = |account: &Arc<ReadAccount>| ReadAccount::scope(Arc::clone(account), get_ranges(&files, &path, &[0..1 << 20]));
        let cold = Arc::new(ReadAccount::default());
        let data = read(&cold).await.unwrap();
        assert!(data[0].len() == 1 << 20 && data[0].iter().all(|&b| b == 3), "the bytes");
        assert_eq!((cold.requests(), cold.device_bytes()), (1, 1 << 20), "all of it from the device");
        let warm = Arc::new(ReadAccount::default());
        read(&warm).await.unwrap();
        assert_eq!((warm.requests(), warm.device_bytes()), (1, 0), "now in the page cache");
        let before = cached_pages(&file);
        let ahead = Arc::new(ReadAccount::default());
        read_ahead(&files, &path, vec![(2 << 20)..(4 << 20)], Some(Arc::clone(&ahead)));
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while cached_pages(&file) < before + ((2 << 20) / page_size() as usize) || ahead.device_bytes() != 2 << 20 {
            assert!(std::time::Instant::now() < deadline, "read ahead: {} pages cached, {before} before", cached_pages(&file));
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    }

    /// Pages of `path` in the page cache, as a map of it sees them.
    fn cached_pages(path: &FsPath) -> usize {
        // SAFETY: nothing writes the file while it is mapped.
        let map = unsafe { memmap2::Mmap::map(&File::open(path).unwrap()) }.unwrap();
        let mut present = vec![0u8; map.len().div_ceil(page_size() as usize)];
        // SAFETY: a live mapping from a page boundary, one byte per page.
        assert_eq!(unsafe { libc::mincore(map.as_ptr() as *mut libc::c_void, map.len(), present.as_mut_ptr()) }, 0);
        present.iter().filter(|p| *p & 1 == 1).count()
    }

    /// A file just written is in the page cache; evicted, none of it is. (In the crate's
    /// directory, on the disk the warehouse lives on: a tmpfs keeps its pages.)
    #[test]
    fn evicted_files_leave_the_page_cache() {
        let dir = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();
        let path = dir.path().join("segment.bin");
        std::fs::write(&path, vec![7u8; 1 << 20]).unwrap();
        assert!(cached_pages(&path) > 0, "a file just written is cached");
        evict_from_page_cache(&path).unwrap();
        assert_eq!(cached_pages(&path), 0);
        assert_eq!(std::fs::read(&path).unwrap(), vec![7u8; 1 << 20], "its bytes are unchanged");
        assert!(evict_from_page_cache(&dir.path().join("missing")).is_err());
    }
}
