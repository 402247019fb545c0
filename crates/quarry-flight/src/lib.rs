//! Storage nodes over Arrow Flight: the node's service ([`serve`], `quarry serve`) and the
//! host's [`RemoteStorageNode`], which implements the same [`quarry_storage::StorageNode`]
//! trait as the in-process node, so the host runs one code path either way.

pub mod auth;
pub mod client;
pub mod metrics;
pub mod server;
pub mod upload;
pub mod wire;

pub use auth::read_token_file;
pub use client::RemoteStorageNode;
pub use server::{NodeService, ServeOptions, TlsIdentity, listen, serve};
pub use upload::upload_table;
