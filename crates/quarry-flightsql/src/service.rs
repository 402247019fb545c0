//! The Flight SQL service: arrow-flight's [`FlightSqlService`] over Quarry sessions.
//!
//! Tickets are Quarry's own ([`StatementTicket`], JSON inside a `TicketStatementQuery`): a
//! query id (what `CancelFlightInfo` names), the session, and the SQL or the prepared
//! statement. Nothing in a ticket is trusted: a ticket that does not parse, or names a prepared
//! statement this server does not hold, is refused with the reason.

use std::pin::Pin;
use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use arrow::ipc::writer::IpcWriteOptions;
use arrow_flight::decode::FlightRecordBatchStream;
use arrow_flight::encode::FlightDataEncoderBuilder;
use arrow_flight::error::FlightError;
use arrow_flight::flight_service_server::FlightService;
use arrow_flight::sql::metadata::{SqlInfoData, XdbcTypeInfoData};
use arrow_flight::sql::server::{FlightSqlService, PeekableFlightDataStream};
use arrow_flight::sql::{
    ActionCancelQueryRequest, ActionCancelQueryResult, ActionClosePreparedStatementRequest, ActionCreatePreparedStatementRequest,
    ActionCreatePreparedStatementResult, Any, CommandGetCatalogs, CommandGetDbSchemas, CommandGetSqlInfo, CommandGetTableTypes, CommandGetTables,
    CommandGetXdbcTypeInfo, CommandPreparedStatementQuery, CommandPreparedStatementUpdate, CommandStatementQuery, CommandStatementUpdate, DoPutPreparedStatementResult, ProstMessageExt, SqlInfo,
    TicketStatementQuery,
};
use arrow_flight::{
    Action, ActionType, CancelFlightInfoRequest, CancelFlightInfoResult, CancelStatus, FlightDescriptor, FlightEndpoint, FlightInfo, HandshakeRequest,
    HandshakeResponse, IpcMessage, SchemaAsIpc, Ticket,
};
use base64::Engine;
use datafusion::common::{ParamValues, ScalarValue};
use datafusion::error::DataFusionError;
use datafusion::logical_expr::LogicalPlan;
use futures::{Stream, StreamExt, TryStreamExt};
use prost::Message;
use quarry_engine::{QuarrySession, QueryStop, user_message};
use quarry_table::manifest::{storage_schema, storage_type};
use quarry_table::segment::conform_batch;
use serde::{Deserialize, Serialize};
use tonic::metadata::MetadataValue;
use tonic::{Request, Response, Status, Streaming};

use crate::catalog::{CATALOG, SCHEMA, sql_info, xdbc_type_info};
use crate::sessions::{Prepared, Running, SESSION_COOKIE, ServerState};

/// The action a client cancels a query with (Flight's own; `CancelQuery` is Flight SQL's older one).
const CANCEL_FLIGHT_INFO: &str = "CancelFlightInfo";

/// Quarry's Flight SQL service.
pub struct QuarryFlightSql {
    state: Arc<ServerState>,
    /// Where queries run: a runtime of their own, so that a query busy on every thread does
    /// not keep the server from answering calls (a cancellation among them).
    queries: tokio::runtime::Handle,
    token: Option<String>,
    sql_info: SqlInfoData,
    type_info: XdbcTypeInfoData,
}

impl QuarryFlightSql {
    /// The service over sessions forked from `base`, running queries on `queries`; `token`
    /// is what a handshake's password must be.
    pub fn new(base: QuarrySession, queries: tokio::runtime::Handle, token: Option<String>) -> Self {
        QuarryFlightSql { state: Arc::new(ServerState::new(base)), queries, token, sql_info: sql_info(), type_info: xdbc_type_info() }
    }

    /// The client's session: the one its cookie names, or a new one (with the cookie to set,
    /// which clients that keep cookies send back).
    async fn session<T>(&self, request: &Request<T>) -> Result<ClientSession, Status> {
        let (id, new) = match cookie(request) {
            Some(id) => (id, false),
            None => (ServerState::new_session_id(), true),
        };
        let session = self.state.session(&id).await.map_err(status)?;
        Ok(ClientSession { id, session, new })
    }

    /// A FlightInfo for `plan`'s result, fetched with `ticket`.
    fn flight_info(&self, plan: &LogicalPlan, ticket: StatementTicket, descriptor: FlightDescriptor) -> Result<FlightInfo, Status> {
        let ticket = TicketStatementQuery { statement_handle: serde_json::to_vec(&ticket).expect("ticket serializes").into() };
        FlightInfo::new()
            .try_with_schema(&result_schema(plan))
            .map_err(|e| Status::internal(format!("encoding the result schema: {e}")))
            .map(|info| info.with_endpoint(FlightEndpoint::new().with_ticket(Ticket::new(ticket.as_any().encode_to_vec()))).with_descriptor(descriptor))
    }

    /// Runs `plan` in `session`, streaming its rows as Flight data; the query `id` can be
    /// cancelled while it runs, and stops if the client goes away.
    fn run(&self, session: Arc<QuarrySession>, plan: LogicalPlan, id: u64) -> Result<Response<<Self as FlightService>::DoGetStream>, Status> {
        let schema = result_schema(&plan);
        let (sender, receiver) = tokio::sync::mpsc::channel::<Result<Option<RecordBatch>, Status>>(2);
        let task_schema = Arc::clone(&schema);
        let stop = Arc::new(QueryStop::default());
        let query_stop = Arc::clone(&stop);
        let task = self.queries.spawn(async move {
            let result = async {
                let mut stream = session.stream_until_stopped(plan, query_stop).await.map_err(status)?;
                while let Some(batch) = stream.next().await {
                    let batch = conform_batch(&batch.map_err(status)?, &task_schema).map_err(Status::internal)?;
                    if sender.send(Ok(Some(batch))).await.is_err() {
                        return Ok(()); // The client went away.
                    }
                }
                Ok(())
            }
            .await;
            // The end marker: a stream that closes without it was cancelled.
            let _ = sender.send(result.map(|()| None)).await;
        });
        let handles = Running { task: task.abort_handle(), stop: Arc::clone(&stop) };
        self.state.started(id, handles.clone());
        let running = RunningQuery { state: Arc::clone(&self.state), id, handles };
        // A task aborts only when it next yields and the runtime polls it again, which a busy
        // query can hold off for many seconds: the stream ends on the cancellation itself.
        let batches = futures::stream::unfold((receiver, Some(running)), move |(mut receiver, guard)| {
            let stop = Arc::clone(&stop);
            async move {
                guard.as_ref()?;
                tokio::select! {
                    biased;
                    () = stop.wait() => Some((Err(cancelled_error()), (receiver, None))),
                    message = receiver.recv() => match message {
                        Some(Ok(Some(batch))) => Some((Ok(batch), (receiver, guard))),
                        Some(Ok(None)) => None,
                        Some(Err(e)) => Some((Err(FlightError::Tonic(Box::new(e))), (receiver, None))),
                        None => Some((Err(cancelled_error()), (receiver, None))),
                    },
                }
            }
        });
        let stream = FlightDataEncoderBuilder::new().with_schema(schema).build(batches).map_err(Status::from);
        Ok(Response::new(Box::pin(stream)))
    }

    /// Cancels the queries of `info`'s endpoints; whether any was running.
    fn cancel(&self, info: &FlightInfo) -> bool {
        let mut cancelled = false;
        for endpoint in &info.endpoint {
            let Some(ticket) = &endpoint.ticket else { continue };
            if let Ok(ticket) = StatementTicket::from_ticket(&ticket.ticket) {
                cancelled |= self.state.cancel(ticket.query);
            }
        }
        cancelled
    }

    /// The prepared statement `handle` names.
    fn prepared(&self, handle: &[u8]) -> Result<Arc<std::sync::Mutex<Prepared>>, Status> {
        let handle = handle_id(handle)?;
        self.state.prepared(handle).ok_or_else(|| Status::not_found("no such prepared statement (closed, or idle too long)"))
    }
}

/// A client's session, and whether it is new (its cookie is then set on the response).
struct ClientSession {
    id: String,
    session: Arc<QuarrySession>,
    new: bool,
}

impl ClientSession {
    /// `response` with the session's cookie, if the client does not have it yet.
    fn respond<T>(&self, body: T) -> Response<T> {
        let mut response = Response::new(body);
        if self.new {
            let cookie = format!("{SESSION_COOKIE}={}", self.id);
            response.metadata_mut().insert("set-cookie", MetadataValue::try_from(cookie).expect("hex is ASCII"));
        }
        response
    }
}

/// What a statement's ticket says.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct StatementTicket {
    /// The query's id, unique per FlightInfo: a cancellation names it.
    query: u64,
    /// The session it runs in.
    session: String,
    /// The SQL, for a statement.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    sql: Option<String>,
    /// The handle, for a prepared statement.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    prepared: Option<u64>,
}

impl StatementTicket {
    /// The ticket inside a `Ticket`'s bytes (an `Any` holding a `TicketStatementQuery`).
    fn from_ticket(bytes: &[u8]) -> Result<Self, Status> {
        let any = Any::decode(bytes).map_err(|_| Status::invalid_argument("not a Quarry statement ticket"))?;
        let ticket: TicketStatementQuery = any
            .unpack()
            .ok()
            .flatten()
            .ok_or_else(|| Status::invalid_argument("not a Quarry statement ticket"))?;
        Self::from_handle(&ticket.statement_handle)
    }

    fn from_handle(handle: &[u8]) -> Result<Self, Status> {
        serde_json::from_slice(handle).map_err(|e| Status::invalid_argument(format!("not a Quarry statement ticket: {e}")))
    }
}

/// A running query's hold on its task. Dropped with the response stream (the result was sent,
/// or the client went away), it stops the task and forgets the query, whichever of the task's
/// end and [`ServerState::started`] came first.
struct RunningQuery {
    state: Arc<ServerState>,
    id: u64,
    handles: Running,
}

impl Drop for RunningQuery {
    fn drop(&mut self) {
        self.handles.stop();
        self.state.ended(self.id);
    }
}

/// How a cancelled query's stream ends.
fn cancelled_error() -> FlightError {
    FlightError::Tonic(Box::new(Status::cancelled("the query was cancelled")))
}

/// The session id in the request's cookies.
fn cookie<T>(request: &Request<T>) -> Option<String> {
    request.metadata().get_all("cookie").iter().filter_map(|value| value.to_str().ok()).find_map(|cookies| {
        cookies.split(';').find_map(|pair| {
            let (name, value) = pair.trim().split_once('=')?;
            let valid = name == SESSION_COOKIE && !value.is_empty() && value.len() <= 64 && value.bytes().all(|b| b.is_ascii_hexdigit());
            valid.then(|| value.to_string())
        })
    })
}

/// `sql` with JDBC-style `?` placeholders numbered `$1`, `$2`, ... as DataFusion takes them;
/// SQL that does not tokenize is left for the parser to report.
fn numbered_placeholders(sql: &str) -> String {
    use datafusion::sql::sqlparser::dialect::GenericDialect;
    use datafusion::sql::sqlparser::tokenizer::{Token, Tokenizer};
    let Ok(tokens) = Tokenizer::new(&GenericDialect {}, sql).tokenize() else { return sql.to_string() };
    if !tokens.iter().any(|t| matches!(t, Token::Placeholder(p) if p == "?")) {
        return sql.to_string();
    }
    let mut next = 0;
    tokens
        .into_iter()
        .map(|token| match token {
            Token::Placeholder(p) if p == "?" => {
                next += 1;
                format!("${next}")
            }
            other => other.to_string(),
        })
        .collect()
}

/// A prepared statement handle's id.
fn handle_id(handle: &[u8]) -> Result<u64, Status> {
    <[u8; 8]>::try_from(handle).map(u64::from_le_bytes).map_err(|_| Status::invalid_argument("not a Quarry prepared statement handle"))
}

/// The schema of `plan`'s result as clients receive it (plain strings, not views).
fn result_schema(plan: &LogicalPlan) -> SchemaRef {
    storage_schema(plan.schema().as_arrow())
}

/// The types of the parameters `plan` takes, `$1` first (`None`: the planner could not infer it).
fn parameter_types(plan: &LogicalPlan) -> Result<Vec<(String, Option<DataType>)>, Status> {
    let mut parameters: Vec<(usize, String, Option<DataType>)> = plan
        .get_parameter_types()
        .map_err(status)?
        .into_iter()
        .map(|(name, data_type)| (name.trim_start_matches('$').parse().unwrap_or(usize::MAX), name, data_type))
        .collect();
    parameters.sort();
    Ok(parameters.into_iter().map(|(_, name, data_type)| (name, data_type)).collect())
}

/// The parameters as clients see them: plain strings, not views (a string where the type is
/// not inferred).
fn parameter_schema(plan: &LogicalPlan) -> Result<Schema, Status> {
    let fields = parameter_types(plan)?
        .into_iter()
        .map(|(name, data_type)| Field::new(name, data_type.as_ref().map_or(DataType::Utf8, storage_type), true));
    Ok(Schema::new(fields.collect::<Vec<_>>()))
}

/// `plan` with `params` bound, each cast to the type the planner inferred for it.
fn bind(plan: LogicalPlan, params: Option<&ParamValues>) -> Result<LogicalPlan, Status> {
    let Some(ParamValues::List(values)) = params else {
        return Ok(plan);
    };
    let types = parameter_types(&plan)?;
    let mut cast = Vec::with_capacity(values.len());
    for (i, value) in values.iter().enumerate() {
        let value = value.value();
        cast.push(match types.get(i) {
            Some((_, Some(data_type))) if value.data_type() != *data_type && !value.is_null() => value
                .cast_to(data_type)
                .map_err(|e| Status::invalid_argument(format!("parameter ${}: {} does not fit {}: {}", i + 1, value, data_type, user_message(&e))))?,
            _ => value.clone(),
        });
    }
    plan.with_param_values(cast).map_err(status)
}

/// Runs `plan` to its end; the rows it returned (a `SET` returns none: Quarry changes no table
/// through SQL).
async fn run_for_effect(session: &QuarrySession, plan: LogicalPlan) -> Result<i64, Status> {
    let mut stream = session.stream(plan).await.map_err(status)?;
    let mut rows = 0;
    while let Some(batch) = stream.next().await {
        rows += batch.map_err(status)?.num_rows() as i64;
    }
    Ok(rows)
}

/// A query's error as the CLI words it.
fn status(e: DataFusionError) -> Status {
    let message = user_message(&e);
    match e.find_root() {
        DataFusionError::SQL(..) | DataFusionError::Plan(_) | DataFusionError::SchemaError(..) | DataFusionError::Configuration(_) | DataFusionError::NotImplemented(_) => {
            Status::invalid_argument(message)
        }
        DataFusionError::ResourcesExhausted(_) => Status::resource_exhausted(message),
        _ => Status::internal(message),
    }
}

/// One batch as a Flight stream.
fn one_batch<E: Send + 'static>(schema: SchemaRef, batch: Result<RecordBatch, E>) -> Response<<QuarryFlightSql as FlightService>::DoGetStream>
where
    FlightError: From<E>,
{
    let stream = FlightDataEncoderBuilder::new()
        .with_schema(schema)
        .build(futures::stream::once(async move { batch.map_err(FlightError::from) }))
        .map_err(Status::from);
    Response::new(Box::pin(stream))
}

/// A FlightInfo whose one endpoint's ticket is the command itself.
fn command_info(command: Any, schema: &Schema, descriptor: FlightDescriptor) -> Result<Response<FlightInfo>, Status> {
    let info = FlightInfo::new()
        .try_with_schema(schema)
        .map_err(|e| Status::internal(format!("encoding a schema: {e}")))?
        .with_endpoint(FlightEndpoint::new().with_ticket(Ticket::new(command.encode_to_vec())))
        .with_descriptor(descriptor);
    Ok(Response::new(info))
}

fn ipc_schema(schema: &Schema) -> Result<bytes::Bytes, Status> {
    let IpcMessage(bytes) =
        SchemaAsIpc::new(schema, &IpcWriteOptions::default()).try_into().map_err(|e: arrow::error::ArrowError| Status::internal(e.to_string()))?;
    Ok(bytes)
}

#[tonic::async_trait]
impl FlightSqlService for QuarryFlightSql {
    type FlightService = QuarryFlightSql;

    /// Basic auth whose password is the server's token (the interceptor has checked it)
    /// answers with the bearer token clients then send.
    async fn do_handshake(
        &self,
        request: Request<Streaming<HandshakeRequest>>,
    ) -> Result<Response<Pin<Box<dyn Stream<Item = Result<HandshakeResponse, Status>> + Send>>>, Status> {
        let token = self.token.clone().unwrap_or_default();
        let payload = HandshakeResponse { protocol_version: 0, payload: token.clone().into() };
        let mut response: Response<Pin<Box<dyn Stream<Item = Result<HandshakeResponse, Status>> + Send>>> =
            Response::new(Box::pin(futures::stream::once(async move { Ok(payload) })));
        if self.token.is_some() {
            let bearer = MetadataValue::try_from(format!("Bearer {token}")).map_err(|_| Status::internal("the token is not printable ASCII"))?;
            response.metadata_mut().insert("authorization", bearer);
        }
        drop(request);
        Ok(response)
    }

    async fn get_flight_info_statement(&self, query: CommandStatementQuery, request: Request<FlightDescriptor>) -> Result<Response<FlightInfo>, Status> {
        let client = self.session(&request).await?;
        let plan = client.session.plan(&query.query).await.map_err(status)?;
        let ticket = StatementTicket { query: rand::random(), session: client.id.clone(), sql: Some(query.query), prepared: None };
        let info = self.flight_info(&plan, ticket, request.into_inner())?;
        Ok(client.respond(info))
    }

    async fn get_flight_info_prepared_statement(
        &self,
        command: CommandPreparedStatementQuery,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let handle = handle_id(&command.prepared_statement_handle)?;
        let (session_plan, params) = {
            let prepared = self.prepared(&command.prepared_statement_handle)?;
            let prepared = prepared.lock().expect("prepared lock");
            (prepared.plan.clone(), prepared.params.clone())
        };
        let plan = bind(session_plan, params.as_ref())?;
        let ticket = StatementTicket { query: rand::random(), session: String::new(), sql: None, prepared: Some(handle) };
        Ok(Response::new(self.flight_info(&plan, ticket, request.into_inner())?))
    }

    async fn do_get_statement(&self, ticket: TicketStatementQuery, _request: Request<Ticket>) -> Result<Response<<Self as FlightService>::DoGetStream>, Status> {
        let ticket = StatementTicket::from_handle(&ticket.statement_handle)?;
        match (&ticket.sql, ticket.prepared) {
            (Some(sql), None) => {
                let session = self.state.session(&ticket.session).await.map_err(status)?;
                let plan = session.plan(sql).await.map_err(status)?;
                self.run(session, plan, ticket.query)
            }
            (None, Some(handle)) => {
                let (session, plan, params) = {
                    let prepared = self.prepared(&handle.to_le_bytes())?;
                    let prepared = prepared.lock().expect("prepared lock");
                    (Arc::clone(&prepared.session), prepared.plan.clone(), prepared.params.clone())
                };
                let plan = bind(plan, params.as_ref())?;
                self.run(session, plan, ticket.query)
            }
            _ => Err(Status::invalid_argument("a Quarry statement ticket names SQL or a prepared statement")),
        }
    }

    async fn do_action_create_prepared_statement(
        &self,
        query: ActionCreatePreparedStatementRequest,
        request: Request<Action>,
    ) -> Result<ActionCreatePreparedStatementResult, Status> {
        let client = self.session(&request).await?;
        let plan = client.session.plan(&numbered_placeholders(&query.query)).await.map_err(status)?;
        let dataset_schema = ipc_schema(&result_schema(&plan))?;
        let parameter_schema = ipc_schema(&parameter_schema(&plan)?)?;
        let handle = self.state.prepare(Prepared { session: client.session, plan, params: None });
        Ok(ActionCreatePreparedStatementResult { prepared_statement_handle: handle.to_le_bytes().to_vec().into(), dataset_schema, parameter_schema })
    }

    /// Binds the parameters: the first row of the batches sent.
    async fn do_put_prepared_statement_query(
        &self,
        command: CommandPreparedStatementQuery,
        request: Request<PeekableFlightDataStream>,
    ) -> Result<DoPutPreparedStatementResult, Status> {
        let prepared = self.prepared(&command.prepared_statement_handle)?;
        // The stream itself, not its inner stream: that would lose the peeked first message (the schema).
        let data = request.into_inner().map_err(FlightError::from);
        let batches: Vec<RecordBatch> = FlightRecordBatchStream::new_from_flight_data(data).try_collect().await.map_err(Status::from)?;
        let rows: usize = batches.iter().map(RecordBatch::num_rows).sum();
        if rows != 1 {
            return Err(Status::invalid_argument(format!("a query's parameters are one row; {rows} rows were bound")));
        }
        let batch = batches.iter().find(|b| b.num_rows() == 1).expect("one row");
        let values = batch
            .columns()
            .iter()
            .map(|column| ScalarValue::try_from_array(column, 0))
            .collect::<datafusion::error::Result<Vec<_>>>()
            .map_err(status)?;
        let mut prepared = prepared.lock().expect("prepared lock");
        // Checked now, so that a wrong parameter is this call's error.
        bind(prepared.plan.clone(), Some(&ParamValues::from(values.clone())))?;
        prepared.params = Some(ParamValues::from(values));
        Ok(DoPutPreparedStatementResult { prepared_statement_handle: Some(command.prepared_statement_handle) })
    }

    /// A statement run for its effect (a `SET`, a view), as JDBC's `execute` sends one whose
    /// result has no columns.
    async fn do_put_statement_update(&self, command: CommandStatementUpdate, request: Request<PeekableFlightDataStream>) -> Result<i64, Status> {
        let client = self.session(&request).await?;
        let plan = client.session.plan(&command.query).await.map_err(status)?;
        run_for_effect(&client.session, plan).await
    }

    async fn do_put_prepared_statement_update(
        &self,
        command: CommandPreparedStatementUpdate,
        _request: Request<PeekableFlightDataStream>,
    ) -> Result<i64, Status> {
        let (session, plan, params) = {
            let prepared = self.prepared(&command.prepared_statement_handle)?;
            let prepared = prepared.lock().expect("prepared lock");
            (Arc::clone(&prepared.session), prepared.plan.clone(), prepared.params.clone())
        };
        run_for_effect(&session, bind(plan, params.as_ref())?).await
    }

    async fn do_action_close_prepared_statement(&self, query: ActionClosePreparedStatementRequest, _request: Request<Action>) -> Result<(), Status> {
        self.state.close(handle_id(&query.prepared_statement_handle)?);
        Ok(())
    }

    async fn do_action_cancel_query(&self, query: ActionCancelQueryRequest, _request: Request<Action>) -> Result<ActionCancelQueryResult, Status> {
        let info = FlightInfo::decode(query.info).map_err(|_| Status::invalid_argument("CancelQuery: not a FlightInfo"))?;
        // CancelResult: 1 cancelled, 3 not cancellable (it is not running).
        Ok(ActionCancelQueryResult { result: if self.cancel(&info) { 1 } else { 3 } })
    }

    async fn do_action_fallback(&self, request: Request<Action>) -> Result<Response<<Self as FlightService>::DoActionStream>, Status> {
        let action = request.into_inner();
        if action.r#type != CANCEL_FLIGHT_INFO {
            return Err(Status::invalid_argument(format!("unknown action '{}'", action.r#type)));
        }
        let request = CancelFlightInfoRequest::decode(action.body).map_err(|_| Status::invalid_argument("CancelFlightInfo: not a CancelFlightInfoRequest"))?;
        let info = request.info.ok_or_else(|| Status::invalid_argument("CancelFlightInfo: no FlightInfo"))?;
        let status = if self.cancel(&info) { CancelStatus::Cancelled } else { CancelStatus::NotCancellable };
        let result = CancelFlightInfoResult { status: status as i32 };
        let body = arrow_flight::Result { body: result.encode_to_vec().into() };
        Ok(Response::new(Box::pin(futures::stream::once(async move { Ok(body) }))))
    }

    async fn list_custom_actions(&self) -> Option<Vec<Result<ActionType, Status>>> {
        Some(vec![Ok(ActionType { r#type: CANCEL_FLIGHT_INFO.into(), description: "Cancel a running query, named by its FlightInfo".into() })])
    }

    async fn get_flight_info_catalogs(&self, query: CommandGetCatalogs, request: Request<FlightDescriptor>) -> Result<Response<FlightInfo>, Status> {
        command_info(query.as_any(), &query.into_builder().schema(), request.into_inner())
    }

    async fn do_get_catalogs(&self, query: CommandGetCatalogs, _request: Request<Ticket>) -> Result<Response<<Self as FlightService>::DoGetStream>, Status> {
        let mut builder = query.into_builder();
        builder.append(CATALOG);
        Ok(one_batch(builder.schema(), builder.build()))
    }

    async fn get_flight_info_schemas(&self, query: CommandGetDbSchemas, request: Request<FlightDescriptor>) -> Result<Response<FlightInfo>, Status> {
        command_info(query.as_any(), &query.into_builder().schema(), request.into_inner())
    }

    async fn do_get_schemas(&self, query: CommandGetDbSchemas, _request: Request<Ticket>) -> Result<Response<<Self as FlightService>::DoGetStream>, Status> {
        let mut builder = query.into_builder();
        builder.append(CATALOG, "information_schema");
        builder.append(CATALOG, SCHEMA);
        Ok(one_batch(builder.schema(), builder.build()))
    }

    async fn get_flight_info_tables(&self, query: CommandGetTables, request: Request<FlightDescriptor>) -> Result<Response<FlightInfo>, Status> {
        command_info(query.as_any(), &query.into_builder().schema(), request.into_inner())
    }

    async fn do_get_tables(&self, query: CommandGetTables, request: Request<Ticket>) -> Result<Response<<Self as FlightService>::DoGetStream>, Status> {
        let client = self.session(&request).await?;
        let schema = client.session.context().catalog(CATALOG).and_then(|c| c.schema(SCHEMA)).ok_or_else(|| Status::internal("no schema quarry.main"))?;
        let mut builder = query.into_builder();
        let mut names = schema.table_names();
        names.sort();
        for name in names {
            let Some(table) = schema.table(&name).await.map_err(status)? else { continue };
            let table_type = match table.table_type() {
                datafusion::datasource::TableType::View => "VIEW",
                _ => "TABLE",
            };
            builder.append(CATALOG, SCHEMA, &name, table_type, &storage_schema(&table.schema())).map_err(Status::from)?;
        }
        Ok(client.respond(one_batch(builder.schema(), builder.build()).into_inner()))
    }

    async fn get_flight_info_table_types(&self, query: CommandGetTableTypes, request: Request<FlightDescriptor>) -> Result<Response<FlightInfo>, Status> {
        command_info(query.as_any(), &query.into_builder().schema(), request.into_inner())
    }

    async fn do_get_table_types(&self, query: CommandGetTableTypes, _request: Request<Ticket>) -> Result<Response<<Self as FlightService>::DoGetStream>, Status> {
        let mut builder = query.into_builder();
        builder.append("TABLE");
        builder.append("VIEW");
        Ok(one_batch(builder.schema(), builder.build()))
    }

    async fn get_flight_info_sql_info(&self, query: CommandGetSqlInfo, request: Request<FlightDescriptor>) -> Result<Response<FlightInfo>, Status> {
        let schema = query.clone().into_builder(&self.sql_info).schema();
        command_info(query.as_any(), &schema, request.into_inner())
    }

    async fn do_get_sql_info(&self, query: CommandGetSqlInfo, _request: Request<Ticket>) -> Result<Response<<Self as FlightService>::DoGetStream>, Status> {
        let builder = query.into_builder(&self.sql_info);
        Ok(one_batch(builder.schema(), builder.build()))
    }

    async fn get_flight_info_xdbc_type_info(&self, query: CommandGetXdbcTypeInfo, request: Request<FlightDescriptor>) -> Result<Response<FlightInfo>, Status> {
        let schema = query.clone().into_builder(&self.type_info).schema();
        command_info(query.as_any(), &schema, request.into_inner())
    }

    async fn do_get_xdbc_type_info(&self, query: CommandGetXdbcTypeInfo, _request: Request<Ticket>) -> Result<Response<<Self as FlightService>::DoGetStream>, Status> {
        let builder = query.into_builder(&self.type_info);
        Ok(one_batch(builder.schema(), builder.build()))
    }

    async fn register_sql_info(&self, _id: i32, _result: &SqlInfo) {}
}

/// The token check of `quarry server`: `authorization: Bearer <token>`, or Basic auth (any
/// user) whose password is the token, as ADBC and JDBC clients send it.
#[derive(Clone)]
pub struct SqlTokenCheck {
    token: Option<String>,
}

impl SqlTokenCheck {
    /// Checks for `token`; `None` accepts every call (loopback only).
    pub fn new(token: Option<String>) -> Self {
        SqlTokenCheck { token: token.map(|t| t.trim().to_string()) }
    }

    fn accepts(&self, header: &[u8]) -> bool {
        let Some(token) = &self.token else { return true };
        if let Some(bearer) = header.strip_prefix(b"Bearer ") {
            return quarry_flight::auth::constant_time_eq(bearer, token.as_bytes());
        }
        let Some(basic) = header.strip_prefix(b"Basic ") else { return false };
        // Padded or not: the Go client (ADBC) sends it without.
        let unpadded = basic.strip_suffix(b"==").or_else(|| basic.strip_suffix(b"=")).unwrap_or(basic);
        let Ok(credentials) = base64::engine::general_purpose::STANDARD_NO_PAD.decode(unpadded) else { return false };
        let password = credentials.iter().position(|&b| b == b':').map_or(&[][..], |colon| &credentials[colon + 1..]);
        quarry_flight::auth::constant_time_eq(password, token.as_bytes())
    }
}

impl tonic::service::Interceptor for SqlTokenCheck {
    fn call(&mut self, request: Request<()>) -> Result<Request<()>, Status> {
        let header = request.metadata().get("authorization").map(|v| v.as_bytes()).unwrap_or_default();
        if self.accepts(header) {
            Ok(request)
        } else if header.is_empty() {
            Err(Status::unauthenticated("this Quarry server requires a token (a bearer token, or the password of basic auth)"))
        } else {
            Err(Status::unauthenticated("wrong token for this Quarry server"))
        }
    }
}
