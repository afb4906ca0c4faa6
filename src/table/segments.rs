//! Segments of a source: small bronze runs merged into larger Parquet files, so that a query on
//! `bronze.<source>` reads a few files however many runs the source has seen.
//!
//! A segment (`_cache/segments/<source>/files/segment=<id>.parquet`) holds, unchanged, the rows of a set
//! of committed runs of one recorded field set and file schema (each row keeps its
//! `ingestion_run_id`); a manifest (`_cache/segments/<source>/manifest-<n>.json`, put
//! create-if-absent under the source lock) lists the live segments. The run files stay where they
//! are and stay the truth: whether a row counts is decided by the run log alone (the catalog leaves
//! out the rows of a segment's runs that were undone since), undo, replay, rekey and change
//! detection read the run files, and a segment that is missing or not of its recorded size is
//! passed over (its runs are read from their own files). Written by [`crate::engine::compact`].

use bytes::Bytes;
use futures::StreamExt;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
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
}

/// The live segments of a source, as of manifest `number`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    pub source: String,
    pub number: u64,
    pub segments: Vec<Segment>,
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
        let Ok(mut m) = serde_json::from_slice::<Manifest>(&bytes) else {
            continue;
        };
        if m.source != source || m.number != number {
            continue;
        }
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
        m.segments.retain(|s| sizes.next().flatten() == Some(s.bytes));
        return Ok(m);
    }
    Ok(Manifest {
        source: source.to_string(),
        number: 0,
        segments: Vec::new(),
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
