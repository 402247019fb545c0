//! Writing query results as a table, CSV, JSON or Parquet.

use std::io::Write;

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use datafusion::error::{DataFusionError, Result};
use parquet::arrow::ArrowWriter;
use quarry_table::manifest::storage_schema;
use quarry_table::segment::conform_batch;

/// Result formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputFormat {
    /// An aligned text table.
    Table,
    /// CSV with a header line.
    Csv,
    /// A JSON array of row objects.
    Json,
    /// A Parquet file (needs a file, not a terminal).
    Parquet,
    /// Nothing: the rows are computed and dropped (benchmarks time a query, not its printing).
    None,
}

impl std::str::FromStr for OutputFormat {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "table" => Ok(OutputFormat::Table),
            "csv" => Ok(OutputFormat::Csv),
            "json" => Ok(OutputFormat::Json),
            "parquet" => Ok(OutputFormat::Parquet),
            "none" => Ok(OutputFormat::None),
            other => Err(format!("unknown format '{other}' (expected table, csv, json, parquet or none)")),
        }
    }
}

/// Receives a result's batches in order.
pub trait ResultSink {
    /// One batch of the result.
    fn write_batch(&mut self, batch: &RecordBatch) -> Result<()>;
    /// The result is complete.
    fn finish(&mut self) -> Result<()>;
}

/// Writes results to `out` in `format`. Strings are written as plain UTF-8 columns (the view
/// types DataFusion computes with are an in-memory detail).
pub struct FormatSink<W: Write + Send> {
    format: OutputFormat,
    schema: SchemaRef,
    out: Option<W>,
    batches: Vec<RecordBatch>,
    csv: Option<arrow::csv::Writer<W>>,
    json: Option<arrow::json::ArrayWriter<W>>,
    parquet: Option<ArrowWriter<W>>,
}

impl<W: Write + Send> FormatSink<W> {
    /// A sink for results of `schema`.
    pub fn try_new(format: OutputFormat, schema: &SchemaRef, out: W) -> Result<Self> {
        let schema = storage_schema(schema);
        let mut sink = FormatSink { format, schema: schema.clone(), out: None, batches: Vec::new(), csv: None, json: None, parquet: None };
        match format {
            OutputFormat::Table => sink.out = Some(out),
            OutputFormat::Csv => sink.csv = Some(arrow::csv::WriterBuilder::new().with_header(true).build(out)),
            OutputFormat::Json => sink.json = Some(arrow::json::ArrayWriter::new(out)),
            OutputFormat::Parquet => sink.parquet = Some(ArrowWriter::try_new(out, schema, None)?),
            OutputFormat::None => {}
        }
        Ok(sink)
    }
}

impl<W: Write + Send> ResultSink for FormatSink<W> {
    fn write_batch(&mut self, batch: &RecordBatch) -> Result<()> {
        if self.format == OutputFormat::None {
            return Ok(());
        }
        let batch = conform_batch(batch, &self.schema).map_err(DataFusionError::Execution)?;
        match self.format {
            OutputFormat::Table => self.batches.push(batch),
            OutputFormat::Csv => self.csv.as_mut().expect("csv writer").write(&batch)?,
            OutputFormat::Json => self.json.as_mut().expect("json writer").write(&batch)?,
            OutputFormat::Parquet => self.parquet.as_mut().expect("parquet writer").write(&batch)?,
            OutputFormat::None => {}
        }
        Ok(())
    }

    fn finish(&mut self) -> Result<()> {
        match self.format {
            OutputFormat::Table => {
                let out = self.out.as_mut().expect("table output");
                let text = if self.batches.is_empty() {
                    arrow::util::pretty::pretty_format_batches(&[RecordBatch::new_empty(self.schema.clone())])?
                } else {
                    arrow::util::pretty::pretty_format_batches(&self.batches)?
                };
                writeln!(out, "{text}")?;
                out.flush()?;
            }
            OutputFormat::Csv => {
                let writer = self.csv.take().expect("csv writer");
                writer.into_inner().flush()?;
            }
            OutputFormat::Json => {
                let mut writer = self.json.take().expect("json writer");
                writer.finish()?;
                let mut out = writer.into_inner();
                writeln!(out)?;
                out.flush()?;
            }
            OutputFormat::Parquet => {
                self.parquet.take().expect("parquet writer").close()?;
            }
            OutputFormat::None => {}
        }
        Ok(())
    }
}
