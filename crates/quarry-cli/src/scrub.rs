//! `quarry scrub`: every segment file of every retained version of the tables, read and checked
//! against the checksums recorded when it was written, on the node that holds it.

use std::time::Instant;

use quarry_engine::user_message;
use quarry_table::{ScrubReport, Warehouse};

use crate::CliResult;
use crate::target::Target;

/// Arguments of `quarry scrub`. With no table named, the graphs are scrubbed too.
#[derive(Debug, clap::Args)]
pub struct ScrubArgs {
    /// Tables to scrub (default: every table and every graph).
    tables: Vec<String>,
    /// Print the report as JSON instead of text.
    #[arg(long)]
    json: bool,
    /// First give the segments written before checksums existed checksums of their bytes as
    /// they are now, committed as a new version of each table (embedded warehouse only).
    #[arg(long)]
    record_missing: bool,
}

fn record_missing(target: &Target, tables: &[String]) -> CliResult {
    if target.is_remote() {
        return Err("--record-missing runs on the warehouse directory; run it where the node's warehouse is".into());
    }
    let warehouse = Warehouse::open(&target.warehouse).map_err(|e| e.to_string())?;
    let tables = if tables.is_empty() { warehouse.table_names().map_err(|e| e.to_string())? } else { tables.to_vec() };
    for table in &tables {
        let recorded = warehouse.record_missing_checksums(table).map_err(|e| e.to_string())?;
        if recorded > 0 {
            println!("recorded checksums of {recorded} segment files of {table}");
        }
    }
    Ok(())
}

/// Scrubs the tables on every node; fails (exit status 1) if anything is damaged.
pub async fn run(target: &Target, args: ScrubArgs) -> CliResult {
    let started = Instant::now();
    if args.record_missing {
        record_missing(target, &args.tables)?;
    }
    let nodes = target.storage_nodes().await?;
    let mut report = ScrubReport::default();
    let mut found = vec![false; args.tables.len()];
    for node in &nodes {
        // With no names a node scrubs all it holds, graphs too; else the named tables it
        // holds (a name no node holds is an error).
        let mut tables = Vec::new();
        if !args.tables.is_empty() {
            let held = node.list_tables().await.map_err(|e| user_message(&e))?;
            for (name, found) in args.tables.iter().zip(found.iter_mut()) {
                if held.contains(name) {
                    *found = true;
                    tables.push(name.clone());
                }
            }
            if tables.is_empty() {
                continue;
            }
        }
        let mut scrubbed = node.scrub(tables).await.map_err(|e| user_message(&e))?;
        if target.is_remote() {
            for damage in &mut scrubbed.damage {
                damage.file = std::path::Path::new(node.name()).join(&damage.file);
            }
        }
        report.merge(scrubbed);
    }
    if let Some((missing, _)) = args.tables.iter().zip(&found).find(|(_, found)| !**found) {
        return Err(format!("no table '{missing}' to scrub"));
    }
    for names in [&mut report.tables, &mut report.graphs] {
        names.sort();
        names.dedup();
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?);
    } else {
        for damage in &report.damage {
            println!("damaged\t{}\t{}: {}", damage.name, damage.location(), damage.reason);
        }
        println!(
            "scrubbed {} tables and {} graphs: {} files, {:.1} MB verified in {:.2} s; {} damaged, {} without checksums",
            report.tables.len(),
            report.graphs.len(),
            report.files_verified,
            report.bytes_verified as f64 / 1e6,
            started.elapsed().as_secs_f64(),
            report.damage.len(),
            report.unverifiable.len()
        );
    }
    match report.damage.len() {
        0 => Ok(()),
        n => Err(format!("{n} damaged segment file ranges found (see above)")),
    }
}
