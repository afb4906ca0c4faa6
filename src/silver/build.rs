//! `ingot build <table>`: run the plans of [`super::compile`] and publish a new snapshot of
//! `silver.<table>` atomically (DESIGN.md §7).
//!
//! # What a build writes, and its commit
//!
//! Every file of a build is build-scoped (see [`crate::lake`] for the layout): the complete
//! snapshot of the table (`silver/<table>/build_id=<id>/part-00000.parquet`, every row of the
//! table as built, streamed), the build's silver rejections (`audit/row_failure_log/build_id=<id>/`,
//! layer `silver`), the state file (`state.parquet`: `natural_key_fingerprint`, `row_hash`,
//! `ingestion_run_id`, `outcome` — `passed`, `rejected` or `filtered` — and the `rules_version`
//! that decided it, of every record the table's current state accounts for) and `inputs.json` (a digest of what `resolve` read). The
//! commit is the `audit.silver_build_log` record, written with a create-if-absent put into the
//! table's next slot `audit/silver_build_log/<table>/<seq>.parquet` (`seq` read when the build
//! starts). `silver.<table>` is the snapshot of the latest succeeded record, so readers see the
//! old snapshot or the new one, never a mix; a crash before the record leaves files nothing
//! reads; a concurrent build that committed first takes the slot and this one publishes nothing.
//!
//! # Modes
//!
//! * `full`: every row of `bronze.<source>_current` is transformed.
//! * `incremental` (default; `full` when the table has no succeeded build): the input is the
//!   current rows whose version (`natural_key_fingerprint`, `row_hash`, `ingestion_run_id`) is not
//!   in the previous build's state — new and changed records — and the previous snapshot's rows
//!   whose record is still current and unchanged are kept byte-for-byte (with their
//!   `silver_build_id`); records no longer current (undone) disappear. Everything is
//!   re-processed when what `resolve` reads changed since the previous build (a lookup source's
//!   committed runs or a contract file: `inputs.json`), since any row's resolved value may have
//!   changed. Records that another rules version rejected or filtered are processed again with
//!   the chosen rules (they have no silver row to keep); rows in silver keep the version that
//!   built them (rebuild them with `--rebuild-where` or `--full`).
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
//! rule and the first failing records, nothing else is published, exit code 1. A rules version is
//! immutable once a succeeded build used it: a different SHA-256 is refused (exit 2).
//!
//! Counts of the record: `rows_read` (input rows processed) = `rows_written` (of them, rows in
//! the new snapshot) + `rows_filtered` + `rows_rejected`; `rows_flagged` counts flagged rows of
//! the whole new table.
//!
use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, BooleanArray, FixedSizeBinaryBuilder, Int32Array, Int32Builder, RecordBatch,
    StringArray, StringBuilder, TimestampMicrosecondArray,
};
use datafusion::arrow::compute::kernels::boolean::{is_null, not};
use datafusion::arrow::compute::{cast as arrow_cast, filter_record_batch};
use datafusion::arrow::datatypes::{DataType, Field, Int32Type, Int64Type, Schema, SchemaRef};
use datafusion::common::tree_node::TreeNode;
use datafusion::common::{Column, DFSchema};
use datafusion::dataframe::DataFrame;
use datafusion::execution::memory_pool::MemoryConsumer;
use datafusion::logical_expr::{Expr, ExprSchemable, lit};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::prelude::SessionContext;
use futures::StreamExt;
use sha2::Digest;

use super::compile::{
    ANOMALY_FLAGS, IS_ANOMALY, RULES_VERSION, SPLIT_RULE, flag, flag_projection, is_window, read_inputs, transform,
    transform_split, window_fired_column, window_fires,
};
use super::keys::{
    FILTERED, FpSet, Keys, Mode, NONE, PASSED, REJECTED, for_each_fp, fp128_udf, in_set_udf, keep_udf, outcome_name,
    outcome_of, pick_udf,
};
use crate::audit::{BuildRecord, BuildStatus, RunRecord, commit_build, failure_log_schema, parquet_bytes};
use crate::bronze::RunFileWriter;
use crate::catalog::{Catalog, latest_build, table_over, table_over_file};
use crate::contract::{Contract, ContractSet};
use crate::error::{Error, Result};
use crate::lake::{Lake, layout};
use crate::rules::{Action, AnomalyKind, RuleSet, RulesSet};
use crate::session::Workspace;
use crate::yaml::Problems;

/// `silver_build_id` (Utf8): the build that wrote a silver row.
pub const SILVER_BUILD_ID: &str = "silver_build_id";

const FP: &str = "natural_key_fingerprint";
const RUN_ID: &str = "ingestion_run_id";
const OUTCOME: &str = "outcome";

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

fn c(name: &str) -> Expr {
    Expr::Column(Column::new_unqualified(name))
}

fn now_micros() -> i64 {
    chrono::Utc::now().timestamp_micros()
}

/// Schema of the state file: the 16-byte key of every record the table's current state accounts
/// for, the run of the version that was decided, the outcome (`passed`, `rejected`, `filtered`)
/// and the rules version that decided it.
pub fn state_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new(FP, DataType::FixedSizeBinary(16), false),
        Field::new(RUN_ID, DataType::Utf8, false),
        Field::new(OUTCOME, DataType::Utf8, false),
        Field::new(RULES_VERSION, DataType::Int32, false),
    ]))
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
    let build_id = uuid::Uuid::now_v7().to_string();
    let started_at = now_micros();
    let catalog = crate::catalog::open(ws).await?;
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


/// Runs whose bronze file the build reads, newest first (the order of `bronze.<source>_current`).
fn runs_newest_first<'a>(catalog: &'a Catalog, source: &str) -> Vec<&'a RunRecord> {
    let mut runs = crate::catalog::bronze_runs(&catalog.runs, source);
    runs.sort_by(|a, b| (b.started_at, &b.run_id).cmp(&(a.started_at, &a.run_id)));
    runs
}

/// One pass over the fingerprints of every bronze run of the source, newest first: the current
/// run of every record.
async fn current_keys(ctx: &SessionContext, lake: &Lake, contract: &Contract, runs: &[&RunRecord]) -> Result<Keys> {
    let capacity: i64 = runs.iter().map(|r| r.rows_inserted + r.rows_updated).sum();
    let mut keys = Keys::new(
        runs.iter().map(|r| r.run_id.clone()).collect(),
        usize::try_from(capacity).unwrap_or(0),
    );
    for (i, run) in runs.iter().enumerate() {
        let table = table_over(
            vec![lake.url(&layout::bronze_data(&run.source, &run.run_id))],
            contract.bronze_schema(),
        )?;
        let mut stream = ctx.read_table(table)?.select(vec![c(FP)])?.execute_stream().await?;
        while let Some(b) = stream.next().await {
            let b = b?;
            let mut missing = false;
            for_each_fp(b.column(0), |_, fp| match fp {
                Some(fp) => keys.see_current(fp, i as u32),
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
    Ok(keys)
}

/// Add the previous build's state to `keys`.
async fn previous_state(ctx: &SessionContext, lake: &Lake, keys: &mut Keys, rel: &str) -> Result<()> {
    let mut index: HashMap<String, u32> = keys
        .runs
        .iter()
        .enumerate()
        .map(|(i, r)| (r.clone(), i as u32))
        .collect();
    let df = ctx.read_table(table_over_file(ctx, lake, rel).await?)?.select(vec![
        c(FP),
        c(RUN_ID),
        c(OUTCOME),
        c(RULES_VERSION),
    ])?;
    let mut stream = df.execute_stream().await?;
    while let Some(b) = stream.next().await {
        let b = b?;
        let runs = arrow_cast(b.column(1), &DataType::Utf8)?;
        let runs = runs.as_string::<i32>();
        let outcomes = arrow_cast(b.column(2), &DataType::Utf8)?;
        let outcomes = outcomes.as_string::<i32>();
        let versions = arrow_cast(b.column(3), &DataType::Int32)?;
        let versions = versions.as_primitive::<Int32Type>();
        let mut rows = Vec::with_capacity(b.num_rows());
        for_each_fp(b.column(0), |i, fp| {
            if let Some(fp) = fp {
                rows.push((i, fp));
            }
        })?;
        for (i, fp) in rows {
            let run = keys.run_index(runs.value(i), &mut index);
            keys.see_previous(fp, run, versions.value(i), outcome_of(outcomes.value(i)));
        }
    }
    Ok(())
}

/// The rules versions of the previous state that `pred` (a predicate on `rules_version`) matches.
async fn matching_versions(ctx: &SessionContext, keys: &Keys, pred: &Expr) -> Result<HashSet<i32>> {
    let versions: BTreeSet<i32> = keys.map.values().filter(|e| e.prev != NONE).map(|e| e.version).collect();
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

/// Failure-log rows of this build from `(fingerprint, row number, rule, reason, payload)` columns.
struct Failures<'a> {
    build_id: &'a str,
    source: &'a str,
    table: &'a str,
    version: i32,
    failed_at: i64,
}

impl Failures<'_> {
    fn batch(&self, fp: &ArrayRef, row: &ArrayRef, rule: &ArrayRef, reason: &ArrayRef, payload: &ArrayRef) -> Result<RecordBatch> {
        let n = fp.len();
        let text = |a: &ArrayRef| -> Result<ArrayRef> {
            let a = arrow_cast(a, &DataType::Utf8)?;
            let s = a.as_string::<i32>();
            Ok(Arc::new(StringArray::from_iter_values(
                (0..n).map(|i| if s.is_null(i) { "" } else { s.value(i) }).collect::<Vec<_>>(),
            )))
        };
        let repeat = |v: &str| -> ArrayRef { Arc::new(StringArray::from_iter_values(std::iter::repeat_n(v, n))) };
        let cols: Vec<ArrayRef> = vec![
            repeat(self.build_id),
            repeat("silver"),
            repeat(self.source),
            repeat(self.table),
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

/// The new state: the processed records with this build's outcome, and the records carried over.
/// Returns the number of processed records no output had (removed by a `filter` step).
async fn write_state(lake: &Lake, rel: &str, keys: &Keys, version: i32) -> Result<u64> {
    const CHUNK: usize = 1 << 16;
    let schema = state_schema();
    let mut w = RunFileWriter::new(lake, rel.to_string(), schema.clone());
    let mut filtered = 0u64;
    let mut fps = FixedSizeBinaryBuilder::with_capacity(CHUNK, 16);
    let mut runs = StringBuilder::with_capacity(CHUNK, CHUNK * 36);
    let mut outcomes = StringBuilder::with_capacity(CHUNK, CHUNK * 8);
    let mut versions = Int32Builder::with_capacity(CHUNK);
    let mut n = 0usize;
    for (fp, e) in &keys.map {
        let (run, outcome, v) = if keys.process(e) {
            let o = e.new.load(std::sync::atomic::Ordering::Relaxed);
            let o = if o == 0 {
                filtered += 1;
                FILTERED
            } else {
                o
            };
            (e.cur, o, version)
        } else if keys.carry(e) {
            (e.prev, e.outcome, e.version)
        } else {
            continue;
        };
        fps.append_value(fp.to_be_bytes())?;
        runs.append_value(keys.runs.get(run as usize).map(String::as_str).unwrap_or(""));
        outcomes.append_value(outcome_name(outcome));
        versions.append_value(v);
        n += 1;
        if n == CHUNK {
            w.write(&state_batch(&schema, &mut fps, &mut runs, &mut outcomes, &mut versions)?)
                .await?;
            n = 0;
        }
    }
    if n > 0 {
        w.write(&state_batch(&schema, &mut fps, &mut runs, &mut outcomes, &mut versions)?)
            .await?;
    }
    if w.finish().await? == 0 {
        lake.put(rel, parquet_bytes(&RecordBatch::new_empty(schema))?).await?;
    }
    Ok(filtered)
}

fn state_batch(
    schema: &SchemaRef,
    fps: &mut FixedSizeBinaryBuilder,
    runs: &mut StringBuilder,
    outcomes: &mut StringBuilder,
    versions: &mut Int32Builder,
) -> Result<RecordBatch> {
    Ok(RecordBatch::try_new(
        schema.clone(),
        vec![
            Arc::new(fps.finish()),
            Arc::new(runs.finish()),
            Arc::new(outcomes.finish()),
            Arc::new(versions.finish()),
        ],
    )?)
}

/// Stream `df` into `writer`, each batch through `each` (which may drop rows by returning `None`).
async fn pump(
    df: DataFrame,
    writer: &mut RunFileWriter,
    mut each: impl FnMut(RecordBatch) -> Result<Option<RecordBatch>>,
) -> Result<()> {
    let mut stream = df.execute_stream().await?;
    while let Some(b) = stream.next().await {
        if let Some(out) = each(b?)?
            && out.num_rows() > 0
        {
            writer.write(&out).await?;
        }
    }
    Ok(())
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
    let lake = &ws.lake;
    let table = record.table.clone();
    let build_id = record.build_id.clone();
    let inputs = read_inputs(ctx, &catalog.contracts, rules).await?;
    let contract = inputs.contract.clone();
    let digest = inputs_digest(catalog, &contract)?;
    let runs = runs_newest_first(catalog, &rules.source);

    // Which records to process, which snapshot rows to keep, which state rows to carry: one pass
    // over the fingerprints of bronze and one over the previous state, into compact keys.
    let mut keys = current_keys(ctx, lake, &contract, &runs).await?;
    let mut snapshot: Option<DataFrame> = None;
    match (previous, &opts.rebuild_where, opts.full) {
        (None, Some(_), _) => {
            return Err(Error::Invalid(format!(
                "--rebuild-where: \"{table}\" has no succeeded build to rebuild rows of; run `ingot build {table}` first"
            )));
        }
        (None, None, _) | (Some(_), None, true) => {}
        (Some(prev), rebuild, _) => {
            let snapshot_rel = layout::silver_data(&table, &prev.build_id);
            let previous_digest = lake
                .get(&layout::silver_inputs(&table, &prev.build_id))
                .await?
                .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
                .and_then(|v| v["inputs_digest"].as_str().map(str::to_string));
            if let Some(pred) = rebuild {
                record.mode = "rebuild".into();
                let snap = ctx.read_table(table_over_file(ctx, lake, &snapshot_rel).await?)?;
                let expr = parse_rebuild_filter(ctx, snap.schema().as_arrow(), pred)?;
                previous_state(ctx, lake, &mut keys, &layout::silver_state(&table, &prev.build_id)).await?;
                keys.mode = Mode::Rebuild {
                    matching: matching_versions(ctx, &keys, &expr).await?,
                };
                snapshot = Some(snap);
            } else {
                record.mode = "incremental".into();
                // When what `resolve` reads changed, any row's resolved value may have: all of
                // them are processed again.
                if previous_digest.as_deref() == Some(digest.as_str()) {
                    previous_state(ctx, lake, &mut keys, &layout::silver_state(&table, &prev.build_id)).await?;
                    keys.mode = Mode::Incremental {
                        version: rules.version,
                    };
                    snapshot = Some(ctx.read_table(table_over_file(ctx, lake, &snapshot_rel).await?)?);
                }
            }
        }
    }
    let reservation = MemoryConsumer::new("silver build keys").register(&ctx.runtime_env().memory_pool);
    reservation.grow(keys.bytes());
    let mut per_run = vec![0u64; keys.current_runs];
    let mut kept_records = 0u64;
    for e in keys.map.values() {
        if keys.process(e) {
            per_run[e.cur as usize] += 1;
        } else if keys.keep_row(e) {
            kept_records += 1;
        }
    }
    let rows_read: u64 = per_run.iter().sum();
    let keys = Arc::new(keys);

    // The records to process: the current rows of the runs that hold any.
    let mut input: Option<DataFrame> = None;
    for (i, run) in runs.iter().enumerate() {
        if per_run[i] == 0 {
            continue;
        }
        let rows = ctx
            .read_table(table_over(
                vec![lake.url(&layout::bronze_data(&run.source, &run.run_id))],
                contract.bronze_schema(),
            )?)?
            .filter(Arc::new(pick_udf(keys.clone(), i as u32)).call(vec![c(FP)]))?;
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
    let mut base_fields = silver_fields.clone();
    base_fields.push(Field::new(SILVER_BUILD_ID, DataType::Utf8, true));
    let base = Arc::new(Schema::new(base_fields));

    // The rows kept from the previous snapshot, in the new column order (flags recomputed).
    let kept = match snapshot {
        Some(snap) if kept_records > 0 => {
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
                    previous.map(|p| p.build_id.as_str()).unwrap_or(""),
                    show(&have),
                    rules.version,
                    show(&want)
                )));
            }
            Some(
                snap.filter(Arc::new(keep_udf(keys.clone())).call(vec![c(FP)]))?
                    .select(want.iter().map(|(n, _)| c(n)).collect::<Vec<_>>())?,
            )
        }
        _ => None,
    };

    // Window anomalies over the few columns they read, of the whole new table: the rows for which
    // each fires, as sets of keys.
    let mut sets: Vec<Option<Arc<FpSet>>> = vec![None; rules.anomalies.len()];
    if rules.anomalies.iter().any(is_window) {
        const TIE: &str = "__ingot_tie";
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
        for n in &narrow {
            if base.index_of(n).is_err() {
                return Err(Error::Invalid(format!(
                    "{}: an anomaly reads column \"{n}\", which the table does not have",
                    rules.path.display()
                )));
            }
        }
        let fp128 = Arc::new(fp128_udf());
        let project = |df: DataFrame| -> Result<DataFrame> {
            let mut cols: Vec<Expr> = narrow
                .iter()
                .map(|n| {
                    let ty = base.field_with_name(n).map(|f| f.data_type().clone());
                    ty.map(|t| datafusion::logical_expr::cast(c(n), t).alias(n))
                })
                .collect::<std::result::Result<_, _>>()?;
            cols.push(fp128.call(vec![c(FP)]).alias(TIE));
            Ok(df.select(cols)?)
        };
        let mut all = project(split.rows.clone().filter(c(SPLIT_RULE).is_null())?)?;
        if let Some(k) = &kept {
            all = project(k.clone())?.union(all)?;
        }
        if let Some(fires) = window_fires(all, rules, TIE)? {
            let mut found: Vec<FpSet> = (0..rules.anomalies.len()).map(|_| FpSet::default()).collect();
            let names: Vec<String> = fires.schema().fields().iter().map(|f| f.name().clone()).collect();
            let mut stream = fires.execute_stream().await?;
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
        }
    }
    let flagger = Flagger::new(ctx, rules, base.clone(), &sets)?;

    // One pass: kept rows, then the transform's rows split into the snapshot and the failures.
    let data_rel = layout::silver_data(&table, &build_id);
    let failures_rel = layout::silver_failures(&build_id);
    let mut data_w = RunFileWriter::new(lake, data_rel.clone(), flagger.schema.clone());
    let mut fail_w = RunFileWriter::new(lake, failures_rel.clone(), failure_log_schema());
    let (mut table_rows, mut written, mut flagged) = (0u64, 0u64, 0u64);
    if let Some(k) = kept {
        pump(k, &mut data_w, |b| {
            let (out, f) = flagger.apply(&b)?;
            table_rows += out.num_rows() as u64;
            flagged += f;
            Ok(Some(out))
        })
        .await?;
    }
    let actions: HashMap<&str, Action> = rules.validate.iter().map(|v| (v.name.as_str(), v.action)).collect();
    let failures = Failures {
        build_id: &build_id,
        source: &rules.source,
        table: &table,
        version: rules.version,
        failed_at: record.started_at,
    };
    let width = split.silver_width;
    let fp_idx = split.rows.schema().as_arrow().index_of(FP)?;
    let build_ids = |n: usize| -> ArrayRef {
        Arc::new(StringArray::from_iter_values(std::iter::repeat_n(build_id.as_str(), n)))
    };
    let (mut n_failed, mut first, mut failed_rules) = (0u64, Vec::new(), BTreeSet::new());
    let mut rejected = 0u64;
    {
        let mut stream = split.rows.clone().execute_stream().await?;
        while let Some(b) = stream.next().await {
            let b = b?;
            let rule = b.column(width + 1).clone();
            let passed = is_null(&rule)?;
            let good = filter_record_batch(&b, &passed)?;
            if good.num_rows() > 0 {
                for_each_fp(good.column(fp_idx), |_, fp| {
                    if let Some(fp) = fp {
                        keys.mark(fp, PASSED);
                    }
                })?;
                let mut cols: Vec<ArrayRef> = good.columns()[..width].to_vec();
                cols.push(build_ids(good.num_rows()));
                let (out, f) = flagger.apply(&RecordBatch::try_new(base.clone(), cols)?)?;
                written += out.num_rows() as u64;
                flagged += f;
                data_w.write(&out).await?;
            }
            if passed.true_count() == b.num_rows() {
                continue;
            }
            let bad = filter_record_batch(&b, &not(&passed)?)?;
            let rules_col = bad.column(width + 1).as_string::<i32>().clone();
            let reject: BooleanArray = (0..bad.num_rows())
                .map(|i| Some(actions.get(rules_col.value(i)) != Some(&Action::Fail)))
                .collect();
            let failing = filter_record_batch(&bad, &not(&reject)?)?;
            if failing.num_rows() > 0 {
                let r = failing.column(width + 1).as_string::<i32>();
                let numbers = arrow_cast(failing.column(width), &DataType::Int64)?;
                let numbers = numbers.as_primitive::<Int64Type>();
                let payload = failing.column(width + 3).as_string::<i32>();
                for i in 0..failing.num_rows() {
                    failed_rules.insert(r.value(i).to_string());
                    if first.len() < 3 {
                        let number = if numbers.is_valid(i) {
                            numbers.value(i).to_string()
                        } else {
                            "?".into()
                        };
                        let p = if payload.is_valid(i) { payload.value(i) } else { "" };
                        first.push(format!("record {number}: {p}"));
                    }
                }
                n_failed += failing.num_rows() as u64;
            }
            let rej = filter_record_batch(&bad, &reject)?;
            if rej.num_rows() > 0 {
                for_each_fp(rej.column(fp_idx), |_, fp| {
                    if let Some(fp) = fp {
                        keys.mark(fp, REJECTED);
                    }
                })?;
                rejected += rej.num_rows() as u64;
                let batch = failures.batch(
                    rej.column(fp_idx),
                    rej.column(width),
                    rej.column(width + 1),
                    rej.column(width + 2),
                    rej.column(width + 3),
                )?;
                fail_w.write(&batch).await?;
            }
        }
    }
    if let Some(rr) = split.resolve_rejected.clone() {
        let mut stream = rr.execute_stream().await?;
        while let Some(b) = stream.next().await {
            let b = b?;
            if b.num_rows() == 0 {
                continue;
            }
            for_each_fp(b.column(0), |_, fp| {
                if let Some(fp) = fp {
                    keys.mark(fp, REJECTED);
                }
            })?;
            rejected += b.num_rows() as u64;
            fail_w
                .write(&failures.batch(b.column(0), b.column(1), b.column(2), b.column(3), b.column(4))?)
                .await?;
        }
    }
    table_rows += written;
    let wrote_data = data_w.finish().await? > 0;
    let wrote_failures = fail_w.finish().await? > 0;

    // A `fail` validation: the build fails, nothing but its record is published.
    if n_failed > 0 {
        let names: Vec<String> = failed_rules.into_iter().map(|r| format!("\"{r}\"")).collect();
        record.status = BuildStatus::Failed;
        record.error = Some(format!(
            "validation {} (action: fail) failed for {n_failed} row{}; nothing was published; first failing {}",
            names.join(", "),
            if n_failed == 1 { "" } else { "s" },
            first.join("; ")
        ));
        record.finished_at = now_micros();
        commit_build(lake, record).await?;
        crate::failpoint::hit("build.after_commit")?;
        for (wrote, rel) in [(wrote_data, &data_rel), (wrote_failures, &failures_rel)] {
            if wrote {
                let _ = lake.delete(rel).await;
            }
        }
        return Ok(Built {
            record: record.clone(),
            table_rows: 0,
            kept_rows: 0,
        });
    }
    if !wrote_data {
        lake.put(&data_rel, parquet_bytes(&RecordBatch::new_empty(flagger.schema.clone()))?)
            .await?;
    }
    let filtered = write_state(lake, &layout::silver_state(&table, &build_id), &keys, rules.version).await?;
    drop(reservation);
    let inputs_json = serde_json::json!({ "inputs_digest": digest }).to_string();
    lake.put(&layout::silver_inputs(&table, &build_id), inputs_json.into())
        .await?;
    crate::failpoint::hit("build.after_data")?;

    record.rows_written = written as i64;
    record.rows_rejected = rejected as i64;
    record.rows_filtered = filtered as i64;
    record.rows_read = rows_read as i64;
    record.rows_flagged = flagged as i64;
    record.finished_at = now_micros();
    commit_build(lake, record).await?;
    crate::failpoint::hit("build.after_commit")?;
    Ok(Built {
        record: record.clone(),
        table_rows,
        kept_rows: table_rows - written,
    })
}
