//! Silver: `bronze.<source>_current` cleaned by a versioned [`crate::spec::rules::RuleSet`] (docs/guide.md#rules, docs/guide.md#silver-builds).
//!
//! [`compile`] builds the DataFusion plans of a build (resolve, steps, validations, anomaly
//! flags) without executing anything; [`json`] holds the `to_json_row` UDF the rejected rows use;
//! [`build`] runs the plans and publishes a snapshot of `silver.<table>` (`ingot build`).

pub mod apply;
pub mod build;
pub mod compile;
pub mod fps;
pub mod keys;
pub mod sources;

pub use apply::apply_steps;

use crate::engine::catalog::{Catalog, register_descriptions, table_over};
use crate::engine::session::Workspace;
use crate::error::Result;
use crate::spec::yaml::Problems;

/// Register `silver.<table>` for every table with valid rules but no build yet: empty, with the
/// columns the latest rules would produce (rules or contracts with problems are skipped silently
/// here: `ingot check` reports them).
pub async fn register_planned(catalog: &Catalog, ws: &Workspace) -> Result<()> {
    let ctx = &catalog.ctx;
    let mut ignored = Problems::default();
    let rules = crate::spec::rules::RulesSet::load(&ws.rules_dir, &catalog.contracts, &mut ignored);
    let mut added = false;
    for (table, versions) in &rules.tables {
        let name = format!("silver.{table}");
        // a table whose snapshot could not be read is never planned-empty: it stays absent and
        // the catalog's problem names the file
        if ctx.table_exist(name.as_str())? || catalog.unreadable.contains(table) {
            continue;
        }
        let Some(latest) = versions.values().next_back() else {
            continue;
        };
        if let Ok(schema) = build::planned_schema(ctx, &catalog.contracts, latest).await {
            ctx.register_table(name.as_str(), table_over(vec![], schema)?)?;
            added = true;
        }
    }
    if added {
        register_descriptions(ctx, ws, &catalog.contracts).await?;
    }
    Ok(())
}
