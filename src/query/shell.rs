//! `ingot sql` without a query: an interactive SQL shell on a terminal, a statement reader in a
//! pipe.
//!
//! Statements end with `;` (they may span lines; a `;` inside quotes does not count). Commands
//! start with `\` on a line of their own: `\d` lists the schemas and tables with their
//! descriptions (from contracts and rules), `\d <table>` shows a table's columns, `\format
//! table|csv|json`, `\timing on|off`, `\?` help, `\q` quit. On a terminal the shell has line
//! editing and a history (`~/.ingot_history`), prints timing by default, and an error is printed
//! without ending the session. In a pipe it reads statements from stdin, prints results, and
//! exits 2 if any statement failed (after running the rest), so it can be used in scripts.
//! Every statement goes through [`crate::query::sql::query`]: read-only.

use std::io::BufRead;
use std::time::Instant;

use crate::engine::catalog::Catalog;
use crate::error::{Error, ExitStatus, Result};
use crate::query::output::{OutputFormat, write_dataframe, write_stream};

/// Splits input lines into complete statements and backslash commands.
#[derive(Debug, Default)]
pub struct StatementReader {
    buffer: String,
    in_single: bool,
    in_double: bool,
}

/// One unit of input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Input {
    Statement(String),
    Command(String),
}

impl StatementReader {
    /// Is a statement started but not ended?
    pub fn pending(&self) -> bool {
        !self.buffer.trim().is_empty()
    }

    /// Feed one line; returns what it completed.
    pub fn push_line(&mut self, line: &str) -> Vec<Input> {
        let mut out = Vec::new();
        if !self.pending() && line.trim_start().starts_with('\\') {
            out.push(Input::Command(line.trim().to_string()));
            return out;
        }
        let mut line_comment = false;
        let chars: Vec<char> = line.chars().collect();
        for (i, &ch) in chars.iter().enumerate() {
            if line_comment {
                self.buffer.push(ch);
                continue;
            }
            match ch {
                '\'' if !self.in_double => self.in_single = !self.in_single,
                '"' if !self.in_single => self.in_double = !self.in_double,
                '-' if !self.in_single && !self.in_double && chars.get(i + 1) == Some(&'-') => line_comment = true,
                ';' if !self.in_single && !self.in_double => {
                    let stmt = self.buffer.trim().to_string();
                    self.buffer.clear();
                    if !stmt.is_empty() {
                        out.push(Input::Statement(stmt));
                    }
                    continue;
                }
                _ => {}
            }
            self.buffer.push(ch);
        }
        self.buffer.push('\n');
        if !self.pending() {
            self.buffer.clear();
        }
        out
    }

    /// What is left at the end of input (a last statement without `;`).
    pub fn finish(&mut self) -> Option<Input> {
        let stmt = std::mem::take(&mut self.buffer).trim().to_string();
        (!stmt.is_empty() && !stmt.lines().all(|l| l.trim().is_empty() || l.trim().starts_with("--")))
            .then_some(Input::Statement(stmt))
    }
}

/// The shell's state.
pub struct Shell<'a> {
    catalog: &'a Catalog,
    pub format: OutputFormat,
    pub timing: bool,
    /// Statements that failed so far.
    pub errors: usize,
}

const HELP: &str = "\
  \\d                 list schemas and tables, with their descriptions
  \\d <table>         columns of a table (e.g. \\d silver.bookings)
  \\format <f>        output format: table, csv or json
  \\timing on|off     print how long each statement took
  \\q                 quit (also Ctrl-D)
  SQL statements end with ';' and may span lines. The lake is read-only here.";

impl<'a> Shell<'a> {
    pub fn new(catalog: &'a Catalog, format: OutputFormat, timing: bool) -> Shell<'a> {
        Shell {
            catalog,
            format,
            timing,
            errors: 0,
        }
    }

    /// Run one input; `Ok(false)` means quit.
    pub async fn execute(&mut self, input: &Input) -> Result<bool> {
        match input {
            Input::Statement(sql) => {
                let start = Instant::now();
                let result = async {
                    let df = crate::query::sql::query(&self.catalog.ctx, sql).await?;
                    // a long session: the checkpoints its tables read may have been replaced
                    self.catalog.logs.check_checkpoints().await?;
                    let schema = df.schema().inner().clone();
                    let rows = crate::engine::exec::stream(self.catalog.cluster.as_deref(), df, "sql").await?;
                    write_stream(schema, rows, self.format, None).await
                }
                .await;
                match result {
                    Ok(rows) => {
                        if self.timing {
                            crate::tell!(
                                "{rows} row{} in {:.3}s",
                                if rows == 1 { "" } else { "s" },
                                start.elapsed().as_secs_f64()
                            );
                        }
                    }
                    Err(e) => {
                        self.errors += 1;
                        crate::tell!("error: {e}");
                    }
                }
                Ok(true)
            }
            Input::Command(cmd) => self.command(cmd).await,
        }
    }

    async fn command(&mut self, cmd: &str) -> Result<bool> {
        let mut words = cmd.split_whitespace();
        let name = words.next().unwrap_or("");
        let arg = words.next();
        match (name, arg) {
            ("\\q" | "\\quit", _) => return Ok(false),
            ("\\?" | "\\help" | "\\h", _) => crate::show!("{HELP}"),
            ("\\d", None) => self.tables().await?,
            ("\\d", Some(table)) => match self.columns(table).await {
                Ok(()) => {}
                Err(e) => {
                    self.errors += 1;
                    crate::tell!("error: {e}");
                }
            },
            ("\\format", Some(f)) => match f {
                "table" => self.format = OutputFormat::Table,
                "csv" => self.format = OutputFormat::Csv,
                "json" => self.format = OutputFormat::Json,
                _ => {
                    self.errors += 1;
                    crate::tell!("error: unknown format \"{f}\"; valid formats: table, csv, json");
                }
            },
            ("\\timing", Some("on")) => self.timing = true,
            ("\\timing", Some("off")) => self.timing = false,
            _ => {
                self.errors += 1;
                crate::tell!("error: unknown command \"{cmd}\"; \\? lists the commands");
            }
        }
        Ok(true)
    }

    /// Every table of the catalog: schema, name, what it is, description.
    async fn tables(&self) -> Result<()> {
        let df = self.catalog.ctx.table("table_descriptions").await?;
        write_dataframe(df, self.format, None).await?;
        Ok(())
    }

    /// The columns of one table, with contract descriptions where there are some.
    async fn columns(&self, table: &str) -> Result<()> {
        let (schema, name) = table
            .split_once('.')
            .ok_or_else(|| Error::Invalid(format!("no table \"{table}\"; \\d lists the tables (schema.table)")))?;
        use datafusion::prelude::{col, lit};
        let df = self
            .catalog
            .ctx
            .table("column_descriptions")
            .await?
            .filter(col("schema").eq(lit(schema)).and(col("table").eq(lit(name))))?
            .select_columns(&["column", "type", "nullable", "description"])?;
        let df = df.cache().await?;
        if df.clone().count().await? == 0 {
            return Err(Error::Invalid(format!("no table \"{table}\"; \\d lists the tables")));
        }
        write_dataframe(df, self.format, None).await?;
        Ok(())
    }
}

/// Read statements from a non-terminal stdin and run them; returns the exit code (2 if any
/// statement failed).
pub async fn run_piped(catalog: &Catalog, format: OutputFormat) -> Result<ExitStatus> {
    let mut shell = Shell::new(catalog, format, false);
    let mut reader = StatementReader::default();
    let stdin = std::io::stdin();
    let mut inputs = Vec::new();
    for line in stdin.lock().lines() {
        let line = line.map_err(|e| Error::io("stdin", e))?;
        inputs.extend(reader.push_line(&line));
        for input in inputs.drain(..) {
            if !shell.execute(&input).await? {
                return Ok(if shell.errors > 0 {
                    ExitStatus::Invalid
                } else {
                    ExitStatus::Success
                });
            }
        }
    }
    if let Some(last) = reader.finish() {
        shell.execute(&last).await?;
    }
    Ok(if shell.errors > 0 {
        ExitStatus::Invalid
    } else {
        ExitStatus::Success
    })
}

/// The interactive shell on a terminal, in a build without the `shell` feature: statements from
/// stdin as in a pipe.
#[cfg(not(feature = "shell"))]
pub async fn run_interactive(catalog: &Catalog, format: OutputFormat) -> Result<ExitStatus> {
    crate::tell!("(this ingot was built without the `shell` feature: no line editing; statements end with ';')");
    run_piped(catalog, format).await
}

/// The interactive shell on a terminal (line editing, history).
#[cfg(feature = "shell")]
pub async fn run_interactive(catalog: &Catalog, format: OutputFormat) -> Result<ExitStatus> {
    use rustyline::error::ReadlineError;
    let mut editor = rustyline::DefaultEditor::new().map_err(|e| Error::Invalid(format!("terminal: {e}")))?;
    let history = std::env::var_os("HOME").map(|h| std::path::PathBuf::from(h).join(".ingot_history"));
    if let Some(h) = &history {
        let _ = editor.load_history(h);
    }
    crate::show!("ingot sql shell: read-only SQL over bronze.*, silver.*, audit.*; \\? for help, \\q to quit");
    let mut shell = Shell::new(catalog, format, true);
    let mut reader = StatementReader::default();
    loop {
        let prompt = if reader.pending() { "     -> " } else { "ingot> " };
        match editor.readline(prompt) {
            Ok(line) => {
                if !line.trim().is_empty() {
                    let _ = editor.add_history_entry(line.as_str());
                }
                for input in reader.push_line(&line) {
                    if !shell.execute(&input).await? {
                        if let Some(h) = &history {
                            let _ = editor.save_history(h);
                        }
                        return Ok(ExitStatus::Success);
                    }
                }
                let _ = std::io::Write::flush(&mut std::io::stdout());
            }
            Err(ReadlineError::Interrupted) => {
                // Ctrl-C drops the statement being typed, as in psql
                reader = StatementReader::default();
            }
            Err(ReadlineError::Eof) => break,
            Err(e) => return Err(Error::Invalid(format!("terminal: {e}"))),
        }
    }
    if let Some(h) = &history {
        let _ = editor.save_history(h);
    }
    Ok(ExitStatus::Success)
}
