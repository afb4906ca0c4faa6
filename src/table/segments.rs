//! Segments of a source: small bronze runs merged into larger Parquet files, so that a query on
//! `bronze.<source>` reads a few files however many runs the source has seen.
//!
//! A segment (`_cache/segments/<source>/files/segment=<id>.parquet`) holds, unchanged, the rows of a set
//! of committed runs of one recorded field set and file schema (each row keeps its
//! `ingestion_run_id`, and gets its run's commit slot); a manifest
//! (`_cache/segments/<source>/manifest-<n>.json`, put create-if-absent under the source lock)
//! lists the live segments and what the views need from the run log as of a slot
//! ([`ViewState`]). The run files stay where they are and stay the truth: whether a row counts is
//! decided by the run log alone (the catalog leaves out the rows of a segment's runs that were
//! undone since), undo, replay, rekey and change detection read the run files, and a segment that
//! is missing or not of its recorded size is passed over (its runs are read from their own files,
//! through the log). Written by [`crate::engine::compact`].

use bytes::Bytes;
use futures::StreamExt;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::table::audit::{RunRecord, RunStatus};
use crate::table::lake::Lake;

/// One segment: its file and the runs whose rows it holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Segment {
    pub id: String,
    /// Path relative to the lake root.
    pub file: String,
    pub bytes: u64,
    pub rows: u64,
    /// 1 for a merge of runs, one more than its inputs' for a merge of segments.
    pub level: u32,
    /// The `contract_fields` the runs recorded (the same for all of them).
    pub definition: Option<String>,
    /// A digest of the runs' Parquet schema (the same for all of them).
    pub schema: String,
    /// The runs, in commit order.
    pub runs: Vec<String>,
    /// Each row carries the commit slot of its run in a column [`SLOT`] (segments written
    /// before that have none: a source with one is read through its run log).
    #[serde(default)]
    pub slotted: bool,
    /// The CRC-32 of the file as written, 8 hex digits (`ingot doctor --verify` reads it whole);
    /// none in segments written before checksums.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub crc32: Option<String>,
}

/// The column of a segment's rows that holds the commit slot of the row's run (nullable in the
/// file schema; never null in a segment).
pub use crate::table::log::SLOT;

/// [`SLOT`] as a segment's file holds it.
pub fn slot_field() -> datafusion::arrow::datatypes::Field {
    datafusion::arrow::datatypes::Field::new(SLOT, datafusion::arrow::datatypes::DataType::Int64, true)
}

/// The live segments of a source, as of manifest `number`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    pub source: String,
    pub number: u64,
    pub segments: Vec<Segment>,
    /// What the source's views need from its run log, as of a slot ([`ViewState`]); none when a
    /// live segment has no slot column, or a segment it names is gone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<ViewState>,
}

/// What `bronze.<source>` and `bronze.<source>_current` need from the source's run log, as of the
/// record in slot `through`: written with the manifest by the compaction that read the log
/// through that slot, under the source lock. With it and the segments' slot column, a reader
/// builds both views from the manifest and the few records after `through` ([`ViewState::advance`]),
/// never the log's checkpoint. It is a cache like the manifest: a reader that cannot use it
/// (the record in slot `through` is not the one it was taken after, a segment is gone, too many
/// records follow it) reads the log instead, and `ingot doctor` compares it with the log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ViewState {
    /// The last slot of the source's run log the state accounts for.
    pub through: u64,
    /// SHA-256 of the record file in slot `through`.
    pub through_sha256: String,
    /// The slot and run of the latest loaded `ingot rekey` run, if any: rows of runs committed
    /// before it are not current.
    pub rekey: Option<(u64, String)>,
    /// Runs the segments hold that are not loaded (undone since, or without a record): their
    /// rows are left out of both views.
    pub undone: Vec<String>,
    /// The loaded runs with rows that no segment holds, in slot order: read from their own files.
    pub own: Vec<OwnRun>,
    /// The natural-key definition and version the current runs recorded.
    pub key: RunKeys,
}

/// A loaded run no segment holds: its id, slot and recorded `contract_fields`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OwnRun {
    pub run: String,
    pub slot: u64,
    pub definition: Option<String>,
}

/// The `(natural_key_definition, natural_key_version)` a set of runs recorded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum RunKeys {
    /// No run.
    None,
    /// Every run recorded this one.
    Same(Option<String>, Option<i32>),
    /// The runs differ.
    Mixed,
}

impl RunKeys {
    /// These keys and one more run's.
    pub fn with(self, definition: Option<&str>, version: Option<i32>) -> RunKeys {
        match self {
            RunKeys::None => RunKeys::Same(definition.map(str::to_string), version),
            RunKeys::Same(d, v) if d.as_deref() == definition && v == version => RunKeys::Same(d, v),
            _ => RunKeys::Mixed,
        }
    }
}

/// What a source's two views read: [`ViewState`] brought up to date with the records after it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ViewInputs {
    /// Rows of runs committed before this slot are not current (1: every run's are).
    pub first_slot: u64,
    /// Runs whose rows the segments hold and neither view shows.
    pub undone: Vec<String>,
    /// The loaded runs with rows no segment holds.
    pub own: Vec<OwnRun>,
    /// What the current runs recorded of their natural key.
    pub key: RunKeys,
}

impl ViewState {
    /// The state of the source's log `through` its last slot (`runs`: its records, one per id, in
    /// slot order; `covered`: the runs the manifest's segments hold; `through_sha256`: of the
    /// record file in the last slot).
    pub fn of(runs: &[&RunRecord], covered: &hashbrown::HashSet<&str>, through_sha256: String) -> ViewState {
        let through = runs.iter().map(|r| r.seq).max().unwrap_or(0);
        let rekey = runs
            .iter()
            .rfind(|r| r.status.is_loaded() && r.is_rekey())
            .map(|r| (r.seq, r.run_id.to_string()));
        let first = rekey.as_ref().map_or(0, |(s, _)| *s);
        // every run a segment holds that is not loaded now: undone, or with no record at all (a
        // log restored from an older copy)
        let loaded: hashbrown::HashSet<&str> = runs
            .iter()
            .filter(|r| r.status.is_loaded())
            .map(|r| r.run_id.as_str())
            .collect();
        let mut undone: Vec<String> = covered
            .iter()
            .filter(|r| !loaded.contains(*r))
            .map(|r| r.to_string())
            .collect();
        undone.sort();
        let own = runs
            .iter()
            .filter(|r| r.has_data() && !covered.contains(r.run_id.as_str()))
            .map(|r| OwnRun {
                run: r.run_id.to_string(),
                slot: r.seq,
                definition: r.contract_fields.as_deref().map(str::to_string),
            })
            .collect();
        let key = runs
            .iter()
            .filter(|r| r.has_data() && r.seq >= first)
            .fold(RunKeys::None, |k, r| {
                k.with(r.natural_key_definition.as_deref(), r.natural_key_version)
            });
        ViewState {
            through,
            through_sha256,
            rekey,
            undone,
            own,
            key,
        }
    }

    /// The views' inputs after `later` (the source's records in the slots after `through`, one per
    /// id, in slot order). `None` when they do what the state cannot follow: undo the rekey run it
    /// names (the runs before it would count again), or re-commit a loaded run it knows.
    pub fn advance(&self, later: &[RunRecord]) -> Option<ViewInputs> {
        let mut rekey = self.rekey.clone();
        let mut undone = self.undone.clone();
        let mut own = self.own.clone();
        let mut key = self.key.clone();
        for r in later {
            let id = r.run_id.as_str();
            if r.status.is_loaded() {
                if own.iter().any(|o| o.run == id) {
                    return None;
                }
                if r.is_rekey() {
                    rekey = Some((r.seq, id.to_string()));
                    key = RunKeys::None;
                }
                if r.has_data() {
                    own.push(OwnRun {
                        run: id.to_string(),
                        slot: r.seq,
                        definition: r.contract_fields.as_deref().map(str::to_string),
                    });
                    key = key.with(r.natural_key_definition.as_deref(), r.natural_key_version);
                }
                continue;
            }
            if rekey.as_ref().is_some_and(|(_, run)| run == id) {
                return None;
            }
            // a run no longer loaded leaves the views: its own file, or its rows in a segment.
            // Only an undo takes out a run a segment can hold (a failed, skipped, held or
            // discarded run was never loaded). The keys stay what they were: one run fewer can
            // make mixed keys the same, never the same keys mixed.
            match own.iter().position(|o| o.run == id) {
                Some(i) => {
                    own.remove(i);
                }
                None if r.status == RunStatus::RolledBack => undone.push(id.to_string()),
                None => {}
            }
        }
        undone.sort();
        undone.dedup();
        Some(ViewInputs {
            first_slot: rekey.map_or(1, |(s, _)| s),
            undone,
            own,
            key,
        })
    }
}

impl Manifest {
    /// Every run a segment holds.
    pub fn covered(&self) -> hashbrown::HashSet<&str> {
        self.segments
            .iter()
            .flat_map(|s| s.runs.iter().map(String::as_str))
            .collect()
    }
}

pub fn folder(source: &str) -> String {
    format!("_cache/segments/{source}")
}

pub fn manifest_path(source: &str, number: u64) -> String {
    format!("{}/manifest-{number:010}.json", folder(source))
}

/// Segment files live apart from the manifests, so that finding the newest manifest lists only
/// the few manifests (compaction keeps two), never the segments gc has not yet removed.
pub fn segment_path(source: &str, id: &str) -> String {
    format!("{}/files/segment={id}.parquet", folder(source))
}

/// The number of a manifest file name (`manifest-<n>.json`).
pub fn manifest_number(name: &str) -> Option<u64> {
    name.strip_prefix("manifest-")?.strip_suffix(".json")?.parse().ok()
}

/// The latest manifest of `source` that parses, with the segments that are not present at their
/// recorded size left out (one listing of the manifests, one read, a HEAD of each live segment,
/// concurrently). An empty manifest when there is none.
pub async fn read(lake: &Lake, source: &str) -> Result<Manifest> {
    let mut m = read_named(lake, source).await?;
    let mut pending = futures::stream::FuturesOrdered::new();
    for s in &m.segments {
        let (lake, file) = (lake.clone(), s.file.clone());
        pending.push_back(async move { lake.size_of(&file).await });
    }
    let mut sizes = Vec::with_capacity(m.segments.len());
    while let Some(size) = pending.next().await {
        sizes.push(size?);
    }
    let mut sizes = sizes.into_iter();
    let named = m.segments.len();
    m.segments.retain(|s| sizes.next().flatten() == Some(s.bytes));
    // the state counts the runs of every segment it names as held
    if m.segments.len() < named || m.segments.iter().any(|s| !s.slotted) {
        m.state = None;
    }
    Ok(m)
}

/// The latest manifest of `source` that parses, every segment it names kept (`ingot doctor`
/// checks them against their files); an empty manifest when there is none.
pub async fn read_named(lake: &Lake, source: &str) -> Result<Manifest> {
    let mut manifests: Vec<(u64, String)> = lake
        .list_here(&folder(source))
        .await?
        .iter()
        .filter_map(|m| Some((manifest_number(m.location.filename()?)?, lake.relative(&m.location)?)))
        .collect();
    manifests.sort();
    for (number, rel) in manifests.into_iter().rev() {
        // a manifest removed since the listing (a newer compaction pruned it) is passed over
        let Some(bytes) = lake.get(&rel).await? else {
            continue;
        };
        let Ok(m) = serde_json::from_slice::<Manifest>(&bytes) else {
            continue;
        };
        if m.source != source || m.number != number {
            continue;
        }
        return Ok(m);
    }
    Ok(Manifest {
        source: source.to_string(),
        number: 0,
        segments: Vec::new(),
        state: None,
    })
}

/// Remove the manifests of `source` older than `keep_from` (a compaction keeps the one it wrote
/// and the one before: a reader that listed an older one reads the next older or none, and then
/// the runs' own files).
pub async fn prune_manifests(lake: &Lake, source: &str, keep_from: u64) -> Result<()> {
    for m in lake.list_here(&folder(source)).await? {
        if let (Some(n), Some(rel)) = (
            m.location.filename().and_then(manifest_number),
            lake.relative(&m.location),
        ) && n < keep_from
        {
            lake.delete(&rel).await?;
        }
    }
    Ok(())
}

/// Put `manifest` as the source's manifest `manifest.number` (create-if-absent): `false` when
/// another command put that number first.
pub async fn write(lake: &Lake, manifest: &Manifest) -> Result<bool> {
    // compact: a manifest lists every run its segments hold, and every reader of the source parses it
    let bytes = serde_json::to_vec(manifest)
        .map_err(|e| Error::Internal(format!("segment manifest of {}: {e}", manifest.source)))?;
    lake.put_create(&manifest_path(&manifest.source, manifest.number), Bytes::from(bytes))
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Run `id` committed in `slot` with `status`, `rows` rows written; a rekey run with `rekey`.
    fn run(id: &str, slot: u64, status: RunStatus, rows: i64, rekey: bool) -> RunRecord {
        RunRecord {
            run_id: id.into(),
            source: "t".into(),
            contract_version: 1,
            file_path: format!("{id}.csv").into(),
            file_hash: None,
            file_bytes: 0,
            started_at: 0,
            finished_at: 0,
            status,
            rows_seen: rows,
            rows_inserted: rows,
            rows_updated: 0,
            rows_unchanged: 0,
            rows_failed: 0,
            replay_of: None,
            error: None,
            ingot_version: "test".into(),
            ignored_columns: None,
            rolled_back_at: None,
            rows_deleted: 0,
            natural_key_version: Some(if rekey { 2 } else { 1 }),
            previous_natural_key_version: rekey.then_some(1),
            natural_key_definition: Some(if rekey { "k2" } else { "k1" }.into()),
            rows_superseded: 0,
            contract_fields: Some("id int64".into()),
            failure_class: None,
            held_reason: None,
            decided_at: None,
            data_file: None,
            failure_file: None,
            pull: None,
            seq: slot,
        }
    }

    const OK: RunStatus = RunStatus::Succeeded;

    fn state(runs: &[RunRecord], covered: &[&str]) -> ViewState {
        let runs: Vec<&RunRecord> = runs.iter().collect();
        ViewState::of(&runs, &covered.iter().copied().collect(), "sha".into())
    }

    #[test]
    fn the_state_of_a_log_names_held_runs_not_loaded_own_runs_and_the_latest_rekey() {
        let runs = [
            run("a", 1, OK, 1, false),
            run("c", 4, OK, 0, false),
            run("r", 5, OK, 2, true),
            run("d", 6, RunStatus::Failed, 0, false),
            run("e", 7, OK, 1, false),
            // b committed in slot 2, undone in slot 8
            run("b", 8, RunStatus::RolledBack, 1, false),
        ];
        // the segment holds a, b and a run the log no longer has
        let s = state(&runs, &["a", "b", "gone"]);
        assert_eq!(s.through, 8);
        assert_eq!(s.rekey, Some((5, "r".to_string())));
        assert_eq!(s.undone, vec!["b".to_string(), "gone".to_string()]);
        let own: Vec<(&str, u64)> = s.own.iter().map(|o| (o.run.as_str(), o.slot)).collect();
        assert_eq!(own, vec![("r", 5), ("e", 7)]);
        // the current runs with rows: r (k2, 2) and e (k1, 1)
        assert_eq!(s.key, RunKeys::Mixed);
    }

    #[test]
    fn later_records_add_runs_take_undone_ones_out_and_move_the_first_slot_at_a_rekey() {
        let s = state(&[run("a", 1, OK, 1, false), run("b", 2, OK, 1, false)], &["a"]);
        assert_eq!(s.key, RunKeys::Same(Some("k1".into()), Some(1)));
        let later = [
            run("c", 3, OK, 1, false),
            run("f", 4, RunStatus::Failed, 0, false),
            run("b", 5, RunStatus::RolledBack, 1, false),
            run("a", 6, RunStatus::RolledBack, 1, false),
        ];
        let got = s.advance(&later).unwrap();
        assert_eq!(got.first_slot, 1);
        // the failed run is in neither list; b leaves the own runs, a goes to the undone
        assert_eq!(got.undone, vec!["a".to_string()]);
        assert_eq!(got.own.iter().map(|o| o.run.as_str()).collect::<Vec<_>>(), vec!["c"]);
        assert_eq!(got.key, RunKeys::Same(Some("k1".into()), Some(1)));

        // a run after the rekey, under its key
        let mut e = run("e", 4, OK, 1, true);
        e.previous_natural_key_version = None;
        let rekeyed = s.advance(&[run("r", 3, OK, 2, true), e]).unwrap();
        assert_eq!(rekeyed.first_slot, 3);
        assert_eq!(rekeyed.key, RunKeys::Same(Some("k2".into()), Some(2)));
    }

    #[test]
    fn later_records_the_state_cannot_follow_give_none() {
        let s = state(
            &[
                run("a", 1, OK, 1, false),
                run("r", 2, OK, 1, true),
                run("b", 3, OK, 1, false),
            ],
            &["a"],
        );
        // the rekey run undone: the runs before it would count again
        assert_eq!(s.advance(&[run("r", 4, RunStatus::RolledBack, 1, true)]), None);
        // a loaded run committed again: its slot would move
        assert_eq!(s.advance(&[run("b", 4, OK, 1, false)]), None);
        assert!(s.advance(&[]).is_some());
    }
}
