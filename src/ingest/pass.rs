//! One pass over an input file: parse, type, hash, classify, write.
//!
//! Five stages joined by short bounded channels, so both cores stay busy and memory stays a few
//! batches whatever the file size: a parser thread (parse and type), a hashing thread (the SQL
//! UDF kernels, or the canonical input texts when a batch has them), the async task (classify
//! each row against the key index), a writer thread (stamp the run's constant columns, which
//! waits for the file hash when it is still computing) and two Parquet encoder threads
//! ([`crate::table::bronze::ParallelFileWriter`]).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, AsArray, RecordBatch, StringArray, UInt32Array, new_null_array};
use datafusion::arrow::compute::{cast, take};
use datafusion::arrow::datatypes::{DataType, SchemaRef};
use datafusion::common::{Column, DFSchema};
use datafusion::execution::FunctionRegistry;
use datafusion::logical_expr::Expr;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::prelude::{SessionContext, lit};
use futures::StreamExt;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

use crate::engine::session::Workspace;
use crate::error::{Error, Result};
use crate::hash::{FieldTexts, fingerprint_texts_with_heads, row_hash_texts_with_heads};
use crate::ingest::keys::{Classifier, Fate, Fp, hex_u64};
use crate::ingest::sink::ParsedBatch;
use crate::ingest::{FileDigest, IngestOptions, open_loader};
use crate::spec::contract::{Contract, FieldType};
use crate::table::audit::{FailureRow, FailureWriter, RunRecord};
use crate::table::bronze::{ParallelFileWriter, RunStamp};
use crate::table::evolve::StoredRun;
use crate::table::failpoint;
use crate::table::lake::layout;
use crate::table::upload::FileStamp;

/// Every row's key and row-hash prefix (see [`HashedBatch::key`]).
pub type RowKeys = Vec<(Fp, u64)>;

/// The fingerprint and row-hash expressions of a contract, compiled once per run.
pub struct Hashers {
    fingerprint: Arc<dyn PhysicalExpr>,
    row_hash: Arc<dyn PhysicalExpr>,
    schema: SchemaRef,
    /// For batches that carry their canonical texts: the row-hash fields (non-volatile, in
    /// contract order), whether each may need escaping (strings), the key fields and version.
    text_row_fields: Vec<usize>,
    text_escape: Vec<bool>,
    text_key_fields: Vec<usize>,
    key_version: i64,
}

impl Hashers {
    pub fn new(ctx: &SessionContext, contract: &Contract) -> Result<Hashers> {
        let schema = DFSchema::try_from(contract.fields_schema().as_ref().clone())?;
        let normalize = ctx.udf("normalize_text")?;
        let field_expr = |i: usize| -> Expr {
            let f = &contract.fields[i];
            let c = Expr::Column(Column::new_unqualified(&f.name));
            if f.normalize.is_empty() {
                c
            } else {
                let steps: Vec<&str> = f.normalize.iter().map(|s| s.name()).collect();
                normalize.call(vec![c, lit(steps.join(","))])
            }
        };
        let mut fp_args = vec![lit(contract.natural_key.version)];
        fp_args.extend(contract.natural_key.fields.iter().map(|&i| field_expr(i)));
        let fp = ctx.udf("natural_key_fingerprint")?.call(fp_args);
        let rh_args: Vec<Expr> = (0..contract.fields.len())
            .filter(|&i| !contract.fields[i].volatile)
            .map(field_expr)
            .collect();
        let rh = ctx.udf("row_hash")?.call(rh_args);
        let text_row_fields: Vec<usize> = (0..contract.fields.len())
            .filter(|&i| !contract.fields[i].volatile)
            .collect();
        let text_escape = text_row_fields
            .iter()
            .map(|&i| contract.fields[i].ty == FieldType::String)
            .collect();
        Ok(Hashers {
            text_row_fields,
            text_escape,
            text_key_fields: contract.natural_key.fields.clone(),
            key_version: contract.natural_key.version,
            schema: contract.fields_schema(),
            fingerprint: ctx.create_physical_expr(fp, &schema)?,
            row_hash: ctx.create_physical_expr(rh, &schema)?,
        })
    }

    /// Fingerprints of a batch of contract fields (in [`Contract::fields_schema`]), under the
    /// contract's natural key (`ingot rekey`).
    pub fn fingerprint(&self, fields: &RecordBatch) -> Result<StringArray> {
        evaluate_utf8(&self.fingerprint, fields, "natural_key_fingerprint")
    }

    /// Row hashes of a batch of contract fields (in [`Contract::fields_schema`]): a stored
    /// version's hash under the current contract ([`crate::table::evolve`]).
    pub fn row_hashes(&self, fields: &RecordBatch) -> Result<StringArray> {
        evaluate_utf8(&self.row_hash, fields, "row_hash")
    }

    /// Fingerprints and row hashes of every row of the batch (rejected rows included), and, when
    /// the digests were computed here from the batch's texts, every row's key and row-hash prefix
    /// (otherwise [`HashedBatch::new`] reads them from the hex digits).
    pub fn eval(&self, batch: &ParsedBatch) -> Result<(StringArray, StringArray, Option<RowKeys>)> {
        let utf8 = |a: ArrayRef, what: &str| -> Result<StringArray> {
            a.as_string_opt::<i32>()
                .cloned()
                .ok_or_else(|| Error::RunFailed(format!("{what} UDF returned a non-utf8 array")))
        };
        let fields = self.schema.fields().len();
        if let Some(t) = &batch.texts
            && t.ends.len() == batch.num_rows() * fields
        {
            // The input spelled every value canonically: hash its bytes, no re-formatting.
            let texts = FieldTexts {
                bytes: &t.bytes,
                ends: &t.ends,
                fields,
            };
            let (fp, fp_heads) = fingerprint_texts_with_heads(self.key_version, &texts, &self.text_key_fields)?;
            let (rh, rh_heads) = row_hash_texts_with_heads(&texts, &self.text_row_fields, &self.text_escape)?;
            let keys = fp_heads
                .iter()
                .zip(&rh_heads)
                .map(|(f, r)| (Fp(f[0], f[1]), r[0]))
                .collect();
            return Ok((utf8(fp, "natural_key_fingerprint")?, utf8(rh, "row_hash")?, Some(keys)));
        }
        let rb = RecordBatch::try_new(self.schema.clone(), batch.columns.clone())?;
        Ok((self.fingerprint(&rb)?, self.row_hashes(&rb)?, None))
    }
}

/// One hash expression over a batch of contract fields: its digests as a string array.
fn evaluate_utf8(expr: &Arc<dyn PhysicalExpr>, fields: &RecordBatch, what: &str) -> Result<StringArray> {
    expr.evaluate(fields)?
        .into_array(fields.num_rows())?
        .as_string_opt::<i32>()
        .cloned()
        .ok_or_else(|| Error::RunFailed(format!("{what} UDF returned a non-utf8 array")))
}

/// A parsed, typed and hashed batch.
pub struct HashedBatch {
    pub batch: ParsedBatch,
    pub fp: StringArray,
    pub rh: StringArray,
    /// Key and row-hash prefix of every row, read from the digests once.
    keys: Vec<(Fp, u64)>,
}

impl HashedBatch {
    /// `keys`: every row's key and row-hash prefix when the caller has them (from the digests'
    /// bytes); otherwise they are read from the hex digits.
    pub fn new(batch: ParsedBatch, fp: StringArray, rh: StringArray, keys: Option<RowKeys>) -> Result<HashedBatch> {
        let malformed = || Error::RunFailed("hash UDFs returned a malformed digest".into());
        let n = batch.num_rows();
        if fp.len() != n || rh.len() != n || fp.null_count() > 0 || rh.null_count() > 0 {
            return Err(malformed());
        }
        if let Some(keys) = keys {
            if keys.len() != n {
                return Err(malformed());
            }
            return Ok(HashedBatch { batch, fp, rh, keys });
        }
        let parse = |f: &[u8], r: &[u8]| match (hex_u64(f), f.get(16..).and_then(hex_u64), hex_u64(r)) {
            (Some(a), Some(b), Some(r)) => Ok((Fp(a, b), r)),
            _ => Err(malformed()),
        };
        // The kernels write 64 bytes a row into one buffer: read it straight, without offsets.
        let packed = |a: &StringArray| a.value_offsets().first() == Some(&0) && a.values().len() == 64 * n;
        let keys = if packed(&fp) && packed(&rh) {
            fp.values()
                .chunks_exact(64)
                .zip(rh.values().chunks_exact(64))
                .map(|(f, r)| parse(f, r))
                .collect::<Result<Vec<_>>>()?
        } else {
            (0..n)
                .map(|i| parse(fp.value(i).as_bytes(), rh.value(i).as_bytes()))
                .collect::<Result<Vec<_>>>()?
        };
        Ok(HashedBatch { batch, fp, rh, keys })
    }

    /// The key and row-hash prefix of row `i`.
    pub fn key(&self, i: usize) -> (Fp, u64) {
        self.keys[i]
    }

    pub fn is_valid(&self, i: usize) -> bool {
        self.batch.valid.as_ref().is_none_or(|v| v.value(i))
    }
}

/// How many rows ahead of the classified one the index slot is prefetched.
const PREFETCH_AHEAD: usize = 16;

/// The producer side: a blocking thread that parses and hashes the file.
pub struct Producer {
    pub rx: mpsc::Receiver<Result<HashedBatch>>,
    pub ignored: oneshot::Receiver<Vec<String>>,
    pub thread: JoinHandle<()>,
}

pub fn spawn_producer(
    contract: &Arc<Contract>,
    path: &Path,
    opts: &IngestOptions,
    hashers: &Arc<Hashers>,
    keep_raw: bool,
) -> Producer {
    let (parsed_tx, mut parsed_rx) = mpsc::channel::<Result<ParsedBatch>>(2);
    let (tx, rx) = mpsc::channel::<Result<HashedBatch>>(2);
    let (ignored_tx, ignored) = oneshot::channel::<Vec<String>>();
    let contract = contract.clone();
    let path = path.to_path_buf();
    let batch_size = opts.batch_size;
    let replay = opts.replay.clone();
    let name = opts.input_name.clone();
    let hashers = hashers.clone();
    // Stage 1: parse and type (a thread of its own, so that hashing overlaps it).
    let parse = move || {
        let mut loader = match open_loader(contract, &path, name.as_deref(), batch_size, keep_raw) {
            Ok(l) => crate::ingest::replay::Renumber::wrap(l, replay),
            Err(e) => {
                let _ = parsed_tx.blocking_send(Err(e));
                return;
            }
        };
        loop {
            match loader.next_batch() {
                Ok(Some(batch)) => {
                    if parsed_tx.blocking_send(Ok(batch)).is_err() {
                        return;
                    }
                }
                Ok(None) => {
                    if let Some(why) = loader.missing_fields() {
                        let _ = parsed_tx.blocking_send(Err(Error::RunFailed(why)));
                        return;
                    }
                    break;
                }
                Err(e) => {
                    let _ = parsed_tx.blocking_send(Err(e));
                    return;
                }
            }
        }
        let _ = ignored_tx.send(loader.ignored_columns());
    };
    // Stage 2: hash, on the blocking task the caller joins.
    let thread = tokio::task::spawn_blocking(move || {
        let parser = match std::thread::Builder::new().name("ingot-parse".into()).spawn(parse) {
            Ok(t) => t,
            Err(e) => {
                let _ = tx.blocking_send(Err(Error::RunFailed(format!("cannot start the parser thread: {e}"))));
                return;
            }
        };
        while let Some(parsed) = parsed_rx.blocking_recv() {
            let hashed = parsed.and_then(|batch| {
                let (fp, rh, keys) = hashers.eval(&batch)?;
                HashedBatch::new(batch, fp, rh, keys)
            });
            let failed = hashed.is_err();
            if tx.blocking_send(hashed).is_err() || failed {
                break;
            }
        }
        // Unblocks the parser if it is still sending, then waits for it.
        drop(parsed_rx);
        if parser.join().is_err() {
            let _ = tx.blocking_send(Err(Error::Internal("the parser thread panicked".into())));
        }
    });
    Producer { rx, ignored, thread }
}

/// The rows of a batch to write, before the run's constant columns are added.
struct NewRows {
    columns: Vec<ArrayRef>,
    row_hash: ArrayRef,
    fingerprint: ArrayRef,
    row_numbers: ArrayRef,
    /// Tombstones (see [`write_tombstones`]).
    deleted: bool,
}

/// The run's data file, stamped and encoded (Parquet, zstd) on a blocking thread of its own so
/// that encoding overlaps classification and parsing. The stamp needs the file hash, which may
/// still be computing when the first rows arrive: they wait in the channel (a few batches, then
/// the pass waits too), so memory stays bounded.
struct DataWriter {
    tx: Option<mpsc::Sender<NewRows>>,
    thread: JoinHandle<Result<(u64, Option<FileStamp>)>>,
}

/// Batches that may wait for the stamp (the file hash) before the pass stalls.
const WRITE_QUEUE: usize = 24;

impl DataWriter {
    fn spawn(ws: &Workspace, rel: String, schema: SchemaRef, stamp: StampParts) -> DataWriter {
        let (tx, mut rx) = mpsc::channel::<NewRows>(WRITE_QUEUE);
        let handle = tokio::runtime::Handle::current();
        let mut writer = ParallelFileWriter::new(&ws.lake, rel, schema.clone(), handle);
        let thread = tokio::task::spawn_blocking(move || {
            let mut pending = Some(stamp);
            let mut ready: Option<RunStamp> = None;
            while let Some(rows) = rx.blocking_recv() {
                let first = ready.is_none();
                if let Some(parts) = pending.take() {
                    ready = Some(parts.resolve()?);
                }
                let Some(stamp) = ready.as_mut() else {
                    return Err(Error::RunFailed("internal error: the run stamp is missing".into()));
                };
                let batch = stamp.stamp(
                    &schema,
                    rows.columns,
                    rows.row_hash,
                    rows.fingerprint,
                    rows.row_numbers,
                    rows.deleted,
                )?;
                writer.write(&batch)?;
                if first {
                    failpoint::hit("ingest.mid_data")?;
                }
            }
            writer.finish()
        });
        DataWriter { tx: Some(tx), thread }
    }

    async fn write(&mut self, rows: NewRows) -> Result<()> {
        if let Some(tx) = &self.tx
            && tx.send(rows).await.is_ok()
        {
            return Ok(());
        }
        // The writer stopped early: report why.
        self.tx = None;
        match (&mut self.thread).await {
            Ok(Err(e)) => Err(e),
            Ok(Ok(_)) => Err(Error::RunFailed("the data writer stopped early".into())),
            Err(e) => Err(Error::RunFailed(format!("data writer task failed: {e}"))),
        }
    }

    /// Close the file; the number of rows written and the file's size and CRC-32.
    async fn finish(mut self) -> Result<(u64, Option<FileStamp>)> {
        self.tx = None;
        self.thread
            .await
            .map_err(|e| Error::RunFailed(format!("data writer task failed: {e}")))?
    }
}

/// A [`RunStamp`] whose file hash may still be computing.
struct StampParts {
    run_id: String,
    digest: FileDigest,
    natural_key_version: i32,
    contract_version: i32,
    ingested_at: i64,
}

impl StampParts {
    fn resolve(self) -> Result<RunStamp> {
        Ok(RunStamp::new(
            self.run_id,
            self.digest.wait()?,
            self.natural_key_version,
            self.contract_version,
            self.ingested_at,
        ))
    }
}

#[derive(Debug, Default)]
pub struct Stats {
    pub seen: u64,
    pub inserted: u64,
    pub updated: u64,
    pub unchanged: u64,
    pub failed: u64,
    /// Tombstones written (a full delivery).
    pub deleted: u64,
    /// Replayed records a later run had delivered (counted in `failed` too).
    pub superseded: u64,
    /// A full delivery: the records current before the run.
    pub current: u64,
    /// A full delivery: rejected records whose natural key could not be read (so the run cannot
    /// tell which records they hold), and the first of them (`record N, rule: reason`).
    pub unreadable_keys: u64,
    pub first_unreadable: Option<String>,
    pub ignored: Vec<String>,
    /// The size and CRC-32 of the data file and the failure file the pass wrote.
    pub data_file: Option<FileStamp>,
    pub failure_file: Option<FileStamp>,
}

/// How a write pass ended.
pub enum PassOutcome {
    Done(Stats),
    /// The classifier found conflicts it did not know about: redo the pass.
    Rerun,
}

/// A conflicting record, logged at the end when all records of its key are known.
struct ConflictRow {
    fp: Fp,
    fp_hex: String,
    row_number: u64,
    raw: String,
}

/// Everything a pass over one input needs.
pub struct RunInput<'a> {
    pub ws: &'a Workspace,
    pub contract: &'a Arc<Contract>,
    pub path: &'a Path,
    pub opts: &'a IngestOptions,
    pub record: &'a RunRecord,
    pub hashers: &'a Arc<Hashers>,
    /// The input's hash (stamped on every bronze row), possibly still computing.
    pub digest: &'a FileDigest,
    pub ctx: &'a SessionContext,
    /// For a `delivery: full` file: the bronze files of the source's current state (oldest
    /// first), read again after the pass to write the tombstones. `None`: nothing is deleted.
    pub delete_from: Option<&'a [StoredRun]>,
    /// For a replay: the keys runs after the original delivered (their rows are not loaded).
    pub superseding: Option<&'a super::replay::Superseding>,
}

/// Parse the file and write the run's data and failure files, asking `classifier` the fate of
/// every valid row. `keep_raw` keeps every record's raw text (needed to log conflict rows).
pub async fn write_pass(input: &RunInput<'_>, classifier: &mut dyn Classifier, keep_raw: bool) -> Result<PassOutcome> {
    let RunInput {
        ws,
        contract,
        path,
        opts,
        record,
        hashers,
        digest,
        ctx,
        delete_from,
        superseding,
    } = *input;
    let mut producer = spawn_producer(contract, path, opts, hashers, keep_raw);
    let progress = super::progress_bar(opts.progress, record.file_bytes as u64, path);
    let data_schema = contract.bronze_schema();
    let stamp = StampParts {
        run_id: record.run_id.to_string(),
        digest: digest.clone(),
        natural_key_version: contract.natural_key.version as i32,
        contract_version: contract.version as i32,
        ingested_at: record.started_at,
    };
    // the run's own folders, or a re-derivation's scratch run ([`IngestOptions::files_as`])
    let folder = opts.files_as.as_deref().unwrap_or(&record.run_id);
    let mut data = DataWriter::spawn(ws, layout::bronze_data(&contract.source, folder), data_schema, stamp);
    let mut failures = FailureWriter::new(&ws.lake, folder, &contract.source, record.started_at);
    let mut stats = Stats::default();
    let mut held: Vec<ConflictRow> = Vec::new();

    while let Some(hashed) = producer.rx.recv().await {
        let hashed = hashed?;
        let batch = &hashed.batch;
        stats.seen += batch.num_rows() as u64;
        log_rejections(&hashed, &mut stats, classifier, &mut failures, delete_from.is_some()).await?;
        let mut keep: Vec<u32> = Vec::new();
        for i in (0..batch.num_rows()).filter(|&i| hashed.is_valid(i)) {
            // The index is far larger than the caches: ask for a later row's slot now.
            if let Some(&(ahead, _)) = hashed.keys.get(i + PREFETCH_AHEAD) {
                classifier.prefetch(ahead);
            }
            let (key, row) = hashed.key(i);
            let row_number = batch.row_numbers.value(i) as u64;
            if let Some(s) = superseding
                && let Some(row) = s.failure(key, &hashed, i)
            {
                stats.failed += 1;
                stats.superseded += 1;
                failures.push(row).await?;
                continue;
            }
            match classifier.classify(key, row, row_number) {
                Fate::Inserted => {
                    stats.inserted += 1;
                    keep.push(i as u32);
                }
                Fate::Updated => {
                    stats.updated += 1;
                    keep.push(i as u32);
                }
                Fate::Unchanged => stats.unchanged += 1,
                Fate::Conflict => {
                    stats.failed += 1;
                    let raw = batch.raw.as_ref().map(|r| r.value(i).to_string()).unwrap_or_default();
                    held.push(ConflictRow {
                        fp: key,
                        fp_hex: hashed.fp.value(i).to_string(),
                        row_number,
                        raw,
                    });
                }
            }
        }
        if let Some(p) = &progress {
            p.set_position(batch.bytes_read.min(record.file_bytes as u64));
        }
        if classifier.discovered() {
            // Keep draining the input to find every conflicting key, but write nothing more.
            continue;
        }
        if !keep.is_empty() {
            let rows = if keep.len() == batch.num_rows() {
                // Every row is new (a first load): no copy.
                NewRows {
                    columns: batch.columns.clone(),
                    row_hash: Arc::new(hashed.rh.clone()),
                    fingerprint: Arc::new(hashed.fp.clone()),
                    row_numbers: batch.row_numbers.clone(),
                    deleted: false,
                }
            } else {
                let idx = UInt32Array::from(keep);
                let columns = batch
                    .columns
                    .iter()
                    .map(|c| take(c.as_ref(), &idx, None))
                    .collect::<std::result::Result<Vec<_>, _>>()?;
                NewRows {
                    columns,
                    row_hash: take(&hashed.rh, &idx, None)?,
                    fingerprint: take(&hashed.fp, &idx, None)?,
                    row_numbers: take(batch.row_numbers.as_ref(), &idx, None)?,
                    deleted: false,
                }
            };
            data.write(rows).await?;
        }
    }
    producer
        .thread
        .await
        .map_err(|e| Error::RunFailed(format!("parser task failed: {e}")))?;
    if let Some(p) = progress {
        p.finish_and_clear();
    }
    if classifier.discovered() {
        // Abandon this pass; its run-scoped files are overwritten by the next one.
        let _ = data.finish().await;
        let _ = failures.finish().await;
        return Ok(PassOutcome::Rerun);
    }
    log_conflicts(contract, held, &mut failures).await?;
    if let Some(stored) = delete_from {
        stats.current = classifier.current_records();
        stats.deleted = write_tombstones(ctx, contract, stored, classifier, &mut data).await?;
    }
    stats.data_file = data.finish().await?.1;
    failpoint::hit("ingest.after_data")?;
    stats.failure_file = failures.finish_stamped().await?.1;
    failpoint::hit("ingest.after_failures")?;
    stats.ignored = producer.ignored.await.unwrap_or_default();
    Ok(PassOutcome::Done(stats))
}

/// Log the rejected records of a batch. In a full delivery (`full`) a rejected record whose key
/// could be computed counts as delivered; one whose key could not is counted, as it may be a
/// record the run deletes (a hold gate, [`crate::ingest::hold`]).
async fn log_rejections(
    hashed: &HashedBatch,
    stats: &mut Stats,
    classifier: &mut dyn Classifier,
    failures: &mut FailureWriter,
    full: bool,
) -> Result<()> {
    for r in &hashed.batch.rejections {
        stats.failed += 1;
        if full {
            if r.key_ok {
                classifier.mark_present(hashed.key(r.index).0);
            } else {
                stats.unreadable_keys += 1;
                if stats.first_unreadable.is_none() {
                    stats.first_unreadable = Some(format!("record {}, {}: {}", r.row_number, r.rule, r.reason));
                }
            }
        }
        failures
            .push(FailureRow {
                source_row_number: Some(r.row_number as i64),
                natural_key_fingerprint: r.key_ok.then(|| hashed.fp.value(r.index).to_string()),
                raw_payload: r.raw_payload.clone(),
                rule: r.rule.clone(),
                reason: r.reason.clone(),
            })
            .await?;
    }
    Ok(())
}

/// Write a tombstone for every current record a full delivery did not have: read the current
/// state's bronze files newest first (so the first row of a key is its latest version) and ask the
/// classifier for each key. A tombstone keeps the record's natural-key fields (from that latest
/// version) and its fingerprint; every other field, `row_hash` and `source_row_number` are null,
/// `is_deleted` is true. Each file is read as one stream in its own order (no byte-range
/// partitions), so the tombstones come in the same order and batches on any machine: a run's file
/// can be derived again byte for byte (`ingot doctor --fix`). Returns the number written.
async fn write_tombstones(
    ctx: &SessionContext,
    contract: &Contract,
    stored: &[StoredRun],
    classifier: &mut dyn Classifier,
    data: &mut DataWriter,
) -> Result<u64> {
    let state = datafusion::execution::session_state::SessionStateBuilder::new_from_existing(ctx.state())
        .with_config(ctx.copied_config().with_repartition_file_scans(false))
        .build();
    let ctx = &SessionContext::new_with_state(state);
    let key_names = contract.natural_key_names();
    let mut columns = vec!["natural_key_fingerprint"];
    columns.extend(&key_names);
    let mut written = 0u64;
    for run in stored.iter().rev() {
        let url = &run.url;
        let df = crate::table::evolve::read_stored(ctx, contract, &[run])?.select_columns(&columns)?;
        let mut stream = df.execute_stream().await?;
        while let Some(batch) = stream.next().await {
            let batch = batch?;
            let fps = crate::ingest::keys::StrColumn::new(batch.column(0))
                .ok_or_else(|| Error::RunFailed(format!("{url}: natural_key_fingerprint is not a string column")))?;
            let mut pick: Vec<u32> = Vec::new();
            for i in 0..batch.num_rows() {
                if batch.column(0).is_valid(i)
                    && let Some(key) = crate::ingest::keys::fp_key(fps.value(i))
                    && classifier.take_deletion(key)
                {
                    pick.push(i as u32);
                }
            }
            if pick.is_empty() {
                continue;
            }
            let n = pick.len();
            let idx = UInt32Array::from(pick);
            let mut fields: Vec<ArrayRef> = contract
                .fields
                .iter()
                .map(|f| new_null_array(&f.ty.arrow_type(), n))
                .collect();
            for (k, &i) in contract.natural_key.fields.iter().enumerate() {
                let taken = take(batch.column(k + 1).as_ref(), &idx, None)?;
                fields[i] = cast(&taken, &contract.fields[i].ty.arrow_type())?;
            }
            let fingerprint = cast(&take(batch.column(0).as_ref(), &idx, None)?, &DataType::Utf8)?;
            data.write(NewRows {
                columns: fields,
                row_hash: new_null_array(&DataType::Utf8, n),
                fingerprint,
                row_numbers: new_null_array(&DataType::Int64, n),
                deleted: true,
            })
            .await?;
            written += n as u64;
        }
    }
    Ok(written)
}

/// Log every record of each conflicting key, naming its siblings.
async fn log_conflicts(contract: &Contract, held: Vec<ConflictRow>, failures: &mut FailureWriter) -> Result<()> {
    let mut by_key: BTreeMap<Fp, Vec<u64>> = BTreeMap::new();
    for h in &held {
        by_key.entry(h.fp).or_default().push(h.row_number);
    }
    let names = contract.natural_key_names();
    for h in held {
        let others: Vec<String> = by_key
            .get(&h.fp)
            .map(|v| {
                v.iter()
                    .filter(|&&r| r != h.row_number)
                    .map(|r| r.to_string())
                    .collect()
            })
            .unwrap_or_default();
        failures
            .push(FailureRow {
                source_row_number: Some(h.row_number as i64),
                natural_key_fingerprint: Some(h.fp_hex),
                raw_payload: h.raw,
                rule: "natural_key_conflict".into(),
                reason: format!(
                    "natural key ({}) has different versions in this file (also record{} {}); none of them is loaded and the current version stays",
                    names.join(", "),
                    if others.len() == 1 { "" } else { "s" },
                    others.join(", ")
                ),
            })
            .await?;
    }
    Ok(())
}
