//! The SQL catalog over a lake: `bronze.<source>`, `bronze.<source>_current`,
//! `audit.ingestion_run_log` and `audit.row_failure_log`.
//!
//! Tables are listing tables over the explicit list of files named by committed run records, so
//! an uncommitted (crashed) run is invisible by construction and the same plans can later be
//! shipped to a cluster. `bronze.<source>_current` is a view: the latest committed version per
//! `natural_key_fingerprint` (newest `ingested_at`, then run id).

use std::sync::Arc;

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::catalog::{MemTable, MemorySchemaProvider, TableProvider};
use datafusion::datasource::file_format::parquet::ParquetFormat;
use datafusion::datasource::listing::{ListingOptions, ListingTable, ListingTableConfig, ListingTableUrl};
use datafusion::logical_expr::ExprFunctionExt;
use datafusion::prelude::{SessionContext, col, lit};

use crate::audit::{RunRecord, failure_log_schema, read_run_log, run_log_schema};
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
    /// Problems of contracts that could not be loaded (their tables are missing).
    pub problems: Problems,
}

/// Open a session over the lake with all tables registered.
pub async fn open(ws: &Workspace) -> Result<Catalog> {
    let ctx = ws.session()?;
    let mut problems = Problems::default();
    let contracts = ContractSet::load(&ws.contracts_dir, &mut problems);
    let runs = read_run_log(&ws.lake).await?;
    let catalog = ctx
        .catalog("ingot")
        .ok_or_else(|| Error::Invalid("the default catalog \"ingot\" is missing".into()))?;
    for schema in ["bronze", "audit"] {
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
    let failure_files: Vec<String> = runs
        .iter()
        .filter(|r| r.has_failures())
        .map(|r| ws.lake.url(&layout::failures(&r.run_id)))
        .collect();
    ctx.register_table(
        "audit.row_failure_log",
        table_over(failure_files, failure_log_schema())?,
    )?;
    Ok(Catalog {
        ctx,
        contracts,
        runs,
        problems,
    })
}

async fn register_bronze(ctx: &SessionContext, lake: &Lake, contract: &Contract, runs: &[RunRecord]) -> Result<()> {
    let files: Vec<String> = runs
        .iter()
        .filter(|r| r.source == contract.source && r.has_data())
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

/// A Parquet listing table over exactly `files` (an empty table when there are none).
fn table_over(files: Vec<String>, schema: SchemaRef) -> Result<Arc<dyn TableProvider>> {
    if files.is_empty() {
        return Ok(Arc::new(MemTable::try_new(schema, vec![vec![]])?));
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
