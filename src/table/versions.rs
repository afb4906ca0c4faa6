//! Which runs of a source are current, and which of them can supersede a version: the rules
//! `bronze.<source>_current` (see [`crate::engine::current`]), change detection, silver builds
//! and the Delta table of the current versions ([`crate::table::delta::current`]) share.

use crate::table::audit::{RunRecord, RunStatus};

/// The runs that make up the current state of `source` (`bronze.<source>_current`, change
/// detection, silver builds): the runs with data from the source's latest `ingot rekey` run on,
/// or all of them when it was never re-keyed. The rekey run wrote every current record again
/// under the new natural key, so nothing before it decides what is current.
pub fn current_runs<'a>(runs: impl IntoIterator<Item = &'a RunRecord>, source: &str) -> Vec<&'a RunRecord> {
    let loaded: Vec<&RunRecord> = runs
        .into_iter()
        .filter(|r| r.source == source && r.status.is_loaded())
        .collect();
    let from = loaded.iter().rposition(|r| r.is_rekey()).unwrap_or(0);
    loaded[from..].iter().copied().filter(|r| r.has_data()).collect()
}

/// The slot before which a current run of `source` may hold a new version of a record that
/// counts again (`runs`: the latest record of each run): the latest undo, since the source's
/// latest rekey, of a run that wrote tombstones. A key that run deleted may have been delivered
/// again by a later run as a new record (an insert, superseding nothing then), while its version
/// from before the deleting run counts again once the undo removed the tombstone.
pub fn reinserts_before<'a>(runs: impl IntoIterator<Item = &'a RunRecord>, source: &str) -> Option<u64> {
    let mine: Vec<&RunRecord> = runs.into_iter().filter(|r| r.source == source).collect();
    let rekey = mine
        .iter()
        .filter(|r| r.status.is_loaded() && r.is_rekey())
        .map(|r| r.seq)
        .max()
        .unwrap_or(0);
    mine.iter()
        .filter(|r| r.status == RunStatus::RolledBack && r.rows_deleted > 0 && r.seq > rekey)
        .map(|r| r.seq)
        .max()
}

/// Can the versions of the current run `r` supersede a version that still counts? A run
/// classified its rows against the current runs before it, so only its updates and tombstones
/// can; a row for a key that was not current (a new record, or one deleted before) supersedes
/// nothing, unless an undo since brought an older version of that key back ([`reinserts_before`]:
/// then every run with new records before that undo counts as superseding).
pub fn supersedes(r: &RunRecord, reinserts_before: Option<u64>) -> bool {
    r.rows_updated > 0 || r.rows_deleted > 0 || (r.rows_inserted > 0 && reinserts_before.is_some_and(|s| r.seq < s))
}
