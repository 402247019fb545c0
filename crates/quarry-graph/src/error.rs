//! The crate's error type: one line, naming the file (and line, for parse errors) involved.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

/// Result alias used throughout the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in graph storage, import and analytics.
#[derive(Debug)]
pub enum Error {
    /// An I/O operation on a graph file, a temporary file or a directory failed.
    Io {
        /// What was being done (e.g. "reading edge file").
        action: &'static str,
        /// The file or directory involved.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
    /// An input edge file is malformed.
    Parse {
        /// The input file (or the name given for a reader).
        path: PathBuf,
        /// 1-based line number.
        line: u64,
        /// What is wrong.
        message: String,
    },
    /// A caller-supplied value is unusable: an edge whose vertex id is out of range, a NaN
    /// weight, a root that is not a vertex, a graph without the reverse edges an algorithm needs,
    /// a memory budget that is too small, a destination that already exists.
    Invalid(String),
    /// A graph or engine file does not have the expected size or contents.
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What was wrong.
        detail: String,
    },
    /// The sort-reducer failed.
    SortReduce(quarry_sortreduce::Error),
    /// The run was cancelled ([`crate::engine::Cancel`]).
    Cancelled,
}

impl Error {
    pub(crate) fn io(action: &'static str, path: impl Into<PathBuf>, source: io::Error) -> Self {
        Error::Io {
            action,
            path: path.into(),
            source,
        }
    }

    pub(crate) fn corrupt(path: impl AsRef<Path>, detail: impl Into<String>) -> Self {
        Error::Corrupt {
            path: path.as_ref().to_path_buf(),
            detail: detail.into(),
        }
    }

    pub(crate) fn invalid(message: impl Into<String>) -> Self {
        Error::Invalid(message.into())
    }
}

impl From<quarry_sortreduce::Error> for Error {
    fn from(e: quarry_sortreduce::Error) -> Self {
        Error::SortReduce(e)
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Io {
                action,
                path,
                source,
            } => write!(f, "graph: {action} {}: {source}", path.display()),
            Error::Parse {
                path,
                line,
                message,
            } => write!(f, "graph: {}:{line}: {message}", path.display()),
            Error::Invalid(message) => write!(f, "graph: {message}"),
            Error::Corrupt { path, detail } => {
                write!(f, "graph: corrupt file {}: {detail}", path.display())
            }
            // The sort-reduce error already names its crate.
            Error::SortReduce(e) => write!(f, "graph: {e}"),
            Error::Cancelled => write!(f, "graph: the run was cancelled"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Io { source, .. } => Some(source),
            Error::SortReduce(e) => Some(e),
            _ => None,
        }
    }
}
