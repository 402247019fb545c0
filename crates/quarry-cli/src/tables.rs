//! `quarry tables`: the tables of the warehouse or the nodes, with rows, segments and sizes
//! (a table spread over nodes summed over them); `--json` adds the schemas, for scripts.

use quarry_engine::user_message;
use quarry_table::csv_import::sql_type_name;
use serde_json::json;

use crate::CliResult;
use crate::target::Target;

/// Arguments of `quarry tables`.
#[derive(Debug, clap::Args)]
pub struct TablesArgs {
    /// Print the tables as JSON: name, rows, segments, bytes, versions per node, columns.
    #[arg(long)]
    json: bool,
}

pub async fn run(target: &Target, args: TablesArgs) -> CliResult {
    let nodes = target.storage_nodes().await?;
    // Each node's tables, asked once.
    let mut held = Vec::with_capacity(nodes.len());
    for node in &nodes {
        held.push(node.list_tables().await.map_err(|e| user_message(&e))?);
    }
    let mut names: Vec<&String> = held.iter().flatten().collect();
    names.sort();
    names.dedup();
    let mut listed = Vec::with_capacity(names.len());
    for name in names {
        let (mut rows, mut segments, mut bytes, mut versions, mut columns) = (0, 0, 0, Vec::new(), None);
        for (node, tables) in nodes.iter().zip(&held) {
            if !tables.contains(name) {
                continue;
            }
            let info = node.table_info(name).await.map_err(|e| user_message(&e))?;
            rows += info.total_rows();
            segments += info.segments.len();
            bytes += info.total_bytes();
            versions.push((node.name().to_string(), info.version));
            columns.get_or_insert_with(|| {
                info.schema.fields().iter().map(|f| json!({"name": f.name(), "type": sql_type_name(f.data_type()), "nullable": f.is_nullable()})).collect::<Vec<_>>()
            });
        }
        if !args.json {
            let versions: Vec<String> = versions.iter().map(|(_, v)| v.to_string()).collect();
            println!("{name}\t{rows} rows\t{segments} segments\t{:.1} MB\tversion {}", bytes as f64 / 1e6, versions.join(","));
        }
        let versions: Vec<_> = versions.into_iter().map(|(node, version)| json!({"node": node, "version": version})).collect();
        listed.push(json!({"name": name, "rows": rows, "segments": segments, "bytes": bytes, "versions": versions, "columns": columns.unwrap_or_default()}));
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&listed).map_err(|e| e.to_string())?);
    }
    Ok(())
}
