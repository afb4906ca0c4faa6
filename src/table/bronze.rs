//! Bronze tables: the columns ingot adds to every row, and the streaming Parquet writer of a run.
//!
//! `bronze.<source>` holds every committed version of every record (append-only, one folder per
//! run). The writer streams batches to the run-scoped object with a multipart upload; nothing is
//! visible before the run's record commits (see [`crate::table::lake`]).

use std::sync::{Arc, Mutex};

use bytes::Bytes;

use datafusion::arrow::array::{
    ArrayRef, BooleanArray, Int32Array, RecordBatch, StringArray, TimestampMicrosecondArray, new_null_array,
};
use datafusion::arrow::datatypes::{DataType, Schema, SchemaRef};
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryPool, MemoryReservation};
use datafusion::parquet::arrow::arrow_writer::{
    ArrowColumnChunk, ArrowColumnWriter, ArrowLeafColumn, ArrowRowGroupWriterFactory, compute_leaves,
};
use datafusion::parquet::arrow::{ArrowWriter, AsyncArrowWriter};
use datafusion::parquet::basic::{Compression, Encoding, ZstdLevel};
use datafusion::parquet::file::metadata::KeyValue;
use datafusion::parquet::file::properties::{EnabledStatistics, WriterProperties, WriterPropertiesBuilder};
use datafusion::parquet::file::writer::SerializedFileWriter;
use datafusion::parquet::schema::types::ColumnPath;

use crate::error::{Error, Result};
use crate::table::lake::Lake;
use crate::table::upload::{DEFAULT_IN_FLIGHT, DEFAULT_PART, FileStamp, LakeUpload};

use crate::spec::columns::FINGERPRINT;
pub use crate::spec::columns::{IS_DELETED, PREVIOUS_FINGERPRINT, meta_fields};

/// Parquet settings of every file ingot writes: zstd, dictionary on (the default) except for
/// the hash columns (see [`writer_properties_for`]).
pub fn writer_properties() -> WriterProperties {
    builder().build()
}

fn builder() -> WriterPropertiesBuilder {
    WriterProperties::builder()
        .set_compression(Compression::ZSTD(ZstdLevel::try_new(1).unwrap_or_default()))
        .set_max_row_group_row_count(Some(1 << 20))
        // A high-cardinality text column gives up on its dictionary sooner (less wasted interning);
        // low-cardinality columns stay far below this.
        .set_dictionary_page_size_limit(256 * 1024)
}

/// [`writer_properties_for`] without compression: for the small files ingot reads on every
/// command (log records, checkpoints, key states). Parquet 59 builds a zstd compressor and
/// decompressor for every column chunk it reads, which costs more than the reading of a
/// one-row record; and key states hold random bits that do not compress.
pub fn uncompressed_properties_for(schema: &Schema) -> WriterProperties {
    writer_properties_for(schema)
        .into_builder()
        .set_compression(Compression::UNCOMPRESSED)
        .build()
}

/// [`writer_properties`] for a file of `schema`, with its hex hash columns set apart.
///
/// Hashes are unique per row and uniformly random: a dictionary attempt only costs time before
/// falling back, and min/max statistics cannot prune anything. DELTA_LENGTH_BYTE_ARRAY keeps the
/// lengths apart from the hex: zstd then sees hex digits only (PLAIN puts a 4-byte length before
/// every 64 digits, which zstd takes for matches): ~8% less CPU for an ingest and a smaller file.
/// Every Parquet reader we know (DataFusion, DuckDB, Arrow, Spark) reads it (and the
/// DELTA_BINARY_PACKED of `source_row_number` below). Only text columns:
/// a build state's binary fingerprints stay PLAIN.
pub fn writer_properties_for(schema: &Schema) -> WriterProperties {
    let mut b = builder();
    for unique in ["row_hash", FINGERPRINT] {
        let Ok(field) = schema.field_with_name(unique) else {
            continue;
        };
        b = b
            .set_column_dictionary_enabled(ColumnPath::from(unique), false)
            .set_column_statistics_enabled(ColumnPath::from(unique), EnabledStatistics::None);
        if matches!(
            field.data_type(),
            DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View
        ) {
            b = b.set_column_encoding(ColumnPath::from(unique), Encoding::DELTA_LENGTH_BYTE_ARRAY);
        }
    }
    // The record number of a row in its input: rising by one from row to row within a run, so
    // DELTA_BINARY_PACKED stores it in a few bits a row; a dictionary (distinct per row) would only
    // be tried and dropped, and PLAIN would leave 8 bytes a row to zstd.
    if schema
        .field_with_name(SOURCE_ROW_NUMBER)
        .is_ok_and(|f| f.data_type() == &DataType::Int64)
    {
        b = b
            .set_column_dictionary_enabled(ColumnPath::from(SOURCE_ROW_NUMBER), false)
            .set_column_encoding(ColumnPath::from(SOURCE_ROW_NUMBER), Encoding::DELTA_BINARY_PACKED);
    }
    b.build()
}

/// Bronze column: the record's number in its input (1-based).
const SOURCE_ROW_NUMBER: &str = "source_row_number";

/// Constant columns of one run, repeated for a batch.
pub struct RunStamp {
    pub run_id: String,
    pub file_hash: String,
    pub natural_key_version: i32,
    pub contract_version: i32,
    pub ingested_at: i64,
    /// The constant columns built once for the longest batch so far; shorter batches slice them.
    built: Option<[ArrayRef; 5]>,
}

impl RunStamp {
    pub fn new(
        run_id: String,
        file_hash: String,
        natural_key_version: i32,
        contract_version: i32,
        ingested_at: i64,
    ) -> Self {
        RunStamp {
            run_id,
            file_hash,
            natural_key_version,
            contract_version,
            ingested_at,
            built: None,
        }
    }

    /// The run id, file hash, key version, contract version and ingestion time columns of `n` rows.
    fn constants(&mut self, n: usize) -> [ArrayRef; 5] {
        let built = match &mut self.built {
            Some(b) if b[0].len() >= n => b,
            slot => slot.insert([
                Arc::new(StringArray::from_iter_values(std::iter::repeat_n(
                    self.run_id.as_str(),
                    n,
                ))),
                Arc::new(StringArray::from_iter_values(std::iter::repeat_n(
                    self.file_hash.as_str(),
                    n,
                ))),
                Arc::new(Int32Array::from_value(self.natural_key_version, n)),
                Arc::new(Int32Array::from_value(self.contract_version, n)),
                Arc::new(TimestampMicrosecondArray::from_value(self.ingested_at, n).with_timezone("UTC")),
            ]),
        };
        built.clone().map(|a| a.slice(0, n))
    }

    /// Append the bronze columns to `fields` (contract columns, already filtered to the rows kept);
    /// `deleted`: the rows are tombstones.
    pub fn stamp(
        &mut self,
        schema: &SchemaRef,
        mut columns: Vec<ArrayRef>,
        row_hash: ArrayRef,
        fingerprint: ArrayRef,
        row_numbers: ArrayRef,
        deleted: bool,
    ) -> Result<RecordBatch> {
        let n = row_hash.len();
        let [run_id, file_hash, key_version, contract_version, ingested_at] = self.constants(n);
        columns.push(run_id);
        columns.push(file_hash);
        columns.push(row_hash);
        columns.push(fingerprint);
        columns.push(key_version);
        columns.push(contract_version);
        columns.push(row_numbers);
        columns.push(ingested_at);
        columns.push(Arc::new(BooleanArray::from(vec![deleted; n])));
        columns.push(new_null_array(&DataType::Utf8, n));
        Ok(RecordBatch::try_new(schema.clone(), columns)?)
    }
}

/// Streams batches to one run- or build-scoped Parquet object (bronze data, failure rows, silver
/// parts), created on the first non-empty batch: a writer that gets no rows leaves no file.
pub struct RunFileWriter {
    lake: Lake,
    rel: String,
    schema: SchemaRef,
    /// Write without compression ([`uncompressed_properties_for`]).
    uncompressed: bool,
    /// Leave the fingerprint column uncompressed ([`RunFileWriter::with_fingerprints_uncompressed`]).
    fingerprints_uncompressed: bool,
    writer: Option<AsyncArrowWriter<LakeUpload>>,
    /// Close a row group once its encoded size passes this (a writer holds its open row group in
    /// memory; silver builds run one writer per partition at once).
    row_group_bytes: Option<usize>,
    /// The writer's memory in DataFusion's pool ([`RunFileWriter::with_budget`]).
    budget: Option<MemoryReservation>,
    /// The file's key index ([`RunFileWriter::with_keys`]) and the digest of its keys so far.
    keys: Option<(Box<RunFileWriter>, u128)>,
    /// Key-value metadata for the file's footer.
    metadata: Vec<KeyValue>,
    /// Close a data page after this many rows ([`RunFileWriter::with_page_rows`]).
    page_rows: Option<usize>,
    pub rows: u64,
}

/// The smallest budget [`RunFileWriter::with_budget`] settles for (taken even past the pool's
/// limit: a writer cannot spill).
const MIN_BUDGET: usize = 2 << 20;

impl RunFileWriter {
    pub fn new(lake: &Lake, rel: String, schema: SchemaRef) -> RunFileWriter {
        RunFileWriter {
            lake: lake.clone(),
            rel,
            schema,
            uncompressed: false,
            fingerprints_uncompressed: false,
            writer: None,
            row_group_bytes: None,
            budget: None,
            keys: None,
            metadata: Vec::new(),
            page_rows: None,
            rows: 0,
        }
    }

    /// Write the file without compression ([`uncompressed_properties_for`]).
    pub fn uncompressed(mut self) -> RunFileWriter {
        self.uncompressed = true;
        self
    }

    /// Leave the `natural_key_fingerprint` column uncompressed (the rest as
    /// [`writer_properties_for`]): for silver files, whose fingerprints a later delta build reads
    /// in full to find the positions of the rows it deletes (Delta deletion vectors). Random hex
    /// digits compress to half; zstd costs about 0.26 s of CPU to write and 0.15 s to read the
    /// column of 6 million rows, uncompressed 0.6x and 0.35x of that.
    pub fn with_fingerprints_uncompressed(mut self) -> RunFileWriter {
        self.fingerprints_uncompressed = true;
        self
    }

    /// Write, row for row beside the file, the 16-byte key of each row's `natural_key_fingerprint`
    /// to `keys` (a writer of one FixedSizeBinary(16) column): the file's key index, which a
    /// later delta build reads instead of the file's hex fingerprints to find the positions of
    /// the rows it deletes (a sixth of the bytes, no text to parse). Its footer names this file
    /// (`ingot.keys_of`, lake-relative) and the digest of its keys (`ingot.keys_digest`,
    /// [`crate::hash::fp::keys_digest`] in hex), so a reader can tell a damaged or misplaced one.
    pub fn with_keys(mut self, keys: RunFileWriter) -> RunFileWriter {
        self.keys = Some((Box::new(keys), 0));
        self
    }

    /// Close data pages after `rows` rows (parquet's default closes them by size, about 1 MB):
    /// the page index then holds the min and max of every `rows` rows, and a reader's filter on
    /// a column the rows are ordered by decodes only the pages that may match.
    pub fn with_page_rows(mut self, rows: usize) -> RunFileWriter {
        self.page_rows = Some(rows);
        self
    }

    /// The writer's properties, as its options say.
    fn properties(&self) -> WriterProperties {
        let props = if self.uncompressed {
            uncompressed_properties_for(&self.schema)
        } else if self.fingerprints_uncompressed {
            writer_properties_for(&self.schema)
                .into_builder()
                .set_column_compression(ColumnPath::from(FINGERPRINT), Compression::UNCOMPRESSED)
                .build()
        } else {
            writer_properties_for(&self.schema)
        };
        match self.page_rows {
            Some(rows) => props.into_builder().set_data_page_row_count_limit(rows).build(),
            None => props,
        }
    }

    /// Close row groups once their encoded size passes `bytes`.
    pub fn with_row_group_bytes(mut self, bytes: usize) -> RunFileWriter {
        self.row_group_bytes = Some(bytes);
        self
    }

    /// Account for the writer's memory in DataFusion's memory pool, as `name`: `bytes`, or as
    /// much as the pool has left (halving down to 2 MiB, which it takes even past the limit).
    /// Half of it bounds the open row group, half the upload of the closed one (parts of a sixth:
    /// one filling, two in flight; never under S3's 5 MiB, the pool then holds the upload's
    /// parts past the budget: [`crate::table::upload`]), so operators running beside the writer
    /// spill instead of the process outgrowing `--memory-limit`. Without a budget a writer holds
    /// up to a row group plus 8 parts of 10 MiB in flight, none of it in the pool.
    pub fn with_budget(mut self, pool: &Arc<dyn MemoryPool>, name: &str, bytes: usize) -> RunFileWriter {
        let budget = MemoryConsumer::new(name).register(pool);
        let mut want = bytes.max(MIN_BUDGET);
        while want > MIN_BUDGET && budget.try_grow(want).is_err() {
            want /= 2;
        }
        if budget.size() == 0 {
            budget.grow(MIN_BUDGET);
        }
        self.row_group_bytes = Some(budget.size() / 2);
        self.budget = Some(budget);
        self
    }

    pub async fn write(&mut self, batch: &RecordBatch) -> Result<()> {
        if batch.num_rows() == 0 {
            return Ok(());
        }
        if self.writer.is_none() {
            let w = match &self.budget {
                // parts of a sixth of the budget, one filling and two in flight: the upload's
                // half, grown to S3's smallest part where the budget is less
                Some(b) => LakeUpload::new(&self.lake, &self.rel, b.size() / 6, 2).with_memory(b.split(b.size() / 2)),
                None => LakeUpload::new(&self.lake, &self.rel, DEFAULT_PART, DEFAULT_IN_FLIGHT),
            };
            self.writer = Some(AsyncArrowWriter::try_new(
                w,
                self.schema.clone(),
                Some(self.properties()),
            )?);
        }
        if let Some(w) = self.writer.as_mut() {
            w.write(batch).await?;
            if self.row_group_bytes.is_some_and(|limit| w.in_progress_size() > limit) {
                w.flush().await?;
            }
        }
        if let Some((keys, digest)) = self.keys.as_mut() {
            let fp = crate::hash::fp::fixed_keys(batch.column(self.schema.index_of(FINGERPRINT)?))?;
            *digest = crate::hash::fp::keys_digest(*digest, self.rows, &fp);
            let batch = RecordBatch::try_new(keys.schema.clone(), vec![Arc::new(fp)])?;
            Box::pin(keys.write(&batch)).await?;
        }
        self.rows += batch.num_rows() as u64;
        Ok(())
    }

    /// Close the file (and its key index); returns the number of rows written (0: no file was
    /// created).
    pub async fn finish(self) -> Result<u64> {
        Ok(self.finish_stamped().await?.0)
    }

    /// [`RunFileWriter::finish`], also returning the file's size and CRC-32 (`None`: no file).
    pub async fn finish_stamped(mut self) -> Result<(u64, Option<FileStamp>)> {
        let mut stamp = None;
        if let Some(mut w) = self.writer.take() {
            for kv in self.metadata.drain(..) {
                w.append_key_value_metadata(kv);
            }
            w.finish().await?;
            stamp = Some(w.into_inner().stamp());
        }
        if let Some((mut keys, digest)) = self.keys.take() {
            keys.metadata = vec![
                KeyValue::new(KEYS_OF.to_string(), self.rel.clone()),
                KeyValue::new(KEYS_DIGEST.to_string(), format!("{digest:032x}")),
            ];
            Box::pin(keys.finish()).await?;
        }
        Ok((self.rows, stamp))
    }
}

/// Footer key of a key index: the lake-relative path of the file it indexes.
pub const KEYS_OF: &str = "ingot.keys_of";
/// Footer key of a key index: the digest of its keys ([`crate::hash::fp::keys_digest`]), hex.
pub const KEYS_DIGEST: &str = "ingot.keys_digest";

/// Encoder threads of a [`ParallelFileWriter`].
const ENCODERS: usize = 2;

/// Work for one encoder thread: its column writers of a new row group, the leaf arrays of a batch
/// for those writers (same order), or closing the row group's chunks.
enum EncodeJob {
    Start(Vec<ArrowColumnWriter>),
    Write(Vec<ArrowLeafColumn>),
    Close(std::sync::mpsc::Sender<Result<Vec<ArrowColumnChunk>>>),
}

struct Encoder {
    jobs: std::sync::mpsc::SyncSender<EncodeJob>,
    thread: std::thread::JoinHandle<()>,
}

impl Encoder {
    fn spawn(n: usize) -> Result<Encoder> {
        let (jobs, rx) = std::sync::mpsc::sync_channel::<EncodeJob>(4);
        let thread = std::thread::Builder::new()
            .name(format!("ingot-encode-{n}"))
            .spawn(move || {
                let mut writers: Vec<ArrowColumnWriter> = Vec::new();
                let mut failed: Option<Error> = None;
                for job in rx {
                    match job {
                        EncodeJob::Start(w) => writers = w,
                        EncodeJob::Write(leaves) => {
                            if failed.is_none()
                                && let Err(e) = writers.iter_mut().zip(&leaves).try_for_each(|(w, l)| w.write(l))
                            {
                                failed = Some(e.into());
                            }
                        }
                        EncodeJob::Close(reply) => {
                            let chunks = match failed.take() {
                                Some(e) => Err(e),
                                None => writers.drain(..).map(|w| w.close().map_err(Error::from)).collect(),
                            };
                            let _ = reply.send(chunks);
                        }
                    }
                }
            })
            .map_err(|e| Error::RunFailed(format!("cannot start a Parquet encoder thread: {e}")))?;
        Ok(Encoder { jobs, thread })
    }

    fn send(&self, job: EncodeJob) -> Result<()> {
        self.jobs
            .send(job)
            .map_err(|_| Error::RunFailed("a Parquet encoder thread stopped".into()))
    }
}

/// Bytes of a [`Spool`] block: 8 MiB, a few object-store parts' worth.
const SPOOL_BLOCK: usize = 8 << 20;
/// Blocks kept for reuse: a row group's worth (its compressed size is ~100 MiB at most here).
const SPOOL_POOLED: usize = 16;

/// The bytes of a file being written, in blocks of [`SPOOL_BLOCK`] that go to the upload as they
/// fill. A block returns to the pool when the upload is done with it and is filled again: the
/// memory of one row group is reused for the next, not faulted in afresh (a growing `Vec` of the
/// whole row group cost a quarter of a million page faults for an SF1 ingest, and reallocations).
struct Spool {
    current: Vec<u8>,
    ready: Vec<Bytes>,
    pool: Arc<Mutex<Vec<Vec<u8>>>>,
}

/// A full block on its way to the upload; back to the pool when dropped.
struct PooledBlock {
    block: Vec<u8>,
    pool: Arc<Mutex<Vec<Vec<u8>>>>,
}

impl AsRef<[u8]> for PooledBlock {
    fn as_ref(&self) -> &[u8] {
        &self.block
    }
}

impl Drop for PooledBlock {
    fn drop(&mut self) {
        if let Ok(mut pool) = self.pool.lock()
            && pool.len() < SPOOL_POOLED
        {
            let mut block = std::mem::take(&mut self.block);
            block.clear();
            pool.push(block);
        }
    }
}

impl Spool {
    fn new() -> Spool {
        Spool {
            current: Vec::new(),
            ready: Vec::new(),
            pool: Arc::new(Mutex::new(Vec::new())),
        }
    }

    fn seal(&mut self) {
        let fresh = self
            .pool
            .lock()
            .ok()
            .and_then(|mut p| p.pop())
            .unwrap_or_else(|| Vec::with_capacity(SPOOL_BLOCK));
        let block = std::mem::replace(&mut self.current, fresh);
        self.ready.push(Bytes::from_owner(PooledBlock {
            block,
            pool: self.pool.clone(),
        }));
    }

    /// Everything written since the last call, in order.
    fn take(&mut self) -> Vec<Bytes> {
        if !self.current.is_empty() {
            self.seal();
        }
        std::mem::take(&mut self.ready)
    }
}

impl std::io::Write for Spool {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        if self.current.capacity() == 0 {
            self.current.reserve_exact(SPOOL_BLOCK);
        }
        let n = data.len().min(SPOOL_BLOCK - self.current.len());
        self.current.extend_from_slice(&data[..n]);
        if self.current.len() >= SPOOL_BLOCK {
            self.seal();
        }
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// An open [`ParallelFileWriter`].
struct OpenFile {
    file: SerializedFileWriter<Spool>,
    factory: ArrowRowGroupWriterFactory,
    out: LakeUpload,
    encoders: Vec<Encoder>,
    /// For each leaf column, the encoder that owns it.
    owner: Vec<usize>,
    group_rows: usize,
}

/// Streams batches to one run-scoped Parquet object like [`RunFileWriter`] (same schema, properties
/// and row groups), but encodes and compresses the columns on [`ENCODERS`] threads. It is
/// synchronous, for a blocking thread; `handle` runs the uploads. Memory is one row group of
/// encoded pages, as with the plain writer.
pub struct ParallelFileWriter {
    lake: Lake,
    rel: String,
    schema: SchemaRef,
    handle: tokio::runtime::Handle,
    open: Option<OpenFile>,
    max_rows: usize,
    pub rows: u64,
}

impl ParallelFileWriter {
    pub fn new(lake: &Lake, rel: String, schema: SchemaRef, handle: tokio::runtime::Handle) -> ParallelFileWriter {
        let max_rows = writer_properties().max_row_group_row_count().unwrap_or(1 << 20).max(1);
        ParallelFileWriter {
            lake: lake.clone(),
            rel,
            schema,
            handle,
            open: None,
            max_rows,
            rows: 0,
        }
    }

    fn open(&self, batch: &RecordBatch) -> Result<OpenFile> {
        let writer = ArrowWriter::try_new(
            Spool::new(),
            self.schema.clone(),
            Some(writer_properties_for(&self.schema)),
        )?;
        let (file, factory) = writer.into_serialized_writer()?;
        // Columns go to the encoders largest first (by their in-memory size in the first batch),
        // each to the least loaded one.
        let mut sizes = Vec::new();
        for (field, column) in self.schema.fields().iter().zip(batch.columns()) {
            let leaves = compute_leaves(field, column)?.len();
            for _ in 0..leaves {
                sizes.push(column.get_array_memory_size() / leaves.max(1));
            }
        }
        let mut order: Vec<usize> = (0..sizes.len()).collect();
        order.sort_by_key(|&i| std::cmp::Reverse(sizes[i]));
        let mut load = [0usize; ENCODERS];
        let mut owner = vec![0; sizes.len()];
        for i in order {
            let k = (0..ENCODERS).min_by_key(|&k| load[k]).unwrap_or(0);
            owner[i] = k;
            load[k] += sizes[i];
        }
        let encoders = (0..ENCODERS).map(Encoder::spawn).collect::<Result<Vec<_>>>()?;
        let out = LakeUpload::new(&self.lake, &self.rel, DEFAULT_PART, DEFAULT_IN_FLIGHT);
        Ok(OpenFile {
            file,
            factory,
            out,
            encoders,
            owner,
            group_rows: 0,
        })
    }

    pub fn write(&mut self, batch: &RecordBatch) -> Result<()> {
        if batch.num_rows() == 0 {
            return Ok(());
        }
        if self.open.is_none() {
            self.open = Some(self.open(batch)?);
        }
        let Some(open) = self.open.as_mut() else {
            return Err(Error::RunFailed(
                "internal error: the Parquet writer is not open".into(),
            ));
        };
        let room = self.max_rows - open.group_rows;
        if batch.num_rows() > room {
            self.write(&batch.slice(0, room))?;
            return self.write(&batch.slice(room, batch.num_rows() - room));
        }
        if open.group_rows == 0 {
            let index = open.file.flushed_row_groups().len();
            let mut mine: Vec<Vec<ArrowColumnWriter>> = (0..ENCODERS).map(|_| Vec::new()).collect();
            for (leaf, w) in open.factory.create_column_writers(index)?.into_iter().enumerate() {
                mine[open.owner.get(leaf).copied().unwrap_or(0)].push(w);
            }
            for (e, w) in open.encoders.iter().zip(mine) {
                e.send(EncodeJob::Start(w))?;
            }
        }
        let mut mine: Vec<Vec<ArrowLeafColumn>> = (0..ENCODERS).map(|_| Vec::new()).collect();
        let mut leaf = 0;
        for (field, column) in self.schema.fields().iter().zip(batch.columns()) {
            for l in compute_leaves(field, column)? {
                mine[open.owner.get(leaf).copied().unwrap_or(0)].push(l);
                leaf += 1;
            }
        }
        for (e, l) in open.encoders.iter().zip(mine) {
            e.send(EncodeJob::Write(l))?;
        }
        open.group_rows += batch.num_rows();
        self.rows += batch.num_rows() as u64;
        if open.group_rows == self.max_rows {
            Self::flush_group(open, &self.handle)?;
        }
        Ok(())
    }

    /// Close the row group: collect every column's chunk, append them in column order, upload.
    fn flush_group(open: &mut OpenFile, handle: &tokio::runtime::Handle) -> Result<()> {
        let mut replies = Vec::with_capacity(ENCODERS);
        for e in &open.encoders {
            let (tx, rx) = std::sync::mpsc::channel();
            e.send(EncodeJob::Close(tx))?;
            replies.push(rx);
        }
        let mut chunks = Vec::with_capacity(ENCODERS);
        for rx in replies {
            let c = rx
                .recv()
                .map_err(|_| Error::RunFailed("a Parquet encoder thread stopped".into()))??;
            chunks.push(c.into_iter());
        }
        let mut group = open.file.next_row_group()?;
        for &k in &open.owner {
            let Some(chunk) = chunks.get_mut(k).and_then(|c| c.next()) else {
                return Err(Error::RunFailed("internal error: a column chunk is missing".into()));
            };
            chunk.append_to_row_group(&mut group)?;
        }
        group.close()?;
        open.group_rows = 0;
        // `put` hands the blocks to the upload without copying them.
        let blocks = open.file.inner_mut().take();
        handle.block_on(async {
            for b in blocks {
                open.out.put(b).await?;
            }
            Ok::<_, Error>(())
        })?;
        Ok(())
    }

    /// Close the file; returns the number of rows written (0: no file was created) and the
    /// file's size and CRC-32.
    pub fn finish(mut self) -> Result<(u64, Option<FileStamp>)> {
        let Some(mut open) = self.open.take() else {
            return Ok((0, None));
        };
        if open.group_rows > 0 {
            Self::flush_group(&mut open, &self.handle)?;
        }
        open.file.finish()?;
        let blocks = open.file.inner_mut().take();
        let OpenFile { mut out, encoders, .. } = open;
        self.handle.block_on(async {
            for b in blocks {
                out.put(b).await?;
            }
            out.finish().await
        })?;
        for e in encoders {
            drop(e.jobs);
            let _ = e.thread.join();
        }
        Ok((self.rows, Some(out.stamp())))
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use datafusion::arrow::array::Int64Array;
    use datafusion::arrow::datatypes::Field;
    use datafusion::execution::memory_pool::GreedyMemoryPool;

    use super::*;

    /// Writes of every size, across block boundaries, come out of the spool whole and in order,
    /// and the blocks the upload dropped are filled again.
    #[test]
    fn the_spool_hands_over_every_byte_in_order_and_reuses_its_blocks() {
        let data: Vec<u8> = (0..(2 * SPOOL_BLOCK + 12_345) as u64)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        let mut spool = Spool::new();
        let mut taken: Vec<Bytes> = Vec::new();
        let mut at = 0;
        for (k, size) in [1, 7, SPOOL_BLOCK - 8, 3, SPOOL_BLOCK + 5, 1 << 20]
            .into_iter()
            .cycle()
            .enumerate()
        {
            let end = (at + size).min(data.len());
            spool.write_all(&data[at..end]).unwrap();
            at = end;
            if k % 2 == 1 {
                taken.extend(spool.take());
            }
            if at == data.len() {
                break;
            }
        }
        taken.extend(spool.take());
        assert!(spool.take().is_empty());
        assert!(taken.iter().all(|b| b.len() <= SPOOL_BLOCK));
        assert_eq!(taken.concat(), data);
        let blocks = taken.len();
        assert!(blocks >= 3, "{blocks}");
        drop(taken);
        let pooled = spool.pool.lock().unwrap().len();
        assert_eq!(pooled, blocks.min(SPOOL_POOLED));
        spool.write_all(&data[..SPOOL_BLOCK + 1]).unwrap();
        assert_eq!(
            spool.pool.lock().unwrap().len(),
            pooled - 1,
            "a full block takes a pooled one"
        );
        assert_eq!(spool.take().concat(), &data[..SPOOL_BLOCK + 1]);
    }

    /// Incompressible values (no encoding or zstd shrinks them below 8 bytes).
    fn scrambled(i: i64) -> i64 {
        i.wrapping_mul(0x9E37_79B9_7F4A_7C15u64 as i64).rotate_left(29)
    }

    fn batch(schema: &SchemaRef, from: i64, n: i64) -> RecordBatch {
        let col: ArrayRef = Arc::new(Int64Array::from_iter_values((from..from + n).map(scrambled)));
        RecordBatch::try_new(schema.clone(), vec![col]).unwrap()
    }

    /// The column chunk codecs of a file, by column name.
    fn codecs(path: &std::path::Path) -> std::collections::BTreeMap<String, Compression> {
        let bytes = Bytes::from(std::fs::read(path).unwrap());
        let reader = datafusion::parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(bytes).unwrap();
        let rg = reader.metadata().row_group(0);
        rg.columns()
            .iter()
            .map(|c| (c.column_path().string(), c.compression()))
            .collect()
    }

    /// A silver writer leaves only the fingerprint column uncompressed; every other writer
    /// compresses it like the rest.
    #[tokio::test]
    async fn only_a_silver_writer_leaves_the_fingerprints_uncompressed() {
        use datafusion::arrow::array::StringArray;
        let dir = tempfile::tempdir().unwrap();
        let lake = Lake::open(dir.path().to_str().unwrap()).unwrap();
        let schema: SchemaRef = Arc::new(Schema::new(vec![
            Field::new("v", DataType::Int64, false),
            Field::new("row_hash", DataType::Utf8, false),
            Field::new(FINGERPRINT, DataType::Utf8, false),
        ]));
        let hex = |i: i64| format!("{:016x}{:016x}", scrambled(i), scrambled(-i));
        let b = RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(Int64Array::from_iter_values(0..1000)),
                Arc::new(StringArray::from_iter_values((0..1000).map(hex))),
                Arc::new(StringArray::from_iter_values((1000..2000).map(hex))),
            ],
        )
        .unwrap();
        let zstd = Compression::ZSTD(ZstdLevel::try_new(1).unwrap());
        for (name, silver) in [("bronze.parquet", false), ("silver.parquet", true)] {
            let mut w = RunFileWriter::new(&lake, name.into(), schema.clone());
            if silver {
                w = w.with_fingerprints_uncompressed();
            }
            w.write(&b).await.unwrap();
            w.finish().await.unwrap();
            let fp = if silver { Compression::UNCOMPRESSED } else { zstd };
            let want = [("v", zstd), ("row_hash", zstd), (FINGERPRINT, fp)]
                .map(|(c, z)| (c.to_string(), z))
                .into_iter()
                .collect();
            assert_eq!(codecs(&dir.path().join(name)), want, "{name}");
        }
    }

    #[tokio::test]
    async fn a_budgeted_writer_takes_what_the_pool_has_bounds_its_row_groups_by_it_and_gives_it_back() {
        let dir = tempfile::tempdir().unwrap();
        let lake = Lake::open(dir.path().to_str().unwrap()).unwrap();
        let schema: SchemaRef = Arc::new(Schema::new(vec![Field::new("v", DataType::Int64, false)]));
        let pool: Arc<dyn MemoryPool> = Arc::new(GreedyMemoryPool::new(10 << 20));
        // 48 MiB asked of a 10 MiB pool: halved until it fits (6 MiB), row groups of 3 MiB
        let mut w = RunFileWriter::new(&lake, "t/a.parquet".into(), schema.clone()).with_budget(&pool, "w", 48 << 20);
        assert_eq!(pool.reserved(), 6 << 20);
        assert_eq!(w.row_group_bytes, Some(3 << 20));
        // a second writer finds 4 MiB left and takes 3 MiB; a third finds 1 MiB and still takes
        // the minimum, past the limit (a writer cannot spill), so the pool shows it
        let w2 = RunFileWriter::new(&lake, "t/b.parquet".into(), schema.clone()).with_budget(&pool, "w2", 48 << 20);
        assert_eq!(pool.reserved(), 9 << 20);
        let w3 = RunFileWriter::new(&lake, "t/c.parquet".into(), schema.clone()).with_budget(&pool, "w3", 48 << 20);
        assert_eq!(pool.reserved(), (9 << 20) + MIN_BUDGET);
        drop((w2, w3));
        assert_eq!(pool.reserved(), 6 << 20);
        // 2M distinct int64s (16 MB plain) cannot stay in one 3 MiB row group
        let rows = 2_000_000i64;
        for k in 0..(rows / 100_000) {
            w.write(&batch(&schema, k * 100_000, 100_000)).await.unwrap();
        }
        assert_eq!(w.finish().await.unwrap(), rows as u64);
        assert_eq!(pool.reserved(), 0, "finishing gives the budget back");
        let bytes = std::fs::read(dir.path().join("t/a.parquet")).unwrap();
        let reader = datafusion::parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(
            bytes::Bytes::from(bytes),
        )
        .unwrap();
        assert!(
            reader.metadata().num_row_groups() > 2,
            "{} row groups",
            reader.metadata().num_row_groups()
        );
        let mut next = 0i64;
        for b in reader.build().unwrap() {
            let b = b.unwrap();
            for v in b.column(0).as_any().downcast_ref::<Int64Array>().unwrap().values() {
                assert_eq!(*v, scrambled(next));
                next += 1;
            }
        }
        assert_eq!(next, rows, "every row read back in order");
    }
}
