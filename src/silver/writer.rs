//! The Parquet writer of a silver build's files (snapshot parts, state parts, failures).
//!
//! Like bronze's run writer (same encodings, zstd), but a row group is closed as soon as its
//! encoded size passes [`ROW_GROUP_BYTES`]: a build runs one writer per partition at once, and a
//! writer holds its whole row group in memory until it closes it.

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::parquet::arrow::AsyncArrowWriter;
use object_store::buffered::BufWriter;

use crate::error::Result;
use crate::lake::Lake;

/// Encoded bytes after which a row group is closed.
pub const ROW_GROUP_BYTES: usize = 24 << 20;

/// Streams batches to one build-scoped object, created on the first non-empty batch: a writer
/// that gets no rows leaves no file.
pub struct PartWriter {
    lake: Lake,
    rel: String,
    schema: SchemaRef,
    writer: Option<AsyncArrowWriter<BufWriter>>,
    pub rows: u64,
}

impl PartWriter {
    pub fn new(lake: &Lake, rel: String, schema: SchemaRef) -> PartWriter {
        PartWriter {
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
            let props = crate::bronze::writer_properties();
            self.writer = Some(AsyncArrowWriter::try_new(w, self.schema.clone(), Some(props))?);
        }
        if let Some(w) = self.writer.as_mut() {
            w.write(batch).await?;
            if w.in_progress_size() > ROW_GROUP_BYTES {
                w.flush().await?;
            }
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
