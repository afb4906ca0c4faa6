//! A silver snapshot as Delta readers see it ([`Published`] in the build's manifest): computed by
//! the build before its commit, so every file the Delta table names is a file of a committed
//! build that gc keeps with it ([`crate::table::silver::build_files`]).
//!
//! A whole snapshot publishes its parts. A delta layer publishes the previous build's files
//! minus the rows of the keys it deletes, plus its own parts: with deletion vectors, each
//! touched file gets the union of its old positions and the new ones, and the build writes one
//! `deletion_vector_<uuid>.bin` in its folder holding every vector of the snapshot (so the
//! current snapshot never depends on an older build's vector file); copy-on-write instead copies
//! each touched file without those rows (`cow-NNNNN.parquet` in the build's folder).
//!
//! Hazard: a deletion vector counts physical rows of the file in file order; positions come from
//! reading the file's key index (written beside it, row for row) or its fingerprint column in
//! order, never from a plan that may reorder rows.

use std::sync::Arc;

use bytes::Bytes;
use datafusion::arrow::array::{Array, AsArray, BooleanArray, RecordBatch};
use datafusion::arrow::compute::filter_record_batch;
use datafusion::arrow::datatypes::DataType;
use datafusion::parquet::arrow::{ParquetRecordBatchStreamBuilder, ProjectionMask};
use delta_kernel::actions::deletion_vector_writer::{KernelDeletionVector, StreamingDeletionVectorWriter};
use futures::StreamExt;
use roaring::RoaringTreemap;

use super::Mode;
use crate::error::{Error, Result};
use crate::hash::fp::{FpSet, Heads, for_each_fp, keys_digest};
use crate::table::bronze::{KEYS_DIGEST, KEYS_OF, RunFileWriter};
use crate::table::lake::{Lake, layout};
use crate::table::parquet::object_reader;
use crate::table::silver::{FP, Manifest, Published, PublishedDv, PublishedFile, index_writer, key_schema, keys_of};

/// The magic number that opens a serialized deletion vector (Delta protocol).
const DV_MAGIC: u32 = 1681511377;

fn bad(rel: &str, e: impl std::fmt::Display) -> Error {
    Error::RunFailed(format!("{rel}: {e}"))
}

/// A whole snapshot: its data files (lake-relative), unchanged; `keyed` when the build wrote
/// their key indexes ([`keys_of`]: a file without rows, the empty part of an empty table, has
/// none).
pub async fn whole(lake: &Lake, mode: Mode, data: &[String], keyed: bool) -> Result<Published> {
    let mut files = Vec::with_capacity(data.len());
    for rel in data {
        let rows = rows_of(lake, rel).await?;
        files.push(PublishedFile {
            path: rel.clone(),
            rows,
            dv: None,
            keys: (keyed && rows > 0).then(|| keys_of(rel)),
        });
    }
    Ok(Published {
        mode: mode.as_str().to_string(),
        files,
    })
}

/// Rows of a Parquet file, from its footer.
async fn rows_of(lake: &Lake, rel: &str) -> Result<u64> {
    let builder = ParquetRecordBatchStreamBuilder::new(object_reader(lake, rel).await?)
        .await
        .map_err(|e| bad(rel, e))?;
    Ok(builder.metadata().file_metadata().num_rows().max(0) as u64)
}

/// A file being published, with the positions deleted so far.
#[derive(Clone)]
struct Live {
    path: String,
    rows: u64,
    deleted: RoaringTreemap,
    /// Its key index, if it has one.
    keys: Option<String>,
}

/// The previous snapshot's files as a delta layer of it publishes them: each with the positions
/// of the keys the layer deletes. It depends only on the previous build and those keys, so a build
/// starts it ([`Prior::start`]) before it writes its own files, and the reading of the older
/// files' fingerprints runs beside that work instead of after it.
pub struct Prior {
    mode: Mode,
    live: Vec<Live>,
}

impl Prior {
    /// The files of `prev` (lake-relative, its published files, or its layers when it has none
    /// in `mode`) minus the rows of the keys in `deleted`: `expect` of them (the rows of the
    /// previous snapshot with those keys, which the build counted). Positions come from the
    /// files' key indexes where they have them and they read back whole, else from the files'
    /// fingerprints; if the indexes do not account for exactly `expect` rows, from every file's
    /// fingerprints. An index that was not used is dropped from the snapshot (gc removes it).
    pub async fn of(lake: &Lake, mode: Mode, prev: &Manifest, deleted: Arc<FpSet>, expect: u64) -> Result<Prior> {
        let live = match &prev.published {
            Some(p) if p.mode == mode.as_str() => from_published(lake, p).await?,
            _ => from_layers(lake, prev).await?,
        };
        if deleted.is_empty() {
            return Ok(Prior { mode, live });
        }
        let indexed = live.iter().any(|f| f.keys.is_some());
        let mut with = live.clone();
        if with_positions(lake, &mut with, &deleted, true).await? == expect || !indexed {
            return Ok(Prior { mode, live: with });
        }
        let mut live = live;
        with_positions(lake, &mut live, &deleted, false).await?;
        for f in &mut live {
            f.keys = None;
        }
        Ok(Prior { mode, live })
    }

    /// [`Prior::of`] in a task of its own, in the table's mode (`None` with publishing off);
    /// dropping the handle before [`Started::wait`] stops it.
    pub fn start(lake: &Lake, table: &str, prev: Manifest, deleted: FpSet, expect: u64) -> Started {
        let (lake, table) = (lake.clone(), table.to_string());
        Started(tokio::spawn(async move {
            match super::builds::table_mode(&lake, &table).await? {
                Mode::Off => Ok(None),
                mode => Prior::of(&lake, mode, &prev, Arc::new(deleted), expect).await.map(Some),
            }
        }))
    }
}

/// Add to each file's deleted positions those of `keys` (from its key index when `indexed` and it
/// has one); returns how many positions were not deleted before.
async fn with_positions(lake: &Lake, live: &mut [Live], keys: &Arc<FpSet>, indexed: bool) -> Result<u64> {
    let files = live
        .iter()
        .map(|f| (f.path.clone(), f.rows, f.keys.clone().filter(|_| indexed)))
        .collect();
    let mut added = 0;
    for (f, (hits, from_index)) in live.iter_mut().zip(positions_of(lake, files, keys.clone()).await?) {
        let before = f.deleted.len();
        f.deleted |= hits;
        added += f.deleted.len() - before;
        if indexed && !from_index {
            f.keys = None;
        }
    }
    Ok(added)
}

/// A [`Prior`] being computed ([`Prior::start`]).
pub struct Started(tokio::task::JoinHandle<Result<Option<Prior>>>);

impl Started {
    pub async fn wait(mut self) -> Result<Option<Prior>> {
        (&mut self.0)
            .await
            .map_err(|e| Error::Internal(format!("deletion positions: {e}")))?
    }
}

impl Drop for Started {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The snapshot of a delta build of `table` (`build_id`): the previous build's files less the
/// deleted rows (`prior`) plus the new layer's `data` files (`keyed`: with key indexes).
pub async fn layer(
    lake: &Lake,
    table: &str,
    build_id: &str,
    prior: Prior,
    data: &[String],
    keyed: bool,
) -> Result<Published> {
    let Prior { mode, mut live } = prior;
    for rel in data {
        let rows = rows_of(lake, rel).await?;
        live.push(Live {
            path: rel.clone(),
            rows,
            deleted: RoaringTreemap::new(),
            keys: (keyed && rows > 0).then(|| keys_of(rel)),
        });
    }
    match mode {
        Mode::CopyOnWrite => copy_without(lake, table, build_id, live).await,
        _ => with_vectors(lake, table, build_id, live).await,
    }
}

/// The files of `p` with their deletion vectors read back.
async fn from_published(lake: &Lake, p: &Published) -> Result<Vec<Live>> {
    let mut out = Vec::with_capacity(p.files.len());
    let mut dv_files: std::collections::HashMap<String, Bytes> = std::collections::HashMap::new();
    for f in &p.files {
        let deleted = match &f.dv {
            None => RoaringTreemap::new(),
            Some(d) => {
                if !dv_files.contains_key(&d.file) {
                    let bytes = lake
                        .get(&d.file)
                        .await?
                        .ok_or_else(|| bad(&d.file, "deletion-vector file missing"))?;
                    dv_files.insert(d.file.clone(), bytes);
                }
                read_vector(&dv_files[&d.file], d).map_err(|e| bad(&d.file, e))?
            }
        };
        out.push(Live {
            path: f.path.clone(),
            rows: f.rows,
            deleted,
            keys: f.keys.clone(),
        });
    }
    Ok(out)
}

/// One vector of a deletion-vector file: at `offset`, its size (4 bytes, big-endian), the magic
/// number, the serialized 64-bit roaring bitmap, then a CRC-32.
fn read_vector(file: &[u8], d: &PublishedDv) -> std::result::Result<RoaringTreemap, String> {
    let at = usize::try_from(d.offset).map_err(|_| "negative offset".to_string())?;
    let size = usize::try_from(d.size).map_err(|_| "negative size".to_string())?;
    let body = file
        .get(at + 4..at + 4 + size)
        .ok_or_else(|| format!("vector at {at} of {size} bytes past the end"))?;
    if body.len() < 4 || u32::from_le_bytes([body[0], body[1], body[2], body[3]]) != DV_MAGIC {
        return Err(format!("no deletion vector at offset {at}"));
    }
    RoaringTreemap::deserialize_from(&body[4..]).map_err(|e| e.to_string())
}

/// The files of `m`'s layers, each with the positions of the keys later layers deleted.
async fn from_layers(lake: &Lake, m: &Manifest) -> Result<Vec<Live>> {
    let mut layers: Vec<&[String]> = vec![&m.data];
    let mut deletions: Vec<FpSet> = Vec::new();
    for d in &m.deltas {
        layers.push(&d.data);
        deletions.push(if d.deleted_keys == 0 {
            FpSet::default()
        } else {
            read_keys(lake, &d.deleted).await?
        });
    }
    let mut out = Vec::new();
    for (i, files) in layers.iter().enumerate() {
        let later: FpSet = deletions[i..].iter().flatten().copied().collect();
        let deleted = if later.is_empty() {
            vec![RoaringTreemap::new(); files.len()]
        } else {
            let files = files.iter().map(|f| (f.clone(), 0, None)).collect();
            positions_of(lake, files, Arc::new(later))
                .await?
                .into_iter()
                .map(|(hits, _)| hits)
                .collect()
        };
        for (rel, deleted) in files.iter().zip(deleted) {
            out.push(Live {
                path: rel.clone(),
                rows: rows_of(lake, rel).await?,
                deleted,
                keys: None,
            });
        }
    }
    Ok(out)
}

/// The keys of a deletion file.
async fn read_keys(lake: &Lake, rel: &str) -> Result<FpSet> {
    let mut set = FpSet::default();
    let builder = ParquetRecordBatchStreamBuilder::new(object_reader(lake, rel).await?)
        .await
        .map_err(|e| bad(rel, e))?;
    if builder.schema().fields() != key_schema().fields() {
        return Err(bad(rel, "not a deletion file of 16-byte keys"));
    }
    let mut stream = builder.build().map_err(|e| bad(rel, e))?;
    while let Some(b) = stream.next().await {
        let b = b.map_err(|e| bad(rel, e))?;
        for_each_fp(b.column(0), |_, fp| {
            if let Some(fp) = fp {
                set.insert(fp);
            }
        })?;
    }
    Ok(set)
}

/// [`positions`] of `keys` in each of `files` (path, rows, key index), the files read side by
/// side (one task per core); from a file's key index when it has one that reads back as the
/// index of `rows` keys of that file ([`indexed`]; then true beside the positions).
async fn positions_of(
    lake: &Lake,
    files: Vec<(String, u64, Option<String>)>,
    keys: Arc<FpSet>,
) -> Result<Vec<(RoaringTreemap, bool)>> {
    let heads = Arc::new(Heads::of(keys.iter()));
    let width = std::thread::available_parallelism().map_or(2, |n| n.get());
    let tasks = files.into_iter().map(|(rel, rows, index)| {
        let (lake, keys, heads) = (lake.clone(), keys.clone(), heads.clone());
        tokio::spawn(async move {
            if let Some(index) = index
                && let Some(hits) = indexed(&lake, &index, &rel, rows, &keys, &heads).await
            {
                return Ok::<_, Error>((hits, true));
            }
            Ok((positions(&lake, &rel, &keys, &heads).await?, false))
        })
    });
    let mut out = Vec::new();
    let mut running = futures::stream::iter(tasks).buffered(width);
    while let Some(done) = running.next().await {
        out.push(done.map_err(|e| Error::Internal(format!("deletion positions: {e}")))??);
    }
    Ok(out)
}

/// The positions of `keys` in `file` (of `rows` rows) read from its key index `rel`; `None` when
/// that is not an index of `file` that reads back whole (missing, damaged, of another file:
/// its footer's path and digest decide, see [`RunFileWriter::with_keys`]).
async fn indexed(lake: &Lake, rel: &str, file: &str, rows: u64, keys: &FpSet, heads: &Heads) -> Option<RoaringTreemap> {
    let builder = ParquetRecordBatchStreamBuilder::new(object_reader(lake, rel).await.ok()?)
        .await
        .ok()?;
    let fields = builder.schema().fields();
    if fields.len() != 1 || fields[0].data_type() != &DataType::FixedSizeBinary(16) {
        return None;
    }
    let meta = builder.metadata().file_metadata();
    let footer = |key: &str| -> Option<String> {
        meta.key_value_metadata()?
            .iter()
            .find(|kv| kv.key == key)
            .and_then(|kv| kv.value.clone())
    };
    if meta.num_rows() != rows as i64 || footer(KEYS_OF).as_deref() != Some(file) {
        return None;
    }
    let want = footer(KEYS_DIGEST)?;
    let mut stream = builder.build().ok()?;
    let mut out = RoaringTreemap::new();
    let (mut base, mut digest) = (0u64, 0u128);
    while let Some(b) = stream.next().await {
        let b = b.ok()?;
        for_each_fp(b.column(0), |i, fp| {
            if fp.is_some_and(|fp| heads.may_contain(fp) && keys.contains(&fp)) {
                out.insert(base + i as u64);
            }
        })
        .ok()?;
        digest = keys_digest(digest, base, b.column(0).as_fixed_size_binary_opt()?);
        base += b.num_rows() as u64;
    }
    (base == rows && format!("{digest:032x}") == want).then_some(out)
}

/// The positions (0-based, in file order) of the rows of `rel` whose key is in `keys`.
async fn positions(lake: &Lake, rel: &str, keys: &FpSet, heads: &Heads) -> Result<RoaringTreemap> {
    let builder = ParquetRecordBatchStreamBuilder::new(object_reader(lake, rel).await?)
        .await
        .map_err(|e| bad(rel, e))?;
    let Ok(at) = builder.schema().index_of(FP) else {
        return Err(bad(rel, format!("no {FP} column")));
    };
    let mask = ProjectionMask::roots(builder.parquet_schema(), [at]);
    let mut stream = builder.with_projection(mask).build().map_err(|e| bad(rel, e))?;
    let mut out = RoaringTreemap::new();
    let mut base = 0u64;
    while let Some(b) = stream.next().await {
        let b = b.map_err(|e| bad(rel, e))?;
        let column = b.column(0);
        match column.as_any().downcast_ref::<datafusion::arrow::array::StringArray>() {
            // the common case: hex text, most rows decided from their first characters
            Some(text) => {
                for i in 0..text.len() {
                    if text.is_valid(i)
                        && heads.may_contain_hex(text.value(i).as_bytes())
                        && crate::hash::fp::fp_of_hex(text.value(i)).is_some_and(|fp| keys.contains(&fp))
                    {
                        out.insert(base + i as u64);
                    }
                }
            }
            None => for_each_fp(column, |i, fp| {
                if fp.is_some_and(|fp| keys.contains(&fp)) {
                    out.insert(base + i as u64);
                }
            })?,
        }
        base += b.num_rows() as u64;
    }
    Ok(out)
}

/// Deletion vectors: one file in the build's folder with a vector for every file that has
/// deleted rows.
async fn with_vectors(lake: &Lake, table: &str, build_id: &str, live: Vec<Live>) -> Result<Published> {
    let uuid = uuid::Uuid::new_v4();
    let file = layout::silver_file(table, build_id, &format!("deletion_vector_{uuid}.bin"));
    let mut buf: Vec<u8> = Vec::new();
    let mut files = Vec::with_capacity(live.len());
    {
        let mut writer = StreamingDeletionVectorWriter::new(&mut buf);
        for f in live {
            let dv = if f.deleted.is_empty() {
                None
            } else {
                let mut v = KernelDeletionVector::new();
                v.add_deleted_row_indexes(f.deleted.iter());
                let r = writer
                    .write_deletion_vector(v)
                    .map_err(|e| Error::Internal(format!("deletion vector: {e}")))?;
                Some(PublishedDv {
                    file: file.clone(),
                    uuid: uuid.to_string(),
                    offset: r.offset,
                    size: r.size_in_bytes,
                    cardinality: r.cardinality,
                })
            };
            files.push(PublishedFile {
                path: f.path,
                rows: f.rows,
                dv,
                keys: f.keys,
            });
        }
        writer
            .finalize()
            .map_err(|e| Error::Internal(format!("deletion vector: {e}")))?;
    }
    if files.iter().any(|f| f.dv.is_some()) {
        lake.put_file(&file, Bytes::from(buf)).await?;
    }
    Ok(Published {
        mode: Mode::DeletionVectors.as_str().to_string(),
        files,
    })
}

/// Copy-on-write: every file with deleted rows copied without them into the build's folder.
async fn copy_without(lake: &Lake, table: &str, build_id: &str, live: Vec<Live>) -> Result<Published> {
    let mut files = Vec::with_capacity(live.len());
    let mut n = 0;
    for f in live {
        if f.deleted.is_empty() {
            files.push(PublishedFile {
                path: f.path,
                rows: f.rows,
                dv: None,
                keys: f.keys,
            });
            continue;
        }
        let rel = layout::silver_file(table, build_id, &format!("cow-{n:05}.parquet"));
        n += 1;
        let rows = copy_file(lake, &f.path, &rel, &f.deleted).await?;
        files.push(PublishedFile {
            keys: Some(keys_of(&rel)),
            path: rel,
            rows,
            dv: None,
        });
    }
    Ok(Published {
        mode: Mode::CopyOnWrite.as_str().to_string(),
        files,
    })
}

/// Copy the Parquet file `from` to `to` without the rows at `deleted`; the rows written.
async fn copy_file(lake: &Lake, from: &str, to: &str, deleted: &RoaringTreemap) -> Result<u64> {
    let builder = ParquetRecordBatchStreamBuilder::new(object_reader(lake, from).await?)
        .await
        .map_err(|e| bad(from, e))?;
    let schema = builder.schema().clone();
    let mut stream = builder.build().map_err(|e| bad(from, e))?;
    let mut w = RunFileWriter::new(lake, to.to_string(), schema)
        .with_fingerprints_uncompressed()
        .with_keys(index_writer(lake, keys_of(to)));
    let mut base = 0u64;
    let mut kept = 0u64;
    while let Some(b) = stream.next().await {
        let b: RecordBatch = b.map_err(|e| bad(from, e))?;
        let n = b.num_rows() as u64;
        let keep: BooleanArray = (0..n).map(|i| Some(!deleted.contains(base + i))).collect();
        let out = filter_record_batch(&b, &keep)?;
        kept += out.num_rows() as u64;
        if out.num_rows() > 0 {
            w.write(&out).await?;
        }
        base += n;
    }
    w.finish().await?;
    Ok(kept)
}

/// The Delta `add` of a published file, in the table at `silver/<table>` (its path relative to
/// that folder), with the file's size and time from the store.
pub async fn add_of(lake: &Lake, table: &str, f: &PublishedFile) -> Result<deltalake_core::kernel::Add> {
    use deltalake_core::kernel::{DeletionVectorDescriptor, StorageType};
    let root = super::roots::silver(table);
    let inside = f
        .path
        .strip_prefix(&format!("{root}/"))
        .ok_or_else(|| Error::Internal(format!("{}: not a file of silver.{table}", f.path)))?;
    let meta = super::runs::head(lake, &root, inside).await?;
    let deletion_vector = match &f.dv {
        None => None,
        Some(d) => {
            let uuid = uuid::Uuid::parse_str(&d.uuid).map_err(|e| bad(&d.file, e))?;
            // the vector file sits in the build's folder: that folder is the path's prefix
            let folder = d
                .file
                .strip_prefix(&format!("{root}/"))
                .and_then(|p| p.rsplit_once('/'))
                .map(|(dir, _)| format!("{dir}/"))
                .unwrap_or_default();
            Some(DeletionVectorDescriptor {
                storage_type: StorageType::UuidRelativePath,
                path_or_inline_dv: format!("{}{}", folder.trim_end_matches('/'), z85::encode(uuid.as_bytes())),
                offset: Some(d.offset),
                size_in_bytes: d.size,
                cardinality: d.cardinality,
            })
        }
    };
    let physical = f.rows as i64;
    Ok(deltalake_core::kernel::Add {
        path: inside.to_string(),
        size: meta.size as i64,
        modification_time: meta.last_modified.timestamp_millis(),
        data_change: true,
        stats: Some(serde_json::json!({"numRecords": physical, "tightBounds": deletion_vector.is_none()}).to_string()),
        deletion_vector,
        ..Default::default()
    })
}

/// The adds of a layered snapshot built without a published set (before Delta publishing, or
/// with it off): every layer's files, each with an inline deletion vector (stored in the log:
/// nothing is written into a committed build's folder).
pub async fn inline(lake: &Lake, table: &str, m: &Manifest) -> Result<Vec<deltalake_core::kernel::Add>> {
    let mut out = Vec::new();
    for f in from_layers(lake, m).await? {
        let file = PublishedFile {
            path: f.path.clone(),
            rows: f.rows,
            dv: None,
            keys: None,
        };
        let mut add = add_of(lake, table, &file).await?;
        if !f.deleted.is_empty() {
            add.deletion_vector = Some(inline_dv(&f.deleted)?);
            add.stats = Some(serde_json::json!({"numRecords": f.rows, "tightBounds": false}).to_string());
        }
        out.push(add);
    }
    Ok(out)
}

/// A deletion vector of the rows at `deleted` stored in the log itself (inline: the magic number
/// and the serialized bitmap, z85-encoded), so no file holds it.
pub(crate) fn inline_dv(deleted: &RoaringTreemap) -> Result<deltalake_core::kernel::DeletionVectorDescriptor> {
    use delta_kernel::actions::deletion_vector_writer::DeletionVector;
    use deltalake_core::kernel::{DeletionVectorDescriptor, StorageType};
    let mut v = KernelDeletionVector::new();
    v.add_deleted_row_indexes(deleted.iter());
    let body = v
        .serialize()
        .map_err(|e| Error::Internal(format!("deletion vector: {e}")))?;
    let mut data = DV_MAGIC.to_le_bytes().to_vec();
    data.extend_from_slice(&body);
    let size = data.len();
    // z85 encodes 4 bytes at a time; readers take `size_in_bytes` of the decoded bytes
    while !data.len().is_multiple_of(4) {
        data.push(0);
    }
    Ok(DeletionVectorDescriptor {
        storage_type: StorageType::Inline,
        path_or_inline_dv: z85::encode(&data),
        offset: None,
        size_in_bytes: i32::try_from(size)
            .map_err(|_| Error::Internal(format!("a deletion vector of {size} bytes")))?,
        cardinality: deleted.len() as i64,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_written_vector_reads_back_from_its_offset() {
        let mut buf = Vec::new();
        let mut results = Vec::new();
        {
            let mut w = StreamingDeletionVectorWriter::new(&mut buf);
            for rows in [vec![0u64, 3, 7], vec![1u64 << 33, 5]] {
                let mut v = KernelDeletionVector::new();
                v.add_deleted_row_indexes(rows.iter().copied());
                results.push(w.write_deletion_vector(v).unwrap());
            }
            w.finalize().unwrap();
        }
        let read = |i: usize| {
            let r = &results[i];
            read_vector(
                &buf,
                &PublishedDv {
                    file: "f".into(),
                    uuid: String::new(),
                    offset: r.offset,
                    size: r.size_in_bytes,
                    cardinality: r.cardinality,
                },
            )
            .unwrap()
        };
        assert_eq!(read(0).iter().collect::<Vec<_>>(), vec![0, 3, 7]);
        assert_eq!(read(1).iter().collect::<Vec<_>>(), vec![5, 1u64 << 33]);
        let bad = PublishedDv {
            file: "f".into(),
            uuid: String::new(),
            offset: results[1].offset + 1,
            size: results[1].size_in_bytes,
            cardinality: 0,
        };
        assert!(read_vector(&buf, &bad).is_err());
    }
}
