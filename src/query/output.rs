//! Writing query results for people (`table`) and for scripts (`csv`, `json`, `parquet`,
//! `arrow`).
//!
//! `csv`, `json`, `parquet` and `arrow` stream batch by batch; `table` has to see every row to size its
//! columns, so it is meant for the bounded results people read.
//!
//! `table` shows text as a terminal cannot act on it: control characters (ESC, CR, backspace,
//! C1 controls, line breaks and tabs) and bidirectional overrides in values and column names are
//! shown escaped (`\x1b`, `\n`, `\u{202e}`; see [`crate::error::console::cell`]), so a raw payload
//! from a hostile file cannot clear the screen, rewrite earlier lines or forge a table row. The
//! other formats are exact: the bytes as stored.

use std::io::Write;
use std::path::Path;

use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, RecordBatch, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::arrow::util::display::{ArrayFormatter, FormatOptions};
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
            let shown = batches.iter().map(terminal_safe_batch).collect::<Result<Vec<_>>>()?;
            let text = datafusion::arrow::util::pretty::pretty_format_batches(&shown)?;
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

/// `batch` for the `table` format: every column that can hold text (strings, and lists, structs
/// and maps, which show their strings) as the strings `table` would show, with what a terminal
/// would act on escaped; numbers, dates and binary columns (shown as hex) as they are. Nulls
/// stay null (shown empty).
fn terminal_safe_batch(batch: &RecordBatch) -> Result<RecordBatch> {
    use crate::error::console::cell;
    let schema = batch.schema();
    let mut fields = Vec::with_capacity(schema.fields().len());
    let mut columns: Vec<ArrayRef> = Vec::with_capacity(schema.fields().len());
    let options = FormatOptions::default();
    for (field, column) in schema.fields().iter().zip(batch.columns()) {
        let name = cell(field.name()).into_owned();
        let texty = matches!(
            field.data_type(),
            DataType::Utf8
                | DataType::LargeUtf8
                | DataType::Utf8View
                | DataType::List(_)
                | DataType::LargeList(_)
                | DataType::ListView(_)
                | DataType::LargeListView(_)
                | DataType::FixedSizeList(_, _)
                | DataType::Struct(_)
                | DataType::Map(_, _)
                | DataType::Union(_, _)
                | DataType::Dictionary(_, _)
                | DataType::RunEndEncoded(_, _)
        );
        if !texty {
            fields.push(Arc::new(field.as_ref().clone().with_name(name)));
            columns.push(column.clone());
            continue;
        }
        let formatter = ArrayFormatter::try_new(column.as_ref(), &options)?;
        let mut shown = Vec::with_capacity(column.len());
        for row in 0..column.len() {
            shown.push(if column.is_null(row) {
                None
            } else {
                Some(cell(&formatter.value(row).to_string()).into_owned())
            });
        }
        fields.push(Arc::new(Field::new(name, DataType::Utf8, true)));
        columns.push(Arc::new(StringArray::from(shown)));
    }
    Ok(RecordBatch::try_new_with_options(
        Arc::new(Schema::new(fields)),
        columns,
        &datafusion::arrow::array::RecordBatchOptions::new().with_row_count(Some(batch.num_rows())),
    )?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_cells_escape_what_a_terminal_would_act_on_and_keep_the_rest() {
        let batch = RecordBatch::try_from_iter(vec![
            (
                "raw_payload",
                Arc::new(StringArray::from(vec![Some("ok"), Some("\x1b]0;pwned\x07x\ny"), None])) as ArrayRef,
            ),
            (
                "n",
                Arc::new(datafusion::arrow::array::Int64Array::from(vec![1, 2, 3])) as ArrayRef,
            ),
        ])
        .unwrap();
        let shown = terminal_safe_batch(&batch).unwrap();
        let text = datafusion::arrow::util::pretty::pretty_format_batches(&[shown])
            .unwrap()
            .to_string();
        let plain = datafusion::arrow::util::pretty::pretty_format_batches(&[batch])
            .unwrap()
            .to_string();
        assert!(!text.contains('\x1b') && !text.contains('\x07'), "{text:?}");
        assert!(text.contains("\\x1b]0;pwned\\x07x\\ny"), "{text}");
        // the row without controls, the null and the number look as they did
        let lines = |t: &str| t.lines().map(str::to_string).collect::<Vec<_>>();
        assert_eq!(lines(&text)[3].replace(' ', ""), lines(&plain)[3].replace(' ', ""));
        assert_eq!(lines(&text).len(), 7, "one line per row: {text}");
    }
}
