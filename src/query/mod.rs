//! Reading the lake with SQL: read-only statement checks ([`sql`]), result formats ([`output`]),
//! the interactive shell ([`shell`]) and the Arrow Flight SQL endpoint (`serve`, cargo feature
//! `flight`).

pub mod output;
#[cfg(feature = "flight")]
pub mod serve;
pub mod shell;
pub mod sql;

use crate::engine::catalog::Catalog;
use crate::engine::session::Workspace;
use crate::error::Result;

/// The catalog analysts query: every table of the lake ([`crate::engine::catalog::open_as_of`])
/// plus the silver tables that have rules but no build yet (empty, with their planned columns).
pub async fn open_catalog(ws: &Workspace, as_of: Option<&str>) -> Result<Catalog> {
    let catalog = crate::engine::catalog::open_as_of(ws, as_of).await?;
    crate::silver::register_planned(&catalog, ws).await?;
    Ok(catalog)
}
