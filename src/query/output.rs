//! Writing query results for people (`table`) and for scripts (`csv`, `json`, `parquet`,
//! `arrow`).
//!
//! `csv`, `json`, `parquet` and `arrow` stream batch by batch; `table` has to see every row to size its
//! columns, so it is meant for the bounded results people read.

use std::io::Write;
use std::path::Path;

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::dataframe::DataFrame;
use datafusion::execution::SendableRecordBatchStream;
use datafusion::parquet::arrow::ArrowWriter;
use futures::StreamExt;

use crate::error::{Error, Result};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum OutputFormat {
    /// Aligned table for people.
    Table,
    /// A header row, then one line per row.
    Csv,
    /// One JSON object per row and line.
    Json,
    /// A Parquet file (needs --output).
    Parquet,
    /// An Arrow IPC stream (to a file or a pipe, e.g. `pyarrow.ipc.open_stream`).
    Arrow,
}

/// Run `df` and write its rows to `output` (stdout when `None`). Returns the number of rows.
pub async fn write_dataframe(df: DataFrame, format: OutputFormat, output: Option<&Path>) -> Result<u64> {
    let schema = df.schema().inner().clone();
    write_stream(schema, df.execute_stream().await?, format, output).await
}

/// Write the rows of `stream` (of `schema`) to `output` (stdout when `None`). Returns the number of rows.
pub async fn write_stream(
    schema: SchemaRef,
    mut stream: SendableRecordBatchStream,
    format: OutputFormat,
    output: Option<&Path>,
) -> Result<u64> {
    let mut sink: Box<dyn Write + Send> = match output {
        Some(p) => Box::new(std::io::BufWriter::new(
            std::fs::File::create(p).map_err(|e| Error::io(p.display(), e))?,
        )),
        None => {
            if format == OutputFormat::Parquet {
                return Err(Error::Invalid("--format parquet needs --output FILE".into()));
            }
            Box::new(std::io::BufWriter::new(crate::error::console::Stdout))
        }
    };
    let mut rows = 0u64;
    let io = |e: std::io::Error| {
        Error::io(
            output
                .map(|p| p.display().to_string())
                .unwrap_or_else(|| "stdout".into()),
            e,
        )
    };
    match format {
        OutputFormat::Table => {
            let mut batches: Vec<RecordBatch> = Vec::new();
            while let Some(b) = stream.next().await {
                let b = b?;
                rows += b.num_rows() as u64;
                batches.push(b);
            }
            let text = datafusion::arrow::util::pretty::pretty_format_batches(&batches)?;
            writeln!(sink, "{text}").map_err(io)?;
            writeln!(sink, "({rows} row{})", if rows == 1 { "" } else { "s" }).map_err(io)?;
        }
        OutputFormat::Csv => {
            let mut w = datafusion::arrow::csv::WriterBuilder::new()
                .with_header(true)
                .build(&mut sink);
            let mut wrote = false;
            while let Some(b) = stream.next().await {
                let b = b?;
                rows += b.num_rows() as u64;
                w.write(&b)?;
                if output.is_none() && crate::error::console::stdout_gone() {
                    break;
                }
                wrote = true;
            }
            if !wrote {
                w.write(&RecordBatch::new_empty(schema.clone()))?;
            }
        }
        OutputFormat::Json => {
            let mut w = datafusion::arrow::json::LineDelimitedWriter::new(&mut sink);
            while let Some(b) = stream.next().await {
                let b = b?;
                rows += b.num_rows() as u64;
                w.write(&b)?;
                if output.is_none() && crate::error::console::stdout_gone() {
                    break;
                }
            }
            w.finish()?;
        }
        OutputFormat::Parquet => {
            let props = crate::table::bronze::writer_properties_for(&schema);
            let mut w = ArrowWriter::try_new(&mut sink, schema, Some(props))?;
            while let Some(b) = stream.next().await {
                let b = b?;
                rows += b.num_rows() as u64;
                w.write(&b)?;
                if output.is_none() && crate::error::console::stdout_gone() {
                    break;
                }
            }
            w.close()?;
        }
        OutputFormat::Arrow => {
            let mut w = datafusion::arrow::ipc::writer::StreamWriter::try_new(&mut sink, &schema)?;
            while let Some(b) = stream.next().await {
                let b = b?;
                rows += b.num_rows() as u64;
                w.write(&b)?;
                if output.is_none() && crate::error::console::stdout_gone() {
                    break;
                }
            }
            w.finish()?;
        }
    }
    sink.flush().map_err(io)?;
    Ok(rows)
}
