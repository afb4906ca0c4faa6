//! `ingot build <table>`: run the plans of [`super::compile`] and publish a new snapshot of
//! `silver.<table>` atomically (docs/guide.md#silver-builds).
//!
//! # What a build writes, and its commit
//!
//! Every file of a build is build-scoped (see [`crate::table::lake`] for the layout): the complete
//! snapshot of the table as `part-NNNNN.parquet` files (one per partition of the output pass,
//! written in parallel), the state as `state-NNNNN.parquet` files, `manifest.json` naming both
//! lists ([`Manifest`]; builds from before manifests wrote one `part-00000.parquet` and one
//! `state.parquet`, which [`manifest`] still reads), `inputs.json` (a digest of what `resolve`
//! read) and the build's silver rejections (`audit/row_failure_log/build_id=<id>/`, layer
//! `silver`). The state has one row per record the table's current state accounts for: the
//! 16-byte key of its fingerprint (see [`super::keys`]), the run of the version that was decided,
//! its `outcome` (`passed`, `rejected`, `filtered`) and the `rules_version` that decided it. The
//! commit is the `audit.silver_build_log` record, written with a create-if-absent put into the
//! table's next slot `audit/silver_build_log/<table>/<seq>.parquet` (`seq` read when the build
//! starts). `silver.<table>` is the manifest's snapshot files of the latest succeeded record
//! ([`snapshot_table`]), so readers see the old snapshot or the new one, never a mix; a crash
//! before the record leaves files nothing reads; a concurrent build that committed first takes
//! the slot and this one publishes nothing.
//!
//! # Modes
//!
//! * `full`: every row of `bronze.<source>_current` is transformed.
//! * `incremental` (default; `full` when the table has no succeeded build): the input is the
//!   current records whose version (fingerprint, run) is not the one the previous build's state
//!   names — new and changed records — and the previous snapshot's rows whose record is still
//!   current and unchanged are kept byte-for-byte (with their `silver_build_id`); records no
//!   longer current (undone) disappear. Everything is re-processed when what `resolve` reads
//!   changed since the previous build (a lookup source's committed runs or a contract file:
//!   `inputs.json`), since any row's resolved value may have changed. Records that another rules
//!   version rejected or filtered are processed again with the chosen rules (they have no silver
//!   row to keep); rows in silver keep the version that built them (rebuild them with
//!   `--rebuild-where` or `--full`).
//! * `rebuild` (`--rebuild-where PRED`, a predicate on `rules_version` only): the records whose
//!   `rules_version` in the previous build's state matches PRED — the snapshot's rows of those
//!   versions, and the records those versions rejected or filtered — are rebuilt from their
//!   current bronze record with the chosen rules; every other row is kept byte-for-byte, even if
//!   its bronze record changed since (the next incremental build picks that up).
//!
//! Anomaly flags are always recomputed over the whole new table (kept rows too), with the chosen
//! rules' anomalies: a kept row's `anomaly_flags` and `is_anomaly` may change (its history did),
//! every other column of it does not. So an incremental build yields exactly the rows and flags
//! of a full build of the same bronze state, except `silver_build_id` of the rows it kept.
//!
//! A `fail` validation that any processed row fails fails the build: a `failed` record names the
//! rule and the first failing records, the files written are deleted (best effort; nothing reads
//! them anyway), exit code 1. A rules version is immutable once a succeeded build used it: a
//! different SHA-256 is refused (exit 2).
//!
//! Counts of the record: `rows_read` (input rows processed) = `rows_written` (of them, rows in
//! the new snapshot) + `rows_filtered` + `rows_rejected`; `rows_flagged` counts flagged rows of
//! the whole new table.
//!
//! # How it runs (and what it costs)
//!
//! 1. Decisions, without joins. A full build over one bronze run needs none: every row is
//!    current and processed. Otherwise one pass over the fingerprint column of every bronze run
//!    (newest first) and one over the previous state build [`Keys`]: per record its current run
//!    and what the state says, ~32 bytes a record (reserved in the memory pool). A UDF over that
//!    map picks the rows to process out of each run's file (a run whose rows are all processed is
//!    read without lookups); the previous snapshot's rows are kept unless their record is in the
//!    (small) set of records the build drops. An incremental build with nothing to do stops
//!    here (see below).
//! 2. Window anomalies (`spike`, `first_seen`) over only the columns they read, of the passing
//!    rows and the kept rows, ties broken by the fingerprint's 16-byte key (ordered as the hex
//!    text): DataFusion sorts those narrow rows (spilling in the pool) and the result is, per
//!    anomaly, the set of keys it fires on (`when` anomalies need no pass).
//! 3. One output pass, one task per partition: kept rows get their flags recomputed (the `when`
//!    expressions and a lookup in those sets) and are written; the transform runs once
//!    ([`super::compile::transform_split`]) and each batch is split into the snapshot (flagged),
//!    the failure file and the state. The rows a `filter` step removed come from one narrow
//!    plan per filter step; carried state rows from the map.
//!
//! So bronze is read twice (narrow for the windows, whole for the output) and nothing is joined
//! on hex strings. Memory: the key map, the window pass's sort (bounded by the pool, spills) and
//! one row group per part writer (row groups closed at 24 MB); glibc's arenas are limited and trimmed
//! between the passes so that freed sort memory does not add to the output pass's peak.
//!
//! An incremental build that finds nothing to do (no record to process, none removed, the same
//! rules version) writes no data: its manifest names the previous build's files (paths relative
//! to the lake root). Hazard: `gc` must keep every file a succeeded build's manifest names, not
//! only the files in the build's own folder ([`build_files`] lists them, layers included).
//!
//! # Delta builds
//!
//! An incremental build is a *delta build* when it can extend the previous build's layers (see
//! `delta_base`: same rules version, the previous build was full or incremental and its manifest
//! names the runs it accounted for, none of them undone since, every run committed since is newer,
//! fewer than 8 layers). It reads only the runs committed since, processes their records, and
//! publishes a manifest of the previous layers plus one [`Delta`]: the new rows, the new state
//! rows, and two deletion files of 16-byte keys, the records whose snapshot rows are replaced or
//! gone and the records whose state rows are. Readers ([`snapshot_table`], `layers`) take each
//! layer's rows without the keys any later layer deleted. Window anomalies are recomputed only
//! for the groups (`by` values) a processed record was or is in, over every row of such a group,
//! and only the kept rows whose window flags change are rewritten (into the delta, their keys
//! deleted below it); `when` flags depend on the row alone. The groups are those of the new rows
//! and of the processed records' old rows; the build first assumes the latter are among the
//! former (a correction seldom moves a record to another group) and reads the previous snapshot
//! once, the old rows of processed records riding along inert (taking no part in any window) to
//! be counted; if one of them is in another group, it scans those old rows for their groups and
//! redoes the window pass without them. So a build after a small delivery costs one narrow scan
//! of the previous snapshot (two when a record changed groups) plus the work on the new rows,
//! not a rewrite of the table. Past a fraction of the
//! table deleted by the layers (`INGOT_SILVER_DELTA_LIMIT`, default 0.1) or after 8 layers, the
//! next build writes a whole snapshot again (compaction); so does any build the conditions rule
//! out (an undo, a rules version change, `--full`, `--rebuild-where`).
//!
//! On a cluster (`--cluster`, [`crate::engine::exec`]) every plan above runs there. The key map stays in
//! this process, so the two selections that look it up — the rows of a partly superseded run to
//! process (`__ingot_pick`) and the kept rows to drop (`__ingot_in_set`) — become a semi-join and
//! an anti-join on `__ingot_fp128(fp)` with build-scoped files of 16-byte keys
//! (`keys-pick-NNNNN.parquet`, `keys-dropped.parquet`; written before, deleted after the output
//! pass, never named by a manifest). The partition tasks that write the snapshot, the failures
//! and the state run here, reading the plan's rows as one stream from the cluster.
//!
//! Delta builds use in-process key sets (`__ingot_in_set`, `__ingot_in_groups`) for the layers
//! and the touched groups; with `--cluster` a build is never a delta build, and reading a table
//! with delta layers runs those plans in the client (see [`crate::engine::exec`]).

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, BooleanArray, DictionaryArray, FixedSizeBinaryBuilder, Int32Array, Int32Builder,
    RecordBatch, StringArray, StringDictionaryBuilder, TimestampMicrosecondArray,
};
use datafusion::arrow::compute::kernels::boolean::{is_null, not};
use datafusion::arrow::compute::{cast as arrow_cast, filter_record_batch};
use datafusion::arrow::datatypes::{DataType, Field, Int32Type, Int64Type, Schema, SchemaRef};
use datafusion::catalog::TableProvider;
use datafusion::common::DFSchema;
use datafusion::common::tree_node::TreeNode;
use datafusion::dataframe::DataFrame;
use datafusion::execution::SendableRecordBatchStream;
use datafusion::execution::memory_pool::MemoryConsumer;
use datafusion::logical_expr::{Expr, ExprSchemable, JoinType, lit};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::prelude::SessionContext;
use futures::StreamExt;
use sha2::Digest;

use super::compile::{
    ANOMALY_FLAGS, IS_ANOMALY, RULES_VERSION, SPLIT_RULE, Split, flag, flag_projection, is_window, read_inputs,
    transform, transform_split, window_fired_column, window_fires, window_fires_with,
};
use super::keys::{
    FILTERED, FpSet, GroupSet, Keys, Mode, NONE, PASSED, REJECTED, for_each_fp, fp128_udf, in_groups_udf, in_set_udf,
    outcome_name, outcome_of, pick_udf,
};
use crate::engine::catalog::{Catalog, latest_build, table_over};
use crate::engine::session::Workspace;
use crate::error::{Error, Result};
use crate::spec::contract::{Contract, ContractSet};
use crate::spec::rules::{Action, AnomalyKind, RuleSet, RulesSet};
use crate::spec::yaml::Problems;
use crate::table::audit::{BuildRecord, BuildStatus, RunRecord, commit_build, failure_log_schema, parquet_bytes};
use crate::table::bronze::RunFileWriter;
use crate::table::lake::{Lake, layout};
use crate::table::silver::{
    Delta, FP, Manifest, OUTCOME, RUN_ID, Side, c, dict_type, key_schema, layers, manifest, relayer, state_schema,
    table_over_build_files,
};
pub use crate::table::silver::{build_files, snapshot_table};

/// `silver_build_id` (Utf8): the build that wrote a silver row.
pub const SILVER_BUILD_ID: &str = "silver_build_id";

/// What `ingot build` was asked to do.
#[derive(Debug, Clone, Default)]
pub struct BuildOptions {
    pub full: bool,
    pub rebuild_where: Option<String>,
    pub rules_version: Option<i32>,
}

/// A finished build: its record (committed) and the number of rows of the published table.
#[derive(Debug, Clone)]
pub struct Built {
    pub record: BuildRecord,
    /// Rows of the snapshot (0 for a failed build).
    pub table_rows: u64,
    /// Rows of the snapshot kept from the previous build.
    pub kept_rows: u64,
}

fn now_micros() -> i64 {
    chrono::Utc::now().timestamp_micros()
}

/// For every row of a text column, `f(value)` evaluated once per distinct value.
fn per_value<T: Copy>(col: &ArrayRef, mut f: impl FnMut(&str) -> T) -> Result<Vec<T>> {
    let dict = arrow_cast(col, &dict_type())?;
    let dict = dict.as_dictionary::<Int32Type>();
    let values = arrow_cast(dict.values(), &DataType::Utf8)?;
    let values = values.as_string::<i32>();
    let mapped: Vec<T> = (0..values.len()).map(|i| f(values.value(i))).collect();
    Ok(dict.keys().values().iter().map(|k| mapped[*k as usize]).collect())
}

/// The columns `silver.<table>` gets from `rules` (without executing anything), for a table
/// that has no build yet.
pub async fn planned_schema(ctx: &SessionContext, contracts: &ContractSet, rules: &RuleSet) -> Result<SchemaRef> {
    let inputs = read_inputs(ctx, contracts, rules).await?;
    let t = transform(ctx, rules, &inputs.contract, inputs.input, &inputs.lookups)?;
    let df = flag(t.passed.with_column(SILVER_BUILD_ID, lit(""))?, rules)?;
    Ok(Arc::new(df.schema().as_arrow().clone()))
}

/// Load the rules of `table` (refusing to build when any contract or rules file has a problem).
pub fn load_rules(ws: &Workspace, catalog: &Catalog, table: &str, version: Option<i32>) -> Result<Arc<RuleSet>> {
    let mut problems = Problems::default();
    let rules = RulesSet::load(&ws.rules_dir, &catalog.contracts, &mut problems);
    let mut all = catalog.problems.items.clone();
    all.extend(problems.items);
    if !all.is_empty() {
        return Err(Error::Config(all));
    }
    rules.select(table, version)
}

/// Digest of what `resolve` reads: the source's and lookups' contract files and the lookups'
/// committed data runs. When it differs from the previous build's, every row is processed again.
fn inputs_digest(catalog: &Catalog, contract: &Contract) -> Result<String> {
    let mut h = sha2::Sha256::new();
    let file = |p: &std::path::Path| std::fs::read(p).map_err(|e| Error::io(p.display(), e));
    h.update(file(&contract.path)?);
    let lookups: BTreeSet<&str> = contract.resolve.iter().map(|r| r.lookup.as_str()).collect();
    for source in lookups {
        h.update(format!("\nlookup {source}\n"));
        if let Some(lc) = catalog.contracts.contracts.get(source) {
            h.update(file(&lc.path)?);
        }
        let mut runs: Vec<_> = catalog
            .runs
            .iter()
            .filter(|r| r.source == source && r.has_data())
            .collect();
        runs.sort_by_key(|r| r.seq);
        for r in runs {
            h.update(format!("\n{}", r.run_id));
        }
    }
    Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

/// Parse `--rebuild-where` against the silver table's columns; only `rules_version` may appear.
pub fn parse_rebuild_filter(ctx: &SessionContext, schema: &Schema, pred: &str) -> Result<Expr> {
    let df_schema = DFSchema::try_from(schema.clone())?;
    let bad = |msg: String| Error::Invalid(format!("--rebuild-where \"{pred}\": {msg}"));
    let expr = ctx.parse_sql_expr(pred, &df_schema).map_err(|e| bad(format!("{e}")))?;
    let others: BTreeSet<String> = expr
        .column_refs()
        .into_iter()
        .map(|c| c.name.clone())
        .filter(|n| n != RULES_VERSION)
        .collect();
    if !others.is_empty() {
        return Err(bad(format!(
            "only {RULES_VERSION} may be used, not {}",
            others.into_iter().collect::<Vec<_>>().join(", ")
        )));
    }
    let nested = expr.exists(|e| {
        Ok(matches!(
            e,
            Expr::ScalarSubquery(_)
                | Expr::Exists(_)
                | Expr::InSubquery(_)
                | Expr::AggregateFunction(_)
                | Expr::WindowFunction(_)
        ))
    })?;
    if nested {
        return Err(bad("subqueries, aggregates and window functions are not allowed".into()));
    }
    let ty = expr.get_type(&df_schema).map_err(|e| bad(format!("{e}")))?;
    if ty != DataType::Boolean {
        return Err(bad(format!("the predicate must be boolean, it is {ty}")));
    }
    Ok(expr)
}

/// `batch` with the columns cast to `schema`'s types (same order).
fn conform(batch: &RecordBatch, schema: &SchemaRef) -> Result<RecordBatch> {
    let mut cols = Vec::with_capacity(batch.num_columns());
    for (col, field) in batch.columns().iter().zip(schema.fields()) {
        if col.data_type() == field.data_type() {
            cols.push(col.clone());
        } else {
            cols.push(arrow_cast(col, field.data_type())?);
        }
    }
    Ok(RecordBatch::try_new(schema.clone(), cols)?)
}

/// Build `table`; see the module documentation. A build that fails a `fail` validation returns
/// its committed `failed` record (the caller exits 1); other errors are returned as errors.
pub async fn build(ws: &Workspace, table: &str, opts: &BuildOptions) -> Result<Built> {
    limit_arenas();
    let build_id = uuid::Uuid::now_v7().to_string();
    let started_at = now_micros();
    let catalog = crate::engine::catalog::open(ws).await?;
    let rules = load_rules(ws, &catalog, table, opts.rules_version)?;
    let ours: Vec<&BuildRecord> = catalog.builds.iter().filter(|b| b.table == table).collect();
    let seq = ours.iter().map(|b| b.seq).max().unwrap_or(0) + 1;
    if let Some(b) = ours.iter().find(|b| {
        b.status == BuildStatus::Succeeded && b.rules_version == rules.version && b.rules_sha256 != rules.sha256
    }) {
        return Err(Error::Invalid(format!(
            "{}: rules version {} of \"{table}\" was used by build {} (sha256 {}) and has changed since \
             (sha256 {} now); a rules version is immutable once used: restore the file and put the \
             change in a new version, {}",
            rules.path.display(),
            rules.version,
            b.build_id,
            b.rules_sha256,
            rules.sha256,
            rules
                .path
                .with_file_name(format!("v{}.yaml", next_version(ws, &catalog, table, rules.version)))
                .display()
        )));
    }
    let previous = latest_build(&catalog.builds, table).cloned();
    let mut record = BuildRecord {
        build_id: build_id.clone(),
        table: table.to_string(),
        rules_version: rules.version,
        rules_sha256: rules.sha256.clone(),
        mode: "full".into(),
        rebuild_filter: opts.rebuild_where.clone(),
        started_at,
        finished_at: started_at,
        status: BuildStatus::Succeeded,
        rows_read: 0,
        rows_written: 0,
        rows_filtered: 0,
        rows_rejected: 0,
        rows_flagged: 0,
        error: None,
        rolled_back_at: None,
        seq,
    };
    match run(ws, &catalog, &rules, previous.as_ref(), opts, &mut record).await {
        Ok(built) => Ok(built),
        Err(Error::Invalid(m)) => Err(Error::Invalid(m)),
        Err(Error::Config(m)) => Err(Error::Config(m)),
        Err(Error::Locked(m)) => Err(Error::Locked(m)),
        Err(e) => {
            // Record the failure (best effort) so the build log tells what happened.
            record.status = BuildStatus::Failed;
            record.error = Some(e.to_string());
            record.finished_at = now_micros();
            let _ = commit_build(&ws.lake, &record).await;
            Err(e)
        }
    }
}

/// The version to suggest for an edited rules file: one more than the highest there is.
fn next_version(ws: &Workspace, catalog: &Catalog, table: &str, version: i32) -> i32 {
    let mut problems = Problems::default();
    let rules = RulesSet::load(&ws.rules_dir, &catalog.contracts, &mut problems);
    rules.latest(table).map(|r| r.version).unwrap_or(version).max(version) + 1
}

/// Encoded bytes after which a silver part writer closes its row group.
const ROW_GROUP_BYTES: usize = 24 << 20;

/// A writer of one build-scoped Parquet file with bounded row groups.
fn part_writer(lake: &Lake, rel: String, schema: SchemaRef) -> RunFileWriter {
    RunFileWriter::new(lake, rel, schema).with_row_group_bytes(ROW_GROUP_BYTES)
}

/// Runs whose bronze file the build reads, newest first (the order of `bronze.<source>_current`).
fn runs_newest_first<'a>(catalog: &'a Catalog, source: &str) -> Vec<&'a RunRecord> {
    let mut runs = crate::engine::catalog::current_runs(&catalog.runs, source);
    runs.sort_by(|a, b| (b.started_at, &b.run_id).cmp(&(a.started_at, &a.run_id)));
    runs
}

fn run_table(lake: &Lake, contract: &Contract, run: &RunRecord) -> Result<Arc<dyn TableProvider>> {
    table_over(
        vec![lake.url(&layout::bronze_data(&run.source, &run.run_id))],
        contract.bronze_schema(),
    )
}

/// One pass over the fingerprints of every bronze run of the source, newest first: the current
/// run of every record (none for a record whose latest version is a tombstone).
async fn current_keys(
    ctx: &SessionContext,
    cluster: Option<&str>,
    lake: &Lake,
    contract: &Contract,
    runs: &[&RunRecord],
) -> Result<Keys> {
    let capacity: i64 = runs.iter().map(|r| r.rows_inserted + r.rows_updated).sum();
    let mut keys = Keys::new(
        runs.iter().map(|r| r.run_id.clone()).collect(),
        usize::try_from(capacity).unwrap_or(0),
    );
    for (i, run) in runs.iter().enumerate() {
        let fps = ctx
            .read_table(run_table(lake, contract, run)?)?
            .select(vec![c(FP), c(crate::table::bronze::IS_DELETED)])?;
        let mut stream = crate::engine::exec::stream(cluster, fps, "build: bronze fingerprints").await?;
        while let Some(b) = stream.next().await {
            let b = b?;
            let mut missing = false;
            let deleted = b.column(1).as_boolean_opt();
            for_each_fp(b.column(0), |row, fp| match fp {
                Some(fp) => {
                    let tombstone = deleted.is_some_and(|d| d.is_valid(row) && d.value(row));
                    keys.see_current(fp, i as u32, tombstone)
                }
                None => missing = true,
            })?;
            if missing {
                return Err(Error::RunFailed(format!(
                    "bronze run {} of \"{}\" has a row without {FP}",
                    run.run_id, run.source
                )));
            }
        }
    }
    keys.forget_deleted();
    Ok(keys)
}

/// Add the previous build's state to `keys`.
async fn previous_state(
    ctx: &SessionContext,
    cluster: Option<&str>,
    lake: &Lake,
    keys: &mut Keys,
    table: &str,
    build_id: &str,
) -> Result<()> {
    let m = manifest(lake, table, build_id).await?;
    let mut index: HashMap<String, u32> = keys
        .runs
        .iter()
        .enumerate()
        .map(|(i, r)| (r.clone(), i as u32))
        .collect();
    let df = if m.deltas.is_empty() {
        ctx.read_table(table_over_build_files(ctx, lake, table, build_id, &m.state).await?)?
    } else {
        match layers(ctx, lake, table, build_id, Side::State).await? {
            Some(df) => df,
            None => return Ok(()),
        }
    };
    let df = df.select(vec![c(FP), c(RUN_ID), c(OUTCOME), c(RULES_VERSION)])?;
    let mut stream = crate::engine::exec::stream(cluster, df, "build: previous state").await?;
    while let Some(b) = stream.next().await {
        let b = b?;
        let runs = per_value(b.column(1), |r| keys.run_index(r, &mut index))?;
        let outcomes = per_value(b.column(2), outcome_of)?;
        let versions = arrow_cast(b.column(3), &DataType::Int32)?;
        let versions = versions.as_primitive::<Int32Type>();
        let mut rows = Vec::with_capacity(b.num_rows());
        for_each_fp(b.column(0), |i, fp| {
            if let Some(fp) = fp {
                rows.push((i, fp));
            }
        })?;
        for (i, fp) in rows {
            keys.see_previous(fp, runs[i], versions.value(i), outcomes[i]);
        }
    }
    Ok(())
}

/// The rules versions of the previous state that `pred` (a predicate on `rules_version`) matches.
async fn matching_versions(ctx: &SessionContext, keys: &Keys, pred: &Expr) -> Result<HashSet<i32>> {
    let versions: BTreeSet<i32> = keys
        .map
        .values()
        .filter(|e| e.prev != NONE)
        .map(|e| e.version)
        .collect();
    let schema = Arc::new(Schema::new(vec![Field::new(RULES_VERSION, DataType::Int32, true)]));
    let batch = RecordBatch::try_new(
        schema,
        vec![Arc::new(Int32Array::from(versions.into_iter().collect::<Vec<_>>()))],
    )?;
    // A handful of distinct versions: the result is tiny.
    let matched = ctx.read_batch(batch)?.filter(pred.clone().is_true())?.collect().await?;
    let mut out = HashSet::new();
    for b in matched {
        out.extend(b.column(0).as_primitive::<Int32Type>().iter().flatten());
    }
    Ok(out)
}

/// Evaluates the flag projection on batches with the columns of `base`.
struct Flagger {
    exprs: Vec<Arc<dyn PhysicalExpr>>,
    schema: SchemaRef,
    base: SchemaRef,
    is_anomaly: usize,
}

impl Flagger {
    fn new(ctx: &SessionContext, rules: &RuleSet, base: SchemaRef, sets: &[Option<Arc<FpSet>>]) -> Result<Flagger> {
        let df_schema = DFSchema::try_from(base.as_ref().clone())?;
        let window = |i: usize| -> Expr {
            match sets.get(i).cloned().flatten() {
                Some(set) => Arc::new(in_set_udf(set)).call(vec![c(FP)]),
                None => lit(false),
            }
        };
        let projection = flag_projection(&df_schema, rules, window)?;
        let state = ctx.state();
        let mut exprs = Vec::new();
        let mut fields = Vec::new();
        for e in projection {
            let (_, field) = e.to_field(&df_schema)?;
            fields.push(field.as_ref().clone().with_nullable(true));
            exprs.push(state.create_physical_expr(e, &df_schema)?);
        }
        let schema = Arc::new(Schema::new(fields));
        let is_anomaly = schema.index_of(IS_ANOMALY)?;
        Ok(Flagger {
            exprs,
            schema,
            base,
            is_anomaly,
        })
    }

    /// `batch` (the base columns, in order) flagged; also returns how many rows are anomalies.
    fn apply(&self, batch: &RecordBatch) -> Result<(RecordBatch, u64)> {
        let batch = conform(batch, &self.base)?;
        let n = batch.num_rows();
        let mut cols = Vec::with_capacity(self.exprs.len());
        for (e, f) in self.exprs.iter().zip(self.schema.fields()) {
            let a = e.evaluate(&batch)?.into_array(n)?;
            cols.push(if a.data_type() == f.data_type() {
                a
            } else {
                arrow_cast(&a, f.data_type())?
            });
        }
        let out = RecordBatch::try_new(self.schema.clone(), cols)?;
        let flagged = out.column(self.is_anomaly).as_boolean().true_count() as u64;
        Ok((out, flagged))
    }
}

/// Write `keys` to the build-scoped file `rel` ([`key_schema`]): a delta layer's deletion files,
/// and on a cluster the key sets [`join_keys`] joins with (no keys: no file). Returns the number
/// of keys.
async fn write_keys(lake: &Lake, rel: &str, keys: impl Iterator<Item = super::keys::Fp>) -> Result<u64> {
    const CHUNK: usize = 1 << 16;
    let schema = key_schema();
    let mut w = part_writer(lake, rel.to_string(), schema.clone());
    let mut b = FixedSizeBinaryBuilder::with_capacity(CHUNK, 16);
    let mut n = 0usize;
    for fp in keys {
        b.append_value(fp.to_be_bytes())?;
        n += 1;
        if n.is_multiple_of(CHUNK) {
            w.write(&RecordBatch::try_new(schema.clone(), vec![Arc::new(b.finish())])?)
                .await?;
        }
    }
    if !n.is_multiple_of(CHUNK) {
        w.write(&RecordBatch::try_new(schema, vec![Arc::new(b.finish())])?)
            .await?;
    }
    w.finish().await
}

/// `rows` semi- or anti-joined on their fingerprint's key with the key file `rel`: the portable
/// form of `__ingot_pick` / `NOT __ingot_in_set` (a run holds one row per fingerprint, so the
/// rows are the same).
fn join_keys(ctx: &SessionContext, lake: &Lake, rows: DataFrame, rel: &str, how: JoinType) -> Result<DataFrame> {
    const KEY: &str = "__ingot_key";
    let keys = ctx
        .read_table(table_over(vec![lake.url(rel)], key_schema())?)?
        .select(vec![c(FP).alias(KEY)])?;
    let key = Arc::new(fp128_udf()).call(vec![c(FP)]);
    Ok(rows.join_on(keys, how, [key.eq(c(KEY))])?)
}

/// Failure-log rows of this build.
struct Failures {
    build_id: String,
    source: String,
    table: String,
    version: i32,
    failed_at: i64,
}

impl Failures {
    /// From `(fingerprint, row number, rule, reason, payload)` columns.
    fn batch(
        &self,
        fp: &ArrayRef,
        row: &ArrayRef,
        rule: &ArrayRef,
        reason: &ArrayRef,
        payload: &ArrayRef,
    ) -> Result<RecordBatch> {
        let n = fp.len();
        let text = |a: &ArrayRef| -> Result<ArrayRef> {
            let a = arrow_cast(a, &DataType::Utf8)?;
            let s = a.as_string::<i32>();
            Ok(Arc::new(StringArray::from_iter_values(
                (0..n).map(|i| if s.is_null(i) { "" } else { s.value(i) }),
            )))
        };
        let repeat = |v: &str| -> ArrayRef { Arc::new(StringArray::from_iter_values(std::iter::repeat_n(v, n))) };
        let cols: Vec<ArrayRef> = vec![
            repeat(&self.build_id),
            repeat("silver"),
            repeat(&self.source),
            repeat(&self.table),
            arrow_cast(row, &DataType::Int64)?,
            arrow_cast(fp, &DataType::Utf8)?,
            text(payload)?,
            text(rule)?,
            text(reason)?,
            Arc::new(Int32Array::from_value(self.version, n)),
            Arc::new(TimestampMicrosecondArray::from_value(self.failed_at, n).with_timezone("UTC")),
        ];
        Ok(RecordBatch::try_new(failure_log_schema(), cols)?)
    }
}

/// State rows `(key, run, outcome, version)` from a fingerprint and a run id column.
fn state_rows(fp: &ArrayRef, run: &ArrayRef, outcome: u8, version: i32) -> Result<RecordBatch> {
    let n = fp.len();
    let mut fps = FixedSizeBinaryBuilder::with_capacity(n, 16);
    let mut err = None;
    for_each_fp(fp, |_, v| {
        // A null fingerprint cannot reach silver: bronze always has one.
        if let Err(e) = fps.append_value(v.unwrap_or_default().to_be_bytes()) {
            err = Some(e);
        }
    })?;
    if let Some(e) = err {
        return Err(e.into());
    }
    Ok(RecordBatch::try_new(
        state_schema(),
        vec![
            Arc::new(fps.finish()),
            arrow_cast(run, &dict_type())?,
            Arc::new(DictionaryArray::<Int32Type>::try_new(
                Int32Array::from_value(0, n),
                Arc::new(StringArray::from(vec![outcome_name(outcome)])),
            )?),
            Arc::new(Int32Array::from_value(version, n)),
        ],
    )?)
}

/// The state rows the previous state carries over (records this build did not process).
async fn write_carried(lake: &Lake, rel: &str, keys: &Keys) -> Result<u64> {
    const CHUNK: usize = 1 << 16;
    let schema = state_schema();
    let mut w = part_writer(lake, rel.to_string(), schema.clone());
    let mut fps = FixedSizeBinaryBuilder::with_capacity(CHUNK, 16);
    let mut runs = StringDictionaryBuilder::<Int32Type>::new();
    let mut outcomes = StringDictionaryBuilder::<Int32Type>::new();
    let mut versions = Int32Builder::with_capacity(CHUNK);
    let mut n = 0usize;
    let flush = |fps: &mut FixedSizeBinaryBuilder,
                 runs: &mut StringDictionaryBuilder<Int32Type>,
                 outcomes: &mut StringDictionaryBuilder<Int32Type>,
                 versions: &mut Int32Builder|
     -> Result<RecordBatch> {
        Ok(RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(fps.finish()),
                Arc::new(runs.finish()),
                Arc::new(outcomes.finish()),
                Arc::new(versions.finish()),
            ],
        )?)
    };
    for (fp, e) in &keys.map {
        if !keys.carry(e) {
            continue;
        }
        fps.append_value(fp.to_be_bytes())?;
        runs.append_value(keys.runs.get(e.prev as usize).map(String::as_str).unwrap_or(""));
        outcomes.append_value(outcome_name(e.outcome));
        versions.append_value(e.version);
        n += 1;
        if n.is_multiple_of(CHUNK) {
            w.write(&flush(&mut fps, &mut runs, &mut outcomes, &mut versions)?)
                .await?;
        }
    }
    if !n.is_multiple_of(CHUNK) {
        w.write(&flush(&mut fps, &mut runs, &mut outcomes, &mut versions)?)
            .await?;
    }
    w.finish().await
}

/// What one partition of the build's outputs wrote.
#[derive(Default)]
struct PartOut {
    /// Snapshot rows written (kept or new).
    rows: u64,
    /// New rows (this build's).
    written: u64,
    flagged: u64,
    rejected: u64,
    failed: u64,
    first_failed: Vec<String>,
    failed_rules: BTreeSet<String>,
    data: Option<String>,
    state: Option<String>,
}

impl PartOut {
    fn merge(&mut self, o: PartOut, data: &mut Vec<String>, state: &mut Vec<String>) {
        self.rows += o.rows;
        self.written += o.written;
        self.flagged += o.flagged;
        self.rejected += o.rejected;
        self.failed += o.failed;
        for f in o.first_failed {
            if self.first_failed.len() < 3 {
                self.first_failed.push(f);
            }
        }
        self.failed_rules.extend(o.failed_rules);
        data.extend(o.data);
        state.extend(o.state);
    }
}

/// Everything a partition task needs (owned: tasks run on the runtime's threads).
struct PartCtx {
    lake: Lake,
    table: String,
    build_id: String,
    flagger: Arc<Flagger>,
    base: SchemaRef,
    width: usize,
    fp_idx: usize,
    run_idx: usize,
    version: i32,
    actions: Arc<HashMap<String, Action>>,
    failures: Arc<Failures>,
    fail_w: Arc<tokio::sync::Mutex<RunFileWriter>>,
}

impl PartCtx {
    /// Kept rows of the previous snapshot: flags recomputed, written to `part`.
    async fn kept(self: Arc<Self>, mut stream: SendableRecordBatchStream, part: String) -> Result<PartOut> {
        let rel = layout::silver_file(&self.table, &self.build_id, &part);
        let mut w = part_writer(&self.lake, rel, self.flagger.schema.clone());
        let mut out = PartOut::default();
        while let Some(b) = stream.next().await {
            let (b, f) = self.flagger.apply(&b?)?;
            out.rows += b.num_rows() as u64;
            out.flagged += f;
            w.write(&b).await?;
        }
        if w.finish().await? > 0 {
            out.data = Some(part);
        }
        Ok(out)
    }

    /// Rows of the transform: passing rows flagged into `part`, rejections to the failure file,
    /// every outcome into `state_part`.
    async fn new_rows(
        self: Arc<Self>,
        mut stream: SendableRecordBatchStream,
        part: String,
        state_part: String,
    ) -> Result<PartOut> {
        let rel = layout::silver_file(&self.table, &self.build_id, &part);
        let mut w = part_writer(&self.lake, rel, self.flagger.schema.clone());
        let state_rel = layout::silver_file(&self.table, &self.build_id, &state_part);
        let mut sw = part_writer(&self.lake, state_rel, state_schema());
        let mut out = PartOut::default();
        let width = self.width;
        while let Some(b) = stream.next().await {
            let b = b?;
            let passed = is_null(b.column(width + 1))?;
            let good = if passed.true_count() == b.num_rows() {
                b.clone()
            } else {
                filter_record_batch(&b, &passed)?
            };
            if good.num_rows() > 0 {
                sw.write(&state_rows(
                    good.column(self.fp_idx),
                    good.column(self.run_idx),
                    PASSED,
                    self.version,
                )?)
                .await?;
                let mut cols: Vec<ArrayRef> = good.columns()[..width].to_vec();
                cols.push(Arc::new(StringArray::from_iter_values(std::iter::repeat_n(
                    self.build_id.as_str(),
                    good.num_rows(),
                ))));
                let (rows, f) = self.flagger.apply(&RecordBatch::try_new(self.base.clone(), cols)?)?;
                out.rows += rows.num_rows() as u64;
                out.written += rows.num_rows() as u64;
                out.flagged += f;
                w.write(&rows).await?;
            }
            if passed.true_count() == b.num_rows() {
                continue;
            }
            let bad = filter_record_batch(&b, &not(&passed)?)?;
            let rule = arrow_cast(bad.column(width + 1), &DataType::Utf8)?;
            let rule = rule.as_string::<i32>();
            let reject: BooleanArray = (0..bad.num_rows())
                .map(|i| Some(self.actions.get(rule.value(i)) != Some(&Action::Fail)))
                .collect();
            let failing = filter_record_batch(&bad, &not(&reject)?)?;
            if failing.num_rows() > 0 {
                let r = arrow_cast(failing.column(width + 1), &DataType::Utf8)?;
                let r = r.as_string::<i32>();
                let numbers = arrow_cast(failing.column(width), &DataType::Int64)?;
                let numbers = numbers.as_primitive::<Int64Type>();
                let payload = arrow_cast(failing.column(width + 3), &DataType::Utf8)?;
                let payload = payload.as_string::<i32>();
                for i in 0..failing.num_rows() {
                    out.failed_rules.insert(r.value(i).to_string());
                    if out.first_failed.len() < 3 {
                        let number = if numbers.is_valid(i) {
                            numbers.value(i).to_string()
                        } else {
                            "?".into()
                        };
                        let p = if payload.is_valid(i) { payload.value(i) } else { "" };
                        out.first_failed.push(format!("record {number}: {p}"));
                    }
                }
                out.failed += failing.num_rows() as u64;
            }
            let rej = filter_record_batch(&bad, &reject)?;
            if rej.num_rows() > 0 {
                out.rejected += rej.num_rows() as u64;
                sw.write(&state_rows(
                    rej.column(self.fp_idx),
                    rej.column(self.run_idx),
                    REJECTED,
                    self.version,
                )?)
                .await?;
                let batch = self.failures.batch(
                    rej.column(self.fp_idx),
                    rej.column(width),
                    rej.column(width + 1),
                    rej.column(width + 2),
                    rej.column(width + 3),
                )?;
                self.fail_w.lock().await.write(&batch).await?;
            }
        }
        if w.finish().await? > 0 {
            out.data = Some(part);
        }
        if sw.finish().await? > 0 {
            out.state = Some(state_part);
        }
        Ok(out)
    }
}

/// Run the tasks concurrently (one per partition) and merge what they wrote.
async fn join_parts(
    handles: Vec<tokio::task::JoinHandle<Result<PartOut>>>,
    total: &mut PartOut,
    data: &mut Vec<String>,
    state: &mut Vec<String>,
) -> Result<()> {
    let mut first_err = None;
    for h in handles {
        match h.await {
            Ok(Ok(o)) => total.merge(o, data, state),
            Ok(Err(e)) => {
                first_err.get_or_insert(e);
            }
            Err(e) => {
                first_err.get_or_insert(Error::RunFailed(format!("build task failed: {e}")));
            }
        }
    }
    match first_err {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

async fn run(
    ws: &Workspace,
    catalog: &Catalog,
    rules: &RuleSet,
    previous: Option<&BuildRecord>,
    opts: &BuildOptions,
    record: &mut BuildRecord,
) -> Result<Built> {
    let ctx = &catalog.ctx;
    // Plans run here or on the cluster (`--cluster`): see crate::engine::exec for which.
    let cluster = ws.cluster.as_deref();
    let lake = &ws.lake;
    let table = record.table.clone();
    let build_id = record.build_id.clone();
    let inputs = read_inputs(ctx, &catalog.contracts, rules).await?;
    let contract = inputs.contract.clone();
    let digest = inputs_digest(catalog, &contract)?;
    let runs = runs_newest_first(catalog, &rules.source);
    // the runs this build accounts for, oldest first (the next build's delta starts after them)
    let run_ids: Vec<String> = runs.iter().rev().map(|r| r.run_id.clone()).collect();

    // Which records to process, which snapshot rows to keep, which state rows to carry. A full
    // build over one bronze run needs none of it (every row is current and processed); otherwise
    // one pass over the fingerprints of bronze and one over the previous state give compact keys.
    let mut mode = Mode::Full;
    let mut previous_build: Option<&BuildRecord> = None;
    let mut rebuild_expr = None;
    match (previous, &opts.rebuild_where, opts.full) {
        (None, Some(_), _) => {
            return Err(Error::Invalid(format!(
                "--rebuild-where: \"{table}\" has no succeeded build to rebuild rows of; run `ingot build {table}` first"
            )));
        }
        (None, None, _) | (Some(_), None, true) => {}
        (Some(prev), Some(pred), _) => {
            record.mode = "rebuild".into();
            let snap = ctx.read_table(snapshot_table(ctx, lake, &table, &prev.build_id).await?)?;
            rebuild_expr = Some(parse_rebuild_filter(ctx, snap.schema().as_arrow(), pred)?);
            previous_build = Some(prev);
        }
        (Some(prev), None, false) => {
            record.mode = "incremental".into();
            let previous_digest = lake
                .get(&layout::silver_inputs(&table, &prev.build_id))
                .await?
                .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
                .and_then(|v| v["inputs_digest"].as_str().map(str::to_string));
            // When what `resolve` reads changed, any row's resolved value may have: all of them
            // are processed again.
            if previous_digest.as_deref() == Some(digest.as_str()) {
                mode = Mode::Incremental { version: rules.version };
                previous_build = Some(prev);
            }
        }
    }
    // A delta build when the previous build's layers can be extended (see `delta_base`): only the
    // runs committed since are read.
    let mut delta = match (&mode, previous_build) {
        (Mode::Incremental { .. }, Some(prev)) if cluster.is_none() => {
            delta_base(lake, &table, prev, rules, &runs).await?
        }
        _ => None,
    };
    let mut delta_keys: Option<Keys> = None;
    if let Some(d) = &delta {
        if d.new_runs.is_empty() {
            // nothing committed since: the table is the previous one
            let prev = previous_build.ok_or_else(|| Error::RunFailed("delta build without a previous build".into()))?;
            let mut m = d.manifest.clone();
            m.runs = Some(run_ids.clone());
            return publish_unchanged(lake, record, prev, m, &digest).await;
        }
        let keys = current_keys(ctx, cluster, lake, &contract, &d.new_runs).await?;
        let deleted_before: u64 = d.manifest.deltas.iter().map(|x| x.deleted_keys).sum();
        // compaction: past a fraction of the table deleted, a build rewrites the whole snapshot
        let touched = (keys.map.len() + keys.tombstones.len()) as u64;
        if (deleted_before + touched) as f64 <= delta_limit()? * d.rows as f64 {
            delta_keys = Some(keys);
        } else {
            delta = None;
        }
    }
    let work_runs: Vec<&RunRecord> = match &delta {
        Some(d) => d.new_runs.clone(),
        None => runs.clone(),
    };
    let keys = if let Some(keys) = delta_keys {
        Some(keys)
    } else if matches!(mode, Mode::Full)
        && previous_build.is_none()
        && runs.len() <= 1
        && runs.iter().all(|r| r.rows_deleted == 0)
    {
        None
    } else {
        let mut keys = current_keys(ctx, cluster, lake, &contract, &runs).await?;
        if let Some(prev) = previous_build {
            previous_state(ctx, cluster, lake, &mut keys, &table, &prev.build_id).await?;
        }
        keys.mode = match &rebuild_expr {
            Some(expr) => Mode::Rebuild {
                matching: matching_versions(ctx, &keys, expr).await?,
            },
            None => mode,
        };
        Some(keys)
    };
    let reservation = MemoryConsumer::new("silver build keys").register(&ctx.runtime_env().memory_pool);
    reservation.grow(keys.as_ref().map(Keys::bytes).unwrap_or(0));
    let mut per_run = vec![0u64; work_runs.len()];
    let mut kept_records = 0u64;
    match &keys {
        None => {
            for (i, r) in work_runs.iter().enumerate() {
                per_run[i] = u64::try_from(r.rows_inserted + r.rows_updated).unwrap_or(0);
            }
        }
        Some(keys) => {
            for e in keys.map.values() {
                if keys.process(e) {
                    per_run[e.cur as usize] += 1;
                } else if keys.keep_row(e) {
                    kept_records += 1;
                }
            }
        }
    }
    let keys = keys.map(Arc::new);

    // Nothing changed since the previous build (no record to process, none removed, the same
    // rules): the table is the previous one, so this build's manifest names its files.
    if let (Some(prev), Some(k)) = (previous_build, &keys)
        && matches!(k.mode, Mode::Incremental { .. })
        && per_run.iter().all(|n| *n == 0)
        && prev.rules_version == rules.version
        && !k.map.values().any(|e| e.prev != NONE && e.cur == NONE)
    {
        let mut m = relayer(&manifest(lake, &table, &prev.build_id).await?, &table, &prev.build_id);
        m.runs = Some(run_ids.clone());
        m.rows = Some(kept_records);
        return publish_unchanged(lake, record, prev, m, &digest).await;
    }

    // The records to process: the current rows of the runs that hold any (all rows of a run
    // whose rows are all to be processed, without looking them up). On a cluster the key sets
    // cannot be UDFs over this process's memory: they are written as build-scoped files of keys
    // that the plans join with (deleted before the commit).
    let mut key_files: Vec<String> = Vec::new();
    let mut input: Option<DataFrame> = None;
    for (i, run) in work_runs.iter().enumerate() {
        if per_run[i] == 0 {
            continue;
        }
        let mut rows = ctx.read_table(run_table(lake, &contract, run)?)?;
        let whole = i64::try_from(per_run[i]).ok() == Some(run.rows_written());
        if let Some(keys) = keys.as_ref().filter(|_| !whole) {
            rows = match cluster {
                None => rows.filter(Arc::new(pick_udf(keys.clone(), i as u32)).call(vec![c(FP)]))?,
                Some(_) => {
                    let picked = keys
                        .map
                        .iter()
                        .filter(|(_, e)| e.cur == i as u32 && keys.process(e))
                        .map(|(fp, _)| *fp);
                    let rel = layout::silver_file(&table, &build_id, &format!("keys-pick-{i:05}.parquet"));
                    if write_keys(lake, &rel, picked).await? == 0 {
                        rows.filter(lit(false))?
                    } else {
                        key_files.push(rel.clone());
                        join_keys(ctx, lake, rows, &rel, JoinType::LeftSemi)?
                    }
                }
            };
        }
        input = Some(match input {
            None => rows,
            Some(df) => df.union(rows)?,
        });
    }
    let input = match input {
        Some(df) => df,
        None => ctx.read_table(table_over(vec![], contract.bronze_schema())?)?,
    };
    let split = transform_split(ctx, rules, &contract, input, &inputs.lookups)?;
    let silver_fields: Vec<Field> = split.rows.schema().as_arrow().fields()[..split.silver_width]
        .iter()
        .map(|f| f.as_ref().clone().with_nullable(true))
        .collect();
    let mut base_fields = silver_fields;
    base_fields.push(Field::new(SILVER_BUILD_ID, DataType::Utf8, true));
    let base = Arc::new(Schema::new(base_fields));

    // A delta build: what the previous snapshot held of the processed records, the groups the
    // window anomalies recompute, and the kept rows whose window flags change (rewritten).
    let mut delta_out: Option<DeltaOut> = None;
    let mut delta_sets = None;
    let mut kept_delta = None;
    if let (Some(d), Some(prev), Some(keys)) = (&delta, previous_build, &keys) {
        // records with a new version or a tombstone in the new runs
        let processed: Arc<FpSet> = Arc::new(keys.map.keys().chain(&keys.tombstones).copied().collect());
        let view = layers(ctx, lake, &table, &prev.build_id, Side::Data)
            .await?
            .ok_or_else(|| Error::RunFailed(format!("build {} of \"{table}\" names no files", prev.build_id)))?;
        let (out, sets, changed) = delta_windows(rules, &base, &split, &view, processed.clone()).await?;
        if !changed.is_empty() {
            let cols: Vec<Expr> = base.fields().iter().map(|f| c(f.name())).collect();
            kept_delta = Some(
                view.filter(Arc::new(in_set_udf(Arc::new(changed.clone()))).call(vec![c(FP)]))?
                    .select(cols)?,
            );
        }
        let mut deleted: FpSet = changed;
        deleted.extend(processed.iter().copied());
        delta_sets = Some(sets);
        delta_out = Some(DeltaOut {
            deleted,
            processed,
            prev_rows: d.rows,
            ..out
        });
    }

    // The rows kept from the previous snapshot, in the new column order (flags recomputed).
    let kept = match (previous_build, &keys) {
        _ if delta.is_some() => kept_delta,
        (Some(prev), Some(keys)) if kept_records > 0 => {
            let snap = ctx.read_table(snapshot_table(ctx, lake, &table, &prev.build_id).await?)?;
            let want: Vec<(String, DataType)> = base
                .fields()
                .iter()
                .map(|f| (f.name().clone(), f.data_type().clone()))
                .collect();
            let have: Vec<(String, DataType)> = snap
                .schema()
                .fields()
                .iter()
                .filter(|f| f.name() != ANOMALY_FLAGS && f.name() != IS_ANOMALY)
                .map(|f| (f.name().clone(), f.data_type().clone()))
                .collect();
            let mut sorted_want = want.clone();
            let mut sorted_have = have.clone();
            sorted_want.sort();
            sorted_have.sort();
            if sorted_want != sorted_have {
                let show =
                    |v: &[(String, DataType)]| v.iter().map(|(n, t)| format!("{n} {t}")).collect::<Vec<_>>().join(", ");
                return Err(Error::Invalid(format!(
                    "rules v{} of \"{table}\" produce other columns than the rows kept from build {} \
                     (kept: {}; v{}: {}); rebuild every row with `ingot build {table} --full`",
                    rules.version,
                    prev.build_id,
                    show(&have),
                    rules.version,
                    show(&want)
                )));
            }
            // Every snapshot row's record is in the previous state, so a row is kept unless its
            // record is one of the few the build drops (processed, removed or rebuilt): a lookup
            // in a small set, not in the map of every record.
            let dropped: FpSet = keys
                .map
                .iter()
                .filter(|(_, e)| e.prev != NONE && e.outcome == PASSED && !keys.keep_row(e))
                .map(|(fp, _)| *fp)
                .collect();
            let snap = match cluster {
                _ if dropped.is_empty() => snap,
                None => {
                    let dropped = Arc::new(in_set_udf(Arc::new(dropped))).call(vec![c(FP)]);
                    snap.filter(Expr::Not(Box::new(dropped)))?
                }
                Some(_) => {
                    let rel = layout::silver_file(&table, &build_id, "keys-dropped.parquet");
                    write_keys(lake, &rel, dropped.into_iter()).await?;
                    key_files.push(rel.clone());
                    join_keys(ctx, lake, snap, &rel, JoinType::LeftAnti)?
                }
            };
            Some(snap.select(want.iter().map(|(n, _)| c(n)).collect::<Vec<_>>())?)
        }
        _ => None,
    };

    // Window anomalies over the few columns they read, of the whole new table: the rows for which
    // each fires, as sets of keys.
    let sets = match delta_sets {
        Some(sets) => sets,
        None => window_sets(cluster, rules, &base, &split, kept.as_ref()).await?,
    };
    release_free_memory();
    let flagger = Arc::new(Flagger::new(ctx, rules, base.clone(), &sets)?);

    // One pass, one task per partition: kept rows, then the transform's rows split into the
    // snapshot, the failures and the state.
    let failures_rel = layout::silver_failures(&build_id);
    let fail_w = Arc::new(tokio::sync::Mutex::new(part_writer(
        lake,
        failures_rel.clone(),
        failure_log_schema(),
    )));
    let schema = split.rows.schema().as_arrow().clone();
    let part = Arc::new(PartCtx {
        lake: lake.clone(),
        table: table.clone(),
        build_id: build_id.clone(),
        flagger: flagger.clone(),
        base: base.clone(),
        width: split.silver_width,
        fp_idx: schema.index_of(FP)?,
        run_idx: schema.index_of(RUN_ID)?,
        version: rules.version,
        actions: Arc::new(rules.validate.iter().map(|v| (v.name.clone(), v.action)).collect()),
        failures: Arc::new(Failures {
            build_id: build_id.clone(),
            source: rules.source.clone(),
            table: table.clone(),
            version: rules.version,
            failed_at: record.started_at,
        }),
        fail_w: fail_w.clone(),
    });
    let (mut total, mut data_files, mut state_files) = (PartOut::default(), Vec::new(), Vec::new());
    let mut n_part = 0usize;
    let mut name = |prefix: &str| {
        n_part += 1;
        format!("{prefix}-{:05}.parquet", n_part - 1)
    };
    if let Some(k) = kept {
        let handles = crate::engine::exec::streams(cluster, k, "build: kept rows")
            .await?
            .into_iter()
            .map(|s| tokio::spawn(part.clone().kept(s, name("part"))))
            .collect();
        join_parts(handles, &mut total, &mut data_files, &mut state_files).await?;
    }
    let handles = crate::engine::exec::streams(cluster, split.rows.clone(), "build: transform")
        .await?
        .into_iter()
        .map(|s| {
            let (p, st) = (name("part"), name("state"));
            tokio::spawn(part.clone().new_rows(s, p, st))
        })
        .collect();
    join_parts(handles, &mut total, &mut data_files, &mut state_files).await?;
    let extra_state = |rows: u64, st: String, list: &mut Vec<String>| {
        if rows > 0 {
            list.push(st);
        }
    };
    if let Some(rr) = split.resolve_rejected.clone() {
        let st = name("state");
        let mut sw = part_writer(lake, layout::silver_file(&table, &build_id, &st), state_schema());
        let mut stream = crate::engine::exec::stream(cluster, rr, "build: resolve rejections").await?;
        while let Some(b) = stream.next().await {
            let b = b?;
            if b.num_rows() == 0 {
                continue;
            }
            total.rejected += b.num_rows() as u64;
            sw.write(&state_rows(b.column(0), b.column(5), REJECTED, rules.version)?)
                .await?;
            let batch = part
                .failures
                .batch(b.column(0), b.column(1), b.column(2), b.column(3), b.column(4))?;
            fail_w.lock().await.write(&batch).await?;
        }
        extra_state(sw.finish().await?, st, &mut state_files);
    }
    let mut filtered = 0u64;
    if let Some(f) = split.filtered.clone() {
        let st = name("state");
        let mut sw = part_writer(lake, layout::silver_file(&table, &build_id, &st), state_schema());
        let mut stream = crate::engine::exec::stream(cluster, f, "build: filtered rows").await?;
        while let Some(b) = stream.next().await {
            let b = b?;
            filtered += b.num_rows() as u64;
            sw.write(&state_rows(b.column(0), b.column(1), FILTERED, rules.version)?)
                .await?;
        }
        extra_state(sw.finish().await?, st, &mut state_files);
    }
    if let Some(keys) = keys.as_ref().filter(|_| delta.is_none()) {
        let st = name("state");
        let n = write_carried(lake, &layout::silver_file(&table, &build_id, &st), keys).await?;
        extra_state(n, st, &mut state_files);
    }
    drop(reservation);
    drop(part);
    for rel in &key_files {
        lake.delete(rel).await?;
    }
    let fail_w = Arc::try_unwrap(fail_w)
        .map_err(|_| Error::RunFailed("build: the failure writer is still in use".into()))?
        .into_inner();
    let wrote_failures = fail_w.finish().await? > 0;

    // A `fail` validation: the build fails, nothing but its record is published.
    if total.failed > 0 {
        let names: Vec<String> = total.failed_rules.iter().map(|r| format!("\"{r}\"")).collect();
        record.status = BuildStatus::Failed;
        record.error = Some(format!(
            "validation {} (action: fail) failed for {} row{}; nothing was published; first failing {}",
            names.join(", "),
            total.failed,
            if total.failed == 1 { "" } else { "s" },
            total.first_failed.join("; ")
        ));
        record.finished_at = now_micros();
        commit_build(lake, record).await?;
        crate::table::failpoint::hit("build.after_commit")?;
        let mut rels: Vec<String> = data_files
            .iter()
            .chain(&state_files)
            .map(|n| layout::silver_file(&table, &build_id, n))
            .collect();
        if wrote_failures {
            rels.push(failures_rel);
        }
        for rel in rels {
            let _ = lake.delete(&rel).await;
        }
        return Ok(Built {
            record: record.clone(),
            table_rows: 0,
            kept_rows: 0,
        });
    }
    if let (Some(d), Some(out), Some(prev)) = (delta, delta_out, previous_build) {
        return publish_delta(
            lake,
            record,
            prev,
            d,
            out,
            DeltaFiles {
                data: data_files,
                state: state_files,
                run_ids,
                digest,
                total,
                filtered,
            },
        )
        .await;
    }
    if data_files.is_empty() {
        let n = name("part");
        lake.put(
            &layout::silver_file(&table, &build_id, &n),
            parquet_bytes(&RecordBatch::new_empty(flagger.schema.clone()))?,
        )
        .await?;
        data_files.push(n);
    }
    if state_files.is_empty() {
        let n = name("state");
        lake.put(
            &layout::silver_file(&table, &build_id, &n),
            parquet_bytes(&RecordBatch::new_empty(state_schema()))?,
        )
        .await?;
        state_files.push(n);
    }
    let m = Manifest {
        data: data_files,
        state: state_files,
        deltas: Vec::new(),
        runs: Some(run_ids),
        rows: Some(total.rows),
    };
    let bytes = serde_json::to_vec(&m).map_err(|e| Error::RunFailed(format!("build manifest: {e}")))?;
    lake.put(&layout::silver_manifest(&table, &build_id), bytes.into())
        .await?;
    let inputs_json = serde_json::json!({ "inputs_digest": digest }).to_string();
    lake.put(&layout::silver_inputs(&table, &build_id), inputs_json.into())
        .await?;
    crate::table::failpoint::hit("build.after_data")?;

    record.rows_written = total.written as i64;
    record.rows_rejected = total.rejected as i64;
    record.rows_filtered = filtered as i64;
    record.rows_read = record.rows_written + record.rows_rejected + record.rows_filtered;
    record.rows_flagged = total.flagged as i64;
    record.finished_at = now_micros();
    commit_build(lake, record).await?;
    crate::table::failpoint::hit("build.after_commit")?;
    Ok(Built {
        record: record.clone(),
        table_rows: total.rows,
        kept_rows: total.rows - total.written,
    })
}

/// At most this many delta layers; the next build rewrites the whole snapshot (compaction).
const MAX_DELTAS: usize = 8;

/// The fraction of the snapshot's rows that delta layers may delete in all before a build
/// rewrites the whole snapshot instead: `INGOT_SILVER_DELTA_LIMIT` (default 0.1; 0 turns delta
/// builds off).
fn delta_limit() -> Result<f64> {
    match std::env::var("INGOT_SILVER_DELTA_LIMIT") {
        Err(_) => Ok(0.1),
        Ok(v) => v.trim().parse::<f64>().ok().filter(|f| f.is_finite() && *f >= 0.0).ok_or_else(|| {
            Error::Invalid(format!(
                "INGOT_SILVER_DELTA_LIMIT=\"{v}\": expected a fraction of the table such as 0.1 (0 turns delta builds off)"
            ))
        }),
    }
}

/// The previous build's layers, extended by a delta build.
struct DeltaBase<'a> {
    /// The previous build's manifest, every name lake-relative.
    manifest: Manifest,
    /// The runs committed since the previous build, newest first.
    new_runs: Vec<&'a RunRecord>,
    /// Rows of the previous snapshot.
    rows: u64,
}

/// Can this incremental build be a delta build on top of `prev`? Yes when the rules version is
/// the previous build's and that build was a full or incremental one (so every record its state
/// rejected or filtered was decided by this version, and nothing but new runs is to be
/// processed), its manifest names the runs it accounted for and they are all still committed
/// (nothing undone), every run committed since is newer than all of them (so its rows are the
/// current versions of their records), and there are fewer than [`MAX_DELTAS`] layers.
async fn delta_base<'a>(
    lake: &Lake,
    table: &str,
    prev: &BuildRecord,
    rules: &RuleSet,
    runs: &[&'a RunRecord],
) -> Result<Option<DeltaBase<'a>>> {
    if prev.rules_version != rules.version || !(prev.mode == "full" || prev.mode == "incremental") {
        return Ok(None);
    }
    let m = manifest(lake, table, &prev.build_id).await?;
    let (Some(prev_runs), Some(rows)) = (&m.runs, m.rows) else {
        return Ok(None);
    };
    if m.deltas.len() >= MAX_DELTAS {
        return Ok(None);
    }
    let before: HashSet<&str> = prev_runs.iter().map(String::as_str).collect();
    let seen: Vec<&&RunRecord> = runs.iter().filter(|r| before.contains(r.run_id.as_str())).collect();
    if seen.len() != before.len() {
        return Ok(None); // a run the previous build read was undone
    }
    let newest = seen.iter().map(|r| (r.started_at, r.run_id.as_str())).max();
    let new_runs: Vec<&'a RunRecord> = runs
        .iter()
        .filter(|r| !before.contains(r.run_id.as_str()))
        .copied()
        .collect();
    if new_runs
        .iter()
        .any(|r| newest.is_some_and(|n| (r.started_at, r.run_id.as_str()) <= n))
    {
        return Ok(None); // a run that started before one the previous build read
    }
    Ok(Some(DeltaBase {
        manifest: relayer(&m, table, &prev.build_id),
        new_runs,
        rows,
    }))
}

/// Publish a build whose table is the previous build's (nothing to do): its manifest `m` names
/// the previous build's files.
async fn publish_unchanged(
    lake: &Lake,
    record: &mut BuildRecord,
    prev: &BuildRecord,
    m: Manifest,
    digest: &str,
) -> Result<Built> {
    let bytes = serde_json::to_vec(&m).map_err(|e| Error::RunFailed(format!("build manifest: {e}")))?;
    lake.put(&layout::silver_manifest(&record.table, &record.build_id), bytes.into())
        .await?;
    let inputs_json = serde_json::json!({ "inputs_digest": digest }).to_string();
    lake.put(
        &layout::silver_inputs(&record.table, &record.build_id),
        inputs_json.into(),
    )
    .await?;
    crate::table::failpoint::hit("build.after_data")?;
    record.rows_flagged = prev.rows_flagged;
    record.finished_at = now_micros();
    commit_build(lake, record).await?;
    crate::table::failpoint::hit("build.after_commit")?;
    let rows = m.rows.unwrap_or(0);
    Ok(Built {
        record: record.clone(),
        table_rows: rows,
        kept_rows: rows,
    })
}

/// What a delta build found in the previous snapshot.
#[derive(Default)]
struct DeltaOut {
    /// The records processed (every record of the new runs).
    processed: Arc<FpSet>,
    /// Keys whose rows in the previous layers are gone: processed, and re-flagged.
    deleted: FpSet,
    prev_rows: u64,
    /// Rows of the previous snapshot that are processed records' (replaced or gone).
    old_rows: u64,
    /// Of those and of the re-flagged rows, how many were flagged.
    old_flagged: u64,
    /// Kept rows whose window flags change (rewritten with the new flags).
    changed_rows: u64,
}

/// The window pass of a delta build. Finds the previous snapshot's rows of the processed
/// records (their groups, their count), then recomputes the window anomalies over only the
/// groups (`by` values) that processed records were in or are now in: every row of such a group,
/// kept or new. Returns the counts, the window sets for the flagger (every row of a recomputed
/// group, and the rewritten rows' flags of groups not recomputed) and the kept rows whose window
/// flags change.
async fn delta_windows(
    rules: &RuleSet,
    base: &SchemaRef,
    split: &Split,
    view: &DataFrame,
    processed: Arc<FpSet>,
) -> Result<(DeltaOut, Vec<Option<Arc<FpSet>>>, FpSet)> {
    const TIE: &str = "__ingot_tie";
    let n = rules.anomalies.len();
    let by_of = |a: &crate::spec::rules::Anomaly| -> Vec<String> {
        match &a.kind {
            AnomalyKind::Spike { by, .. } | AnomalyKind::FirstSeen { by, .. } => {
                by.iter().map(|i| i.name.clone()).collect()
            }
            AnomalyKind::When(_) => Vec::new(),
        }
    };
    let ty = |name: &str| -> Result<DataType> {
        Ok(base
            .field_with_name(name)
            .map_err(|_| {
                Error::Invalid(format!(
                    "{}: an anomaly reads column \"{name}\", which the table does not have",
                    rules.path.display()
                ))
            })?
            .data_type()
            .clone())
    };
    let cast_col = |name: &str| -> Result<Expr> { Ok(datafusion::logical_expr::cast(c(name), ty(name)?).alias(name)) };
    // per window anomaly with `by` columns: its groups
    let empty_groups = || -> Result<Vec<Option<GroupSet>>> {
        let mut groups = Vec::with_capacity(n);
        for a in &rules.anomalies {
            let by = by_of(a);
            groups.push(if is_window(a) && !by.is_empty() {
                Some(GroupSet::new(by.iter().map(|b| ty(b)).collect::<Result<Vec<_>>>()?))
            } else {
                None
            });
        }
        Ok(groups)
    };
    let mut by_cols: Vec<String> = Vec::new();
    for a in &rules.anomalies {
        if is_window(a) && !by_of(a).is_empty() {
            for b in by_of(a) {
                if !by_cols.contains(&b) {
                    by_cols.push(b);
                }
            }
        }
    }
    let positions = |names: &[String]| -> Vec<usize> {
        names
            .iter()
            .filter_map(|b| by_cols.iter().position(|x| x == b))
            .collect()
    };
    let add_groups = |groups: &mut Vec<Option<GroupSet>>, b: &RecordBatch, offset: usize| -> Result<()> {
        for (i, a) in rules.anomalies.iter().enumerate() {
            if let Some(g) = groups[i].as_mut() {
                let cols: Vec<ArrayRef> = positions(&by_of(a))
                    .into_iter()
                    .map(|p| b.column(offset + p).clone())
                    .collect();
                g.insert(&cols, |_| true)?;
            }
        }
        Ok(())
    };
    let in_processed = Arc::new(in_set_udf(processed.clone())).call(vec![c(FP)]);
    let passing = split.rows.clone().filter(c(SPLIT_RULE).is_null())?;

    // The windows need the groups of the processed records' old rows too. A first attempt
    // assumes those are groups a new row is in (a correction seldom moves a record to another
    // group) and reads the previous snapshot once: the old rows of processed records ride along
    // in the window pass as inert rows (no part in any window), counted there. When one of them
    // is in a group no new row is in, the pass is redone the careful way: a scan of those old
    // rows for their groups first, then the window pass without them.
    let mut speculate = rules.anomalies.iter().any(is_window);
    loop {
        let mut out = DeltaOut::default();
        let mut groups = empty_groups()?;
        if !speculate {
            // 1. the previous snapshot's rows of the processed records
            let mut cols = vec![c(IS_ANOMALY)];
            for b in &by_cols {
                cols.push(cast_col(b)?);
            }
            let mut stream = view
                .clone()
                .filter(in_processed.clone())?
                .select(cols)?
                .execute_stream()
                .await?;
            while let Some(b) = stream.next().await {
                let b = b?;
                out.old_rows += b.num_rows() as u64;
                out.old_flagged += b.column(0).as_boolean().true_count() as u64;
                add_groups(&mut groups, &b, 1)?;
            }
            if !rules.anomalies.iter().any(is_window) {
                return Ok((out, vec![None; n], FpSet::default()));
            }
        }

        // 2. the groups of the new rows
        if !by_cols.is_empty() {
            let cols = by_cols.iter().map(|b| cast_col(b)).collect::<Result<Vec<_>>>()?;
            let mut stream = passing.clone().select(cols)?.execute_stream().await?;
            while let Some(b) = stream.next().await {
                add_groups(&mut groups, &b?, 0)?;
            }
        }
        let groups: Vec<Option<Arc<GroupSet>>> = groups.into_iter().map(|g| g.map(Arc::new)).collect();

        // 3. the windows over every row of those groups
        let narrow = window_columns(rules);
        let windows: Vec<usize> = (0..n).filter(|i| is_window(&rules.anomalies[*i])).collect();
        let in_col = |i: usize| format!("__ingot_in_{i}");
        let had_col = |i: usize| format!("__ingot_had_{i}");
        const OLD: &str = "__ingot_old";
        const WAS: &str = "__ingot_was_anomaly";
        const PROCESSED: &str = "__ingot_processed";
        let fp128 = Arc::new(fp128_udf());
        let project = |df: DataFrame, old: bool| -> Result<DataFrame> {
            let mut cols: Vec<Expr> = narrow.iter().map(|name| cast_col(name)).collect::<Result<_>>()?;
            cols.push(fp128.call(vec![c(FP)]).alias(TIE));
            for &i in &windows {
                let in_group = match &groups[i] {
                    Some(g) => {
                        let args = by_of(&rules.anomalies[i])
                            .iter()
                            .map(|b| cast_col(b))
                            .collect::<Result<Vec<_>>>()?;
                        Arc::new(in_groups_udf(g.clone())).call(args)
                    }
                    None => lit(true),
                };
                cols.push(in_group.alias(in_col(i)));
                let had = if old {
                    datafusion::functions_nested::expr_fn::array_has(
                        c(ANOMALY_FLAGS),
                        lit(rules.anomalies[i].name.clone()),
                    )
                } else {
                    lit(false)
                };
                cols.push(had.alias(had_col(i)));
            }
            cols.push(lit(old).alias(OLD));
            cols.push(if old { c(IS_ANOMALY) } else { lit(false) }.alias(WAS));
            cols.push(
                if old && speculate {
                    in_processed.clone()
                } else {
                    lit(false)
                }
                .alias(PROCESSED),
            );
            Ok(df.select(cols)?)
        };
        let old_rows = if speculate {
            view.clone()
        } else {
            view.clone().filter(Expr::Not(Box::new(in_processed.clone())))?
        };
        let all = project(old_rows, true)?.union(project(passing.clone(), false)?)?;
        let any_in = windows
            .iter()
            .map(|i| c(&in_col(*i)))
            .reduce(Expr::or)
            .unwrap_or(lit(false));
        let all = all.filter(if speculate { any_in.or(c(PROCESSED)) } else { any_in })?;
        let mut extra: Vec<String> = Vec::new();
        for &i in &windows {
            extra.push(in_col(i));
            extra.push(had_col(i));
        }
        extra.extend([OLD.into(), WAS.into(), PROCESSED.into()]);
        let inert = speculate.then_some(PROCESSED);
        let Some(fires) = window_fires_with(all, rules, TIE, &extra, inert, false)? else {
            return Ok((out, vec![None; n], FpSet::default()));
        };
        let mut found: Vec<FpSet> = (0..n).map(|_| FpSet::default()).collect();
        let mut changed = FpSet::default();
        let mut moved = false;
        let mut stream = fires.execute_stream().await?;
        while let Some(b) = stream.next().await {
            let b = b?;
            let schema = b.schema();
            let col = |name: &str| -> Result<BooleanArray> {
                let a = b.column(schema.index_of(name)?);
                Ok(arrow_cast(a, &DataType::Boolean)?.as_boolean().clone())
            };
            let mut keys = Vec::with_capacity(b.num_rows());
            for_each_fp(b.column(schema.index_of(TIE)?), |_, fp| keys.push(fp))?;
            let old = col(OLD)?;
            let was = col(WAS)?;
            let gone = col(PROCESSED)?;
            let truth = |a: &BooleanArray, r: usize| a.is_valid(r) && a.value(r);
            let mut inside = Vec::with_capacity(windows.len());
            for &i in &windows {
                inside.push(col(&in_col(i))?);
            }
            // the processed records' old rows: counted, and their groups checked
            for r in (0..b.num_rows()).filter(|&r| truth(&gone, r)) {
                out.old_rows += 1;
                if truth(&was, r) {
                    out.old_flagged += 1;
                }
                moved |= windows
                    .iter()
                    .zip(&inside)
                    .any(|(&i, g)| groups[i].is_some() && !truth(g, r));
            }
            if moved {
                break;
            }
            for (&i, inside) in windows.iter().zip(&inside) {
                let fired = col(&window_fired_column(i))?;
                let had = col(&had_col(i))?;
                for (r, key) in keys.iter().enumerate() {
                    let Some(key) = key else { continue };
                    if truth(&gone, r) {
                        continue;
                    }
                    let (f, g, h, o) = (truth(&fired, r), truth(inside, r), truth(&had, r), truth(&old, r));
                    if (g && f) || (!g && o && h) {
                        found[i].insert(*key);
                    }
                    if o && g && f != h && changed.insert(*key) {
                        out.changed_rows += 1;
                        if truth(&was, r) {
                            out.old_flagged += 1;
                        }
                    }
                }
            }
        }
        if moved {
            speculate = false;
            continue;
        }
        // a rewritten row's flags of a group not recomputed come from its stored flags, which the
        // pass above saw only for rows inside some recomputed group: every rewritten row is one
        let sets = (0..n)
            .map(|i| is_window(&rules.anomalies[i]).then(|| Arc::new(std::mem::take(&mut found[i]))))
            .collect();
        return Ok((out, sets, changed));
    }
}

/// What a delta build wrote, for [`publish_delta`].
struct DeltaFiles {
    data: Vec<String>,
    state: Vec<String>,
    run_ids: Vec<String>,
    digest: String,
    total: PartOut,
    filtered: u64,
}

/// Publish a delta build: its deletion files, then a manifest of the previous layers plus this
/// one, then the record.
async fn publish_delta(
    lake: &Lake,
    record: &mut BuildRecord,
    prev: &BuildRecord,
    base: DeltaBase<'_>,
    out: DeltaOut,
    files: DeltaFiles,
) -> Result<Built> {
    let (table, build_id) = (record.table.clone(), record.build_id.clone());
    let (deleted, deleted_state) = (
        "deleted-00000.parquet".to_string(),
        "deleted-state-00000.parquet".to_string(),
    );
    let rel = |name: &str| layout::silver_file(&table, &build_id, name);
    write_keys(lake, &rel(&deleted), out.deleted.iter().copied()).await?;
    write_keys(lake, &rel(&deleted_state), out.processed.iter().copied()).await?;
    let total = &files.total;
    let table_rows = (out.prev_rows + total.rows).saturating_sub(out.old_rows + out.changed_rows);
    let mut m = base.manifest;
    m.deltas.push(Delta {
        data: files.data,
        state: files.state,
        deleted,
        deleted_state,
        deleted_keys: out.deleted.len() as u64,
    });
    m.runs = Some(files.run_ids);
    m.rows = Some(table_rows);
    let bytes = serde_json::to_vec(&m).map_err(|e| Error::RunFailed(format!("build manifest: {e}")))?;
    lake.put(&layout::silver_manifest(&table, &build_id), bytes.into())
        .await?;
    let inputs_json = serde_json::json!({ "inputs_digest": files.digest }).to_string();
    lake.put(&layout::silver_inputs(&table, &build_id), inputs_json.into())
        .await?;
    crate::table::failpoint::hit("build.after_data")?;
    record.rows_written = total.written as i64;
    record.rows_rejected = total.rejected as i64;
    record.rows_filtered = files.filtered as i64;
    record.rows_read = record.rows_written + record.rows_rejected + record.rows_filtered;
    record.rows_flagged = (prev.rows_flagged + total.flagged as i64 - out.old_flagged as i64).max(0);
    record.finished_at = now_micros();
    commit_build(lake, record).await?;
    crate::table::failpoint::hit("build.after_commit")?;
    Ok(Built {
        record: record.clone(),
        table_rows,
        kept_rows: table_rows.saturating_sub(total.written),
    })
}

/// glibc's allocator, tuned for a build: batches are made on one thread and freed on another, and
/// glibc keeps freed memory in per-thread arenas (up to 8 per core), so without a limit the peak
/// resident size of a build is far above what it ever holds at once.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
mod glibc {
    unsafe extern "C" {
        fn mallopt(param: i32, value: i32) -> i32;
        fn malloc_trim(pad: usize) -> i32;
    }
    const M_ARENA_MAX: i32 = -8;

    /// Let threads created from now on share two arenas.
    pub fn limit_arenas() {
        // SAFETY: mallopt only changes allocator tuning; M_ARENA_MAX affects arenas created later.
        unsafe {
            mallopt(M_ARENA_MAX, 2);
        }
    }

    /// Return free heap memory to the system (between the window pass and the output pass).
    pub fn trim() {
        // SAFETY: malloc_trim only releases free memory; it has no preconditions.
        unsafe {
            malloc_trim(0);
        }
    }
}

fn limit_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    glibc::limit_arenas();
}

fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    glibc::trim();
}

/// The columns the window anomalies of `rules` read (`by`, `order`, and a spike's column), each
/// once, in rule order.
fn window_columns(rules: &RuleSet) -> Vec<String> {
    let mut narrow: Vec<String> = Vec::new();
    for a in rules.anomalies.iter().filter(|a| is_window(a)) {
        let names: Vec<&str> = match &a.kind {
            AnomalyKind::Spike { column, by, order, .. } => {
                by.iter().chain([order, column]).map(|i| i.name.as_str()).collect()
            }
            AnomalyKind::FirstSeen { by, order, .. } => by.iter().chain([order]).map(|i| i.name.as_str()).collect(),
            AnomalyKind::When(_) => Vec::new(),
        };
        for n in names {
            if !narrow.iter().any(|x| x == n) {
                narrow.push(n.to_string());
            }
        }
    }
    narrow
}

/// The window anomalies of `rules` over the new table (the transform's passing rows and the kept
/// rows), computed over only the columns they read: for each window anomaly, the keys of the
/// rows it fires on.
async fn window_sets(
    cluster: Option<&str>,
    rules: &RuleSet,
    base: &SchemaRef,
    split: &Split,
    kept: Option<&DataFrame>,
) -> Result<Vec<Option<Arc<FpSet>>>> {
    const TIE: &str = "__ingot_tie";
    let mut sets: Vec<Option<Arc<FpSet>>> = vec![None; rules.anomalies.len()];
    if !rules.anomalies.iter().any(is_window) {
        return Ok(sets);
    }
    let narrow = window_columns(rules);
    let mut types = Vec::new();
    for n in &narrow {
        let f = base.field_with_name(n).map_err(|_| {
            Error::Invalid(format!(
                "{}: an anomaly reads column \"{n}\", which the table does not have",
                rules.path.display()
            ))
        })?;
        types.push(f.data_type().clone());
    }
    let fp128 = Arc::new(fp128_udf());
    let project = |df: DataFrame| -> Result<DataFrame> {
        let mut cols: Vec<Expr> = narrow
            .iter()
            .zip(&types)
            .map(|(n, t)| datafusion::logical_expr::cast(c(n), t.clone()).alias(n))
            .collect();
        cols.push(fp128.call(vec![c(FP)]).alias(TIE));
        Ok(df.select(cols)?)
    };
    let mut all = project(split.rows.clone().filter(c(SPLIT_RULE).is_null())?)?;
    if let Some(k) = kept {
        all = project(k.clone())?.union(all)?;
    }
    let Some(fires) = window_fires(all, rules, TIE)? else {
        return Ok(sets);
    };
    let mut found: Vec<FpSet> = (0..rules.anomalies.len()).map(|_| FpSet::default()).collect();
    let names: Vec<String> = fires.schema().fields().iter().map(|f| f.name().clone()).collect();
    let mut stream = crate::engine::exec::stream(cluster, fires, "build: window anomalies").await?;
    while let Some(b) = stream.next().await {
        let b = b?;
        let mut fps = Vec::with_capacity(b.num_rows());
        for_each_fp(b.column(0), |_, fp| fps.push(fp))?;
        for (i, set) in found.iter_mut().enumerate() {
            let Some(col) = names.iter().position(|n| *n == window_fired_column(i)) else {
                continue;
            };
            let fired = b.column(col).as_boolean();
            for (r, fp) in fps.iter().enumerate() {
                if let Some(fp) = fp
                    && fired.is_valid(r)
                    && fired.value(r)
                {
                    set.insert(*fp);
                }
            }
        }
    }
    for (i, set) in found.into_iter().enumerate() {
        if is_window(&rules.anomalies[i]) {
            sets[i] = Some(Arc::new(set));
        }
    }
    Ok(sets)
}
