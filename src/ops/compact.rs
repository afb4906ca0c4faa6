//! `ingot compact [SOURCE...] [--all]`: merge the small runs of each source into segments now,
//! under the source's lock ([`crate::engine::compact`]; an ingest does the same after it commits).

use crate::engine::compact::Compacted;
use crate::engine::session::Workspace;
use crate::error::Result;
use crate::spec::contract::Contract;

/// Compact one source: take its lock, read its run log, merge.
pub async fn compact(ws: &Workspace, contract: &Contract, all: bool) -> Result<Compacted> {
    let holder = format!("compact-{}", ws.new_id());
    let ttl = crate::table::lock::default_ttl();
    let lock = crate::table::lock::acquire(&ws.lake, &contract.source, &holder, ttl, ws.lock_wait).await?;
    let result = async {
        let runs = crate::table::audit::read_source_runs(&ws.lake, &contract.source).await?;
        crate::engine::compact::compact_source(ws, contract, &runs, all).await
    }
    .await;
    lock.release().await?;
    result
}
