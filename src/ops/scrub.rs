//! The lake's committed data files against what their commits recorded of them: size and CRC-32
//! ([`FileStamp`]) in the run record, the build manifest (`files`) and the segment manifest.
//!
//! [`check`] compares the sizes of one listing with the recorded ones, and the Parquet footer of
//! files committed before checksums; with `verify` (`ingot doctor --verify`, a scrub) it reads
//! every stamped file whole and compares its CRC-32. Each [`Damage`] names the file, its table,
//! its run or build and what to do: a silver snapshot is built again from bronze, a damaged
//! segment (a cache) removed and a bronze file derived again from its unchanged landing file, all
//! by `ingot doctor --fix` ([`repair`]); else a bronze file is undone with the runs after it,
//! their files then ingested again in order. [`damaged`] is the quick form a command runs when
//! its error came from reading a Parquet file (DataFusion's errors name none), so the error
//! names the file at fault.
//!
//! Hazard: a byte changed in place (the size kept) is found only by `--verify`.

use std::collections::BTreeMap;

use futures::StreamExt;

use crate::error::{Error, Result};
use crate::table::audit::{BuildRecord, RunRecord};
use crate::table::lake::{Lake, layout};
use crate::table::upload::FileStamp;

/// Who committed a file, for messages and fixes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Committer {
    /// A run's bronze data file or failure file.
    Run { source: String, run_id: String, data: bool },
    /// A file a silver build wrote into its folder.
    Build { table: String, build_id: String },
    /// A segment of a source's history cache.
    Segment { source: String },
    /// The records an API pull kept ([`crate::ingest::pull::layout_pull_file`]).
    Kept { source: String, run_id: String },
}

/// A committed file and what its commit recorded of it: its size and CRC-32 (none of either in
/// records written before stamps; a segment always recorded its size).
#[derive(Debug, Clone)]
pub struct Committed {
    pub rel: String,
    pub bytes: Option<u64>,
    pub crc32: Option<u32>,
    pub by: Committer,
}

impl Committed {
    fn stamped(rel: String, stamp: Option<FileStamp>, by: Committer) -> Committed {
        Committed {
            rel,
            bytes: stamp.map(|s| s.bytes),
            crc32: stamp.map(|s| s.crc32),
            by,
        }
    }
}

/// A committed file that is not what its commit recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Damage {
    pub rel: String,
    pub by: Committer,
    /// What is wrong (`is 1,024 bytes, its run committed 88,310`).
    pub what: String,
    /// What to do.
    pub fix: String,
}

impl std::fmt::Display for Damage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} ({}): damaged: {}; {}",
            self.rel,
            self.owner(),
            self.what,
            self.fix
        )
    }
}

impl Damage {
    /// `bronze.<source>, run <id>`, `silver.<table>, build <id>`, `bronze.<source>, segment`.
    pub fn owner(&self) -> String {
        match &self.by {
            Committer::Run {
                source,
                run_id,
                data: true,
            } => format!("bronze.{source}, run {run_id}"),
            Committer::Run {
                source,
                run_id,
                data: false,
            } => {
                format!("audit.row_failure_log of bronze.{source}, run {run_id}")
            }
            Committer::Build { table, build_id } => format!("silver.{table}, build {build_id}"),
            Committer::Segment { source } => format!("bronze.{source}, a segment"),
            Committer::Kept { source, run_id } => format!("the kept records of bronze.{source}, run {run_id}"),
        }
    }
}

/// Every data file the logs commit: the files of loaded and held runs, the files the current
/// build of each silver table reads (stamped by the manifest of the build that wrote each), and
/// the segments of each source in `sources`.
pub async fn committed_files(
    lake: &Lake,
    runs: &[RunRecord],
    builds: &[BuildRecord],
    sources: &[String],
) -> Result<Vec<Committed>> {
    let mut out = Vec::new();
    for r in runs.iter().filter(|r| r.keeps_files()) {
        let by = |data: bool| Committer::Run {
            source: r.source.to_string(),
            run_id: r.run_id.to_string(),
            data,
        };
        if r.rows_written() > 0 {
            out.push(Committed::stamped(
                layout::bronze_data(&r.source, &r.run_id),
                r.data_file,
                by(true),
            ));
        }
        if r.rows_failed > 0 {
            out.push(Committed::stamped(
                layout::failures(&r.run_id),
                r.failure_file,
                by(false),
            ));
        }
        if r.pull.is_some() && r.replay_of.is_none() && r.status != crate::table::audit::RunStatus::SkippedDuplicateFile
        {
            // its size is the run's `file_bytes`; its CRC-32 is gzip's own, checked by `--verify`
            out.push(Committed {
                rel: crate::ingest::pull::layout_pull_file(&r.source, &r.run_id),
                bytes: u64::try_from(r.file_bytes).ok(),
                crc32: None,
                by: Committer::Kept {
                    source: r.source.to_string(),
                    run_id: r.run_id.to_string(),
                },
            });
        }
    }
    // the files readers read of each table: those its current build names, stamped by the
    // manifest of the build that wrote each (a delta build keeps earlier builds' files)
    let tables: std::collections::BTreeSet<&str> = builds.iter().map(|b| b.table.as_str()).collect();
    let mut manifests: BTreeMap<String, BTreeMap<String, FileStamp>> = BTreeMap::new();
    for table in tables {
        let Some(current) = crate::engine::catalog::latest_build(builds, table) else {
            continue;
        };
        // a manifest that does not read is the file checks' to report
        let Ok(named) = crate::table::silver::build_files(lake, table, &current.build_id).await else {
            continue;
        };
        for rel in named {
            let Some(crate::ops::gc::Owner::Build { build_id, .. }) = crate::ops::gc::owner_of(&rel) else {
                continue;
            };
            let Some(name) = rel.strip_prefix(&format!("{}/", layout::silver_build_dir(table, &build_id))) else {
                continue;
            };
            if name.ends_with(".json") {
                continue; // the manifest and inputs digest: read by every build, not data
            }
            if !manifests.contains_key(&build_id) {
                let files = crate::table::silver::manifest(lake, table, &build_id)
                    .await
                    .map(|m| m.files);
                manifests.insert(build_id.clone(), files.unwrap_or_default());
            }
            let stamp = manifests.get(&build_id).and_then(|files| files.get(name)).copied();
            let by = Committer::Build {
                table: table.to_string(),
                build_id,
            };
            out.push(Committed::stamped(rel, stamp, by));
        }
    }
    for source in sources {
        for s in crate::table::segments::read_named(lake, source).await?.segments {
            out.push(Committed {
                crc32: s.crc32.as_deref().and_then(|c| u32::from_str_radix(c, 16).ok()),
                bytes: Some(s.bytes),
                rel: s.file,
                by: Committer::Segment { source: source.clone() },
            });
        }
    }
    Ok(out)
}

/// What to do about a damaged file of `by` (`runs`: the run log, for the runs after a damaged
/// bronze file's run).
fn fix_for(by: &Committer, runs: &[RunRecord]) -> String {
    match by {
        Committer::Build { table, .. } => {
            format!("`ingot build {table} --full` writes a new snapshot from bronze (`ingot doctor --fix` runs it)")
        }
        Committer::Segment { source } => format!(
            "remove {} (a cache of the runs' own files; `ingot doctor --fix` removes it)",
            crate::table::segments::folder(source)
        ),
        Committer::Run {
            source,
            run_id,
            data: true,
        } => format!(
            "`ingot doctor --fix` derives it again from its landing file while that file is unchanged; else {}",
            undo_advice(source, run_id, runs)
        ),
        Committer::Run { source, run_id, .. } => undo_advice(source, run_id, runs),
        Committer::Kept { source, run_id } => format!(
            "it is read only to derive the run's bronze file again, which is whole: nothing is lost; for a whole \
             copy, {}",
            undo_advice(source, run_id, runs)
        ),
    }
}

/// The runs to undo for a damaged file of run `run_id` of `source` (it and every later loaded
/// run of the source, newest first), and the files to ingest again in order.
fn undo_advice(source: &str, run_id: &str, runs: &[RunRecord]) -> String {
    let loaded: Vec<&RunRecord> = runs
        .iter()
        .filter(|r| r.source == *source && r.status.is_loaded())
        .collect();
    let from = loaded.iter().position(|r| r.run_id == *run_id);
    let (first, later) = match from {
        Some(i) => (Some(loaded[i]), &loaded[i + 1..]),
        None => (None, &loaded[..0]),
    };
    let undo: Vec<String> = later
        .iter()
        .rev()
        .chain(first.iter())
        .map(|r| r.run_id.to_string())
        .collect();
    let files: Vec<String> = first
        .iter()
        .chain(later.iter())
        .map(|r| r.file_path.to_string())
        .collect();
    if later.is_empty() && first.is_some_and(|r| r.pull.is_some()) {
        format!("`ingot undo {run_id}`, then pull again (`ingot pull {source}`)")
    } else if later.is_empty() {
        format!(
            "`ingot undo {run_id}`, then ingest its file again (`ingot ingest {source} {}`)",
            files.first().cloned().unwrap_or_default()
        )
    } else {
        format!(
            "undo it and the {} later run{} of {source}, newest first (`ingot undo` {}), then ingest their \
             files again in order ({})",
            later.len(),
            if later.len() == 1 { "" } else { "s" },
            undo.join(", "),
            files.join(", ")
        )
    }
}

/// The committed files that are not what their commits recorded. `sizes`: the size of every file
/// under the lake's data prefixes, from a listing (a missing file is left to the file checks).
/// A file with a recorded size must have it; one without a recorded CRC-32 must end in a whole
/// Parquet footer (one ranged read); with `verify`, every file with a CRC-32 is read whole.
pub async fn check(
    lake: &Lake,
    files: &[Committed],
    sizes: &BTreeMap<String, u64>,
    runs: &[RunRecord],
    verify: bool,
) -> Result<Vec<Damage>> {
    let mut out = Vec::new();
    for f in files {
        let Some(&size) = sizes.get(&f.rel) else {
            // a lost data file is the file checks' to report; nothing else knows of a kept pull
            if let Committer::Kept { .. } = f.by {
                out.push(Damage {
                    rel: f.rel.clone(),
                    by: f.by.clone(),
                    what: "it is gone".into(),
                    fix: fix_for(&f.by, runs),
                });
            }
            continue;
        };
        let committer = match &f.by {
            Committer::Run { .. } => "its run committed",
            Committer::Build { .. } => "its build wrote",
            Committer::Segment { .. } => "the segment manifest says",
            Committer::Kept { .. } => "its run recorded",
        };
        let what = match (f.bytes, f.crc32) {
            (Some(bytes), _) if bytes != size => Some(format!("it is {size} bytes, {committer} {bytes}")),
            (_, Some(want)) if verify => {
                let got = crc_of(lake, &f.rel).await?;
                (got != want).then(|| {
                    format!(
                        "its CRC-32 is {got:08x}, {committer} {want:08x} (its bytes changed after they were written)"
                    )
                })
            }
            (_, None) if matches!(f.by, Committer::Kept { .. }) => match verify {
                true => gzip_damage(lake, &f.rel).await?,
                false => None,
            },
            // recorded before checksums: at least a whole Parquet footer
            (_, None) => crate::table::parquet::check_footer(lake, &f.rel, size)
                .await
                .err()
                .map(|e| e.to_string()),
            _ => None,
        };
        if let Some(what) = what {
            out.push(Damage {
                rel: f.rel.clone(),
                by: f.by.clone(),
                what,
                fix: fix_for(&f.by, runs),
            });
        }
    }
    Ok(out)
}

/// What is wrong with a gzip file of the lake, read whole (its trailer's CRC-32 and length are
/// checked against what it decompresses to), if anything.
async fn gzip_damage(lake: &Lake, rel: &str) -> Result<Option<String>> {
    use std::io::Write as _;
    let mut gz = flate2::write::GzDecoder::new(std::io::sink());
    let mut broken = None;
    each_chunk(lake, rel, |chunk| {
        if broken.is_none()
            && let Err(e) = gz.write_all(chunk)
        {
            broken = Some(format!("it is not whole gzip ({e})"));
        }
    })
    .await?;
    Ok(broken.or_else(|| {
        gz.try_finish()
            .err()
            .map(|e| format!("it is not whole gzip ({e}): its bytes changed after they were written"))
    }))
}

/// The CRC-32 of a lake file, streamed.
pub(crate) async fn crc_of(lake: &Lake, rel: &str) -> Result<u32> {
    let mut crc = crc32fast::Hasher::new();
    each_chunk(lake, rel, |chunk| crc.update(chunk)).await?;
    Ok(crc.finalize())
}

/// Read a lake file whole, handing each chunk to `f` as it arrives.
async fn each_chunk(lake: &Lake, rel: &str, mut f: impl FnMut(&[u8])) -> Result<()> {
    use object_store::ObjectStoreExt;
    let explain = |e| crate::table::store::explain(&lake.url(rel), e);
    let mut stream = lake.store.get(&lake.path(rel)).await.map_err(explain)?.into_stream();
    while let Some(chunk) = stream.next().await {
        f(&chunk.map_err(explain)?);
    }
    Ok(())
}

/// The size of every file under the prefixes committed files live in.
pub async fn listed_sizes(lake: &Lake) -> Result<BTreeMap<String, u64>> {
    let mut out = BTreeMap::new();
    for prefix in ["bronze", "audit/row_failure_log", "silver", "_cache/segments"] {
        for meta in lake.list(prefix).await? {
            if let Some(rel) = lake.relative(&meta.location) {
                out.insert(rel, meta.size);
            }
        }
    }
    Ok(out)
}

/// The damaged committed files of the lake, found without reading them (sizes against stamps;
/// the Parquet footer of each unstamped file): what a command whose read of a Parquet file
/// failed reports, so the error names the file.
pub async fn damaged(lake: &Lake, sources: &[String]) -> Result<Vec<Damage>> {
    let runs = crate::table::audit::read_run_log(lake).await?;
    let builds = crate::table::audit::read_build_log(lake).await?;
    let files = committed_files(lake, &runs, &builds, sources).await?;
    let sizes = listed_sizes(lake).await?;
    check(lake, &files, &sizes, &runs, false).await
}

/// Does `e` come from reading a Parquet file (where DataFusion names no file)?
pub fn is_read_error(e: &Error) -> bool {
    e.chain().iter().any(|t| {
        t.contains("Parquet error")
            || t.contains("Corrupt footer")
            || t.contains("Invalid Parquet")
            || t.contains("EOF")
            || t.contains("out of range")
    })
}

/// What `ingot doctor --fix` did about a damaged file, or why it did not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Repair {
    Fixed(String),
    NotFixed(String),
}

impl std::fmt::Display for Repair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Repair::Fixed(line) => write!(f, "fixed: {line}"),
            Repair::NotFixed(line) => write!(f, "not fixed: {line}"),
        }
    }
}

/// `ingot doctor --fix` for damaged files, in this order: a damaged bronze data file is derived
/// again from its run's landing file when that file is unchanged ([`crate::ops::rederive`];
/// otherwise it is left, saying why, for the undo of [`Damage::fix`]); a source with a damaged
/// segment loses its segments (a cache: readers go back to the runs' own files, and compaction
/// writes them again); a silver table whose current snapshot has a damaged file gets a full
/// build from bronze, with the rules version of its current build (the damaged snapshot is then
/// no longer read). A damaged failure file is left for the operator. Returns a line per repair.
pub async fn repair(ws: &crate::engine::session::Workspace, verify: bool) -> Result<Vec<Repair>> {
    let lake = &ws.lake;
    let sources: Vec<String> = crate::spec::contract::ContractSet::readable(&ws.contracts_dir)
        .into_keys()
        .collect();
    let runs = crate::table::audit::read_run_log(lake).await?;
    let builds = crate::table::audit::read_build_log(lake).await?;
    let files = committed_files(lake, &runs, &builds, &sources).await?;
    let sizes = listed_sizes(lake).await?;
    let mut tables = std::collections::BTreeSet::new();
    let mut segments = std::collections::BTreeSet::new();
    let mut done = Vec::new();
    for d in check(lake, &files, &sizes, &runs, verify).await? {
        match &d.by {
            Committer::Build { table, .. } => {
                tables.insert(table.clone());
            }
            Committer::Segment { source } => {
                segments.insert(source.clone());
            }
            Committer::Run {
                source,
                run_id,
                data: true,
            } => {
                let why = match crate::ops::rederive::bronze_file(ws, source, run_id).await {
                    Ok(crate::ops::rederive::Outcome::Rederived(line)) => {
                        done.push(Repair::Fixed(line));
                        continue;
                    }
                    Ok(crate::ops::rederive::Outcome::Left(why)) => why,
                    Err(e @ Error::Failpoint(_)) => return Err(e),
                    Err(e) => format!("deriving it again failed ({e})"),
                };
                done.push(Repair::NotFixed(format!(
                    "{} ({}): not re-derived: {why}; {}",
                    d.rel,
                    d.owner(),
                    undo_advice(source, run_id, &runs)
                )));
            }
            Committer::Run { .. } | Committer::Kept { .. } => {}
        }
    }
    for source in segments {
        // under the source lock: no compaction writes the manifest meanwhile
        let holder = format!("doctor-{}", ws.new_id());
        let ttl = crate::table::lock::default_ttl();
        let lock = crate::table::lock::acquire(lake, &source, &holder, ttl, ws.lock_wait).await?;
        let folder = crate::table::segments::folder(&source);
        let removed = async {
            for meta in lake.list(&folder).await? {
                if let Some(rel) = lake.relative(&meta.location) {
                    lake.delete(&rel).await?;
                }
            }
            Ok::<_, Error>(())
        }
        .await;
        lock.release().await?;
        removed?;
        done.push(Repair::Fixed(format!(
            "removed {folder}: a segment of {source} was damaged (a cache; queries read the runs' files)"
        )));
    }
    for table in tables {
        let Some(current) = crate::engine::catalog::latest_build(&builds, &table) else {
            continue;
        };
        let opts = crate::silver::build::BuildOptions {
            full: true,
            rebuild_where: None,
            rules_version: Some(current.rules_version),
        };
        let built = crate::silver::build::build(ws, &table, &opts).await?;
        done.push(Repair::Fixed(format!(
            "silver.{table}: build {} (full, rules version {}) replaces build {}, whose snapshot had a damaged file",
            built.record.build_id, current.rules_version, current.build_id
        )));
    }
    Ok(done)
}
