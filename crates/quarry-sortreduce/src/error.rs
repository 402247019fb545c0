//! The crate's error type: one line, naming the file or the limit involved.

use std::fmt;
use std::io;
use std::path::PathBuf;

/// Result alias used throughout the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in sort-reduce.
#[derive(Debug)]
pub enum Error {
    /// An I/O operation on a temporary file or directory failed.
    Io {
        /// What was being done (e.g. "writing run").
        action: &'static str,
        /// The file or directory involved.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
    /// A reservation did not fit in the memory budget.
    Budget {
        /// Bytes asked for.
        requested: usize,
        /// Bytes reserved by others at the time.
        reserved: usize,
        /// The budget's limit.
        limit: usize,
    },
    /// The configuration cannot work (fan-in below 2, budget too small for even one merge, ...).
    Config(String),
    /// An earlier call on this reducer failed part-way (its chunk may be half sorted), so it
    /// refuses further work instead of producing a wrong result.
    Poisoned,
    /// A run file does not have the expected header or length (truncated or overwritten).
    Corrupt {
        /// The run file.
        path: PathBuf,
        /// What was wrong.
        detail: String,
    },
}

impl Error {
    pub(crate) fn io(action: &'static str, path: impl Into<PathBuf>, source: io::Error) -> Self {
        Error::Io {
            action,
            path: path.into(),
            source,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Io {
                action,
                path,
                source,
            } => {
                write!(f, "sort-reduce: {action} {}: {source}", path.display())
            }
            Error::Budget {
                requested,
                reserved,
                limit,
            } => write!(
                f,
                "sort-reduce: memory budget exceeded: {requested} bytes requested with \
                 {reserved} of {limit} bytes already reserved"
            ),
            Error::Config(msg) => write!(f, "sort-reduce: invalid configuration: {msg}"),
            Error::Poisoned => {
                write!(f, "sort-reduce: reducer unusable after an earlier error")
            }
            Error::Corrupt { path, detail } => {
                write!(
                    f,
                    "sort-reduce: corrupt run file {}: {detail}",
                    path.display()
                )
            }
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}
