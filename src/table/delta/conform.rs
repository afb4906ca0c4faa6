//! Conformed copies: `bronze/<source>` reads the same in other engines after its contract renamed
//! a field (`renamed_from`) or changed its type (a widening, `older_values: cast`).
//!
//! ingot reads an older run's file under the current contract ([`read_stored`]); a Delta reader
//! reads every file by column name under the table's one schema, and would see null for a renamed
//! field, or the stored type. Such a run is published as a copy of its rows as ingot reads them,
//! `bronze/<source>/_conformed/<key>/run_id=<id>/part-00000.parquet` ([`conform_key`] of the
//! contract), written before the Delta commit that names it; the run's own file stays the truth.
//!
//! The table's schema is the contract's, its property [`CONFORMED_TO`] the key: a commit under
//! another contract compares the whole table again ([`super::runs::sync_source`]). Without a
//! readable contract the runs are published as stored. gc: see docs/delta.md.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use futures::StreamExt;

use crate::error::Result;
use crate::spec::contract::Contract;
use crate::table::audit::RunRecord;
use crate::table::bronze::RunFileWriter;
use crate::table::evolve::{StoredRun, check_readable, conform_key, read_stored, reads_as_stored};
use crate::table::lake::Lake;

/// The folder of a bronze table's conformed copies, inside the table.
pub const CONFORMED: &str = "_conformed";

/// The table property that says which key a bronze table's files were chosen under.
pub const CONFORMED_TO: &str = "ingot.conformedTo";

/// A run's conformed copy under `key`, as a path inside its `bronze/<source>` table.
pub fn copy_path(key: &str, run_id: &str) -> String {
    format!("{CONFORMED}/{key}/run_id={run_id}/part-00000.parquet")
}

/// The run a conformed copy (a path inside a bronze table) is of, and its key.
pub fn copy_of(inside: &str) -> Option<(&str, &str)> {
    let rest = inside.strip_prefix(CONFORMED)?.strip_prefix('/')?;
    let (key, rest) = rest.split_once('/')?;
    let (dir, file) = rest.split_once('/')?;
    (file == "part-00000.parquet").then_some(())?;
    Some((dir.strip_prefix("run_id=")?, key))
}

/// How a source's runs are published under its contract.
pub struct Conform<'a> {
    pub contract: &'a Contract,
    pub key: String,
    /// Per recorded definition: does a reader by column name read it as the contract does?
    plain: Mutex<HashMap<Option<String>, bool>>,
}

impl<'a> Conform<'a> {
    /// The publishing of `runs` under `contract`; `None` when the contract cannot read some of
    /// them (ingot refuses the source then too): they are published as stored.
    pub fn new(contract: &'a Contract, runs: &[&RunRecord]) -> Option<Conform<'a>> {
        check_readable(contract, runs).ok()?;
        Some(Conform {
            contract,
            key: conform_key(contract),
            plain: Mutex::new(HashMap::new()),
        })
    }

    /// The file of run `r` inside its table: its conformed copy when a reader by column name
    /// would read its own file differently from ingot, else its own file (`own`).
    pub fn path(&self, r: &RunRecord, own: String) -> String {
        if self.copies(r) {
            copy_path(&self.key, &r.run_id)
        } else {
            own
        }
    }

    /// Is run `r` published as a conformed copy?
    pub fn copies(&self, r: &RunRecord) -> bool {
        let definition = r.contract_fields.as_deref();
        let mut plain = self.plain.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(p) = plain.get(&definition.map(str::to_string)) {
            return !p;
        }
        let p = reads_as_stored(self.contract, definition);
        plain.insert(definition.map(str::to_string), p);
        !p
    }

    /// Write run `r`'s conformed copy (its rows as ingot reads them) to `rel` (lake-relative);
    /// the rows written. A copy is put whole or not at all, like every data file.
    pub async fn write(&self, lake: &Lake, r: &RunRecord, rel: String) -> Result<u64> {
        let ctx = datafusion::prelude::SessionContext::new();
        ctx.register_object_store(&lake.store_url, crate::table::strict::wrap(lake.store.clone()));
        let stored = StoredRun::new(lake, r);
        let df = read_stored(&ctx, self.contract, &[&stored])?;
        let schema = Arc::new(df.schema().as_arrow().clone());
        let mut rows = df.execute_stream().await?;
        crate::table::failpoint::hit("delta.conform")?;
        let mut w = RunFileWriter::new(lake, rel, schema);
        while let Some(batch) = rows.next().await {
            w.write(&batch?).await?;
        }
        w.finish().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_copy_path_names_its_run_and_key_and_nothing_else_does() {
        let p = copy_path("0123456789abcdef", "r-1");
        assert_eq!(p, "_conformed/0123456789abcdef/run_id=r-1/part-00000.parquet");
        assert_eq!(copy_of(&p), Some(("r-1", "0123456789abcdef")));
        for other in [
            "run_id=r-1/part-00000.parquet",
            "_conformed/k/run_id=r-1/part-00001.parquet",
            "_conformed/k/r-1/part-00000.parquet",
            "_conformed/run_id=r-1/part-00000.parquet",
            "_conformedx/k/run_id=r-1/part-00000.parquet",
        ] {
            assert_eq!(copy_of(other), None, "{other}");
        }
    }
}
