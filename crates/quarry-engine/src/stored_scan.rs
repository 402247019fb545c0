//! Passthrough as a plain storage device serves it: the host asks the node for the stored bytes
//! of a fragment's segments ([`StorageNode::read_segment`]) and decodes the Parquet pages
//! itself, with DataFusion's Parquet reader. Like any reader of files on an object store, it
//! fetches the footer and the column chunks of the columns it reads, and skips row groups whose
//! statistics fail the filters above the scan.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::ops::Range;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use async_trait::async_trait;
use bytes::Bytes;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::common::config::TableParquetOptions;
use datafusion::datasource::physical_plan::parquet::DefaultParquetFileReaderFactory;
use datafusion::datasource::physical_plan::{FileScanConfigBuilder, ParquetSource};
use datafusion::datasource::source::DataSourceExec;
use datafusion::datasource::listing::PartitionedFile;
use datafusion::error::Result;
use datafusion::execution::TaskContext;
use datafusion::execution::object_store::ObjectStoreUrl;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::metrics::Count;
use datafusion::physical_plan::ExecutionPlan;
use futures::future::{BoxFuture, Shared};
use futures::stream::BoxStream;
use futures::{FutureExt, StreamExt};
use object_store::path::Path;
use parquet::file::metadata::{FooterTail, ParquetMetaDataReader};
use object_store::{
    CopyOptions, GetOptions, GetRange, GetResult, GetResultPayload, ListResult, MultipartUpload, ObjectMeta, ObjectStore, PutMultipartOptions,
    PutOptions, PutPayload, PutResult,
};
use quarry_storage::read_account::ReadAccount;
use quarry_storage::{FragmentProgress, ScanLeaf, ScanMessage, ScanStats, ScanStream, SegmentInfo, SegmentRead, StorageNode};

/// The `store` a failed read from a node names in its `object_store::Error::Generic`, whose
/// source is the node's error (`session::user_message` finds it there).
pub const STORE_NAME: &str = "storage node";

/// A host-side scan of `leaf`'s `segments` on `node`: their stored bytes fetched, decoded here.
/// `predicate` (the filters above the scan, possibly dynamic) prunes row groups and pages by
/// their statistics only: the filters themselves still run above. The stream ends, as a
/// node's does, with the scan's statistics: the bytes that crossed from the node count as both
/// read and returned. `progress` counts the bytes fetched as they arrive.
pub fn stored_scan(
    node: Arc<dyn StorageNode>,
    leaf: &ScanLeaf,
    segments: &[SegmentInfo],
    schema: SchemaRef,
    predicate: Option<Arc<dyn PhysicalExpr>>,
    context: Arc<TaskContext>,
    progress: FragmentProgress,
) -> Result<ScanStream> {
    let started = Instant::now();
    let mut stats = ScanStats {
        segments_requested: segments.len() as u64,
        rows_scanned: segments.iter().map(|s| s.rows).sum(),
        ..Default::default()
    };
    if segments.is_empty() {
        return Ok(futures::stream::once(async move { Ok(ScanMessage::Finished(stats)) }).boxed());
    }
    let fetched = Count::new();
    let reads = SegmentReads::new(node, leaf.table.clone(), leaf.version, segments, fetched.clone(), progress);
    let account = Arc::new(ReadAccount::default());
    let store = SegmentStore::new(reads, segments, schema.fields().iter().map(|f| f.name().clone()).collect(), Arc::clone(&account));
    let mut options = TableParquetOptions { global: context.session_config().options().execution.parquet.clone(), ..Default::default() };
    // The footer's exact length, then the footer: a hint (DataFusion's default, 512 KB) would
    // ship column data with it that the scan may not need.
    options.global.metadata_size_hint = None;
    // Row groups are pruned by the footer's statistics; pages are not: fetching and evaluating
    // the page index cost more than it saved on TPC-H at SF 10 (Q03 1.43-1.93 s with it,
    // 1.38-1.41 s without).
    options.global.enable_page_index = false;
    let mut source = ParquetSource::new(Arc::clone(&schema))
        .with_table_parquet_options(options)
        .with_parquet_file_reader_factory(Arc::new(DefaultParquetFileReaderFactory::new(Arc::new(store))));
    if let Some(predicate) = predicate {
        source = source.with_predicate(predicate);
    }
    // The reader factory above reads every byte; the URL only names the files' home.
    let mut config = FileScanConfigBuilder::new(ObjectStoreUrl::local_filesystem(), Arc::new(source)).with_limit(leaf.limit);
    for segment in segments {
        config = config.with_file(PartitionedFile::new(SegmentReads::path(&leaf.table, leaf.version, &segment.id).to_string(), segment.bytes));
    }
    let batches = DataSourceExec::from_data_source(config.build()).execute(0, context)?;
    let rows_returned = Count::new();
    let returned = rows_returned.clone();
    let closing = futures::stream::once(async move {
        stats.rows_returned = returned.value() as u64;
        stats.bytes_read = fetched.value() as u64;
        stats.bytes_returned = stats.bytes_read;
        stats.link_bytes = stats.bytes_read;
        stats.read_requests = account.requests();
        stats.bytes_read_device = account.device_bytes();
        stats.read_wait_ns = account.wait_ns();
        stats.elapsed_ns = started.elapsed().as_nanos() as u64;
        Ok(ScanMessage::Finished(stats))
    });
    Ok(batches
        .map(move |batch| {
            let batch = batch?;
            rows_returned.add(batch.num_rows());
            Ok(ScanMessage::Batch(batch))
        })
        .chain(closing)
        .boxed())
}

/// An object store whose objects are one node's segments of one table version: reads become
/// [`StorageNode::read_segment`] calls, each counted in `fetched`.
///
/// It also reads ahead. The Parquet scan reads a segment's footer and then its column chunks
/// when it is done with the segment before, so a cold device sat idle while the host decoded
/// (TPC-H Q01 at SF 10: 1.43 s cold against 1.10 s warm). The first read of a segment therefore
/// starts a task that fetches its footer and the chunks of the scan's columns in every row
/// group, and one for each of the `SEGMENTS_AHEAD` segments after it; the scan's reads are then
/// served from what the tasks fetched. At most four segments are held: the one before (whose
/// last reads may still come), the one being decoded, the next two.
struct SegmentStore {
    reads: Arc<SegmentReads>,
    /// Segment paths in the order the scan reads them, with their sizes.
    order: Vec<(Path, u64)>,
    /// The scan's columns, by name: the chunks fetched ahead.
    columns: Arc<Vec<String>>,
    /// Segments fetched ahead, oldest first (index into `order`).
    ahead: Mutex<VecDeque<Ahead>>,
    /// The scan's reads: counted by the node's files in process, else here.
    account: Arc<ReadAccount>,
}

/// One segment fetched ahead: its byte ranges and their bytes, once the task is done (`None`
/// if it failed: the scan's own reads then say why).
struct Ahead {
    segment: usize,
    fetched: Fetched,
    task: tokio::task::AbortHandle,
}

impl Drop for Ahead {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Segments fetched ahead of the one the scan reads: two kept a cold device busier than one
/// (SSB lineorder, four columns, passthrough, cold, median of 3 interleaved: 1,023 ms with one,
/// 940 with two, 1,021 with three; TPC-H Q01 1,327, 1,315, 1,286 ms).
const SEGMENTS_AHEAD: usize = 2;

/// A segment's byte ranges and their bytes, once fetched.
type Fetched = Shared<BoxFuture<'static, Option<Arc<Vec<(Range<u64>, Bytes)>>>>>;

impl SegmentStore {
    fn new(reads: SegmentReads, segments: &[SegmentInfo], columns: Vec<String>, account: Arc<ReadAccount>) -> Self {
        let order = segments.iter().map(|s| (SegmentReads::path(&reads.table, reads.version, &s.id), s.bytes)).collect();
        SegmentStore { reads: Arc::new(reads), order, columns: Arc::new(columns), ahead: Mutex::default(), account }
    }

    /// The bytes of `ranges` of `location`: from what was fetched ahead if it holds them all,
    /// else read. The first read of a segment starts fetching it ahead.
    async fn read(&self, location: &Path, ranges: &[Range<u64>]) -> object_store::Result<Vec<Bytes>> {
        ReadAccount::scope(Arc::clone(&self.account), self.read_here(location, ranges)).await
    }

    async fn read_here(&self, location: &Path, ranges: &[Range<u64>]) -> object_store::Result<Vec<Bytes>> {
        let (segment, _) = self.reads.segment(location)?.clone();
        let index = self.order.iter().position(|(path, _)| path == location);
        let fetched = index.and_then(|index| {
            let fetched = self.fetch_ahead(index);
            for next in index + 1..(index + 1 + SEGMENTS_AHEAD).min(self.order.len()) {
                self.fetch_ahead(next);
            }
            fetched
        });
        if let Some(fetched) = fetched
            && let Some(fetched) = fetched.await
            && let Some(bytes) = cut(&fetched, ranges)
        {
            return Ok(bytes);
        }
        self.reads.read(&segment, ranges).await
    }

    /// What is fetched ahead for segment `index`, the task started now if it was not yet, and
    /// segments more than `SEGMENTS_AHEAD + 1` before it dropped (so the segment before the one
    /// being read stays); `None` for a segment before the last started.
    fn fetch_ahead(&self, index: usize) -> Option<Fetched> {
        let mut ahead = self.ahead.lock().expect("read-ahead lock");
        if let Some(known) = ahead.iter().find(|a| a.segment == index) {
            return Some(known.fetched.clone());
        }
        if ahead.iter().any(|a| a.segment > index) {
            return None;
        }
        while ahead.front().is_some_and(|a| a.segment + 1 + SEGMENTS_AHEAD < index) {
            ahead.pop_front();
        }
        let (path, size) = self.order[index].clone();
        let (reads, columns) = (Arc::clone(&self.reads), Arc::clone(&self.columns));
        let fetching = async move { fetch_segment(&reads, &path, size, &columns).await.map(Arc::new) };
        let task = tokio::spawn(ReadAccount::scope(Arc::clone(&self.account), fetching));
        let abort = task.abort_handle();
        let fetched = async move { task.await.ok().flatten() }.boxed().shared();
        ahead.push_back(Ahead { segment: index, fetched: fetched.clone(), task: abort });
        Some(fetched)
    }
}

/// The footer of the segment at `path` and the chunks of `columns` in each of its row groups:
/// each range and its bytes, `None` if a read fails or the footer does not parse.
async fn fetch_segment(reads: &SegmentReads, path: &Path, size: u64, columns: &[String]) -> Option<Vec<(Range<u64>, Bytes)>> {
    let (segment, _) = reads.segment(path).ok()?.clone();
    // The footer as the Parquet reader reads it (its length, then it), no byte more: the link
    // carries what a plain storage device would.
    let tail_range = size.checked_sub(8)?..size;
    let tail = reads.read(&segment, std::slice::from_ref(&tail_range)).await.ok()?.pop()?;
    let footer = FooterTail::try_new(tail.as_ref().try_into().ok()?).ok()?;
    let metadata_range = tail_range.start.checked_sub(footer.metadata_length() as u64)?..tail_range.start;
    let metadata_bytes = reads.read(&segment, std::slice::from_ref(&metadata_range)).await.ok()?.pop()?;
    let metadata = ParquetMetaDataReader::decode_metadata(&metadata_bytes).ok()?;
    let leaves: Vec<usize> = metadata
        .file_metadata()
        .schema_descr()
        .columns()
        .iter()
        .enumerate()
        .filter(|(_, c)| columns.iter().any(|name| c.path().parts() == std::slice::from_ref(name)))
        .map(|(i, _)| i)
        .collect();
    let chunks: Vec<Range<u64>> = metadata
        .row_groups()
        .iter()
        .flat_map(|group| leaves.iter().map(move |&leaf| group.column(leaf).byte_range()))
        .map(|(start, length)| start..start + length)
        .collect();
    let data = reads.read(&segment, &chunks).await.ok()?;
    Some([(tail_range, tail), (metadata_range, metadata_bytes)].into_iter().chain(chunks.into_iter().zip(data)).collect())
}

/// `ranges` cut out of `fetched`, if each lies within one fetched range.
fn cut(fetched: &[(Range<u64>, Bytes)], ranges: &[Range<u64>]) -> Option<Vec<Bytes>> {
    ranges
        .iter()
        .map(|r| {
            let (have, bytes) = fetched.iter().find(|(have, _)| have.start <= r.start && r.end <= have.end)?;
            Some(bytes.slice((r.start - have.start) as usize..(r.end - have.start) as usize))
        })
        .collect()
}

/// Reads of one node's segments of one table version, counted in `fetched` and `progress`.
struct SegmentReads {
    node: Arc<dyn StorageNode>,
    table: String,
    version: u64,
    /// Segment id and size by object path.
    segments: HashMap<Path, (String, u64)>,
    fetched: Count,
    progress: FragmentProgress,
}

impl SegmentReads {
    fn new(node: Arc<dyn StorageNode>, table: String, version: u64, segments: &[SegmentInfo], fetched: Count, progress: FragmentProgress) -> Self {
        let segments = segments.iter().map(|s| (Self::path(&table, version, &s.id), (s.id.clone(), s.bytes))).collect();
        SegmentReads { node, table, version, segments, fetched, progress }
    }

    fn path(table: &str, version: u64, segment: &str) -> Path {
        Path::from_iter([table, &version.to_string(), segment])
    }

    fn segment(&self, location: &Path) -> object_store::Result<&(String, u64)> {
        self.segments.get(location).ok_or_else(|| object_store::Error::NotFound {
            path: location.to_string(),
            source: format!("not a segment of table '{}' version {} on this node", self.table, self.version).into(),
        })
    }

    /// The bytes of `ranges`, one `Bytes` per range, fetched in reads the node accepts.
    async fn read(&self, segment: &str, ranges: &[Range<u64>]) -> object_store::Result<Vec<Bytes>> {
        let mut pieces = Vec::new();
        for read in SegmentRead::split(&self.table, self.version, segment, ranges, SegmentRead::MAX_BYTES) {
            let (bytes, requests, started) = (read.len(), read.ranges.len() as u64, Instant::now());
            let parts = self.node.read_segment(read).await.map_err(|e| object_store::Error::Generic { store: STORE_NAME, source: Box::new(e) })?;
            // A node in this process counts its own reads (and which were the device's).
            if !self.node.in_process() {
                ReadAccount::record(requests, 0, started.elapsed());
            }
            self.fetched.add(bytes as usize);
            self.progress.add(bytes);
            pieces.extend(parts);
        }
        SegmentRead::join(ranges, pieces).map_err(|e| object_store::Error::Generic { store: STORE_NAME, source: format!("segment '{segment}': {e}").into() })
    }
}

impl fmt::Debug for SegmentStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SegmentStore({}, {} v{})", self.reads.node.name(), self.reads.table, self.reads.version)
    }
}

impl fmt::Display for SegmentStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

fn read_only(operation: &str) -> object_store::Error {
    object_store::Error::NotImplemented { operation: operation.to_string(), implementer: "quarry's segment store (read-only)".to_string() }
}

#[async_trait]
impl ObjectStore for SegmentStore {
    async fn put_opts(&self, _location: &Path, _payload: PutPayload, _opts: PutOptions) -> object_store::Result<PutResult> {
        Err(read_only("put"))
    }

    async fn put_multipart_opts(&self, _location: &Path, _opts: PutMultipartOptions) -> object_store::Result<Box<dyn MultipartUpload>> {
        Err(read_only("put_multipart"))
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> object_store::Result<GetResult> {
        let (_, size) = self.reads.segment(location)?.clone();
        let meta = ObjectMeta { location: location.clone(), last_modified: Default::default(), size, e_tag: None, version: None };
        let range = options.range.clone().unwrap_or(GetRange::Bounded(0..size)).as_range(size).map_err(|e| object_store::Error::Generic {
            store: STORE_NAME,
            source: Box::new(e),
        })?;
        let body = if options.head || range.is_empty() { Bytes::new() } else { self.read(location, std::slice::from_ref(&range)).await?.remove(0) };
        let payload = GetResultPayload::Stream(Box::pin(futures::stream::once(async move { Ok(body) })));
        Ok(GetResult { payload, meta, range, attributes: Default::default() })
    }

    async fn get_ranges(&self, location: &Path, ranges: &[Range<u64>]) -> object_store::Result<Vec<Bytes>> {
        self.read(location, ranges).await
    }

    fn delete_stream(&self, _locations: BoxStream<'static, object_store::Result<Path>>) -> BoxStream<'static, object_store::Result<Path>> {
        Box::pin(futures::stream::once(async { Err(read_only("delete")) }))
    }

    fn list(&self, _prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        Box::pin(futures::stream::once(async { Err(read_only("list")) }))
    }

    async fn list_with_delimiter(&self, _prefix: Option<&Path>) -> object_store::Result<ListResult> {
        Err(read_only("list"))
    }

    async fn copy_opts(&self, _from: &Path, _to: &Path, _options: CopyOptions) -> object_store::Result<()> {
        Err(read_only("copy"))
    }
}
