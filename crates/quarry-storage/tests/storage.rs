//! Integration tests of quarry-storage.

use std::path::Path;
use std::sync::Arc;

use arrow::array::{Int64Array, RecordBatch, StringArray, StringViewArray};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use arrow::row::{RowConverter, SortField};
use datafusion::common::{JoinSide, JoinType, NullEquality};
use datafusion::datasource::memory::MemorySourceConfig;
use datafusion::error::DataFusionError;
use datafusion::execution::TaskContext;
use datafusion::execution::memory_pool::{GreedyMemoryPool, MemoryPool, TrackConsumersPool};
use datafusion::execution::runtime_env::RuntimeEnvBuilder;
use datafusion::logical_expr::Operator;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::expressions::{BinaryExpr, col, lit};
use datafusion::physical_plan::joins::utils::{ColumnIndex, JoinFilter};
use datafusion::physical_plan::joins::{HashJoinExec, PartitionMode};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::streaming::{PartitionStream, StreamingTableExec};
use datafusion::physical_plan::{ExecutionPlan, ExecutionPlanProperties, SendableRecordBatchStream, collect};
use futures::StreamExt;
use quarry_storage::grace_join::GraceHashJoinExec;

const BATCH_ROWS: usize = 8192;
const BUDGET: usize = 256 * 1024;

fn part_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("p_key", DataType::Int64, true),
        Field::new("p_name", DataType::Utf8, false),
        Field::new("p_brand", DataType::Utf8View, false),
    ]))
}

fn lineitem_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![Field::new("l_key", DataType::Int64, true), Field::new("l_qty", DataType::Int64, false)]))
}

/// `rows` parts with keys 0.., one in `null_every` keyless; `key` maps a row number to its key.
fn parts(rows: usize, null_every: usize, key: impl Fn(usize) -> i64) -> Vec<RecordBatch> {
    (0..rows)
        .step_by(BATCH_ROWS)
        .map(|start| {
            let range = start..(start + BATCH_ROWS).min(rows);
            let keys: Int64Array = range.clone().map(|i| (i % null_every != 7).then(|| key(i))).collect();
            let names: StringArray = range.clone().map(|i| Some(format!("part name {i:06}"))).collect();
            // Longer than 12 bytes, so the views point into data buffers.
            let brands: StringViewArray = range.map(|i| Some(format!("brand-with-a-long-name-{}", i % 97))).collect();
            RecordBatch::try_new(part_schema(), vec![Arc::new(keys), Arc::new(names), Arc::new(brands)]).unwrap()
        })
        .collect()
}

/// `rows` line items over keys 0..25,000 (parts above 20,000 do not exist), one in `null_every` keyless.
fn lineitems(rows: usize, null_every: usize) -> Vec<RecordBatch> {
    (0..rows)
        .step_by(BATCH_ROWS)
        .map(|start| {
            let range = start..(start + BATCH_ROWS).min(rows);
            let keys: Int64Array = range.clone().map(|i| (i % null_every != 3).then(|| ((i * 7919) % 25_000) as i64)).collect();
            let qty: Int64Array = range.map(|i| Some((i % 50) as i64)).collect();
            RecordBatch::try_new(lineitem_schema(), vec![Arc::new(keys), Arc::new(qty)]).unwrap()
        })
        .collect()
}

fn bytes(batches: &[RecordBatch]) -> usize {
    batches.iter().map(RecordBatch::get_array_memory_size).sum()
}

/// The batches dealt round-robin over `partitions` partitions of an in-memory scan.
fn memory_scan(batches: &[RecordBatch], schema: SchemaRef, partitions: usize) -> Arc<dyn ExecutionPlan> {
    let mut split = vec![Vec::new(); partitions];
    for (i, batch) in batches.iter().enumerate() {
        split[i % partitions].push(batch.clone());
    }
    MemorySourceConfig::try_new_exec(&split, schema, None).unwrap()
}

/// One partition of a scan without statistics.
#[derive(Debug)]
struct Batches(SchemaRef, Vec<RecordBatch>);

impl PartitionStream for Batches {
    fn schema(&self) -> &SchemaRef {
        &self.0
    }

    fn execute(&self, _ctx: Arc<TaskContext>) -> SendableRecordBatchStream {
        let batches = self.1.clone().into_iter().map(Ok);
        Box::pin(RecordBatchStreamAdapter::new(Arc::clone(&self.0), futures::stream::iter(batches)))
    }
}

/// `l_qty < 25 AND p_brand <> 'brand-with-a-long-name-3'`.
fn join_filter() -> JoinFilter {
    let schema =
        Arc::new(Schema::new(vec![Field::new("p_brand", DataType::Utf8View, false), Field::new("l_qty", DataType::Int64, false)]));
    let qty: Arc<dyn PhysicalExpr> = Arc::new(BinaryExpr::new(col("l_qty", &schema).unwrap(), Operator::Lt, lit(25i64)));
    let brand = Arc::new(BinaryExpr::new(
        col("p_brand", &schema).unwrap(),
        Operator::NotEq,
        lit(datafusion::common::ScalarValue::Utf8View(Some("brand-with-a-long-name-3".into()))),
    ));
    let columns = vec![ColumnIndex { index: 2, side: JoinSide::Left }, ColumnIndex { index: 1, side: JoinSide::Right }];
    JoinFilter::new(Arc::new(BinaryExpr::new(qty, Operator::And, brand)), columns, schema)
}

fn hash_join(
    left: Arc<dyn ExecutionPlan>,
    right: Arc<dyn ExecutionPlan>,
    join_type: JoinType,
    filter: Option<JoinFilter>,
    projection: Option<Vec<usize>>,
    null_equality: NullEquality,
) -> HashJoinExec {
    let on = vec![(col("p_key", &left.schema()).unwrap(), col("l_key", &right.schema()).unwrap())];
    let mode = if left.output_partitioning().partition_count() == 1 { PartitionMode::CollectLeft } else { PartitionMode::Auto };
    HashJoinExec::try_new(left, right, on, filter, &join_type, projection, mode, null_equality, false).unwrap()
}

async fn run(plan: Arc<dyn ExecutionPlan>) -> datafusion::error::Result<Vec<RecordBatch>> {
    collect(plan, Arc::new(TaskContext::default())).await
}

/// All rows, each in Arrow's row format, sorted: equal for equal multisets of rows.
fn sorted_rows(schema: &SchemaRef, batches: &[RecordBatch]) -> Vec<Vec<u8>> {
    let fields = schema.fields().iter().map(|field| SortField::new(field.data_type().clone())).collect();
    let converter = RowConverter::new(fields).unwrap();
    let mut rows = Vec::new();
    for batch in batches {
        rows.extend(converter.convert_columns(batch.columns()).unwrap().iter().map(|row| row.as_ref().to_vec()));
    }
    rows.sort();
    rows
}

fn assert_empty_dir(dir: &Path) {
    let left: Vec<_> = std::fs::read_dir(dir).unwrap().map(|entry| entry.unwrap().path()).collect();
    assert!(left.is_empty(), "spill files left behind: {left:?}");
}

/// Runs `reference` and a Grace join made from `join` (the same join, maybe over other scans of
/// the same rows) within `budget`; checks they agree, the budget held, and the spill files are gone.
async fn assert_same_results(reference: HashJoinExec, join: &HashJoinExec, budget: usize) -> Arc<GraceHashJoinExec> {
    let dir = tempfile::tempdir().unwrap();
    let grace = Arc::new(GraceHashJoinExec::try_from_hash_join(join, budget, dir.path().to_path_buf()).unwrap());
    assert_eq!(grace.schema(), reference.schema());
    let schema = reference.schema();
    let expected = sorted_rows(&schema, &run(Arc::new(reference)).await.unwrap());
    let actual = sorted_rows(&schema, &run(Arc::clone(&grace) as _).await.unwrap());
    assert_eq!(actual.len(), expected.len(), "{} join: row counts differ", join.join_type());
    assert!(actual == expected, "{} join: rows differ", join.join_type());
    assert_eq!(grace.output_rows(), expected.len());
    // It spills when the build side's join would not fit in the budget, and only then.
    let build_bytes: usize = run(Arc::clone(join.left())).await.unwrap().iter().map(|b| b.get_array_memory_size()).sum();
    if 2 * build_bytes > budget {
        assert!(grace.spilled_bytes() > 0, "{} join: {build_bytes} build bytes in a budget of {budget}", join.join_type());
    } else if 4 * build_bytes < budget {
        assert_eq!(grace.spilled_bytes(), 0, "{} join: {build_bytes} build bytes in a budget of {budget}", join.join_type());
    }
    assert!(grace.max_build_partition_bytes() <= budget, "{} > {budget}", grace.max_build_partition_bytes());
    assert_empty_dir(dir.path());
    grace
}

#[tokio::test]
async fn grace_inner_join_matches_hash_join_within_budget() {
    let (build, probe) = (parts(20_000, 53, |i| i as i64), lineitems(200_000, 101));
    assert!(BUDGET < bytes(&build) && BUDGET < bytes(&probe));
    let join = || hash_join(memory_scan(&build, part_schema(), 1), memory_scan(&probe, lineitem_schema(), 4), JoinType::Inner, None, None, NullEquality::NullEqualsNothing);
    let grace = assert_same_results(join(), &join(), BUDGET).await;
    assert!(grace.output_rows() > 100_000);
    assert!(grace.spill_partitions() >= 2 && grace.max_build_partition_bytes() > 0);
}

#[tokio::test]
async fn grace_join_with_filter_projection_and_null_keys_matching() {
    let (build, probe) = (parts(20_000, 997, |i| i as i64), lineitems(200_000, 1009));
    // Output: l_qty, p_name, l_key.
    let join = || {
        let (left, right) = (memory_scan(&build, part_schema(), 1), memory_scan(&probe, lineitem_schema(), 4));
        hash_join(left, right, JoinType::Inner, Some(join_filter()), Some(vec![4, 1, 3]), NullEquality::NullEqualsNull)
    };
    let grace = assert_same_results(join(), &join(), BUDGET).await;
    assert!(grace.output_rows() > 10_000);
}

#[tokio::test]
async fn grace_outer_semi_anti_and_mark_joins_match_hash_join() {
    // Also with a tiny side, so that many partitions have rows on one side only.
    for (build_rows, probe_rows) in [(20_000, 50_000), (20_000, 20), (20, 50_000)] {
        let (build, probe) = (parts(build_rows, 53, |i| i as i64), lineitems(probe_rows, 101));
        assert_joins_match(&build, &probe).await;
    }
}

async fn assert_joins_match(build: &[RecordBatch], probe: &[RecordBatch]) {
    for join_type in [
        JoinType::Left,
        JoinType::Right,
        JoinType::Full,
        JoinType::LeftSemi,
        JoinType::RightSemi,
        JoinType::LeftAnti,
        JoinType::RightAnti,
        JoinType::LeftMark,
        JoinType::RightMark,
    ] {
        for filter in [None, Some(join_filter())] {
            let join = || {
                let (left, right) = (memory_scan(build, part_schema(), 1), memory_scan(probe, lineitem_schema(), 3));
                hash_join(left, right, join_type, filter.clone(), None, NullEquality::NullEqualsNothing)
            };
            assert_same_results(join(), &join(), BUDGET).await;
        }
    }
}

#[tokio::test]
async fn grace_join_splits_partitions_over_budget_again() {
    // Without statistics the first pass makes 16 partitions of about 80 KiB, whose joins in
    // memory (rows, their copy, the hash table) take some 200 KiB: over a 96 KiB budget. (The
    // 377 NULL keys share one partition, whatever the hash: about 70 KiB in memory.)
    let (build, probe) = (parts(20_000, 53, |i| i as i64), lineitems(100_000, 101));
    let budget = 96 * 1024;
    let halves = [build[..build.len() / 2].to_vec(), build[build.len() / 2..].to_vec()];
    let streams = halves.into_iter().map(|half| Arc::new(Batches(part_schema(), half)) as Arc<dyn PartitionStream>).collect();
    let unknown_size = Arc::new(StreamingTableExec::try_new(part_schema(), streams, None, Vec::new(), false, None).unwrap());
    let probe_scan = || memory_scan(&probe, lineitem_schema(), 2);
    let join = hash_join(unknown_size, probe_scan(), JoinType::Full, None, None, NullEquality::NullEqualsNothing);
    let reference = hash_join(memory_scan(&build, part_schema(), 1), probe_scan(), JoinType::Full, None, None, NullEquality::NullEqualsNothing);
    let grace = assert_same_results(reference, &join, budget).await;
    assert!(grace.spill_partitions() > 16, "{} partitions", grace.spill_partitions());
}

#[tokio::test]
async fn grace_join_spills_when_the_memory_pool_refuses_and_stays_within_it() {
    // A budget that would hold the whole build side, in a pool that does not: the pool decides.
    let (build, probe) = (parts(20_000, 53, |i| i as i64), lineitems(100_000, 101));
    let pool_bytes = 512 * 1024;
    let pool = Arc::new(TrackConsumersPool::new(GreedyMemoryPool::new(pool_bytes), std::num::NonZeroUsize::new(3).unwrap()));
    let runtime = RuntimeEnvBuilder::new().with_memory_pool(Arc::clone(&pool) as _).build_arc().unwrap();
    let ctx = Arc::new(TaskContext::default().with_runtime(runtime));
    let join = || hash_join(memory_scan(&build, part_schema(), 1), memory_scan(&probe, lineitem_schema(), 2), JoinType::Inner, None, None, NullEquality::NullEqualsNothing);
    let dir = tempfile::tempdir().unwrap();
    let grace = Arc::new(GraceHashJoinExec::try_from_hash_join(&join(), 64 << 20, dir.path().to_path_buf()).unwrap());
    let expected = sorted_rows(&join().schema(), &run(Arc::new(join())).await.unwrap());
    let mut stream = grace.execute(0, Arc::clone(&ctx)).unwrap();
    let (mut batches, mut peak) = (Vec::new(), 0);
    while let Some(batch) = stream.next().await {
        batches.push(batch.unwrap());
        peak = peak.max(pool.reserved());
    }
    drop(stream);
    assert!(sorted_rows(&join().schema(), &batches) == expected, "rows differ");
    assert!(grace.spilled_bytes() > 0, "a build side over the pool is partitioned");
    assert!(peak > 0 && peak <= pool_bytes, "peak {peak} of a {pool_bytes}-byte pool");
    assert_eq!(pool.reserved(), 0, "everything reserved is returned");
    assert_empty_dir(dir.path());
}

#[tokio::test]
async fn grace_join_fails_when_one_key_exceeds_the_budget() {
    let dir = tempfile::tempdir().unwrap();
    let (build, probe) = (parts(20_000, 53, |_| 42), lineitems(10_000, 101));
    // A left join: the build rows must be loaded even where no probe row shares their key.
    let join = hash_join(memory_scan(&build, part_schema(), 1), memory_scan(&probe, lineitem_schema(), 1), JoinType::Left, None, None, NullEquality::NullEqualsNothing);
    let grace = GraceHashJoinExec::try_from_hash_join(&join, 64 * 1024, dir.path().to_path_buf()).unwrap();
    let error = run(Arc::new(grace)).await.unwrap_err();
    assert!(matches!(error.find_root(), DataFusionError::ResourcesExhausted(_)), "{error}");
    assert!(error.to_string().contains("memory budget of 65536 bytes"), "{error}");
    assert_empty_dir(dir.path());
}

#[tokio::test]
async fn grace_join_removes_spill_files_when_its_stream_ends_or_is_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let (build, probe) = (parts(20_000, 53, |i| i as i64), lineitems(100_000, 101));
    let join = hash_join(memory_scan(&build, part_schema(), 1), memory_scan(&probe, lineitem_schema(), 1), JoinType::Inner, None, None, NullEquality::NullEqualsNothing);
    let grace = GraceHashJoinExec::try_from_hash_join(&join, BUDGET, dir.path().to_path_buf()).unwrap();

    // Drained: the files are gone before the stream itself is dropped.
    let mut stream = grace.execute(0, Arc::new(TaskContext::default())).unwrap();
    while let Some(batch) = stream.next().await {
        batch.unwrap();
    }
    assert_empty_dir(dir.path());
    drop(stream);

    // Dropped half way: the files exist while it runs and go with it.
    let mut stream = grace.execute(0, Arc::new(TaskContext::default())).unwrap();
    stream.next().await.unwrap().unwrap();
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    drop(stream);
    assert_empty_dir(dir.path());
}

#[tokio::test]
async fn grace_join_rejects_a_zero_budget_and_null_aware_anti_joins() {
    let (build, probe) = (parts(100, 53, |i| i as i64), lineitems(100, 101));
    let join = hash_join(memory_scan(&build, part_schema(), 1), memory_scan(&probe, lineitem_schema(), 1), JoinType::Inner, None, None, NullEquality::NullEqualsNothing);
    assert!(GraceHashJoinExec::try_from_hash_join(&join, 0, std::env::temp_dir()).is_err());

    let (left, right) = (memory_scan(&build, part_schema(), 1), memory_scan(&probe, lineitem_schema(), 1));
    let on = vec![(col("p_key", &left.schema()).unwrap(), col("l_key", &right.schema()).unwrap())];
    let not_in = HashJoinExec::try_new(left, right, on, None, &JoinType::LeftAnti, None, PartitionMode::CollectLeft, NullEquality::NullEqualsNothing, true)
        .unwrap();
    let error = GraceHashJoinExec::try_from_hash_join(&not_in, BUDGET, std::env::temp_dir()).unwrap_err();
    assert!(matches!(error, DataFusionError::NotImplemented(_)), "{error}");
}

/// Passthrough reads larger than a node accepts are split into reads of at most the limit,
/// cutting long ranges, and the answers join back into exactly the bytes of each range.
#[test]
fn segment_reads_split_to_the_limit_and_join_back() {
    use quarry_storage::SegmentRead;
    let file: Vec<u8> = (0..1000u32).map(|i| (i * 7 % 251) as u8).collect();
    let ranges = vec![0..250, 300..310, 400..1000];
    for max in [1, 7, 100, 250, 260, 10_000] {
        let reads = SegmentRead::split("t", 3, "s", &ranges, max);
        assert!(reads.iter().all(|r| r.len() <= max && r.len() > 0 && r.table == "t" && r.version == 3 && r.segment == "s"), "max {max}");
        assert_eq!(reads.iter().map(SegmentRead::len).sum::<u64>(), 860, "max {max}");
        let expected_reads = 860u64.div_ceil(max) as usize;
        assert_eq!(reads.len(), expected_reads, "reads are filled to the limit, max {max}");
        let pieces: Vec<bytes::Bytes> =
            reads.iter().flat_map(|r| r.ranges.iter().map(|p| bytes::Bytes::copy_from_slice(&file[p.start as usize..p.end as usize]))).collect();
        let joined = SegmentRead::join(&ranges, pieces).unwrap();
        for (bytes, range) in joined.iter().zip(&ranges) {
            assert!(bytes[..] == file[range.start as usize..range.end as usize], "max {max} range {range:?}");
        }
    }
    let short = SegmentRead::join(&ranges, vec![bytes::Bytes::from(vec![0u8; 250]), bytes::Bytes::from(vec![0u8; 5])]).unwrap_err();
    assert!(short.contains("got 5 bytes for range 300..310"), "{short}");
}

/// An emulated link charges every transfer its time, even one shorter than tokio's 1 ms
/// tick, and transfers at once share it as a fluid: one beside another takes twice its time
/// alone, and a tiny one beside forty long ones is not queued behind them (the limiter once
/// queued transfers whole, then by 250 µs turns, so a 1 KB read beside forty streams waited
/// about 10 ms for its turn). The bounds leave milliseconds for a loaded machine's wake-ups:
/// under the whole suite on 2 cores a 90 µs wait took 1.7 ms.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_link_charges_short_transfers_and_shares_itself_fairly() {
    use quarry_storage::BandwidthLimiter;
    use std::time::{Duration, Instant};
    let link = Arc::new(BandwidthLimiter::new(100.0));
    // 100 KB at 100 MB/s: 1 ms.
    let started = Instant::now();
    link.consume(100_000).await;
    assert!(started.elapsed() >= Duration::from_micros(950), "{:?}", started.elapsed());

    let long = |bytes: u64| {
        let link = Arc::clone(&link);
        tokio::spawn(async move { link.consume(bytes).await })
    };
    // 100 KB beside a 10 MB stream: 2 ms, its half of the link (queued behind the stream
    // whole, about 100 ms).
    let stream = long(10_000_000);
    tokio::time::sleep(Duration::from_millis(5)).await;
    let asked = Instant::now();
    link.consume(100_000).await;
    let shared = asked.elapsed();
    assert!(shared >= Duration::from_micros(1900) && shared < Duration::from_millis(20), "100 KB beside one stream took {shared:?}");
    stream.await.unwrap();

    // 1 KB beside forty 250 KB streams: 0.4 ms at its forty-first of the link; all 10 MB take
    // 100 ms.
    let started = Instant::now();
    let streams: Vec<_> = (0..40).map(|_| long(250_000)).collect();
    tokio::time::sleep(Duration::from_millis(5)).await;
    let asked = Instant::now();
    link.consume(1_000).await;
    let tiny = asked.elapsed();
    for stream in streams {
        stream.await.unwrap();
    }
    assert!(tiny < Duration::from_millis(5), "1 KB beside forty streams waited {tiny:?}");
    assert!(started.elapsed() >= Duration::from_millis(100), "{:?}", started.elapsed());
}

/// Writes go through the `StorageNode` seam: a write commits as one version, an aborted one
/// and one whose lease ran out change nothing and leave the table unlocked.
#[tokio::test]
async fn writes_behind_the_storage_node_commit_abort_and_expire() {
    use quarry_storage::{BeginWrite, LocalStorageNode, StorageNode};
    use quarry_table::manifest::TableSchema;

    let dir = tempfile::tempdir().unwrap();
    let warehouse = quarry_table::Warehouse::open(dir.path()).unwrap();
    let node = LocalStorageNode::new(warehouse).with_write_lease(std::time::Duration::from_millis(200));
    let schema = Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, false)]));
    let begin = BeginWrite {
        table: "t".into(),
        schema: TableSchema::from_arrow(&schema),
        append: true,
        bloom_filter_columns: Vec::new(),
        sort_key: Vec::new(),
        page_encoding: Default::default(),
    };
    let batch = |from: i64| RecordBatch::try_new(Arc::clone(&schema), vec![Arc::new(Int64Array::from_iter_values(from..from + 100))]).unwrap();
    let put = |write: String, from: i64| {
        let (node, schema) = (&node, Arc::clone(&schema));
        async move { node.put_segment(&write, schema, Box::pin(futures::stream::iter([Ok(batch(from))]))).await }
    };

    let write = node.begin_write(begin.clone()).await.unwrap();
    assert_eq!(put(write.clone(), 0).await.unwrap(), 100);
    let version = node.commit_write(&write, Vec::new()).await.unwrap();
    assert_eq!(node.table_info("t").await.unwrap().total_rows(), 100);

    // Aborted: nothing changes, and the table can be written again at once.
    let write = node.begin_write(begin.clone()).await.unwrap();
    put(write.clone(), 100).await.unwrap();
    node.abort_write(&write).await.unwrap();
    assert_eq!(node.table_info("t").await.unwrap().version, version);

    // A host that went away: its write expires with its lease, and the next one proceeds.
    let abandoned = node.begin_write(begin.clone()).await.unwrap();
    put(abandoned.clone(), 200).await.unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let write = node.begin_write(begin.clone()).await.unwrap();
    assert!(node.commit_write(&abandoned, Vec::new()).await.unwrap_err().to_string().contains("lease ran out"));
    put(write.clone(), 300).await.unwrap();
    node.commit_write(&write, Vec::new()).await.unwrap();
    let info = node.table_info("t").await.unwrap();
    assert_eq!((info.version, info.total_rows()), (version + 1, 200));
}

/// A leaf may read each segment range of a table with a sorted copy from another copy, never
/// one range from two (their rows would be read twice).
#[test]
fn a_leaf_reads_each_segment_range_from_one_copy() {
    use quarry_storage::catalog::select_segments;
    use quarry_table::ingest::{write_batches, write_segments_of};
    use quarry_table::{SegmentOptions, SortedVersion, Warehouse, WriteMode};

    let dir = tempfile::tempdir().unwrap();
    let warehouse = Warehouse::open(dir.path()).unwrap();
    let schema = lineitem_schema();
    let rows = |from: i64| RecordBatch::try_new(Arc::clone(&schema), vec![Arc::new(Int64Array::from_iter_values(from..from + 100)), Arc::new(Int64Array::from_iter_values((from..from + 100).rev()))]).unwrap();
    let writer = warehouse.begin_write("t", &schema, WriteMode::Replace, SegmentOptions::default(), vec!["l_key".into()]).unwrap();
    let own = write_batches(&writer, std::iter::once(Ok(rows(0))), &|_| {}).unwrap();
    let copy = write_segments_of(&writer, std::iter::once(Ok(rows(0))), 1000, Some("l_qty"), &|_| {}).unwrap();
    writer.commit_with_versions(own, vec![SortedVersion { sort_key: vec!["l_qty".into()], segments: copy }], vec![]).unwrap();
    let writer = warehouse.begin_write("t", &schema, WriteMode::Append, SegmentOptions::default(), vec![]).unwrap();
    let appended = write_batches(&writer, std::iter::once(Ok(rows(100))), &|_| {}).unwrap();
    let manifest = writer.commit(appended, vec![]).unwrap();
    let snapshot = warehouse.table("t").unwrap();
    let (own, copy) = (&manifest.segments, &manifest.versions[0].segments);
    assert_eq!((own.len(), copy.len()), (2, 2));
    assert_ne!(own[0].range, own[1].range);

    let ids = |segments: &[&quarry_table::SegmentMeta]| segments.iter().map(|s| s.id.clone()).collect::<Vec<_>>();
    // The first range from the copy, the appended one from the table's own segments.
    let mixed = select_segments(&snapshot, &ids(&[&copy[0], &own[1]])).unwrap();
    assert_eq!(mixed.iter().map(|s| s.rows).sum::<u64>(), 200);
    // The first range from both copies.
    let err = select_segments(&snapshot, &ids(&[&own[0], &own[1], &copy[0]])).unwrap_err().to_string();
    assert!(err.contains("belongs to another sorted copy than segment"), "{err}");
    assert!(select_segments(&snapshot, &["nope".to_string()]).unwrap_err().to_string().contains("has no segment 'nope'"));
}
