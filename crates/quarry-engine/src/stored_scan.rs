//! Passthrough as a plain storage device serves it: the host asks the node for the stored bytes
//! of a fragment's segments ([`StorageNode::read_segment`]) and decodes the Parquet pages
//! itself, with DataFusion's Parquet reader. Like any reader of files on an object store, it
//! fetches the footer and the column chunks of the columns it reads, and skips row groups whose
//! statistics fail the filters above the scan.

use std::collections::HashMap;
use std::fmt;
use std::ops::Range;
use std::sync::Arc;
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
use futures::StreamExt;
use futures::stream::BoxStream;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetRange, GetResult, GetResultPayload, ListResult, MultipartUpload, ObjectMeta, ObjectStore, PutMultipartOptions,
    PutOptions, PutPayload, PutResult,
};
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
    let store = SegmentStore::new(node, leaf.table.clone(), leaf.version, segments, fetched.clone(), progress);
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
        config = config.with_file(PartitionedFile::new(SegmentStore::path(&leaf.table, leaf.version, &segment.id).to_string(), segment.bytes));
    }
    let batches = DataSourceExec::from_data_source(config.build()).execute(0, context)?;
    let rows_returned = Count::new();
    let returned = rows_returned.clone();
    let closing = futures::stream::once(async move {
        stats.rows_returned = returned.value() as u64;
        stats.bytes_read = fetched.value() as u64;
        stats.bytes_returned = stats.bytes_read;
        stats.link_bytes = stats.bytes_read;
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
struct SegmentStore {
    node: Arc<dyn StorageNode>,
    table: String,
    version: u64,
    /// Segment id and size by object path.
    segments: HashMap<Path, (String, u64)>,
    fetched: Count,
    progress: FragmentProgress,
}

impl SegmentStore {
    fn new(node: Arc<dyn StorageNode>, table: String, version: u64, segments: &[SegmentInfo], fetched: Count, progress: FragmentProgress) -> Self {
        let segments = segments.iter().map(|s| (Self::path(&table, version, &s.id), (s.id.clone(), s.bytes))).collect();
        SegmentStore { node, table, version, segments, fetched, progress }
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
            let bytes = read.len();
            let parts = self.node.read_segment(read).await.map_err(|e| object_store::Error::Generic { store: STORE_NAME, source: Box::new(e) })?;
            self.fetched.add(bytes as usize);
            self.progress.add(bytes);
            pieces.extend(parts);
        }
        SegmentRead::join(ranges, pieces).map_err(|e| object_store::Error::Generic { store: STORE_NAME, source: format!("segment '{segment}': {e}").into() })
    }
}

impl fmt::Debug for SegmentStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SegmentStore({}, {} v{})", self.node.name(), self.table, self.version)
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
        let (segment, size) = self.segment(location)?.clone();
        let meta = ObjectMeta { location: location.clone(), last_modified: Default::default(), size, e_tag: None, version: None };
        let range = options.range.clone().unwrap_or(GetRange::Bounded(0..size)).as_range(size).map_err(|e| object_store::Error::Generic {
            store: STORE_NAME,
            source: Box::new(e),
        })?;
        let body = if options.head || range.is_empty() { Bytes::new() } else { self.read(&segment, std::slice::from_ref(&range)).await?.remove(0) };
        let payload = GetResultPayload::Stream(Box::pin(futures::stream::once(async move { Ok(body) })));
        Ok(GetResult { payload, meta, range, attributes: Default::default() })
    }

    async fn get_ranges(&self, location: &Path, ranges: &[Range<u64>]) -> object_store::Result<Vec<Bytes>> {
        let (segment, _) = self.segment(location)?.clone();
        self.read(&segment, ranges).await
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
