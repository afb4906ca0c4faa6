//! The silver snapshot format: a build's manifest (`manifest.json`) naming its snapshot and state
//! files, the delta layers later incremental builds add on top, the deletion files (16-byte keys)
//! of those layers, and the readers that turn them into one table (`silver.<table>`) or state.
//!
//! Hazard: a delta layer's rows are live only minus the keys every later layer deleted; a reader
//! that globs a build's folder sees too much. gc keeps exactly [`build_files`].

use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::catalog::TableProvider;
use datafusion::common::Column;
use datafusion::dataframe::DataFrame;
use datafusion::logical_expr::Expr;
use datafusion::prelude::SessionContext;
use futures::StreamExt;

use crate::error::{Error, Result};
use crate::hash::fp::{FpSet, for_each_fp, in_set_udf};
use crate::spec::columns::RULES_VERSION;
use crate::table::lake::{Lake, layout};
use crate::table::parquet::{file_schema, table_over};

pub use crate::spec::columns::FINGERPRINT as FP;

pub const RUN_ID: &str = "ingestion_run_id";

pub const OUTCOME: &str = "outcome";

pub fn c(name: &str) -> Expr {
    Expr::Column(Column::new_unqualified(name))
}

/// Schema of the state file: the 16-byte key of every record the table's current state accounts
/// for, the run of the version that was decided, the outcome (`passed`, `rejected`, `filtered`)
/// and the rules version that decided it.
pub fn state_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new(FP, DataType::FixedSizeBinary(16), false),
        Field::new(RUN_ID, dict_type(), false),
        Field::new(OUTCOME, dict_type(), false),
        Field::new(RULES_VERSION, DataType::Int32, false),
    ]))
}

/// Run ids and outcomes repeat: dictionary-encoded in memory and in the file.
pub fn dict_type() -> DataType {
    DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8))
}

/// The files of a build's snapshot (`data`) and state (`state`), names relative to its folder
/// (a name with `/` is relative to the lake root: a file of an earlier build).
///
/// A delta build (an incremental build that rewrote only what changed) adds a [`Delta`] layer on
/// top of its previous build's layers: the snapshot is the base files' rows and every delta's
/// rows, each minus the keys deleted by any later delta (see [`layers`]).
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct Manifest {
    pub data: Vec<String>,
    pub state: Vec<String>,
    /// Layers written by later incremental builds on top of `data` / `state`, oldest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deltas: Vec<Delta>,
    /// The committed runs of the source (with data) whose rows the build accounted for; `None`
    /// in manifests written before delta builds (the next build then reads every run).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runs: Option<Vec<String>>,
    /// Rows of the snapshot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rows: Option<u64>,
    /// The snapshot as the table's Delta log publishes it ([`crate::table::delta::publish`]);
    /// `None` when the build was made with Delta publishing off or before it existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub published: Option<Published>,
    /// The files this build wrote into its folder, by name, with the size and CRC-32 of each as
    /// written (`ingot doctor` checks them, `--verify` reads them whole); none in manifests
    /// written before checksums. Files a build keeps from earlier builds are stamped in the
    /// manifest of the build that wrote them.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub files: std::collections::BTreeMap<String, crate::table::upload::FileStamp>,
    /// A table with several sources: the build's conflict file, when it holds any conflict.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conflicts: Option<String>,
    /// A table with several sources: the ids of the conflict decisions in force when it was
    /// built (a decision recorded or withdrawn since makes the next build process its record).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decisions: Option<Vec<String>>,
}

/// The files of a snapshot as Delta readers see it: the base and layer files, each with a
/// deletion vector of the rows later layers deleted (mode `deletion-vectors`), or copies of them
/// without those rows (mode `copy-on-write`). Paths are lake-relative.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Published {
    pub mode: String,
    pub files: Vec<PublishedFile>,
}

#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PublishedFile {
    pub path: String,
    /// Rows in the file (deleted ones included).
    pub rows: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dv: Option<PublishedDv>,
    /// The file's key index ([`keys_of`]), lake-relative: a cache of its fingerprints, so a
    /// missing or damaged one costs time, never a wrong result.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keys: Option<String>,
}

/// The key index of a silver file (`part-00000.parquet` → `part-00000.keys.parquet`): the
/// 16-byte key of each of its rows' fingerprints, in the file's row order ([`index_schema`]).
pub fn keys_of(rel: &str) -> String {
    format!("{}.keys.parquet", rel.strip_suffix(".parquet").unwrap_or(rel))
}

/// Schema of a key index: one 16-byte key per row of its file (null where the row has no
/// fingerprint).
pub fn index_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![Field::new(FP, DataType::FixedSizeBinary(16), true)]))
}

/// A deletion vector in a file the build wrote (`deletion_vector_<uuid>.bin` in its folder).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PublishedDv {
    /// Lake-relative path of the deletion-vector file.
    pub file: String,
    /// The UUID in its name.
    pub uuid: String,
    pub offset: i32,
    pub size: i32,
    pub cardinality: i64,
}

/// One delta layer: new snapshot and state files, and the 16-byte keys ([`key_schema`]) whose
/// rows in earlier layers are replaced or gone: `deleted` for snapshot rows (records processed
/// again, removed, or whose window flags changed), `deleted_state` for state rows (records
/// processed again or removed).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Delta {
    pub data: Vec<String>,
    pub state: Vec<String>,
    pub deleted: String,
    pub deleted_state: String,
    /// Number of keys in `deleted` (compaction is decided on it without reading the files).
    pub deleted_keys: u64,
}

/// Schema of a deletion file: one 16-byte key per row.
pub fn key_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![Field::new(FP, DataType::FixedSizeBinary(16), false)]))
}

/// The manifest of build `build_id` of `table` (builds before manifests wrote one file of each).
pub async fn manifest(lake: &Lake, table: &str, build_id: &str) -> Result<Manifest> {
    let rel = layout::silver_manifest(table, build_id);
    match lake.get(&rel).await? {
        Some(bytes) => serde_json::from_slice(&bytes)
            .map_err(|e| Error::RunFailed(format!("{}: not a snapshot manifest: {e}", lake.url(&rel)))),
        None => Ok(Manifest {
            data: vec!["part-00000.parquet".into()],
            state: vec!["state.parquet".into()],
            ..Manifest::default()
        }),
    }
}

/// `m` (build `build_id`'s manifest) with every name as a lake-relative path, for a later
/// build's manifest that names the same files.
pub fn relayer(m: &Manifest, table: &str, build_id: &str) -> Manifest {
    let full = |names: &[String]| -> Vec<String> { names.iter().map(|n| manifest_rel(table, build_id, n)).collect() };
    Manifest {
        data: full(&m.data),
        state: full(&m.state),
        deltas: m
            .deltas
            .iter()
            .map(|d| Delta {
                data: full(&d.data),
                state: full(&d.state),
                deleted: manifest_rel(table, build_id, &d.deleted),
                deleted_state: manifest_rel(table, build_id, &d.deleted_state),
                deleted_keys: d.deleted_keys,
            })
            .collect(),
        runs: m.runs.clone(),
        rows: m.rows,
        published: m.published.clone(),
        // stamps stay with the build that wrote the files
        files: Default::default(),
        conflicts: m.conflicts.as_ref().map(|n| manifest_rel(table, build_id, n)),
        decisions: m.decisions.clone(),
    }
}

/// Every lake file build `build_id` of `table` reads when it is the current build or the base
/// of the next incremental build: its manifest and inputs digest, and the snapshot, state and
/// deletion files its manifest names (possibly in earlier builds' folders). `gc` keeps these.
pub async fn build_files(lake: &Lake, table: &str, build_id: &str) -> Result<Vec<String>> {
    let m = relayer(&manifest(lake, table, build_id).await?, table, build_id);
    let mut out = vec![
        layout::silver_manifest(table, build_id),
        layout::silver_inputs(table, build_id),
    ];
    out.extend(m.data.into_iter().chain(m.state).chain(m.conflicts));
    for f in m.published.iter().flat_map(|p| &p.files) {
        out.push(f.path.clone());
        out.extend(f.dv.as_ref().map(|d| d.file.clone()));
    }
    for d in m.deltas {
        out.extend(d.data.into_iter().chain(d.state));
        if d.deleted_keys > 0 {
            out.push(d.deleted);
            out.push(d.deleted_state);
        }
    }
    Ok(out)
}

/// A writer of the key index `rel` ([`keys_of`]): uncompressed (random keys do not compress),
/// row groups of at most 8 MiB.
pub fn index_writer(lake: &Lake, rel: String) -> crate::table::bronze::RunFileWriter {
    crate::table::bronze::RunFileWriter::new(lake, rel, index_schema())
        .uncompressed()
        .with_row_group_bytes(8 << 20)
}

/// The key indexes of build `build_id`'s published files: not needed to read the build (so not
/// in [`build_files`]), but kept by gc with it for the next delta build.
pub async fn index_files(lake: &Lake, table: &str, build_id: &str) -> Result<Vec<String>> {
    let m = manifest(lake, table, build_id).await?;
    Ok(m.published
        .iter()
        .flat_map(|p| &p.files)
        .filter_map(|f| f.keys.clone())
        .collect())
}

/// Which files of the layers [`layers`] reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    Data,
    State,
}

/// The keys of a deletion file.
async fn read_keys(ctx: &SessionContext, lake: &Lake, rel: &str) -> Result<FpSet> {
    let mut set = FpSet::default();
    let mut stream = ctx
        .read_table(table_over(vec![lake.url(rel)], key_schema())?)?
        .execute_stream()
        .await?;
    while let Some(b) = stream.next().await {
        for_each_fp(b?.column(0), |_, fp| {
            if let Some(fp) = fp {
                set.insert(fp);
            }
        })?;
    }
    Ok(set)
}

/// The snapshot (`Side::Data`) or state of build `build_id`: one listing table per layer, each
/// without the keys later layers deleted, as one plan. `None` when no layer has a file.
pub async fn layers(
    ctx: &SessionContext,
    lake: &Lake,
    table: &str,
    build_id: &str,
    side: Side,
) -> Result<Option<DataFrame>> {
    let m = relayer(&manifest(lake, table, build_id).await?, table, build_id);
    let mut files: Vec<Vec<String>> = vec![match side {
        Side::Data => m.data.clone(),
        Side::State => m.state.clone(),
    }];
    let mut deleted: Vec<Arc<FpSet>> = Vec::new();
    for d in &m.deltas {
        files.push(match side {
            Side::Data => d.data.clone(),
            Side::State => d.state.clone(),
        });
        let rel = match side {
            Side::Data => &d.deleted,
            Side::State => &d.deleted_state,
        };
        // no keys deleted: `write_keys` wrote no file (the state set is a subset of the data set)
        deleted.push(Arc::new(if d.deleted_keys == 0 {
            FpSet::default()
        } else {
            read_keys(ctx, lake, rel).await?
        }));
    }
    let mut out: Option<DataFrame> = None;
    let mut columns: Option<Vec<Expr>> = None;
    for (i, rels) in files.iter().enumerate() {
        let Some(first) = rels.first() else {
            continue;
        };
        let schema = file_schema(ctx, lake, first).await?;
        let mut df = ctx.read_table(table_over(rels.iter().map(|r| lake.url(r)).collect(), schema)?)?;
        // the keys every later layer deleted
        let later: Vec<&Arc<FpSet>> = deleted[i..].iter().filter(|s| !s.is_empty()).collect();
        if !later.is_empty() {
            let gone: Arc<FpSet> = if later.len() == 1 {
                later[0].clone()
            } else {
                Arc::new(later.iter().flat_map(|s| s.iter().copied()).collect())
            };
            df = df.filter(Expr::Not(Box::new(Arc::new(in_set_udf(gone)).call(vec![c(FP)]))))?;
        }
        let cols = columns
            .get_or_insert_with(|| df.schema().fields().iter().map(|f| c(f.name())).collect())
            .clone();
        let df = df.select(cols)?;
        out = Some(match out {
            None => df,
            Some(o) => o.union(df)?,
        });
    }
    Ok(out)
}

/// The lake path of a file a manifest of build `build_id` names: a bare name is in the build's
/// folder, a path (with `/`) is relative to the lake root (a file of an earlier build).
pub fn manifest_rel(table: &str, build_id: &str, name: &str) -> String {
    if name.contains('/') {
        name.to_string()
    } else {
        layout::silver_file(table, build_id, name)
    }
}

/// A listing table over the files `names` of build `build_id` (schema of the first).
pub async fn table_over_build_files(
    ctx: &SessionContext,
    lake: &Lake,
    table: &str,
    build_id: &str,
    names: &[String],
) -> Result<Arc<dyn TableProvider>> {
    let rels: Vec<String> = names.iter().map(|n| manifest_rel(table, build_id, n)).collect();
    let first = rels
        .first()
        .ok_or_else(|| Error::RunFailed(format!("build {build_id} of \"{table}\" names no files")))?;
    let schema = file_schema(ctx, lake, first).await?;
    table_over(rels.iter().map(|r| lake.url(r)).collect(), schema)
}

/// `silver.<table>` as build `build_id` published it: a listing table over its snapshot's files,
/// or, after delta builds, the plan of [`layers`] over them.
pub async fn snapshot_table(
    ctx: &SessionContext,
    lake: &Lake,
    table: &str,
    build_id: &str,
) -> Result<Arc<dyn TableProvider>> {
    let m = manifest(lake, table, build_id).await?;
    if m.deltas.is_empty() {
        return table_over_build_files(ctx, lake, table, build_id, &m.data).await;
    }
    match layers(ctx, lake, table, build_id, Side::Data).await? {
        Some(df) => Ok(df.into_view()),
        None => Err(Error::RunFailed(format!(
            "build {build_id} of \"{table}\" names no files"
        ))),
    }
}
