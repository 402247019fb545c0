//! CSV input: schema inference and parsing into Arrow batches, with errors that name the file,
//! line, column and offending token.
//!
//! Parsing is two-step: fields are collected as text per batch, then cast to the column types
//! with Arrow's cast kernels in "safe" mode (failures become NULL). A value that was present in
//! the text but NULL after the cast failed to parse, and its row's recorded line number locates it.

use std::fs::File;
use std::io::BufReader;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, RecordBatch, StringBuilder};
use arrow::compute::{CastOptions, cast_with_options};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};

use crate::error::{Result, TableError};

/// Rows per batch produced by the reader.
pub const CSV_BATCH_ROWS: usize = 64 * 1024;

/// How to read a CSV file.
#[derive(Debug, Clone)]
pub struct CsvOptions {
    /// Field separator.
    pub delimiter: u8,
    /// Quote character.
    pub quote: u8,
    /// Escape character inside quoted fields; `None` means quotes are escaped by doubling (RFC 4180).
    pub escape: Option<u8>,
    /// Whether the first line names the columns.
    pub has_header: bool,
    /// Field text that means NULL (an empty field always does).
    pub null_text: Option<String>,
    /// Rows sampled to infer types.
    pub infer_rows_max: usize,
}

impl Default for CsvOptions {
    fn default() -> Self {
        CsvOptions { delimiter: b',', quote: b'"', escape: None, has_header: true, null_text: None, infer_rows_max: 100_000 }
    }
}

fn csv_reader(path: &Path, options: &CsvOptions) -> Result<csv::Reader<BufReader<File>>> {
    let file = File::open(path).map_err(TableError::io("opening", path))?;
    Ok(csv::ReaderBuilder::new()
        .delimiter(options.delimiter)
        .quote(options.quote)
        .escape(options.escape)
        .double_quote(options.escape.is_none())
        .has_headers(false)
        .flexible(true)
        .from_reader(BufReader::with_capacity(1 << 20, file)))
}

/// Reads one record; `Ok(None)` at end of file. Errors carry the line they happened on.
fn next_record(reader: &mut csv::Reader<BufReader<File>>, record: &mut csv::StringRecord, path: &Path) -> Result<Option<u64>> {
    match reader.read_record(record) {
        Ok(true) => Ok(Some(record.position().map(|p| p.line()).unwrap_or(0))),
        Ok(false) => Ok(None),
        Err(e) => {
            let line = e.position().map(|p| p.line()).unwrap_or(0);
            let (column, reason) = match e.kind() {
                csv::ErrorKind::Utf8 { err, .. } => (format!("{}", err.field() + 1), format!("invalid UTF-8 (valid up to byte {})", err.valid_up_to())),
                _ => ("?".to_string(), e.to_string()),
            };
            Err(TableError::BadInput { file: path.to_path_buf(), line, column, reason })
        }
    }
}

fn is_null(field: &str, options: &CsvOptions) -> bool {
    field.is_empty() || options.null_text.as_deref() == Some(field)
}

/// Column names from the header (or `column1..N`), lowercased so SQL can name them unquoted
/// (unquoted identifiers are case-folded to lowercase), and made unique the way DuckDB does
/// (`a`, `a_1`).
fn column_names(header: Option<&csv::StringRecord>, count: usize) -> Vec<String> {
    let mut names: Vec<String> = Vec::with_capacity(count);
    for i in 0..count {
        let base = header
            .and_then(|h| h.get(i))
            .map(|s| s.trim().trim_start_matches('\u{feff}').to_lowercase())
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| format!("column{}", i + 1));
        let mut name = base.clone();
        let mut n = 1;
        while names.contains(&name) {
            name = format!("{base}_{n}");
            n += 1;
        }
        names.push(name);
    }
    names
}

/// What the values of one column seen so far could all be.
#[derive(Debug, Clone)]
struct TypeCandidates {
    seen: bool,
    boolean: bool,
    integer: bool,
    float: bool,
    date: bool,
    timestamp: bool,
}

impl TypeCandidates {
    fn new() -> Self {
        TypeCandidates { seen: false, boolean: true, integer: true, float: true, date: true, timestamp: true }
    }

    fn observe(&mut self, value: &str) {
        self.seen = true;
        if self.boolean {
            self.boolean = value.eq_ignore_ascii_case("true") || value.eq_ignore_ascii_case("false");
        }
        if self.integer {
            self.integer = value.parse::<i64>().is_ok();
        }
        if self.float {
            self.float = value.bytes().any(|b| b.is_ascii_digit()) && value.parse::<f64>().is_ok();
        }
        if self.date {
            self.date = value.len() == 10 && chrono::NaiveDate::parse_from_str(value, "%Y-%m-%d").is_ok();
        }
        if self.timestamp {
            self.timestamp = value.len() >= 19
                && (chrono::NaiveDateTime::parse_from_str(value, "%Y-%m-%d %H:%M:%S%.f").is_ok()
                    || chrono::NaiveDateTime::parse_from_str(value, "%Y-%m-%dT%H:%M:%S%.f").is_ok());
        }
    }

    /// Numbers with a point or an exponent are DOUBLE, as DuckDB's reader infers them: a
    /// DECIMAL sized to the sample (`0.0 .. 499.5` -> DECIMAL(4,1)) would reject later appends
    /// of larger or finer values. DECIMAL is for the user to declare (`--schema`).
    fn data_type(&self) -> DataType {
        if !self.seen {
            DataType::Utf8
        } else if self.boolean {
            DataType::Boolean
        } else if self.integer {
            DataType::Int64
        } else if self.float {
            DataType::Float64
        } else if self.date {
            DataType::Date32
        } else if self.timestamp {
            DataType::Timestamp(TimeUnit::Microsecond, None)
        } else {
            DataType::Utf8
        }
    }
}

/// The narrowest type that holds both the values of a `column` type and `value` (for a message
/// about a value that does not fit the column).
fn type_holding(column: &DataType, value: &str) -> DataType {
    let mut alone = TypeCandidates::new();
    alone.observe(value);
    let alone = alone.data_type();
    let numeric = |t: &DataType| t.is_integer() || t.is_floating() || matches!(t, DataType::Decimal128(..));
    match column {
        DataType::Decimal128(precision, column_scale) => match decimal_shape(value) {
            Some((int_digits, value_scale)) => {
                let column_scale = (*column_scale).max(0) as u8;
                let scale = column_scale.max(value_scale);
                let int_digits = precision.saturating_sub(column_scale).max(int_digits);
                if int_digits as u32 + scale as u32 <= 38 { DataType::Decimal128(int_digits + scale, scale as i8) } else { DataType::Float64 }
            }
            None if numeric(&alone) => DataType::Float64,
            None => DataType::Utf8,
        },
        c if c.is_integer() && alone == DataType::Int64 => DataType::Int64,
        c if numeric(c) && numeric(&alone) => DataType::Float64,
        DataType::Date32 if matches!(alone, DataType::Timestamp(..)) => alone,
        _ => DataType::Utf8,
    }
}

/// `(integer digits, fraction digits)` of a plain decimal literal like `-12.50`, else `None`.
fn decimal_shape(value: &str) -> Option<(u8, u8)> {
    let unsigned = value.strip_prefix(['-', '+']).unwrap_or(value);
    let (int_part, frac_part) = unsigned.split_once('.').unwrap_or((unsigned, ""));
    let digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    if (int_part.is_empty() && frac_part.is_empty()) || !digits(int_part) || !digits(frac_part) {
        return None;
    }
    let int_digits = int_part.trim_start_matches('0').len().max(1);
    Some((int_digits.min(255) as u8, frac_part.len().min(255) as u8))
}

/// Infers a schema from the header and the first `infer_rows_max` rows. Every column is
/// nullable. Types: BOOLEAN, BIGINT, DOUBLE (numbers with a point or an exponent), DATE,
/// TIMESTAMP, else VARCHAR.
pub fn infer_csv_schema(path: &Path, options: &CsvOptions) -> Result<SchemaRef> {
    let mut reader = csv_reader(path, options)?;
    let mut record = csv::StringRecord::new();
    let header = if options.has_header {
        match next_record(&mut reader, &mut record, path)? {
            Some(_) => Some(record.clone()),
            None => return Err(TableError::InvalidInput { file: path.into(), reason: "the file is empty (no header line)".into() }),
        }
    } else {
        None
    };
    let mut candidates: Vec<TypeCandidates> = header.as_ref().map(|h| vec![TypeCandidates::new(); h.len()]).unwrap_or_default();
    let mut rows = 0;
    while rows < options.infer_rows_max {
        let Some(line) = next_record(&mut reader, &mut record, path)? else { break };
        if header.is_none() && rows == 0 {
            candidates = vec![TypeCandidates::new(); record.len()];
        }
        check_width(&record, candidates.len(), path, line)?;
        for (field, candidate) in record.iter().zip(candidates.iter_mut()) {
            if !is_null(field, options) {
                candidate.observe(field);
            }
        }
        rows += 1;
    }
    if candidates.is_empty() {
        return Err(TableError::InvalidInput { file: path.into(), reason: "the file has no columns".into() });
    }
    let names = column_names(header.as_ref(), candidates.len());
    let fields: Vec<Field> = names.into_iter().zip(&candidates).map(|(name, c)| Field::new(name, c.data_type(), true)).collect();
    Ok(Arc::new(Schema::new(fields)))
}

fn check_width(record: &csv::StringRecord, expected: usize, path: &Path, line: u64) -> Result<()> {
    if record.len() != expected {
        return Err(TableError::BadInput {
            file: path.into(),
            line,
            column: format!("{}", expected.min(record.len()) + 1),
            reason: format!("expected {expected} fields, found {}", record.len()),
        });
    }
    Ok(())
}

/// Reads a CSV file as batches of `schema` (the file's columns in order).
pub struct CsvBatchReader {
    path: PathBuf,
    reader: csv::Reader<BufReader<File>>,
    schema: SchemaRef,
    options: CsvOptions,
    record: csv::StringRecord,
    done: bool,
}

impl CsvBatchReader {
    /// Opens `path` for reading with `schema`; skips the header line when there is one.
    pub fn try_new(path: &Path, schema: SchemaRef, options: CsvOptions) -> Result<Self> {
        let mut reader = csv_reader(path, &options)?;
        let mut record = csv::StringRecord::new();
        if options.has_header
            && let Some(line) = next_record(&mut reader, &mut record, path)?
        {
            check_width(&record, schema.fields().len(), path, line)?;
        }
        Ok(CsvBatchReader { path: path.to_path_buf(), reader, schema, options, record, done: false })
    }

    fn next_batch(&mut self) -> Result<Option<RecordBatch>> {
        let width = self.schema.fields().len();
        let mut columns: Vec<StringBuilder> = (0..width).map(|_| StringBuilder::new()).collect();
        let mut lines = Vec::with_capacity(CSV_BATCH_ROWS);
        while lines.len() < CSV_BATCH_ROWS {
            let Some(line) = next_record(&mut self.reader, &mut self.record, &self.path)? else {
                self.done = true;
                break;
            };
            check_width(&self.record, width, &self.path, line)?;
            for (field, column) in self.record.iter().zip(columns.iter_mut()) {
                if is_null(field, &self.options) { column.append_null() } else { column.append_value(field) }
            }
            lines.push(line);
        }
        if lines.is_empty() {
            return Ok(None);
        }
        let mut arrays: Vec<ArrayRef> = Vec::with_capacity(width);
        for (index, (mut builder, field)) in columns.into_iter().zip(self.schema.fields()).enumerate() {
            let text = builder.finish();
            let options = CastOptions { safe: true, ..Default::default() };
            let typed = cast_with_options(&text, field.data_type(), &options).map_err(|e| TableError::InvalidInput {
                file: self.path.clone(),
                reason: format!("column '{}' cannot be read as {}: {e}", field.name(), field.data_type()),
            })?;
            if typed.null_count() != text.null_count() {
                let row = (0..text.len()).find(|&r| text.is_valid(r) && typed.is_null(r)).expect("a value failed to cast");
                return Err(TableError::BadInput {
                    file: self.path.clone(),
                    line: lines[row],
                    column: format!("{} ({})", index + 1, field.name()),
                    reason: format!(
                        "'{}' does not fit the column's type {}; {} would hold it (load the table again with --schema to change the type)",
                        text.value(row),
                        sql_type_name(field.data_type()),
                        sql_type_name(&type_holding(field.data_type(), text.value(row)))
                    ),
                });
            }
            if !field.is_nullable() && typed.null_count() > 0 {
                let row = (0..typed.len()).find(|&r| typed.is_null(r)).expect("a null exists");
                return Err(TableError::BadInput {
                    file: self.path.clone(),
                    line: lines[row],
                    column: format!("{} ({})", index + 1, field.name()),
                    reason: "NULL in a NOT NULL column".into(),
                });
            }
            arrays.push(typed);
        }
        RecordBatch::try_new(self.schema.clone(), arrays)
            .map(Some)
            .map_err(|e| TableError::InvalidInput { file: self.path.clone(), reason: e.to_string() })
    }
}

impl Iterator for CsvBatchReader {
    type Item = Result<RecordBatch>;
    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        match self.next_batch() {
            Ok(Some(batch)) => Some(Ok(batch)),
            Ok(None) => None,
            Err(e) => {
                self.done = true;
                Some(Err(e))
            }
        }
    }
}

/// The SQL spelling of an Arrow type, for messages.
pub fn sql_type_name(data_type: &DataType) -> String {
    match data_type {
        DataType::Boolean => "BOOLEAN".into(),
        DataType::Int8 => "TINYINT".into(),
        DataType::Int16 => "SMALLINT".into(),
        DataType::Int32 => "INTEGER".into(),
        DataType::Int64 => "BIGINT".into(),
        DataType::Float32 => "REAL".into(),
        DataType::Float64 => "DOUBLE".into(),
        DataType::Decimal128(p, s) => format!("DECIMAL({p},{s})"),
        DataType::Date32 => "DATE".into(),
        DataType::Timestamp(_, _) => "TIMESTAMP".into(),
        DataType::Utf8 | DataType::Utf8View | DataType::LargeUtf8 => "VARCHAR".into(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn write_csv(dir: &Path, text: &str) -> PathBuf {
        let path = dir.join("input.csv");
        std::fs::File::create(&path).unwrap().write_all(text.as_bytes()).unwrap();
        path
    }

    #[test]
    fn infers_types_and_reads_quoted_fields() {
        let dir = tempfile::tempdir().unwrap();
        let path = write_csv(
            dir.path(),
            "id,price,ratio,day,flag,name,at\n1,12.50,1e3,1992-01-02,true,\"Smith, \"\"Jr\"\"\",1992-01-02 10:00:00\n2,,2.5,,false,Zürich,\n",
        );
        let options = CsvOptions::default();
        let schema = infer_csv_schema(&path, &options).unwrap();
        let types: Vec<String> = schema.fields().iter().map(|f| sql_type_name(f.data_type())).collect();
        assert_eq!(types, ["BIGINT", "DOUBLE", "DOUBLE", "DATE", "BOOLEAN", "VARCHAR", "TIMESTAMP"]);
        let batches: Vec<_> = CsvBatchReader::try_new(&path, schema, options).unwrap().collect::<Result<_>>().unwrap();
        let batch = &batches[0];
        assert_eq!(batch.num_rows(), 2);
        let names = batch.column(5).as_any().downcast_ref::<arrow::array::StringArray>().unwrap();
        assert_eq!(names.value(0), "Smith, \"Jr\"");
        assert_eq!(names.value(1), "Zürich");
        assert!(batch.column(1).is_null(1), "empty field is NULL");
    }

    #[test]
    fn bad_value_names_file_line_column_and_token() {
        let dir = tempfile::tempdir().unwrap();
        let path = write_csv(dir.path(), "a,b\n1,2\n3,x4\n");
        let schema = Arc::new(Schema::new(vec![Field::new("a", DataType::Int64, true), Field::new("b", DataType::Int32, true)]));
        let err = CsvBatchReader::try_new(&path, schema, CsvOptions::default()).unwrap().find_map(|r| r.err()).unwrap();
        let message = err.to_string();
        assert!(message.contains("input.csv:3:2 (b)"), "{message}");
        assert!(message.contains("'x4'"), "{message}");
    }

    #[test]
    fn a_value_that_does_not_fit_names_the_type_that_would() {
        let holding = |column: DataType, value: &str| sql_type_name(&type_holding(&column, value));
        assert_eq!(holding(DataType::Decimal128(4, 1), "7500000.0"), "DECIMAL(8,1)");
        assert_eq!(holding(DataType::Decimal128(21, 20), "9.9e-05"), "DOUBLE");
        assert_eq!(holding(DataType::Decimal128(4, 1), "12.345"), "DECIMAL(6,3)");
        assert_eq!(holding(DataType::Int32, "5000000000"), "BIGINT");
        assert_eq!(holding(DataType::Int64, "2.5"), "DOUBLE");
        assert_eq!(holding(DataType::Int64, "x4"), "VARCHAR");
        assert_eq!(holding(DataType::Date32, "2020-01-01 10:00:00"), "TIMESTAMP");
        let dir = tempfile::tempdir().unwrap();
        let path = write_csv(dir.path(), "a\n1.5\n7500000.0\n");
        let schema = Arc::new(Schema::new(vec![Field::new("a", DataType::Decimal128(4, 1), true)]));
        let err = CsvBatchReader::try_new(&path, schema, CsvOptions::default()).unwrap().find_map(|r| r.err()).unwrap().to_string();
        assert!(err.contains("input.csv:3:1 (a): '7500000.0' does not fit the column's type DECIMAL(4,1); DECIMAL(8,1) would hold it"), "{err}");
    }

    #[test]
    fn ragged_row_is_reported() {
        let dir = tempfile::tempdir().unwrap();
        let path = write_csv(dir.path(), "a,b\n1,2\n3\n");
        let err = infer_csv_schema(&path, &CsvOptions::default()).unwrap_err().to_string();
        assert!(err.contains("input.csv:3:") && err.contains("expected 2 fields, found 1"), "{err}");
    }

    #[test]
    fn duplicate_and_empty_header_names_are_made_unique() {
        let dir = tempfile::tempdir().unwrap();
        let path = write_csv(dir.path(), "a,a,\n1,2,3\n");
        let schema = infer_csv_schema(&path, &CsvOptions::default()).unwrap();
        let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
        assert_eq!(names, ["a", "a_1", "column3"]);
    }
}
