//! `ingot build <table>`: decide what to do ([`plan()`], a [`BuildPlan`]: full, incremental,
//! delta layer, rebuild or nothing), then carry it out and publish a new snapshot of
//! `silver.<table>` atomically (docs/architecture.md#silver-builds tells how a build runs,
//! docs/formats.md the files it writes).
//!
//! Invariants: an incremental or delta build yields exactly the rows and flags of a full build
//! of the same bronze state, except `silver_build_id` of the rows it kept; the commit is the
//! build-log record, written last, so readers see the old snapshot or the new one; a crash
//! before it leaves files nothing reads. A rules version is immutable once a succeeded build
//! used it.
//! Hazard: gc must keep every file a succeeded build's manifest names, not only the files in the
//! build's own folder ([`build_files`] lists them, layers included).

mod delta;
mod execute;
mod memory;
mod parts;
mod plan;
mod publish;
mod scan;
mod sources;
mod windows;

use std::sync::Arc;

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::logical_expr::lit;
use datafusion::prelude::SessionContext;

pub use self::plan::{BuildPlan, PlanSummary, PlannedRun, parse_rebuild_filter, plan};
use crate::engine::catalog::{Catalog, latest_build};
use crate::engine::session::Workspace;
use crate::error::{Error, Result};
use crate::silver::compile::{flag, read_inputs, transform};
use crate::spec::contract::ContractSet;
use crate::spec::rules::{RuleSet, RulesSet};
use crate::spec::yaml::Problems;
use crate::table::audit::{BuildRecord, BuildStatus, commit_build};
use crate::table::lock::{Scope, acquire_for, default_ttl};
pub use crate::table::silver::{build_files, index_files, snapshot_table};

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

/// Build `table` (see the module documentation). A build that fails a `fail` validation returns
/// its committed `failed` record (the caller exits 1); other errors are returned as errors, and
/// those that are not the user's input are recorded as a `failed` build first.
///
/// The build holds the table's lock (`_locks/silver/<table>.lock`) from before it reads the
/// build log until after its commit: one build or undo of a table at a time, and gc leaves the
/// table's files alone meanwhile.
pub async fn build(ws: &Workspace, table: &str, opts: &BuildOptions) -> Result<Built> {
    memory::limit_arenas();
    // the manifest records the size and CRC-32 of every file the build writes
    let ws = &Workspace {
        lake: ws.lake.journaled(),
        ..ws.clone()
    };
    let build_id = ws.new_id();
    let lock = acquire_for(
        &ws.lake,
        Scope::Table(table),
        &build_id,
        Vec::new(),
        default_ttl(),
        ws.lock_wait,
    )
    .await?;
    let result = build_locked(ws, table, opts, build_id).await;
    lock.release().await?;
    result
}

async fn build_locked(ws: &Workspace, table: &str, opts: &BuildOptions, build_id: String) -> Result<Built> {
    let now = ws.now_micros();
    let catalog = crate::engine::catalog::open(ws).await?;
    // Never before a record of the table: build times follow commit order whatever the clock does.
    let started_at = catalog
        .builds
        .iter()
        .filter(|b| b.table == table)
        .map(|b| b.finished_at.max(b.rolled_back_at.unwrap_or(0)).saturating_add(1))
        .fold(now, i64::max);
    let rules = load_rules(ws, &catalog, table, opts.rules_version)?;
    check_unchanged_rules(ws, &catalog, &rules)?;
    let previous = latest_build(&catalog.builds, table);
    let seq = catalog
        .builds
        .iter()
        .filter(|b| b.table == table)
        .map(|b| b.seq)
        .max()
        .unwrap_or(0)
        + 1;
    let mut record = BuildRecord {
        build_id: build_id.clone(),
        table: table.to_string(),
        rules_version: rules.version,
        rules_sha256: rules.sha256.clone(),
        mode: plan::mode_name(previous.is_some(), opts).into(),
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
        conflicts_open: 0,
        conflicts_decided: 0,
        decisions_stale: 0,
        seq,
    };
    let done = match plan(ws, &catalog, &rules, opts).await {
        Ok(p) => execute::execute(ws, &catalog, p, &mut record).await,
        Err(e) => Err(e),
    };
    match done {
        Ok(built) => Ok(built),
        Err(e @ (Error::Invalid(_) | Error::Config(_) | Error::Locked(_))) => Err(e),
        Err(e) => {
            // Record the failure (best effort) so the build log tells what happened.
            record.status = BuildStatus::Failed;
            record.error = Some(e.to_string());
            record.finished_at = ws.now_micros().max(record.started_at);
            let _ = commit_build(&ws.lake, &record).await;
            Err(e)
        }
    }
}

/// What `ingot build --dry-run` prints: the plan of a build of `table` now, without writing.
pub async fn dry_run(ws: &Workspace, table: &str, opts: &BuildOptions) -> Result<PlanSummary> {
    let catalog = crate::engine::catalog::open(ws).await?;
    let rules = load_rules(ws, &catalog, table, opts.rules_version)?;
    plan_summary(ws, &catalog, &rules, opts).await
}

/// The plan of a build of `rules` now, refused as the build would be.
pub async fn plan_summary(
    ws: &Workspace,
    catalog: &Catalog,
    rules: &RuleSet,
    opts: &BuildOptions,
) -> Result<PlanSummary> {
    check_unchanged_rules(ws, catalog, rules)?;
    Ok(plan(ws, catalog, rules, opts).await?.summary)
}

/// Refuse rules whose version a succeeded build used with other contents (a rules version is
/// immutable once used), suggesting the next free version.
fn check_unchanged_rules(ws: &Workspace, catalog: &Catalog, rules: &RuleSet) -> Result<()> {
    let table = rules.table.as_str();
    let Some(b) = catalog.builds.iter().find(|b| {
        b.table == table
            && b.status == BuildStatus::Succeeded
            && b.rules_version == rules.version
            && b.rules_sha256 != rules.sha256
    }) else {
        return Ok(());
    };
    Err(Error::Invalid(format!(
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
            .with_file_name(format!("v{}.yaml", next_version(ws, catalog, table, rules.version)))
            .display()
    )))
}

/// The version to suggest for an edited rules file: one more than the highest there is.
fn next_version(ws: &Workspace, catalog: &Catalog, table: &str, version: i32) -> i32 {
    let mut problems = Problems::default();
    let rules = RulesSet::load(&ws.rules_dir, &catalog.contracts, &mut problems);
    rules.latest(table).map(|r| r.version).unwrap_or(version).max(version) + 1
}
