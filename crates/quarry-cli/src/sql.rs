//! `quarry sql` and `quarry tables`.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use arrow::datatypes::SchemaRef;
use clap::Args;
use quarry_engine::{FormatSink, OutputFormat, QuarrySession, QueryStats, ResultSink, user_message};

use crate::CliResult;
use crate::progress::QueryBar;
use crate::target::Target;

#[derive(Debug, Args)]
pub struct SqlArgs {
    /// The SQL to run (one or more statements separated by ';').
    query: Option<String>,
    /// Read the SQL from a file instead.
    #[arg(short = 'f', long = "file", conflicts_with = "query")]
    file: Option<PathBuf>,
    /// Result format.
    #[arg(long, default_value = "table")]
    format: OutputFormat,
    /// Write the result to this file instead of standard output.
    #[arg(long, short = 'o')]
    output: Option<PathBuf>,
    /// Write the query's accounting (time, rows, bytes) as JSON to this file.
    #[arg(long)]
    stats: Option<PathBuf>,
}

pub async fn run(target: &Target, args: SqlArgs) -> CliResult {
    let (sql, source) = match (&args.query, &args.file) {
        (Some(sql), None) => (sql.clone(), None),
        (None, Some(file)) => (
            std::fs::read_to_string(file).map_err(|e| format!("reading {}: {e}", file.display()))?,
            Some(file.display().to_string()),
        ),
        _ => return Err("give the SQL as an argument or with -f FILE".into()),
    };
    if args.format == OutputFormat::Parquet && args.output.is_none() {
        return Err("--format parquet needs --output FILE".into());
    }
    let session = target.session().await?;
    let in_source = |message: String| match &source {
        Some(file) => format!("{file}: {message}"),
        None => message,
    };
    let statements = session.parse(&sql).map_err(|e| in_source(user_message(&e)))?;
    if statements.len() > 1 && args.output.is_some() {
        return Err(in_source(format!("--output takes the result of one statement; found {}", statements.len())));
    }
    let mut last_stats = None;
    for statement in statements {
        let stats = run_statement(&session, statement, args.format, args.output.as_deref()).await.map_err(in_source)?;
        last_stats = Some(stats);
    }
    if let (Some(path), Some(stats)) = (&args.stats, last_stats) {
        write_stats(path, &stats)?;
    }
    Ok(())
}

/// Runs one statement, writing its result to `output` or standard output.
pub async fn run_statement(
    session: &QuarrySession,
    statement: datafusion::sql::parser::Statement,
    format: OutputFormat,
    output: Option<&Path>,
) -> CliResult<QueryStats> {
    let out: Box<dyn Write + Send> = match output {
        Some(path) => Box::new(BufWriter::new(File::create(path).map_err(|e| format!("creating {}: {e}", path.display()))?)),
        None => Box::new(BufWriter::new(std::io::stdout())),
    };
    let mut out = Some(out);
    // A long query shows its progress on a terminal (results to a file or not).
    let bar = QueryBar::on_terminal();
    let sink_for = |schema: &SchemaRef| {
        let sink: Box<dyn ResultSink> = Box::new(FormatSink::try_new(format, schema, out.take().expect("one sink per statement"))?);
        Ok(match &bar {
            Some(bar) => bar.clearing(sink),
            None => sink,
        })
    };
    let watch = |progress| {
        if let Some(bar) = &bar {
            bar.watch(progress);
        }
    };
    session.execute_watched(statement, sink_for, watch).await.map_err(|e| user_message(&e))
}

fn write_stats(path: &Path, stats: &QueryStats) -> CliResult {
    let text = serde_json::to_string_pretty(stats).expect("stats serialize");
    std::fs::write(path, text + "\n").map_err(|e| format!("writing {}: {e}", path.display()))
}
