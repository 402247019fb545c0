//! The node's cumulative counters over HTTP in Prometheus text format (`--metrics-listen`).

use std::net::SocketAddr;
use std::sync::Arc;

use quarry_storage::LocalStorageNode;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Serves `GET /metrics` (any path) on `addr`; returns the bound address.
pub async fn serve_metrics(node: Arc<LocalStorageNode>, addr: SocketAddr) -> Result<SocketAddr, String> {
    let listener = tokio::net::TcpListener::bind(addr).await.map_err(|e| format!("metrics: listening on {addr}: {e}"))?;
    let bound = listener.local_addr().map_err(|e| e.to_string())?;
    tokio::spawn(async move {
        loop {
            let Ok((mut socket, _)) = listener.accept().await else { continue };
            let node = Arc::clone(&node);
            tokio::spawn(async move {
                // The request itself does not matter: read what arrived and answer.
                let mut buf = [0u8; 4096];
                let _ = tokio::time::timeout(std::time::Duration::from_secs(2), socket.read(&mut buf)).await;
                let body = node.metrics_text();
                let response = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = socket.write_all(response.as_bytes()).await;
                let _ = socket.shutdown().await;
            });
        }
    });
    Ok(bound)
}
