//! Delta builds: when an incremental build can extend the previous build's layers instead of
//! writing a whole snapshot ([`delta_base`]), and how such a layer is published: new rows and
//! state rows, plus deletion files of the 16-byte keys whose rows in earlier layers are replaced
//! or gone (docs/architecture.md#silver-builds). Past [`MAX_DELTAS`] layers or a fraction of the
//! table deleted ([`delta_limit`]), the next build compacts into a whole snapshot.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use super::Built;
use super::parts::{PartOut, write_keys};
use super::publish::{commit, put_manifest};
use crate::engine::session::Workspace;
use crate::error::{Error, Result};
use crate::hash::fp::FpSet;
use crate::spec::rules::RuleSet;
use crate::table::audit::{BuildRecord, RunRecord};
use crate::table::delta::publish::Started;
use crate::table::lake::{Lake, layout};
use crate::table::silver::{Delta, Manifest, manifest, relayer};

/// At most this many delta layers; the next build rewrites the whole snapshot (compaction).
pub(super) const MAX_DELTAS: usize = 8;

/// The fraction of the snapshot's rows that delta layers may delete in all before a build
/// rewrites the whole snapshot instead: `INGOT_SILVER_DELTA_LIMIT` (default 0.1; 0 turns delta
/// builds off).
pub(super) fn delta_limit() -> Result<f64> {
    match std::env::var("INGOT_SILVER_DELTA_LIMIT") {
        Err(_) => Ok(0.1),
        Ok(v) => v.trim().parse::<f64>().ok().filter(|f| f.is_finite() && *f >= 0.0).ok_or_else(|| {
            Error::Invalid(format!(
                "INGOT_SILVER_DELTA_LIMIT=\"{v}\": expected a fraction of the table such as 0.1 (0 turns delta builds off)"
            ))
        }),
    }
}

/// The previous build's layers, extended by a delta build.
pub(super) struct DeltaBase<'a> {
    /// The previous build's manifest, every name lake-relative.
    pub manifest: Manifest,
    /// The runs committed since the previous build, newest first.
    pub new_runs: Vec<&'a RunRecord>,
    /// Rows of the previous snapshot.
    pub rows: u64,
}

/// Can this incremental build be a delta build on top of `prev`? Yes when the rules version is
/// the previous build's and that build was a full or incremental one (so every record its state
/// rejected or filtered was decided by this version, and nothing but new runs is to be
/// processed), its manifest names the runs it accounted for and they are all still committed
/// (nothing undone), every run committed since is newer than all of them (so its rows are the
/// current versions of their records), and there are fewer than [`MAX_DELTAS`] layers. When it
/// cannot, the reason (for the plan).
pub(super) async fn delta_base<'a>(
    lake: &Lake,
    table: &str,
    prev: &BuildRecord,
    rules: &RuleSet,
    runs: &[&'a RunRecord],
) -> Result<std::result::Result<DeltaBase<'a>, String>> {
    if prev.rules_version != rules.version {
        return Ok(Err(format!(
            "build {} used rules v{}",
            prev.build_id, prev.rules_version
        )));
    }
    if !(prev.mode == "full" || prev.mode == "incremental") {
        return Ok(Err(format!("build {} was a {}", prev.build_id, prev.mode)));
    }
    let m = manifest(lake, table, &prev.build_id).await?;
    let (Some(prev_runs), Some(rows)) = (&m.runs, m.rows) else {
        return Ok(Err(format!("the manifest of build {} names no runs", prev.build_id)));
    };
    if m.deltas.len() >= MAX_DELTAS {
        return Ok(Err(format!(
            "build {} has {MAX_DELTAS} delta layers (compaction)",
            prev.build_id
        )));
    }
    let before: HashSet<&str> = prev_runs.iter().map(String::as_str).collect();
    let seen: Vec<&&RunRecord> = runs.iter().filter(|r| before.contains(r.run_id.as_str())).collect();
    if seen.len() != before.len() {
        return Ok(Err(format!("a run build {} read was undone since", prev.build_id)));
    }
    // commit slots are per source (a table with several sources reads several)
    let mut newest: HashMap<&str, u64> = HashMap::new();
    for r in &seen {
        let n = newest.entry(r.source.as_str()).or_insert(r.seq);
        *n = (*n).max(r.seq);
    }
    let new_runs: Vec<&'a RunRecord> = runs
        .iter()
        .filter(|r| !before.contains(r.run_id.as_str()))
        .copied()
        .collect();
    if new_runs
        .iter()
        .any(|r| newest.get(r.source.as_str()).is_some_and(|n| r.seq <= *n))
    {
        return Ok(Err(format!(
            "a run committed since took a slot before one build {} read",
            prev.build_id
        )));
    }
    Ok(Ok(DeltaBase {
        manifest: relayer(&m, table, &prev.build_id),
        new_runs,
        rows,
    }))
}

/// What a delta build found in the previous snapshot.
#[derive(Default)]
pub(super) struct DeltaOut {
    /// The records processed (every record of the new runs).
    pub processed: Arc<FpSet>,
    /// Keys whose rows in the previous layers are gone: processed, and re-flagged.
    pub deleted: FpSet,
    pub prev_rows: u64,
    /// Rows of the previous snapshot that are processed records' (replaced or gone).
    pub old_rows: u64,
    /// Of those and of the re-flagged rows, how many were flagged.
    pub old_flagged: u64,
    /// Kept rows whose window flags change (rewritten with the new flags).
    pub changed_rows: u64,
}

/// What a delta build wrote, for [`publish_delta`].
pub(super) struct DeltaFiles {
    pub data: Vec<String>,
    pub state: Vec<String>,
    pub run_ids: Vec<String>,
    pub digest: String,
    pub total: PartOut,
    pub filtered: u64,
    /// The new files have key indexes.
    pub keyed: bool,
    /// Several sources: this build's conflict file (every conflict of the table) and the
    /// decisions it applied.
    pub conflicts: Option<String>,
    pub decisions: Option<Vec<String>>,
}

/// Publish a delta build: its deletion files, then a manifest of the previous layers plus this
/// one, then the record.
pub(super) async fn publish_delta(
    ws: &Workspace,
    record: &mut BuildRecord,
    prev: &BuildRecord,
    base: DeltaBase<'_>,
    out: DeltaOut,
    files: DeltaFiles,
    prior: Started,
) -> Result<Built> {
    let lake = &ws.lake;
    let (table, build_id) = (record.table.clone(), record.build_id.clone());
    let (deleted, deleted_state) = (
        "deleted-00000.parquet".to_string(),
        "deleted-state-00000.parquet".to_string(),
    );
    let rel = |name: &str| layout::silver_file(&table, &build_id, name);
    write_keys(lake, &rel(&deleted), out.deleted.iter().copied()).await?;
    write_keys(lake, &rel(&deleted_state), out.processed.iter().copied()).await?;
    let total = &files.total;
    let table_rows = (out.prev_rows + total.rows).saturating_sub(out.old_rows + out.changed_rows);
    let mut m = base.manifest;
    let new_data: Vec<String> = files.data.iter().map(|n| rel(n)).collect();
    // the previous files' deleted positions were started after the window pass ([`Prior::start`])
    let published = async {
        match prior.wait().await? {
            None => Ok(None),
            Some(p) => crate::table::delta::publish::layer(lake, &table, &build_id, p, &new_data, files.keyed)
                .await
                .map(Some),
        }
    }
    .await;
    let published = super::publish::or_warn(&table, published);
    m.deltas.push(Delta {
        data: files.data,
        state: files.state,
        deleted,
        deleted_state,
        deleted_keys: out.deleted.len() as u64,
    });
    m.runs = Some(files.run_ids);
    m.rows = Some(table_rows);
    m.conflicts = files.conflicts;
    m.decisions = files.decisions;
    m.published = published;
    put_manifest(lake, record, &m, &files.digest).await?;
    record.rows_written = total.written as i64;
    record.rows_rejected = total.rejected as i64;
    record.rows_filtered = files.filtered as i64;
    record.rows_read = record.rows_written + record.rows_rejected + record.rows_filtered;
    record.rows_flagged = (prev.rows_flagged + total.flagged as i64 - out.old_flagged as i64).max(0);
    commit(ws, record).await?;
    Ok(Built {
        record: record.clone(),
        table_rows,
        kept_rows: table_rows.saturating_sub(total.written),
    })
}
