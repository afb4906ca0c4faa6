//! The Delta tables a build's commit changes: `silver/<table>` (the current build's published
//! snapshot, [`super::publish`]), `audit/silver_build_log` (every table's latest record per
//! build, partitioned by `commit_seq`) and the builds' part of `audit/row_failure_log`.
//!
//! `silver/<table>` has few files, so every build (and undo of one) compares it whole with the
//! current build's snapshot and commits the difference: a delta layer adds its parts and
//! re-adds the files whose deletion vectors grew, a whole snapshot replaces the file set, an
//! undo restores the previous one. The logs take one commit per record, like the run tables.

use std::collections::{BTreeSet, HashMap};

use deltalake_core::kernel::Add;
use deltalake_core::protocol::{DeltaOperation, SaveMode};
use serde_json::Value;

use super::log::{self, Change, Outcome, Shape, Table};
use super::runs::{Want, add_of, head, listing, operation};
use super::schema::schema_string;
use super::{COMMIT_SEQ, Finding, Mode, build_app, roots};
use crate::error::{Error, Result};
use crate::table::audit::{BuildRecord, BuildStatus, build_log_schema, failure_log_schema, read_table_builds};
use crate::table::lake::{Lake, layout};
use crate::table::silver::{Manifest, manifest, relayer};

/// The three tables a build's commit changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    Silver,
    BuildLog,
    Failures,
}

pub const KINDS: [Kind; 3] = [Kind::Silver, Kind::BuildLog, Kind::Failures];

impl Kind {
    pub fn root(&self, table: &str) -> String {
        match self {
            Kind::Silver => roots::silver(table),
            Kind::BuildLog => roots::BUILD_LOG.to_string(),
            Kind::Failures => roots::FAILURE_LOG.to_string(),
        }
    }
}

fn record_file(table: &str, seq: u64) -> String {
    format!("{table}/{seq:010}.parquet")
}

fn failure_file(build_id: &str) -> String {
    format!("build_id={build_id}/part-00000.parquet")
}

/// What a log table holds of a build whose latest record is `b`.
fn wants(kind: Kind, b: &BuildRecord) -> Option<Want> {
    match kind {
        Kind::Silver => None,
        Kind::BuildLog => Some(Want {
            path: record_file(&b.table, b.seq),
            rows: Some(1),
            commit_seq: Some(b.seq),
        }),
        Kind::Failures => (b.status == BuildStatus::Succeeded && b.rows_rejected > 0).then(|| Want {
            path: failure_file(&b.build_id),
            rows: Some(b.rows_rejected),
            commit_seq: None,
        }),
    }
}

/// The build whose snapshot `silver.<table>` is: the highest-numbered succeeded one.
fn current(builds: &[BuildRecord]) -> Option<&BuildRecord> {
    builds
        .iter()
        .filter(|b| b.status == BuildStatus::Succeeded)
        .max_by_key(|b| b.seq)
}

/// The mode a build of `table` publishes in: its Delta table's (deletion vectors if its
/// protocol has them), or `INGOT_DELTA`'s for a table not yet published.
pub async fn table_mode(lake: &Lake, table: &str) -> Result<Mode> {
    let env = Mode::from_env()?;
    if env == Mode::Off {
        return Ok(Mode::Off);
    }
    let root = roots::silver(table);
    let t = Table::new(lake, &root);
    let has_dv = match log::fold(t).await? {
        Some(f) if f.version < 0 => return Ok(env),
        Some(f) => f.has_deletion_vectors(),
        None => match log::load(t).await? {
            None => return Ok(env),
            Some(l) => l
                .protocol
                .get("readerFeatures")
                .and_then(Value::as_array)
                .is_some_and(|f| f.iter().any(|x| x == "deletionVectors")),
        },
    };
    Ok(if has_dv {
        Mode::DeletionVectors
    } else {
        Mode::CopyOnWrite
    })
}

/// After `record` was committed (superseding `previous`, the latest record of its build before
/// it): a commit in each of the build's Delta tables (best effort, see [`super::warn`]).
pub async fn after_commit(lake: &Lake, record: &BuildRecord, previous: Option<&BuildRecord>) {
    if !super::enabled() {
        return;
    }
    let done = futures::future::join_all(KINDS.map(|kind| async move {
        match kind {
            Kind::Silver => sync_table(lake, kind, &record.table, false).await.map(|_| ()),
            _ => publish(lake, kind, record, previous).await,
        }
    }))
    .await;
    for (kind, result) in KINDS.into_iter().zip(done) {
        if let Err(e) = result {
            super::warn(
                &format!(
                    "{} after build {} of {}",
                    kind.root(&record.table),
                    record.build_id,
                    record.table
                ),
                &e,
            );
        }
    }
}

fn log_shape(kind: Kind) -> Result<Shape> {
    let (schema, partition_columns) = match kind {
        Kind::BuildLog => (
            schema_string(&build_log_schema(), &[(COMMIT_SEQ, "long")])?,
            vec![COMMIT_SEQ.to_string()],
        ),
        _ => (schema_string(&failure_log_schema(), &[])?, vec![]),
    };
    Ok(Shape {
        schema,
        partition_columns,
        deletion_vectors: false,
        conformed: None,
    })
}

async fn publish(lake: &Lake, kind: Kind, record: &BuildRecord, previous: Option<&BuildRecord>) -> Result<()> {
    let root = kind.root(&record.table);
    let now = wants(kind, record);
    let before = previous.and_then(|p| wants(kind, p));
    let mut adds = Vec::new();
    let mut removes = Vec::new();
    let same = matches!((&now, &before), (Some(a), Some(b)) if a.path == b.path);
    if !same {
        if let Some(w) = &now {
            adds.push(add_of(w, &head(lake, &root, &w.path).await?));
        }
        if let Some(w) = &before {
            removes.push(deltalake_core::kernel::Remove {
                path: w.path.clone(),
                data_change: true,
                deletion_timestamp: Some(chrono::Utc::now().timestamp_millis()),
                extended_file_metadata: Some(false),
                partition_values: Some(
                    w.commit_seq
                        .map(|s| HashMap::from([(COMMIT_SEQ.to_string(), Some(s.to_string()))]))
                        .unwrap_or_default(),
                ),
                ..Default::default()
            });
        }
    }
    let change = Change {
        app: build_app(&record.table),
        slot: record.seq as i64,
        operation: operation(&adds, &removes),
        adds,
        removes,
        info: info(&record.table, record.seq, Some(record)),
    };
    if log::append(Table::new(lake, &root), &log_shape(kind)?, change).await? == Outcome::Lagging {
        sync_table(lake, kind, &record.table, false).await?;
    }
    Ok(())
}

fn info(table: &str, slot: u64, record: Option<&BuildRecord>) -> HashMap<String, Value> {
    let mut v = serde_json::json!({"log": "silver_build_log", "table": table, "slot": slot});
    if let Some(r) = record {
        v["build_id"] = Value::from(r.build_id.as_str());
        v["status"] = Value::from(r.status.as_str());
    }
    HashMap::from([("ingot".to_string(), v)])
}

/// The adds of silver's current snapshot: its manifest's published files; for a build made
/// without them, its files (layers with inline deletion vectors).
async fn silver_adds(lake: &Lake, table: &str, build: &BuildRecord) -> Result<(Vec<Add>, Mode)> {
    let m: Manifest = relayer(&manifest(lake, table, &build.build_id).await?, table, &build.build_id);
    let published = match m.published.clone() {
        Some(p) => p,
        None if m.deltas.is_empty() => {
            super::publish::whole(lake, table_mode(lake, table).await?, &m.data, false).await?
        }
        None => {
            return super::publish::inline(lake, table, &m)
                .await
                .map(|a| (a, Mode::DeletionVectors));
        }
    };
    let mode = Mode::parse(&published.mode).unwrap_or(Mode::DeletionVectors);
    let mut adds = Vec::with_capacity(published.files.len());
    for f in &published.files {
        adds.push(super::publish::add_of(lake, table, f).await?);
    }
    Ok((adds, mode))
}

/// Make `kind`'s table hold exactly what the table's build log says, in one commit with `txn` at
/// the log's last slot (none when it does). Returns the version committed, if any.
pub async fn sync_table(lake: &Lake, kind: Kind, table: &str, thorough: bool) -> Result<Option<i64>> {
    let builds = read_table_builds(lake, table).await?;
    let Some(last) = builds.iter().map(|b| b.seq).max() else {
        return Ok(None);
    };
    let root = kind.root(table);
    if !thorough
        && kind != Kind::Silver
        && log::has_slot(Table::new(lake, &root), &build_app(table), last as i64, None).await?
    {
        return Ok(None);
    }
    let (adds, shape) = match kind {
        Kind::Silver => {
            let Some(b) = current(&builds) else {
                // no succeeded build: an empty table would need a schema; nothing to publish yet
                return Ok(None);
            };
            let (adds, mode) = silver_adds(lake, table, b).await?;
            let first = adds.first().map(|a| format!("{root}/{}", a.path));
            let schema = match first {
                Some(rel) => crate::table::parquet::footer_schema(lake, &rel).await?,
                None => return Ok(None),
            };
            let shape = Shape {
                schema: schema_string(&schema, &[])?,
                partition_columns: vec![],
                deletion_vectors: mode == Mode::DeletionVectors,
                conformed: None,
            };
            (adds, shape)
        }
        _ => {
            let files = listing(lake, &root).await?;
            let mut adds = Vec::new();
            for w in builds.iter().filter_map(|b| wants(kind, b)) {
                let meta = files.get(&w.path).ok_or_else(|| {
                    Error::RunFailed(format!(
                        "{}: named by the build log of {table} but missing (`ingot doctor` says more)",
                        lake.url(&format!("{root}/{}", w.path))
                    ))
                })?;
                adds.push(add_of(&w, meta));
            }
            (adds, log_shape(kind)?)
        }
    };
    let change = Change {
        app: build_app(table),
        slot: last as i64,
        operation: DeltaOperation::Write {
            mode: SaveMode::Overwrite,
            partition_by: None,
            predicate: None,
        },
        adds,
        removes: Vec::new(),
        info: info(table, last, current(&builds)),
    };
    let owns = owner(kind, table, &builds);
    log::replace(Table::new(lake, &root), &shape, change, &*owns).await
}

fn owner(kind: Kind, table: &str, builds: &[BuildRecord]) -> Box<dyn Fn(&str) -> bool + Send + Sync> {
    match kind {
        Kind::Silver => Box::new(|_| true),
        Kind::BuildLog => {
            let prefix = format!("{table}/");
            Box::new(move |p: &str| p.starts_with(&prefix))
        }
        Kind::Failures => {
            let ids: BTreeSet<String> = builds.iter().map(|b| failure_file(&b.build_id)).collect();
            Box::new(move |p: &str| ids.contains(p))
        }
    }
}

/// The tables of the lake (folders of the build log).
async fn tables(lake: &Lake) -> Result<Vec<String>> {
    lake.list_dirs(layout::BUILD_LOG).await
}

/// [`sync_table`] for every table and kind; what was repaired, for people.
pub async fn sync_all(lake: &Lake, _mode: Mode) -> Result<Vec<String>> {
    let mut out = Vec::new();
    for table in tables(lake).await? {
        for kind in KINDS {
            if let Some(v) = sync_table(lake, kind, &table, true).await? {
                out.push(format!(
                    "{}: {table}'s builds published as version {v}",
                    kind.root(&table)
                ));
            }
        }
    }
    Ok(out)
}

/// Every difference between the build tables and the build log.
pub async fn check_all(lake: &Lake) -> Result<Vec<Finding>> {
    let mut out = Vec::new();
    let mut shared: HashMap<Kind, Option<log::Loaded>> = HashMap::new();
    for kind in [Kind::BuildLog, Kind::Failures] {
        if let Some(l) = super::load_checked(lake, &kind.root(""), &mut out).await {
            shared.insert(kind, l);
        }
    }
    for table in tables(lake).await? {
        let builds = read_table_builds(lake, &table).await?;
        let Some(last) = builds.iter().map(|b| b.seq).max() else {
            continue;
        };
        for kind in KINDS {
            let root = kind.root(&table);
            let own;
            let loaded = match kind {
                Kind::Silver => match super::load_checked(lake, &root, &mut out).await {
                    Some(l) => {
                        own = l;
                        own.as_ref()
                    }
                    None => continue,
                },
                _ => match shared.get(&kind) {
                    Some(l) => l.as_ref(),
                    // unreadable, said above
                    None => continue,
                },
            };
            let want: BTreeSet<String> = match kind {
                Kind::Silver => match current(&builds) {
                    None => continue,
                    Some(b) => silver_adds(lake, &table, b)
                        .await?
                        .0
                        .into_iter()
                        .map(|a| log::identity(&a.path, a.deletion_vector.as_ref()))
                        .collect(),
                },
                _ => builds.iter().filter_map(|b| wants(kind, b)).map(|w| w.path).collect(),
            };
            let owns = owner(kind, &table, &builds);
            let expected = super::Expected {
                owner: &table,
                log: "build",
                app: build_app(&table),
                last,
                state: format!("{table}'s current build"),
                want,
            };
            let have = |l: &log::Loaded| {
                l.files
                    .iter()
                    .filter(|v| owns(&v.path()))
                    .map(|v| match kind {
                        Kind::Silver => log::identity(&v.path(), v.deletion_vector_descriptor().as_ref()),
                        _ => v.path().to_string(),
                    })
                    .collect()
            };
            super::compare(&root, loaded, expected, have, &mut out).await?;
        }
    }
    Ok(out)
}
