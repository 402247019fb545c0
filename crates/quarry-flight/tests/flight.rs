//! A storage node over Flight must not trust what it is sent: fragments naming file paths,
//! unknown tables, segments or columns, filters that misname their input's columns, and bytes
//! that are no plan at all, and operators that are not node operators (`NodeOp`) are rejected
//! with an error, and the node keeps serving.

use std::sync::Arc;

use arrow::array::{Int64Array, RecordBatch};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::logical_expr::Operator;
use datafusion::physical_expr::expressions::{BinaryExpr, Column, lit};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::common::{JoinType, NullEquality};
use datafusion::physical_expr::{LexOrdering, PhysicalSortExpr};
use datafusion::physical_plan::filter::FilterExec;
use datafusion::physical_plan::joins::{HashJoinExec, PartitionMode};
use datafusion::physical_plan::limit::LocalLimitExec;
use datafusion::physical_plan::sorts::sort::SortExec;
use futures::TryStreamExt;
use quarry_flight::{RemoteStorageNode, ServeOptions, serve};
use quarry_storage::{Fragment, FragmentPlan, LinkCodec, LocalStorageNode, ScanLeaf, ScanLeafExec, ScanMessage, SegmentRead, StorageNode, built_fragment, encode_fragment};
use quarry_table::{SegmentOptions, Warehouse, WriteMode};

mod fault_sim;

const TOKEN: &str = "test-token";

fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, false), Field::new("value", DataType::Int64, false)]))
}

/// A warehouse with table `t` (ids 0..1000, value = 2 * id) in one segment.
fn warehouse(dir: &std::path::Path) -> (Warehouse, String) {
    let warehouse = Warehouse::open(dir).unwrap();
    let writer = warehouse.begin_write("t", &schema(), WriteMode::Replace, SegmentOptions::default(), Vec::new()).unwrap();
    let mut segment = writer.new_segment().unwrap();
    let ids: Vec<i64> = (0..1000).collect();
    let batch = RecordBatch::try_new(
        schema(),
        vec![Arc::new(Int64Array::from(ids.clone())), Arc::new(Int64Array::from_iter_values(ids.iter().map(|i| i * 2)))],
    )
    .unwrap();
    segment.write(&batch).unwrap();
    let meta = segment.finish().unwrap();
    let id = meta.id.clone();
    writer.commit(vec![meta], Vec::new()).unwrap();
    (warehouse, id)
}

/// Starts a node on a free loopback port; returns its URL.
async fn start_node(warehouse: Warehouse) -> String {
    let node = Arc::new(LocalStorageNode::new(warehouse));
    let (tx, rx) = tokio::sync::oneshot::channel();
    let options = ServeOptions { listen: "127.0.0.1:0".parse().unwrap(), token: Some(TOKEN.into()), metrics_listen: None, tls: None, insecure: false };
    tokio::spawn(serve(node, options, move |url, _| {
        let _ = tx.send(url);
    }));
    rx.await.unwrap()
}

fn leaf(table: &str, segments: Vec<String>, projection: &[&str], schema: SchemaRef) -> ScanLeafExec {
    let leaf = ScanLeaf { table: table.into(), version: 1, segments, projection: projection.iter().map(|c| c.to_string()).collect(), limit: None };
    ScanLeafExec::new(leaf, schema)
}

async fn run(node: &dyn StorageNode, fragment: Fragment) -> datafusion::error::Result<Vec<ScanMessage>> {
    node.execute(fragment).await?.try_collect().await
}

/// `plan` as the host sends it to `node`: encoded, or as built for a node in its process.
fn fragment_for(node: &dyn StorageNode, plan: Arc<dyn ExecutionPlan>) -> Fragment {
    if node.in_process() { built_fragment(plan) } else { encode_fragment(plan).unwrap() }
}

async fn rejected(node: &dyn StorageNode, plan: Arc<dyn ExecutionPlan>) -> String {
    match run(node, fragment_for(node, plan)).await {
        Ok(messages) => panic!("the node ran a bad fragment and returned {} messages", messages.len()),
        Err(e) => e.to_string(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_rejects_bad_fragments_and_keeps_serving() {
    let dir = tempfile::tempdir().unwrap();
    let (warehouse, segment) = warehouse(dir.path());
    let url = start_node(warehouse).await;
    let node = RemoteStorageNode::connect(&url, Some(TOKEN), None).await.unwrap();
    rejects_bad_fragments(&node, Some(&url), &segment).await;
    // Bytes that are no plan.
    for garbage in [&b""[..], b"\x00\x01\x02garbage", &[0xff; 64]] {
        let error = run(&node, Fragment { plan: FragmentPlan::Encoded(bytes::Bytes::copy_from_slice(garbage)), link_codec: LinkCodec::None, demand: 0, progress: Default::default() }).await.unwrap_err().to_string();
        assert!(error.contains("fragment rejected: the plan does not decode"), "{garbage:?}: {error}");
        assert!(!error.contains("bug report") && !error.contains('\n'), "one line in Quarry's words: {error}");
    }
}

/// A node in the host's process takes plans built there without encoding them, and checks
/// them as it checks decoded ones: the same fragments are rejected with the same errors.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_in_process_checks_built_fragments_as_decoded_ones() {
    let dir = tempfile::tempdir().unwrap();
    let (warehouse, segment) = warehouse(dir.path());
    let node = LocalStorageNode::new(warehouse);
    assert!(node.in_process());
    rejects_bad_fragments(&node, None, &segment).await;
    // A leaf that claims columns of another type than the table's.
    let info = node.table_info("t").await.unwrap();
    let claimed = Arc::new(Schema::new(vec![Field::new("id", DataType::Utf8, false)]));
    let plan = leaf("t", vec![], &["id"], claimed).with_segments(info.version, vec![segment]);
    let error = rejected(&node, Arc::new(plan)).await;
    assert!(error.contains("does not have the table's columns"), "{error}");
}

/// The fragments every node rejects, whether they came encoded or built, and a good one it
/// still runs after them; `name`, how errors name the node (a remote one's URL).
async fn rejects_bad_fragments(node: &dyn StorageNode, name: Option<&str>, segment: &str) {
    let segment = segment.to_string();
    let info = node.table_info("t").await.unwrap();
    assert_eq!(info.total_rows(), 1000);
    let version = info.version;
    let with_version = |l: ScanLeafExec| l.with_segments(version, vec![segment.clone()]);
    let both = schema();

    // A table named by a file path.
    for table in ["/etc/passwd", "../t", "t/data", "t/../t"] {
        let error = rejected(node, Arc::new(with_version(leaf(table, vec![], &["id"], Arc::clone(&both))))).await;
        assert!(error.contains("not found"), "{table}: {error}");
        assert!(name.is_none_or(|name| error.contains(name)), "the error names the node: {error}");
    }
    // A segment named by a file path, or one the table does not have.
    for id in ["../../etc/passwd", "data/x.parquet", "nope"] {
        let plan = leaf("t", vec![id.into()], &["id"], Arc::clone(&both)).with_segments(version, vec![id.into()]);
        let error = rejected(node, Arc::new(plan)).await;
        assert!(error.contains(&format!("no segment '{id}'")), "{id}: {error}");
    }
    // An unknown column.
    let plan = with_version(leaf("t", vec![], &["id", "secret"], Arc::clone(&both)));
    let error = rejected(node, Arc::new(plan)).await;
    assert!(error.contains("has no column 'secret'"), "{error}");
    // A filter whose column is not its input's column of that name at that index.
    let scan: Arc<dyn ExecutionPlan> = Arc::new(with_version(leaf("t", vec![], &["id", "value"], Arc::clone(&both))));
    for column in [Column::new("value", 0), Column::new("nope", 1)] {
        let predicate = Arc::new(BinaryExpr::new(Arc::new(column.clone()), Operator::Gt, lit(5i64)));
        let filter = FilterExec::try_new(predicate, Arc::clone(&scan)).unwrap();
        let error = rejected(node, Arc::new(filter)).await;
        assert!(error.contains(&format!("unknown column '{}'", column.name())), "{column}: {error}");
    }
    // Operators a node does not run: a sort without a limit, a limit (the leaf carries it), a
    // join type placement never pushes.
    let order = LexOrdering::new(vec![PhysicalSortExpr::new_default(Arc::new(Column::new("id", 0)))]).unwrap();
    let sort = SortExec::new(order.clone(), Arc::clone(&scan));
    let error = rejected(node, Arc::new(sort)).await;
    assert!(error.contains("only top-k sorts"), "{error}");
    let top_k = SortExec::new(order, Arc::clone(&scan)).with_fetch(Some(3));
    let messages = run(node, fragment_for(node, Arc::new(top_k))).await.unwrap();
    assert_eq!(messages.iter().map(|m| if let ScanMessage::Batch(b) = m { b.num_rows() } else { 0 }).sum::<usize>(), 3, "a top-k runs");
    let error = rejected(node, Arc::new(LocalLimitExec::new(Arc::clone(&scan), 5))).await;
    assert!(error.contains("operator LocalLimitExec is not run in storage"), "{error}");
    let on = vec![(Arc::new(Column::new("id", 0)) as _, Arc::new(Column::new("id", 0)) as _)];
    for (join_type, runs) in [(JoinType::Left, false), (JoinType::LeftAnti, false), (JoinType::Inner, true)] {
        let join = HashJoinExec::try_new(Arc::clone(&scan), Arc::clone(&scan), on.clone(), None, &join_type, None, PartitionMode::CollectLeft, NullEquality::NullEqualsNothing, false).unwrap();
        match run(node, fragment_for(node, Arc::new(join))).await {
            Ok(messages) => assert!(runs, "{join_type} ran: {} messages", messages.len()),
            Err(e) => assert!(!runs && e.to_string().contains(&format!("join type {join_type} is not run in storage")), "{join_type}: {e}"),
        }
    }
    // Still serving, and a good fragment gives the right rows.
    let predicate = Arc::new(BinaryExpr::new(Arc::new(Column::new("id", 0)), Operator::Lt, lit(10i64)));
    let filter = FilterExec::try_new(predicate, scan).unwrap();
    let messages = run(node, fragment_for(node, Arc::new(filter))).await.unwrap();
    let rows: usize = messages.iter().map(|m| if let ScanMessage::Batch(b) = m { b.num_rows() } else { 0 }).sum();
    assert_eq!(rows, 10);
    assert!(matches!(messages.last(), Some(ScanMessage::Finished(_))));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_without_the_token_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (warehouse, _) = warehouse(dir.path());
    let url = start_node(warehouse).await;
    let error = RemoteStorageNode::connect(&url, None, None).await.unwrap_err();
    assert!(error.contains("requires a token"), "{error}");
    let error = RemoteStorageNode::connect(&url, Some("guess"), None).await.unwrap_err();
    assert!(error.contains("wrong token"), "{error}");
    RemoteStorageNode::connect(&url, Some(TOKEN), None).await.unwrap();
}

/// A node's accepted connections send small messages at once: with Nagle's algorithm a
/// fragment's closing statistics waited for the host's delayed ACK (about 40 ms a fragment).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accepted_connections_do_not_wait_for_acks() {
    use futures::StreamExt;
    let options = ServeOptions { listen: "127.0.0.1:0".parse().unwrap(), token: None, metrics_listen: None, tls: None, insecure: false };
    let (mut incoming, address, _, _) = quarry_flight::listen(&options).await.unwrap();
    let _client = tokio::net::TcpStream::connect(address).await.unwrap();
    let accepted = incoming.next().await.unwrap().unwrap();
    assert!(accepted.nodelay().unwrap(), "TCP_NODELAY is not set on the accepted connection");
}

/// Passthrough reads: the stored bytes of a segment, exactly, over several Flight results when
/// larger than one; reads of segments the version lacks or of bytes beyond the file refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_segment_serves_exactly_the_stored_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let warehouse = Warehouse::open(dir.path()).unwrap();
    let writer = warehouse.begin_write("r", &schema(), WriteMode::Replace, SegmentOptions::default(), Vec::new()).unwrap();
    let mut segment = writer.new_segment().unwrap();
    // Values that do not compress: a file of several Flight results.
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state as i64
    };
    let ids: Vec<i64> = (0..400_000).map(|_| next()).collect();
    let values: Vec<i64> = (0..400_000).map(|_| next()).collect();
    let batch = RecordBatch::try_new(schema(), vec![Arc::new(Int64Array::from(ids)), Arc::new(Int64Array::from(values))]).unwrap();
    segment.write(&batch).unwrap();
    let meta = segment.finish().unwrap();
    let id = meta.id.clone();
    writer.commit(vec![meta], Vec::new()).unwrap();
    let snapshot = warehouse.table("r").unwrap();
    let file = std::fs::read(snapshot.segment_path(&snapshot.manifest.segments[0])).unwrap();
    assert!(file.len() > 3 << 20, "the segment should span several results: {} bytes", file.len());
    let url = start_node(warehouse).await;
    let node = RemoteStorageNode::connect(&url, Some(TOKEN), None).await.unwrap();
    let version = node.table_info("r").await.unwrap().version;
    let size = file.len() as u64;
    let read = |segment: &str, ranges: Vec<std::ops::Range<u64>>| SegmentRead { table: "r".into(), version, segment: segment.into(), ranges };

    let ranges = vec![0..size, 4..10, size - 8..size];
    let parts = node.read_segment(read(&id, ranges.clone())).await.unwrap();
    assert_eq!(parts.len(), ranges.len());
    for (part, range) in parts.iter().zip(&ranges) {
        assert!(part[..] == file[range.start as usize..range.end as usize], "range {range:?} differs from the file");
    }

    for (segment, ranges, expected) in [
        ("nope", vec![0..4], "no segment 'nope'".to_string()),
        ("../../etc/passwd", vec![0..4], "no segment '../../etc/passwd'".to_string()),
        (id.as_str(), vec![0..size + 1], format!("it has {size} bytes")),
        (id.as_str(), vec![8..8], format!("it has {size} bytes")),
    ] {
        let error = node.read_segment(read(segment, ranges.clone())).await.unwrap_err().to_string();
        assert!(error.contains(&expected), "{segment} {ranges:?}: {error}");
        assert!(error.contains(&url), "the error names the node: {error}");
    }
}

/// A fragment's batches cross the link compressed when the host asks: the same rows under every
/// codec, the compressed ones in fewer bytes (counted as sent: `link_bytes`, with the ticket that
/// crossed the other way), the Arrow bytes unchanged; a ticket naming a codec the node does not
/// know is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compressed_links_carry_the_same_rows_in_fewer_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let (warehouse, segment) = warehouse(dir.path());
    let url = start_node(warehouse).await;
    let node = RemoteStorageNode::connect(&url, Some(TOKEN), None).await.unwrap();
    let version = node.table_info("t").await.unwrap().version;
    let scan: Arc<dyn ExecutionPlan> = Arc::new(leaf("t", vec![], &["id", "value"], schema()).with_segments(version, vec![segment]));
    // A filter makes it pushdown (a bare leaf is read as stored bytes by the host instead).
    let predicate = Arc::new(BinaryExpr::new(Arc::new(Column::new("id", 0)), Operator::GtEq, lit(0i64)));
    let plan: Arc<dyn ExecutionPlan> = Arc::new(FilterExec::try_new(predicate, scan).unwrap());
    let mut results = Vec::new();
    let mut ticket_bytes = 0;
    for codec in LinkCodec::ALL {
        let mut fragment = encode_fragment(Arc::clone(&plan)).unwrap();
        fragment.link_codec = codec;
        ticket_bytes = quarry_flight::wire::encode_ticket(&fragment).unwrap().len() as u64;
        let messages = run(&node, fragment).await.unwrap();
        let batches: Vec<RecordBatch> = messages.iter().filter_map(|m| if let ScanMessage::Batch(b) = m { Some(b.clone()) } else { None }).collect();
        let Some(ScanMessage::Finished(stats)) = messages.last() else { panic!("{codec:?}: no closing statistics") };
        results.push((codec, arrow::compute::concat_batches(&schema(), &batches).unwrap(), stats.clone()));
    }
    let (_, plain_rows, plain) = &results[0];
    assert_eq!(plain_rows.num_rows(), 1000);
    assert!(ticket_bytes > 0);
    // Uncompressed, the Arrow bytes cross (with IPC's headers and padding), and the ticket.
    let arrow = plain.bytes_returned + ticket_bytes;
    assert!(plain.link_bytes >= arrow && plain.link_bytes < arrow + arrow / 10, "uncompressed: {} link bytes for {arrow}", plain.link_bytes);
    for (codec, rows, stats) in &results[1..] {
        assert_eq!(rows, plain_rows, "{codec:?} changed the rows");
        assert_eq!(stats.bytes_returned, plain.bytes_returned, "{codec:?}");
        assert!(stats.link_bytes > 0 && stats.link_bytes < plain.bytes_returned * 3 / 4, "{codec:?}: {} link bytes of {} Arrow bytes", stats.link_bytes, plain.bytes_returned);
    }

    let channel = tonic::transport::Endpoint::from_shared(url.replace("grpc://", "http://")).unwrap().connect().await.unwrap();
    let mut client = arrow_flight::flight_service_client::FlightServiceClient::new(channel);
    let mut request = tonic::Request::new(arrow_flight::Ticket { ticket: bytes::Bytes::from_static(b"Q\x07\0\0\0\0\0\0\0\0plan") });
    request.metadata_mut().insert("authorization", format!("Bearer {TOKEN}").parse().unwrap());
    let error = client.do_get(request).await.unwrap_err();
    assert!(error.message().contains("link codec 7"), "{error}");
}

/// Rows of long strings a node filters cross the link at their own bytes, once: the node's
/// string view columns point into whole pages' buffers, which Arrow IPC would send whole with
/// every batch (TPC-H Q10's customer rows: 687 MB over loopback for 45 MB of rows). The bytes
/// are counted as they arrive, and the node's `link_bytes` says the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn filtered_strings_cross_the_link_once() {
    let dir = tempfile::tempdir().unwrap();
    let warehouse = Warehouse::open(dir.path()).unwrap();
    let stored = Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, false), Field::new("bucket", DataType::Int64, false), Field::new("text", DataType::Utf8, false)]));
    let writer = warehouse.begin_write("s", &stored, WriteMode::Replace, SegmentOptions::default(), Vec::new()).unwrap();
    let mut segment = writer.new_segment().unwrap();
    const ROWS: i64 = 200_000;
    let text = |i: i64| format!("{i:>10} and ninety more bytes of text that no dictionary or run could make any shorter {:>6}", i * 7919 % 1_000_003);
    let batch = RecordBatch::try_new(
        Arc::clone(&stored),
        vec![
            Arc::new(Int64Array::from_iter_values(0..ROWS)),
            Arc::new(Int64Array::from_iter_values((0..ROWS).map(|i| i % 4))),
            Arc::new(arrow::array::StringArray::from_iter_values((0..ROWS).map(text))),
        ],
    )
    .unwrap();
    segment.write(&batch).unwrap();
    let meta = segment.finish().unwrap();
    let id = meta.id.clone();
    writer.commit(vec![meta], Vec::new()).unwrap();
    let url = start_node(warehouse.clone()).await;
    let node = RemoteStorageNode::connect(&url, Some(TOKEN), None).await.unwrap();
    let version = node.table_info("s").await.unwrap().version;

    let schema = quarry_storage::scan_schema(&stored);
    assert_eq!(schema.field(2).data_type(), &DataType::Utf8View, "the scan reads strings as views");
    let scan: Arc<dyn ExecutionPlan> = Arc::new(leaf("s", vec![], &["id", "bucket", "text"], Arc::clone(&schema)).with_segments(version, vec![id]));
    // A quarter of the rows, spread over every page; a comparison the node runs over its pages,
    // decoding the strings of the rows that pass.
    let predicate = Arc::new(BinaryExpr::new(Arc::new(Column::new("bucket", 1)), Operator::Eq, lit(0i64)));
    let plan: Arc<dyn ExecutionPlan> = Arc::new(FilterExec::try_new(predicate, scan).unwrap());
    let ticket = quarry_flight::wire::encode_ticket(&encode_fragment(plan).unwrap()).unwrap();

    let channel = tonic::transport::Endpoint::from_shared(url.replace("grpc://", "http://")).unwrap().connect().await.unwrap();
    let mut client = arrow_flight::flight_service_client::FlightServiceClient::new(channel).max_decoding_message_size(256 << 20);
    let mut request = tonic::Request::new(arrow_flight::Ticket { ticket: ticket.clone().into() });
    request.metadata_mut().insert("authorization", format!("Bearer {TOKEN}").parse().unwrap());
    let messages: Vec<arrow_flight::FlightData> = client.do_get(request).await.unwrap().into_inner().try_collect().await.unwrap();
    let received: usize = messages.iter().map(|m| m.data_header.len() + m.data_body.len()).sum();
    // Each kept row's id, bucket, view and out-of-line string.
    let kept = (0..ROWS).step_by(4).map(|i| 8 + 8 + 16 + text(i).len()).sum::<usize>();
    assert!(received < kept + kept / 5, "{received} bytes crossed for {kept} bytes of rows");

    // The same fragment through the client: the rows, and the count of what crossed.
    let fragment = quarry_flight::wire::decode_ticket(ticket).unwrap();
    let out = run(&node, fragment).await.unwrap();
    let rows: usize = out.iter().map(|m| if let ScanMessage::Batch(b) = m { b.num_rows() } else { 0 }).sum();
    assert_eq!(rows as i64, ROWS / 4);
    let Some(ScanMessage::Finished(stats)) = out.last() else { panic!("no closing statistics") };
    assert!(stats.link_bytes as usize >= kept && (stats.link_bytes as usize) < kept + kept / 5, "{} link bytes counted for {kept} bytes of rows", stats.link_bytes);
}

/// Fuzz targets: what a node or a loader reads from outside (a Flight ticket and the fragment
/// in it, a manifest file, a CSV file) is decoded from mutations of valid inputs and from
/// arbitrary bytes; each must give a value or an error, never a panic. Each target runs
/// `QUARRY_FUZZ_SECONDS` seconds (default 3), in rounds of 256 cases whose seeds are 0, 1, 2, ...:
/// a failure names its seed and the shrunk input, and `QUARRY_FUZZ_SEED=N` replays that round.
mod fuzz {
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use datafusion::execution::TaskContext;
    use proptest::prelude::*;
    use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
    use quarry_flight::wire::{decode_ticket, encode_ticket};
    use quarry_storage::fragment::LeafResolver;
    use quarry_storage::{Fragment, LinkCodec, decode_fragment, encode_fragment};
    use quarry_table::csv_import::{CsvBatchReader, CsvOptions, infer_csv_schema};
    use quarry_table::{Warehouse, WriteMode};

    /// A byte edit: overwrite, insert or delete at a position (taken modulo the length).
    #[derive(Debug, Clone)]
    enum Edit {
        Set(usize, u8),
        Insert(usize, u8),
        Delete(usize),
        Truncate(usize),
    }

    fn edits() -> impl Strategy<Value = Vec<Edit>> {
        let edit = prop_oneof![
            (any::<usize>(), any::<u8>()).prop_map(|(p, b)| Edit::Set(p, b)),
            (any::<usize>(), any::<u8>()).prop_map(|(p, b)| Edit::Insert(p, b)),
            any::<usize>().prop_map(Edit::Delete),
            any::<usize>().prop_map(Edit::Truncate),
        ];
        prop::collection::vec(edit, 1..8)
    }

    fn apply(seed: &[u8], edits: &[Edit]) -> Vec<u8> {
        let mut bytes = seed.to_vec();
        for edit in edits {
            let at = |p: usize, len: usize| if len == 0 { 0 } else { p % len };
            match *edit {
                Edit::Set(p, b) if !bytes.is_empty() => {
                    let i = at(p, bytes.len());
                    bytes[i] = b;
                }
                Edit::Insert(p, b) => {
                    let i = at(p, bytes.len() + 1);
                    bytes.insert(i, b);
                }
                Edit::Delete(p) if !bytes.is_empty() => {
                    let i = at(p, bytes.len());
                    bytes.remove(i);
                }
                Edit::Truncate(p) => bytes.truncate(at(p, bytes.len() + 1)),
                _ => {}
            }
        }
        bytes
    }

    /// Inputs: mutations of one of `seeds`, or arbitrary bytes.
    fn inputs(seeds: Vec<Vec<u8>>) -> impl Strategy<Value = Vec<u8>> {
        let count = seeds.len();
        prop_oneof![
            4 => (0..count, edits()).prop_map(move |(i, e)| apply(&seeds[i], &e)),
            1 => prop::collection::vec(any::<u8>(), 0..512),
        ]
    }

    /// Runs `check` on `strategy`'s inputs for the time budget (see the module docs).
    fn fuzz<S: Strategy>(name: &str, strategy: S, check: impl Fn(S::Value)) {
        let budget = Duration::from_secs_f64(std::env::var("QUARRY_FUZZ_SECONDS").ok().and_then(|s| s.parse().ok()).unwrap_or(3.0));
        let replay: Option<u64> = std::env::var("QUARRY_FUZZ_SEED").ok().and_then(|s| s.parse().ok());
        let started = Instant::now();
        let (mut seed, mut cases) = (replay.unwrap_or(0), 0u64);
        loop {
            let mut key = [0u8; 32];
            key[..8].copy_from_slice(&seed.to_le_bytes());
            let rng = TestRng::from_seed(RngAlgorithm::ChaCha, &key);
            let mut runner = TestRunner::new_with_rng(Config { cases: 256, failure_persistence: None, ..Config::default() }, rng);
            let result = runner.run(&strategy, |input| {
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| check(input))).map_err(|_| TestCaseError::fail("panicked"))
            });
            if let Err(e) = result {
                panic!("fuzz target {name}: seed {seed} failed (replay with QUARRY_FUZZ_SEED={seed}): {e:?}");
            }
            cases += 256;
            seed += 1;
            if replay.is_some() || started.elapsed() >= budget {
                break;
            }
        }
        eprintln!("fuzz target {name}: {cases} cases in {:.1} s, no panic", started.elapsed().as_secs_f64());
    }

    #[test]
    fn ticket_and_fragment_decoding() {
        let leaf = super::leaf("t", vec![], &["id", "value"], super::schema()).with_segments(1, vec!["s".into()]);
        let scan: Arc<dyn datafusion::physical_plan::ExecutionPlan> = Arc::new(leaf);
        let predicate = Arc::new(super::BinaryExpr::new(Arc::new(super::Column::new("id", 0)), super::Operator::Lt, super::lit(10i64)));
        let filter = Arc::new(super::FilterExec::try_new(predicate, Arc::clone(&scan)).unwrap());
        let seeds: Vec<Vec<u8>> = [scan, filter]
            .into_iter()
            .map(|plan| encode_ticket(&Fragment { link_codec: LinkCodec::Lz4, ..encode_fragment(plan).unwrap() }).unwrap().to_vec())
            .collect();
        let ctx = TaskContext::default();
        let resolve: LeafResolver = Arc::new(|_| Ok(super::schema()));
        fuzz("ticket_and_fragment", inputs(seeds), |ticket| {
            if let Ok(fragment) = decode_ticket(ticket.into()) {
                let _ = decode_fragment(&fragment, &ctx, Arc::clone(&resolve));
            }
        });
    }

    /// Every action the node serves, with bodies mutated from valid ones: an answer or an
    /// error, never a panic. The first byte picks the action. (Graph jobs are left out: a
    /// mutated valid job may ask for a graph of any size, which is a job, not a parse.)
    #[test]
    fn flight_actions() {
        use arrow_flight::Action;
        use arrow_flight::flight_service_server::FlightService;
        use futures::StreamExt;
        use quarry_flight::NodeService;
        use quarry_flight::wire::{BeginWrite, CommitWrite, action};
        use quarry_storage::{LocalStorageNode, SegmentRead};

        let dir = tempfile::tempdir().unwrap();
        let (warehouse, segment) = super::warehouse(dir.path());
        let manifest = warehouse.table("t").unwrap().manifest;
        let service = NodeService::new(Arc::new(LocalStorageNode::new(warehouse)));
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        fn json<T: serde::Serialize>(value: &T) -> Vec<u8> {
            serde_json::to_vec(value).unwrap()
        }
        let bodies: Vec<(&str, Vec<u8>)> = vec![
            (action::READ_SEGMENT, json(&SegmentRead { table: "t".into(), version: 1, segment, ranges: vec![0..4, 8..64] })),
            (action::TABLE_INFO, json(&"t")),
            (action::SCRUB, json(&vec!["t".to_string()])),
            (action::LIST_TABLES, Vec::new()),
            (action::DESCRIBE, Vec::new()),
            (
                action::BEGIN_WRITE,
                json(&BeginWrite {
                    table: "fuzzed".into(),
                    schema: manifest.schema.clone(),
                    append: false,
                    bloom_filter_columns: vec!["id".into()],
                    sort_key: vec![],
                    page_encoding: manifest.page_encoding,
                }),
            ),
            (action::COMMIT_WRITE, json(&CommitWrite { write: "w0".into(), properties: vec![("k".into(), "v".into())] })),
            (action::ABORT_WRITE, json(&"w1")),
        ];
        let seeds = bodies.iter().enumerate().map(|(i, (_, body))| [&[i as u8][..], body].concat()).collect();
        fuzz("flight_actions", inputs(seeds), |input| {
            let Some((&which, body)) = input.split_first() else { return };
            let name = bodies[which as usize % bodies.len()].0;
            let request = tonic::Request::new(Action { r#type: name.into(), body: body.to_vec().into() });
            runtime.block_on(async {
                if let Ok(response) = service.do_action(request).await {
                    let _ = response.into_inner().collect::<Vec<_>>().await;
                }
            });
        });
    }

    #[test]
    fn manifest_reading() {
        let dir = tempfile::tempdir().unwrap();
        let (warehouse, _) = super::warehouse(dir.path());
        let snapshot = warehouse.table("t").unwrap();
        let manifest = std::fs::read(&snapshot.manifest_path).unwrap();
        fuzz("manifest", inputs(vec![manifest]), |text| {
            std::fs::write(&snapshot.manifest_path, &text).unwrap();
            if let Ok(read) = warehouse.table("t") {
                let _ = warehouse.scrub(&[], &mut |_| {});
                drop(read);
            }
        });
    }

    #[test]
    fn csv_import() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("input.csv");
        let seeds = vec![
            b"id,price,day,name,flag\n1,2.5,2020-01-02,\"a, \"\"b\"\"\",true\n2,,1999-12-31,x,false\n".to_vec(),
            b"a;b\n1;1e300\n-9223372036854775808;\"q\nr\"\n".to_vec(),
        ];
        let warehouse = Warehouse::open(dir.path().join("wh")).unwrap();
        fuzz("csv", inputs(seeds), |text| {
            std::fs::write(&path, &text).unwrap();
            for delimiter in [b',', b';'] {
                let options = CsvOptions { delimiter, ..CsvOptions::default() };
                let Ok(schema) = infer_csv_schema(&path, &options) else { continue };
                let Ok(reader) = CsvBatchReader::try_new(&path, schema.clone(), options) else { continue };
                // A load through the table layer: all or nothing.
                let Ok(writer) = warehouse.begin_write("fuzzed", &schema, WriteMode::Replace, Default::default(), vec![]) else { continue };
                if let Ok(segments) = quarry_table::ingest::write_batches(&writer, reader, &|_| {}) {
                    let _ = writer.commit(segments, vec![]);
                }
            }
        });
    }
}
