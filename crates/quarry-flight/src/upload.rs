//! Sending tables to storage nodes (`quarry load|gen --nodes`): a table staged in a local
//! warehouse is spread segment by segment, round-robin, over the nodes, each of which commits
//! its share as its own version of the table (a node may hold none of a table's segments: it
//! still commits the table, empty, so every node knows every table's schema).

use std::fs::File;
use std::sync::Arc;

use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use quarry_storage::{BeginWrite, StorageNode};
use quarry_table::Warehouse;

use crate::client::RemoteStorageNode;

/// Sends `table` from `staging` to `nodes`, its first segment to node `first_node` (callers
/// sending several tables continue the round-robin, so small tables do not all land on one
/// node). Each node's share commits atomically on that node; a failure aborts the writes not
/// yet committed. Returns the number of segments sent.
pub async fn upload_table(staging: &Warehouse, table: &str, nodes: &[RemoteStorageNode], append: bool, first_node: usize) -> Result<usize, String> {
    let snapshot = staging.table(table).map_err(|e| e.to_string())?;
    let manifest = &snapshot.manifest;
    let begin = BeginWrite {
        table: table.to_string(),
        schema: manifest.schema.clone(),
        append,
        bloom_filter_columns: manifest.bloom_filter_columns.clone(),
        sort_key: manifest.sort_key.clone(),
        page_encoding: manifest.page_encoding,
    };
    let mut writes = Vec::with_capacity(nodes.len());
    for node in nodes {
        match node.begin_write(begin.clone()).await {
            Ok(id) => writes.push(id),
            Err(e) => {
                abort(nodes, &writes).await;
                return Err(e.message().to_string());
            }
        }
    }
    // For tests: the host dies holding the nodes' write transactions.
    if std::env::var("QUARRY_FAIL_POINT").is_ok_and(|v| v == "upload-after-begin") {
        std::process::abort();
    }
    let outcome = async {
        for (i, segment) in manifest.segments.iter().enumerate() {
            let node = (first_node + i) % nodes.len();
            let path = snapshot.segment_path(segment);
            let file = File::open(&path).map_err(|e| format!("reading {}: {e}", path.display()))?;
            let reader = ParquetRecordBatchReaderBuilder::try_new(file).and_then(|b| b.build()).map_err(|e| format!("reading {}: {e}", path.display()))?;
            let batches = reader.collect::<Result<Vec<_>, _>>().map_err(|e| format!("reading {}: {e}", path.display()))?;
            let batches = futures::stream::iter(batches.into_iter().map(Ok));
            nodes[node].put_segment(&writes[node], Arc::clone(&snapshot.schema), Box::pin(batches)).await.map_err(|e| e.message().to_string())?;
        }
        Ok::<(), String>(())
    }
    .await;
    if let Err(e) = outcome {
        abort(nodes, &writes).await;
        return Err(e);
    }
    let properties: Vec<(String, String)> = manifest.properties.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    for (i, (node, write)) in nodes.iter().zip(&writes).enumerate() {
        if let Err(e) = node.commit_write(write, properties.clone()).await {
            abort(&nodes[i + 1..], &writes[i + 1..]).await;
            return Err(format!("{} ({i} of {} nodes had committed their share of '{table}')", e.message(), nodes.len()));
        }
    }
    Ok(manifest.segments.len())
}

async fn abort(nodes: &[RemoteStorageNode], writes: &[String]) {
    for (node, write) in nodes.iter().zip(writes) {
        let _ = node.abort_write(write).await;
    }
}
