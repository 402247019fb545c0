//! Arrow Flight SQL over Quarry (`quarry server`): the warehouse (or storage nodes) as a
//! database that ADBC, JDBC and other Flight SQL clients query.
//!
//! - Statements and prepared statements (parameters `$1` or `?`, bound by `DoPut`), their
//!   results streamed as Arrow; `CancelFlightInfo` (and Flight SQL's older `CancelQuery`)
//!   stops a running query.
//! - `GetSqlInfo`, `GetCatalogs`, `GetDbSchemas`, `GetTables` (with schemas), `GetTableTypes`,
//!   `GetXdbcTypeInfo`.
//! - Each client has its own session ([`sessions`]); all share the process's memory pool.
//! - A query's error is a Flight error carrying the one-line message the CLI prints.

pub mod catalog;
pub mod service;
pub mod sessions;

use std::sync::Arc;

use arrow_flight::flight_service_server::FlightServiceServer;
use quarry_engine::QuarrySession;
use quarry_flight::ServeOptions;

pub use service::{QuarryFlightSql, SqlTokenCheck};

/// Serves Flight SQL over sessions forked from `base` until the process ends, queries running
/// on `threads` threads of their own. `on_ready` gets the server's URL (the port may have been
/// 0). It refuses to listen beyond loopback without a token, and without TLS unless
/// `options.insecure`.
pub async fn serve_sql(base: QuarrySession, threads: usize, options: ServeOptions, on_ready: impl FnOnce(String)) -> Result<(), String> {
    let (incoming, address, mut builder, scheme) = quarry_flight::listen(&options).await?;
    // Lives as long as the process: a runtime may not be dropped inside another one.
    let queries: &'static tokio::runtime::Runtime = Box::leak(Box::new(
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads.max(1))
            .thread_name("quarry-query")
            .enable_all()
            .build()
            .map_err(|e| format!("starting the query runtime: {e}"))?,
    ));
    on_ready(format!("{scheme}://{address}"));
    let service = Arc::new(QuarryFlightSql::new(base, queries.handle().clone(), options.token.clone()));
    let server = FlightServiceServer::from_arc(service).max_decoding_message_size(256 << 20).max_encoding_message_size(256 << 20);
    let service = tonic::codegen::InterceptedService::new(server, SqlTokenCheck::new(options.token));
    builder
        .add_service(service)
        .serve_with_incoming(incoming)
        .await
        .map_err(|e| format!("serving on {address}: {e}"))
}
