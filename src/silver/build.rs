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
//! Performance: `bronze.<source>_current` (a window over every bronze version) is computed once
//! per build: one pass writes the records to process, and for an incremental build every current
//! record's keys, to build-scoped scratch files (`_scratch_*.parquet`, deleted after the commit)
//! that the snapshot, failure, `fail`-check and state plans read. The transform still runs once
//! per output (snapshot, failures, and the `fail` check when the rules have a `fail`
//! validation); the state's outcomes are read back from the files just written. An incremental
//! build rewrites the whole snapshot and recomputes the flags over all of it, so it costs about
//! as much as a full build on a large table: only the transform work shrinks.

use std::collections::BTreeSet;
use std::sync::Arc;

use datafusion::arrow::array::{Array, AsArray, RecordBatch};
use datafusion::arrow::compute::cast as arrow_cast;
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::common::tree_node::TreeNode;
use datafusion::common::{Column, DFSchema, ScalarValue};
use datafusion::dataframe::DataFrame;
use datafusion::logical_expr::{Expr, ExprSchemable, JoinType, lit, when};
use datafusion::prelude::SessionContext;
use futures::StreamExt;
use sha2::Digest;

use super::compile::{ANOMALY_FLAGS, IS_ANOMALY, RULES_VERSION, flag, read_inputs, transform};
use crate::audit::{BuildRecord, BuildStatus, commit_build, failure_log_schema, parquet_bytes};
use crate::bronze::RunFileWriter;
use crate::catalog::{Catalog, latest_build, table_over_file};
use crate::contract::{Contract, ContractSet};
use crate::error::{Error, Result};
use crate::lake::{Lake, layout};
use crate::rules::{RuleSet, RulesSet};
use crate::session::Workspace;
use crate::yaml::Problems;

/// `silver_build_id` (Utf8): the build that wrote a silver row.
pub const SILVER_BUILD_ID: &str = "silver_build_id";

const FP: &str = "natural_key_fingerprint";
const ROW_HASH: &str = "row_hash";
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

/// Schema of the state file.
pub fn state_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new(FP, DataType::Utf8, true),
        Field::new(ROW_HASH, DataType::Utf8, true),
        Field::new(RUN_ID, DataType::Utf8, true),
        Field::new(OUTCOME, DataType::Utf8, true),
        Field::new(RULES_VERSION, DataType::Int32, true),
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

/// `(fp, row_hash, run)` of `df` under private names, for joins.
fn keys(df: DataFrame, prefix: &str, with_versions: bool) -> Result<DataFrame> {
    let mut cols = vec![c(FP).alias(format!("{prefix}_fp"))];
    if with_versions {
        cols.push(c(ROW_HASH).alias(format!("{prefix}_rh")));
        cols.push(c(RUN_ID).alias(format!("{prefix}_run")));
    }
    Ok(df.select(cols)?)
}

/// Rows of `left` whose fingerprint is (`JoinType::LeftSemi`) or is not (`LeftAnti`) in `right`.
fn by_fingerprint(left: DataFrame, right: DataFrame, how: JoinType, prefix: &str) -> Result<DataFrame> {
    let right = keys(right, prefix, false)?;
    Ok(left.join_on(right, how, [c(FP).eq(c(&format!("{prefix}_fp")))])?)
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

/// Stream the rows of `parts`, one after the other, into one file `rel`; when `always` an empty
/// file with the schema is written for no rows. `each` sees every batch with the index of its
/// part. Returns the number of rows.
async fn write_df(
    lake: &Lake,
    rel: String,
    parts: Vec<DataFrame>,
    schema: Option<SchemaRef>,
    always: bool,
    mut each: impl FnMut(usize, &RecordBatch),
) -> Result<u64> {
    let mut w: Option<(RunFileWriter, SchemaRef)> = None;
    let mut last_schema = schema.clone();
    for (i, df) in parts.into_iter().enumerate() {
        let mut stream = df.execute_stream().await?;
        let schema = schema.clone().unwrap_or_else(|| stream.schema());
        last_schema = Some(schema.clone());
        while let Some(b) = stream.next().await {
            let (writer, schema) =
                w.get_or_insert_with(|| (RunFileWriter::new(lake, rel.clone(), schema.clone()), schema.clone()));
            let b = conform(&b?, schema)?;
            each(i, &b);
            writer.write(&b).await?;
        }
    }
    let n = match w {
        Some((writer, _)) => writer.finish().await?,
        None => 0,
    };
    if n == 0
        && always
        && let Some(schema) = last_schema
    {
        lake.put(&rel, parquet_bytes(&RecordBatch::new_empty(schema))?).await?;
    }
    Ok(n)
}

/// Stream `df` (the current records, with extra columns when `process` is given) once: the rows
/// for which `process` is true — all rows when it is `None` — go to `input_rel` with the current
/// records' columns, and when `keys_rel` is given every row's (fingerprint, row_hash, run) goes
/// there. Returns the rows to process as a DataFrame over the file written.
async fn split_current(
    ctx: &SessionContext,
    lake: &Lake,
    current: DataFrame,
    process: Option<Expr>,
    input_rel: &str,
    keys_rel: Option<&str>,
) -> Result<DataFrame> {
    const PROCESS: &str = "__ingot_process";
    let width = current.schema().fields().len();
    let df = match process {
        Some(p) => {
            let mut cols: Vec<Expr> = current
                .schema()
                .iter()
                .filter(|(_, f)| !f.name().starts_with("__ingot_"))
                .map(|(q, f)| Expr::Column(Column::from((q, f))))
                .collect();
            cols.push(when(p, lit(true)).otherwise(lit(false))?.alias(PROCESS));
            current.select(cols)?
        }
        None => current,
    };
    let has_mark = df.schema().has_column_with_unqualified_name(PROCESS);
    let mut stream = df.execute_stream().await?;
    let full = stream.schema();
    let data_width = if has_mark { full.fields().len() - 1 } else { width };
    let data_schema = Arc::new(full.project(&(0..data_width).collect::<Vec<_>>())?);
    let key_idx: Vec<usize> = [FP, ROW_HASH, RUN_ID]
        .iter()
        .map(|n| data_schema.index_of(n))
        .collect::<std::result::Result<_, _>>()?;
    let keys_schema = Arc::new(data_schema.project(&key_idx)?);
    let mut input_w = RunFileWriter::new(lake, input_rel.to_string(), data_schema.clone());
    let mut keys_w = keys_rel.map(|rel| RunFileWriter::new(lake, rel.to_string(), keys_schema.clone()));
    while let Some(b) = stream.next().await {
        let b = b?;
        let data = b.project(&(0..data_width).collect::<Vec<_>>())?;
        let data = RecordBatch::try_new(data_schema.clone(), data.columns().to_vec())?;
        if let Some(w) = keys_w.as_mut() {
            w.write(&data.project(&key_idx)?).await?;
        }
        let chosen = if has_mark {
            let mask = b
                .column(data_width)
                .as_boolean_opt()
                .ok_or_else(|| Error::RunFailed("build: the input mark is not boolean".into()))?;
            datafusion::arrow::compute::filter_record_batch(&data, mask)?
        } else {
            data
        };
        input_w.write(&chosen).await?;
    }
    for (w, rel, schema) in [
        (Some(input_w), Some(input_rel), data_schema),
        (keys_w, keys_rel, keys_schema),
    ] {
        if let (Some(w), Some(rel)) = (w, rel)
            && w.finish().await? == 0
        {
            lake.put(rel, parquet_bytes(&RecordBatch::new_empty(schema))?).await?;
        }
    }
    Ok(ctx.read_table(table_over_file(ctx, lake, input_rel).await?)?)
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
    let current = inputs.input.clone();
    let digest = inputs_digest(catalog, &inputs.contract)?;

    // Which current records to process (P), which previous snapshot rows to keep (K) and which
    // previous state rows to keep (S). `bronze.<source>_current` is computed once: one pass
    // writes the records to process (and, for an incremental build, every current record's
    // keys) to build-scoped scratch files that every later plan reads.
    let input_rel = layout::silver_scratch(&table, &build_id, "input");
    let keys_rel = layout::silver_scratch(&table, &build_id, "current_keys");
    let (input, kept, kept_state) = match (previous, &opts.rebuild_where, opts.full) {
        (None, Some(_), _) => {
            return Err(Error::Invalid(format!(
                "--rebuild-where: \"{table}\" has no succeeded build to rebuild rows of; run `ingot build {table}` first"
            )));
        }
        (None, None, _) | (Some(_), None, true) => {
            let input = split_current(ctx, lake, current.clone(), None, &input_rel, None).await?;
            (input, None, None)
        }
        (Some(prev), rebuild, _) => {
            let snapshot_rel = layout::silver_data(&table, &prev.build_id);
            let snapshot = ctx.read_table(table_over_file(ctx, lake, &snapshot_rel).await?)?;
            let state =
                ctx.read_table(table_over_file(ctx, lake, &layout::silver_state(&table, &prev.build_id)).await?)?;
            if let Some(pred) = rebuild {
                record.mode = "rebuild".into();
                let expr = parse_rebuild_filter(ctx, snapshot.schema().as_arrow(), pred)?;
                // The state has every processed record's rules_version: rows a matching
                // version rejected or filtered are rebuilt too.
                let matching = keys(state.clone().filter(expr.clone().is_true())?, "__ingot_m", false)?;
                let marked = current
                    .clone()
                    .join_on(matching, JoinType::Left, [c(FP).eq(c("__ingot_m_fp"))])?;
                let process = c("__ingot_m_fp").is_not_null();
                let input = split_current(ctx, lake, marked, Some(process), &input_rel, None).await?;
                let kept = snapshot.filter(expr.is_not_true())?;
                let kept_state = by_fingerprint(state, input.clone(), JoinType::LeftAnti, "__ingot_p")?;
                (input, Some(kept), Some(kept_state))
            } else {
                record.mode = "incremental".into();
                let previous_digest = lake
                    .get(&layout::silver_inputs(&table, &prev.build_id))
                    .await?
                    .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
                    .and_then(|v| v["inputs_digest"].as_str().map(str::to_string));
                if previous_digest.as_deref() != Some(digest.as_str()) {
                    let input = split_current(ctx, lake, current.clone(), None, &input_rel, None).await?;
                    (input, None, None)
                } else {
                    // Rows another rules version rejected or filtered are processed again.
                    let unchanged = state
                        .clone()
                        .filter(c(OUTCOME).eq(lit("passed")).or(c(RULES_VERSION).eq(lit(rules.version))))?;
                    let marked = current.clone().join_on(
                        keys(unchanged, "__ingot_s", true)?,
                        JoinType::Left,
                        [
                            c(FP).eq(c("__ingot_s_fp")),
                            c(ROW_HASH).eq(c("__ingot_s_rh")),
                            c(RUN_ID).eq(c("__ingot_s_run")),
                        ],
                    )?;
                    let process = c("__ingot_s_fp").is_null();
                    let input = split_current(ctx, lake, marked, Some(process), &input_rel, Some(&keys_rel)).await?;
                    let current_keys = ctx.read_table(table_over_file(ctx, lake, &keys_rel).await?)?;
                    let still = |df: DataFrame| -> Result<DataFrame> {
                        let df = by_fingerprint(df, current_keys.clone(), JoinType::LeftSemi, "__ingot_c")?;
                        by_fingerprint(df, input.clone(), JoinType::LeftAnti, "__ingot_p")
                    };
                    (input.clone(), Some(still(snapshot)?), Some(still(state)?))
                }
            }
        }
    };

    let t = transform(ctx, rules, &inputs.contract, input.clone(), &inputs.lookups)?;

    // A `fail` validation: the build fails, nothing but its record is published.
    let has_fail = rules.validate.iter().any(|v| v.action == crate::rules::Action::Fail);
    let mut stream = if has_fail {
        t.failed.clone().execute_stream().await?
    } else {
        t.failed.clone().limit(0, Some(0))?.execute_stream().await?
    };
    let (mut n_failed, mut first, mut failed_rules) = (0u64, Vec::new(), BTreeSet::new());
    while let Some(b) = stream.next().await {
        let b = b?;
        let rule = b.column_by_name("rule").map(|a| a.as_string::<i32>().clone());
        let row = b.column_by_name("source_row_number").cloned();
        let raw = b.column_by_name("raw_payload").map(|a| a.as_string::<i32>().clone());
        for i in 0..b.num_rows() {
            if let Some(r) = &rule {
                failed_rules.insert(r.value(i).to_string());
            }
            if first.len() < 3 {
                let number = row
                    .as_ref()
                    .and_then(|a| a.as_primitive_opt::<datafusion::arrow::datatypes::Int64Type>())
                    .filter(|a| a.is_valid(i))
                    .map(|a| a.value(i).to_string())
                    .unwrap_or_else(|| "?".into());
                let payload = raw.as_ref().map(|a| a.value(i).to_string()).unwrap_or_default();
                first.push(format!("record {number}: {payload}"));
            }
        }
        n_failed += b.num_rows() as u64;
    }
    drop(stream);
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
        for rel in [&input_rel, &keys_rel] {
            let _ = lake.delete(rel).await;
        }
        return Ok(Built {
            record: record.clone(),
            table_rows: 0,
            kept_rows: 0,
        });
    }

    // The new table: kept rows (byte-for-byte but for the flags) and the rebuilt rows, flagged
    // over the whole of it.
    let rebuilt = t.passed.clone().with_column(SILVER_BUILD_ID, lit(build_id.as_str()))?;
    let combined = match kept {
        None => rebuilt,
        Some(kept) => {
            let kept = kept.drop_columns(&[ANOMALY_FLAGS, IS_ANOMALY])?;
            let want: Vec<(String, DataType)> = rebuilt
                .schema()
                .fields()
                .iter()
                .map(|f| (f.name().clone(), f.data_type().clone()))
                .collect();
            let have: Vec<(String, DataType)> = kept
                .schema()
                .fields()
                .iter()
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
            let kept = kept.select(want.iter().map(|(n, _)| c(n)).collect::<Vec<_>>())?;
            kept.union(rebuilt)?
        }
    };
    let table_df = flag(combined, rules)?;

    let (mut table_rows, mut written, mut flagged) = (0u64, 0u64, 0u64);
    write_df(
        lake,
        layout::silver_data(&table, &build_id),
        vec![table_df],
        None,
        true,
        |_, b| {
            table_rows += b.num_rows() as u64;
            if let Some(a) = b.column_by_name(IS_ANOMALY).and_then(|a| a.as_boolean_opt().cloned()) {
                flagged += a.true_count() as u64;
            }
            if let Some(a) = b
                .column_by_name(SILVER_BUILD_ID)
                .and_then(|a| a.as_string_opt::<i32>().cloned())
            {
                written += a.iter().filter(|v| *v == Some(build_id.as_str())).count() as u64;
            }
        },
    )
    .await?;

    let failures = t.rejected.clone().select(vec![
        lit(build_id.as_str()).alias("run_id"),
        lit("silver").alias("layer"),
        lit(rules.source.as_str()).alias("source"),
        lit(table.as_str()).alias("table"),
        c("source_row_number"),
        c(FP),
        c("raw_payload"),
        c("rule"),
        c("reason"),
        lit(rules.version).alias("rules_version"),
        lit(ScalarValue::TimestampMicrosecond(
            Some(record.started_at),
            Some("UTC".into()),
        ))
        .alias("failed_at"),
    ])?;
    let rejected = write_df(
        lake,
        layout::silver_failures(&build_id),
        vec![failures],
        Some(failure_log_schema()),
        false,
        |_, _| {},
    )
    .await?;

    // The state of the processed records, from what was just written: a record is `passed` when
    // the new snapshot has it from this build, `rejected` when this build's failure file has it,
    // otherwise a filter step removed it (every input row ends in exactly one of these, the
    // `failed` ones having failed the build above).
    let data_rel = layout::silver_data(&table, &build_id);
    let passed = ctx
        .read_table(table_over_file(ctx, lake, &data_rel).await?)?
        .filter(c(SILVER_BUILD_ID).eq(lit(build_id.as_str())))?;
    let mut processed = input.select(vec![c(FP), c(ROW_HASH), c(RUN_ID)])?.join_on(
        keys(passed, "__ingot_passed", false)?,
        JoinType::Left,
        [c(FP).eq(c("__ingot_passed_fp"))],
    )?;
    let mut outcome = when(c("__ingot_passed_fp").is_not_null(), lit("passed"));
    if rejected > 0 {
        let failures = ctx.read_table(table_over_file(ctx, lake, &layout::silver_failures(&build_id)).await?)?;
        processed = processed.join_on(
            keys(failures, "__ingot_rejected", false)?,
            JoinType::Left,
            [c(FP).eq(c("__ingot_rejected_fp"))],
        )?;
        outcome = outcome.when(c("__ingot_rejected_fp").is_not_null(), lit("rejected"));
    }
    let processed = processed.select(vec![
        c(FP),
        c(ROW_HASH),
        c(RUN_ID),
        outcome.otherwise(lit("filtered"))?.alias(OUTCOME),
        lit(rules.version).alias(RULES_VERSION),
    ])?;
    let mut parts = vec![processed];
    if let Some(k) = kept_state {
        parts.push(k.select(vec![c(FP), c(ROW_HASH), c(RUN_ID), c(OUTCOME), c(RULES_VERSION)])?);
    }
    let mut filtered = 0u64;
    write_df(
        lake,
        layout::silver_state(&table, &build_id),
        parts,
        Some(state_schema()),
        true,
        |part, b| {
            if part == 0
                && let Some(a) = b.column_by_name(OUTCOME).and_then(|a| a.as_string_opt::<i32>())
            {
                filtered += a.iter().filter(|v| *v == Some("filtered")).count() as u64;
            }
        },
    )
    .await?;
    let inputs_json = serde_json::json!({ "inputs_digest": digest }).to_string();
    lake.put(&layout::silver_inputs(&table, &build_id), inputs_json.into())
        .await?;
    crate::failpoint::hit("build.after_data")?;

    record.rows_written = written as i64;
    record.rows_rejected = rejected as i64;
    record.rows_filtered = filtered as i64;
    record.rows_read = record.rows_written + record.rows_rejected + record.rows_filtered;
    record.rows_flagged = flagged as i64;
    record.finished_at = now_micros();
    commit_build(lake, record).await?;
    crate::failpoint::hit("build.after_commit")?;
    for rel in [&input_rel, &keys_rel] {
        let _ = lake.delete(rel).await;
    }
    Ok(Built {
        record: record.clone(),
        table_rows,
        kept_rows: table_rows - written,
    })
}
