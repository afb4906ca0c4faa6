//! `audit.silver_build_log` (docs/formats.md#auditsilver_build_log): one record per build or
//! undo of a build, committed into its table's slot like a run record
//! ([`crate::table::commit`]); read per table through its latest checkpoint.

use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, RecordBatch};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};

use crate::error::{Error, Result};
use crate::spec::contract::timestamp_type;
use crate::table::audit::{LogState, i64_array, opt_ts_array, str_array, ts_array};
use crate::table::lake::{Lake, layout};
use crate::table::log::{LogColumns, Record, read_checkpointed};

/// Status of a silver build.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BuildStatus {
    Succeeded,
    Failed,
    /// Undone by `ingot undo <build_id>`: the table is back at the previous snapshot.
    RolledBack,
}

impl BuildStatus {
    pub fn as_str(&self) -> &'static str {
        match self {
            BuildStatus::Succeeded => "succeeded",
            BuildStatus::Failed => "failed",
            BuildStatus::RolledBack => "rolled_back",
        }
    }

    pub fn parse(s: &str) -> Option<BuildStatus> {
        Some(match s {
            "succeeded" => BuildStatus::Succeeded,
            "failed" => BuildStatus::Failed,
            "rolled_back" => BuildStatus::RolledBack,
            _ => return None,
        })
    }
}

/// One row of `audit.silver_build_log` (docs/formats.md#tables): the commit of a silver build. Times are
/// microseconds since the epoch, UTC. `rows_read = rows_written + rows_filtered + rows_rejected`
/// counts the input rows this build processed (an incremental build processes only changed
/// records); `rows_flagged` counts the flagged rows of the whole published table.
#[derive(Debug, Clone, PartialEq)]
pub struct BuildRecord {
    pub build_id: String,
    pub table: String,
    pub rules_version: i32,
    pub rules_sha256: String,
    /// `full`, `incremental` or `rebuild`.
    pub mode: String,
    pub rebuild_filter: Option<String>,
    pub started_at: i64,
    pub finished_at: i64,
    pub status: BuildStatus,
    pub rows_read: i64,
    pub rows_written: i64,
    pub rows_filtered: i64,
    pub rows_rejected: i64,
    pub rows_flagged: i64,
    pub error: Option<String>,
    /// When `ingot undo` rolled the build back (microseconds, UTC); extension column.
    pub rolled_back_at: Option<i64>,
    /// A table with several sources: conflicts open, conflicts a decision settles, and
    /// decisions that no longer apply (a candidate changed) after the build; extension columns
    /// (null, read as 0, in older records and for one source).
    pub conflicts_open: i64,
    pub conflicts_decided: i64,
    pub decisions_stale: i64,
    /// Position among the table's build records (1-based): its commit slot and file name.
    pub seq: u64,
}

pub fn build_log_schema() -> SchemaRef {
    let ts = timestamp_type();
    Arc::new(Schema::new(vec![
        Field::new("build_id", DataType::Utf8, false),
        Field::new("table", DataType::Utf8, false),
        Field::new("rules_version", DataType::Int32, false),
        Field::new("rules_sha256", DataType::Utf8, false),
        Field::new("mode", DataType::Utf8, false),
        Field::new("rebuild_filter", DataType::Utf8, true),
        Field::new("started_at", ts.clone(), false),
        Field::new("finished_at", ts, false),
        Field::new("status", DataType::Utf8, false),
        Field::new("rows_read", DataType::Int64, false),
        Field::new("rows_written", DataType::Int64, false),
        Field::new("rows_filtered", DataType::Int64, false),
        Field::new("rows_rejected", DataType::Int64, false),
        Field::new("rows_flagged", DataType::Int64, false),
        Field::new("error", DataType::Utf8, true),
        Field::new("rolled_back_at", timestamp_type(), true),
        Field::new("conflicts_open", DataType::Int64, true),
        Field::new("conflicts_decided", DataType::Int64, true),
        Field::new("decisions_stale", DataType::Int64, true),
    ]))
}

impl BuildRecord {
    pub fn to_batch(&self) -> Result<RecordBatch> {
        let cols: Vec<ArrayRef> = vec![
            str_array(Some(&self.build_id)),
            str_array(Some(&self.table)),
            Arc::new(datafusion::arrow::array::Int32Array::from(vec![self.rules_version])),
            str_array(Some(&self.rules_sha256)),
            str_array(Some(&self.mode)),
            str_array(self.rebuild_filter.as_deref()),
            ts_array(self.started_at),
            ts_array(self.finished_at),
            str_array(Some(self.status.as_str())),
            i64_array(self.rows_read),
            i64_array(self.rows_written),
            i64_array(self.rows_filtered),
            i64_array(self.rows_rejected),
            i64_array(self.rows_flagged),
            str_array(self.error.as_deref()),
            opt_ts_array(self.rolled_back_at),
            i64_array(self.conflicts_open),
            i64_array(self.conflicts_decided),
            i64_array(self.decisions_stale),
        ];
        Ok(RecordBatch::try_new(build_log_schema(), cols)?)
    }

    fn from_columns(c: &LogColumns<'_>) -> Result<Vec<BuildRecord>> {
        let mut out = Vec::with_capacity(c.batch.num_rows());
        for r in 0..c.batch.num_rows() {
            let status_text = c.str("status")?.value(r);
            let status = BuildStatus::parse(status_text)
                .ok_or_else(|| Error::RunFailed(format!("build log has unknown status \"{status_text}\"")))?;
            out.push(BuildRecord {
                build_id: c.text("build_id", r)?,
                table: c.text("table", r)?,
                rules_version: c.i32("rules_version")?.value(r),
                rules_sha256: c.text("rules_sha256", r)?,
                mode: c.text("mode", r)?,
                rebuild_filter: c.opt("rebuild_filter", r)?,
                started_at: c.ts("started_at")?.value(r),
                finished_at: c.ts("finished_at")?.value(r),
                status,
                rows_read: c.i64("rows_read")?.value(r),
                rows_written: c.i64("rows_written")?.value(r),
                rows_filtered: c.i64("rows_filtered")?.value(r),
                rows_rejected: c.i64("rows_rejected")?.value(r),
                rows_flagged: c.i64("rows_flagged")?.value(r),
                error: c.opt("error", r)?,
                rolled_back_at: c.opt_ts("rolled_back_at", r)?,
                conflicts_open: opt_count(c, "conflicts_open", r)?,
                conflicts_decided: opt_count(c, "conflicts_decided", r)?,
                decisions_stale: opt_count(c, "decisions_stale", r)?,
                seq: 0,
            });
        }
        Ok(out)
    }
}

/// An extension count column: 0 when the record predates it or holds a null.
fn opt_count(c: &LogColumns<'_>, name: &str, row: usize) -> Result<i64> {
    if !c.has(name) {
        return Ok(0);
    }
    let a = c.i64(name)?;
    Ok(if datafusion::arrow::array::Array::is_valid(a, row) {
        a.value(row)
    } else {
        0
    })
}

impl Record for BuildRecord {
    const DIR: &'static str = layout::BUILD_LOG;
    const LOG: &'static str = "build log";

    fn schema() -> SchemaRef {
        build_log_schema()
    }

    fn parse(c: &LogColumns<'_>) -> Result<Vec<Self>> {
        BuildRecord::from_columns(c)
    }

    fn to_batch(&self) -> Result<RecordBatch> {
        BuildRecord::to_batch(self)
    }

    fn id(&self) -> &str {
        &self.build_id
    }

    fn seq(&self) -> u64 {
        self.seq
    }

    fn set_seq(&mut self, seq: u64) {
        self.seq = seq;
    }
}

/// The committed build records of one table, in commit order, through its latest checkpoint.
pub async fn read_table_builds(lake: &Lake, table: &str) -> Result<Vec<BuildRecord>> {
    let mut builds = read_checkpointed::<BuildRecord>(lake, table).await?.records;
    builds.retain(|b| b.table == table);
    Ok(builds)
}

/// Every committed build record of the lake, by table then sequence number.
pub async fn read_build_log(lake: &Lake) -> Result<Vec<BuildRecord>> {
    Ok(read_build_log_state(lake).await?.records)
}

/// [`read_build_log`] with the checkpoints it was read from.
pub async fn read_build_log_state(lake: &Lake) -> Result<LogState<BuildRecord>> {
    let mut out = LogState::default();
    for table in lake.list_dirs(layout::BUILD_LOG).await? {
        let folded = read_checkpointed::<BuildRecord>(lake, &table).await?;
        out.records
            .extend(folded.records.into_iter().filter(|b| b.table == table));
        if let Some(through) = folded.checkpoint {
            out.checkpoints.push((table, through));
        }
    }
    Ok(out)
}
