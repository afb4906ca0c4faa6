//! Publishing a build: the manifest and `inputs.json`, then the commit (the build-log record,
//! written last, into the table's next slot). A crash before the record leaves files nothing
//! reads; a failed build publishes only its record and deletes what it wrote (best effort).

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::SchemaRef;

use super::Built;
use super::execute::Names;
use super::parts::PartOut;
use crate::engine::session::Workspace;
use crate::error::{Error, Result};
use crate::table::audit::{BuildRecord, BuildStatus, commit_build};
use crate::table::lake::{Lake, layout};
use crate::table::parquet::parquet_bytes;
use crate::table::silver::{Manifest, state_schema};

/// What the output pass wrote: file names (in the build's folder) and counts.
#[derive(Default)]
pub(super) struct Outputs {
    pub total: PartOut,
    pub data: Vec<String>,
    pub state: Vec<String>,
    /// Rows a `filter` step removed.
    pub filtered: u64,
    /// The build's failure file (lake-relative) and whether it has rows.
    pub failures: String,
    pub wrote_failures: bool,
    /// The snapshot files have key indexes ([`crate::table::silver::keys_of`]).
    pub keyed: bool,
    /// Several sources: the conflict file's name (when it holds any) and the decisions applied.
    pub conflicts: Option<String>,
    pub decisions: Option<Vec<String>>,
}

impl Outputs {
    /// Name a state file that the pass wrote `rows` rows to (an empty one is left out).
    pub fn add_state(&mut self, rows: u64, name: String) {
        if rows > 0 {
            self.state.push(name);
        }
    }
}

/// Write the build's manifest, with the size and CRC-32 of every file the build wrote into its
/// folder (`files`), and `inputs.json` (the digest of what `resolve` read).
pub(super) async fn put_manifest(lake: &Lake, record: &BuildRecord, m: &Manifest, digest: &str) -> Result<()> {
    let m = Manifest {
        files: lake.stamps_under(&layout::silver_build_dir(&record.table, &record.build_id)),
        ..m.clone()
    };
    let bytes = serde_json::to_vec(&m).map_err(|e| Error::RunFailed(format!("build manifest: {e}")))?;
    lake.put(&layout::silver_manifest(&record.table, &record.build_id), bytes.into())
        .await?;
    let inputs_json = serde_json::json!({ "inputs_digest": digest }).to_string();
    lake.put(
        &layout::silver_inputs(&record.table, &record.build_id),
        inputs_json.into(),
    )
    .await?;
    crate::table::failpoint::hit("build.after_data")
}

/// Commit `record` (succeeded or failed) with its finish time. A succeeded build first checks
/// that every file its manifest names (its own, and those it keeps from earlier builds' folders)
/// is still there, so it never publishes a snapshot with a hole in it.
pub(super) async fn commit(ws: &Workspace, record: &mut BuildRecord) -> Result<()> {
    if record.status == BuildStatus::Succeeded {
        check_files(&ws.lake, record).await?;
    }
    record.finished_at = ws.now_micros().max(record.started_at);
    commit_build(&ws.lake, record).await?;
    crate::table::failpoint::hit("build.after_commit")
}

/// Every file the manifest of `record` names exists, or an error naming the first missing one.
async fn check_files(lake: &Lake, record: &BuildRecord) -> Result<()> {
    for rel in crate::table::silver::build_files(lake, &record.table, &record.build_id).await? {
        if !lake.exists(&rel).await? {
            return Err(Error::RunFailed(format!(
                "build {} of silver.{} was not published: {} that its manifest names is gone (removed while \
                 the build ran, e.g. by `ingot gc` after a lost lock, or by hand); run the build again",
                record.build_id,
                record.table,
                lake.url(&rel)
            )));
        }
    }
    Ok(())
}

/// Publish a build whose table is the previous build's (nothing to do): its manifest `m` names
/// the previous build's files.
pub(super) async fn publish_unchanged(
    ws: &Workspace,
    record: &mut BuildRecord,
    prev: &BuildRecord,
    m: Manifest,
    digest: &str,
) -> Result<Built> {
    put_manifest(&ws.lake, record, &m, digest).await?;
    record.rows_flagged = prev.rows_flagged;
    commit(ws, record).await?;
    let rows = m.rows.unwrap_or(0);
    Ok(Built {
        record: record.clone(),
        table_rows: rows,
        kept_rows: rows,
    })
}

/// A `fail` validation failed: the build fails, nothing but its record is published.
pub(super) async fn fail_build(ws: &Workspace, record: &mut BuildRecord, out: Outputs) -> Result<Built> {
    let total = &out.total;
    let names: Vec<String> = total.failed_rules.iter().map(|r| format!("\"{r}\"")).collect();
    record.status = BuildStatus::Failed;
    record.error = Some(format!(
        "validation {} (action: fail) failed for {} row{}; nothing was published; first failing {}",
        names.join(", "),
        total.failed,
        if total.failed == 1 { "" } else { "s" },
        total.first_failed.join("; ")
    ));
    commit(ws, record).await?;
    let mut rels: Vec<String> = out
        .data
        .iter()
        .chain(&out.state)
        .map(|n| layout::silver_file(&record.table, &record.build_id, n))
        .collect();
    if out.wrote_failures {
        rels.push(out.failures.clone());
    }
    if let Some(name) = &out.conflicts {
        rels.push(layout::silver_file(&record.table, &record.build_id, name));
    }
    if out.keyed {
        let data = out
            .data
            .iter()
            .map(|n| layout::silver_file(&record.table, &record.build_id, n));
        rels.extend(data.map(|rel| crate::table::silver::keys_of(&rel)).collect::<Vec<_>>());
    }
    for rel in rels {
        let _ = ws.lake.delete(&rel).await;
    }
    Ok(Built {
        record: record.clone(),
        table_rows: 0,
        kept_rows: 0,
    })
}

/// Publish a whole snapshot: its files (an empty part and state file when the pass wrote none),
/// the manifest, then the record.
pub(super) async fn publish_full(
    ws: &Workspace,
    record: &mut BuildRecord,
    mut out: Outputs,
    schema: &SchemaRef,
    mut names: Names,
    run_ids: Vec<String>,
    digest: &str,
) -> Result<Built> {
    let (table, build_id) = (record.table.clone(), record.build_id.clone());
    if out.data.is_empty() {
        let n = names.next("part");
        ws.lake
            .put_file(
                &layout::silver_file(&table, &build_id, &n),
                parquet_bytes(&RecordBatch::new_empty(schema.clone()))?,
            )
            .await?;
        out.data.push(n);
    }
    if out.state.is_empty() {
        let n = names.next("state");
        ws.lake
            .put_file(
                &layout::silver_file(&table, &build_id, &n),
                parquet_bytes(&RecordBatch::new_empty(state_schema()))?,
            )
            .await?;
        out.state.push(n);
    }
    let total = &out.total;
    let keyed = out.keyed;
    let rels: Vec<String> = out
        .data
        .iter()
        .map(|n| layout::silver_file(&table, &build_id, n))
        .collect();
    let m = Manifest {
        data: out.data.clone(),
        state: out.state.clone(),
        deltas: Vec::new(),
        runs: Some(run_ids),
        rows: Some(total.rows),
        published: published(&ws.lake, &table, |mode| async move {
            crate::table::delta::publish::whole(&ws.lake, mode, &rels, keyed).await
        })
        .await,
        files: Default::default(),
        conflicts: out.conflicts.clone(),
        decisions: out.decisions.clone(),
    };
    put_manifest(&ws.lake, record, &m, digest).await?;
    record.rows_written = total.written as i64;
    record.rows_rejected = total.rejected as i64;
    record.rows_filtered = out.filtered as i64;
    record.rows_read = record.rows_written + record.rows_rejected + record.rows_filtered;
    record.rows_flagged = total.flagged as i64;
    commit(ws, record).await?;
    Ok(Built {
        record: record.clone(),
        table_rows: total.rows,
        kept_rows: total.rows - total.written,
    })
}

/// The snapshot as its Delta table will publish it (`make` it in the table's mode), or `None`
/// with Delta publishing off; a failure is reported, not a failed build (the publish after the
/// commit then reads the layers instead).
pub(super) async fn published<F, Fut>(lake: &Lake, table: &str, make: F) -> Option<crate::table::silver::Published>
where
    F: FnOnce(crate::table::delta::Mode) -> Fut,
    Fut: std::future::Future<Output = Result<crate::table::silver::Published>>,
{
    let result = async {
        match crate::table::delta::builds::table_mode(lake, table).await? {
            crate::table::delta::Mode::Off => Ok(None),
            mode => make(mode).await.map(Some),
        }
    }
    .await;
    or_warn(table, result)
}

/// The snapshot's Delta files, or `None` with a warning when they could not be computed.
pub(super) fn or_warn(
    table: &str,
    result: Result<Option<crate::table::silver::Published>>,
) -> Option<crate::table::silver::Published> {
    result.unwrap_or_else(|e| {
        crate::table::delta::warn(&format!("silver/{table}: the snapshot's Delta files"), &e);
        None
    })
}
