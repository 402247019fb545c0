//! The one error type of the table layer. Every variant names the file it concerns, so a user can
//! find the problem without a stack trace.

use std::path::PathBuf;

/// Result alias for the table layer.
pub type Result<T, E = TableError> = std::result::Result<T, E>;

/// What can go wrong reading or writing tables.
#[derive(Debug, thiserror::Error)]
pub enum TableError {
    /// An operating-system I/O error on a named path.
    #[error("{op} {path}: {source}")]
    Io {
        /// What we were doing (e.g. "reading", "renaming").
        op: &'static str,
        /// The file or directory concerned.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A manifest that is missing, unreadable or inconsistent.
    #[error("corrupt manifest {path}: {reason}")]
    CorruptManifest {
        /// The manifest (or CURRENT pointer) file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// A segment file that is missing or cannot be decoded.
    #[error("corrupt segment {path}: {reason}")]
    CorruptSegment {
        /// The segment file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// No table of that name exists in the warehouse.
    #[error("table '{0}' does not exist")]
    TableNotFound(String),
    /// A table name that is not a plain identifier.
    #[error("invalid table name '{0}': use lowercase letters, digits and '_' (not starting with a digit), at most 128 characters")]
    InvalidTableName(String),
    /// Another process holds the table's write lock.
    #[error("table '{0}' is being written by another process; try again when that load finishes")]
    Locked(String),
    /// Data whose schema does not fit the table (e.g. `--append` with other columns).
    #[error("schema mismatch for table '{table}': {reason}")]
    SchemaMismatch {
        /// The table.
        table: String,
        /// How the schemas differ.
        reason: String,
    },
    /// A bad value in an input file, located precisely.
    #[error("{file}:{line}:{column}: {reason}")]
    BadInput {
        /// The input file.
        file: PathBuf,
        /// 1-based line number in the file.
        line: u64,
        /// 1-based column number, with the column's name when known (e.g. `3 (price)`).
        column: String,
        /// What is wrong, quoting the offending token.
        reason: String,
    },
    /// An input file we cannot use at all (unreadable header, unsupported type, ...).
    #[error("{file}: {reason}")]
    InvalidInput {
        /// The input file.
        file: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// An Arrow or Parquet error while writing a segment.
    #[error("writing segment {path}: {reason}")]
    WriteSegment {
        /// The segment being written.
        path: PathBuf,
        /// The underlying error.
        reason: String,
    },
}

impl TableError {
    /// Wraps an I/O error with the operation and path it happened on.
    pub fn io(op: &'static str, path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> Self {
        let path = path.into();
        move |source| TableError::Io { op, path, source }
    }
}
