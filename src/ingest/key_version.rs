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
    let Some(newest) = newest_keyed(runs, source) else {
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

/// A key definition without its field names (`a string [trim]; n integer []` ->
/// `string [trim]; integer []`): what its fingerprints depend on, so renaming a key field in the
/// contract is not a key change.
fn key_shape(definition: &str) -> Vec<&str> {
    definition
        .split("; ")
        .map(|part| part.split_once(' ').map_or(part, |(_, rest)| rest))
        .collect()
}

/// The run whose keys `source`'s current bronze state has: its latest rekey run, or its newest
/// loaded run with data since.
fn newest_keyed<'a>(runs: &'a [RunRecord], source: &str) -> Option<&'a RunRecord> {
    runs.iter()
        .rev()
        .filter(|r| r.source == source && r.status.is_loaded())
        .find(|r| r.is_rekey() || r.has_data())
}

/// Refuse to ingest `contract` into a lake whose bronze is keyed with another natural-key version,
/// or with another key definition under the same version (fields, their order, their types as
/// canonical text sees them, normalize steps: [`Contract::key_definition`]).
pub async fn check_key_version(ws: &Workspace, runs: &[RunRecord], contract: &Contract) -> Result<()> {
    let want = contract.natural_key.version;
    let source = &contract.source;
    let path = contract.path.display();
    match lake_key_version(ws, runs, source).await? {
        Some(have) if i64::from(have) != want => Err(Error::Invalid(format!(
            "{source}: bronze.{source} is keyed with natural_key version {have}, but {path} says version {want}; \
             ingest will not mix key versions: run `ingot rekey {source}` first (or restore natural_key version \
             {have} in the contract)"
        ))),
        _ => match newest_keyed(runs, source).and_then(|r| r.natural_key_definition.as_deref()) {
            Some(have) if key_shape(have) != key_shape(&contract.key_definition()) => Err(Error::Invalid(format!(
                "{source}: natural_key changed under version {want}: bronze.{source} is keyed by ({have}), but \
                 {path} says ({now}); that changes every fingerprint, so records delivered again would be \
                 current twice. Raise natural_key.version in {path}, then run `ingot rekey {source}` (or restore \
                 the key)",
                now = contract.key_definition()
            ))),
            _ => Ok(()),
        },
    }
}
