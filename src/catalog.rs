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
//! `natural_key_fingerprint` (newest `ingested_at`, then run id).

use std::sync::Arc;

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::catalog::{MemorySchemaProvider, TableProvider};
use datafusion::datasource::empty::EmptyTable;
use datafusion::datasource::file_format::parquet::ParquetFormat;
use datafusion::datasource::listing::{ListingOptions, ListingTable, ListingTableConfig, ListingTableUrl};
use datafusion::logical_expr::ExprFunctionExt;
use datafusion::prelude::{SessionContext, col, lit};

use crate::audit::{
    BuildRecord, BuildStatus, RunRecord, build_log_schema, failure_log_schema, read_build_log, read_run_log,
    run_log_schema,
};
use crate::contract::{Contract, ContractSet};
use crate::error::{Error, Result};
use crate::lake::{Lake, layout};
use crate::session::Workspace;
use crate::yaml::Problems;

/// A session with every table of the lake registered.
pub struct Catalog {
    pub ctx: SessionContext,
    pub contracts: ContractSet,
    pub runs: Vec<RunRecord>,
    /// Every committed silver build record, by table then sequence number.
    pub builds: Vec<BuildRecord>,
    /// Problems of contracts that could not be loaded (their tables are missing).
    pub problems: Problems,
    /// The cluster queries run on (`--cluster`), see [`crate::exec`].
    pub cluster: Option<String>,
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
    let runs = read_run_log(&ws.lake).await?;
    let builds = read_build_log(&ws.lake).await?;
    let cutoff = as_of.map(|a| as_of_micros(a, &builds)).transpose()?;
    let catalog = ctx
        .catalog("ingot")
        .ok_or_else(|| Error::Invalid("the default catalog \"ingot\" is missing".into()))?;
    for schema in ["bronze", "silver", "audit"] {
        catalog.register_schema(schema, Arc::new(MemorySchemaProvider::new()))?;
    }
    for contract in contracts.contracts.values() {
        register_bronze(&ctx, &ws.lake, contract, &runs).await?;
    }
    let run_files: Vec<String> = runs
        .iter()
        .map(|r| ws.lake.url(&layout::run_record(&r.source, r.seq)))
        .collect();
    ctx.register_table("audit.ingestion_run_log", table_over(run_files, run_log_schema())?)?;
    let mut failure_files: Vec<String> = runs
        .iter()
        .filter(|r| r.has_failures())
        .map(|r| ws.lake.url(&layout::failures(&r.run_id)))
        .collect();
    failure_files.extend(
        builds
            .iter()
            .filter(|b| b.status == BuildStatus::Succeeded && b.rows_rejected > 0)
            .map(|b| ws.lake.url(&layout::silver_failures(&b.build_id))),
    );
    let build_files: Vec<String> = builds
        .iter()
        .map(|b| ws.lake.url(&layout::build_record(&b.table, b.seq)))
        .collect();
    ctx.register_table("audit.silver_build_log", table_over(build_files, build_log_schema())?)?;
    register_silver(&ctx, ws, &contracts, &builds, cutoff).await?;
    ctx.register_table(
        "audit.row_failure_log",
        table_over(failure_files, failure_log_schema())?,
    )?;
    Ok(Catalog {
        ctx,
        contracts,
        runs,
        builds,
        problems,
        cluster: ws.cluster.clone(),
    })
}

async fn register_bronze(ctx: &SessionContext, lake: &Lake, contract: &Contract, runs: &[RunRecord]) -> Result<()> {
    let files: Vec<String> = bronze_runs(runs, &contract.source)
        .into_iter()
        .map(|r| lake.url(&layout::bronze_data(&r.source, &r.run_id)))
        .collect();
    let name = format!("bronze.{}", contract.source);
    ctx.register_table(name.as_str(), table_over(files, contract.bronze_schema())?)?;
    let rn = datafusion::functions_window::expr_fn::row_number()
        .partition_by(vec![col("natural_key_fingerprint")])
        .order_by(vec![
            col("ingested_at").sort(false, true),
            col("ingestion_run_id").sort(false, true),
        ])
        .build()?
        .alias("__ingot_rn");
    let current = ctx
        .table(name.as_str())
        .await?
        .window(vec![rn])?
        .filter(col("__ingot_rn").eq(lit(1u64)))?
        .drop_columns(&["__ingot_rn"])?;
    ctx.register_table(
        format!("bronze.{}_current", contract.source).as_str(),
        current.into_view(),
    )?;
    Ok(())
}

/// The runs whose bronze data file is part of `bronze.<source>` (silver builds read the same).
pub fn bronze_runs<'a>(runs: &'a [RunRecord], source: &str) -> Vec<&'a RunRecord> {
    runs.iter().filter(|r| r.source == source && r.has_data()).collect()
}

/// The build of `table` that was current at `t` (microseconds, UTC): the latest that had finished
/// by then and was not rolled back before it.
pub fn current_at<'a>(builds: &'a [BuildRecord], table: &str, t: i64) -> Option<&'a BuildRecord> {
    builds
        .iter()
        .filter(|b| b.table == table && b.finished_at <= t)
        .filter(|b| match b.status {
            BuildStatus::Succeeded => true,
            BuildStatus::RolledBack => b.rolled_back_at.is_some_and(|r| r > t),
            BuildStatus::Failed => false,
        })
        .max_by_key(|b| (b.finished_at, b.seq))
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

/// `silver.<table>` for every table with a succeeded build (its latest snapshot) and every table
/// with valid rules but no build yet (empty, with the columns the rules would produce; rules or
/// contracts with problems are skipped silently here: `ingot check` reports them).
async fn register_silver(
    ctx: &SessionContext,
    ws: &Workspace,
    contracts: &ContractSet,
    builds: &[BuildRecord],
    as_of: Option<i64>,
) -> Result<()> {
    let mut tables: Vec<&str> = builds.iter().map(|b| b.table.as_str()).collect();
    tables.dedup();
    let mut built = std::collections::HashSet::new();
    for table in tables {
        let chosen = match as_of {
            None => latest_build(builds, table),
            Some(t) => current_at(builds, table, t),
        };
        if let Some(b) = chosen {
            let provider = crate::silver::build::snapshot_table(ctx, &ws.lake, table, &b.build_id)
                .await
                .map_err(|e| match as_of {
                    Some(_) => Error::Invalid(format!(
                        "silver.{table} as of then is build {}, whose snapshot is no longer readable (removed by \
                         `ingot gc` after its retention?): {e}",
                        b.build_id
                    )),
                    None => e,
                })?;
            ctx.register_table(format!("silver.{table}").as_str(), provider)?;
            built.insert(table.to_string());
        }
    }
    let mut ignored = Problems::default();
    let rules = crate::rules::RulesSet::load(&ws.rules_dir, contracts, &mut ignored);
    for (table, versions) in &rules.tables {
        if built.contains(table) {
            continue;
        }
        let Some(latest) = versions.values().next_back() else {
            continue;
        };
        if let Ok(schema) = crate::silver::build::planned_schema(ctx, contracts, latest).await {
            ctx.register_table(format!("silver.{table}").as_str(), table_over(vec![], schema)?)?;
        }
    }
    Ok(())
}

/// The Arrow schema stored in one Parquet file ingot wrote (strings stay `Utf8`, not views).
pub async fn file_schema(ctx: &SessionContext, lake: &Lake, rel: &str) -> Result<SchemaRef> {
    let url = ListingTableUrl::parse(lake.url(rel))?;
    let options = ListingOptions::new(Arc::new(ParquetFormat::default().with_force_view_types(false)))
        .with_file_extension(".parquet");
    Ok(options.infer_schema(&ctx.state(), &url).await?)
}

/// A listing table over one Parquet file ingot wrote, with the schema stored in it.
pub async fn table_over_file(ctx: &SessionContext, lake: &Lake, rel: &str) -> Result<Arc<dyn TableProvider>> {
    let schema = file_schema(ctx, lake, rel).await?;
    table_over(vec![lake.url(rel)], schema)
}

/// A Parquet listing table over exactly `files` (an [`EmptyTable`] when there are none, which a
/// plan sent to a cluster carries as an empty relation, see [`crate::exec`]).
pub fn table_over(files: Vec<String>, schema: SchemaRef) -> Result<Arc<dyn TableProvider>> {
    if files.is_empty() {
        return Ok(Arc::new(EmptyTable::new(schema)));
    }
    let urls = files
        .iter()
        .map(ListingTableUrl::parse)
        .collect::<datafusion::error::Result<Vec<_>>>()?;
    let options = ListingOptions::new(Arc::new(ParquetFormat::default())).with_file_extension(".parquet");
    let config = ListingTableConfig::new_with_multi_paths(urls)
        .with_listing_options(options)
        .with_schema(schema);
    Ok(Arc::new(ListingTable::try_new(config)?))
}
