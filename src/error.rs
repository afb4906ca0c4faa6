//! The library's error type.
//!
//! Every error a user can cause names the thing at fault (file, line, field, rule) and, where
//! there is a closed set of choices, what would have been valid. The binary maps the variants to
//! exit codes (DESIGN.md §8): [`Error::Invalid`] and [`Error::Config`] are "invalid invocation,
//! contract or rules" (exit 2); everything else is a failed run (exit 1).

use std::path::PathBuf;

/// `Result` with ingot's [`Error`] as the default error type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A problem located in a configuration file: `file:line:column: message`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Located {
    pub file: PathBuf,
    pub line: usize,
    pub column: usize,
    pub message: String,
}

impl std::fmt::Display for Located {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}:{}:{}: {}",
            self.file.display(),
            self.line,
            self.column,
            self.message
        )
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// One or more problems in contracts or rules files, each located.
    #[error("{}", render_located(.0))]
    Config(Vec<Located>),

    /// The invocation itself is wrong (unknown source, missing file, bad option value).
    #[error("{0}")]
    Invalid(String),

    /// A run failed: the input cannot be loaded as a whole (missing required column, unreadable
    /// file). Nothing of the run is published.
    #[error("{0}")]
    RunFailed(String),

    /// Another process holds the lock of this source.
    #[error("{0}")]
    Locked(String),

    /// File-system or object-store failure, with the path it concerns.
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },

    #[error("object store: {0}")]
    ObjectStore(#[from] object_store::Error),

    /// An object-store failure on a known URL (the lake or a landing file).
    #[error("{url}: {source}")]
    Storage {
        url: String,
        #[source]
        source: object_store::Error,
    },

    #[error(transparent)]
    DataFusion(#[from] datafusion::error::DataFusionError),

    #[error(transparent)]
    Arrow(#[from] datafusion::arrow::error::ArrowError),

    #[error(transparent)]
    Parquet(#[from] datafusion::parquet::errors::ParquetError),

    /// A failpoint fired (tests only, see [`crate::failpoint`]).
    #[error("failpoint {0} fired")]
    Failpoint(String),
}

impl Error {
    pub fn io(path: impl std::fmt::Display, source: std::io::Error) -> Self {
        Error::Io {
            path: path.to_string(),
            source,
        }
    }

    /// Exit code for schedulers (DESIGN.md §8).
    pub fn exit_code(&self) -> u8 {
        match self {
            Error::Config(_) | Error::Invalid(_) => 2,
            _ => 1,
        }
    }
}

fn render_located(items: &[Located]) -> String {
    let mut out = String::new();
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.push('\n');
        }
        out.push_str(&item.to_string());
    }
    out
}
