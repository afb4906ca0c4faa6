//! What a build will do, decided before anything is written: the mode, the runs it reads, per run
//! the records it processes, the rows it keeps, and whether it extends the previous build's
//! layers. `ingot build --dry-run` and `ingot explain` print a [`PlanSummary`]; [`super::execute`]
//! carries a [`BuildPlan`] out. Deciding reads the fingerprints of bronze and the previous
//! build's state (narrow scans), never the rows themselves.

use std::collections::BTreeSet;
use std::fmt;
use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, Schema};
use datafusion::common::DFSchema;
use datafusion::common::tree_node::TreeNode;
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryReservation};
use datafusion::logical_expr::{Expr, ExprSchemable};
use datafusion::prelude::SessionContext;
use sha2::Digest;

use super::BuildOptions;
use super::delta::{DeltaBase, delta_base, delta_limit};
use super::scan::{current_keys, matching_versions, previous_state, runs_newest_first};
use super::sources::MultiPlan;
use crate::engine::catalog::{Catalog, latest_build};
use crate::engine::session::Workspace;
use crate::error::{Error, Result};
use crate::silver::compile::{Inputs, RULES_VERSION, read_inputs};
use crate::silver::keys::{Keys, Mode, NONE};
use crate::spec::contract::Contract;
use crate::spec::rules::RuleSet;
use crate::table::audit::{BuildRecord, RunRecord};
use crate::table::lake::layout;
use crate::table::silver::{Manifest, manifest, relayer, snapshot_table};

/// A build's plan in words and numbers (owned: printed by `--dry-run` and `explain`, as text or
/// JSON).
#[derive(Debug, Clone, serde::Serialize)]
pub struct PlanSummary {
    pub table: String,
    pub rules_version: i32,
    /// As the build record will say: `full`, `incremental` or `rebuild`.
    pub mode: String,
    /// What the build does: `full` (every current record), `incremental` (a whole new snapshot
    /// of new and changed records plus kept rows), `delta` (a layer on the previous build's),
    /// `rebuild` or `unchanged` (nothing to do: the previous build's files are published again).
    pub kind: String,
    /// Why every record is processed, or why an incremental build is not a delta layer.
    pub reason: Option<String>,
    /// The build whose snapshot and state this one starts from.
    pub previous_build: Option<String>,
    pub rebuild_filter: Option<String>,
    /// Committed bronze runs (with data) the new table accounts for.
    pub runs: usize,
    /// The runs read, newest first, with the records processed of each.
    pub read: Vec<PlannedRun>,
    /// Records transformed by the build.
    pub process: u64,
    /// Rows kept from the previous snapshot (a delta build: the previous layers' rows).
    pub kept: u64,
    /// Records of the previous build that are no longer current (undone or deleted).
    pub removed: u64,
    /// The layer a delta build adds (1 is the first delta on a whole snapshot).
    pub delta_layer: Option<usize>,
}

/// One bronze run a build reads.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PlannedRun {
    pub run_id: String,
    /// Records of the run the build transforms.
    pub process: u64,
    /// Every row of the run is processed (read without key lookups).
    pub whole: bool,
}

/// A decided build: its summary and what [`super::execute`] needs to carry it out.
pub struct BuildPlan<'a> {
    pub summary: PlanSummary,
    pub(super) rules: &'a RuleSet,
    pub(super) inputs: Inputs,
    /// Digest of what `resolve` reads (`inputs.json`).
    pub(super) digest: String,
    /// The runs the new table accounts for, oldest first (the manifest's `runs`).
    pub(super) run_ids: Vec<String>,
    /// The build whose snapshot rows and state are kept or extended.
    pub(super) previous: Option<&'a BuildRecord>,
    /// The runs read, newest first, and the records to process of each.
    pub(super) work_runs: Vec<&'a RunRecord>,
    pub(super) per_run: Vec<u64>,
    /// Records whose previous snapshot row is kept.
    pub(super) kept_records: u64,
    /// Per record: current run, previous state, what to do (none for a full build over one run).
    pub(super) keys: Option<Arc<Keys>>,
    pub(super) delta: Option<DeltaBase<'a>>,
    /// Set when nothing is to be done: the manifest to publish (the previous build's files).
    pub(super) unchanged: Option<Manifest>,
    /// The key map's memory, held until the build ends.
    pub(super) reservation: MemoryReservation,
    /// A table with several sources: what each source reads.
    pub(super) multi: Option<MultiPlan<'a>>,
}

/// The mode the build record states, decided by the options and whether a build exists.
pub(super) fn mode_name(has_previous: bool, opts: &BuildOptions) -> &'static str {
    match (has_previous, &opts.rebuild_where, opts.full) {
        (true, Some(_), _) => "rebuild",
        (true, None, false) => "incremental",
        _ => "full",
    }
}

/// Where a build starts from: which records it must look at, from which previous build.
struct Start<'a> {
    mode: Mode,
    previous: Option<&'a BuildRecord>,
    rebuild_expr: Option<Expr>,
    reason: Option<String>,
}

/// Decide the mode: a rebuild of the rows `--rebuild-where` matches, an incremental build on the
/// latest build, or a full build (none yet, `--full`, or what `resolve` reads changed).
async fn start<'a>(
    ctx: &SessionContext,
    ws: &Workspace,
    table: &str,
    last: Option<&'a BuildRecord>,
    opts: &BuildOptions,
    rules: &RuleSet,
    digest: &str,
) -> Result<Start<'a>> {
    let lake = &ws.lake;
    let full = |reason: String| Start {
        mode: Mode::Full,
        previous: None,
        rebuild_expr: None,
        reason: Some(reason),
    };
    match (last, &opts.rebuild_where, opts.full) {
        (None, Some(_), _) => Err(Error::Invalid(format!(
            "--rebuild-where: \"{table}\" has no succeeded build to rebuild rows of; run `ingot build {table}` first"
        ))),
        (None, None, _) => Ok(full(format!("\"{table}\" has no succeeded build"))),
        (Some(_), None, true) => Ok(full("--full".into())),
        (Some(prev), Some(pred), _) => {
            let snap = ctx.read_table(snapshot_table(ctx, lake, table, &prev.build_id).await?)?;
            Ok(Start {
                mode: Mode::Full,
                previous: Some(prev),
                rebuild_expr: Some(parse_rebuild_filter(ctx, snap.schema().as_arrow(), pred)?),
                reason: None,
            })
        }
        (Some(prev), None, false) => {
            let previous_digest = lake
                .get(&layout::silver_inputs(table, &prev.build_id))
                .await?
                .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
                .and_then(|v| v["inputs_digest"].as_str().map(str::to_string));
            // When what `resolve` reads changed, any row's resolved value may have: all of them
            // are processed again.
            if previous_digest.as_deref() != Some(digest) {
                return Ok(full(format!(
                    "what resolve reads (a lookup's runs or a contract file) changed since build {}",
                    prev.build_id
                )));
            }
            Ok(Start {
                mode: Mode::Incremental { version: rules.version },
                previous: Some(prev),
                rebuild_expr: None,
                reason: None,
            })
        }
    }
}

/// Decide what a build of `rules` does now; writes nothing (see the module documentation).
pub async fn plan<'a>(
    ws: &Workspace,
    catalog: &'a Catalog,
    rules: &'a RuleSet,
    opts: &BuildOptions,
) -> Result<BuildPlan<'a>> {
    let ctx = &catalog.ctx;
    let cluster = ws.cluster.as_deref();
    let lake = &ws.lake;
    let table = rules.table.as_str();
    let inputs = read_inputs(ctx, &catalog.contracts, rules).await?;
    let contract = inputs.contract.clone();
    let all = catalog.runs().await?;
    let multi = match rules.sources {
        Some(_) => Some(MultiPlan::read(ctx, catalog, lake, rules, all).await?),
        None => None,
    };
    let (digest, runs) = match &multi {
        Some(m) => (m.digest(all, catalog)?, m.flat_runs()),
        None => (
            inputs_digest(catalog, all, &[&contract], false)?,
            runs_newest_first(all, &rules.source),
        ),
    };
    let run_ids: Vec<String> = runs.iter().rev().map(|r| r.run_id.to_string()).collect();
    let last = latest_build(&catalog.builds, table);
    let start = start(ctx, ws, table, last, opts, rules, &digest).await?;
    let mut summary = PlanSummary {
        table: table.to_string(),
        rules_version: rules.version,
        mode: mode_name(last.is_some(), opts).into(),
        kind: match (&start.mode, &start.rebuild_expr) {
            (_, Some(_)) => "rebuild",
            (Mode::Incremental { .. }, _) => "incremental",
            _ => "full",
        }
        .into(),
        reason: start.reason.clone(),
        previous_build: start.previous.map(|b| b.build_id.clone()),
        rebuild_filter: opts.rebuild_where.clone().filter(|_| start.rebuild_expr.is_some()),
        runs: runs.len(),
        read: Vec::new(),
        process: 0,
        kept: 0,
        removed: 0,
        delta_layer: None,
    };
    let reservation = MemoryConsumer::new("silver build keys").register(&ctx.runtime_env().memory_pool);
    let mut plan = BuildPlan {
        summary: summary.clone(),
        rules,
        inputs,
        digest,
        run_ids,
        previous: start.previous,
        work_runs: runs.clone(),
        per_run: Vec::new(),
        kept_records: 0,
        keys: None,
        delta: None,
        unchanged: None,
        reservation,
        multi,
    };

    // A delta build when the previous build's layers can be extended (see `delta_base`): only the
    // runs committed since are read.
    let mut delta_keys: Option<Keys> = None;
    if let (Mode::Incremental { .. }, Some(prev)) = (&start.mode, start.previous) {
        match layering(ws, ctx, prev, rules, &contract, &runs, plan.multi.as_ref()).await? {
            Layering::Whole(why) => summary.reason = Some(why),
            Layering::Unchanged(mut m) => {
                // nothing committed since: the table is the previous one
                m.runs = Some(plan.run_ids.clone());
                return Ok(plan.unchanged(summary, prev, *m));
            }
            Layering::Delta(d, keys) => {
                summary.kind = "delta".into();
                summary.delta_layer = Some(d.manifest.deltas.len() + 1);
                summary.kept = d.rows;
                summary.removed = keys.tombstones.len() as u64;
                if plan.multi.is_none() {
                    plan.work_runs = d.new_runs.clone(); // (several sources: older runs too)
                }
                plan.delta = Some(d);
                delta_keys = Some(*keys);
            }
        }
    }
    let keys = match delta_keys {
        Some(keys) => Some(keys),
        // a full build over one bronze run: every row is current and processed
        None if plan.multi.is_none()
            && matches!(start.mode, Mode::Full)
            && start.previous.is_none()
            && runs.len() <= 1
            && runs.iter().all(|r| r.rows_deleted == 0) =>
        {
            None
        }
        None => {
            let mut keys = match &plan.multi {
                Some(m) => m.keys(ctx, cluster, lake, table, start.previous).await?,
                None => one_source_keys(ws, ctx, table, &contract, &runs, start.previous).await?,
            };
            keys.mode = match &start.rebuild_expr {
                Some(expr) => Mode::Rebuild {
                    matching: matching_versions(ctx, &keys, expr).await?,
                },
                None => start.mode,
            };
            summary.removed = keys.map.values().filter(|e| e.prev != NONE && e.cur == NONE).count() as u64;
            Some(keys)
        }
    };
    plan.reservation.grow(keys.as_ref().map(Keys::bytes).unwrap_or(0));
    plan.count(keys.as_ref());

    // Nothing changed since the previous build (no record to process, none removed, the same
    // rules): the table is the previous one, so this build's manifest names its files.
    if let (Some(prev), Some(k)) = (start.previous, &keys)
        && matches!(k.mode, Mode::Incremental { .. })
        && plan.per_run.iter().all(|n| *n == 0)
        && prev.rules_version == rules.version
        && summary.removed == 0
    {
        let mut m = relayer(&manifest(lake, table, &prev.build_id).await?, table, &prev.build_id);
        m.runs = Some(plan.run_ids.clone());
        m.rows = Some(plan.kept_records);
        return Ok(plan.unchanged(summary, prev, m));
    }
    plan.keys = keys.map(Arc::new);
    if plan.delta.is_none() {
        summary.kept = plan.kept_records;
    }
    summary.process = plan.processed();
    summary.read = plan
        .work_runs
        .iter()
        .zip(&plan.per_run)
        .filter(|(_, n)| **n > 0)
        .map(|(r, n)| PlannedRun {
            run_id: r.run_id.to_string(),
            process: *n,
            whole: plan.keys.is_none() || reads_whole(r, *n),
        })
        .collect();
    plan.summary = summary;
    Ok(plan)
}

/// The key map of a table with one source: its current records and `previous`'s state.
async fn one_source_keys(
    ws: &Workspace,
    ctx: &SessionContext,
    table: &str,
    contract: &Contract,
    runs: &[&RunRecord],
    previous: Option<&BuildRecord>,
) -> Result<Keys> {
    let cluster = ws.cluster.as_deref();
    let mut keys = current_keys(ctx, cluster, &ws.lake, contract, runs).await?;
    if let Some(prev) = previous {
        previous_state(ctx, cluster, &ws.lake, &mut keys, table, &prev.build_id).await?;
    }
    Ok(keys)
}

/// How an incremental build on `prev` writes its table.
#[allow(clippy::large_enum_variant)] // one value per build, moved once
enum Layering<'a> {
    /// Nothing was committed since `prev`: its manifest, published again.
    Unchanged(Box<Manifest>),
    /// A delta layer on `prev`'s layers, with the keys of the runs committed since.
    Delta(DeltaBase<'a>, Box<Keys>),
    /// A whole new snapshot, for this reason.
    Whole(String),
}

/// Can an incremental build on `prev` extend its layers (see `delta_base`), reading only the
/// runs committed since (several sources: and the candidates their records have in older
/// runs)? Not on a cluster, and not past the compaction limit.
async fn layering<'a>(
    ws: &Workspace,
    ctx: &SessionContext,
    prev: &BuildRecord,
    rules: &RuleSet,
    contract: &Contract,
    runs: &[&'a RunRecord],
    multi: Option<&MultiPlan<'a>>,
) -> Result<Layering<'a>> {
    if ws.cluster.is_some() {
        return Ok(Layering::Whole("a build on a cluster writes no delta layers".into()));
    }
    let d = match delta_base(&ws.lake, &rules.table, prev, rules, runs).await? {
        Err(why) => return Ok(Layering::Whole(why)),
        Ok(d) => d,
    };
    let keys = match multi {
        None if d.new_runs.is_empty() => return Ok(Layering::Unchanged(Box::new(d.manifest))),
        None => current_keys(ctx, None, &ws.lake, contract, &d.new_runs).await?,
        Some(m) => {
            // a decision recorded or withdrawn since changes its record, as a new run would
            let forced = m.changed_decisions(&ws.lake, &rules.table, prev).await?;
            if d.new_runs.is_empty() && forced.is_empty() {
                return Ok(Layering::Unchanged(Box::new(d.manifest)));
            }
            m.delta_keys(ctx, &ws.lake, &rules.table, prev, &d.new_runs, &forced)
                .await?
        }
    };
    let deleted_before: u64 = d.manifest.deltas.iter().map(|x| x.deleted_keys).sum();
    // compaction: past a fraction of the table deleted, a build rewrites the whole snapshot
    let touched = (keys.map.len() + keys.tombstones.len()) as u64;
    let limit = delta_limit()?;
    if (deleted_before + touched) as f64 <= limit * d.rows as f64 {
        Ok(Layering::Delta(d, Box::new(keys)))
    } else {
        Ok(Layering::Whole(format!(
            "delta layers would replace more than {limit} of the table's {} rows \
             (INGOT_SILVER_DELTA_LIMIT): a whole new snapshot",
            d.rows
        )))
    }
}

/// Are all rows of `run` processed (`n` of them), so that it is read without key lookups?
pub(super) fn reads_whole(run: &RunRecord, n: u64) -> bool {
    i64::try_from(n).ok() == Some(run.rows_written())
}

impl<'a> BuildPlan<'a> {
    /// Records to process (several sources: records, not their candidates).
    fn processed(&self) -> u64 {
        match &self.multi {
            Some(m) => m.processed.get(),
            None => self.per_run.iter().sum(),
        }
    }

    /// Records to process per work run, and the previous snapshot's rows kept.
    fn count(&mut self, keys: Option<&Keys>) {
        self.per_run = vec![0u64; self.work_runs.len()];
        if let (Some(m), Some(keys)) = (&self.multi, keys) {
            m.count(keys, &mut self.per_run, &mut self.kept_records);
            return;
        }
        match keys {
            None => {
                for (i, r) in self.work_runs.iter().enumerate() {
                    self.per_run[i] = u64::try_from(r.rows_inserted + r.rows_updated).unwrap_or(0);
                }
            }
            Some(keys) => {
                for e in keys.map.values() {
                    if keys.process(e) {
                        self.per_run[e.cur as usize] += 1;
                    } else if keys.keep_row(e) {
                        self.kept_records += 1;
                    }
                }
            }
        }
    }

    /// This plan turned into "nothing to do": publish manifest `m` (the previous build's files).
    fn unchanged(mut self, mut summary: PlanSummary, prev: &'a BuildRecord, m: Manifest) -> BuildPlan<'a> {
        summary.kind = "unchanged".into();
        summary.reason = None;
        summary.kept = m.rows.unwrap_or(0);
        summary.read.clear();
        summary.process = 0;
        summary.delta_layer = None;
        self.summary = summary;
        self.previous = Some(prev);
        self.delta = None;
        self.unchanged = Some(m);
        self
    }
}

impl fmt::Display for PlanSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let prev = self.previous_build.as_deref().unwrap_or("-");
        write!(f, "silver.{} with rules v{}: ", self.table, self.rules_version)?;
        match self.kind.as_str() {
            "unchanged" => writeln!(f, "nothing to do since build {prev} (its files are published again)")?,
            "delta" => writeln!(
                f,
                "incremental build, delta layer {} on build {prev}",
                self.delta_layer.unwrap_or(1)
            )?,
            "incremental" => writeln!(f, "incremental build on build {prev}, as a whole new snapshot")?,
            "rebuild" => writeln!(
                f,
                "rebuild of the rows where {} on build {prev}",
                self.rebuild_filter.as_deref().unwrap_or("?")
            )?,
            _ => writeln!(f, "full build, every current record")?,
        }
        if let Some(why) = &self.reason {
            writeln!(f, "  because: {why}")?;
        }
        writeln!(
            f,
            "  bronze runs: {} accounted for, {} to read",
            self.runs,
            self.read.len()
        )?;
        for r in &self.read {
            let whole = if r.whole { " (every row)" } else { "" };
            writeln!(
                f,
                "    run {}: {} record{}{whole}",
                r.run_id,
                r.process,
                plural(r.process)
            )?;
        }
        write!(
            f,
            "  records: {} to process, {} kept, {} removed",
            self.process, self.kept, self.removed
        )
    }
}

fn plural(n: u64) -> &'static str {
    if n == 1 { "" } else { "s" }
}

/// Digest of what `resolve` reads: the sources' and lookups' contract files and the lookups'
/// committed data runs. When it differs from the previous build's, every row is processed again.
/// `labelled`: each source's file is preceded by its name (several sources, in name order; one
/// source's digest stays as it always was).
pub(super) fn inputs_digest(
    catalog: &Catalog,
    all: &[RunRecord],
    contracts: &[&Contract],
    labelled: bool,
) -> Result<String> {
    let mut h = sha2::Sha256::new();
    let file = |p: &std::path::Path| std::fs::read(p).map_err(|e| Error::io(p.display(), e));
    let mut lookups: BTreeSet<&str> = BTreeSet::new();
    for contract in contracts {
        if labelled {
            h.update(format!("\nsource {}\n", contract.source));
        }
        h.update(file(&contract.path)?);
        lookups.extend(contract.resolve.iter().map(|r| r.lookup.as_str()));
    }
    for source in lookups {
        h.update(format!("\nlookup {source}\n"));
        if let Some(lc) = catalog.contracts.contracts.get(source) {
            h.update(file(&lc.path)?);
        }
        let mut runs: Vec<_> = all.iter().filter(|r| r.source == source && r.has_data()).collect();
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
