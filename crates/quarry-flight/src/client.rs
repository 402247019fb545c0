//! The host's side of a remote storage node: [`StorageNode`] over Arrow Flight.
//!
//! Connections use HTTP/2 keep-alives (every 5 s, 20 s to answer), so a node that hangs
//! mid-query turns into an error naming it, never a hang; one that dies resets its connection
//! at once. The answer is awaited that long because the pings are answered on the same workers
//! that compute: a 2 s limit failed a query of the soak (16 clients on 2 cores) with the node
//! alive.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use arrow_flight::decode::FlightRecordBatchStream;
use arrow_flight::error::FlightError;
use arrow_flight::flight_service_client::FlightServiceClient;
use arrow_flight::{Action, FlightDescriptor, Ticket};
use async_trait::async_trait;
use bytes::Bytes;
use datafusion::error::{DataFusionError, Result};
use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use arrow_flight::encode::FlightDataEncoderBuilder;
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use quarry_storage::view_compaction::link_batches;
use quarry_storage::{BeginWrite, Fragment, NodeDescription, ScanMessage, ScanStats, ScanStream, SegmentRead, StorageNode, TableInfo};
use tonic::codegen::InterceptedService;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};

use crate::auth::TokenAttach;
use crate::wire::{CommitWrite, FragmentReport, LINK_MESSAGE_BYTES, PutSegment, TableInfoWire, action, decode_sequence, decode_stored_chunk, encode_ticket};

type Client = FlightServiceClient<InterceptedService<Channel, TokenAttach>>;

/// A storage node reached over Flight.
#[derive(Debug, Clone)]
pub struct RemoteStorageNode {
    url: String,
    client: ClientHandle,
}

#[derive(Clone)]
struct ClientHandle(Client);

impl std::fmt::Debug for ClientHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FlightClient")
    }
}

impl RemoteStorageNode {
    /// Connects to `url` (`grpc://HOST:PORT`, or `grpc+tls://HOST:PORT` for a node serving
    /// TLS, whose certificate must be signed by `tls_ca` (PEM) or, without it, by a root the
    /// system trusts), sending `token` with every call.
    pub async fn connect(url: &str, token: Option<&str>, tls_ca: Option<&[u8]>) -> Result<Self, String> {
        let (address, tls) = match (url.strip_prefix("grpc://"), url.strip_prefix("grpc+tls://")) {
            (Some(address), _) => (address, false),
            (_, Some(address)) => (address, true),
            _ => return Err(format!("storage node address '{url}' must look like grpc://HOST:PORT or grpc+tls://HOST:PORT")),
        };
        let mut endpoint = Endpoint::from_shared(format!("{}://{address}", if tls { "https" } else { "http" }))
            .map_err(|e| format!("storage node address '{url}': {e}"))?;
        if tls {
            let host = endpoint.uri().host().unwrap_or_default().trim_start_matches('[').trim_end_matches(']').to_string();
            let config = ClientTlsConfig::new().domain_name(host);
            let config = match tls_ca {
                Some(pem) => config.ca_certificate(Certificate::from_pem(pem)),
                None => config.with_native_roots(),
            };
            endpoint = endpoint.tls_config(config).map_err(|e| format!("TLS for storage node {url}: {}", source_text(&e)))?;
        }
        let endpoint = endpoint
            .connect_timeout(Duration::from_secs(3))
            .http2_keep_alive_interval(Duration::from_secs(5))
            .keep_alive_timeout(Duration::from_secs(20))
            .keep_alive_while_idle(true)
            .tcp_nodelay(true);
        let channel = endpoint.connect().await.map_err(|e| {
            let reason = source_text(&e);
            // rustls repeats its reason down the source chain: say it once, with the remedy.
            match reason.find("invalid peer certificate: ") {
                Some(at) => {
                    let what = reason[at..].split(": ").nth(1).unwrap_or_default();
                    format!("storage node {url}: its TLS certificate is not trusted ({what}): give --tls-ca with the certificate of the CA that signed it")
                }
                None => format!("cannot reach storage node {url}: {reason}"),
            }
        })?;
        Self::over_channel(url, channel, token).await.map_err(|e| {
            // A plaintext call to a node serving TLS fails in HTTP/2 or below, never with a
            // node's answer: name the likely cause.
            let message = e.message();
            let transport = ["transport error", "h2 protocol error", "operation was canceled", "connection"].iter().any(|m| message.contains(m));
            if !tls && transport { format!("{message} (a node that serves TLS is named grpc+tls://{address})") } else { message.to_string() }
        })
    }

    /// The node named `url` behind `channel`, an established connection (`connect` makes one
    /// over TCP; the fault simulation's is in process), sending `token` with every call. Lists
    /// the node's tables once, so that a node that refuses us fails here.
    pub async fn over_channel(url: &str, channel: Channel, token: Option<&str>) -> Result<Self> {
        let attach = TokenAttach::new(token).map_err(DataFusionError::Configuration)?;
        let client = FlightServiceClient::with_interceptor(channel, attach).max_decoding_message_size(256 << 20).max_encoding_message_size(256 << 20);
        let node = RemoteStorageNode { url: url.to_string(), client: ClientHandle(client) };
        node.list_tables().await?;
        Ok(node)
    }

    fn error(&self, status: tonic::Status) -> DataFusionError {
        let message = status.message();
        let mut message = if message.is_empty() { status.code().description() } else { message }.to_string();
        // A transport failure says what failed in its sources ("http2 error": "keep-alive timed out").
        let mut source = std::error::Error::source(&status);
        while let Some(cause) = source {
            let cause_text = cause.to_string();
            if !message.contains(&cause_text) {
                message = format!("{message}: {cause_text}");
            }
            source = cause.source();
        }
        DataFusionError::Execution(format!("storage node {}: {message}", self.url))
    }

    /// Runs an action and returns its one result's body.
    pub async fn action(&self, name: &str, body: Vec<u8>) -> Result<Bytes> {
        let request = Action { r#type: name.into(), body: body.into() };
        let mut client = self.client.0.clone();
        let mut results = client.do_action(request).await.map_err(|s| self.error(s))?.into_inner();
        let first = results.message().await.map_err(|s| self.error(s))?;
        first.map(|r| r.body).ok_or_else(|| DataFusionError::Execution(format!("storage node {}: empty answer to {name}", self.url)))
    }

    async fn action_json<T: serde::de::DeserializeOwned>(&self, name: &str, body: &impl serde::Serialize) -> Result<T> {
        let body = serde_json::to_vec(body).expect("request serializes");
        let answer = self.action(name, body).await?;
        serde_json::from_slice(&answer).map_err(|e| DataFusionError::Execution(format!("storage node {}: malformed answer to {name}: {e}", self.url)))
    }

}

fn source_text(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

#[async_trait]
impl StorageNode for RemoteStorageNode {
    fn name(&self) -> &str {
        &self.url
    }

    async fn list_tables(&self) -> Result<Vec<String>> {
        self.action_json(action::LIST_TABLES, &()).await
    }

    async fn table_info(&self, table: &str) -> Result<TableInfo> {
        let wire: TableInfoWire = self.action_json(action::TABLE_INFO, &table).await?;
        wire.into_info(&self.url)
    }

    async fn describe(&self) -> Result<NodeDescription> {
        self.action_json(action::DESCRIBE, &()).await
    }

    async fn scrub(&self, tables: Vec<String>) -> Result<quarry_table::ScrubReport> {
        self.action_json(action::SCRUB, &tables).await
    }

    async fn read_segment(&self, read: SegmentRead) -> Result<Vec<Bytes>> {
        let body = serde_json::to_vec(&read).expect("request serializes");
        let request = Action { r#type: action::READ_SEGMENT.into(), body: body.into() };
        let mut client = self.client.0.clone();
        let mut results = client.do_action(request).await.map_err(|s| self.error(s))?.into_inner();
        let mut received = bytes::BytesMut::with_capacity(read.len() as usize);
        while let Some(chunk) = results.message().await.map_err(|s| self.error(s))? {
            let damaged = |what: String| DataFusionError::Execution(format!("storage node {}: the stored bytes of segment '{}' arrived damaged: {what}", self.url, read.segment));
            let (offset, chunk) = decode_stored_chunk(chunk.body).ok_or_else(|| damaged("a chunk without its offset".into()))?;
            if offset != received.len() as u64 {
                return Err(damaged(format!("a chunk for offset {offset} came where offset {} was due", received.len())));
            }
            if received.len() + chunk.len() > read.len() as usize {
                return Err(DataFusionError::Execution(format!("storage node {}: sent more than the {} bytes asked of segment '{}'", self.url, read.len(), read.segment)));
            }
            received.extend_from_slice(&chunk);
        }
        if received.len() != read.len() as usize {
            return Err(DataFusionError::Execution(format!(
                "storage node {}: sent {} of the {} bytes asked of segment '{}'",
                self.url,
                received.len(),
                read.len(),
                read.segment
            )));
        }
        let mut received = received.freeze();
        Ok(read.ranges.iter().map(|r| received.split_to((r.end - r.start) as usize)).collect())
    }

    async fn begin_write(&self, request: BeginWrite) -> Result<String> {
        self.action_json(action::BEGIN_WRITE, &request).await
    }

    async fn put_segment(&self, write: &str, schema: SchemaRef, batches: BoxStream<'static, Result<RecordBatch>>) -> Result<u64> {
        let descriptor = serde_json::to_vec(&PutSegment { write: write.to_string() }).expect("request serializes");
        // A batch the caller could not produce ends the upload; the node then has a segment
        // cut short, which the error makes the caller abort.
        let failed: Arc<Mutex<Option<DataFusionError>>> = Arc::default();
        let slot = Arc::clone(&failed);
        let batches = batches
            .and_then(|batch| futures::future::ready(link_batches(batch, LINK_MESSAGE_BYTES / 2)))
            .map_ok(|pieces| futures::stream::iter(pieces.into_iter().map(Ok::<_, DataFusionError>)))
            .try_flatten();
        let data = FlightDataEncoderBuilder::new()
            .with_schema(schema)
            .with_flight_descriptor(Some(FlightDescriptor::new_cmd(descriptor)))
            .with_max_flight_data_size(LINK_MESSAGE_BYTES)
            .build(batches.map_err(|e| FlightError::ExternalError(Box::new(e))))
            .scan((), move |_, item| {
                futures::future::ready(match item {
                    Ok(data) => Some(data),
                    Err(e) => {
                        *slot.lock().expect("put lock") = Some(DataFusionError::Execution(format!("sending a segment: {e}")));
                        None
                    }
                })
            });
        let mut client = self.client.0.clone();
        let mut response = client.do_put(data).await.map_err(|s| self.error(s))?.into_inner();
        let mut rows = 0;
        while let Some(result) = response.message().await.map_err(|s| self.error(s))? {
            rows = std::str::from_utf8(&result.app_metadata).ok().and_then(|text| text.parse().ok()).unwrap_or(rows);
        }
        match failed.lock().expect("put lock").take() {
            Some(e) => Err(e),
            None => Ok(rows),
        }
    }

    async fn commit_write(&self, write: &str, properties: Vec<(String, String)>) -> Result<u64> {
        self.action_json(action::COMMIT_WRITE, &CommitWrite { write: write.to_string(), properties }).await
    }

    async fn run_job(&self, job: Vec<u8>) -> Result<Vec<u8>> {
        self.action(action::JOB, job).await.map(Vec::from)
    }

    async fn abort_write(&self, write: &str) -> Result<()> {
        self.action_json::<bool>(action::ABORT_WRITE, &write).await.map(drop)
    }

    async fn execute(&self, fragment: Fragment) -> Result<ScanStream> {
        let mut client = self.client.0.clone();
        let response = client.do_get(Ticket { ticket: encode_ticket(&fragment)? }).await.map_err(|s| self.error(s))?;
        let node = self.clone();
        // Messages without data carry the node's reports: progress goes to the fragment's
        // slot; the statistics, in the last one, are taken out before decoding.
        let stats: Arc<Mutex<Option<Result<ScanStats>>>> = Arc::default();
        let slot = Arc::clone(&stats);
        let url = self.url.clone();
        let progress = fragment.progress;
        // Data messages must arrive numbered 0, 1, 2, ... and the closing statistics must count
        // them all: a lost, repeated or reordered message is an error, never a changed result.
        let mut data_messages = 0u64;
        let data = response.into_inner().map_err(FlightError::from).try_filter_map(move |message| {
            let checked = if message.data_header.is_empty() && !message.app_metadata.is_empty() {
                match FragmentReport::decode(&message.app_metadata) {
                    Ok(FragmentReport::Progress(bytes)) => {
                        progress.report(bytes);
                        Ok(None)
                    }
                    Ok(FragmentReport::Finished { data_messages: sent, .. }) if sent != data_messages => {
                        Err(FlightError::ProtocolError(format!("the fragment's stream was damaged: the node sent {sent} data messages, {data_messages} arrived before its statistics")))
                    }
                    Ok(FragmentReport::Finished { stats, .. }) => {
                        progress.report(stats.bytes_read);
                        *slot.lock().expect("stats lock") = Some(Ok(stats));
                        Ok(None)
                    }
                    Err(e) => {
                        *slot.lock().expect("stats lock") = Some(Err(DataFusionError::Execution(format!("storage node {url}: {e}"))));
                        Ok(None)
                    }
                }
            } else {
                match decode_sequence(&message.app_metadata) {
                    Some(sequence) if sequence == data_messages => {
                        data_messages += 1;
                        Ok(Some(message))
                    }
                    Some(sequence) => Err(FlightError::ProtocolError(format!("the fragment's stream was damaged: data message {sequence} came where {data_messages} was due"))),
                    None => Err(FlightError::ProtocolError(format!("the fragment's stream was damaged: data message {data_messages} carries no sequence number"))),
                }
            };
            futures::future::ready(checked)
        });
        let batches = FlightRecordBatchStream::new_from_flight_data(data).map(move |item| match item {
            Ok(batch) => Ok(ScanMessage::Batch(batch)),
            Err(FlightError::Tonic(status)) => Err(node.error(*status)),
            Err(FlightError::ProtocolError(message)) => Err(DataFusionError::Execution(format!("storage node {}: {message}", node.url))),
            Err(e) => Err(DataFusionError::Execution(format!("storage node {}: {e}", node.url))),
        });
        // After the last batch: the statistics, if the node sent them; otherwise nothing, and
        // the host reports the stream as incomplete.
        let closing = futures::stream::once(async move { stats.lock().expect("stats lock").take() })
            .filter_map(|stats| async move { stats.map(|s| s.map(ScanMessage::Finished)) });
        Ok(batches.chain(closing).boxed())
    }
}
