//! The machinery every commit log shares (the run log and the build log, [`crate::table::audit`]):
//! a log is a folder of one-record Parquet files named by their slot (`<digits>.parquet`), each
//! put create-if-absent, read back in slot order; within a log the record in the highest slot
//! stands for its id. Objects that are not `<digits>.parquet`, and records no reader can parse,
//! are not part of a log: every reader skips them and `ingot doctor` reports them.

use bytes::Bytes;
use datafusion::arrow::array::{Array, ArrayRef, AsArray, RecordBatch, StringArray};
use datafusion::arrow::datatypes::{Int32Type, Int64Type, TimestampMicrosecondType};
use datafusion::parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use object_store::ObjectStoreExt;

use crate::error::{Error, Result};
use crate::table::lake::Lake;

/// The slot a log file name stands for: `<digits>.parquet`.
pub(crate) fn slot_of(name: Option<&str>) -> Option<u64> {
    let digits = name?.strip_suffix(".parquet")?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// One record per id: the one in the highest slot. A log is append-only; `ingot undo` marks a run
/// or build `rolled_back` by committing a copy of its record, with the new status, into the next
/// slot, and that copy supersedes the original everywhere (catalog, audit tables, next slot).
pub(crate) fn latest_per_id<T, K: Ord>(records: Vec<T>, id: impl Fn(&T) -> K, seq: impl Fn(&T) -> u64) -> Vec<T> {
    let mut best: std::collections::BTreeMap<K, T> = std::collections::BTreeMap::new();
    for r in records {
        let k = id(&r);
        match best.get(&k) {
            Some(have) if seq(have) >= seq(&r) => {}
            _ => {
                best.insert(k, r);
            }
        }
    }
    best.into_values().collect()
}

/// Typed access to the columns of a log record batch, with errors naming the log and column.
pub(crate) struct LogColumns<'a> {
    pub(crate) batch: &'a RecordBatch,
    pub(crate) log: &'static str,
}

impl<'a> LogColumns<'a> {
    pub(crate) fn col(&self, name: &str) -> Result<&'a ArrayRef> {
        self.batch
            .column_by_name(name)
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
        if self.batch.column_by_name(name).is_none() {
            return Ok(None);
        }
        let a = self.ts(name)?;
        Ok((!a.is_null(row)).then(|| a.value(row)))
    }

    /// A nullable int64 of a column that older records may lack (`None` then).
    pub(crate) fn opt_i64(&self, name: &str, row: usize) -> Result<Option<i64>> {
        if self.batch.column_by_name(name).is_none() {
            return Ok(None);
        }
        let a = self.i64(name)?;
        Ok((!a.is_null(row)).then(|| a.value(row)))
    }

    /// A nullable int32 of a column that older records may lack (`None` then).
    pub(crate) fn opt_i32(&self, name: &str, row: usize) -> Result<Option<i32>> {
        if self.batch.column_by_name(name).is_none() {
            return Ok(None);
        }
        let a = self.i32(name)?;
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

/// Every record of one log (`rel`), each with the sequence number its file name carries.
pub(crate) async fn read_log<T>(
    lake: &Lake,
    rel: &str,
    log: &'static str,
    parse: impl Fn(&LogColumns<'_>) -> Result<Vec<T>>,
    mut set_seq: impl FnMut(&mut T, u64),
) -> Result<Vec<T>> {
    let mut out = Vec::new();
    for meta in lake.list(rel).await? {
        // Only `<digits>.parquet` is a record (a slot); anything else (`._0000000001.parquet` from
        // a macOS copy, an editor's backup) is not part of the log: skipped here, reported by
        // `ingot doctor` ([`crate::table::audit::stray_log_objects`]).
        let Some(seq) = slot_of(meta.location.filename()) else {
            continue;
        };
        let bytes = lake.store.get(&meta.location).await?.bytes().await?;
        // A record no reader can parse (a foreign file in a slot, a damaged copy) is not part of
        // the log either: skipped, reported by `ingot doctor`; a commit passes its slot by.
        let Ok(records) = parse_record(bytes, log, &parse) else {
            continue;
        };
        for mut record in records {
            set_seq(&mut record, seq);
            out.push(record);
        }
    }
    Ok(out)
}

/// The records of one log file's bytes.
pub(crate) fn parse_record<T>(
    bytes: Bytes,
    log: &'static str,
    parse: &impl Fn(&LogColumns<'_>) -> Result<Vec<T>>,
) -> Result<Vec<T>> {
    let reader = ParquetRecordBatchReaderBuilder::try_new(bytes)
        .and_then(|b| b.build())
        .map_err(|e| Error::RunFailed(format!("unreadable {log} record: {e}")))?;
    let mut out = Vec::new();
    for batch in reader {
        let batch = batch.map_err(|e| Error::RunFailed(format!("unreadable {log} record: {e}")))?;
        out.extend(parse(&LogColumns { batch: &batch, log })?);
    }
    Ok(out)
}

/// Put a commit record into slot `seq` (`rel` names a slot's file), create-if-absent; `Ok(false)`
/// when the slot holds another commit. A slot holding an object no reader can parse is not a
/// commit (every reader skips it): the record goes into the next free slot instead.
pub(crate) async fn put_record<T>(
    lake: &Lake,
    rel: impl Fn(u64) -> String,
    mut seq: u64,
    bytes: Bytes,
    log: &'static str,
    parse: impl Fn(&LogColumns<'_>) -> Result<Vec<T>>,
) -> Result<bool> {
    loop {
        if lake.put_create(&rel(seq), bytes.clone()).await? {
            return Ok(true);
        }
        match lake.get(&rel(seq)).await? {
            Some(taken) if parse_record(taken.clone(), log, &parse).is_err() => seq += 1,
            _ => return Ok(false),
        }
    }
}
