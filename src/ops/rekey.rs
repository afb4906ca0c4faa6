//! `ingot rekey <source>`: move a source's bronze to a new natural-key definition as one committed
//! run.
//!
//! A fingerprint is `sha256("{natural_key.version}|{v1}|...")` (docs/formats.md#hashes), so a change of the
//! contract's `natural_key` (its fields, their `normalize`, or just its version) changes every
//! record's identity. Ingest refuses to mix versions ([`check_key_version`]): until the source is
//! re-keyed, every ingest of it fails with exit 2 naming both versions and this command.
//!
//! Invariants: bronze stays append-only (one new version per current record, under the new key,
//! with `previous_natural_key_fingerprint`); two records the new key merges with different
//! contents are a conflict, never a silent pick ([`log_conflicts`]); the commit and its undo are
//! those of an ingest ([`rekey`]). What is written: [`rekey_locked`].

use std::collections::BTreeMap;
use std::sync::Arc;

use datafusion::arrow::array::TimestampMicrosecondArray;
use datafusion::arrow::array::{Array, ArrayRef, AsArray, Int32Array, RecordBatch, StringArray, UInt32Array};
use datafusion::arrow::compute::take;
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::arrow::json::writer::{LineDelimited, WriterBuilder};
use datafusion::prelude::SessionContext;
use futures::StreamExt;

use crate::engine::catalog::current_runs;
use crate::engine::session::Workspace;
use crate::error::{Error, Result};
pub use crate::ingest::key_version::{check_key_version, lake_key_version};
use crate::ingest::keys::{Classifier, Fate, Fp, InMemory, StrColumn, fp_key};
use crate::ingest::pass::Hashers;
use crate::ingest::sink::{NATURAL_KEY_INVALID, key_part_problem};
use crate::spec::contract::Contract;
use crate::table::audit::{FailureRow, FailureWriter, RunRecord, RunStatus, commit_run_record, next_seq, read_run_log};
use crate::table::bronze::{IS_DELETED, PREVIOUS_FINGERPRINT, RunFileWriter};
use crate::table::evolve::StoredRun;
use crate::table::failpoint;
use crate::table::lake::layout;

/// The rule of a rekey conflict in `audit.row_failure_log`.
pub const REKEY_CONFLICT: &str = "rekey_conflict";

/// What `ingot rekey` did.
#[derive(Debug, Clone)]
pub enum Rekeyed {
    /// The committed rekey run.
    Run(Box<RunRecord>),
    /// Nothing to do, and why.
    Nothing(String),
}

impl Rekeyed {
    /// One line for people.
    pub fn describe(&self) -> String {
        match self {
            Rekeyed::Run(r) => format!(
                "re-keyed {} from natural_key v{} to v{}: {} current records, {} written under the new key, {} merged \
                 (same contents), {} in conflict (rule {REKEY_CONFLICT} in audit.row_failure_log) [run {}]",
                r.source,
                r.previous_natural_key_version.unwrap_or_default(),
                r.natural_key_version.unwrap_or_default(),
                r.rows_seen,
                r.rows_inserted,
                r.rows_unchanged,
                r.rows_failed,
                r.run_id
            ),
            Rekeyed::Nothing(why) => why.clone(),
        }
    }
}

/// Why undoing `run` would mix key versions, if it would.
pub fn undo_blocker(runs: &[RunRecord], run: &RunRecord) -> Option<String> {
    let loaded: Vec<&RunRecord> = runs
        .iter()
        .filter(|r| r.source == run.source && r.status.is_loaded())
        .collect();
    let pos = loaded.iter().position(|r| r.run_id == run.run_id)?;
    if run.is_rekey() {
        let later: Vec<&str> = loaded[pos + 1..]
            .iter()
            .filter(|r| r.has_data())
            .map(|r| r.run_id.as_str())
            .collect();
        if !later.is_empty() {
            return Some(format!(
                "cannot undo rekey run {} of {}: the runs after it were keyed with natural_key version {} ({}); undo \
                 them first (latest first), then the rekey",
                run.run_id,
                run.source,
                run.natural_key_version.unwrap_or_default(),
                later.join(", ")
            ));
        }
        return None;
    }
    let rekey = loaded[pos + 1..].iter().rev().find(|r| r.is_rekey())?;
    Some(format!(
        "cannot undo run {} of {} alone: rekey run {} (natural_key v{} -> v{}) came after it and wrote its current \
         records under the new key; undo the rekey run first (and any run after it), then this run",
        run.run_id,
        run.source,
        rekey.run_id,
        rekey.previous_natural_key_version.unwrap_or_default(),
        rekey.natural_key_version.unwrap_or_default()
    ))
}

/// Re-key `contract.source` under the contract's natural key (see the module documentation).
///
/// Same protocol as an ingest (see [`crate::table::lake`]): under the source's lock, the data file, then
/// the failure file, then the run record into the source's next slot with a create-if-absent put.
/// A crash before the put leaves orphans nothing reads; running `ingot rekey` again starts over
/// (failpoints [`crate::table::failpoint::REKEY`]); after the put, it says the source is keyed already.
/// `ingot undo <rekey run>` restores the old keys (the rekey run's file stops counting, so the runs
/// before it are the current state again); it is refused while runs after the rekey exist (they
/// were keyed with the new key: undo them first), and a run from before the rekey cannot be undone
/// alone (undo the rekey first).
///
/// Memory: two key indexes ([`InMemory`], about 32 bytes a slot each: old and new fingerprints);
/// the data streams in batches, read twice (once to find conflicts, once to write).
pub async fn rekey(ws: &Workspace, contract: Arc<Contract>) -> Result<Rekeyed> {
    let holder = format!("rekey-{}", ws.new_id());
    // the rekey run's id, named in the lock so that gc keeps its files while it runs
    let run_id = ws.new_id();
    let scope = crate::table::lock::Scope::Source(&contract.source);
    let ttl = crate::table::lock::default_ttl();
    let lock =
        crate::table::lock::acquire_for(&ws.lake, scope, &holder, vec![run_id.clone()], ttl, ws.lock_wait).await?;
    let result = async {
        failpoint::hit("rekey.after_lock")?;
        let runs = read_run_log(&ws.lake).await?;
        rekey_locked(ws, &contract, &runs, run_id).await
    }
    .await;
    if matches!(result, Ok(Rekeyed::Run(_))) {
        failpoint::hit("rekey.after_commit")?;
    }
    lock.release().await?;
    result
}

/// Bronze is append-only, and a rekey keeps it so. The rekey run reads the source's current state
/// (the runs of [`crate::engine::catalog::current_runs`], newest first, so the first row of an old
/// fingerprint is that record's current version; a record whose latest version is a tombstone is
/// not current) and appends one version per current record under the new key to its own
/// run-scoped file: the record's fields, `row_hash`, `file_hash`, `contract_version` and
/// `source_row_number` as they were, `natural_key_fingerprint` and `natural_key_version` under
/// the new key, `previous_natural_key_fingerprint` = the fingerprint it had, `ingestion_run_id` and
/// `ingested_at` of the rekey run. From that run on, `bronze.<source>_current`, change detection
/// and silver builds read only the rekey run and the runs after it; the older versions stay in
/// `bronze.<source>` under the fingerprint they were written with (their `natural_key_version` says
/// which), reachable from the new key through `previous_natural_key_fingerprint`. The next silver
/// build removes the old fingerprints and adds the new ones (a full and an incremental build agree).
async fn rekey_locked(ws: &Workspace, contract: &Arc<Contract>, runs: &[RunRecord], run_id: String) -> Result<Rekeyed> {
    let source = &contract.source;
    let new_version = contract.natural_key.version as i32;
    let Some(old_version) = lake_key_version(ws, runs, source).await? else {
        return Ok(Rekeyed::Nothing(format!(
            "{source}: bronze.{source} holds no records yet: nothing to re-key (ingest with the new key directly)"
        )));
    };
    if old_version == new_version {
        return Ok(Rekeyed::Nothing(format!(
            "{source}: bronze.{source} is keyed with natural_key version {new_version} already, as {} says: nothing \
             to do (when you change the natural key's fields, also raise its version)",
            contract.path.display()
        )));
    }
    let current = current_runs(runs, source);
    let ctx = ws.session()?;
    let key_names = contract.natural_key_names();
    for r in &current {
        let schema =
            crate::engine::catalog::file_schema(&ctx, &ws.lake, &layout::bronze_data(source, &r.run_id)).await?;
        let has = |n: &str| schema.field_with_name(n).is_ok();
        let renamed = |n: &str| {
            contract
                .field_index(n)
                .and_then(|i| contract.fields[i].renamed_from.as_deref())
        };
        if let Some(missing) = key_names
            .iter()
            .find(|n| !has(n) && renamed(n).is_none_or(|old| !has(old)))
        {
            return Err(Error::Invalid(format!(
                "{source}: the new natural key needs field \"{missing}\", which bronze run {} does not have (it was \
                 loaded under an older contract); natural-key fields must exist in the stored records. Fields it \
                 has: {}",
                r.run_id,
                schema
                    .fields()
                    .iter()
                    .map(|f| f.name().as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
    }

    let started_at = crate::table::audit::not_before(runs, source, ws.now_micros());
    let mut record = RunRecord {
        run_id: run_id.clone().into(),
        source: source.as_str().into(),
        contract_version: contract.version as i32,
        file_path: format!("rekey {source}: natural_key v{old_version} -> v{new_version}").into(),
        file_hash: None,
        file_bytes: 0,
        started_at,
        finished_at: started_at,
        status: RunStatus::Succeeded,
        rows_seen: 0,
        rows_inserted: 0,
        rows_updated: 0,
        rows_unchanged: 0,
        rows_failed: 0,
        replay_of: None,
        error: None,
        ingot_version: crate::table::audit::INGOT_VERSION.into(),
        ignored_columns: None,
        rolled_back_at: None,
        rows_deleted: 0,
        natural_key_version: Some(new_version),
        previous_natural_key_version: Some(old_version),
        natural_key_definition: Some(contract.key_definition().into()),
        rows_superseded: 0,
        contract_fields: Some(contract.fields_definition().into()),
        failure_class: None,
        held_reason: None,
        decided_at: None,
        data_file: None,
        failure_file: None,
        pull: None,
        seq: next_seq(runs, source),
    };
    let hashers = Hashers::new(&ctx, contract)?;
    let newest_first: Vec<&RunRecord> = current.iter().rev().copied().collect();
    let urls = crate::table::evolve::stored_runs(&ws.lake, contract, &newest_first)?;
    let capacity = current.iter().map(|r| r.rows_inserted.max(0) as usize).sum::<usize>();

    // Pass 1: which new fingerprints do current records with different contents share?
    let mut new_keys = InMemory::new(capacity);
    let mut scan = CurrentScan::new(&ctx, contract, &hashers, &urls, capacity)?;
    while let Some(rows) = scan.next().await? {
        for k in (0..rows.len()).filter(|&k| rows.invalid[k].is_none()) {
            new_keys.classify(rows.new_key[k], rows.row_hash(k)?, 0);
        }
    }
    new_keys.rerun_with_found();

    // Pass 2: write one version per new fingerprint; log the records in conflict.
    let schema = contract.bronze_schema();
    let mut data = RunFileWriter::new(&ws.lake, layout::bronze_data(source, &run_id), schema.clone());
    let mut failures = FailureWriter::new(&ws.lake, &run_id, source, started_at);
    let mut held: Vec<Held> = Vec::new();
    let (mut written, mut merged, mut conflicting) = (0u64, 0u64, 0u64);
    let names: Vec<String> = contract.fields.iter().map(|f| f.name.clone()).collect();
    let mut scan = CurrentScan::new(&ctx, contract, &hashers, &urls, capacity)?;
    while let Some(rows) = scan.next().await? {
        let mut keep: Vec<usize> = Vec::new();
        let mut clash: Vec<usize> = Vec::new();
        conflicting += log_invalid(&rows, &names, &mut failures).await?;
        for k in (0..rows.len()).filter(|&k| rows.invalid[k].is_none()) {
            match new_keys.classify(rows.new_key[k], rows.row_hash(k)?, 0) {
                Fate::Inserted => keep.push(k),
                Fate::Conflict => clash.push(k),
                Fate::Unchanged | Fate::Updated => merged += 1,
            }
        }
        if !keep.is_empty() {
            written += keep.len() as u64;
            data.write(&rows.rekeyed(&keep, &run_id, new_version, started_at, &schema)?)
                .await?;
        }
        if !clash.is_empty() {
            conflicting += clash.len() as u64;
            held.extend(rows.held(&clash, &names)?);
        }
    }
    record.data_file = data.finish_stamped().await?.1;
    failpoint::hit("rekey.after_data")?;
    log_conflicts(contract, new_version, held, &mut failures).await?;
    record.failure_file = failures.finish_stamped().await?.1;
    failpoint::hit("rekey.after_failures")?;

    record.rows_seen = (written + merged + conflicting) as i64;
    record.rows_inserted = written as i64;
    record.rows_unchanged = merged as i64;
    record.rows_failed = conflicting as i64;
    record.status = if conflicting > 0 {
        RunStatus::SucceededWithFailures
    } else {
        RunStatus::Succeeded
    };
    record.finished_at = ws.now_micros().max(record.started_at);
    commit_run_record(&ws.lake, &record, None, "rekey.before_commit", Some(contract)).await?;
    Ok(Rekeyed::Run(Box::new(record)))
}

/// The current records of one bronze batch.
struct CurrentRows {
    batch: RecordBatch,
    /// Row index in `batch` of each current record.
    index: Vec<u32>,
    /// The new fingerprint (hex) of every row of the batch.
    new_fp: StringArray,
    /// The new key of each current record.
    new_key: Vec<Fp>,
    /// Why the new key cannot name each current record, if it cannot (rule `natural_key_invalid`:
    /// a null part, a part empty after normalize, `|` in a part of a composite key).
    invalid: Vec<Option<String>>,
    fp_col: usize,
    rh_col: usize,
}

impl CurrentRows {
    fn len(&self) -> usize {
        self.index.len()
    }

    fn text(&self, col: usize, row: u32) -> Result<&str> {
        StrColumn::new(self.batch.column(col))
            .map(|c| c.value(row as usize))
            .ok_or_else(|| Error::RunFailed("a bronze hash column is not text".into()))
    }

    fn old_fp(&self, k: usize) -> Result<&str> {
        self.text(self.fp_col, self.index[k])
    }

    fn row_hash(&self, k: usize) -> Result<u64> {
        crate::ingest::keys::hex_u64(self.text(self.rh_col, self.index[k])?.as_bytes())
            .ok_or_else(|| Error::RunFailed("a bronze row_hash is not a SHA-256 in hex".into()))
    }

    /// Current records `pick` (positions in `index`) as versions of the rekey run.
    fn rekeyed(
        &self,
        pick: &[usize],
        run_id: &str,
        version: i32,
        ingested_at: i64,
        schema: &datafusion::arrow::datatypes::SchemaRef,
    ) -> Result<RecordBatch> {
        let idx = UInt32Array::from(pick.iter().map(|&k| self.index[k]).collect::<Vec<_>>());
        let n = pick.len();
        let mut columns: Vec<ArrayRef> = self
            .batch
            .columns()
            .iter()
            .map(|c| take(c.as_ref(), &idx, None))
            .collect::<std::result::Result<_, _>>()?;
        let old_fp = take(self.batch.column(self.fp_col).as_ref(), &idx, None)?;
        let new_fp = take(&self.new_fp, &idx, None)?;
        let mut set = |name: &str, a: ArrayRef| -> Result<()> {
            columns[schema.index_of(name)?] = a;
            Ok(())
        };
        set("ingestion_run_id", Arc::new(StringArray::from(vec![run_id; n])))?;
        set("natural_key_fingerprint", new_fp)?;
        set("natural_key_version", Arc::new(Int32Array::from(vec![version; n])))?;
        set(
            "ingested_at",
            Arc::new(TimestampMicrosecondArray::from(vec![ingested_at; n]).with_timezone("UTC")),
        )?;
        set(
            PREVIOUS_FINGERPRINT,
            datafusion::arrow::compute::cast(&old_fp, &DataType::Utf8)?,
        )?;
        Ok(RecordBatch::try_new(schema.clone(), columns)?)
    }

    /// Current records `pick` as conflict rows: their fields as one JSON object each.
    fn held(&self, pick: &[usize], names: &[String]) -> Result<Vec<Held>> {
        let idx = UInt32Array::from(pick.iter().map(|&k| self.index[k]).collect::<Vec<_>>());
        let fields: Vec<ArrayRef> = self.batch.columns()[..names.len()]
            .iter()
            .map(|c| take(c.as_ref(), &idx, None))
            .collect::<std::result::Result<_, _>>()?;
        let schema = Arc::new(Schema::new(
            names
                .iter()
                .zip(&fields)
                .map(|(n, c)| Field::new(n, c.data_type().clone(), true))
                .collect::<Vec<_>>(),
        ));
        let mut buf = Vec::new();
        {
            let mut w = WriterBuilder::new()
                .with_explicit_nulls(true)
                .build::<_, LineDelimited>(&mut buf);
            w.write(&RecordBatch::try_new(schema, fields)?)?;
            w.finish()?;
        }
        let text = String::from_utf8_lossy(&buf);
        let numbers = self.batch.column(self.batch.schema().index_of("source_row_number")?);
        let numbers = datafusion::arrow::compute::cast(numbers, &DataType::Int64)?;
        let numbers = numbers.as_primitive::<datafusion::arrow::datatypes::Int64Type>();
        pick.iter()
            .zip(text.lines())
            .map(|(&k, line)| {
                let i = self.index[k] as usize;
                Ok(Held {
                    new_fp: self.new_fp.value(i).to_string(),
                    old_fp: self.old_fp(k)?.to_string(),
                    row_number: numbers.is_valid(i).then(|| numbers.value(i)),
                    payload: line.to_string(),
                })
            })
            .collect()
    }
}

/// Streams the current records of the source: the files newest first, where the first row of an
/// old fingerprint is the record's current version (unless it is a tombstone), with their new keys.
struct CurrentScan<'a> {
    ctx: &'a SessionContext,
    contract: &'a Contract,
    hashers: &'a Hashers,
    urls: &'a [StoredRun],
    next_url: usize,
    /// The run being read was written under other fields: recompute its row hashes.
    rehash: bool,
    norm: String,
    scratch: String,
    stream: Option<datafusion::execution::SendableRecordBatchStream>,
    old_keys: InMemory,
    fp_col: usize,
    rh_col: usize,
    del_col: usize,
}

impl<'a> CurrentScan<'a> {
    fn new(
        ctx: &'a SessionContext,
        contract: &'a Contract,
        hashers: &'a Hashers,
        urls: &'a [StoredRun],
        capacity: usize,
    ) -> Result<CurrentScan<'a>> {
        let schema = contract.bronze_schema();
        Ok(CurrentScan {
            ctx,
            contract,
            hashers,
            urls,
            next_url: 0,
            rehash: false,
            norm: String::new(),
            scratch: String::new(),
            stream: None,
            old_keys: InMemory::new(capacity),
            fp_col: schema.index_of("natural_key_fingerprint")?,
            rh_col: schema.index_of("row_hash")?,
            del_col: schema.index_of(IS_DELETED)?,
        })
    }

    /// Why row `i` of `fields` (contract fields) cannot be keyed under the new natural key, if so.
    fn key_problem(&mut self, fields: &RecordBatch, i: usize) -> Option<String> {
        let composite = self.contract.natural_key.fields.len() > 1;
        for &f in &self.contract.natural_key.fields {
            let column = fields.column(f);
            let text = if column.is_null(i) {
                None
            } else {
                Some(StrColumn::new(column).map_or("", |c| c.value(i)))
            };
            let field = &self.contract.fields[f];
            if let Some(r) = key_part_problem(field, text, composite, &mut self.norm, &mut self.scratch) {
                return Some(r.reason);
            }
        }
        None
    }

    /// The next batch with at least one current record.
    async fn next(&mut self) -> Result<Option<CurrentRows>> {
        loop {
            let batch = match self.stream.as_mut() {
                Some(s) => s.next().await.transpose()?,
                None => None,
            };
            let Some(batch) = batch else {
                let Some(stored) = self.urls.get(self.next_url) else {
                    return Ok(None);
                };
                self.next_url += 1;
                self.rehash = stored.rehash(self.contract);
                let df = crate::table::evolve::read_stored(self.ctx, self.contract, &[stored])?;
                self.stream = Some(df.execute_stream().await?);
                continue;
            };
            let damaged =
                |what: &str| Error::RunFailed(format!("a bronze file of the source: column {what} is damaged"));
            let fields = RecordBatch::try_new(
                self.contract.fields_schema(),
                batch.columns()[..self.contract.fields.len()].to_vec(),
            )?;
            let new_fp = self.hashers.fingerprint(&fields)?;
            // A run written under other fields: its versions carry the hash the contract gives them.
            let batch = if self.rehash {
                let mut columns = batch.columns().to_vec();
                columns[self.rh_col] = Arc::new(self.hashers.row_hashes(&fields)?);
                RecordBatch::try_new(batch.schema(), columns)?
            } else {
                batch
            };
            let old_fp = StrColumn::new(batch.column(self.fp_col)).ok_or_else(|| damaged("natural_key_fingerprint"))?;
            let deleted = batch.column(self.del_col).as_boolean_opt();
            let mut index = Vec::new();
            let mut new_key = Vec::new();
            let mut invalid = Vec::new();
            for i in 0..batch.num_rows() {
                let Some(key) = batch
                    .column(self.fp_col)
                    .is_valid(i)
                    .then(|| fp_key(old_fp.value(i)))
                    .flatten()
                else {
                    return Err(damaged("natural_key_fingerprint"));
                };
                // The first row of an old key (newest first) is its latest version.
                if self.old_keys.classify(key, 0, 0) != Fate::Inserted
                    || deleted.is_some_and(|d| d.is_valid(i) && d.value(i))
                {
                    continue;
                }
                index.push(i as u32);
                new_key.push(fp_key(new_fp.value(i)).ok_or_else(|| damaged("the new fingerprint"))?);
                invalid.push(self.key_problem(&fields, i));
            }
            if index.is_empty() {
                continue;
            }
            return Ok(Some(CurrentRows {
                batch,
                index,
                new_fp,
                new_key,
                invalid,
                fp_col: self.fp_col,
                rh_col: self.rh_col,
            }));
        }
    }
}

/// A record in conflict, logged when all of its key's records are known.
struct Held {
    new_fp: String,
    old_fp: String,
    row_number: Option<i64>,
    payload: String,
}

/// Log every record of each conflicting new key, naming the others.
///
/// Two current records that the new key maps to one fingerprint:
///
/// * with the same `row_hash` (the same contents), they become one record: the newer is written,
///   the other counts as `unchanged`;
/// * with different contents, that is a conflict, treated like an in-file natural-key conflict of
///   an ingest: ingot will not pick one. Every record of the key is logged to
///   `audit.row_failure_log` with rule `rekey_conflict`, the new fingerprint, its record number and
///   its bronze fields as JSON (`raw_payload`), and a reason naming the others' previous
///   fingerprints; none of them is current under the new key (they disappear from `_current` and,
///   at the next build, from silver) until a delivery brings that key again (it is then
///   `inserted`). Their versions stay in `bronze.<source>` under the old key.
///
/// The run record: `file_path` `rekey <source>: natural_key v<old> -> v<new>`, no file hash,
/// `natural_key_version` = the new version and `previous_natural_key_version` = the old one (which
/// marks a rekey run); `rows_seen` current records read, `rows_inserted` written under the new key,
/// `rows_unchanged` merged duplicates, `rows_failed` records in conflict, so it reconciles like any
/// run.
/// Log the records of `rows` the new key cannot name (rule `natural_key_invalid`); how many.
async fn log_invalid(rows: &CurrentRows, names: &[String], failures: &mut FailureWriter) -> Result<u64> {
    let bad: Vec<usize> = (0..rows.len()).filter(|&k| rows.invalid[k].is_some()).collect();
    if bad.is_empty() {
        return Ok(0);
    }
    for (h, &k) in rows.held(&bad, names)?.into_iter().zip(&bad) {
        failures
            .push(FailureRow {
                source_row_number: h.row_number,
                natural_key_fingerprint: Some(h.new_fp),
                raw_payload: h.payload,
                rule: NATURAL_KEY_INVALID.into(),
                reason: rows.invalid[k].clone().unwrap_or_default(),
            })
            .await?;
    }
    Ok(bad.len() as u64)
}

async fn log_conflicts(contract: &Contract, version: i32, held: Vec<Held>, failures: &mut FailureWriter) -> Result<()> {
    let mut by_key: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for h in &held {
        by_key.entry(h.new_fp.clone()).or_default().push(h.old_fp.clone());
    }
    let names = contract.natural_key_names();
    for h in held {
        let others: Vec<&str> = by_key
            .get(&h.new_fp)
            .map(|v| v.iter().filter(|o| **o != h.old_fp).map(String::as_str).collect())
            .unwrap_or_default();
        let reason = format!(
            "natural key ({}) v{version} gives this record (previous fingerprint {}) the fingerprint of {} other \
             current record{} with different contents (previous fingerprint{} {}); none of them is current under the \
             new key until a delivery brings it again",
            names.join(", "),
            h.old_fp,
            others.len(),
            if others.len() == 1 { "" } else { "s" },
            if others.len() == 1 { "" } else { "s" },
            others.join(", ")
        );
        failures
            .push(FailureRow {
                source_row_number: h.row_number,
                natural_key_fingerprint: Some(h.new_fp),
                raw_payload: h.payload,
                rule: REKEY_CONFLICT.into(),
                reason,
            })
            .await?;
    }
    Ok(())
}
