//! Audit tables: `audit.ingestion_run_log` and `audit.row_failure_log` (docs/formats.md#tables);
//! `audit.silver_build_log` is [`crate::table::builds`]'s, re-exported here.
//!
//! A run-log record is the commit of its run: it is written once, as a one-row Parquet file, with
//! a create-if-absent put (see [`crate::table::lake`]). Failure rows are streamed to a run-scoped Parquet
//! file that only becomes visible through the run's committed record. Columns added after the
//! first release (`ignored_columns`, `rolled_back_at`, `rows_deleted`, `natural_key_version`,
//! `previous_natural_key_version`, `natural_key_definition`, `rows_superseded`,
//! `contract_fields`, `failure_class`, `held_reason`, `decided_at`, `data_file_bytes`,
//! `data_file_crc32`, `failure_file_bytes`, `failure_file_crc32`, the `pull_*` columns of an API
//! pull) read as null (or 0) in older records; [`RunRecord`] says what each holds. A `held` run wrote its files but publishes nothing
//! until `ingot publish` commits a loaded copy of its record (or `ingot discard` a `discarded` one).
//!
//! Reconciliation of a run record: `rows_seen = rows_inserted + rows_updated + rows_unchanged +
//! rows_failed` (records of the file; a deleted key is not a record of the file), and its bronze
//! file holds `rows_inserted + rows_updated + rows_deleted` rows (new versions, then tombstones).

use std::sync::Arc;

use datafusion::arrow::array::{
    Array, ArrayRef, Int32Builder, Int64Array, Int64Builder, RecordBatch, StringArray, StringBuilder,
    TimestampMicrosecondArray, TimestampMicrosecondBuilder,
};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};

use crate::error::{Error, Result};
use crate::spec::contract::timestamp_type;
use crate::table::bronze::RunFileWriter;
use crate::table::lake::{Lake, layout};
use crate::table::log::{LogColumns, Record, read_checkpointed};
use crate::table::text::Text;
use crate::table::upload::FileStamp;

pub const INGOT_VERSION: &str = env!("CARGO_PKG_VERSION");

/// Status of a run (docs/formats.md#tables).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunStatus {
    Succeeded,
    SucceededWithFailures,
    Failed,
    SkippedDuplicateFile,
    RolledBack,
    /// A hold gate stopped the run: its files are written, nothing is published until
    /// `ingot publish` (docs/operations.md#held-runs).
    Held,
    /// A held run that `ingot discard` dropped: it published nothing, its files are gc's.
    Discarded,
}

impl RunStatus {
    pub fn as_str(&self) -> &'static str {
        match self {
            RunStatus::Succeeded => "succeeded",
            RunStatus::SucceededWithFailures => "succeeded_with_failures",
            RunStatus::Failed => "failed",
            RunStatus::SkippedDuplicateFile => "skipped_duplicate_file",
            RunStatus::RolledBack => "rolled_back",
            RunStatus::Held => "held",
            RunStatus::Discarded => "discarded",
        }
    }

    pub fn parse(s: &str) -> Option<RunStatus> {
        Some(match s {
            "succeeded" => RunStatus::Succeeded,
            "succeeded_with_failures" => RunStatus::SucceededWithFailures,
            "failed" => RunStatus::Failed,
            "skipped_duplicate_file" => RunStatus::SkippedDuplicateFile,
            "rolled_back" => RunStatus::RolledBack,
            "held" => RunStatus::Held,
            "discarded" => RunStatus::Discarded,
            _ => return None,
        })
    }

    /// The statuses of runs whose data counts ([`RunStatus::is_loaded`]).
    pub const LOADED: [RunStatus; 2] = [RunStatus::Succeeded, RunStatus::SucceededWithFailures];

    /// Does this run's data count (bronze rows, failure rows, file_hash for skipping)?
    pub fn is_loaded(&self) -> bool {
        RunStatus::LOADED.contains(self)
    }
}

/// `failure_class` of a run that failed for its file's content under its contract.
pub const FAILED_FOR_CONTENT: &str = "content";
/// `failure_class` of a run that failed for a passing cause (retried by the nightly job).
pub const FAILED_TRANSIENTLY: &str = "transient";

/// The `pull_*` columns of an API pull's run record (docs/formats.md#tables).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PullStats {
    /// HTTP requests sent, retries and token requests included.
    pub requests: i64,
    /// Pages whose records the pull kept.
    pub pages: i64,
    /// Response body bytes received (as sent, before any decompression).
    pub bytes: i64,
    /// Requests sent again after a 429, a 5xx, a timeout or a broken connection.
    pub retries: i64,
    /// Milliseconds waited on the rate limit, `Retry-After` and backoff.
    pub waited_ms: i64,
    /// The incremental cursor after this pull: the largest `cursor_field` value it loaded, in
    /// the field's canonical text (the previous cursor when it loaded none).
    pub cursor: Option<Text>,
    /// The response's `ETag` and `Last-Modified` (pagination `none` with `conditional: true`).
    pub etag: Option<Text>,
    pub last_modified: Option<Text>,
}

/// One row of `audit.ingestion_run_log`. Times are microseconds since the epoch, UTC.
#[derive(Debug, Clone, PartialEq)]
pub struct RunRecord {
    pub run_id: Text,
    pub source: Text,
    pub contract_version: i32,
    pub file_path: Text,
    pub file_hash: Option<Text>,
    pub file_bytes: i64,
    pub started_at: i64,
    pub finished_at: i64,
    pub status: RunStatus,
    pub rows_seen: i64,
    pub rows_inserted: i64,
    pub rows_updated: i64,
    pub rows_unchanged: i64,
    pub rows_failed: i64,
    pub replay_of: Option<Text>,
    pub error: Option<Text>,
    pub ingot_version: Text,
    pub ignored_columns: Option<Text>,
    /// When `ingot undo` rolled the run back (microseconds, UTC); extension column.
    pub rolled_back_at: Option<i64>,
    /// Tombstones written: current records whose natural key a `delivery: full` file did not
    /// have (extension column; null in older records reads as 0).
    pub rows_deleted: i64,
    /// The natural-key version of the fingerprints the run wrote (extension column; null in
    /// older records: then the run's bronze file says).
    pub natural_key_version: Option<i32>,
    /// Set on the runs `ingot rekey` commits: the natural-key version it migrated from
    /// (extension column).
    pub previous_natural_key_version: Option<i32>,
    /// The key definition the run's fingerprints were computed under ([`Contract::key_definition`]:
    /// key fields, their types as canonical text sees them, normalize steps; extension column,
    /// null in older records).
    ///
    /// [`Contract::key_definition`]: crate::spec::contract::Contract::key_definition
    pub natural_key_definition: Option<Text>,
    /// Replayed records not loaded because a run committed after the original delivered their key
    /// (rule `replay_superseded`; counted in `rows_failed` too). Extension column; null reads as 0.
    pub rows_superseded: i64,
    /// The contract fields the run's bronze file was written under, in order
    /// ([`Contract::fields_definition`]: `name type`, ` volatile` when so, `, ` between): what its
    /// `row_hash` covers. Extension column; null in older records (read as the current contract's).
    ///
    /// [`Contract::fields_definition`]: crate::spec::contract::Contract::fields_definition
    pub contract_fields: Option<Text>,
    /// Why a `failed` run failed: `content` (the file under this contract: retried only when the
    /// contract changes) or `transient` (the file changed while read, a read failed: the nightly
    /// job retries it). Extension column; null on other runs and in older records (read as content).
    pub failure_class: Option<Text>,
    /// Why a hold gate held the run (`held`, and kept on the copy `ingot publish` or `ingot
    /// discard` commits). Extension column; null on other runs and in older records.
    pub held_reason: Option<Text>,
    /// When `ingot publish` or `ingot discard` decided a held run (microseconds, UTC). Extension
    /// column.
    pub decided_at: Option<i64>,
    /// The size and CRC-32 of the run's bronze data file and failure file as written (extension
    /// columns `data_file_bytes`, `data_file_crc32`, `failure_file_…`; none in older records).
    pub data_file: Option<FileStamp>,
    pub failure_file: Option<FileStamp>,
    /// What an API pull fetched (extension columns `pull_*`; none on file runs and in older
    /// records).
    pub pull: Option<PullStats>,
    /// Position of the record among the source's run records (1-based): its commit slot. Not a
    /// column; it is the record's file name.
    pub seq: u64,
}

impl RunRecord {
    /// Did this run fail for a passing cause (`failure_class` transient)?
    pub fn failed_transiently(&self) -> bool {
        self.status == RunStatus::Failed && self.failure_class.as_deref() == Some(FAILED_TRANSIENTLY)
    }

    /// Did this run write a bronze data file?
    pub fn has_data(&self) -> bool {
        self.status.is_loaded() && self.rows_written() > 0
    }

    /// Rows of the run's bronze file: new versions and tombstones.
    pub fn rows_written(&self) -> i64 {
        self.rows_inserted + self.rows_updated + self.rows_deleted
    }

    /// Is this the run of an `ingot rekey`?
    pub fn is_rekey(&self) -> bool {
        self.previous_natural_key_version.is_some()
    }

    pub fn has_failures(&self) -> bool {
        self.status.is_loaded() && self.rows_failed > 0
    }

    /// Does the run keep files that a later command may still publish (a held run), or that
    /// readers read (a loaded run)?
    pub fn keeps_files(&self) -> bool {
        self.status.is_loaded() || self.status == RunStatus::Held
    }
}

pub fn run_log_schema() -> SchemaRef {
    let ts = timestamp_type();
    Arc::new(Schema::new(vec![
        Field::new("run_id", DataType::Utf8, false),
        Field::new("source", DataType::Utf8, false),
        Field::new("contract_version", DataType::Int32, false),
        Field::new("file_path", DataType::Utf8, false),
        Field::new("file_hash", DataType::Utf8, true),
        Field::new("file_bytes", DataType::Int64, false),
        Field::new("started_at", ts.clone(), false),
        Field::new("finished_at", ts, false),
        Field::new("status", DataType::Utf8, false),
        Field::new("rows_seen", DataType::Int64, false),
        Field::new("rows_inserted", DataType::Int64, false),
        Field::new("rows_updated", DataType::Int64, false),
        Field::new("rows_unchanged", DataType::Int64, false),
        Field::new("rows_failed", DataType::Int64, false),
        Field::new("replay_of", DataType::Utf8, true),
        Field::new("error", DataType::Utf8, true),
        Field::new("ingot_version", DataType::Utf8, false),
        Field::new("ignored_columns", DataType::Utf8, true),
        Field::new("rolled_back_at", timestamp_type(), true),
        Field::new("rows_deleted", DataType::Int64, true),
        Field::new("natural_key_version", DataType::Int32, true),
        Field::new("previous_natural_key_version", DataType::Int32, true),
        Field::new("natural_key_definition", DataType::Utf8, true),
        Field::new("rows_superseded", DataType::Int64, true),
        Field::new("contract_fields", DataType::Utf8, true),
        Field::new("failure_class", DataType::Utf8, true),
        Field::new("held_reason", DataType::Utf8, true),
        Field::new("decided_at", timestamp_type(), true),
        Field::new("data_file_bytes", DataType::Int64, true),
        Field::new("data_file_crc32", DataType::Utf8, true),
        Field::new("failure_file_bytes", DataType::Int64, true),
        Field::new("failure_file_crc32", DataType::Utf8, true),
        Field::new("pull_requests", DataType::Int64, true),
        Field::new("pull_pages", DataType::Int64, true),
        Field::new("pull_bytes", DataType::Int64, true),
        Field::new("pull_retries", DataType::Int64, true),
        Field::new("pull_wait_ms", DataType::Int64, true),
        Field::new("pull_cursor", DataType::Utf8, true),
        Field::new("pull_etag", DataType::Utf8, true),
        Field::new("pull_last_modified", DataType::Utf8, true),
    ]))
}

pub fn failure_log_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("run_id", DataType::Utf8, false),
        Field::new("layer", DataType::Utf8, false),
        Field::new("source", DataType::Utf8, false),
        Field::new("table", DataType::Utf8, true),
        Field::new("source_row_number", DataType::Int64, true),
        Field::new("natural_key_fingerprint", DataType::Utf8, true),
        Field::new("raw_payload", DataType::Utf8, false),
        Field::new("rule", DataType::Utf8, false),
        Field::new("reason", DataType::Utf8, false),
        Field::new("rules_version", DataType::Int32, true),
        Field::new("failed_at", timestamp_type(), false),
    ]))
}

pub(crate) fn ts_array(v: i64) -> ArrayRef {
    Arc::new(TimestampMicrosecondArray::from(vec![v]).with_timezone("UTC"))
}

pub(crate) fn opt_ts_array(v: Option<i64>) -> ArrayRef {
    Arc::new(TimestampMicrosecondArray::from(vec![v]).with_timezone("UTC"))
}

pub(crate) fn str_array(v: Option<&str>) -> ArrayRef {
    Arc::new(StringArray::from(vec![v]))
}

pub(crate) fn i64_array(v: i64) -> ArrayRef {
    Arc::new(Int64Array::from(vec![v]))
}

impl RunRecord {
    pub fn to_batch(&self) -> Result<RecordBatch> {
        RunRecord::batch_of(std::slice::from_ref(self))
    }

    /// The records as one batch of [`run_log_schema`], a row each, column by column (a
    /// checkpoint holds a row per run of the source).
    pub fn batch_of(records: &[RunRecord]) -> Result<RecordBatch> {
        use datafusion::arrow::array::Int32Array;
        let text = |f: fn(&RunRecord) -> Option<&str>| -> ArrayRef {
            Arc::new(records.iter().map(f).collect::<StringArray>())
        };
        let int64 = |f: fn(&RunRecord) -> i64| -> ArrayRef { Arc::new(records.iter().map(f).collect::<Int64Array>()) };
        let int32 =
            |f: fn(&RunRecord) -> Option<i32>| -> ArrayRef { Arc::new(records.iter().map(f).collect::<Int32Array>()) };
        let time = |f: fn(&RunRecord) -> Option<i64>| -> ArrayRef {
            Arc::new(
                records
                    .iter()
                    .map(f)
                    .collect::<TimestampMicrosecondArray>()
                    .with_timezone("UTC"),
            )
        };
        let mut cols: Vec<ArrayRef> = vec![
            text(|r| Some(&r.run_id)),
            text(|r| Some(&r.source)),
            int32(|r| Some(r.contract_version)),
            text(|r| Some(&r.file_path)),
            text(|r| r.file_hash.as_deref()),
            int64(|r| r.file_bytes),
            time(|r| Some(r.started_at)),
            time(|r| Some(r.finished_at)),
            text(|r| Some(r.status.as_str())),
            int64(|r| r.rows_seen),
            int64(|r| r.rows_inserted),
            int64(|r| r.rows_updated),
            int64(|r| r.rows_unchanged),
            int64(|r| r.rows_failed),
            text(|r| r.replay_of.as_deref()),
            text(|r| r.error.as_deref()),
            text(|r| Some(&r.ingot_version)),
            text(|r| r.ignored_columns.as_deref()),
            time(|r| r.rolled_back_at),
            int64(|r| r.rows_deleted),
            int32(|r| r.natural_key_version),
            int32(|r| r.previous_natural_key_version),
            text(|r| r.natural_key_definition.as_deref()),
            int64(|r| r.rows_superseded),
            text(|r| r.contract_fields.as_deref()),
            text(|r| r.failure_class.as_deref()),
            text(|r| r.held_reason.as_deref()),
            time(|r| r.decided_at),
        ];
        // each file stamp as two columns, its size and its CRC-32
        for f in [|r: &RunRecord| r.data_file, |r: &RunRecord| r.failure_file] {
            cols.push(Arc::new(
                records
                    .iter()
                    .map(|r| f(r).map(|s| s.bytes as i64))
                    .collect::<Int64Array>(),
            ));
            cols.push(Arc::new(
                records
                    .iter()
                    .map(|r| f(r).map(|s| s.crc_hex()))
                    .collect::<StringArray>(),
            ));
        }
        let counts: [fn(&PullStats) -> i64; 5] =
            [|p| p.requests, |p| p.pages, |p| p.bytes, |p| p.retries, |p| p.waited_ms];
        for f in counts {
            cols.push(Arc::new(
                records.iter().map(|r| r.pull.as_ref().map(f)).collect::<Int64Array>(),
            ));
        }
        let texts: [fn(&PullStats) -> Option<&str>; 3] = [
            |p| p.cursor.as_deref(),
            |p| p.etag.as_deref(),
            |p| p.last_modified.as_deref(),
        ];
        for f in texts {
            cols.push(Arc::new(
                records
                    .iter()
                    .map(|r| r.pull.as_ref().and_then(f))
                    .collect::<StringArray>(),
            ));
        }
        Ok(RecordBatch::try_new(run_log_schema(), cols)?)
    }

    /// Read every record of a batch in the run-log schema into `out` (each column looked up
    /// once: a checkpoint holds a row per run of the source, parsed where it stays).
    fn from_columns(c: &LogColumns<'_>, out: &mut Vec<RunRecord>) -> Result<()> {
        let (run_id, source, path, status) = (
            c.str("run_id")?,
            c.str("source")?,
            c.str("file_path")?,
            c.str("status")?,
        );
        let (hash, replay_of, error, version) = (
            c.str("file_hash")?,
            c.str("replay_of")?,
            c.str("error")?,
            c.str("ingot_version")?,
        );
        let contract_version = c.i32("contract_version")?;
        let (started, finished) = (c.ts("started_at")?, c.ts("finished_at")?);
        let counts = [
            "file_bytes",
            "rows_seen",
            "rows_inserted",
            "rows_updated",
            "rows_unchanged",
            "rows_failed",
        ]
        .map(|n| c.i64(n));
        let [bytes, seen, inserted, updated, unchanged, failed] = counts;
        let (bytes, seen, inserted, updated, unchanged, failed) =
            (bytes?, seen?, inserted?, updated?, unchanged?, failed?);
        // extension columns: older records lack them
        let text = |n: &str| if c.has(n) { c.str(n).map(Some) } else { Ok(None) };
        let int64 = |n: &str| if c.has(n) { c.i64(n).map(Some) } else { Ok(None) };
        let int32 = |n: &str| if c.has(n) { c.i32(n).map(Some) } else { Ok(None) };
        let time = |n: &str| if c.has(n) { c.ts(n).map(Some) } else { Ok(None) };
        let (ignored, key_definition, fields) = (
            text("ignored_columns")?,
            text("natural_key_definition")?,
            text("contract_fields")?,
        );
        let (failure_class, held_reason) = (text("failure_class")?, text("held_reason")?);
        let (deleted, superseded) = (int64("rows_deleted")?, int64("rows_superseded")?);
        let (key_version, previous_key_version) =
            (int32("natural_key_version")?, int32("previous_natural_key_version")?);
        let (rolled_back_at, decided_at) = (time("rolled_back_at")?, time("decided_at")?);
        let stamps = [
            (int64("data_file_bytes")?, text("data_file_crc32")?),
            (int64("failure_file_bytes")?, text("failure_file_crc32")?),
        ];
        // a stamp whose two columns are set and whose CRC is 8 hex digits (anything else: none)
        let stamp = |k: usize, r: usize| -> Option<FileStamp> {
            let (bytes, crc) = (get(stamps[k].0, r)?.value(r), get(stamps[k].1, r)?.value(r));
            let crc32 = u32::from_str_radix(crc, 16).ok().filter(|_| crc.len() == 8)?;
            Some(FileStamp {
                bytes: u64::try_from(bytes).ok()?,
                crc32,
            })
        };
        fn get<T: Array>(a: Option<&T>, r: usize) -> Option<&T> {
            a.filter(|a| !a.is_null(r))
        }
        let s = |a: Option<&StringArray>, r: usize| a.and_then(|a| Text::of_opt(a, r));
        let pull_counts = [
            int64("pull_requests")?,
            int64("pull_pages")?,
            int64("pull_bytes")?,
            int64("pull_retries")?,
            int64("pull_wait_ms")?,
        ];
        let pull_texts = [text("pull_cursor")?, text("pull_etag")?, text("pull_last_modified")?];
        // a pull's record: its request count is set
        let pull = |r: usize| -> Option<PullStats> {
            get(pull_counts[0], r)?;
            let n = |k: usize| get(pull_counts[k], r).map_or(0, |a| a.value(r));
            Some(PullStats {
                requests: n(0),
                pages: n(1),
                bytes: n(2),
                retries: n(3),
                waited_ms: n(4),
                cursor: s(pull_texts[0], r),
                etag: s(pull_texts[1], r),
                last_modified: s(pull_texts[2], r),
            })
        };
        out.reserve(c.batch.num_rows());
        for r in 0..c.batch.num_rows() {
            let status_text = status.value(r);
            let status = RunStatus::parse(status_text)
                .ok_or_else(|| Error::RunFailed(format!("run log has unknown status \"{status_text}\"")))?;
            out.push(RunRecord {
                run_id: Text::of(run_id, r),
                source: Text::of(source, r),
                contract_version: contract_version.value(r),
                file_path: Text::of(path, r),
                file_hash: s(Some(hash), r),
                file_bytes: bytes.value(r),
                started_at: started.value(r),
                finished_at: finished.value(r),
                status,
                rows_seen: seen.value(r),
                rows_inserted: inserted.value(r),
                rows_updated: updated.value(r),
                rows_unchanged: unchanged.value(r),
                rows_failed: failed.value(r),
                replay_of: s(Some(replay_of), r),
                error: s(Some(error), r),
                ingot_version: Text::of(version, r),
                ignored_columns: s(ignored, r),
                rolled_back_at: get(rolled_back_at, r).map(|a| a.value(r)),
                rows_deleted: get(deleted, r).map_or(0, |a| a.value(r)),
                natural_key_version: get(key_version, r).map(|a| a.value(r)),
                previous_natural_key_version: get(previous_key_version, r).map(|a| a.value(r)),
                natural_key_definition: s(key_definition, r),
                rows_superseded: get(superseded, r).map_or(0, |a| a.value(r)),
                contract_fields: s(fields, r),
                failure_class: s(failure_class, r),
                held_reason: s(held_reason, r),
                decided_at: get(decided_at, r).map(|a| a.value(r)),
                data_file: stamp(0, r),
                failure_file: stamp(1, r),
                pull: pull(r),
                seq: 0,
            });
        }
        Ok(())
    }
}

/// The start time of the next run of `source`: `now`, but later than every record of the source
/// in the run log, so that `ingested_at` never goes backwards within a source however the
/// host's clock steps (NTP, a resumed VM, a second host with a skewed clock). Taken under the
/// source's lock with its commit slot, it orders a source's versions as their commits do.
pub fn not_before(runs: &[RunRecord], source: &str, now: i64) -> i64 {
    runs.iter()
        .filter(|r| r.source == source)
        .map(|r| r.started_at.saturating_add(1))
        .fold(now, i64::max)
}

impl Record for RunRecord {
    const DIR: &'static str = layout::RUN_LOG;
    const LOG: &'static str = "run log";

    fn schema() -> SchemaRef {
        run_log_schema()
    }

    fn parse(c: &LogColumns<'_>) -> Result<Vec<Self>> {
        let mut out = Vec::new();
        RunRecord::from_columns(c, &mut out)?;
        Ok(out)
    }

    fn parse_into(c: &LogColumns<'_>, out: &mut Vec<Self>) -> Result<()> {
        RunRecord::from_columns(c, out)
    }

    fn to_batch(&self) -> Result<RecordBatch> {
        RunRecord::to_batch(self)
    }

    fn batch_of(records: &[Self]) -> Result<RecordBatch> {
        RunRecord::batch_of(records)
    }

    fn id(&self) -> &str {
        &self.run_id
    }

    fn seq(&self) -> u64 {
        self.seq
    }

    fn set_seq(&mut self, seq: u64) {
        self.seq = seq;
    }
}

/// The next commit slot of `source`, given the run log.
pub fn next_seq(runs: &[RunRecord], source: &str) -> u64 {
    runs.iter()
        .filter(|r| r.source == source)
        .map(|r| r.seq)
        .max()
        .unwrap_or(0)
        + 1
}

pub use super::commit::{commit_build, commit_build_record, commit_run, commit_run_record};

/// Objects under the run and build logs that are not records (their names are not
/// `<digits>.parquet`), records no reader can parse, and empty slots below a record (a record
/// removed): `(path, why)`, for `ingot doctor`.
pub async fn stray_log_objects(lake: &Lake) -> Result<Vec<(String, String)>> {
    let mut out = crate::table::log::stray_objects::<RunRecord>(lake).await?;
    out.extend(crate::table::log::stray_objects::<BuildRecord>(lake).await?);
    Ok(out)
}

/// Checkpoints of the run and build logs that readers pass over or that differ from the records
/// they summarize: `(path, why)`, for `ingot doctor`.
pub async fn checkpoint_problems(lake: &Lake) -> Result<Vec<(String, String)>> {
    let mut out = Vec::new();
    for source in lake.list_dirs(layout::RUN_LOG).await? {
        out.extend(crate::table::log::check_checkpoints::<RunRecord>(lake, &source).await?);
    }
    for table in lake.list_dirs(layout::BUILD_LOG).await? {
        out.extend(crate::table::log::check_checkpoints::<BuildRecord>(lake, &table).await?);
    }
    Ok(out)
}

/// Every committed run record of the lake, in commit order within each source (sources by name):
/// each source's log read through its checkpoint ([`read_source_runs`]).
pub async fn read_run_log(lake: &Lake) -> Result<Vec<RunRecord>> {
    Ok(read_run_log_state(lake).await?.records)
}

/// The records of every folder of a log, and the checkpoint each folder was read from.
#[derive(Debug, Clone)]
pub struct LogState<T> {
    /// One per id, by folder (source or table) then slot.
    pub records: Vec<T>,
    /// `(folder, through)` of each folder read from a checkpoint: its records in slots up to
    /// `through` are rows of that checkpoint's file ([`layout::log_checkpoint`]).
    pub checkpoints: Vec<(String, u64)>,
}

impl<T> Default for LogState<T> {
    fn default() -> Self {
        LogState {
            records: Vec::new(),
            checkpoints: Vec::new(),
        }
    }
}

/// [`read_run_log`] with the checkpoints it was read from (the catalog's `audit.ingestion_run_log`
/// reads those files instead of each record's).
pub async fn read_run_log_state(lake: &Lake) -> Result<LogState<RunRecord>> {
    let mut out = LogState::default();
    for source in lake.list_dirs(layout::RUN_LOG).await? {
        let folded = read_source_state(lake, &source).await?;
        out.records.extend(folded.records);
        if let Some(through) = folded.checkpoint {
            out.checkpoints.push((source, through));
        }
    }
    Ok(out)
}

/// The committed run records of one source, in commit order: what an ingest of that source
/// needs, without reading any other source's log; through the source's latest checkpoint, so the
/// cost does not grow with the source's history ([`crate::table::log`]).
pub async fn read_source_runs(lake: &Lake, source: &str) -> Result<Vec<RunRecord>> {
    Ok(read_source_state(lake, source).await?.records)
}

/// One source's committed run records, in commit order, and the checkpoint they were read
/// through (its records in slots up to it are rows of that checkpoint's file).
#[derive(Debug, Clone, Default)]
pub struct SourceRuns {
    pub records: Vec<RunRecord>,
    pub checkpoint: Option<u64>,
}

/// [`read_source_runs`] with the checkpoint it was read through.
pub async fn read_source_state(lake: &Lake, source: &str) -> Result<SourceRuns> {
    let folded = read_checkpointed::<RunRecord>(lake, source).await?;
    let mut records = folded.records;
    // a record filed under another source's folder is not this source's
    records.retain(|r| r.source == source);
    Ok(SourceRuns {
        records,
        checkpoint: folded.checkpoint,
    })
}

/// The run records of `source` in the slots after `through`, one per run, in slot order; `None`
/// when more than `max` slots follow it ([`crate::table::log::latest_after`]).
pub async fn read_source_runs_after(
    lake: &Lake,
    source: &str,
    through: u64,
    max: u64,
) -> Result<Option<Vec<RunRecord>>> {
    let mut records = crate::table::log::latest_after::<RunRecord>(lake, source, through, max).await?;
    if let Some(r) = records.as_mut() {
        r.retain(|r| r.source == source);
    }
    Ok(records)
}

/// A rejected record, bronze or silver.
#[derive(Debug, Clone)]
pub struct FailureRow {
    pub source_row_number: Option<i64>,
    pub natural_key_fingerprint: Option<String>,
    pub raw_payload: String,
    pub rule: String,
    pub reason: String,
}

/// Streams failure rows of one run into its run-scoped Parquet file.
pub struct FailureWriter {
    run_id: String,
    layer: &'static str,
    source: String,
    table: Option<String>,
    rules_version: Option<i32>,
    failed_at: i64,
    pending: Vec<FailureRow>,
    file: RunFileWriter,
    pub count: u64,
}

const FAILURE_FLUSH: usize = 8192;

impl FailureWriter {
    pub fn new(lake: &Lake, run_id: &str, source: &str, failed_at: i64) -> FailureWriter {
        FailureWriter {
            run_id: run_id.to_string(),
            layer: "bronze",
            source: source.to_string(),
            table: None,
            rules_version: None,
            failed_at,
            pending: Vec::new(),
            file: RunFileWriter::new(lake, layout::failures(run_id), failure_log_schema()),
            count: 0,
        }
    }

    pub async fn push(&mut self, row: FailureRow) -> Result<()> {
        self.pending.push(row);
        self.count += 1;
        if self.pending.len() >= FAILURE_FLUSH {
            self.flush().await?;
        }
        Ok(())
    }

    fn batch(&mut self) -> Result<RecordBatch> {
        let n = self.pending.len();
        let mut run = StringBuilder::with_capacity(n, n * 36);
        let mut layer = StringBuilder::new();
        let mut source = StringBuilder::new();
        let mut table = StringBuilder::new();
        let mut row_no = Int64Builder::with_capacity(n);
        let mut fp = StringBuilder::new();
        let mut raw = StringBuilder::new();
        let mut rule = StringBuilder::new();
        let mut reason = StringBuilder::new();
        let mut rv = Int32Builder::with_capacity(n);
        let mut at = TimestampMicrosecondBuilder::with_capacity(n);
        for f in self.pending.drain(..) {
            run.append_value(&self.run_id);
            layer.append_value(self.layer);
            source.append_value(&self.source);
            table.append_option(self.table.as_deref());
            row_no.append_option(f.source_row_number);
            fp.append_option(f.natural_key_fingerprint.as_deref());
            raw.append_value(&f.raw_payload);
            rule.append_value(&f.rule);
            reason.append_value(&f.reason);
            rv.append_option(self.rules_version);
            at.append_value(self.failed_at);
        }
        let cols: Vec<ArrayRef> = vec![
            Arc::new(run.finish()),
            Arc::new(layer.finish()),
            Arc::new(source.finish()),
            Arc::new(table.finish()),
            Arc::new(row_no.finish()),
            Arc::new(fp.finish()),
            Arc::new(raw.finish()),
            Arc::new(rule.finish()),
            Arc::new(reason.finish()),
            Arc::new(rv.finish()),
            Arc::new(at.finish().with_timezone("UTC")),
        ];
        Ok(RecordBatch::try_new(failure_log_schema(), cols)?)
    }

    async fn flush(&mut self) -> Result<()> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let batch = self.batch()?;
        self.file.write(&batch).await
    }

    /// Flush and close the file (if any row was written). Returns the number of rows.
    pub async fn finish(self) -> Result<u64> {
        Ok(self.finish_stamped().await?.0)
    }

    /// [`FailureWriter::finish`] with the file's size and CRC-32 (`None`: no file).
    pub async fn finish_stamped(mut self) -> Result<(u64, Option<FileStamp>)> {
        self.flush().await?;
        let (_, stamp) = self.file.finish_stamped().await?;
        Ok((self.count, stamp))
    }
}

pub use super::builds::{
    BuildRecord, BuildStatus, build_log_schema, read_build_log, read_build_log_state, read_table_builds,
};
