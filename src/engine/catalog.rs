//! The SQL catalog over a lake: `bronze.<source>`, `bronze.<source>_current`, `silver.<table>`,
//! `audit.ingestion_run_log`, `audit.row_failure_log` and `audit.silver_build_log`.
//!
//! `silver.<table>` is a listing table over the snapshot files (its manifest) of the table's
//! latest succeeded build (its highest-numbered `succeeded` record), so a reader sees one
//! complete build, never a mix; a table that has rules but no build yet is an empty table with
//! the columns its latest rules version would produce. `audit.row_failure_log` holds the failure files of
//! committed ingest runs and of succeeded builds.
//!
//! Tables are listing tables over the explicit list of files named by committed run records, so
//! an uncommitted (crashed) run is invisible by construction and the same plans can later be
//! shipped to a cluster. `bronze.<source>_current` is a view: the latest committed version per
//! `natural_key_fingerprint` (the one of the latest committed run: commit order, never a clock) over the runs since the source's
//! latest rekey ([`current_runs`]), leaving out the records whose latest version is a tombstone
//! (`is_deleted`); a compacted source's are built from its segment manifest's view state
//! ([`bronze_views_from_state`]).

use std::sync::Arc;

use datafusion::catalog::{MemTable, MemorySchemaProvider, TableProvider};
use datafusion::logical_expr::{JoinType, LogicalPlanBuilder};
use datafusion::prelude::{DataFrame, Expr, SessionContext, col, lit};

use crate::engine::current::{KeyColumns, RUN, Ranks, SLOT, Superseding, latest_versions, superseding};
use crate::engine::session::Workspace;
use crate::error::{Error, Result};
use crate::spec::contract::{Contract, ContractSet};
use crate::spec::yaml::Problems;
use crate::table::audit::{
    BuildRecord, BuildStatus, RunRecord, build_log_schema, failure_log_schema, read_build_log_state, run_log_schema,
};
use crate::table::evolve::{read_stored, stored_files};
use crate::table::lake::{Lake, layout};
pub use crate::table::parquet::{file_schema, table_over, table_over_file};

/// A session with every table of the lake registered.
pub struct Catalog {
    pub ctx: SessionContext,
    pub contracts: ContractSet,
    /// The run log, read source by source as tables need it ([`Catalog::runs`]: all of it).
    pub logs: Arc<crate::engine::lazy::RunLogs>,
    /// Every committed silver build record, by table then sequence number.
    pub builds: Arc<Vec<BuildRecord>>,
    /// Problems of contracts that could not be loaded (their tables are missing).
    pub problems: Problems,
    /// The cluster queries run on (`--cluster`), see [`crate::engine::exec`].
    pub cluster: Option<String>,
    /// Silver tables left out because their snapshot cannot be read (see `problems`).
    pub unreadable: Vec<String>,
}

/// Open a session over the lake with all tables registered.
pub async fn open(ws: &Workspace) -> Result<Catalog> {
    open_as_of(ws, None).await
}

/// [`open`], with `silver.<table>` as it was at `as_of` (a build id, or a UTC time such as
/// `2026-11-30T10:00:00Z` or `2026-11-30`): the snapshot of the table's build that was current
/// then (a build later rolled back counts until its undo). Tables without a build then are empty.
/// Bronze and audit tables are as they are now.
pub async fn open_as_of(ws: &Workspace, as_of: Option<&str>) -> Result<Catalog> {
    let ctx = ws.session()?;
    let mut problems = Problems::default();
    let contracts = ContractSet::load(&ws.contracts_dir, &mut problems);
    let build_log = read_build_log_state(&ws.lake).await?;
    let builds = build_log.records;
    let cutoff = as_of.map(|a| as_of_micros(a, &builds)).transpose()?;
    let catalog = ctx
        .catalog("ingot")
        .ok_or_else(|| Error::Invalid("the default catalog \"ingot\" is missing".into()))?;
    catalog.register_schema("silver", Arc::new(MemorySchemaProvider::new()))?;
    // the run log is read source by source, when a query first names a table that needs it
    let logs = Arc::new(crate::engine::lazy::RunLogs::new(&ws.lake));
    let bronze = crate::engine::lazy::BronzeSchema::new(
        &ws.lake,
        contracts.contracts.clone(),
        logs.clone(),
        ws.cluster.is_none(),
    );
    catalog.register_schema("bronze", Arc::new(bronze))?;
    let build_table = log_table(
        &ctx,
        &ws.lake,
        LogTable {
            dir: layout::BUILD_LOG,
            schema: build_log_schema(),
            id: "build_id",
            checkpoints: &build_log.checkpoints,
            slot: layout::build_record,
        },
        builds.iter().map(|b| (b.table.as_str(), b.seq, b.build_id.as_str())),
    )?;
    let builds = Arc::new(builds);
    let audit = crate::engine::lazy::AuditSchema::new(&ws.lake, logs.clone(), builds.clone(), build_table);
    catalog.register_schema("audit", Arc::new(audit))?;
    let unreadable = register_silver(&ctx, ws, &builds, cutoff, &mut problems).await?;
    register_descriptions(&ctx, ws, &contracts).await?;
    Ok(Catalog {
        ctx,
        contracts,
        logs,
        builds,
        problems,
        cluster: ws.cluster.clone(),
        unreadable,
    })
}

impl Catalog {
    /// Every committed run record of the lake, by source then slot (read on first use, once).
    pub async fn runs(&self) -> Result<&[RunRecord]> {
        Ok(&self.logs.all().await?.records)
    }
}

/// `audit.ingestion_run_log` over every source's runs ([`log_table`]).
pub fn run_log_table(
    ctx: &SessionContext,
    lake: &Lake,
    all: &crate::engine::lazy::AllRuns,
) -> Result<Arc<dyn TableProvider>> {
    log_table(
        ctx,
        lake,
        LogTable {
            dir: layout::RUN_LOG,
            schema: run_log_schema(),
            id: "run_id",
            checkpoints: &all.checkpoints,
            slot: layout::run_record,
        },
        all.records
            .iter()
            .map(|r| (r.source.as_str(), r.seq, r.run_id.as_str())),
    )
}

/// `audit.row_failure_log`: the failure files of committed ingest runs and of succeeded builds.
pub fn failure_table(lake: &Lake, runs: &[RunRecord], builds: &[BuildRecord]) -> Result<Arc<dyn TableProvider>> {
    let mut files: Vec<String> = runs
        .iter()
        .filter(|r| r.has_failures())
        .map(|r| lake.url(&layout::failures(&r.run_id)))
        .collect();
    files.extend(
        builds
            .iter()
            .filter(|b| b.status == BuildStatus::Succeeded && b.rows_rejected > 0)
            .map(|b| lake.url(&layout::silver_failures(&b.build_id))),
    );
    table_over(files, failure_log_schema())
}

/// `audit.source_conflict_log`: the conflict files of the succeeded builds (not rolled back) of
/// tables fed by several sources, each build's the conflicts its table held after it.
pub fn conflict_table(lake: &Lake, builds: &[BuildRecord]) -> Result<Arc<dyn TableProvider>> {
    let files = builds
        .iter()
        .filter(|b| b.status == BuildStatus::Succeeded && b.conflicts_open + b.conflicts_decided > 0)
        .map(|b| lake.url(&crate::table::conflicts::file(&b.table, &b.build_id)))
        .collect();
    table_over(files, crate::table::conflicts::log_schema())
}

/// `audit.source_conflict_decision_log`: every table's decisions, each as its latest record
/// (a withdrawn one with `withdrawn_at`); a few rows, read into memory.
pub async fn decision_table(lake: &Lake) -> Result<Arc<dyn TableProvider>> {
    use crate::table::log::Record;
    let mut batches = Vec::new();
    for table in lake.list_dirs(crate::table::decisions::DIR).await? {
        for d in crate::table::decisions::read_decisions(lake, &table).await? {
            batches.push(d.to_batch()?);
        }
    }
    let schema = crate::table::decisions::log_schema();
    Ok(Arc::new(datafusion::datasource::MemTable::try_new(
        schema,
        vec![batches],
    )?))
}

/// Where an audit log's table reads from: see [`log_table`].
struct LogTable<'a> {
    dir: &'a str,
    schema: datafusion::arrow::datatypes::SchemaRef,
    /// The id column a later record supersedes.
    id: &'a str,
    /// `(folder, through)` of the folders read from a checkpoint.
    checkpoints: &'a [(String, u64)],
    /// The record file of a folder's slot.
    slot: fn(&str, u64) -> String,
}

/// An audit log as a table, over `records` (`(folder, slot, id)`, one per id): the rows of each
/// folder's checkpoint file, less the ids a record after it supersedes, and the files of the
/// records after the checkpoints. So a query on the log reads one file per folder and the few
/// records after it, however long the history.
fn log_table<'a>(
    ctx: &SessionContext,
    lake: &Lake,
    log: LogTable<'_>,
    records: impl Iterator<Item = (&'a str, u64, &'a str)>,
) -> Result<Arc<dyn TableProvider>> {
    let through: std::collections::HashMap<&str, u64> = log.checkpoints.iter().map(|(n, t)| (n.as_str(), *t)).collect();
    let mut tail_files = Vec::new();
    let mut tail_slots = Vec::new();
    let mut superseded = Vec::new();
    for (folder, slot, id) in records {
        let in_tail = match through.get(folder) {
            Some(t) if slot <= *t => false,
            Some(_) => {
                superseded.push(lit(id.to_string()));
                true
            }
            None => true,
        };
        if in_tail {
            tail_files.push(lake.url(&(log.slot)(folder, slot)));
            tail_slots.push(vec![lit(id.to_string()), lit(slot as i64)]);
        }
    }
    let columns = |extra: Expr| -> Vec<Expr> {
        let mut cols: Vec<Expr> = log.schema.fields().iter().map(|f| col(f.name())).collect();
        cols.push(extra.alias(COMMIT_SEQ));
        cols
    };
    // the records after the checkpoints, each with its slot (its file's name) joined on by id
    let tail = if tail_files.is_empty() {
        None
    } else {
        let slots = LogicalPlanBuilder::values(tail_slots)?
            .project(vec![col("column1").alias(TAIL_ID), col("column2").alias(TAIL_SLOT)])?
            .build()?;
        let rows = ctx.read_table(table_over(tail_files, log.schema.clone())?)?.join(
            DataFrame::new(ctx.state(), slots),
            JoinType::Inner,
            &[log.id],
            &[TAIL_ID],
            None,
        )?;
        Some(rows.select(columns(col(TAIL_SLOT)))?)
    };
    if log.checkpoints.is_empty() {
        return Ok(match tail {
            Some(t) => t.into_view(),
            None => Arc::new(datafusion::datasource::empty::EmptyTable::new(with_commit_seq(
                &log.schema,
            ))),
        });
    }
    let files = log
        .checkpoints
        .iter()
        .map(|(n, t)| lake.url(&layout::log_checkpoint(log.dir, n, *t)))
        .collect();
    let stored = crate::table::parquet::with_field(&log.schema, crate::table::log::slot_field());
    let mut rows = ctx.read_table(table_over(files, stored)?)?;
    if !superseded.is_empty() {
        rows = rows.filter(col(log.id).in_list(superseded, true))?;
    }
    let rows = rows.select(columns(col(SLOT)))?;
    Ok(match tail {
        Some(t) => rows.union(t)?.into_view(),
        None => rows.into_view(),
    })
}

/// The column the run and build logs show besides their records' own: the record's commit slot
/// (its file's name), which orders a source's runs (a table's builds) as their commits do.
pub const COMMIT_SEQ: &str = crate::table::delta::COMMIT_SEQ;
const TAIL_ID: &str = "__ingot_tail_id";
const TAIL_SLOT: &str = "__ingot_tail_slot";

/// A log's schema with [`COMMIT_SEQ`] after its columns.
pub fn with_commit_seq(schema: &datafusion::arrow::datatypes::Schema) -> datafusion::arrow::datatypes::SchemaRef {
    crate::table::parquet::with_field(
        schema,
        datafusion::arrow::datatypes::Field::new(COMMIT_SEQ, datafusion::arrow::datatypes::DataType::Int64, false),
    )
}

/// `bronze.<source>` (every committed version, the rows of undone runs a segment holds left out)
/// and `bronze.<source>_current`, over the source's segments and the files of the runs no segment
/// holds: what [`crate::engine::lazy::BronzeSchema`] builds when a query first names them.
/// `checkpoint` is the slot the source's run log was read through from its checkpoint, if it was;
/// `manifest` the source's segment manifest ([`crate::table::segments::read`]).
pub fn bronze_views(
    ctx: &SessionContext,
    lake: &Lake,
    contract: &Contract,
    (runs, checkpoint): (&[RunRecord], Option<u64>),
    manifest: &crate::table::segments::Manifest,
    in_memory: bool,
) -> Result<(Arc<dyn TableProvider>, Arc<dyn TableProvider>)> {
    let source = &contract.source;
    let bronze = bronze_runs(runs, source);
    let (all, excluded) = stored_files(lake, contract, &bronze, manifest)?;
    let mut everything = read_stored(ctx, contract, &all.iter().collect::<Vec<_>>())?;
    // segments holding rows of runs that are not current beside those of current runs
    let mut others = !excluded.is_empty();
    if others {
        let ids = excluded.into_iter().map(lit).collect();
        everything = everything.filter(col("ingestion_run_id").in_list(ids, true))?;
    }
    let current = current_runs(runs, source);
    // the current runs are a part of the runs with data, in the same order: all of them when the
    // source was never re-keyed, and then their files are those of `bronze.<source>`
    let rekeyed = (current.len() < bronze.len())
        .then(|| stored_files(lake, contract, &current, manifest))
        .transpose()?;
    if let Some((_, excluded)) = &rekeyed {
        others = !excluded.is_empty();
    }
    let current_files = rekeyed.as_ref().map_or(&all, |(files, _)| files);
    let versions = read_stored(ctx, contract, &current_files.iter().collect::<Vec<_>>())?;
    let slots = match checkpoint {
        // in this process, each version's slot is looked up in the runs the catalog read; when
        // the files hold rows of current runs only, every row has one
        _ if in_memory => Ranks::Lookup {
            slot_of: crate::engine::slots::slot_of_udf(
                current.iter().map(|r| (r.run_id.clone(), r.seq as i64)).collect(),
            ),
            others,
        },
        // a plan for a cluster carries the slots as a table: up to the checkpoint from its file
        Some(through) => {
            let later = runs.iter().filter(|r| &r.source == source && r.seq > through);
            let from = CheckpointSlots {
                file: lake.url(&layout::log_checkpoint(layout::RUN_LOG, source, through)),
                through,
                later: later.map(|r| r.run_id.to_string()).collect(),
            };
            Ranks::Join(slots_from(ctx, &current, Some(from))?)
        }
        // a short history (no checkpoint yet) travels in the plan as VALUES
        None => Ranks::Join(slots_from(ctx, &current, None)?),
    };
    let reinserts = crate::table::versions::reinserts_before(runs, source);
    let superseding = superseding(ctx, lake, contract, &current, reinserts, manifest)?;
    let now = latest_versions(versions, slots, &KeyColumns::of(contract, &current), superseding)?;
    Ok((everything.into_view(), now.into_view()))
}

/// Records after a manifest's view state that [`bronze_views_from_state`] reads one by one; past
/// that, the log's checkpoint costs less.
const STATE_READ_MAX: u64 = 256;

/// [`bronze_views`] for plans run in this process, from the source's segment manifest and the
/// run records after its view state ([`crate::table::segments::ViewState`]) instead of the whole
/// run log: no checkpoint is read, and a segment's versions rank by their rows' slot column, so a
/// query costs the same at ten thousand runs as at a hundred. `None` when the state cannot be
/// used (none written, a segment gone, the record it was taken after not in its slot, a later
/// record it cannot follow, a stored field set the contract cannot read): then the views are
/// built from the log, which also names what cannot be read.
pub async fn bronze_views_from_state(
    ctx: &SessionContext,
    lake: &Lake,
    contract: &Contract,
    manifest: &crate::table::segments::Manifest,
) -> Result<Option<(Arc<dyn TableProvider>, Arc<dyn TableProvider>)>> {
    use crate::table::evolve::{StoredRun, all_readable, read_segments_slotted};
    let source = &contract.source;
    let Some(state) = &manifest.state else {
        return Ok(None);
    };
    match lake.get(&layout::run_record(source, state.through)).await? {
        Some(b) if crate::hash::sha256_hex(&b) == state.through_sha256 => {}
        _ => return Ok(None),
    }
    let Some(later) = crate::table::audit::read_source_runs_after(lake, source, state.through, STATE_READ_MAX).await?
    else {
        return Ok(None);
    };
    let Some(inputs) = state.advance(&later) else {
        return Ok(None);
    };
    let stored = manifest
        .segments
        .iter()
        .map(|s| (s.definition.as_deref(), s.id.as_str()))
        .chain(inputs.own.iter().map(|o| (o.definition.as_deref(), o.run.as_str())));
    if !all_readable(contract, stored) {
        return Ok(None);
    }
    let segments: Vec<StoredRun> = manifest
        .segments
        .iter()
        .map(|s| StoredRun::segment(lake, source, s))
        .collect();
    let own: Vec<(StoredRun, u64)> = inputs
        .own
        .iter()
        .map(|o| (StoredRun::of_run(lake, source, &o.run, o.definition.as_deref()), o.slot))
        .collect();
    let undone = |df: DataFrame| -> Result<DataFrame> {
        if inputs.undone.is_empty() {
            return Ok(df);
        }
        let ids = inputs.undone.iter().map(|r| lit(r.as_str())).collect();
        Ok(df.filter(col("ingestion_run_id").in_list(ids, true))?)
    };
    let all: Vec<&StoredRun> = segments.iter().chain(own.iter().map(|(s, _)| s)).collect();
    let everything = undone(read_stored(ctx, contract, &all)?)?;
    // the current versions: the segments' rows of current runs, ranked by their slot column, and
    // the current own files', ranked by a lookup of their few runs
    let first = inputs.first_slot;
    let current_own: Vec<&(StoredRun, u64)> = own.iter().filter(|(_, slot)| *slot >= first).collect();
    let slots = crate::engine::slots::slot_of_udf(
        current_own
            .iter()
            .map(|(s, slot)| (s.run_id.as_str().into(), *slot as i64))
            .collect(),
    );
    let mut versions = read_stored(ctx, contract, &current_own.iter().map(|(s, _)| s).collect::<Vec<_>>())?
        .with_column(SLOT, slots.call(vec![col("ingestion_run_id")]))?;
    if !segments.is_empty() {
        let mut held = undone(read_segments_slotted(
            ctx,
            contract,
            &segments.iter().collect::<Vec<_>>(),
        )?)?;
        if first > 1 {
            held = held.filter(col(SLOT).gt_eq(lit(first as i64)))?;
        }
        versions = held.union(versions)?;
    }
    let keys = KeyColumns::from_keys(contract, &inputs.key);
    let now = latest_versions(versions, Ranks::Column, &keys, Superseding::Any)?;
    Ok(Some((everything.into_view(), now.into_view())))
}

/// Where the slots of a source's current runs up to a checkpoint are read from: the run-log
/// checkpoint `file` (slots up to `through`), less the runs with a record after it (`later`).
struct CheckpointSlots {
    file: String,
    through: u64,
    later: Vec<String>,
}

/// `(__ingot_run, __ingot_slot)` of every run in `current`: a `VALUES` of the runs committed after
/// the checkpoint (all of them without one), and the checkpoint's rows that are current runs
/// (loaded, with rows, from the first current slot on, no later record), read from its file. So
/// the plan carries a few literals however long the history, and still ships to a cluster.
fn slots_from(
    ctx: &SessionContext,
    current: &[&RunRecord],
    checkpoint: Option<CheckpointSlots>,
) -> Result<Option<DataFrame>> {
    let Some(first) = current.first() else {
        return Ok(None);
    };
    let through = checkpoint.as_ref().map_or(0, |c| c.through);
    let tail: Vec<Vec<datafusion::prelude::Expr>> = current
        .iter()
        .filter(|r| checkpoint.is_none() || r.seq > through)
        .map(|r| vec![lit(r.run_id.to_string()), lit(r.seq as i64)])
        .collect();
    let tail = (!tail.is_empty())
        .then(|| -> Result<DataFrame> {
            let plan = LogicalPlanBuilder::values(tail)?
                .project(vec![col("column1").alias(RUN), col("column2").alias(SLOT)])?
                .build()?;
            Ok(DataFrame::new(ctx.state(), plan))
        })
        .transpose()?;
    let Some(cp) = checkpoint else {
        return tail.map(one_row_per_run).transpose();
    };
    // the checkpoint's columns this needs: the run log's, and the slot
    let log = run_log_schema();
    let mut fields = Vec::new();
    for name in ["run_id", "status", "rows_inserted", "rows_updated", "rows_deleted"] {
        fields.push(log.field_with_name(name)?.clone());
    }
    fields.push(crate::table::log::slot_field());
    let schema = Arc::new(datafusion::arrow::datatypes::Schema::new(fields));
    let loaded = crate::table::audit::RunStatus::LOADED
        .iter()
        .map(|s| lit(s.as_str()))
        .collect();
    let written = col("rows_inserted")
        + col("rows_updated")
        + datafusion::functions::expr_fn::coalesce(vec![col("rows_deleted"), lit(0i64)]);
    let mut rows = ctx.read_table(table_over(vec![cp.file], schema)?)?.filter(
        col("status")
            .in_list(loaded, false)
            .and(written.gt(lit(0i64)))
            .and(col(SLOT).gt_eq(lit(first.seq as i64))),
    )?;
    if !cp.later.is_empty() {
        rows = rows.filter(col("run_id").in_list(cp.later.into_iter().map(lit).collect(), true))?;
    }
    let rows = rows.select(vec![col("run_id").alias(RUN), col(SLOT)])?;
    let all = match tail {
        Some(tail) => rows.union(tail)?,
        None => rows,
    };
    Ok(Some(one_row_per_run(all)?))
}

/// `slots` (one row per run already) grouped by run: the same rows, but a plan that says the run
/// is unique, so joining it onto the versions is known to keep at most one row per version, and
/// the joins of the current view can be hash joins while the versions are few
/// ([`crate::engine::joins`]).
fn one_row_per_run(slots: DataFrame) -> Result<DataFrame> {
    Ok(slots.aggregate(
        vec![col(RUN)],
        vec![datafusion::functions_aggregate::expr_fn::max(col(SLOT)).alias(SLOT)],
    )?)
}

/// The runs whose bronze data file is part of `bronze.<source>`: every version ever committed,
/// including the history from before a rekey.
pub fn bronze_runs<'a>(runs: &'a [RunRecord], source: &str) -> Vec<&'a RunRecord> {
    runs.iter().filter(|r| r.source == source && r.has_data()).collect()
}

pub use crate::table::versions::current_runs;

/// The build of `table` that was current at `t` (microseconds, UTC): of the builds that had
/// finished by then and were not rolled back before it, the last committed (highest slot).
pub fn current_at<'a>(builds: &'a [BuildRecord], table: &str, t: i64) -> Option<&'a BuildRecord> {
    builds
        .iter()
        .filter(|b| b.table == table && b.finished_at <= t)
        .filter(|b| match b.status {
            BuildStatus::Succeeded => true,
            BuildStatus::RolledBack => b.rolled_back_at.is_some_and(|r| r > t),
            BuildStatus::Failed => false,
        })
        .max_by_key(|b| b.seq)
}

/// `--as-of`: a build id (the moment it finished) or a UTC time.
fn as_of_micros(as_of: &str, builds: &[BuildRecord]) -> Result<i64> {
    if let Some(b) = builds.iter().find(|b| b.build_id == as_of) {
        return Ok(b.finished_at);
    }
    if let Ok(t) = chrono::DateTime::parse_from_rfc3339(as_of) {
        return Ok(t.timestamp_micros());
    }
    for format in ["%Y-%m-%d %H:%M:%S%.f", "%Y-%m-%dT%H:%M:%S%.f"] {
        if let Ok(t) = chrono::NaiveDateTime::parse_from_str(as_of, format) {
            return Ok(t.and_utc().timestamp_micros());
        }
    }
    if let Ok(d) = chrono::NaiveDate::parse_from_str(as_of, "%Y-%m-%d") {
        // the end of that day
        if let Some(t) = d.and_hms_micro_opt(23, 59, 59, 999_999) {
            return Ok(t.and_utc().timestamp_micros());
        }
    }
    Err(Error::Invalid(format!(
        "--as-of \"{as_of}\": not a build id of audit.silver_build_log nor a UTC time; use e.g. \
         2026-11-30T10:00:00Z, \"2026-11-30 10:00:00\" or 2026-11-30 (the end of that day)"
    )))
}

/// The latest succeeded build of `table`, if any.
pub fn latest_build<'a>(builds: &'a [BuildRecord], table: &str) -> Option<&'a BuildRecord> {
    builds
        .iter()
        .filter(|b| b.table == table && b.status == BuildStatus::Succeeded)
        .max_by_key(|b| b.seq)
}

/// `silver.<table>` for every table with a succeeded build (its latest snapshot). Tables with
/// rules but no build yet are added by `crate::silver::register_planned` (the query layer's
/// catalog does so).
async fn register_silver(
    ctx: &SessionContext,
    ws: &Workspace,
    builds: &[BuildRecord],
    as_of: Option<i64>,
    problems: &mut Problems,
) -> Result<Vec<String>> {
    let mut tables: Vec<&str> = builds.iter().map(|b| b.table.as_str()).collect();
    tables.dedup();
    let mut unreadable = Vec::new();
    for table in tables {
        let chosen = match as_of {
            None => latest_build(builds, table),
            Some(t) => current_at(builds, table, t),
        };
        if let Some(b) = chosen {
            let provider = match crate::table::silver::snapshot_table(ctx, &ws.lake, table, &b.build_id).await {
                Ok(p) => p,
                Err(e) if as_of.is_some() => {
                    return Err(Error::Invalid(format!(
                        "silver.{table} as of then is build {}, whose snapshot is no longer readable (removed by \
                         `ingot gc` after its retention?): {e}",
                        b.build_id
                    )));
                }
                Err(Error::Internal(e)) => return Err(Error::Internal(e)),
                Err(e) => {
                    // One broken table leaves the others queryable; its problem names the file.
                    let manifest = layout::silver_manifest(table, &b.build_id);
                    problems.push(
                        std::path::Path::new(&manifest),
                        crate::spec::yaml::Pos { line: 1, column: 1 },
                        format!("silver.{table} (build {}) cannot be read: {e}", b.build_id),
                    );
                    unreadable.push(table.to_string());
                    continue;
                }
            };
            ctx.register_table(format!("silver.{table}").as_str(), provider)?;
        }
    }
    Ok(unreadable)
}

/// `table_descriptions` and `column_descriptions` (see the module docs), from the contracts, the
/// rules' descriptions and the registered tables' schemas; registered anew when tables were added.
///
/// DataFusion 55 has no table or column comments, so the descriptions from contracts and rules
/// are two small tables of their own in the default schema: `table_descriptions` (schema, table,
/// kind, description) and `column_descriptions` (schema, table, column, type, nullable,
/// description). The shell's `\d` reads them; so can any SQL or Flight SQL client.
pub async fn register_descriptions(ctx: &SessionContext, ws: &Workspace, contracts: &ContractSet) -> Result<()> {
    for name in ["table_descriptions", "column_descriptions"] {
        ctx.deregister_table(name)?;
    }
    let mut tables: Vec<[String; 4]> = Vec::new();
    for (source, c) in &contracts.contracts {
        let d = c.description.clone().unwrap_or_default();
        tables.push(["bronze".into(), source.clone(), "every version".into(), d.clone()]);
        tables.push([
            "bronze".into(),
            format!("{source}_current"),
            "latest version per key".into(),
            d,
        ]);
    }
    let mut silver = ctx
        .catalog("ingot")
        .and_then(|c| c.schema("silver"))
        .map(|s| s.table_names())
        .unwrap_or_default();
    silver.sort();
    let mut ignored = Problems::default();
    let rules = crate::spec::rules::RulesSet::load(&ws.rules_dir, contracts, &mut ignored);
    for t in silver {
        let d = rules.latest(&t).and_then(|r| r.description.clone()).unwrap_or_default();
        tables.push(["silver".into(), t, "latest succeeded build".into(), d]);
    }
    for (t, d) in [
        ("ingestion_run_log", "one row per ingestion run (its commit record)"),
        (
            "row_failure_log",
            "every rejected row, bronze and silver, with its raw payload",
        ),
        ("silver_build_log", "one row per silver build"),
        (
            "source_conflict_log",
            "per build of a table fed by several sources, the conflicts it holds",
        ),
        (
            "source_conflict_decision_log",
            "one row per decision on a conflict (ingot resolve), withdrawn ones included",
        ),
    ] {
        tables.push(["audit".into(), t.into(), "audit".into(), d.into()]);
    }
    let mut columns: Vec<[String; 6]> = Vec::new();
    for [schema, table, _, _] in &tables {
        // bronze views have their contract's columns: known without building them (they are
        // built lazily, when a query names them)
        let bronze = (schema == "bronze")
            .then(|| contracts.contracts.get(table.strip_suffix("_current").unwrap_or(table)))
            .flatten();
        let fields = match (bronze, schema.as_str(), table.as_str()) {
            (Some(c), _, _) => c.bronze_schema(),
            // the audit tables that read the run log are built lazily too
            (None, "audit", "ingestion_run_log") => with_commit_seq(&run_log_schema()),
            (None, "audit", "row_failure_log") => failure_log_schema(),
            _ => ctx.table_provider(format!("{schema}.{table}").as_str()).await?.schema(),
        };
        // bronze and silver columns named like a contract field carry its description
        let source = match schema.as_str() {
            "bronze" => Some(table.strip_suffix("_current").unwrap_or(table)),
            "silver" => Some(table.as_str()),
            _ => None,
        };
        let contract = source.and_then(|s| contracts.contracts.get(s));
        for f in fields.fields() {
            let d = contract
                .and_then(|c| c.fields.iter().find(|x| &x.name == f.name()))
                .and_then(|x| x.description.clone())
                .unwrap_or_else(|| {
                    if f.name() == COMMIT_SEQ && schema == "audit" {
                        "the record's commit slot: orders runs (builds) as their commits do".to_string()
                    } else {
                        String::new()
                    }
                });
            columns.push([
                schema.clone(),
                table.clone(),
                f.name().clone(),
                f.data_type().to_string(),
                if f.is_nullable() { "yes" } else { "no" }.to_string(),
                d,
            ]);
        }
    }
    ctx.register_table(
        "table_descriptions",
        strings_table(&["schema", "table", "kind", "description"], &tables)?,
    )?;
    ctx.register_table(
        "column_descriptions",
        strings_table(
            &["schema", "table", "column", "type", "nullable", "description"],
            &columns,
        )?,
    )?;
    Ok(())
}

/// A small in-memory table of non-null strings, one row per array.
fn strings_table<const N: usize>(names: &[&str; N], rows: &[[String; N]]) -> Result<Arc<dyn TableProvider>> {
    use datafusion::arrow::array::{ArrayRef, RecordBatch, StringArray};
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    let schema = Arc::new(Schema::new(
        names
            .iter()
            .map(|n| Field::new(*n, DataType::Utf8, false))
            .collect::<Vec<_>>(),
    ));
    let cols: Vec<ArrayRef> = (0..N)
        .map(|i| Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r[i].as_str()))) as ArrayRef)
        .collect();
    let batch = RecordBatch::try_new(schema.clone(), cols)?;
    Ok(Arc::new(MemTable::try_new(schema, vec![vec![batch]])?))
}
