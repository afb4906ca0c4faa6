//! The natural-key version a source's bronze is keyed with, and the ingest's refusal to mix
//! versions (raising the version is `ingot rekey`'s job, see [`crate::ops::rekey`]).

use std::sync::Arc;

use datafusion::arrow::array::{Array, AsArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema};

use crate::engine::catalog::table_over;
use crate::engine::session::Workspace;
use crate::error::{Error, Result};
use crate::spec::contract::Contract;
use crate::table::audit::RunRecord;
use crate::table::lake::layout;

/// The natural-key version of `source`'s current bronze state (`None`: it holds no records and
/// was never re-keyed): that of its latest rekey run, or of its newest run with data since (older
/// run records lack the column: then the run's file says).
pub async fn lake_key_version(ws: &Workspace, runs: &[RunRecord], source: &str) -> Result<Option<i32>> {
    let Some(newest) = runs
        .iter()
        .rev()
        .filter(|r| r.source == source && r.status.is_loaded())
        .find(|r| r.is_rekey() || r.has_data())
    else {
        return Ok(None);
    };
    if let Some(v) = newest.natural_key_version {
        return Ok(Some(v));
    }
    let ctx = ws.session()?;
    let schema = Arc::new(Schema::new(vec![Field::new(
        "natural_key_version",
        DataType::Int32,
        true,
    )]));
    let url = ws.lake.url(&layout::bronze_data(source, &newest.run_id));
    let batches = ctx
        .read_table(table_over(vec![url], schema)?)?
        .limit(0, Some(1))?
        .collect()
        .await?;
    Ok(batches
        .iter()
        .find(|b| b.num_rows() > 0)
        .and_then(|b| {
            b.column(0)
                .as_primitive_opt::<datafusion::arrow::datatypes::Int32Type>()
        })
        .and_then(|a| a.is_valid(0).then(|| a.value(0))))
}

/// Refuse to ingest `contract` into a lake whose bronze is keyed with another natural-key version.
pub async fn check_key_version(ws: &Workspace, runs: &[RunRecord], contract: &Contract) -> Result<()> {
    let want = contract.natural_key.version;
    match lake_key_version(ws, runs, &contract.source).await? {
        Some(have) if i64::from(have) != want => Err(Error::Invalid(format!(
            "{source}: bronze.{source} is keyed with natural_key version {have}, but {path} says version {want}; \
             ingest will not mix key versions: run `ingot rekey {source}` first (or restore natural_key version \
             {have} in the contract)",
            source = contract.source,
            path = contract.path.display()
        ))),
        _ => Ok(()),
    }
}
