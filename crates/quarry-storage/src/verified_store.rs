//! An object store that checks every read of a segment file against the block checksums its
//! manifest recorded when it was written. A read is widened to whole checksum blocks, each
//! block verified, and the bytes asked for returned; a block that does not match fails the read
//! with an error naming the table, the file and the byte range. Every reader of segments on a
//! node (DataFusion's Parquet scan, the page and PLAIN readers, the star scan, passthrough reads)
//! goes through it, so damage can fail a query but never change its result.

use std::collections::HashMap;
use std::fmt;
use std::ops::Range;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;
use futures::stream::BoxStream;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetRange, GetResult, GetResultPayload, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult,
};
use quarry_table::{BlockChecksums, SegmentMeta};

use crate::profile::ThrottledStore;
use crate::read_account::ReadAccount;

/// Segment files remembered before the map starts over (each is re-registered when next used).
const SEGMENTS_REMEMBERED: usize = 100_000;

/// The `store` a checksum failure names in its `object_store::Error::Generic`.
const CHECKSUM_STORE: &str = "checksum";

/// The words of a checksum failure carried inside `error` (through the readers, DataFusion and
/// the storage node's layers), if that is what it is: table, file and bytes, nothing else.
pub fn damage_message(error: &(dyn std::error::Error + 'static)) -> Option<String> {
    let mut current = Some(error);
    while let Some(e) = current {
        if let Some(object_store::Error::Generic { store: CHECKSUM_STORE, source }) = e.downcast_ref::<object_store::Error>() {
            return Some(source.to_string());
        }
        current = e.source();
    }
    None
}

/// What a segment file must hold.
#[derive(Debug)]
struct Recorded {
    table: String,
    file: PathBuf,
    size: u64,
    checksums: BlockChecksums,
}

impl Recorded {
    fn damaged(&self, bytes: Range<u64>, what: &str) -> object_store::Error {
        let reason = format!(
            "table '{}': segment file {} is damaged: bytes {}..{} {what} (`quarry scrub {}` lists the damage)",
            self.table,
            self.file.display(),
            bytes.start,
            bytes.end,
            self.table
        );
        object_store::Error::Generic { store: CHECKSUM_STORE, source: reason.into() }
    }

    /// Verifies `data`, read from the aligned range `read`, and cuts out `wanted`.
    fn check(&self, read: &Range<u64>, data: Bytes, wanted: &Range<u64>) -> object_store::Result<Bytes> {
        if data.len() as u64 != read.end - read.start {
            return Err(self.damaged(read.start + data.len() as u64..read.end, "are missing (the file is shorter than written)"));
        }
        self.checksums.verify(read.start, &data, self.size).map_err(|bad| self.damaged(bad.bytes, "do not match the checksum written with them"))?;
        Ok(data.slice((wanted.start - read.start) as usize..(wanted.end - read.start) as usize))
    }
}

/// Wraps a store; reads of registered segment files are verified, others pass through. A
/// fragment reads through its own handle ([`VerifiedStore::counting_into`]), which counts its
/// reads in the fragment's [`ReadAccount`] wherever they run (DataFusion polls a scan in tasks
/// of its own when it merges partitions).
#[derive(Debug)]
pub struct VerifiedStore {
    files: Arc<Files>,
    account: Option<Arc<ReadAccount>>,
}

/// What every handle of a node's store shares.
#[derive(Debug)]
struct Files {
    inner: Arc<dyn ObjectStore>,
    /// The node's files, when `inner` reads them, to be told what scans read next.
    local: Option<Arc<ThrottledStore>>,
    segments: Mutex<HashMap<Path, Arc<Recorded>>>,
}

impl VerifiedStore {
    /// Wraps `inner`.
    pub fn new(inner: Arc<dyn ObjectStore>) -> Self {
        VerifiedStore { files: Arc::new(Files { inner, local: None, segments: Mutex::default() }), account: None }
    }

    /// Wraps the node's `files`, which it also tells what scans will read next.
    pub fn over_files(files: Arc<ThrottledStore>) -> Self {
        VerifiedStore { files: Arc::new(Files { inner: Arc::clone(&files) as _, local: Some(files), segments: Mutex::default() }), account: None }
    }

    /// The same store, its reads counted in `account`.
    pub fn counting_into(&self, account: Arc<ReadAccount>) -> Arc<VerifiedStore> {
        Arc::new(VerifiedStore { files: Arc::clone(&self.files), account: Some(account) })
    }

    /// Starts reading `ranges` of `location` (widened to checksum blocks, as their reads will
    /// be) so that they are in memory when read; does nothing over a store of other files.
    pub fn read_ahead(&self, location: &Path, ranges: &[Range<u64>]) {
        let Some(files) = &self.files.local else { return };
        let ranges = match self.recorded(location) {
            Some(recorded) => ranges.iter().map(|r| recorded.checksums.aligned(r.start..r.end.min(recorded.size), recorded.size)).collect(),
            None => ranges.to_vec(),
        };
        files.read_ahead(location, ranges, self.account.clone().or_else(ReadAccount::current));
    }

    /// `read`, counted in this handle's account if it has one.
    async fn counted<T>(&self, read: impl Future<Output = T>) -> T {
        match &self.account {
            Some(account) => ReadAccount::scope(Arc::clone(account), read).await,
            None => read.await,
        }
    }

    /// Remembers what `path`, the file of `segment` of `table`, holds, so that its reads are
    /// verified. A segment written before checksums existed is read unverified.
    pub fn expect(&self, path: &Path, file: PathBuf, table: &str, segment: &SegmentMeta) {
        let Some(checksums) = &segment.checksums else { return };
        let mut segments = self.files.segments.lock().expect("checksum map lock");
        if segments.contains_key(path) {
            return;
        }
        if segments.len() >= SEGMENTS_REMEMBERED {
            segments.clear();
        }
        let recorded = Recorded { table: table.to_string(), file, size: segment.bytes, checksums: checksums.clone() };
        segments.insert(path.clone(), Arc::new(recorded));
    }

    fn recorded(&self, path: &Path) -> Option<Arc<Recorded>> {
        self.files.segments.lock().expect("checksum map lock").get(path).cloned()
    }

    /// A read of `location`, verified if it is a registered segment file.
    async fn verified_get(&self, location: &Path, options: GetOptions) -> object_store::Result<GetResult> {
        let recorded = if options.head { None } else { self.recorded(location) };
        let Some(recorded) = recorded else { return self.files.inner.get_opts(location, options).await };
        let Some(wanted) = requested(options.range.as_ref(), recorded.size) else { return self.files.inner.get_opts(location, options).await };
        let read = recorded.checksums.aligned(wanted.clone(), recorded.size);
        let options = GetOptions { range: Some(GetRange::Bounded(read.clone())), ..options };
        let result = self.files.inner.get_opts(location, options).await?;
        let (meta, attributes) = (result.meta.clone(), result.attributes.clone());
        let data = result.bytes().await?;
        let bytes = timed_check(|| recorded.check(&read, data, &wanted))?;
        let payload = GetResultPayload::Stream(futures::stream::once(async move { Ok(bytes) }).boxed());
        Ok(GetResult { payload, meta, range: wanted, attributes })
    }

    /// Reads of `location`, verified if it is a registered segment file.
    async fn verified_get_ranges(&self, location: &Path, ranges: &[Range<u64>]) -> object_store::Result<Vec<Bytes>> {
        let Some(recorded) = self.recorded(location) else { return self.files.inner.get_ranges(location, ranges).await };
        let wanted: Vec<Range<u64>> = ranges.iter().map(|r| r.start..r.end.min(recorded.size)).collect();
        let reads: Vec<Range<u64>> = wanted.iter().map(|r| recorded.checksums.aligned(r.clone(), recorded.size)).collect();
        let data = self.files.inner.get_ranges(location, &reads).await?;
        timed_check(|| reads.iter().zip(data).zip(&wanted).map(|((read, data), wanted)| recorded.check(read, data, wanted)).collect())
    }
}

impl fmt::Display for VerifiedStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "VerifiedStore({})", self.files.inner)
    }
}

/// `check`, its time counted as read time in the calling fragment's [`ReadAccount`]: the pages
/// of a mapped range that were in the page cache are mapped as it touches them.
fn timed_check<T>(check: impl FnOnce() -> T) -> T {
    let started = Instant::now();
    let checked = check();
    ReadAccount::record(0, 0, started.elapsed());
    checked
}

/// The byte range a `GetRange` asks of a file of `size` bytes; `None` if it is not one the
/// file has (the inner store then reports the error as it would).
fn requested(range: Option<&GetRange>, size: u64) -> Option<Range<u64>> {
    let range = match range {
        None => 0..size,
        Some(GetRange::Bounded(r)) => r.start..r.end.min(size),
        Some(GetRange::Offset(start)) => *start..size,
        Some(GetRange::Suffix(n)) => size.saturating_sub(*n)..size,
    };
    (range.start < range.end || (range.start == 0 && size == 0)).then_some(range)
}

#[async_trait]
impl ObjectStore for VerifiedStore {
    async fn put_opts(&self, location: &Path, payload: PutPayload, opts: PutOptions) -> object_store::Result<PutResult> {
        self.files.inner.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(&self, location: &Path, opts: PutMultipartOptions) -> object_store::Result<Box<dyn MultipartUpload>> {
        self.files.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> object_store::Result<GetResult> {
        self.counted(self.verified_get(location, options)).await
    }

    async fn get_ranges(&self, location: &Path, ranges: &[Range<u64>]) -> object_store::Result<Vec<Bytes>> {
        self.counted(self.verified_get_ranges(location, ranges)).await
    }

    fn delete_stream(&self, locations: BoxStream<'static, object_store::Result<Path>>) -> BoxStream<'static, object_store::Result<Path>> {
        self.files.inner.delete_stream(locations)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.files.inner.list(prefix)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        self.files.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> object_store::Result<()> {
        self.files.inner.copy_opts(from, to, options).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use object_store::ObjectStoreExt;
    use object_store::memory::InMemory;
    use quarry_table::checksum::CHECKSUM_BLOCK_BYTES;

    fn segment(data: &[u8]) -> SegmentMeta {
        SegmentMeta {
            id: "s".into(),
            path: "data/s.parquet".into(),
            rows: 0,
            bytes: data.len() as u64,
            row_groups: 0,
            columns: vec![],
            checksums: Some(BlockChecksums::of_bytes(data)),
            zones: None,
            range: 0,
        }
    }

    #[tokio::test]
    async fn reads_are_verified_by_block() {
        let block = CHECKSUM_BLOCK_BYTES as usize;
        let good: Vec<u8> = (0..3 * block + 10).map(|i| (i % 253) as u8).collect();
        let mut bad = good.clone();
        bad[block + 7] ^= 1;
        let inner = Arc::new(InMemory::new());
        let path = Path::from("t/data/s.parquet");
        inner.put(&path, bad.clone().into()).await.unwrap();
        let store = VerifiedStore::new(inner);
        // Unregistered: bytes as stored.
        assert_eq!(store.get_range(&path, 0..10).await.unwrap().as_ref(), &bad[..10]);
        store.expect(&path, "t/data/s.parquet".into(), "t", &segment(&good));
        // Blocks 0 and 2 are intact: ranges inside them read, even across the file's end.
        assert_eq!(store.get_range(&path, 5..100).await.unwrap().as_ref(), &good[5..100]);
        let tail = (2 * block + 1) as u64..good.len() as u64;
        assert_eq!(store.get_ranges(&path, std::slice::from_ref(&tail)).await.unwrap()[0].as_ref(), &good[tail.start as usize..]);
        assert!(store.get(&path).await.is_err(), "a whole read covers the damaged block");
        // One byte of the damaged block fails, naming the table, the file and the block.
        let error = store.get_range(&path, (block + 100) as u64..(block + 101) as u64).await.unwrap_err().to_string();
        assert!(error.contains("table 't'") && error.contains("t/data/s.parquet"), "{error}");
        assert!(error.contains(&format!("bytes {}..{}", block, 2 * block)), "{error}");
        let error = store.get_ranges(&path, &[0..10, (block as u64)..(block as u64 + 1)]).await.unwrap_err().to_string();
        assert!(error.contains("do not match"), "{error}");
    }
}
