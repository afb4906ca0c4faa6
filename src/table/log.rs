//! The machinery every commit log shares (the run log and the build log, [`crate::table::audit`]):
//! a log is a folder of one-record Parquet files named by their slot (`<digits>.parquet`), each
//! put create-if-absent, read back in slot order; within a log the record in the highest slot
//! stands for its id. Objects that are not `<digits>.parquet`, and records no reader can parse,
//! are not part of a log: every reader skips them and `ingot doctor` reports them.
//!
//! A log folder (one source's runs, one table's builds) also keeps checkpoints, under
//! `_cache/log/<log>/<name>/<through>.parquet` ([`Checkpointed`]): the records standing for
//! their ids after the records through slot `through`, written every `checkpoint_every` commits ([`crate::table::lake::Cadence`]). A reader
//! takes the latest checkpoint whose last record is still the one it names, then lists only the
//! records after it. A checkpoint is a cache, never the truth: a missing, damaged or stale one
//! is passed over (the reader folds every record), and `ingot doctor` compares each with the
//! records it summarizes.

use std::sync::Arc;

use bytes::Bytes;
use datafusion::arrow::array::{Array, ArrayRef, AsArray, Int64Array, RecordBatch, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, Int32Type, Int64Type, SchemaRef, TimestampMicrosecondType};
use datafusion::parquet::arrow::arrow_reader::{ArrowReaderOptions, ParquetRecordBatchReaderBuilder};
use futures::StreamExt;
use object_store::ObjectStoreExt;

use crate::error::{Error, Result};
use crate::table::lake::{Lake, layout};

/// The slot a log file name stands for: `<digits>.parquet`.
pub(crate) fn slot_of(name: Option<&str>) -> Option<u64> {
    let digits = name?.strip_suffix(".parquet")?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// One record per id: the one in the highest slot, in slot order. A log is append-only; `ingot undo` marks a run
/// or build `rolled_back` by committing a copy of its record, with the new status, into the next
/// slot, and that copy supersedes the original everywhere (catalog, audit tables, next slot).
pub(crate) fn latest_per_id<T>(records: Vec<T>, id: impl Fn(&T) -> &str, seq: impl Fn(&T) -> u64) -> Vec<T> {
    // positions of the winners, found with borrowed ids (a long log: no key copied)
    let mut best: std::collections::HashMap<&str, usize> = std::collections::HashMap::with_capacity(records.len());
    for (i, r) in records.iter().enumerate() {
        match best.get(id(r)) {
            Some(&have) if seq(&records[have]) >= seq(r) => {}
            _ => {
                best.insert(id(r), i);
            }
        }
    }
    let mut keep = vec![false; records.len()];
    for i in best.into_values() {
        keep[i] = true;
    }
    let mut out: Vec<T> = records
        .into_iter()
        .zip(keep)
        .filter(|(_, k)| *k)
        .map(|(r, _)| r)
        .collect();
    out.sort_by_key(|r| seq(r));
    out
}

/// Typed access to the columns of a log record batch, with errors naming the log and column.
pub(crate) struct LogColumns<'a> {
    pub(crate) batch: &'a RecordBatch,
    pub(crate) log: &'static str,
    /// Column positions by name, looked up once per batch (records are read row by row).
    index: std::collections::HashMap<&'a str, usize>,
}

impl<'a> LogColumns<'a> {
    pub(crate) fn new(batch: &'a RecordBatch, log: &'static str) -> LogColumns<'a> {
        let index = batch
            .schema_ref()
            .fields()
            .iter()
            .enumerate()
            .map(|(i, f)| (f.name().as_str(), i))
            .collect();
        LogColumns { batch, log, index }
    }

    /// Does the batch have the column (older records lack the later ones)?
    pub(crate) fn has(&self, name: &str) -> bool {
        self.index.contains_key(name)
    }

    pub(crate) fn col(&self, name: &str) -> Result<&'a ArrayRef> {
        self.index
            .get(name)
            .map(|&i| self.batch.column(i))
            .ok_or_else(|| Error::RunFailed(format!("{} record lacks column {name}", self.log)))
    }

    pub(crate) fn bad(&self, name: &str, what: &str) -> Error {
        Error::RunFailed(format!("{} column {name} is not {what}", self.log))
    }

    pub(crate) fn str(&self, name: &str) -> Result<&'a StringArray> {
        self.col(name)?
            .as_string_opt::<i32>()
            .ok_or_else(|| self.bad(name, "utf8"))
    }

    pub(crate) fn i64(&self, name: &str) -> Result<&'a datafusion::arrow::array::PrimitiveArray<Int64Type>> {
        self.col(name)?
            .as_primitive_opt::<Int64Type>()
            .ok_or_else(|| self.bad(name, "int64"))
    }

    pub(crate) fn i32(&self, name: &str) -> Result<&'a datafusion::arrow::array::PrimitiveArray<Int32Type>> {
        self.col(name)?
            .as_primitive_opt::<Int32Type>()
            .ok_or_else(|| self.bad(name, "int32"))
    }

    pub(crate) fn ts(
        &self,
        name: &str,
    ) -> Result<&'a datafusion::arrow::array::PrimitiveArray<TimestampMicrosecondType>> {
        self.col(name)?
            .as_primitive_opt::<TimestampMicrosecondType>()
            .ok_or_else(|| self.bad(name, "a timestamp"))
    }

    /// A nullable timestamp of a column that older records may lack (`None` then).
    pub(crate) fn opt_ts(&self, name: &str, row: usize) -> Result<Option<i64>> {
        if !self.has(name) {
            return Ok(None);
        }
        let a = self.ts(name)?;
        Ok((!a.is_null(row)).then(|| a.value(row)))
    }

    /// A nullable text value.
    pub(crate) fn opt(&self, name: &str, row: usize) -> Result<Option<String>> {
        let a = self.str(name)?;
        Ok((!a.is_null(row)).then(|| a.value(row).to_string()))
    }

    pub(crate) fn text(&self, name: &str, row: usize) -> Result<String> {
        Ok(self.str(name)?.value(row).to_string())
    }
}

/// How log records and checkpoints are read: without decoding the Arrow schema stored in their
/// metadata (the columns are read by name and physical type, so the Parquet schema says enough),
/// which is a good part of reading a one-record file.
fn reader_options() -> ArrowReaderOptions {
    ArrowReaderOptions::new().with_skip_arrow_metadata(true)
}

/// The records of one log file's bytes.
pub(crate) fn parse_record<T>(
    bytes: Bytes,
    log: &'static str,
    parse: &impl Fn(&LogColumns<'_>) -> Result<Vec<T>>,
) -> Result<Vec<T>> {
    let reader = ParquetRecordBatchReaderBuilder::try_new_with_options(bytes, reader_options())
        .and_then(|b| b.build())
        .map_err(|e| Error::RunFailed(format!("unreadable {log} record: {e}")))?;
    let mut out = Vec::new();
    for batch in reader {
        let batch = batch.map_err(|e| Error::RunFailed(format!("unreadable {log} record: {e}")))?;
        out.extend(parse(&LogColumns::new(&batch, log))?);
    }
    Ok(out)
}

/// Put a commit record into slot `seq` of `name`, create-if-absent: the slot taken, or `None` when
/// the slot holds another commit. A slot holding an object no reader can parse is not a commit
/// (every reader skips it): the record goes into the next free slot instead, and the record's
/// slot is then that one (readers give a record the slot its file name says). The slot taken
/// goes into the folder's tail hint.
pub(crate) async fn put_record<T: Record>(lake: &Lake, name: &str, mut seq: u64, bytes: Bytes) -> Result<Option<u64>> {
    loop {
        let rel = slot_rel::<T>(name, seq);
        if lake.put_create(&rel, bytes.clone()).await? {
            hint_tail::<T>(lake, name, seq).await;
            return Ok(Some(seq));
        }
        match lake.get(&rel).await? {
            Some(taken) if parse_record(taken.clone(), T::LOG, &T::parse).is_err() => seq += 1,
            _ => return Ok(None),
        }
    }
}

/// A kind of commit record and the log it is kept in.
pub(crate) trait Record: Sized + Send + 'static {
    /// The log folder (`audit/ingestion_run_log`), with one subfolder per name.
    const DIR: &'static str;
    /// What errors call the log (`run log`).
    const LOG: &'static str;
    fn schema() -> SchemaRef;
    fn parse(c: &LogColumns<'_>) -> Result<Vec<Self>>;
    /// [`Record::parse`], appending to `out`.
    fn parse_into(c: &LogColumns<'_>, out: &mut Vec<Self>) -> Result<()> {
        out.extend(Self::parse(c)?);
        Ok(())
    }
    /// The record as a one-row batch of [`Record::schema`].
    fn to_batch(&self) -> Result<RecordBatch>;
    /// The records as one batch of [`Record::schema`] (a checkpoint's rows).
    fn batch_of(records: &[Self]) -> Result<RecordBatch> {
        let batches = records.iter().map(|r| r.to_batch()).collect::<Result<Vec<_>>>()?;
        Ok(datafusion::arrow::compute::concat_batches(&Self::schema(), &batches)?)
    }
    /// The id a later record of the same id supersedes.
    fn id(&self) -> &str;
    fn seq(&self) -> u64;
    fn set_seq(&mut self, seq: u64);
}

/// The column of a checkpoint that holds each record's slot.
pub const SLOT: &str = "__ingot_slot";
/// The checkpoint's column [`SLOT`].
pub fn slot_field() -> Field {
    Field::new(SLOT, DataType::Int64, false)
}

/// The checkpoint's key-value metadata: JSON with `through`, `records` and `through_sha256`.
const META: &str = "ingot.checkpoint";

/// The records of one log folder, one per id, in slot order, and how they were read.
pub(crate) struct Checkpointed<T> {
    pub(crate) records: Vec<T>,
    /// The checkpoint the read started from (its `through` slot), if any was usable.
    pub(crate) checkpoint: Option<u64>,
    /// The highest slot holding a record (0 for an empty log).
    pub(crate) last_slot: u64,
}

fn folder<T: Record>(name: &str) -> String {
    format!("{}/{name}", T::DIR)
}

fn slot_rel<T: Record>(name: &str, slot: u64) -> String {
    format!("{}/{slot:010}.parquet", folder::<T>(name))
}

/// Read one log folder (`name`: a source, a table) through its latest usable checkpoint.
pub(crate) async fn read_checkpointed<T: Record>(lake: &Lake, name: &str) -> Result<Checkpointed<T>> {
    let mut base: Vec<T> = Vec::new();
    let mut checkpoint = None;
    // newest first; a checkpoint that does not check out is passed over
    for file in lake
        .list_names(&layout::log_checkpoints(T::DIR, name))
        .await?
        .into_iter()
        .rev()
    {
        let Some(through) = slot_of(Some(&file)) else {
            continue;
        };
        if let Ok(records) = load_checkpoint::<T>(lake, name, through).await {
            base = records;
            checkpoint = Some(through);
            break;
        }
    }
    let tail = records_after::<T>(lake, name, checkpoint.unwrap_or(0)).await?;
    let last_slot = tail.iter().map(|r| r.seq()).fold(checkpoint.unwrap_or(0), u64::max);
    let records = if checkpoint.is_some() {
        // a checkpoint holds one record per id, in slot order: only the few records after it can
        // supersede one (no map over the whole history)
        let tail = latest_per_id(tail, |r| r.id(), |r| r.seq());
        if !tail.is_empty() {
            let later: hashbrown::HashSet<&str> = tail.iter().map(|r| r.id()).collect();
            base.retain(|r| !later.contains(r.id()));
        }
        if !base.is_sorted_by_key(|r| r.seq()) {
            base.sort_by_key(|r| r.seq());
        }
        base.extend(tail);
        base
    } else {
        latest_per_id(tail, |r| r.id(), |r| r.seq())
    };
    Ok(Checkpointed {
        records,
        checkpoint,
        last_slot,
    })
}

/// The records of `name` in the slots after `through`, one per id, in slot order; `None` when more
/// than `max` slots follow `through` (the folder's tail hint says so, or an object store's
/// listing): reading them one by one would cost more than the checkpoint.
pub(crate) async fn latest_after<T: Record>(lake: &Lake, name: &str, through: u64, max: u64) -> Result<Option<Vec<T>>> {
    let records = if lake.is_remote() {
        // one `start-after` listing says how many follow
        let listed = lake
            .list_after(&folder::<T>(name), &slot_rel::<T>(name, through))
            .await?;
        if listed.len() as u64 > max {
            return Ok(None);
        }
        read_records::<T>(lake, listed).await?
    } else {
        let hint = read_tail_hint::<T>(lake, name).await;
        if hint.is_some_and(|h| h > through.saturating_add(max)) {
            return Ok(None);
        }
        records_after::<T>(lake, name, through).await?
    };
    Ok(Some(latest_per_id(records, |r| r.id(), |r| r.seq())))
}

/// The file of a log folder's tail hint: the last slot a commit put a record into (decimal text).
fn tail_hint<T: Record>(name: &str) -> String {
    format!("{}/tail", layout::log_checkpoints(T::DIR, name))
}

/// The slot the tail hint of `name` holds, if it holds one (a hint that cannot be read is none).
async fn read_tail_hint<T: Record>(lake: &Lake, name: &str) -> Option<u64> {
    lake.get(&tail_hint::<T>(name))
        .await
        .ok()
        .flatten()
        .and_then(|b| std::str::from_utf8(&b).ok()?.trim().parse::<u64>().ok())
}

/// After a commit into `slot` of `name`: say so in the tail hint, unsynced. A hint is only a
/// lower bound a reader checks its probing against; one that is lost or older is harmless.
async fn hint_tail<T: Record>(lake: &Lake, name: &str, slot: u64) {
    if lake.is_remote() {
        return;
    }
    // a hint not written only makes the next reader's gap check weaker
    let _ = lake
        .put_hint(&tail_hint::<T>(name), Bytes::from(slot.to_string()))
        .await;
}

/// The records of `name` in the slots after `through`, in slot order.
///
/// On S3 that is one `start-after` listing. A local folder cannot be listed from an offset (a
/// directory read costs a name per record of the history), so the slots after `through` are
/// read one by one until the first that holds nothing: slots are taken in order and never
/// emptied. A record removed by hand would end that early; so a commit also leaves the slot it
/// took in the tail hint ([`hint_tail`]), and when the reading ends at or below the hint, or
/// there is no hint, the folder is listed instead (a gap in a log: every later record is still
/// read, and `ingot doctor` reports the gap). The slots up to the hint are read concurrently.
async fn records_after<T: Record>(lake: &Lake, name: &str, through: u64) -> Result<Vec<T>> {
    let listed = |lake: &Lake| {
        let (lake, folder) = (lake.clone(), folder::<T>(name));
        let after = (through > 0).then(|| slot_rel::<T>(name, through));
        async move {
            match after {
                Some(after) => lake.list_after(&folder, &after).await,
                None => lake.list(&folder).await,
            }
        }
    };
    if lake.is_remote() {
        return read_records::<T>(lake, listed(lake).await?).await;
    }
    let hint = read_tail_hint::<T>(lake, name).await;
    // without a hint (a folder no commit of this version wrote to, caches removed) nothing
    // bounds a gap: the folder is listed
    let Some(hint) = hint else {
        return read_records::<T>(lake, listed(lake).await?).await;
    };
    // the slots up to the hint were taken: read at once; past it, probe one slot (the hint is
    // written at every commit, so that slot is empty but after a commit that died between its
    // record and its hint), then in growing steps
    let mut out = Vec::new();
    let (mut next, mut step) = (through + 1, 1u64);
    let empty = 'read: loop {
        let (last, past) = if hint >= next {
            (hint, false)
        } else {
            (next + step - 1, true)
        };
        let mut reads = futures::stream::iter(next..=last)
            .map(|slot| {
                let (lake, rel) = (lake.clone(), slot_rel::<T>(name, slot));
                async move {
                    let Some(bytes) = lake.get(&rel).await? else {
                        return Ok((slot, None));
                    };
                    // parsed on the blocking pool, so the records of the tail parse side by side
                    let parsed = tokio::task::spawn_blocking(move || parse_record(bytes, T::LOG, &T::parse))
                        .await
                        .map_err(|e| Error::Internal(format!("parsing a log record: {e}")))?;
                    Ok::<_, Error>((slot, Some(parsed)))
                }
            })
            .buffered(32);
        while let Some(read) = reads.next().await {
            let (slot, parsed) = read?;
            let Some(parsed) = parsed else {
                break 'read slot;
            };
            // an object no reader can parse holds its slot but is no record
            for mut record in parsed.unwrap_or_default() {
                record.set_seq(slot);
                out.push(record);
            }
        }
        next = last + 1;
        if past {
            step = (step * 2).min(32);
        }
    };
    if empty > hint {
        return Ok(out);
    }
    crate::tell!(
        "{}: slot {empty} holds no record, but a commit took slot {hint}: the folder is read whole (`ingot doctor` \
         names the gap)",
        folder::<T>(name)
    );
    read_records::<T>(lake, listed(lake).await?).await
}

/// Every record of the log folder `name`, superseded ones too, in slot order: the history a
/// past state of the log is folded from ([`latest_per_id`] of the records below a slot). Every
/// record is read (a checkpoint holds only the latest state): for the rare command that needs it.
pub(crate) async fn every_record<T: Record>(lake: &Lake, name: &str) -> Result<Vec<T>> {
    let mut every = records_after::<T>(lake, name, 0).await?;
    every.sort_by_key(|r| r.seq());
    Ok(every)
}

/// The records of the listed log objects, each with the slot its name carries. Objects that are
/// not `<digits>.parquet`, and records no reader can parse, are not part of the log: skipped
/// (`ingot doctor` reports them).
async fn read_records<T: Record>(lake: &Lake, listed: Vec<object_store::ObjectMeta>) -> Result<Vec<T>> {
    let mut out = Vec::new();
    for meta in listed {
        let Some(seq) = slot_of(meta.location.filename()) else {
            continue;
        };
        let bytes = lake.store.get(&meta.location).await?.bytes().await?;
        for mut record in parse_record(bytes, T::LOG, &T::parse).unwrap_or_default() {
            record.set_seq(seq);
            out.push(record);
        }
    }
    Ok(out)
}

/// The records of the checkpoint of `name` through slot `through`, if it checks out: it parses,
/// its metadata names `through`, and the record in slot `through` is still the one it folded.
pub(crate) async fn load_checkpoint<T: Record>(lake: &Lake, name: &str, through: u64) -> Result<Vec<T>> {
    let rel = layout::log_checkpoint(T::DIR, name, through);
    let bad = |why: String| Error::RunFailed(format!("checkpoint: {why}"));
    let bytes = lake.get(&rel).await?.ok_or_else(|| bad(format!("{rel} is missing")))?;
    let builder = ParquetRecordBatchReaderBuilder::try_new_with_options(bytes, reader_options())
        .map_err(|e| bad(format!("unreadable: {e}")))?;
    let meta = builder
        .metadata()
        .file_metadata()
        .key_value_metadata()
        .and_then(|kv| kv.iter().find(|k| k.key == META))
        .and_then(|k| k.value.clone())
        .ok_or_else(|| bad(format!("no {META} metadata")))?;
    let meta: serde_json::Value = serde_json::from_str(&meta).map_err(|e| bad(format!("bad metadata: {e}")))?;
    if meta["through"].as_u64() != Some(through) {
        return Err(bad("its metadata names another slot".into()));
    }
    let last = lake
        .get(&slot_rel::<T>(name, through))
        .await?
        .ok_or_else(|| bad(format!("the record in slot {through} it was taken after is gone")))?;
    if meta["through_sha256"].as_str() != Some(crate::hash::sha256_hex(&last).as_str()) {
        return Err(bad(format!(
            "the record in slot {through} is not the one it was taken after"
        )));
    }
    let reader = builder.build().map_err(|e| bad(format!("unreadable: {e}")))?;
    // room for the records after the checkpoint too (at most a cadence of them), which the reader
    // appends: growing a vector of every run of a long history copies all of it
    let headroom = lake.cadence.checkpoint_every.min(1 << 10) as usize;
    let mut out = Vec::with_capacity(meta["records"].as_u64().unwrap_or(0).min(1 << 24) as usize + headroom);
    for batch in reader {
        let batch = batch.map_err(|e| bad(format!("unreadable: {e}")))?;
        let slots = batch
            .column_by_name(SLOT)
            .and_then(|c| c.as_primitive_opt::<Int64Type>())
            .ok_or_else(|| bad(format!("no {SLOT} column")))?
            .clone();
        // parsed straight into `out`: a long history's records are not moved again
        let from = out.len();
        T::parse_into(&LogColumns::new(&batch, T::LOG), &mut out)?;
        for (i, r) in out[from..].iter_mut().enumerate() {
            let slot = slots.value(i);
            if slot < 1 || slot as u64 > through {
                return Err(bad(format!("a record's slot {slot} is outside 1..={through}")));
            }
            r.set_seq(slot as u64);
        }
    }
    if meta["records"].as_u64() != Some(out.len() as u64) {
        return Err(bad("it holds another number of records than its metadata says".into()));
    }
    Ok(out)
}

/// After a commit into slot `seq` of `name`: every `checkpoint_every` slots, write the checkpoint of the
/// folder as it now stands (create-if-absent; under the lock the commit was made with). A
/// checkpoint that cannot be written is only a slower next read: the commit stands.
pub(crate) async fn checkpoint_after<T: Record>(lake: &Lake, name: &str, seq: u64) -> Result<()> {
    if !seq.is_multiple_of(lake.cadence.checkpoint_every) {
        return Ok(());
    }
    let folded = read_checkpointed::<T>(lake, name).await?;
    if folded.checkpoint == Some(folded.last_slot) || folded.last_slot == 0 {
        return Ok(());
    }
    crate::table::failpoint::hit("log.before_checkpoint")?;
    if let Err(e) = write_checkpoint(lake, name, &folded).await {
        crate::tell!(
            "{}: checkpoint not written ({e}); the next read folds more records",
            folder::<T>(name)
        );
    }
    crate::table::failpoint::hit("log.after_checkpoint")
}

/// Write the checkpoint of `folded` (the records of `name` through `folded.last_slot`).
pub(crate) async fn write_checkpoint<T: Record>(lake: &Lake, name: &str, folded: &Checkpointed<T>) -> Result<()> {
    let through = folded.last_slot;
    let last = lake
        .get(&slot_rel::<T>(name, through))
        .await?
        .ok_or_else(|| Error::Internal(format!("{}: slot {through} vanished", folder::<T>(name))))?;
    let batch = checkpoint_batch(&folded.records)?;
    let meta = serde_json::json!({
        "through": through,
        "records": folded.records.len(),
        "through_sha256": crate::hash::sha256_hex(&last),
    });
    let props = crate::table::bronze::uncompressed_properties_for(&batch.schema())
        .into_builder()
        .set_key_value_metadata(Some(vec![datafusion::parquet::file::metadata::KeyValue::new(
            META.to_string(),
            meta.to_string(),
        )]))
        .build();
    let mut buf = Vec::new();
    let mut w = datafusion::parquet::arrow::ArrowWriter::try_new(&mut buf, batch.schema(), Some(props))?;
    w.write(&batch)?;
    w.close()?;
    lake.put_create(&layout::log_checkpoint(T::DIR, name, through), Bytes::from(buf))
        .await?;
    // Keep this one, the one it was read from, and those written within READER_GRACE (a query
    // planned over one reads its file later), so the folder every reader lists stays small; a
    // reader that listed a removed one takes the next, or folds every record.
    let keep_from = folded.checkpoint.unwrap_or(through);
    let now = chrono::Utc::now();
    for meta in lake.list(&layout::log_checkpoints(T::DIR, name)).await? {
        let superseded = slot_of(meta.location.filename()).is_some_and(|t| t < keep_from);
        if superseded && now.signed_duration_since(meta.last_modified) > READER_GRACE {
            lake.store.delete(&meta.location).await?;
        }
    }
    Ok(())
}

/// How long a superseded checkpoint outlives the next one: the catalog plans
/// `audit.ingestion_run_log` and `bronze.<source>_current` over the checkpoint it read, and a
/// statement still running when newer checkpoints are written must find that file. (`ingot gc`
/// removes all but the newest two at once.)
pub const READER_GRACE: chrono::TimeDelta = chrono::TimeDelta::minutes(10);

/// The records as one batch of the log's schema plus their slots.
fn checkpoint_batch<T: Record>(records: &[T]) -> Result<RecordBatch> {
    let all = T::batch_of(records)?;
    let mut columns = all.columns().to_vec();
    columns.push(Arc::new(Int64Array::from_iter_values(
        records.iter().map(|r| r.seq() as i64),
    )));
    let schema = crate::table::parquet::with_field(&T::schema(), slot_field());
    Ok(RecordBatch::try_new(schema, columns)?)
}

/// What is wrong with the checkpoints of `name`: `(path, why)` for each that readers pass over
/// (damaged, stale) or that differs from the records through its slot, folded one by one.
pub(crate) async fn check_checkpoints<T: Record + PartialEq>(lake: &Lake, name: &str) -> Result<Vec<(String, String)>> {
    let mut out = Vec::new();
    // the tail hint is no checkpoint: whatever it says, readers check it
    let hint = lake.path(&tail_hint::<T>(name));
    let listed: Vec<_> = lake
        .list(&layout::log_checkpoints(T::DIR, name))
        .await?
        .into_iter()
        .filter(|m| m.location != hint)
        .collect();
    if listed.is_empty() {
        return Ok(out);
    }
    let all = read_records::<T>(lake, lake.list(&folder::<T>(name)).await?).await?;
    for meta in listed {
        let rel = lake
            .relative(&meta.location)
            .unwrap_or_else(|| meta.location.to_string());
        let Some(through) = slot_of(meta.location.filename()) else {
            out.push((
                rel,
                "not a checkpoint (checkpoints are named <slot>.parquet); remove it".into(),
            ));
            continue;
        };
        let mut have = match load_checkpoint::<T>(lake, name, through).await {
            Ok(records) => records,
            Err(e) => {
                out.push((rel, format!("{e}: every reader passes it over; remove it")));
                continue;
            }
        };
        let folded: Vec<&T> = all.iter().filter(|r| r.seq() <= through).collect();
        let want = latest_per_id(folded, |r| r.id(), |r| r.seq());
        have.sort_by_key(|r| r.seq());
        if have.len() != want.len() || have.iter().zip(&want).any(|(h, w)| h != *w) {
            let differing = have
                .iter()
                .zip(&want)
                .find(|(h, w)| h != *w)
                .map(|(h, _)| format!(" (first at {} {})", T::LOG, h.id()))
                .unwrap_or_default();
            out.push((
                rel,
                format!(
                    "differs from the records through slot {through} it summarizes{differing}: readers trust it, so \
                     remove it (the next read folds every record)"
                ),
            ));
        }
    }
    Ok(out)
}

/// The objects of every folder of `T`'s log that are not records (their names are not
/// `<digits>.parquet`), records no reader can parse, and the empty slots below a record (a record
/// removed by hand, or a partial copy of the lake): `(path, why)`, for `ingot doctor`.
pub(crate) async fn stray_objects<T: Record>(lake: &Lake) -> Result<Vec<(String, String)>> {
    let (mut out, log) = (Vec::new(), T::LOG);
    // the slots taken in each folder, for the gaps among them
    let mut taken: std::collections::BTreeMap<String, Vec<u64>> = std::collections::BTreeMap::new();
    let delta_log = format!("{}/_delta_log/", T::DIR);
    for meta in lake.list(T::DIR).await? {
        let path = lake
            .relative(&meta.location)
            .unwrap_or_else(|| meta.location.to_string());
        // the log's Delta table (crate::table::delta) lives beside its folders
        if path.starts_with(&delta_log) {
            continue;
        }
        let Some(slot) = slot_of(meta.location.filename()) else {
            out.push((
                path,
                format!("not a {log} record (records are named <slot>.parquet): skipped by every command; remove it"),
            ));
            continue;
        };
        if let Some((folder, _)) = path.rsplit_once('/') {
            taken.entry(folder.to_string()).or_default().push(slot);
        }
        let bytes = lake.store.get(&meta.location).await?.bytes().await?;
        if let Err(e) = parse_record(bytes, log, &T::parse) {
            out.push((path, format!("{e}: skipped by every command; remove it")));
        }
    }
    for (folder, mut slots) in taken {
        slots.sort_unstable();
        let mut expected = 1;
        for slot in slots {
            if slot > expected {
                let missing = if slot - expected == 1 {
                    format!("slot {expected} is")
                } else {
                    format!("slots {expected} to {} are", slot - 1)
                };
                out.push((
                    format!("{folder}/{expected:010}.parquet"),
                    format!(
                        "{missing} empty while slot {slot} holds a record: a {log} record was removed (by hand, or a \
                         partial copy of the lake), and what it committed is missing wherever the records are read \
                         one by one; restore it from a backup"
                    ),
                ));
            }
            expected = slot + 1;
        }
    }
    Ok(out)
}
