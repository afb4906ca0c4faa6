//! Ingest: one input file becomes one run of bronze (DESIGN.md §6).
//!
//! The sequence of a run, and where a crash can hit it:
//!
//! 1. take the source lock; hash the file's bytes; a file already loaded by a committed run is
//!    recorded as `skipped_duplicate_file` and nothing is read;
//! 2. build the change-detection index (fingerprint → row_hash prefixes) from the committed
//!    bronze runs of the source, oldest first, so the newest version wins;
//! 3. parse (a blocking thread) → type and check → hash with the SQL UDFs → classify each row as
//!    inserted / updated / unchanged / failed → stream new versions and failures to run-scoped
//!    Parquet files;
//! 4. commit the run-log record (create-if-absent), release the lock.
//!
//! In-file natural-key conflicts are found during the pass; a file that has any is processed a
//! second time with the conflicting keys known, so that every record of a conflicting key is
//! rejected (the first pass's run-scoped files are overwritten, never published).
//!
//! Memory: the index holds 40 bytes per distinct key (128-bit fingerprint prefix, 64-bit row-hash
//! prefixes); everything else streams in batches.

pub mod csv;
pub mod ndjson;
pub mod parquet;
pub mod sink;
pub mod typing;

use std::collections::BTreeMap;
use std::hash::{BuildHasherDefault, Hash, Hasher};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, AsArray, RecordBatch, UInt32Array};
use datafusion::arrow::compute::take;
use datafusion::common::{Column, DFSchema};
use datafusion::execution::FunctionRegistry;
use datafusion::logical_expr::Expr;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::prelude::{SessionContext, lit};
use futures::StreamExt;
use sha2::{Digest, Sha256};

use crate::audit::{FailureRow, FailureWriter, RunRecord, RunStatus, commit_run, read_run_log};
use crate::bronze::{BronzeWriter, RunStamp};
use crate::contract::{Contract, Format};
use crate::error::{Error, Result};
use crate::failpoint;
use crate::lake::layout;
use crate::session::Workspace;
use sink::ParsedBatch;

/// A source of typed batches (CSV, NDJSON or Parquet).
pub trait Loader: Send {
    fn next_batch(&mut self) -> Result<Option<ParsedBatch>>;
    /// Input columns dropped under `unknown_fields: ignore`.
    fn ignored_columns(&self) -> Vec<String>;
}

/// Options of an ingest.
#[derive(Debug, Clone)]
pub struct IngestOptions {
    pub batch_size: usize,
    pub lock_ttl: std::time::Duration,
    /// Show a progress bar (the CLI sets this when stdout is a terminal).
    pub progress: bool,
    /// Set `replay_of` on the run (used by replay, a later feature).
    pub replay_of: Option<String>,
}

impl Default for IngestOptions {
    fn default() -> Self {
        IngestOptions {
            batch_size: 32 * 1024,
            lock_ttl: crate::lock::default_ttl(),
            progress: false,
            replay_of: None,
        }
    }
}

/// Expand the command line's paths and globs into existing files, sorted, deduplicated.
pub fn expand_inputs(inputs: &[String]) -> Result<Vec<PathBuf>> {
    let mut out = std::collections::BTreeSet::new();
    for input in inputs {
        let input = input.strip_prefix("file://").unwrap_or(input);
        if let Some((scheme, _)) = input.split_once("://") {
            return Err(Error::Invalid(format!(
                "cannot read \"{input}\": {scheme}:// inputs are not supported by this build; use a local path, a glob or file://"
            )));
        }
        if input.contains(['*', '?', '[']) {
            let matches = glob::glob(input).map_err(|e| Error::Invalid(format!("invalid glob \"{input}\": {e}")))?;
            let mut any = false;
            for m in matches {
                let p = m.map_err(|e| Error::Invalid(format!("{input}: {e}")))?;
                if p.is_file() {
                    out.insert(p);
                    any = true;
                }
            }
            if !any {
                return Err(Error::Invalid(format!("no file matches \"{input}\"")));
            }
        } else {
            let p = PathBuf::from(input);
            if !p.is_file() {
                return Err(Error::Invalid(format!("no such file: {input}")));
            }
            out.insert(p);
        }
    }
    Ok(out.into_iter().collect())
}

/// Ingest every input of `source`, one run per file in sorted order. Stops at the first run that
/// fails with an infrastructure error; failed runs (bad input) are recorded and the next file goes.
pub async fn ingest(
    ws: &Workspace,
    contract: Arc<Contract>,
    inputs: &[PathBuf],
    opts: &IngestOptions,
) -> Result<Vec<RunRecord>> {
    let mut out = Vec::new();
    for path in inputs {
        out.push(ingest_file(ws, contract.clone(), path, opts).await?);
    }
    Ok(out)
}

fn now_micros() -> i64 {
    chrono::Utc::now().timestamp_micros()
}

/// Ingest one file as one run and return its committed record.
pub async fn ingest_file(
    ws: &Workspace,
    contract: Arc<Contract>,
    path: &Path,
    opts: &IngestOptions,
) -> Result<RunRecord> {
    let run_id = uuid::Uuid::now_v7().to_string();
    let started_at = now_micros();
    let file_bytes = std::fs::metadata(path).map_err(|e| Error::io(path.display(), e))?.len() as i64;
    let mut record = RunRecord {
        run_id: run_id.clone(),
        source: contract.source.clone(),
        contract_version: contract.version as i32,
        file_path: path.display().to_string(),
        file_hash: None,
        file_bytes,
        started_at,
        finished_at: started_at,
        status: RunStatus::Failed,
        rows_seen: 0,
        rows_inserted: 0,
        rows_updated: 0,
        rows_unchanged: 0,
        rows_failed: 0,
        replay_of: opts.replay_of.clone(),
        error: None,
        ingot_version: crate::audit::INGOT_VERSION.to_string(),
        ignored_columns: None,
    };
    let lock = crate::lock::acquire(&ws.lake, &contract.source, &run_id, opts.lock_ttl).await?;
    let outcome = run(ws, &contract, path, opts, &mut record).await;
    let result = match outcome {
        Ok(()) => Ok(record),
        Err(Error::RunFailed(msg)) => {
            // Bad input: record the failed run (no data is published) and carry on.
            record.status = RunStatus::Failed;
            record.error = Some(msg);
            record.rows_seen = 0;
            record.rows_inserted = 0;
            record.rows_updated = 0;
            record.rows_unchanged = 0;
            record.rows_failed = 0;
            record.finished_at = now_micros();
            commit_run(&ws.lake, &record).await.map(|_| record)
        }
        Err(e) => Err(e),
    };
    if result.is_ok() {
        failpoint::hit("ingest.after_commit")?;
    }
    lock.release().await?;
    result
}

async fn run(
    ws: &Workspace,
    contract: &Arc<Contract>,
    path: &Path,
    opts: &IngestOptions,
    record: &mut RunRecord,
) -> Result<()> {
    failpoint::hit("ingest.after_lock")?;
    let file_hash = hash_file(path).await?;
    record.file_hash = Some(file_hash.clone());
    failpoint::hit("ingest.after_hash")?;

    let runs = read_run_log(&ws.lake).await?;
    let runs: Vec<&RunRecord> = runs.iter().filter(|r| r.source == contract.source).collect();
    if let Some(previous) = runs
        .iter()
        .find(|r| r.status.is_loaded() && r.file_hash.as_deref() == Some(&file_hash))
    {
        record.status = RunStatus::SkippedDuplicateFile;
        record.error = None;
        record.finished_at = now_micros();
        record.ignored_columns = None;
        let _ = previous;
        commit_run(&ws.lake, record).await?;
        return Ok(());
    }

    let ctx = ws.session()?;
    let mut index = KeyIndex::default();
    for r in runs.iter().filter(|r| r.has_data()) {
        index
            .load_run(&ctx, &ws.lake.url(&layout::bronze_data(&r.source, &r.run_id)))
            .await?;
    }

    // Size the index for the file's keys up front (about one key per 128 input bytes) so it does
    // not rehash while loading; capped so a huge file does not reserve more than it needs.
    index
        .map
        .reserve(((record.file_bytes as u64 / 128).min(1 << 26)) as usize);
    let hashers = Arc::new(Hashers::new(&ctx, contract)?);
    let mut conflicts: Conflicts = Conflicts::default();
    let stats = loop {
        let pass = Pass::run(ws, contract, path, opts, record, &hashers, &mut index, &conflicts).await?;
        match pass {
            PassOutcome::Done(stats) => break stats,
            PassOutcome::Conflicts(found) => {
                // Second pass with the conflicting keys known (a file has at most one retry: the
                // set found in pass one is complete).
                if !conflicts.keys.is_empty() {
                    return Err(Error::RunFailed(
                        "natural-key conflict detection did not converge".into(),
                    ));
                }
                index.forget_file();
                conflicts = found;
            }
        }
    };
    record.rows_seen = stats.seen as i64;
    record.rows_inserted = stats.inserted as i64;
    record.rows_updated = stats.updated as i64;
    record.rows_unchanged = stats.unchanged as i64;
    record.rows_failed = stats.failed as i64;
    record.ignored_columns = if stats.ignored.is_empty() {
        None
    } else {
        Some(stats.ignored.join(","))
    };
    record.status = if stats.failed > 0 {
        RunStatus::SucceededWithFailures
    } else {
        RunStatus::Succeeded
    };
    record.finished_at = now_micros();
    debug_assert_eq!(
        stats.seen,
        stats.inserted + stats.updated + stats.unchanged + stats.failed
    );
    commit_run(&ws.lake, record).await
}

/// SHA-256 of the file's bytes as stored.
async fn hash_file(path: &Path) -> Result<String> {
    let path = path.to_path_buf();
    tokio::task::spawn_blocking(move || -> Result<String> {
        let mut f = std::fs::File::open(&path).map_err(|e| Error::io(path.display(), e))?;
        let mut h = Sha256::new();
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let n = f.read(&mut buf).map_err(|e| Error::io(path.display(), e))?;
            if n == 0 {
                break;
            }
            h.update(&buf[..n]);
        }
        let digest: [u8; 32] = h.finalize().into();
        let mut hex = [0u8; 64];
        crate::hash::hex_lower(&digest, &mut hex);
        Ok(String::from_utf8_lossy(&hex).into_owned())
    })
    .await
    .map_err(|e| Error::RunFailed(format!("hashing task failed: {e}")))?
}

/// Open the right loader for the contract's format; `.gz` input is decompressed transparently.
pub fn open_loader(contract: Arc<Contract>, path: &Path, batch_size: usize, keep_raw: bool) -> Result<Box<dyn Loader>> {
    let display = path.display().to_string();
    let mut file = std::fs::File::open(path).map_err(|e| Error::io(&display, e))?;
    let mut magic = [0u8; 2];
    let n = file.read(&mut magic).map_err(|e| Error::io(&display, e))?;
    drop(file);
    let file = std::fs::File::open(path).map_err(|e| Error::io(&display, e))?;
    let gz = n == 2 && magic == [0x1f, 0x8b];
    if contract.format == Format::Parquet {
        if gz {
            return Err(Error::RunFailed(format!(
                "{display}: gzip-compressed Parquet is not supported (Parquet compresses internally)"
            )));
        }
        return Ok(Box::new(parquet::ParquetLoader::open(
            contract, file, display, batch_size, keep_raw,
        )?));
    }
    let input: Box<dyn Read + Send> = if gz {
        Box::new(flate2::read::MultiGzDecoder::new(std::io::BufReader::new(file)))
    } else {
        Box::new(file)
    };
    Ok(match contract.format {
        Format::Csv => Box::new(csv::CsvLoader::open(contract, input, display, batch_size, keep_raw)?),
        Format::Ndjson => Box::new(ndjson::NdjsonLoader::open(
            contract, input, display, batch_size, keep_raw,
        )?),
        Format::Parquet => unreachable!("handled above"),
    })
}

/// The fingerprint and row-hash expressions of a contract, compiled once per run.
struct Hashers {
    fingerprint: Arc<dyn PhysicalExpr>,
    row_hash: Arc<dyn PhysicalExpr>,
    schema: datafusion::arrow::datatypes::SchemaRef,
}

impl Hashers {
    fn new(ctx: &SessionContext, contract: &Contract) -> Result<Hashers> {
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
        Ok(Hashers {
            schema: contract.fields_schema(),
            fingerprint: ctx.create_physical_expr(fp, &schema)?,
            row_hash: ctx.create_physical_expr(rh, &schema)?,
        })
    }

    fn eval(&self, batch: &ParsedBatch) -> Result<(ArrayRef, ArrayRef)> {
        let rb = RecordBatch::try_new(self.schema.clone(), batch.columns.clone())?;
        let n = rb.num_rows();
        let fp = self.fingerprint.evaluate(&rb)?.into_array(n)?;
        let rh = self.row_hash.evaluate(&rb)?.into_array(n)?;
        Ok((fp, rh))
    }
}

/// 128-bit prefix of a fingerprint; hashed by its first word (the bits are already uniform).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Fp(u64, u64);

impl Hash for Fp {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.0 ^ self.1.rotate_left(17));
    }
}

#[derive(Default)]
struct WordHasher(u64);

impl Hasher for WordHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = self.0.rotate_left(8) ^ *b as u64;
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = v;
    }
}

fn hex_u64(s: &[u8]) -> Option<u64> {
    let mut v = 0u64;
    for &c in s.get(..16)? {
        let d = match c {
            b'0'..=b'9' => c - b'0',
            b'a'..=b'f' => c - b'a' + 10,
            _ => return None,
        };
        v = (v << 4) | d as u64;
    }
    Some(v)
}

fn fp_key(hex: &str) -> Option<Fp> {
    let b = hex.as_bytes();
    Some(Fp(hex_u64(b)?, hex_u64(b.get(16..)?)?))
}

#[derive(Debug, Clone, Copy, Default)]
struct KeyState {
    /// Row-hash prefix of the current committed version, when `has_current`.
    current: u64,
    /// Row-hash prefix of this file's first version of the key, when `in_file`.
    file: u64,
    has_current: bool,
    in_file: bool,
}

/// fingerprint → state, over the committed bronze of one source plus the file being loaded.
#[derive(Default)]
struct KeyIndex {
    map: hashbrown::HashMap<Fp, KeyState, BuildHasherDefault<WordHasher>>,
}

impl KeyIndex {
    /// Fold one committed run's versions into the index (later runs overwrite earlier ones).
    async fn load_run(&mut self, ctx: &SessionContext, url: &str) -> Result<()> {
        let df = ctx
            .read_parquet(url, Default::default())
            .await?
            .select_columns(&["natural_key_fingerprint", "row_hash"])?;
        let mut stream = df.execute_stream().await?;
        while let Some(batch) = stream.next().await {
            let batch = batch?;
            let fps = StrColumn::new(batch.column(0)).ok_or_else(|| bad_column(url, "natural_key_fingerprint"))?;
            let rhs = StrColumn::new(batch.column(1)).ok_or_else(|| bad_column(url, "row_hash"))?;
            for i in 0..batch.num_rows() {
                let (Some(fp), Some(rh)) = (fp_key(fps.value(i)), hex_u64(rhs.value(i).as_bytes())) else {
                    return Err(bad_column(url, "natural_key_fingerprint/row_hash"));
                };
                let e = self.map.entry(fp).or_default();
                e.current = rh;
                e.has_current = true;
            }
        }
        Ok(())
    }

    /// Drop what the last pass learned about the file.
    fn forget_file(&mut self) {
        self.map.retain(|_, s| {
            s.in_file = false;
            s.has_current
        });
    }
}

/// A string column read back from Parquet: DataFusion may hand it out as Utf8 or Utf8View.
enum StrColumn<'a> {
    Utf8(&'a datafusion::arrow::array::StringArray),
    View(&'a datafusion::arrow::array::StringViewArray),
}

impl<'a> StrColumn<'a> {
    fn new(array: &'a ArrayRef) -> Option<StrColumn<'a>> {
        if let Some(a) = array.as_string_opt::<i32>() {
            return Some(StrColumn::Utf8(a));
        }
        array.as_string_view_opt().map(StrColumn::View)
    }

    fn value(&self, i: usize) -> &'a str {
        match self {
            StrColumn::Utf8(a) => a.value(i),
            StrColumn::View(a) => a.value(i),
        }
    }
}

fn bad_column(url: &str, col: &str) -> Error {
    Error::RunFailed(format!(
        "{url}: column {col} is not a 64-character hex string; the bronze file is damaged"
    ))
}

/// Keys that conflict within the file, with the record numbers of every version.
#[derive(Default)]
struct Conflicts {
    keys: hashbrown::HashMap<Fp, Vec<u64>>,
}

#[derive(Default)]
struct Stats {
    seen: u64,
    inserted: u64,
    updated: u64,
    unchanged: u64,
    failed: u64,
    ignored: Vec<String>,
}

enum PassOutcome {
    Done(Stats),
    Conflicts(Conflicts),
}

/// A held-back conflicting record (pass two), logged once all its siblings are known.
struct ConflictRow {
    fp: Fp,
    fp_hex: String,
    row_number: u64,
    raw: String,
}

struct Pass;

impl Pass {
    #[allow(clippy::too_many_arguments)]
    async fn run(
        ws: &Workspace,
        contract: &Arc<Contract>,
        path: &Path,
        opts: &IngestOptions,
        record: &RunRecord,
        hashers: &Arc<Hashers>,
        index: &mut KeyIndex,
        known: &Conflicts,
    ) -> Result<PassOutcome> {
        // The blocking thread parses, types and hashes; this task classifies and writes. Two
        // stages for two cores.
        let (tx, mut rx) = tokio::sync::mpsc::channel::<Result<(ParsedBatch, ArrayRef, ArrayRef)>>(2);
        let thread_hashers = hashers.clone();
        let (ignored_tx, ignored_rx) = tokio::sync::oneshot::channel::<Vec<String>>();
        let loader_contract = contract.clone();
        let loader_path = path.to_path_buf();
        let batch_size = opts.batch_size;
        let keep_raw = !known.keys.is_empty();
        let parser = tokio::task::spawn_blocking(move || {
            let mut loader = match open_loader(loader_contract, &loader_path, batch_size, keep_raw) {
                Ok(l) => l,
                Err(e) => {
                    let _ = tx.blocking_send(Err(e));
                    return;
                }
            };
            loop {
                match loader.next_batch() {
                    Ok(Some(b)) => {
                        let hashed = thread_hashers.eval(&b).map(|(fp, rh)| (b, fp, rh));
                        if tx.blocking_send(hashed).is_err() {
                            return;
                        }
                    }
                    Ok(None) => break,
                    Err(e) => {
                        let _ = tx.blocking_send(Err(e));
                        return;
                    }
                }
            }
            let _ = ignored_tx.send(loader.ignored_columns());
        });

        let progress = progress_bar(opts.progress, record.file_bytes as u64, path);
        let data_schema = contract.bronze_schema();
        let mut data = BronzeWriter::new(
            &ws.lake,
            layout::bronze_data(&contract.source, &record.run_id),
            data_schema.clone(),
        );
        let mut failures = FailureWriter::new(&ws.lake, &record.run_id, &contract.source, record.started_at);
        let stamp = RunStamp {
            run_id: record.run_id.clone(),
            file_hash: record.file_hash.clone().unwrap_or_default(),
            natural_key_version: contract.natural_key.version as i32,
            contract_version: contract.version as i32,
            ingested_at: record.started_at,
        };
        let mut stats = Stats::default();
        let mut found = Conflicts::default();
        let mut held: Vec<ConflictRow> = Vec::new();
        let mut first_row: hashbrown::HashMap<Fp, u64> = hashbrown::HashMap::new();
        let mut midway = false;

        while let Some(batch) = rx.recv().await {
            let (batch, fp, rh) = batch?;
            let fp = fp
                .as_string_opt::<i32>()
                .ok_or_else(|| Error::RunFailed("fingerprint UDF returned a non-utf8 array".into()))?
                .clone();
            let rh = rh
                .as_string_opt::<i32>()
                .ok_or_else(|| Error::RunFailed("row_hash UDF returned a non-utf8 array".into()))?
                .clone();
            stats.seen += batch.num_rows() as u64;
            for r in &batch.rejections {
                stats.failed += 1;
                failures
                    .push(FailureRow {
                        source_row_number: Some(r.row_number as i64),
                        natural_key_fingerprint: r.key_ok.then(|| fp.value(r.index).to_string()),
                        raw_payload: r.raw_payload.clone(),
                        rule: r.rule.clone(),
                        reason: r.reason.clone(),
                    })
                    .await?;
            }
            let mut keep: Vec<u32> = Vec::new();
            for i in 0..batch.num_rows() {
                if batch.valid.as_ref().is_some_and(|v| !v.value(i)) {
                    continue;
                }
                let fp_hex = fp.value(i);
                let (Some(key), Some(row)) = (fp_key(fp_hex), hex_u64(rh.value(i).as_bytes())) else {
                    return Err(Error::RunFailed("hash UDFs returned a malformed digest".into()));
                };
                let row_number = batch.row_numbers.value(i) as u64;
                if known.keys.contains_key(&key) {
                    stats.failed += 1;
                    let raw = batch.raw.as_ref().map(|r| r.value(i).to_string()).unwrap_or_default();
                    held.push(ConflictRow {
                        fp: key,
                        fp_hex: fp_hex.to_string(),
                        row_number,
                        raw,
                    });
                    continue;
                }
                let state = index.map.entry(key).or_default();
                if state.in_file {
                    if state.file == row {
                        stats.unchanged += 1;
                    } else {
                        // A conflict: remember both record numbers; the pass will be redone.
                        let first = first_row.get(&key).copied().unwrap_or(0);
                        let rows = found.keys.entry(key).or_insert_with(|| vec![first]);
                        rows.push(row_number);
                        stats.unchanged += 1; // provisional; this pass is discarded
                    }
                    continue;
                }
                state.in_file = true;
                state.file = row;
                if known.keys.is_empty() {
                    first_row.insert(key, row_number);
                }
                if !state.has_current {
                    stats.inserted += 1;
                    keep.push(i as u32);
                } else if state.current != row {
                    stats.updated += 1;
                    keep.push(i as u32);
                } else {
                    stats.unchanged += 1;
                }
            }
            if !found.keys.is_empty() {
                // Keep draining the input to find every conflicting key, but write nothing more.
                continue;
            }
            if !keep.is_empty() {
                let idx = UInt32Array::from(keep);
                let cols = batch
                    .columns
                    .iter()
                    .map(|c| take(c.as_ref(), &idx, None))
                    .collect::<std::result::Result<Vec<_>, _>>()?;
                let out = stamp.stamp(
                    &data_schema,
                    cols,
                    take(&rh, &idx, None)?,
                    take(&fp, &idx, None)?,
                    take(batch.row_numbers.as_ref(), &idx, None)?,
                )?;
                data.write(&out).await?;
                if !midway {
                    midway = true;
                    failpoint::hit("ingest.mid_data")?;
                }
            }
            if let Some(p) = &progress {
                p.set_position(batch.bytes_read.min(record.file_bytes as u64));
            }
        }
        parser
            .await
            .map_err(|e| Error::RunFailed(format!("parser task failed: {e}")))?;
        if let Some(p) = progress {
            p.finish_and_clear();
        }
        if !found.keys.is_empty() {
            // Abandon this pass; its run-scoped files are overwritten by the next one.
            let _ = data.finish().await;
            let _ = failures.finish().await;
            // Collect record numbers of every version of each conflicting key in pass two.
            let keys = found.keys.into_keys().map(|k| (k, Vec::new())).collect();
            return Ok(PassOutcome::Conflicts(Conflicts { keys }));
        }
        // Log every record of each conflicting key, naming its siblings.
        let mut by_key: BTreeMap<(u64, u64), Vec<u64>> = BTreeMap::new();
        for h in &held {
            by_key.entry((h.fp.0, h.fp.1)).or_default().push(h.row_number);
        }
        let names: Vec<&str> = contract
            .natural_key
            .fields
            .iter()
            .map(|&i| contract.fields[i].name.as_str())
            .collect();
        for h in held {
            let others: Vec<String> = by_key
                .get(&(h.fp.0, h.fp.1))
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
                        "natural key ({}) also in record{} {} of this file with different values; the current version stays",
                        names.join(", "),
                        if others.len() == 1 { "" } else { "s" },
                        others.join(", ")
                    ),
                })
                .await?;
        }
        data.finish().await?;
        failpoint::hit("ingest.after_data")?;
        failures.finish().await?;
        failpoint::hit("ingest.after_failures")?;
        stats.ignored = ignored_rx.await.unwrap_or_default();
        Ok(PassOutcome::Done(stats))
    }
}

fn progress_bar(enabled: bool, total: u64, path: &Path) -> Option<indicatif::ProgressBar> {
    if !enabled {
        return None;
    }
    let bar = indicatif::ProgressBar::new(total);
    let style =
        indicatif::ProgressStyle::with_template("{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
            .progress_chars("=> ");
    bar.set_style(style);
    bar.set_message(
        path.file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
    );
    Some(bar)
}
