//! The library's error type.
//!
//! Every error a user can cause names the thing at fault (file, line, field, rule) and, where
//! there is a closed set of choices, what would have been valid. Bad input (a file that cannot be
//! loaded: [`Error::RunFailed`]) is kept apart from ingot's own failures ([`Error::Internal`]):
//! only the first is recorded as a failed run of the file. [`ExitStatus`] is what a scheduler
//! sees (docs/guide.md#exit-codes).

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

    /// A run could not finish for a passing cause (the file changed while it was read, a read
    /// failed): recorded as a failed run of class `transient`, which the nightly job retries.
    #[error("{0}")]
    RunInterrupted(String),

    /// ingot itself failed (a panicked thread, a broken invariant): not the input's fault, so no
    /// failed run is recorded for the file; nothing of the interrupted work is published.
    #[error("internal error: {0}")]
    Internal(String),

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

    /// A failpoint fired (tests only, see [`crate::table::failpoint`]).
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

    /// This error's message and those of its causes, outermost first.
    pub fn chain(&self) -> Vec<String> {
        let mut out = vec![self.to_string()];
        let mut source = std::error::Error::source(self);
        while let Some(s) = source {
            out.push(s.to_string());
            source = s.source();
        }
        out
    }

    /// How a command that ends with this error exits (docs/guide.md#exit-codes).
    pub fn exit_status(&self) -> ExitStatus {
        match self {
            Error::Config(_) | Error::Invalid(_) => ExitStatus::Invalid,
            Error::Internal(_) => ExitStatus::Internal,
            _ => ExitStatus::Failure,
        }
    }
}

/// How a command ended, as a scheduler sees it: the process exit code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitStatus {
    /// 0: done (rejected rows are recorded in the audit tables, not an error).
    Success = 0,
    /// 1: a run or build failed (nothing of it was published), a store failed, or a check found
    /// a problem.
    Failure = 1,
    /// 2: invalid invocation, contract or rules.
    Invalid = 2,
    /// 3: ingot itself failed (a bug or a broken environment); nothing of the interrupted work
    /// was published and no failed run was recorded: re-run, and report it if it repeats.
    Internal = 3,
    /// 4: nothing failed, but a run is held for review (a hold gate stopped it, or the nightly
    /// job found one waiting): `ingot publish` or `ingot discard` it.
    Held = 4,
}

impl ExitStatus {
    /// `Failure` when `failed`, else `Success`.
    pub fn failed_if(failed: bool) -> ExitStatus {
        if failed {
            ExitStatus::Failure
        } else {
            ExitStatus::Success
        }
    }
}

impl From<ExitStatus> for std::process::ExitCode {
    fn from(s: ExitStatus) -> Self {
        std::process::ExitCode::from(s as u8)
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

/// Console output that never stops work: a closed stdout (`ingot run | head -1`) or a dead
/// terminal ends the printing of that stream, never the job. Use through [`say!`](crate::say)
/// (stdout) and [`tell!`](crate::tell) (stderr) instead of `println!`/`eprintln!`, which panic.
pub mod console {
    use std::io::Write;
    use std::sync::atomic::{AtomicBool, Ordering};

    static STDOUT_GONE: AtomicBool = AtomicBool::new(false);
    static STDERR_GONE: AtomicBool = AtomicBool::new(false);

    /// Stdout as a writer that discards everything once a write failed.
    pub struct Stdout;

    impl Write for Stdout {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            if !STDOUT_GONE.load(Ordering::Relaxed) && std::io::stdout().lock().write_all(buf).is_err() {
                STDOUT_GONE.store(true, Ordering::Relaxed);
            }
            Ok(buf.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            if !STDOUT_GONE.load(Ordering::Relaxed) && std::io::stdout().lock().flush().is_err() {
                STDOUT_GONE.store(true, Ordering::Relaxed);
            }
            Ok(())
        }
    }

    /// Has a write to stdout failed (its reader is gone)? Long outputs stop early then.
    pub fn stdout_gone() -> bool {
        STDOUT_GONE.load(Ordering::Relaxed)
    }

    /// Exact output for scripts on stdout (JSON lines): written as it is.
    pub fn say(args: std::fmt::Arguments<'_>) {
        let _ = writeln!(Stdout, "{args}");
    }

    /// Text for people on stdout: like [`say`], with what a terminal would act on escaped
    /// ([`terminal_safe`]): file names and errors quoted from hostile input cannot drive it.
    pub fn show(args: std::fmt::Arguments<'_>) {
        let text = args.to_string();
        let _ = writeln!(Stdout, "{}", terminal_safe(&text));
    }

    /// Messages for people on stderr: a value quoted in a message (a file name from a drop
    /// folder, a line of a hostile file) cannot drive the terminal ([`terminal_safe`]).
    pub fn tell(args: std::fmt::Arguments<'_>) {
        let text = args.to_string();
        if !STDERR_GONE.load(Ordering::Relaxed)
            && writeln!(std::io::stderr().lock(), "{}", terminal_safe(&text)).is_err()
        {
            STDERR_GONE.store(true, Ordering::Relaxed);
        }
    }

    /// Would the terminal act on `c` instead of showing it? C0 controls (ESC starts escape
    /// sequences, CR and backspace overwrite what was shown, BEL rings), DEL, C1 controls (U+009B
    /// is a one-character CSI on many terminals) and the Unicode bidirectional overrides and
    /// isolates (text shown in another order than it is stored).
    fn acts(c: char) -> bool {
        c.is_control() || matches!(c, '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}' | '\u{200E}' | '\u{200F}')
    }

    fn escape_into(out: &mut String, c: char) {
        use std::fmt::Write as _;
        let _ = match c {
            '\n' => write!(out, "\\n"),
            '\r' => write!(out, "\\r"),
            '\t' => write!(out, "\\t"),
            c if (c as u32) < 0x80 => write!(out, "\\x{:02x}", c as u32),
            c => write!(out, "\\u{{{:04x}}}", c as u32),
        };
    }

    /// `text` with every character a terminal would act on written as an escape (`\x1b`,
    /// `\r`, `\u{9b}`, `\u{202e}`), except line breaks and tabs, which messages use; text
    /// without such characters is returned as it is. Backslashes are left alone, so the
    /// escapes are for reading, not for parsing back: scripts read csv or json output, which
    /// is exact.
    pub fn terminal_safe(text: &str) -> std::borrow::Cow<'_, str> {
        escaped_where(text, |c| acts(c) && c != '\n' && c != '\t')
    }

    /// `value` as one table cell: like [`terminal_safe`], and line breaks and tabs escaped too
    /// (they would break the table's rows and columns).
    pub fn cell(value: &str) -> std::borrow::Cow<'_, str> {
        escaped_where(value, acts)
    }

    fn escaped_where(text: &str, escape: impl Fn(char) -> bool) -> std::borrow::Cow<'_, str> {
        if !text.chars().any(&escape) {
            return std::borrow::Cow::Borrowed(text);
        }
        let mut out = String::with_capacity(text.len() + 8);
        for c in text.chars() {
            if escape(c) {
                escape_into(&mut out, c);
            } else {
                out.push(c);
            }
        }
        std::borrow::Cow::Owned(out)
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn terminal_controls_are_escaped_and_plain_text_is_kept() {
            assert_eq!(terminal_safe("plain, ünïcode 日本"), "plain, ünïcode 日本");
            assert!(matches!(terminal_safe("plain"), std::borrow::Cow::Borrowed(_)));
            assert_eq!(
                terminal_safe("a\x1b[2J\x07b\rc\u{9b}31md\u{202e}e\x7f"),
                "a\\x1b[2J\\x07b\\rc\\u{009b}31md\\u{202e}e\\x7f"
            );
            assert_eq!(terminal_safe("line 1\nline 2\tx"), "line 1\nline 2\tx");
            assert_eq!(cell("line 1\nline 2\tx"), "line 1\\nline 2\\tx");
            assert_eq!(cell("back\\slash"), "back\\slash");
        }
    }
}

/// `println!` that a closed stdout cannot turn into a panic ([`console`]), for exact output.
#[macro_export]
macro_rules! say {
    ($($arg:tt)*) => {
        $crate::error::console::say(format_args!($($arg)*))
    };
}

/// `println!` for text people read: a closed stdout cannot turn it into a panic and terminal
/// controls in it are shown escaped ([`console::show`]). Machine output (JSON lines) uses
/// [`say!`](crate::say), which writes it exactly.
#[macro_export]
macro_rules! show {
    ($($arg:tt)*) => {
        $crate::error::console::show(format_args!($($arg)*))
    };
}

/// `eprintln!` that a closed stderr cannot turn into a panic ([`console`]).
#[macro_export]
macro_rules! tell {
    ($($arg:tt)*) => {
        $crate::error::console::tell(format_args!($($arg)*))
    };
}
