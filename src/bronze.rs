//! Bronze tables: the columns ingot adds to every row, and the streaming Parquet writer of a run.
//!
//! `bronze.<source>` holds every committed version of every record (append-only, one folder per
//! run). The writer streams batches to the run-scoped object with a multipart upload; nothing is
//! visible before the run's record commits (see [`crate::lake`]).

use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, Int32Array, RecordBatch, StringArray, TimestampMicrosecondArray};
use datafusion::arrow::datatypes::{DataType, Field, SchemaRef};
use datafusion::parquet::arrow::AsyncArrowWriter;
use datafusion::parquet::basic::{Compression, ZstdLevel};
use datafusion::parquet::file::properties::{EnabledStatistics, WriterProperties};
use datafusion::parquet::schema::types::ColumnPath;
use object_store::buffered::BufWriter;

use crate::contract::timestamp_type;
use crate::error::Result;
use crate::lake::Lake;

/// The bronze columns after the contract fields (DESIGN.md §5), in order.
pub fn meta_fields() -> Vec<Field> {
    vec![
        Field::new("ingestion_run_id", DataType::Utf8, true),
        Field::new("file_hash", DataType::Utf8, true),
        Field::new("row_hash", DataType::Utf8, true),
        Field::new("natural_key_fingerprint", DataType::Utf8, true),
        Field::new("natural_key_version", DataType::Int32, true),
        Field::new("contract_version", DataType::Int32, true),
        Field::new("source_row_number", DataType::Int64, true),
        Field::new("ingested_at", timestamp_type(), true),
    ]
}

/// Parquet settings of every file ingot writes: zstd, dictionary on (the default).
pub fn writer_properties() -> WriterProperties {
    let mut b = WriterProperties::builder()
        .set_compression(Compression::ZSTD(ZstdLevel::try_new(1).unwrap_or_default()))
        .set_max_row_group_row_count(Some(1 << 20))
        // A high-cardinality text column gives up on its dictionary sooner (less wasted interning);
        // low-cardinality columns stay far below this.
        .set_dictionary_page_size_limit(256 * 1024);
    // Hashes are unique per row and uniformly random: a dictionary attempt only costs time before
    // falling back, and min/max statistics cannot prune anything.
    for unique in ["row_hash", "natural_key_fingerprint"] {
        b = b
            .set_column_dictionary_enabled(ColumnPath::from(unique), false)
            .set_column_statistics_enabled(ColumnPath::from(unique), EnabledStatistics::None);
    }
    b.build()
}

/// Constant columns of one run, repeated for a batch.
pub struct RunStamp {
    pub run_id: String,
    pub file_hash: String,
    pub natural_key_version: i32,
    pub contract_version: i32,
    pub ingested_at: i64,
}

impl RunStamp {
    /// Append the bronze columns to `fields` (contract columns, already filtered to the rows kept).
    pub fn stamp(
        &self,
        schema: &SchemaRef,
        mut columns: Vec<ArrayRef>,
        row_hash: ArrayRef,
        fingerprint: ArrayRef,
        row_numbers: ArrayRef,
    ) -> Result<RecordBatch> {
        let n = row_hash.len();
        columns.push(Arc::new(StringArray::from_iter_values(std::iter::repeat_n(
            self.run_id.as_str(),
            n,
        ))));
        columns.push(Arc::new(StringArray::from_iter_values(std::iter::repeat_n(
            self.file_hash.as_str(),
            n,
        ))));
        columns.push(row_hash);
        columns.push(fingerprint);
        columns.push(Arc::new(Int32Array::from_value(self.natural_key_version, n)));
        columns.push(Arc::new(Int32Array::from_value(self.contract_version, n)));
        columns.push(row_numbers);
        columns.push(Arc::new(
            TimestampMicrosecondArray::from_value(self.ingested_at, n).with_timezone("UTC"),
        ));
        Ok(RecordBatch::try_new(schema.clone(), columns)?)
    }
}

/// Streams batches to one run-scoped Parquet object (bronze data, failure rows), created on the
/// first non-empty batch: a run that writes no rows leaves no file.
pub struct RunFileWriter {
    lake: Lake,
    rel: String,
    schema: SchemaRef,
    writer: Option<AsyncArrowWriter<BufWriter>>,
    pub rows: u64,
}

impl RunFileWriter {
    pub fn new(lake: &Lake, rel: String, schema: SchemaRef) -> RunFileWriter {
        RunFileWriter {
            lake: lake.clone(),
            rel,
            schema,
            writer: None,
            rows: 0,
        }
    }

    pub async fn write(&mut self, batch: &RecordBatch) -> Result<()> {
        if batch.num_rows() == 0 {
            return Ok(());
        }
        if self.writer.is_none() {
            let w = BufWriter::new(self.lake.store.clone(), self.lake.path(&self.rel));
            self.writer = Some(AsyncArrowWriter::try_new(
                w,
                self.schema.clone(),
                Some(writer_properties()),
            )?);
        }
        if let Some(w) = self.writer.as_mut() {
            w.write(batch).await?;
        }
        self.rows += batch.num_rows() as u64;
        Ok(())
    }

    /// Close the file; returns the number of rows written (0: no file was created).
    pub async fn finish(mut self) -> Result<u64> {
        if let Some(w) = self.writer.take() {
            w.close().await?;
        }
        Ok(self.rows)
    }
}
