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

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::os::fd::AsRawFd;
use std::ops::Range;
use std::path::Path as FsPath;

use bytes::Bytes;
use futures::StreamExt;
use object_store::local::LocalFileSystem;
use object_store::path::Path;
use object_store::{GetOptions, GetResult, GetResultPayload, ObjectStore};

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
fn read_range(file: &File, path: &FsPath, range: Range<u64>) -> object_store::Result<Bytes> {
    let failed = |source: std::io::Error| object_store::Error::Generic { store: "local files", source: format!("reading {}: {source}", path.display()).into() };
    let wanted = range.end - range.start;
    if wanted >= MAP_MIN_BYTES {
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
/// read here; a whole file is left to stream as `LocalFileSystem` streams it.
pub async fn get_opts(files: &LocalFileSystem, location: &Path, options: GetOptions) -> object_store::Result<GetResult> {
    let ranged = options.range.is_some() && !options.head;
    let GetResult { payload, meta, range, attributes } = files.get_opts(location, options).await?;
    let payload = match payload {
        GetResultPayload::File(file, path) if ranged => {
            let wanted = range.clone();
            let data = blocking(move || read_range(&file, &path, wanted)).await?;
            GetResultPayload::Stream(futures::stream::once(async move { Ok(data) }).boxed())
        }
        other => other,
    };
    Ok(GetResult { payload, meta, range, attributes })
}

/// `LocalFileSystem::get_ranges`, the file read here.
pub async fn get_ranges(files: &LocalFileSystem, location: &Path, ranges: &[Range<u64>]) -> object_store::Result<Vec<Bytes>> {
    let path = files.path_to_filesystem(location)?;
    let ranges = ranges.to_vec();
    blocking(move || {
        let file = File::open(&path).map_err(|source| match source.kind() {
            std::io::ErrorKind::NotFound => object_store::Error::NotFound { path: path.display().to_string(), source: Box::new(source) },
            _ => object_store::Error::Generic { store: "local files", source: format!("opening {}: {source}", path.display()).into() },
        })?;
        ranges.into_iter().map(|range| read_range(&file, &path, range)).collect()
    })
    .await
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
