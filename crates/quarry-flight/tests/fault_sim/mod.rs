//! Seeded fault simulation of the host/node protocol (TigerBeetle's VOPR, in small).
//!
//! Three storage nodes serve their share of three tables through the real Flight service
//! (`NodeService`) over an in-process transport; the host is a real `QuarrySession` over
//! `RemoteStorageNode`s. Between them, a seed decides for every call and every response message
//! whether it is delayed, dropped, repeated, swapped with the next, cut off (the stream ends
//! cleanly there), failed with an I/O error, or whether the node dies there (its connections
//! reset, new ones refused). The node's own segment reads fail where the seed says so too. Each
//! seed runs one query, chosen by the seed, in one pushdown mode. Its outcome must be the
//! fault-free answer or an error naming a node; never another answer, a panic, or a hang past
//! [`QUERY_DEADLINE`].
//!
//! Faults depend only on the seed, the node, the request's bytes (with the cluster's directory
//! and each segment's id, which differ from run to run, replaced by names of their place) and
//! the message's place in its response, never on timing; each node runs on one device thread,
//! so the message at a place is the same in every run. A seed therefore injects the same fault
//! into the same message every time it runs, and a failure it causes replays:
//! `QUARRY_SIM_SEED=N` runs seed N alone and prints what it injected and how it ended. (Once
//! the query has failed, the host stops its other streams, so whether a later fault is reached,
//! and which of two racing faults the host reports, can differ between runs.)
//! `QUARRY_SIM_SEEDS` sets how many seeds the suite runs (default 300; CI runs 10,000).

use std::collections::BTreeMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use arrow::array::{Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use arrow_flight::flight_service_server::{FlightService, FlightServiceServer};
use arrow_flight::{
    Action, ActionType, Criteria, Empty, FlightData, FlightDescriptor, FlightInfo, HandshakeRequest, HandshakeResponse, PollInfo, PutResult,
    SchemaResult, Ticket,
};
use futures::stream::BoxStream;
use futures::StreamExt;
use hyper_util::rt::TokioIo;
use quarry_engine::{EngineOptions, PushdownMode, QuarrySession};
use quarry_flight::wire::{FragmentReport, decode_sequence, encode_sequence};
use quarry_flight::{NodeService, RemoteStorageNode, upload_table};
use quarry_storage::{DeviceProfile, LocalStorageNode, StorageNode};
use quarry_table::{SegmentOptions, Warehouse, WriteMode};
use tokio::io::{AsyncRead, AsyncWrite, DuplexStream, ReadBuf};
use tonic::transport::server::Connected;
use tonic::transport::{Channel, Endpoint, Server};
use tonic::{Request, Response, Status, Streaming};

/// Longer than any query here takes with every delay the simulation injects.
const QUERY_DEADLINE: Duration = Duration::from_secs(20);
const NODES: usize = 3;
const TABLES: [&str; 3] = ["facts", "dims", "blob"];

/// The queries: grouped, joined, filtered and sorted, over tables spread over the three nodes;
/// `blob` has a segment larger than one chunk of a passthrough read.
const QUERIES: &[&str] = &[
    "select k, count(*) as n, sum(v) as total from facts where v % 3 = 0 group by k order by k",
    "select d.name, sum(f.v) as total, count(*) as n from facts f join dims d on f.k = d.k where d.k < 20 group by d.name order by d.name",
    "select id, v, s from facts where id between 100 and 160 order by id",
    "select count(*) as n, sum(length(payload)) as bytes, min(payload) as first from blob",
    "select s, count(*) as n from facts group by s order by n desc, s limit 5",
];

const MODES: [PushdownMode; 3] = [PushdownMode::Auto, PushdownMode::On, PushdownMode::Off];

/// splitmix64's finalizer: the simulation's only source of randomness.
fn mix(a: u64, b: u64) -> u64 {
    let mut z = a ^ b.wrapping_add(0x9e37_79b9_7f4a_7c15).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn hash_bytes(bytes: &[u8]) -> u64 {
    bytes.chunks(8).fold(0xcbf2_9ce4_8422_2325, |h, c| {
        let mut word = [0u8; 8];
        word[..c.len()].copy_from_slice(c);
        mix(h, u64::from_le_bytes(word))
    })
}

/// What happens to one message (or, at index [`CALL`], to the call before it answers).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Fault {
    Delay(u64),
    Drop,
    Duplicate,
    Swap,
    Truncate,
    IoError,
    Kill,
    /// A segment read on the node fails (recorded with the file's hash and the read's offset).
    ReadError,
    /// A message repeated, and the sequence numbers and count after it rewritten to hide that:
    /// a forger the protocol cannot catch, planted only by [`Plan::forging`] to show that the
    /// simulation finds a wrong answer and that its seed replays it.
    Forge,
}

/// The message index that stands for the call itself.
const CALL: u64 = u64::MAX;

/// A seed's faults: how often, and which, decided per (node, request, message).
#[derive(Debug, Clone, Copy)]
struct Plan {
    seed: u64,
    /// Chance of a fault per message, in 1/1000.
    per_mille: u64,
    /// Every fault on a message is this one (a test's).
    only: Option<Fault>,
}

impl Plan {
    fn new(seed: u64) -> Plan {
        // A quarter of the seeds run without faults; the others at growing rates.
        let per_mille = [0, 10, 40, 150][(mix(seed, 1) % 4) as usize];
        Plan { seed, per_mille, only: None }
    }

    fn fault_free() -> Plan {
        Plan { seed: 0, per_mille: 0, only: None }
    }

    /// Seed `seed`'s plan with every message fault a forged duplicate (see [`Fault::Forge`]).
    fn forging(seed: u64) -> Plan {
        Plan { per_mille: 100, only: Some(Fault::Forge), ..Plan::new(seed) }
    }

    fn query(&self) -> (&'static str, PushdownMode) {
        let r = mix(self.seed, 2);
        (QUERIES[(r % QUERIES.len() as u64) as usize], MODES[((r >> 32) % MODES.len() as u64) as usize])
    }

    fn fault(&self, node: usize, request: u64, message: u64) -> Option<Fault> {
        let r = mix(mix(mix(self.seed, node as u64 + 10), request), message);
        if r % 1000 >= self.per_mille {
            return None;
        }
        if let Some(only) = self.only {
            return (message != CALL).then_some(only);
        }
        let kinds = if message == CALL { &[Fault::Delay(0), Fault::IoError, Fault::Kill][..] } else {
            &[Fault::Delay(0), Fault::Drop, Fault::Duplicate, Fault::Swap, Fault::Truncate, Fault::IoError, Fault::Kill][..]
        };
        Some(match kinds[((r >> 20) % kinds.len() as u64) as usize] {
            Fault::Delay(_) => Fault::Delay(1 + (r >> 40) % 4),
            kind => kind,
        })
    }

    /// Whether the node fails a read of `range` of a file (its canonical key).
    fn read_fails(&self, node: usize, file: u64, range: &std::ops::Range<u64>) -> bool {
        if self.only.is_some() {
            return false;
        }
        let r = mix(mix(mix(self.seed, node as u64 + 100), file), range.start ^ (range.end << 32));
        r % 1000 < self.per_mille / 4
    }
}

/// A fault as injected, for the seed's report.
type Injected = (usize, u64, u64, Fault);

/// Lets a node die: its connections fail at once and new ones are refused.
#[derive(Default)]
struct KillSwitch {
    killed: AtomicBool,
    /// The wakers of the node's connections' pending reads and writes.
    waiting: Mutex<Vec<Weak<Mutex<Option<Waker>>>>>,
}

impl KillSwitch {
    fn kill(&self) {
        self.killed.store(true, Ordering::SeqCst);
        for slot in self.waiting.lock().unwrap().drain(..) {
            if let Some(waker) = slot.upgrade().and_then(|s| s.lock().unwrap().take()) {
                waker.wake();
            }
        }
    }

    fn is_killed(&self) -> bool {
        self.killed.load(Ordering::SeqCst)
    }
}

/// The node's end of one in-process connection.
struct NodeEnd {
    io: DuplexStream,
    switch: Arc<KillSwitch>,
    waker: Arc<Mutex<Option<Waker>>>,
}

impl NodeEnd {
    fn new(io: DuplexStream, switch: Arc<KillSwitch>) -> NodeEnd {
        let waker = Arc::default();
        switch.waiting.lock().unwrap().push(Arc::downgrade(&waker));
        NodeEnd { io, switch, waker }
    }

    /// An error once the node is dead; else remembers who to wake when it dies.
    fn check(&self, cx: &Context<'_>) -> std::io::Result<()> {
        *self.waker.lock().unwrap() = Some(cx.waker().clone());
        if self.switch.is_killed() { Err(std::io::Error::new(std::io::ErrorKind::ConnectionReset, "the node died")) } else { Ok(()) }
    }
}

impl Connected for NodeEnd {
    type ConnectInfo = ();
    fn connect_info(&self) {}
}

impl AsyncRead for NodeEnd {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        self.check(cx)?;
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for NodeEnd {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        self.check(cx)?;
        Pin::new(&mut self.io).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.check(cx)?;
        Pin::new(&mut self.io).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// One node of one seed: the real service, with the seed's faults on what it answers.
struct FaultyNode {
    index: usize,
    service: NodeService,
    plan: Plan,
    switch: Arc<KillSwitch>,
    injected: Arc<Mutex<Vec<Injected>>>,
    canon: Arc<Canon>,
}

type Stream<T> = BoxStream<'static, Result<T, Status>>;

impl FaultyNode {
    fn record(&self, request: u64, message: u64, fault: Fault) {
        self.injected.lock().unwrap().push((self.index, request, message, fault));
    }

    /// The fault on the call itself, if any: an error to answer with instead.
    async fn call_fault(&self, request: u64) -> Result<(), Status> {
        if self.switch.is_killed() {
            return Err(Status::unavailable("the node is down"));
        }
        match self.plan.fault(self.index, request, CALL) {
            Some(fault @ Fault::Delay(ms)) => {
                self.record(request, CALL, fault);
                tokio::time::sleep(Duration::from_millis(ms)).await;
                Ok(())
            }
            Some(fault @ Fault::IoError) => {
                self.record(request, CALL, fault);
                Err(Status::unavailable("injected I/O error"))
            }
            Some(fault @ Fault::Kill) => {
                self.record(request, CALL, fault);
                self.switch.kill();
                Err(Status::unavailable("the node died"))
            }
            _ => Ok(()),
        }
    }

    /// `inner` with the seed's faults on its messages.
    fn messages<T: SimMessage>(&self, request: u64, inner: Stream<T>) -> Stream<T> {
        struct State<T> {
            inner: Stream<T>,
            index: u64,
            held: Option<T>,
            queue: std::collections::VecDeque<Result<T, Status>>,
            ended: bool,
            /// Forged messages so far: what the sequence numbers after them are raised by.
            forged: u64,
        }
        let (node, plan, switch, injected) = (self.index, self.plan, Arc::clone(&self.switch), Arc::clone(&self.injected));
        let state = State { inner, index: 0, held: None, queue: Default::default(), ended: false, forged: 0 };
        futures::stream::unfold(state, move |mut s| {
            let (switch, injected) = (Arc::clone(&switch), Arc::clone(&injected));
            async move {
                loop {
                    if let Some(item) = s.queue.pop_front() {
                        return Some((item, s));
                    }
                    if s.ended {
                        return None;
                    }
                    let message = match s.inner.next().await {
                        None => {
                            s.queue.extend(s.held.take().map(Ok));
                            s.ended = true;
                            continue;
                        }
                        Some(Err(status)) => {
                            s.queue.extend(s.held.take().map(Ok));
                            s.queue.push_back(Err(status));
                            s.ended = true;
                            continue;
                        }
                        Some(Ok(message)) if !message.counted() => {
                            s.queue.push_back(Ok(message));
                            continue;
                        }
                        Some(Ok(mut message)) => {
                            message.raise_sequence(s.forged);
                            message
                        }
                    };
                    let index = s.index;
                    s.index += 1;
                    let fault = plan.fault(node, request, index);
                    if let Some(fault) = fault {
                        injected.lock().unwrap().push((node, request, index, fault));
                    }
                    match fault {
                        None | Some(Fault::ReadError) => s.queue.push_back(Ok(message)),
                        Some(Fault::Delay(ms)) => {
                            tokio::time::sleep(Duration::from_millis(ms)).await;
                            s.queue.push_back(Ok(message));
                        }
                        Some(Fault::Drop) => {}
                        Some(Fault::Duplicate) => s.queue.extend([Ok(message.clone()), Ok(message)]),
                        Some(Fault::Forge) => {
                            let mut copy = message.clone();
                            if copy.raise_sequence(1) {
                                s.forged += 1;
                                s.queue.extend([Ok(message), Ok(copy)]);
                            } else {
                                s.queue.push_back(Ok(message));
                            }
                        }
                        Some(Fault::Swap) if s.held.is_none() => {
                            s.held = Some(message);
                            continue;
                        }
                        Some(Fault::Swap) => s.queue.push_back(Ok(message)),
                        Some(Fault::Truncate) => {
                            s.ended = true;
                            s.held = None;
                            continue;
                        }
                        Some(Fault::IoError) => {
                            s.queue.push_back(Err(Status::unavailable("injected I/O error")));
                            s.ended = true;
                            s.held = None;
                            continue;
                        }
                        Some(Fault::Kill) => {
                            switch.kill();
                            s.ended = true;
                            s.held = None;
                            continue;
                        }
                    }
                    // A message held back by a swap goes after the one that overtook it.
                    s.queue.extend(s.held.take().map(Ok));
                }
            }
        })
        .boxed()
    }
}

/// A response message the simulation handles.
trait SimMessage: Clone + Send + 'static {
    /// Whether faults apply to it (a progress report's do not: how many come depends on timing).
    fn counted(&self) -> bool {
        true
    }

    /// Raises its sequence number, or its closing count, by `by`, if it has one; says whether
    /// it is a data message (which a forged duplicate copies).
    fn raise_sequence(&mut self, _by: u64) -> bool {
        false
    }
}

impl SimMessage for arrow_flight::Result {}

impl SimMessage for FlightData {
    fn counted(&self) -> bool {
        !self.data_header.is_empty() || !matches!(FragmentReport::decode(&self.app_metadata), Ok(FragmentReport::Progress(_)))
    }

    fn raise_sequence(&mut self, by: u64) -> bool {
        if self.data_header.is_empty() {
            if let Ok(FragmentReport::Finished { stats, data_messages }) = FragmentReport::decode(&self.app_metadata) {
                self.app_metadata = FragmentReport::Finished { stats, data_messages: data_messages + by }.encode();
            }
            return false;
        }
        let sequence = decode_sequence(&self.app_metadata).expect("a numbered data message");
        self.app_metadata = encode_sequence(sequence + by);
        true
    }
}

#[tonic::async_trait]
impl FlightService for FaultyNode {
    type HandshakeStream = Stream<HandshakeResponse>;
    type ListFlightsStream = Stream<FlightInfo>;
    type DoGetStream = Stream<FlightData>;
    type DoPutStream = Stream<PutResult>;
    type DoActionStream = Stream<arrow_flight::Result>;
    type ListActionsStream = Stream<ActionType>;
    type DoExchangeStream = Stream<FlightData>;

    async fn handshake(&self, request: Request<Streaming<HandshakeRequest>>) -> Result<Response<Self::HandshakeStream>, Status> {
        self.service.handshake(request).await
    }
    async fn list_flights(&self, request: Request<Criteria>) -> Result<Response<Self::ListFlightsStream>, Status> {
        self.service.list_flights(request).await
    }
    async fn get_flight_info(&self, request: Request<FlightDescriptor>) -> Result<Response<FlightInfo>, Status> {
        self.service.get_flight_info(request).await
    }
    async fn poll_flight_info(&self, request: Request<FlightDescriptor>) -> Result<Response<PollInfo>, Status> {
        self.service.poll_flight_info(request).await
    }
    async fn get_schema(&self, request: Request<FlightDescriptor>) -> Result<Response<SchemaResult>, Status> {
        self.service.get_schema(request).await
    }
    async fn do_get(&self, request: Request<Ticket>) -> Result<Response<Self::DoGetStream>, Status> {
        let key = self.canon.key(&request.get_ref().ticket);
        self.call_fault(key).await?;
        let response = self.service.do_get(request).await?.into_inner();
        Ok(Response::new(self.messages(key, response)))
    }
    async fn do_put(&self, request: Request<Streaming<FlightData>>) -> Result<Response<Self::DoPutStream>, Status> {
        self.service.do_put(request).await
    }
    async fn do_action(&self, request: Request<Action>) -> Result<Response<Self::DoActionStream>, Status> {
        let action = request.get_ref();
        let key = mix(hash_bytes(action.r#type.as_bytes()), self.canon.key(&action.body));
        self.call_fault(key).await?;
        let response = self.service.do_action(request).await?.into_inner();
        Ok(Response::new(self.messages(key, response)))
    }
    async fn list_actions(&self, request: Request<Empty>) -> Result<Response<Self::ListActionsStream>, Status> {
        self.service.list_actions(request).await
    }
    async fn do_exchange(&self, request: Request<Streaming<FlightData>>) -> Result<Response<Self::DoExchangeStream>, Status> {
        self.service.do_exchange(request).await
    }
}

/// Serves `node` over an in-process transport; returns the host's connection to it.
async fn connect(index: usize, node: FaultyNode) -> Result<Channel, String> {
    let switch = Arc::clone(&node.switch);
    let (connections, incoming) = tokio::sync::mpsc::unbounded_channel::<std::io::Result<NodeEnd>>();
    let incoming = futures::stream::unfold(incoming, |mut incoming| async move { incoming.recv().await.map(|c| (c, incoming)) });
    let service = FlightServiceServer::new(node).max_decoding_message_size(256 << 20).max_encoding_message_size(256 << 20);
    tokio::spawn(Server::builder().add_service(service).serve_with_incoming(incoming));
    let connector = tower::service_fn(move |_: tonic::transport::Uri| {
        let (connections, switch) = (connections.clone(), Arc::clone(&switch));
        async move {
            if switch.is_killed() {
                return Err(std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "the node is down"));
            }
            let (host_end, node_end) = tokio::io::duplex(1 << 20);
            connections.send(Ok(NodeEnd::new(node_end, switch))).map_err(|_| std::io::Error::other("the node stopped serving"))?;
            Ok(TokioIo::new(host_end))
        }
    });
    Endpoint::try_from(format!("http://sim-node-{index}")).map_err(|e| e.to_string())?.connect_with_connector(connector).await.map_err(|e| e.to_string())
}

fn node_url(index: usize) -> String {
    format!("grpc://sim-node-{index}")
}

/// The three nodes' warehouses (shared by every seed: queries do not change them).
struct Cluster {
    dir: tempfile::TempDir,
    canon: Arc<Canon>,
}

/// Requests and messages in a form that is the same in every run: the cluster's directory and
/// the segment ids (made of the time and the process id) replaced by names of their place.
#[derive(Default)]
struct Canon {
    replacements: Vec<(Vec<u8>, Vec<u8>)>,
}

impl Canon {
    fn canonical(&self, bytes: &[u8]) -> Vec<u8> {
        let mut bytes = bytes.to_vec();
        for (from, to) in &self.replacements {
            while let Some(at) = bytes.windows(from.len()).position(|w| w == from.as_slice()) {
                bytes.splice(at..at + from.len(), to.iter().copied());
            }
        }
        bytes
    }

    fn key(&self, bytes: &[u8]) -> u64 {
        hash_bytes(&self.canonical(bytes))
    }

    fn text(&self, text: &str) -> String {
        String::from_utf8_lossy(&self.canonical(text.as_bytes())).into_owned()
    }
}

fn facts_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("k", DataType::Int64, false),
        Field::new("v", DataType::Int64, true),
        Field::new("s", DataType::Utf8, false),
    ]))
}

/// Writes a table of `segments` into `staging`.
fn stage(staging: &Warehouse, table: &str, schema: SchemaRef, segments: Vec<RecordBatch>) {
    let writer = staging.begin_write(table, &schema, WriteMode::Replace, SegmentOptions::default(), Vec::new()).unwrap();
    let metas = segments
        .iter()
        .map(|batch| {
            let mut segment = writer.new_segment().unwrap();
            segment.write(batch).unwrap();
            segment.finish().unwrap()
        })
        .collect();
    writer.commit(metas, Vec::new()).unwrap();
}

impl Cluster {
    /// Stages the tables, then spreads them over three nodes through Flight, without faults.
    async fn start() -> Cluster {
        let dir = tempfile::tempdir().unwrap();
        let staging = Warehouse::open(dir.path().join("staging")).unwrap();
        let facts = (0..8i64)
            .map(|segment| {
                let ids: Vec<i64> = (segment * 1500..(segment + 1) * 1500).collect();
                let columns: Vec<Arc<dyn arrow::array::Array>> = vec![
                    Arc::new(Int64Array::from(ids.clone())),
                    Arc::new(Int64Array::from_iter_values(ids.iter().map(|i| (i * 7) % 50))),
                    Arc::new(Int64Array::from_iter(ids.iter().map(|i| (i % 11 != 0).then_some(i * 3 - 5000)))),
                    Arc::new(StringArray::from_iter_values(ids.iter().map(|i| format!("s{}", (i * 13) % 37)))),
                ];
                RecordBatch::try_new(facts_schema(), columns).unwrap()
            })
            .collect();
        stage(&staging, "facts", facts_schema(), facts);
        let dims = Arc::new(Schema::new(vec![Field::new("k", DataType::Int64, false), Field::new("name", DataType::Utf8, false)]));
        let dim_rows = RecordBatch::try_new(
            Arc::clone(&dims),
            vec![Arc::new(Int64Array::from_iter_values(0..50)), Arc::new(StringArray::from_iter_values((0..50).map(|k| format!("dim {}", k % 9))))],
        )
        .unwrap();
        stage(&staging, "dims", dims, vec![dim_rows]);
        // 3,000 rows of 600 pseudo-random hex digits: 1.8 MB stored, more than one chunk of a
        // passthrough read.
        let blob = Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, false), Field::new("payload", DataType::Utf8, false)]));
        let payloads = (0..3000u64).map(|i| (0..75u64).map(|j| format!("{:08x}", mix(i, j) as u32)).collect::<String>());
        let blob_rows = RecordBatch::try_new(Arc::clone(&blob), vec![Arc::new(Int64Array::from_iter_values(0..3000)), Arc::new(StringArray::from_iter_values(payloads))]).unwrap();
        stage(&staging, "blob", blob, vec![blob_rows]);

        let mut cluster = Cluster { dir, canon: Arc::default() };
        let remote = Simulation::connect(&cluster, Plan::fault_free(), &Arc::default()).await.unwrap();
        let mut first = 0;
        for table in TABLES {
            first += upload_table(&staging, table, &remote, false, first).await.unwrap();
        }
        let directory = cluster.dir.path().to_str().unwrap().trim_start_matches('/').as_bytes().to_vec();
        let mut replacements = vec![(directory, b"<cluster>".to_vec())];
        for node in 0..NODES {
            let warehouse = Warehouse::open(cluster.dir.path().join(format!("node{node}"))).unwrap();
            for table in TABLES {
                for (i, segment) in warehouse.table(table).unwrap().manifest.segments.iter().enumerate() {
                    replacements.push((segment.id.clone().into_bytes(), format!("<{node}.{table}.{i}>").into_bytes()));
                }
            }
        }
        cluster.canon = Arc::new(Canon { replacements });
        cluster
    }

    /// Fresh nodes over the warehouses (no cache carries a read over from another seed), whose
    /// segment reads fail where `plan` says. Each runs on one device thread, so that what it
    /// sends, message by message, does not depend on timing: a seed's faults hit the same bytes
    /// every time.
    fn nodes(&self, plan: Plan, injected: &Arc<Mutex<Vec<Injected>>>) -> Vec<Arc<LocalStorageNode>> {
        let profile = DeviceProfile { device_threads: Some(1), ..DeviceProfile::load("native").unwrap() };
        (0..NODES)
            .map(|index| {
                let warehouse = Warehouse::open(self.dir.path().join(format!("node{index}"))).unwrap();
                let node = LocalStorageNode::with_profile(warehouse, profile.clone()).unwrap().with_name(node_url(index));
                let (injected, canon) = (Arc::clone(injected), Arc::clone(&self.canon));
                let fails = move |location: &object_store::path::Path, range: &std::ops::Range<u64>| {
                    let file = canon.key(location.as_ref().as_bytes());
                    let fails = plan.read_fails(index, file, range);
                    if fails {
                        injected.lock().unwrap().push((index, file, range.start, Fault::ReadError));
                    }
                    fails
                };
                node.inject_read_faults(Arc::new(fails)).unwrap();
                Arc::new(node)
            })
            .collect()
    }

    fn get() -> &'static Cluster {
        static CLUSTER: OnceLock<Cluster> = OnceLock::new();
        CLUSTER.get_or_init(|| runtime().block_on(Cluster::start()))
    }
}

fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| tokio::runtime::Builder::new_multi_thread().worker_threads(2).thread_name(SIM_THREAD).enable_all().build().unwrap())
}

/// How one seed ended.
#[derive(Debug, Clone, PartialEq)]
enum Outcome {
    /// The fault-free answer.
    Correct,
    /// An error naming a node.
    CleanError(String),
    /// Anything else: the simulation fails.
    Wrong(String),
}

struct Simulation;

impl Simulation {
    /// Connects the host to fresh nodes over the cluster with `plan`'s faults, recorded in
    /// `injected`.
    async fn connect(cluster: &Cluster, plan: Plan, injected: &Arc<Mutex<Vec<Injected>>>) -> datafusion::error::Result<Vec<RemoteStorageNode>> {
        let mut remote = Vec::with_capacity(NODES);
        for (index, node) in cluster.nodes(plan, injected).into_iter().enumerate() {
            let faulty =
                FaultyNode { index, service: NodeService::new(node), plan, switch: Arc::default(), injected: Arc::clone(injected), canon: Arc::clone(&cluster.canon) };
            let channel = connect(index, faulty).await.map_err(datafusion::error::DataFusionError::Execution)?;
            remote.push(RemoteStorageNode::over_channel(&node_url(index), channel, None).await?);
        }
        Ok(remote)
    }

    /// Runs `sql` in `mode` over the cluster with `plan`'s faults: its result as text, and
    /// the faults injected (sorted).
    async fn run(cluster: &Cluster, plan: Plan, sql: &str, mode: PushdownMode) -> (datafusion::error::Result<String>, Vec<Injected>) {
        let injected: Arc<Mutex<Vec<Injected>>> = Arc::default();
        let result = async {
            let remote = Simulation::connect(cluster, plan, &injected).await?;
            let nodes: Vec<Arc<dyn StorageNode>> = remote.into_iter().map(|n| Arc::new(n) as Arc<dyn StorageNode>).collect();
            let session = QuarrySession::try_new(nodes, EngineOptions { threads: 2, pushdown: mode, ..Default::default() }).await?;
            let result = session.query(sql).await?;
            Ok(arrow::util::pretty::pretty_format_batches(&result.batches)?.to_string())
        }
        .await;
        let mut injected = injected.lock().unwrap().clone();
        injected.sort();
        (result, injected)
    }
}

/// The simulation's threads (the runtime's workers and blocking threads, which run the nodes
/// and the host) and the tests' own (named after their test, in this module).
const SIM_THREAD: &str = "fault_sim";

/// Panics on the simulation's threads (a node's worker, the host), caught or not.
static PANICS: AtomicUsize = AtomicUsize::new(0);

/// Counts panics, and runs one simulation test at a time: returns the turn to hold.
fn sim_turn() -> std::sync::MutexGuard<'static, ()> {
    static HOOK: OnceLock<()> = OnceLock::new();
    static TURN: Mutex<()> = Mutex::new(());
    HOOK.get_or_init(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if std::thread::current().name().is_some_and(|name| name.contains(SIM_THREAD)) {
                PANICS.fetch_add(1, Ordering::SeqCst);
            }
            previous(info);
        }));
    });
    TURN.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The fault-free answers, per (query, mode).
fn expected() -> &'static BTreeMap<(usize, usize), String> {
    static EXPECTED: OnceLock<BTreeMap<(usize, usize), String>> = OnceLock::new();
    EXPECTED.get_or_init(|| {
        let cluster = Cluster::get();
        let mut answers = BTreeMap::new();
        for (q, sql) in QUERIES.iter().enumerate() {
            for (m, mode) in MODES.iter().enumerate() {
                let (result, injected) = runtime().block_on(Simulation::run(cluster, Plan::fault_free(), sql, *mode));
                assert!(injected.is_empty());
                answers.insert((q, m), result.unwrap_or_else(|e| panic!("{sql} ({mode:?}) without faults: {e}")));
            }
        }
        // The modes agree with each other.
        for q in 0..QUERIES.len() {
            assert_eq!(answers[&(q, 0)], answers[&(q, 1)], "{}", QUERIES[q]);
            assert_eq!(answers[&(q, 0)], answers[&(q, 2)], "{}", QUERIES[q]);
        }
        answers
    })
}

/// Runs one seed's plan: its outcome and the faults it injected.
fn run_seed(plan: Plan) -> (Outcome, Vec<Injected>) {
    let (sql, mode) = plan.query();
    let q = QUERIES.iter().position(|s| *s == sql).unwrap();
    let m = MODES.iter().position(|x| *x == mode).unwrap();
    let want = &expected()[&(q, m)];
    let cluster = Cluster::get();
    let panics = PANICS.load(Ordering::SeqCst);
    let ran = runtime().block_on(async { tokio::time::timeout(QUERY_DEADLINE, Simulation::run(cluster, plan, sql, mode)).await });
    let (outcome, injected) = match ran {
        Err(_) => (Outcome::Wrong(format!("no answer within {QUERY_DEADLINE:?}")), Vec::new()),
        Ok((Ok(got), injected)) if &got == want => (Outcome::Correct, injected),
        Ok((Ok(got), injected)) => (Outcome::Wrong(format!("a different answer:\n{got}\nexpected:\n{want}")), injected),
        Ok((Err(e), injected)) => {
            let message = cluster.canon.text(&quarry_engine::user_message(&e));
            let names_node = (0..NODES).any(|i| message.contains(&format!("sim-node-{i}")));
            let panicked = message.contains("panic");
            if names_node && !panicked { (Outcome::CleanError(message), injected) } else { (Outcome::Wrong(format!("an error that names no node: {message}")), injected) }
        }
    };
    if PANICS.load(Ordering::SeqCst) != panics {
        return (Outcome::Wrong(format!("a panic ({outcome:?})")), injected);
    }
    (outcome, injected)
}

fn describe(plan: Plan, outcome: &Outcome, injected: &[Injected]) -> String {
    let seed = plan.seed;
    let (sql, mode) = plan.query();
    let faults: Vec<String> = injected.iter().map(|(node, request, message, fault)| {
        let at = if *message == CALL { "call".to_string() } else { format!("message {message}") };
        format!("node {node} request {request:016x} {at}: {fault:?}")
    }).collect();
    format!("seed {seed} ({} faults per 1000, {mode:?}): {sql}\n  {}\n  -> {outcome:?}", plan.per_mille, faults.join("\n  "))
}

/// Every seed ends with the fault-free answer or an error naming a node: never another
/// answer, a panic or a hang. `QUARRY_SIM_SEED=N` runs seed N alone and prints it.
#[test]
fn seeds_end_in_the_right_answer_or_a_clean_error() {
    let _turn = sim_turn();
    let seeds: Vec<u64> = match std::env::var("QUARRY_SIM_SEED") {
        Ok(seed) => vec![seed.parse().expect("QUARRY_SIM_SEED is a number")],
        Err(_) => (0..std::env::var("QUARRY_SIM_SEEDS").map_or(300, |n| n.parse().expect("QUARRY_SIM_SEEDS is a number"))).collect(),
    };
    let started = Instant::now();
    let mut tally: BTreeMap<&str, usize> = BTreeMap::new();
    let mut faults = 0;
    for &seed in &seeds {
        let (outcome, injected) = run_seed(Plan::new(seed));
        faults += injected.len();
        if seeds.len() == 1 {
            eprintln!("{}", describe(Plan::new(seed), &outcome, &injected));
        }
        match &outcome {
            Outcome::Correct => *tally.entry("correct").or_default() += 1,
            Outcome::CleanError(_) => *tally.entry("clean error").or_default() += 1,
            Outcome::Wrong(_) => panic!("{}\nreplay: QUARRY_SIM_SEED={seed}", describe(Plan::new(seed), &outcome, &injected)),
        }
    }
    eprintln!("fault simulation: {} seeds, {faults} faults injected, {tally:?}, {:.1} s", seeds.len(), started.elapsed().as_secs_f64());
    if seeds.len() >= 100 {
        // The mix is real: both outcomes occur.
        assert!(tally.get("correct").copied().unwrap_or(0) > seeds.len() / 10, "{tally:?}");
        assert!(tally.get("clean error").copied().unwrap_or(0) > seeds.len() / 10, "{tally:?}");
    }
}

/// A forger the protocol cannot catch (a repeated batch whose sequence numbers and count are
/// rewritten) is planted on purpose: the simulation finds a seed it turns into a wrong answer,
/// and running that seed again injects the same faults and gives the same wrong answer.
#[test]
fn a_planted_forger_is_caught_and_its_seed_replays_exactly() {
    let _turn = sim_turn();
    let failing = (0..200).map(Plan::forging).find_map(|plan| match run_seed(plan) {
        (outcome @ Outcome::Wrong(_), injected) => Some((plan, outcome, injected)),
        _ => None,
    });
    let (plan, outcome, injected) = failing.expect("a forged duplicate changes some seed's answer");
    assert!(injected.iter().any(|(.., fault)| *fault == Fault::Forge), "{}", describe(plan, &outcome, &injected));
    for _ in 0..2 {
        let (again, injected_again) = run_seed(plan);
        assert_eq!((&again, &injected_again), (&outcome, &injected), "seed {} did not replay", plan.seed);
    }
}

/// Two chunks of a passthrough read swapped (equal in length, so the byte count still adds
/// up) are found by their offsets: an error, not bytes decoded out of place.
#[test]
fn swapped_stored_chunks_are_an_error() {
    let _turn = sim_turn();
    let sql = QUERIES.iter().copied().find(|q| q.contains("blob")).unwrap();
    let plan = Plan { seed: 7, per_mille: 1000, only: Some(Fault::Swap) };
    let (result, injected) = runtime().block_on(Simulation::run(Cluster::get(), plan, sql, PushdownMode::Off));
    let error = result.expect_err("swapped chunks are an error").to_string();
    assert!(error.contains("arrived damaged: a chunk for offset"), "{error}\n{injected:?}");
}
