//! The storage node's Arrow Flight service (`quarry serve`).
//!
//! - `do_get`: the ticket is a [`quarry_storage::Fragment`]; the response is its batches, each
//!   data message numbered in its `app_metadata` (0, 1, 2, ...), then one message carrying only
//!   `app_metadata`: the fragment's [`ScanStats`] and the number of data messages, as JSON. A
//!   stream without that closing message, or whose numbers skip, repeat or go back, is damaged,
//!   and the host treats it as an error.
//! - `do_action`: `list_tables`, `table_info`, `describe`, `scrub`, `read_segment` (stored bytes, for
//!   passthrough), `job` (a graph job, say), and the write transaction `begin_write` / `commit_write` /
//!   `abort_write`.
//! - `do_put`: one segment of a write in progress.
//!
//! With a token, every call must carry `authorization: Bearer <token>`.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arrow_flight::decode::FlightRecordBatchStream;
use arrow::ipc::writer::IpcWriteOptions;
use arrow_flight::encode::FlightDataEncoderBuilder;
use arrow_flight::error::FlightError;
use arrow_flight::flight_service_server::{FlightService, FlightServiceServer};
use arrow_flight::{
    Action, ActionType, Criteria, Empty, FlightData, FlightDescriptor, FlightInfo, HandshakeRequest, HandshakeResponse, PollInfo, PutResult,
    SchemaResult, Ticket,
};
use bytes::Bytes;
use datafusion::error::DataFusionError;
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use quarry_storage::{LinkCodec, LocalStorageNode, ScanMessage, ScanStats, SegmentRead, StorageNode};
use quarry_storage::view_compaction::link_batches;
use tonic::transport::{Identity, Server, ServerTlsConfig};
use tonic::transport::server::TcpIncoming;
use tonic::{Request, Response, Status, Streaming};

use crate::auth::TokenCheck;
use crate::wire::{LINK_MESSAGE_BYTES, 
    BeginWrite, CommitWrite, FragmentReport, PutSegment, STORED_BYTES_CHUNK, TableInfoWire, action, decode_ticket, encode_sequence, encode_stored_chunk,
};

/// The Flight service over a node: it decodes requests and calls the node's `StorageNode`.
pub struct NodeService {
    node: Arc<LocalStorageNode>,
}

impl NodeService {
    /// Serves `node`.
    pub fn new(node: Arc<LocalStorageNode>) -> Self {
        NodeService { node }
    }
}

/// Where and how a node listens.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// Address for Flight.
    pub listen: SocketAddr,
    /// Token every call must carry.
    pub token: Option<String>,
    /// Address for Prometheus metrics.
    pub metrics_listen: Option<SocketAddr>,
    /// The node's TLS certificate chain and private key (PEM); `None` serves plaintext.
    pub tls: Option<TlsIdentity>,
    /// Serve plaintext beyond loopback (otherwise refused).
    pub insecure: bool,
}

/// A certificate chain and its private key, PEM-encoded.
#[derive(Clone)]
pub struct TlsIdentity {
    /// The certificate chain.
    pub cert_pem: Vec<u8>,
    /// The private key.
    pub key_pem: Vec<u8>,
}

impl std::fmt::Debug for TlsIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TlsIdentity { .. }")
    }
}

/// Runs the node until the process ends. `on_ready` gets the node's URL (`grpc://` or
/// `grpc+tls://` and the bound address: the port may have been 0) and the metrics address. A
/// node refuses to listen beyond loopback without a token, and without TLS unless told
/// `insecure`.
pub async fn serve(node: Arc<LocalStorageNode>, options: ServeOptions, on_ready: impl FnOnce(String, Option<SocketAddr>)) -> Result<(), String> {
    let (incoming, address, mut builder, scheme) = listen(&options).await?;
    let metrics_address = match options.metrics_listen {
        Some(addr) => Some(crate::metrics::serve_metrics(Arc::clone(&node), addr).await?),
        None => None,
    };
    on_ready(format!("{scheme}://{address}"), metrics_address);
    // Writes whose host went away are aborted once their lease runs out, even if no other
    // request comes.
    let sweeper = Arc::downgrade(&node);
    let sweep_every = (node.write_lease() / 4).clamp(Duration::from_millis(50), Duration::from_secs(5));
    tokio::spawn(async move {
        while let Some(node) = sweeper.upgrade() {
            if let Err(e) = node.expire_writes().await {
                eprintln!("quarry: aborting expired writes: {e}");
            }
            drop(node);
            tokio::time::sleep(sweep_every).await;
        }
    });
    let service = Arc::new(NodeService::new(node));
    let server = FlightServiceServer::from_arc(service).max_decoding_message_size(256 << 20).max_encoding_message_size(256 << 20);
    let service = tonic::codegen::InterceptedService::new(server, TokenCheck::new(options.token));
    builder
        .add_service(service)
        .serve_with_incoming(incoming)
        .await
        .map_err(|e| format!("serving on {address}: {e}"))
}

/// Binds `options.listen` for a Flight server (a storage node, or `quarry server`), refusing an
/// address beyond loopback without a token, and without TLS unless told `insecure`: the
/// accepted connections (TCP_NODELAY set), its address (the port may have been 0), the server builder (with TLS if given)
/// and the URL scheme (`grpc` or `grpc+tls`).
pub async fn listen(options: &ServeOptions) -> Result<(TcpIncoming, SocketAddr, Server, &'static str), String> {
    if !options.listen.ip().is_loopback() {
        if options.token.is_none() {
            return Err(format!(
                "refusing to listen on {} without authentication: give --token-file, or listen on a loopback address (127.0.0.1)",
                options.listen
            ));
        }
        if options.tls.is_none() && !options.insecure {
            return Err(format!(
                "refusing to listen on {} without TLS: give --tls-cert and --tls-key, or --insecure to send tokens and data in the clear",
                options.listen
            ));
        }
    }
    if options.token.as_ref().is_some_and(|t| t.trim().is_empty()) {
        return Err("the token file is empty".into());
    }
    let listener = tokio::net::TcpListener::bind(options.listen).await.map_err(|e| format!("listening on {}: {e}", options.listen))?;
    let address = listener.local_addr().map_err(|e| e.to_string())?;
    let mut builder = Server::builder();
    let scheme = match &options.tls {
        Some(identity) => {
            let config = ServerTlsConfig::new().identity(Identity::from_pem(&identity.cert_pem, &identity.key_pem));
            builder = builder.tls_config(config).map_err(|e| format!("the TLS certificate or key: {e}"))?;
            "grpc+tls"
        }
        None => "grpc",
    };
    // `serve_with_incoming` ignores the builder's TCP_NODELAY, so the accepted sockets get it
    // here: with Nagle's algorithm, each small response (a fragment's statistics, an action's
    // result) waited for the host's delayed ACK, about 40 ms per fragment.
    Ok((TcpIncoming::from(listener).with_nodelay(Some(true)), address, builder, scheme))
}

fn status(e: DataFusionError) -> Status {
    let message = quarry_message(&e);
    match e {
        DataFusionError::Plan(_) | DataFusionError::SchemaError(..) | DataFusionError::Configuration(_) => Status::invalid_argument(message),
        _ => Status::internal(message),
    }
}

/// The error's own words, without DataFusion's nesting.
fn quarry_message(e: &DataFusionError) -> String {
    if let Some(damage) = quarry_storage::verified_store::damage_message(e) {
        return damage;
    }
    match e {
        DataFusionError::Context(_, inner) | DataFusionError::Diagnostic(_, inner) => quarry_message(inner),
        DataFusionError::Shared(inner) => quarry_message(inner),
        DataFusionError::Plan(m) | DataFusionError::Execution(m) => m.clone(),
        other => other.message().to_string(),
    }
}

fn json<T: serde::Serialize>(value: &T) -> Result<arrow_flight::Result, Status> {
    let body = serde_json::to_vec(value).map_err(|e| Status::internal(e.to_string()))?;
    Ok(arrow_flight::Result { body: body.into() })
}

fn parse<'a, T: serde::Deserialize<'a>>(body: &'a [u8], what: &str) -> Result<T, Status> {
    serde_json::from_slice(body).map_err(|e| Status::invalid_argument(format!("malformed {what} request: {e}")))
}

type Stream<T> = BoxStream<'static, Result<T, Status>>;

/// How often a `do_get` response reports the fragment's progress.
const PROGRESS_INTERVAL: Duration = Duration::from_millis(200);

/// A message of `do_get`'s response that carries only a report.
fn report(report: FragmentReport) -> FlightData {
    FlightData { app_metadata: report.encode(), ..Default::default() }
}

#[tonic::async_trait]
impl FlightService for NodeService {
    type HandshakeStream = Stream<HandshakeResponse>;
    type ListFlightsStream = Stream<FlightInfo>;
    type DoGetStream = Stream<FlightData>;
    type DoPutStream = Stream<PutResult>;
    type DoActionStream = Stream<arrow_flight::Result>;
    type ListActionsStream = Stream<ActionType>;
    type DoExchangeStream = Stream<FlightData>;

    async fn handshake(&self, _request: Request<Streaming<HandshakeRequest>>) -> Result<Response<Self::HandshakeStream>, Status> {
        Err(Status::unimplemented("handshake is not used: send the token as a bearer token on each call"))
    }

    async fn list_flights(&self, _request: Request<Criteria>) -> Result<Response<Self::ListFlightsStream>, Status> {
        Err(Status::unimplemented("list_flights: use the list_tables action"))
    }

    async fn get_flight_info(&self, _request: Request<FlightDescriptor>) -> Result<Response<FlightInfo>, Status> {
        Err(Status::unimplemented("get_flight_info: send a fragment with do_get"))
    }

    async fn poll_flight_info(&self, _request: Request<FlightDescriptor>) -> Result<Response<PollInfo>, Status> {
        Err(Status::unimplemented("poll_flight_info"))
    }

    async fn get_schema(&self, _request: Request<FlightDescriptor>) -> Result<Response<SchemaResult>, Status> {
        Err(Status::unimplemented("get_schema: use the table_info action"))
    }

    async fn do_get(&self, request: Request<Ticket>) -> Result<Response<Self::DoGetStream>, Status> {
        let ticket = request.into_inner().ticket;
        // The ticket crossed the link too, toward the node (a star probe's tables, a join's key
        // sets): it is counted with the bytes that come back, and paced as they are.
        let ticket_bytes = ticket.len() as u64;
        let fragment = decode_ticket(ticket).map_err(Status::invalid_argument)?;
        let ticket_wait_ns = match self.node.link_limiter() {
            Some(link) => link.consume(ticket_bytes).await.as_nanos() as u64,
            None => 0,
        };
        let codec = fragment.link_codec;
        let options = IpcWriteOptions::default().try_with_compression(codec.ipc()).map_err(|e| Status::internal(e.to_string()))?;
        // Compressed batches are paced here, on the bytes sent (the node does not pace them).
        let link = if codec == LinkCodec::None { None } else { self.node.link_limiter() };
        let progress = fragment.progress.clone();
        let messages = self.node.execute(fragment).await.map_err(status)?;
        let stats: Arc<Mutex<Option<ScanStats>>> = Arc::default();
        let stats_slot = Arc::clone(&stats);
        let batches = messages
            .map_err(|e| FlightError::Tonic(Box::new(status(e))))
            .try_filter_map(move |message| {
                let stats_slot = Arc::clone(&stats_slot);
                async move {
                    match message {
                        ScanMessage::Batch(batch) => Ok(Some(batch)),
                        ScanMessage::Finished(stats) => {
                            *stats_slot.lock().expect("stats lock") = Some(stats);
                            Ok(None)
                        }
                    }
                }
            })
            // View columns copied out of the buffers they share, or IPC would send those whole.
            .and_then(|batch| async move { link_batches(batch, LINK_MESSAGE_BYTES / 2).map_err(|e| FlightError::Tonic(Box::new(status(e)))) })
            .map_ok(|pieces| futures::stream::iter(pieces.into_iter().map(Ok)))
            .try_flatten();
        // Bytes encoded, nanoseconds waited for the link, data messages numbered.
        let sent: Arc<Mutex<(u64, u64, u64)>> = Arc::default();
        let sent_slot = Arc::clone(&sent);
        let encoded = FlightDataEncoderBuilder::new()
            .with_options(options)
            .with_max_flight_data_size(LINK_MESSAGE_BYTES)
            .build(batches)
            .map_err(|e| match e {
                FlightError::Tonic(status) => *status,
                other => Status::internal(other.to_string()),
            })
            .and_then(move |mut data| {
                let (link, sent) = (link.clone(), Arc::clone(&sent_slot));
                async move {
                    let bytes = (data.data_header.len() + data.data_body.len()) as u64;
                    let waited = match &link {
                        Some(link) => link.consume(bytes).await.as_nanos() as u64,
                        None => 0,
                    };
                    let mut sent = sent.lock().expect("sent lock");
                    sent.0 += bytes;
                    sent.1 += waited;
                    data.app_metadata = encode_sequence(sent.2);
                    sent.2 += 1;
                    Ok(data)
                }
            });
        // The closing message: statistics, only once the fragment finished.
        let node = Arc::clone(&self.node);
        let closing = futures::stream::once(async move {
            let stats = stats.lock().expect("stats lock").take();
            match stats {
                Some(mut stats) => {
                    let (bytes, waited, data_messages) = *sent.lock().expect("sent lock");
                    let counted = stats.link_bytes;
                    // What crossed the link is what was encoded (compressed or not); the node
                    // paced uncompressed batches itself, compressed ones were paced here.
                    stats.link_bytes = bytes;
                    if codec != LinkCodec::None {
                        stats.link_wait_ns += waited;
                    }
                    stats.link_bytes += ticket_bytes;
                    stats.link_wait_ns += ticket_wait_ns;
                    node.correct_link_bytes(counted, stats.link_bytes);
                    Ok(report(FragmentReport::Finished { stats, data_messages }))
                }
                None => Err(Status::internal("fragment ended without statistics")),
            }
        });
        // Until the fragment ends: its progress, whenever it has moved on.
        let (ended, ended_rx) = tokio::sync::oneshot::channel::<()>();
        let fragment = encoded.chain(closing).chain(futures::stream::once(async move { drop(ended) }).filter_map(|()| async { None }));
        let progress = futures::stream::unfold((progress, 0), |(progress, reported)| async move {
            loop {
                tokio::time::sleep(PROGRESS_INTERVAL).await;
                let read = progress.bytes_read();
                if read > reported {
                    return Some((Ok(report(FragmentReport::Progress(read))), (progress, read)));
                }
            }
        })
        .take_until(ended_rx);
        Ok(Response::new(futures::stream::select(fragment, progress).boxed()))
    }

    async fn do_put(&self, request: Request<Streaming<FlightData>>) -> Result<Response<Self::DoPutStream>, Status> {
        let mut stream = request.into_inner();
        let first = stream.message().await?.ok_or_else(|| Status::invalid_argument("empty do_put"))?;
        let descriptor = first.flight_descriptor.clone().ok_or_else(|| Status::invalid_argument("do_put needs a descriptor naming the write"))?;
        let put: PutSegment = parse(&descriptor.cmd, "put")?;
        let schema = Arc::new(arrow::datatypes::Schema::try_from(&first).map_err(|e| Status::invalid_argument(format!("bad segment schema: {e}")))?);
        let data = futures::stream::once(async { Ok(first) }).chain(stream.map_err(FlightError::from));
        let batches = FlightRecordBatchStream::new_from_flight_data(data).map_err(|e| DataFusionError::Plan(format!("bad segment data: {e}")));
        let rows = self.node.put_segment(&put.write, schema, batches.boxed()).await.map_err(status)?;
        let result = PutResult { app_metadata: Bytes::from(rows.to_string()) };
        Ok(Response::new(futures::stream::once(async { Ok(result) }).boxed()))
    }

    async fn do_action(&self, request: Request<Action>) -> Result<Response<Self::DoActionStream>, Status> {
        let action = request.into_inner();
        let body = &action.body[..];
        let result = match action.r#type.as_str() {
            action::READ_SEGMENT => {
                let read: SegmentRead = parse(body, "read_segment")?;
                let ranges = self.node.read_segment(read).await.map_err(status)?;
                let mut offset = 0u64;
                let chunks: Vec<arrow_flight::Result> = ranges
                    .iter()
                    .flat_map(|bytes| (0..bytes.len()).step_by(STORED_BYTES_CHUNK).map(move |at| &bytes[at..(at + STORED_BYTES_CHUNK).min(bytes.len())]))
                    .map(|bytes| {
                        let body = encode_stored_chunk(offset, bytes);
                        offset += bytes.len() as u64;
                        arrow_flight::Result { body }
                    })
                    .collect();
                return Ok(Response::new(futures::stream::iter(chunks.into_iter().map(Ok)).boxed()));
            }
            action::LIST_TABLES => json(&self.node.list_tables().await.map_err(status)?)?,
            action::TABLE_INFO => {
                let table: String = parse(body, "table_info")?;
                json(&TableInfoWire::from_info(&self.node.table_info(&table).await.map_err(status)?))?
            }
            action::DESCRIBE => json(&self.node.describe().await.map_err(status)?)?,
            action::SCRUB => {
                let tables: Vec<String> = parse(body, "scrub")?;
                json(&self.node.scrub(tables).await.map_err(status)?)?
            }
            // The node parses the job (its `NodeJobs`) and answers in the job's own bytes.
            action::JOB => arrow_flight::Result { body: self.node.run_job(body.to_vec()).await.map_err(status)?.into() },
            action::BEGIN_WRITE => json(&self.node.begin_write(parse::<BeginWrite>(body, "begin_write")?).await.map_err(status)?)?,
            action::COMMIT_WRITE => {
                let commit: CommitWrite = parse(body, "commit_write")?;
                json(&self.node.commit_write(&commit.write, commit.properties).await.map_err(status)?)?
            }
            action::ABORT_WRITE => {
                let write: String = parse(body, "abort_write")?;
                self.node.abort_write(&write).await.map_err(status)?;
                json(&true)?
            }
            other => return Err(Status::invalid_argument(format!("unknown action '{other}'"))),
        };
        Ok(Response::new(futures::stream::once(async { Ok(result) }).boxed()))
    }

    async fn list_actions(&self, _request: Request<Empty>) -> Result<Response<Self::ListActionsStream>, Status> {
        let actions = [
            action::LIST_TABLES,
            action::TABLE_INFO,
            action::DESCRIBE,
            action::READ_SEGMENT,
            action::BEGIN_WRITE,
            action::COMMIT_WRITE,
            action::ABORT_WRITE,
            action::JOB,
            action::SCRUB,
        ]
            .map(|name| Ok(ActionType { r#type: name.into(), description: String::new() }));
        Ok(Response::new(futures::stream::iter(actions).boxed()))
    }

    async fn do_exchange(&self, _request: Request<Streaming<FlightData>>) -> Result<Response<Self::DoExchangeStream>, Status> {
        Err(Status::unimplemented("do_exchange"))
    }
}
