//! Compaction of small bronze runs into segments ([`crate::table::segments`]): size-tiered, so a
//! source's runs are read from O(log n) files and a row is rewritten O(log n) times.
//!
//! Runs of at most [`SMALL_ROWS`] rows that no segment holds are merged, [`RUNS_PER_SEGMENT`] at a
//! time and only with runs of the same recorded fields and file schema, into a level-1 segment;
//! [`FANOUT`] segments of one level merge into one of the next while the result stays within
//! [`MAX_SEGMENT_ROWS`]. Big runs stay in their own files. After an ingest commits, still under the
//! source lock, compaction runs when it has work (`INGOT_COMPACT=0` turns that off); `ingot
//! compact` runs it on demand and with `--all` also merges fewer runs. A level-1 merge gives each
//! row its run's commit slot; the manifest carries the source's view state as of the log it read
//! ([`crate::table::segments::ViewState`]), written again once [`STATE_LAG`] records follow it.
//! A crash leaves at most a segment file no manifest names (gc removes it after the grace period):
//! nothing readers see.

use std::collections::BTreeMap;

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::prelude::SessionContext;
use futures::StreamExt;

use crate::engine::session::Workspace;
use crate::error::{Error, Result};
use crate::spec::contract::Contract;
use crate::table::audit::RunRecord;
use crate::table::bronze::RunFileWriter;
use crate::table::failpoint;
use crate::table::lake::layout;
use crate::table::segments::{self, Manifest, Segment};

/// Runs with at most this many rows (new versions and tombstones) are compacted.
pub const SMALL_ROWS: i64 = 65_536;
/// Runs merged into one level-1 segment.
pub const RUNS_PER_SEGMENT: usize = 16;
/// Segments of one level merged into one of the next.
pub const FANOUT: usize = 8;
/// No merge makes a segment of more rows than this.
pub const MAX_SEGMENT_ROWS: u64 = 4 << 20;

/// What one compaction did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Compacted {
    /// Segments written (merges of runs and of segments).
    pub segments: usize,
    /// Runs newly held by a segment.
    pub runs: usize,
    /// The segments the source has afterwards.
    pub live: usize,
}

/// Is automatic compaction after an ingest on (`INGOT_COMPACT` is not `0`)?
pub fn automatic() -> bool {
    std::env::var("INGOT_COMPACT").map_or(true, |v| v != "0")
}

/// Compact `contract`'s source, whose run log is `runs`; the caller holds the source lock.
/// `all`: also merge fewer than [`RUNS_PER_SEGMENT`] runs (at least two).
pub async fn compact_source(ws: &Workspace, contract: &Contract, runs: &[RunRecord], all: bool) -> Result<Compacted> {
    let source = &contract.source;
    let mut manifest = segments::read(&ws.lake, source).await?;
    let small: Vec<&RunRecord> = {
        let covered = manifest.covered();
        crate::engine::catalog::bronze_runs(runs, source)
            .into_iter()
            .filter(|r| r.rows_written() <= SMALL_ROWS && !covered.contains(r.run_id.as_str()))
            .collect()
    };
    let least = if all { 2 } else { RUNS_PER_SEGMENT };
    let mut out = Compacted::default();
    if small.len() < least && mergeable(&manifest).is_none() {
        out.live = manifest.segments.len();
        if stale(&manifest, runs, source) {
            commit_manifest(ws, source, runs, manifest).await?;
        }
        return Ok(out);
    }
    let ctx = ws.session()?;
    let mut groups: BTreeMap<(Option<String>, String), Vec<&RunRecord>> = BTreeMap::new();
    let mut schemas: BTreeMap<String, SchemaRef> = BTreeMap::new();
    for run in small {
        let schema =
            crate::table::parquet::file_schema(&ctx, &ws.lake, &layout::bronze_data(source, &run.run_id)).await?;
        // a run written when a field could still be named like the slot column stays in its file
        if schema.column_with_name(segments::SLOT).is_some() {
            continue;
        }
        let digest = schema_digest(&schema);
        schemas.insert(digest.clone(), schema);
        groups
            .entry((run.contract_fields.as_deref().map(str::to_string), digest))
            .or_default()
            .push(run);
    }
    let mut written = Vec::new();
    for ((definition, digest), group) in groups {
        for chunk in group.chunks(RUNS_PER_SEGMENT).filter(|c| c.len() >= least) {
            let files = chunk.iter().map(|r| layout::bronze_data(source, &r.run_id)).collect();
            let runs = chunk.iter().map(|r| r.run_id.to_string()).collect();
            // each row gets its run's commit slot: a loaded run's record is superseded only by
            // its undo, so the slot stays the one the run's rows rank by while they count
            let slots = chunk.iter().map(|r| (r.run_id.clone(), r.seq as i64)).collect();
            let seg = write_segment(
                ws,
                &ctx,
                source,
                files,
                (&schemas[&digest], Some(slots)),
                (1, definition.clone(), runs),
            )
            .await?;
            out.runs += chunk.len();
            written.push(seg);
        }
    }
    manifest.segments.extend(written.iter().cloned());
    while let Some(picked) = mergeable(&manifest) {
        let inputs: Vec<Segment> = picked.iter().map(|&i| manifest.segments[i].clone()).collect();
        let first = &inputs[0];
        let schema = crate::table::parquet::file_schema(&ctx, &ws.lake, &first.file).await?;
        let runs = inputs.iter().flat_map(|s| s.runs.iter().cloned()).collect();
        let files = inputs.iter().map(|s| s.file.clone()).collect();
        let seg = write_segment(
            ws,
            &ctx,
            source,
            files,
            (&schema, None),
            (first.level + 1, first.definition.clone(), runs),
        )
        .await?;
        manifest.segments = manifest
            .segments
            .into_iter()
            .enumerate()
            .filter(|(i, _)| !picked.contains(i))
            .map(|(_, s)| s)
            .collect();
        manifest.segments.push(seg.clone());
        written.push(seg);
    }
    out.segments = written.len();
    out.live = manifest.segments.len();
    if !written.is_empty() || stale(&manifest, runs, source) {
        commit_manifest(ws, source, runs, manifest).await?;
    }
    Ok(out)
}

/// Records after a manifest's view state past which a compaction with nothing to merge writes
/// the manifest again, with the state brought up to date (a reader reads each of them).
pub const STATE_LAG: u64 = 32;

/// Is `manifest`'s view state missing while it could be written (there are segments, and every
/// one has the slot column), [`STATE_LAG`] or more slots behind `runs`, or ahead of them?
fn stale(manifest: &Manifest, runs: &[RunRecord], source: &str) -> bool {
    // a source without segments reads its runs' files through the log, as before it had any
    if manifest.segments.is_empty() || manifest.segments.iter().any(|s| !s.slotted) {
        return false;
    }
    let last = runs
        .iter()
        .filter(|r| r.source == source)
        .map(|r| r.seq)
        .max()
        .unwrap_or(0);
    // a log behind the state (restored from an older copy) voids it too
    manifest
        .state
        .as_ref()
        .map_or(last > 0, |s| last >= s.through + STATE_LAG || last < s.through)
}

/// Put `manifest` as the source's next one, with the view state of `runs` (the source's log as
/// the caller read it under the source lock) when every segment has the slot column.
async fn commit_manifest(ws: &Workspace, source: &str, runs: &[RunRecord], mut manifest: Manifest) -> Result<()> {
    let own: Vec<&RunRecord> = runs.iter().filter(|r| r.source == source).collect();
    manifest.state = None;
    if let Some(last) = own.iter().map(|r| r.seq).max()
        && !manifest.segments.is_empty()
        && manifest.segments.iter().all(|s| s.slotted)
    {
        let rel = layout::run_record(source, last);
        // the record the state is taken after: a log that no longer holds it voids the state
        let bytes = ws.lake.get(&rel).await?.ok_or_else(|| {
            Error::RunFailed(format!(
                "{rel}: the run log's last record vanished while \"{source}\" was locked"
            ))
        })?;
        let state = segments::ViewState::of(&own, &manifest.covered(), crate::hash::sha256_hex(&bytes));
        manifest.state = Some(state);
    }
    failpoint::hit("compact.before_manifest")?;
    manifest.number += 1;
    if !segments::write(&ws.lake, &manifest).await? {
        return Err(Error::Locked(format!(
            "another compaction of \"{source}\" committed manifest {} first; run the same command again",
            manifest.number
        )));
    }
    failpoint::hit("compact.after_manifest")?;
    segments::prune_manifests(&ws.lake, source, manifest.number.saturating_sub(1)).await
}

/// The oldest [`FANOUT`] segments of one level, fields and schema whose merge stays within
/// [`MAX_SEGMENT_ROWS`], by their positions in the manifest.
fn mergeable(manifest: &Manifest) -> Option<Vec<usize>> {
    let mut tiers: BTreeMap<(u32, Option<&str>, &str, bool), Vec<usize>> = BTreeMap::new();
    for (i, s) in manifest.segments.iter().enumerate() {
        tiers
            .entry((s.level, s.definition.as_deref(), s.schema.as_str(), s.slotted))
            .or_default()
            .push(i);
    }
    tiers.into_values().find_map(|members| {
        let picked: Vec<usize> = members.into_iter().take(FANOUT).collect();
        let rows: u64 = picked.iter().map(|&i| manifest.segments[i].rows).sum();
        (picked.len() == FANOUT && rows <= MAX_SEGMENT_ROWS).then_some(picked)
    })
}

/// `schema` less a segment's slot column.
fn without_slot(schema: &SchemaRef) -> SchemaRef {
    match schema.index_of(segments::SLOT) {
        Ok(i) => {
            let mut b = datafusion::arrow::datatypes::SchemaBuilder::from(schema.as_ref());
            b.remove(i);
            std::sync::Arc::new(b.finish())
        }
        Err(_) => schema.clone(),
    }
}

/// A digest of a Parquet file's Arrow schema (fields, types, nullability, metadata).
fn schema_digest(schema: &SchemaRef) -> String {
    crate::hash::sha256_hex(format!("{:?}", schema.fields()).as_bytes())[..16].to_string()
}

/// Rows per data page of a segment ([`RunFileWriter::with_page_rows`]).
const SEGMENT_PAGE_ROWS: usize = 1024;

/// Write the rows of `files` (lake paths, all of `schema`) as one segment of `source`, with the
/// slot column from `slots` (each run's commit slot) when the files are runs, or carried over
/// when they are segments: `(level, definition, runs)` describe it.
async fn write_segment(
    ws: &Workspace,
    ctx: &SessionContext,
    source: &str,
    files: Vec<String>,
    (schema, slots): (&SchemaRef, Option<crate::engine::slots::Slots>),
    (level, definition, runs): (u32, Option<String>, Vec<String>),
) -> Result<Segment> {
    let id = ws.new_id();
    let file = segments::segment_path(source, &id);
    let urls = files.iter().map(|f| ws.lake.url(f)).collect();
    let df = ctx.read_table(crate::table::parquet::table_over(urls, schema.clone())?)?;
    // runs get the column (no run file has one: see `compact_source`); segments carry theirs over
    let (df, out_schema, slotted) = match slots {
        Some(slots) => {
            let slot_of =
                crate::engine::slots::slot_of_udf(slots).call(vec![datafusion::prelude::col("ingestion_run_id")]);
            let out = crate::table::parquet::with_field(schema, segments::slot_field());
            (df.with_column(segments::SLOT, slot_of)?, out, true)
        }
        None => (df, schema.clone(), schema.column_with_name(segments::SLOT).is_some()),
    };
    let mut stream = crate::engine::exec::stream(None, df, "compact: segment").await?;
    // pages of 1,024 rows: a point query on `_current` by a key the runs rise in decodes one page
    // of a segment, not its row group
    let mut writer = RunFileWriter::new(&ws.lake, file.clone(), out_schema).with_page_rows(SEGMENT_PAGE_ROWS);
    while let Some(batch) = stream.next().await {
        writer.write(&batch?).await?;
    }
    let (rows, stamp) = writer.finish_stamped().await?;
    let stamp = stamp.ok_or_else(|| Error::Internal(format!("{file}: the segment has no rows")))?;
    Ok(Segment {
        id,
        file,
        bytes: stamp.bytes,
        crc32: Some(stamp.crc_hex()),
        rows,
        level,
        definition,
        // the runs' schema: a merge of segments names the one its level-1 inputs did
        schema: schema_digest(&without_slot(schema)),
        runs,
        slotted,
    })
}
