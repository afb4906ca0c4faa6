//! `bronze/<source>/_current`: a source's current versions (`bronze.<source>_current`) as a Delta
//! table, so other engines read them without ranking. It names the files `bronze/<source>` names
//! for the source's current runs (as `../<path>`, relative to its root), each with an inline
//! deletion vector of its rows that are not current: versions a later current run superseded,
//! and tombstones. Only a run that updated or deleted records supersedes anything
//! ([`crate::table::versions::supersedes`]), so a run that brought only new records is one `add`
//! appended without reading a file ([`append`], beside bronze's commit); any other change
//! recomputes every vector from the run log and the files ([`sync`], after bronze's commit: the
//! fingerprints of the files older than the newest updating run are read).
//!
//! Hazard: a position counts the physical rows of the file the table names, in file order; they
//! are read from that file (a conformed copy or the run's own), never from a plan.

use std::collections::HashMap;
use std::sync::Arc;

use datafusion::arrow::array::{Array, AsArray, StringArray};
use datafusion::parquet::arrow::{ParquetRecordBatchStreamBuilder, ProjectionMask};
use deltalake_core::kernel::{Add, DeletionVectorDescriptor};
use deltalake_core::protocol::{DeltaOperation, SaveMode};
use futures::StreamExt;
use object_store::ObjectMeta;
use roaring::RoaringTreemap;

use super::conform::Conform;
use super::log::{self, Change, Outcome, Shape, Table};
use super::runs::{Kind, conform_of, head, listing, shape as bronze_shape, wants};
use super::{Finding, roots, run_app};
use crate::error::{Error, Result};
use crate::hash::fp::{Fp, FpBuild, Heads, for_each_fp, fp_of_hex};
use crate::spec::columns::{FINGERPRINT, IS_DELETED};
use crate::spec::contract::Contract;
use crate::table::audit::{RunRecord, read_source_runs};
use crate::table::lake::Lake;
use crate::table::parquet::object_reader;
use crate::table::versions::{current_runs, reinserts_before, supersedes};

/// The folder of the current table inside a source's bronze table (hidden from its readers and
/// from Delta's vacuum of it, as `_delta_log` is).
pub const CURRENT: &str = "_current";

/// The shape of the current table: the bronze table's schema, with deletion vectors.
async fn shape(
    lake: &Lake,
    source: &str,
    records: &[&RunRecord],
    conform: Option<&Conform<'_>>,
) -> Result<Option<Shape>> {
    Ok(bronze_shape(lake, Kind::Bronze, source, records, conform)
        .await?
        .map(|s| Shape {
            deletion_vectors: true,
            ..s
        }))
}

/// After `record` (superseding `previous`) was committed: its commit of the current table when
/// that is an append, a record that changes no current file or adds the own file of a run that
/// superseded nothing (a conformed copy is bronze's to write first);
/// `false` when the table must be recomputed ([`sync`], after `bronze/<source>` is published,
/// whose conformed copies it names): an update, an undo, a rekey, a table that lags.
pub async fn append(
    lake: &Lake,
    record: &RunRecord,
    previous: Option<&RunRecord>,
    contract: Option<&Contract>,
) -> Result<bool> {
    let source = record.source.as_str();
    let root = roots::current(source);
    let conform = conform_of(Kind::Bronze, contract, &[record]);
    let Some(shape) = shape(lake, source, &[record], conform.as_ref()).await? else {
        return Ok(true);
    };
    let was = previous.is_some_and(RunRecord::has_data);
    let adds = match (was, record.has_data()) {
        (false, false) => Vec::new(),
        (false, true)
            if !supersedes(record, None)
                && !record.is_rekey()
                && !conform.as_ref().is_some_and(|c| c.copies(record)) =>
        {
            let (_, inside) = named(source, record, conform.as_ref())?;
            let meta = head(lake, &roots::bronze(source), &inside).await?;
            vec![add(source, record, conform.as_ref(), &meta, &RoaringTreemap::new())?]
        }
        _ => return Ok(false),
    };
    let change = Change {
        app: run_app(source),
        slot: record.seq as i64,
        operation: super::runs::operation(&adds, &[]),
        adds,
        removes: Vec::new(),
        info: info(source, record.seq, Some(record)),
    };
    Ok(log::append(Table::new(lake, &root), &shape, change).await? != Outcome::Lagging)
}

fn info(source: &str, slot: u64, record: Option<&RunRecord>) -> HashMap<String, serde_json::Value> {
    let mut v = serde_json::json!({"log": "ingestion_run_log", "source": source, "slot": slot, "current": true});
    if let Some(r) = record {
        v["run_id"] = r.run_id.as_str().into();
        v["status"] = r.status.as_str().into();
    } else {
        v["sync"] = true.into();
    }
    HashMap::from([("ingot".to_string(), v)])
}

/// Make the current table of `source` hold exactly what its run log says, in one commit with
/// `txn` at the log's last slot (none when it does). Unless `thorough`, a table whose `txn` has
/// the last slot under the same conformed copies is taken as up to date without reading it.
pub async fn sync(lake: &Lake, source: &str, thorough: bool, contract: Option<&Contract>) -> Result<Option<i64>> {
    let runs = read_source_runs(lake, source).await?;
    let Some(last) = runs.iter().map(|r| r.seq).max() else {
        return Ok(None);
    };
    let root = roots::current(source);
    let refs: Vec<&RunRecord> = runs.iter().collect();
    let conform = conform_of(Kind::Bronze, contract, &refs);
    let key = conform.as_ref().map(|c| c.key.as_str());
    let t = Table::new(lake, &root);
    if !thorough && log::has_slot(t, &run_app(source), last as i64, key).await? {
        return Ok(None);
    }
    let Some(shape) = shape(lake, source, &refs, conform.as_ref()).await? else {
        return Ok(None);
    };
    let change = Change {
        app: run_app(source),
        slot: last as i64,
        operation: DeltaOperation::Write {
            mode: SaveMode::Overwrite,
            partition_by: None,
            predicate: None,
        },
        adds: desired(lake, source, &runs, conform.as_ref()).await?,
        removes: Vec::new(),
        info: info(source, last, None),
    };
    log::replace(t, &shape, change, &|_| true).await
}

/// The file `bronze/<source>` names for run `r` (lake-relative, and inside that table).
fn named(source: &str, r: &RunRecord, conform: Option<&Conform<'_>>) -> Result<(String, String)> {
    let want = wants(Kind::Bronze, r, conform)
        .ok_or_else(|| Error::Internal(format!("run {} of {source} has no bronze file", r.run_id)))?;
    Ok((format!("{}/{}", roots::bronze(source), want.path), want.path))
}

/// The `add` of run `r`'s file in the current table, without the rows at `deleted`; the file's
/// size and time from `meta` (its object in the store).
fn add(
    source: &str,
    r: &RunRecord,
    conform: Option<&Conform<'_>>,
    meta: &ObjectMeta,
    deleted: &RoaringTreemap,
) -> Result<Add> {
    let (_, inside) = named(source, r, conform)?;
    let deletion_vector = if deleted.is_empty() {
        None
    } else {
        Some(super::publish::inline_dv(deleted)?)
    };
    Ok(Add {
        path: format!("../{inside}"),
        size: meta.size as i64,
        modification_time: meta.last_modified.timestamp_millis(),
        data_change: true,
        stats: Some(
            serde_json::json!({"numRecords": r.rows_written(), "tightBounds": deletion_vector.is_none()}).to_string(),
        ),
        deletion_vector,
        ..Default::default()
    })
}

/// The files of the current table as the run log `runs` of `source` says: each current run's
/// file with a vector of its rows that a later current run superseded and its tombstones. The
/// keys of the updating runs are read first (each with the highest slot that wrote it), then
/// every file that can have such rows, side by side (one task per core).
async fn desired(lake: &Lake, source: &str, runs: &[RunRecord], conform: Option<&Conform<'_>>) -> Result<Vec<Add>> {
    let current = current_runs(runs.iter(), source);
    let reinserts = reinserts_before(runs.iter(), source);
    let width = std::thread::available_parallelism().map_or(2, |n| n.get());
    let mut later: HashMap<Fp, u64, FpBuild> = HashMap::default();
    let updating: Vec<(u64, String)> = current
        .iter()
        .filter(|r| supersedes(r, reinserts))
        .map(|r| Ok((r.seq, named(source, r, conform)?.0)))
        .collect::<Result<_>>()?;
    let newest = updating.iter().map(|(seq, _)| *seq).max();
    let mut reading = futures::stream::iter(updating.into_iter().map(|(seq, rel)| {
        let lake = lake.clone();
        tokio::spawn(async move { Ok::<_, Error>((seq, keys_of(&lake, &rel).await?)) })
    }))
    .buffer_unordered(width);
    while let Some(done) = reading.next().await {
        let (seq, keys) = done.map_err(|e| Error::Internal(format!("current versions: {e}")))??;
        for k in keys {
            let at = later.entry(k).or_insert(seq);
            *at = (*at).max(seq);
        }
    }
    let later = Arc::new(later);
    let heads = Arc::new(Heads::of(later.keys()));
    let mut scans = Vec::with_capacity(current.len());
    for r in &current {
        let (rel, _) = named(source, r, conform)?;
        let read = newest.is_some_and(|n| n > r.seq) || r.rows_deleted > 0;
        let (lake, later, heads) = (lake.clone(), later.clone(), heads.clone());
        let (seq, tombstones, rows) = (r.seq, r.rows_deleted > 0, r.rows_written());
        scans.push(async move {
            if !read {
                return Ok(RoaringTreemap::new());
            }
            tokio::spawn(async move { not_current(&lake, &rel, rows, seq, &later, &heads, tombstones).await })
                .await
                .map_err(|e| Error::Internal(format!("current versions: {e}")))?
        });
    }
    // one listing for every file's size and time (not a HEAD per file: a long history on S3)
    let bronze = roots::bronze(source);
    let listed = listing(lake, &bronze).await?;
    let mut vectors = futures::stream::iter(scans).buffered(width);
    let mut adds = Vec::with_capacity(current.len());
    for r in &current {
        let deleted = match vectors.next().await {
            Some(v) => v?,
            None => return Err(Error::Internal("current versions: a file was not read".into())),
        };
        let (_, inside) = named(source, r, conform)?;
        let meta = match listed.get(&inside) {
            Some(m) => m.clone(),
            // listed before it was put (a store whose listing lags): ask for it
            None => head(lake, &bronze, &inside).await?,
        };
        adds.push(add(source, r, conform, &meta, &deleted)?);
    }
    Ok(adds)
}

fn bad(rel: &str, e: impl std::fmt::Display) -> Error {
    Error::RunFailed(format!("{rel}: {e}"))
}

/// Every key of the bronze file `rel`.
async fn keys_of(lake: &Lake, rel: &str) -> Result<Vec<Fp>> {
    let mut out = Vec::new();
    scan(lake, rel, false, |_, fp, _| {
        if let Some(fp) = fp {
            out.push(fp);
        }
    })
    .await?;
    Ok(out)
}

/// The positions of the rows of the bronze file `rel` (of run slot `seq`, `rows` rows) that are
/// not current: a key a later run wrote (`later`: the highest slot per key of the updating runs),
/// or a tombstone (read when the run wrote some).
async fn not_current(
    lake: &Lake,
    rel: &str,
    rows: i64,
    seq: u64,
    later: &HashMap<Fp, u64, FpBuild>,
    heads: &Heads,
    tombstones: bool,
) -> Result<RoaringTreemap> {
    let mut out = RoaringTreemap::new();
    let read = scan(lake, rel, tombstones, |i, fp, deleted| {
        if deleted || fp.is_some_and(|fp| heads.may_contain(fp) && later.get(&fp).is_some_and(|s| *s > seq)) {
            out.insert(i);
        }
    })
    .await?;
    if read != rows as u64 {
        return Err(bad(
            rel,
            format!("has {read} rows, its run recorded {rows} (`ingot doctor --verify` checks the file)"),
        ));
    }
    Ok(out)
}

/// Call `f(position, key, is a tombstone)` for every row of the bronze file `rel`, in file order,
/// reading only its fingerprints (and `is_deleted` when `tombstones`); the rows read.
async fn scan(lake: &Lake, rel: &str, tombstones: bool, mut f: impl FnMut(u64, Option<Fp>, bool)) -> Result<u64> {
    let builder = ParquetRecordBatchStreamBuilder::new(object_reader(lake, rel).await?)
        .await
        .map_err(|e| bad(rel, e))?;
    let schema = builder.schema().clone();
    let fp_at = schema
        .index_of(FINGERPRINT)
        .map_err(|_| bad(rel, format!("no {FINGERPRINT} column")))?;
    let mut roots = vec![fp_at];
    let deleted_at = if tombstones {
        let at = schema
            .index_of(IS_DELETED)
            .map_err(|_| bad(rel, format!("no {IS_DELETED} column, though its run wrote tombstones")))?;
        roots.push(at);
        Some(at)
    } else {
        None
    };
    let mask = ProjectionMask::roots(builder.parquet_schema(), roots);
    let mut stream = builder.with_projection(mask).build().map_err(|e| bad(rel, e))?;
    let mut base = 0u64;
    while let Some(b) = stream.next().await {
        let b = b.map_err(|e| bad(rel, e))?;
        let fps = b
            .column_by_name(FINGERPRINT)
            .ok_or_else(|| bad(rel, format!("no {FINGERPRINT} column")))?;
        let deleted = match deleted_at {
            Some(_) => Some(
                b.column_by_name(IS_DELETED)
                    .and_then(|c| c.as_boolean_opt())
                    .ok_or_else(|| bad(rel, format!("{IS_DELETED} is not a boolean column")))?
                    .clone(),
            ),
            None => None,
        };
        let tomb = |i: usize| deleted.as_ref().is_some_and(|d| d.is_valid(i) && d.value(i));
        match fps.as_any().downcast_ref::<StringArray>() {
            Some(text) => {
                for i in 0..text.len() {
                    let fp = if text.is_valid(i) {
                        fp_of_hex(text.value(i))
                    } else {
                        None
                    };
                    if text.is_valid(i) && fp.is_none() {
                        return Err(bad(rel, format!("row {}: {FINGERPRINT} is not hex", base + i as u64)));
                    }
                    f(base + i as u64, fp, tomb(i));
                }
            }
            None => for_each_fp(fps, |i, fp| f(base + i as u64, fp, tomb(i))).map_err(|e| bad(rel, e))?,
        }
        base += b.num_rows() as u64;
    }
    Ok(base)
}

/// A file of the current table as `ingot doctor` compares it: its path, and its vector's size and
/// a checksum of it (an inline vector is long).
fn label(path: &str, dv: Option<&DeletionVectorDescriptor>) -> String {
    match dv {
        None => path.to_string(),
        Some(d) => format!(
            "{path} (deletion vector of {} rows, {:08x})",
            d.cardinality,
            crc32fast::hash(log::identity(path, Some(d)).as_bytes())
        ),
    }
}

/// The differences between the current table of `source` and its run log `runs` (`last`: the
/// log's last slot).
pub async fn check(
    lake: &Lake,
    source: &str,
    runs: &[RunRecord],
    last: u64,
    contract: Option<&Contract>,
    out: &mut Vec<Finding>,
) -> Result<()> {
    let root = roots::current(source);
    let Some(loaded) = super::load_checked(lake, &root, out).await else {
        return Ok(());
    };
    let refs: Vec<&RunRecord> = runs.iter().collect();
    let conform = conform_of(Kind::Bronze, contract, &refs);
    if loaded.is_none() && current_runs(runs.iter(), source).is_empty() {
        return Ok(());
    }
    if let Some(l) = &loaded {
        let has = l
            .metadata
            .get("configuration")
            .and_then(|c| c.get(super::conform::CONFORMED_TO))
            .and_then(serde_json::Value::as_str);
        if has != conform.as_ref().map(|c| c.key.as_str()) {
            out.push(Finding::lag(
                &root,
                "its files were chosen under another contract than the source's (its next commit publishes it so)"
                    .to_string(),
            ));
            return Ok(());
        }
    }
    // a table that lags is said so without reading the files
    let want = match &loaded {
        Some(l) if l.txn(&run_app(source)).await? < last as i64 => Default::default(),
        _ => match desired(lake, source, runs, conform.as_ref()).await {
            Ok(adds) => adds
                .iter()
                .map(|a| label(&a.path, a.deletion_vector.as_ref()))
                .collect(),
            // a file that does not read is the file checks' violation (`ingot doctor` names it)
            Err(e) => {
                out.push(Finding::lag(&root, format!("not compared: {e}")));
                return Ok(());
            }
        },
    };
    let expected = super::Expected {
        owner: source,
        log: "run",
        app: run_app(source),
        last,
        state: format!("{source}'s current versions"),
        want,
    };
    let have = |l: &log::Loaded| {
        l.files
            .iter()
            .map(|v| label(&v.path(), v.deletion_vector_descriptor().as_ref()))
            .collect()
    };
    super::compare(&root, loaded.as_ref(), expected, have, out).await
}
