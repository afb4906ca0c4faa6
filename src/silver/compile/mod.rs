//! The plans of a silver build, as DataFrames (nothing is executed here): [`resolve`] the
//! contract's lookups, apply the rules' steps, run the validations ([`transform`]), and flag
//! anomalies over a whole table ([`flag`]). [`explain`] prints the plans for `ingot explain`.
//!
//! Everything is built from `Expr` trees: rule expressions were parsed by DataFusion when the
//! rules were loaded, column names are `Column`s and string literals, never SQL text. The
//! semantics are on the functions: the four outputs on [`transform`], lookups on [`resolve`],
//! anomalies on [`flag`].
//!
//! Hazards: every output of [`transform`] is a separate plan over the same input, so executing
//! all of them reads bronze once per output; a build uses [`transform_split`] (one plan for the
//! passing and failing rows), [`window_fires`] (windows over narrow columns) and
//! [`flag_projection`] (flags of one batch) instead. `to_json_row` is registered in the session
//! given to [`transform`]; plans built from [`resolve`] alone use the hashing UDFs of
//! [`crate::hash`], which every ingot session has.

mod anomaly;
mod inputs;
mod resolve;
mod spike;
mod transform;

use std::collections::HashSet;

use datafusion::common::{Column, ScalarValue};
use datafusion::dataframe::DataFrame;
use datafusion::logical_expr::{Expr, lit};
use datafusion::prelude::SessionContext;

use crate::error::Result;
use crate::spec::contract::Contract;
use crate::spec::rules::RuleSet;

pub use anomaly::{flag, flag_projection, is_window, window_fired_column, window_fires, window_fires_with};
pub use inputs::{Inputs, Lookup, Lookups, contract_of, current_table, lookups_of, read_inputs};
pub(crate) use resolve::field_of;
pub use resolve::{normalized, resolve};
pub use transform::{
    SPLIT_PAYLOAD, SPLIT_REASON, SPLIT_ROW_NUMBER, SPLIT_RULE, Split, Transformed, transform, transform_split,
};

/// `rules_version` (Int32): the version of the rules that produced a silver row.
pub use crate::spec::columns::RULES_VERSION;
/// `anomaly_flags` (List<Utf8>): names of the anomaly rules that fired, in rule order.
pub const ANOMALY_FLAGS: &str = "anomaly_flags";
/// `is_anomaly` (Boolean): whether any anomaly rule fired.
pub const IS_ANOMALY: &str = "is_anomaly";
/// The bronze columns silver keeps (after `rules_version`), for lineage.
pub const LINEAGE_COLUMNS: [&str; 3] = ["natural_key_fingerprint", "row_hash", "ingestion_run_id"];
/// Columns of `rejected` and `failed`.
pub const FAILURE_COLUMNS: [&str; 5] = [
    "natural_key_fingerprint",
    "source_row_number",
    "rule",
    "reason",
    "raw_payload",
];
/// Columns of `filtered`: the fingerprint, the record number, the 1-based number of the filter
/// step in `steps` and its SQL text.
pub const FILTERED_COLUMNS: [&str; 4] = ["natural_key_fingerprint", "source_row_number", "step", "filter"];
/// Added by [`resolve`]: `resolve:<name>` of the first `on_missing: reject` entry that missed,
/// null when none did.
pub const RESOLVE_RULE: &str = "__ingot_resolve_rule";
/// Added by [`resolve`]: why [`RESOLVE_RULE`] is set, null when it is not.
pub const RESOLVE_REASON: &str = "__ingot_resolve_reason";

const FINGERPRINT: &str = "natural_key_fingerprint";
const ROW_NUMBER: &str = "source_row_number";

fn c(name: &str) -> Expr {
    Expr::Column(Column::new_unqualified(name))
}

fn null_text() -> Expr {
    lit(ScalarValue::Utf8(None))
}

/// Every column of `df`, as `(name, column expression)` keeping its qualifier.
pub(crate) fn columns(df: &DataFrame) -> Vec<(String, Expr)> {
    df.schema()
        .iter()
        .map(|(q, f)| (f.name().clone(), Expr::Column(Column::from((q, f)))))
        .collect()
}

/// Names of the bronze bookkeeping columns (`ingestion_run_id`, ..., `ingested_at`).
fn bookkeeping() -> HashSet<String> {
    crate::table::bronze::meta_fields()
        .iter()
        .map(|f| f.name().clone())
        .collect()
}

/// The logical plans of a build of `rules` (transform then flag), as indented text: silver's
/// rows, then the rejected rows.
pub fn explain(
    ctx: &SessionContext,
    rules: &RuleSet,
    contract: &Contract,
    input: DataFrame,
    lookups: &Lookups,
) -> Result<String> {
    let t = transform(ctx, rules, contract, input, lookups)?;
    let silver = flag(t.passed, rules)?;
    Ok(format!(
        "-- silver.{} (rules v{}): the rows that pass, with their anomaly flags\n{}\n\n-- rows rejected to audit.row_failure_log\n{}\n",
        rules.table,
        rules.version,
        silver.logical_plan().display_indent(),
        t.rejected.logical_plan().display_indent()
    ))
}
