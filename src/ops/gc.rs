//! `ingot gc [--dry-run]`: remove files nothing reads any more, never a committed, current one.
//!
//! Every data file of the lake is scoped by the run or build that wrote it (see
//! [`crate::table::lake`]), so whether a file may go follows from the audit logs alone; the
//! table of what is kept and removed is in docs/operations.md#gc. In short: files of runs and
//! builds that never committed, failed or were undone go after the grace period, older snapshots
//! after the retention, superseded caches (`_cache/log`, `_cache/keys`, segment manifests) at once
//! and segments no kept manifest names after the grace period.
//!
//! The logs and anything gc does not recognise are never touched. gc lists files, then
//! reads the live locks ([`crate::table::lock::live_holds`]), then the logs; it decides and deletes
//! a table's snapshots holding the table's lock, so no undo can restore one meanwhile. The grace
//! period guards writers whose lock was lost (default 24 hours). Deleting is idempotent, so a
//! crash during gc is repaired by running it again; `…#<n>` staging leftovers go after the grace.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use object_store::ObjectMeta;

use crate::engine::catalog::latest_build;
use crate::error::{Error, Result};
use crate::table::audit::{BuildRecord, BuildStatus, RunRecord, RunStatus, read_build_log, read_run_log};
use crate::table::lake::Lake;
use crate::table::lock::{GC_HOLDER, Scope, acquire_for, default_ttl};

#[derive(Debug, Clone)]
pub struct GcOptions {
    /// Only report what would be removed.
    pub dry_run: bool,
    /// Files of uncommitted, failed or rolled-back runs and builds must be at least this old.
    pub grace: Duration,
    /// Succeeded builds other than the latest are kept this long after they finished.
    pub retain: Duration,
    /// How long to wait for a table's lock before keeping its snapshots for now (`--wait`).
    pub wait: Duration,
}

impl Default for GcOptions {
    fn default() -> Self {
        GcOptions {
            dry_run: false,
            grace: Duration::from_secs(24 * 3600),
            retain: Duration::from_secs(7 * 24 * 3600),
            wait: crate::table::lock::DEFAULT_WAIT,
        }
    }
}

/// One file gc removed (or would remove).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Removal {
    /// Path relative to the lake root.
    pub path: String,
    pub bytes: u64,
    /// Why: `uncommitted run`, `rolled-back build`, `snapshot past retention`, ...
    pub reason: String,
}

#[derive(Debug, Clone, Default)]
pub struct GcReport {
    pub removed: Vec<Removal>,
    /// Files that would go but are younger than the grace period.
    pub in_grace: usize,
    /// Files of runs and builds a live writer holds (in progress, or about to be restored).
    pub in_use: usize,
    /// Tables whose snapshots were not collected, and why (a build or undo held the table).
    pub skipped: Vec<String>,
    pub dry_run: bool,
}

/// Who wrote a file, from its path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Owner {
    Run(String),
    Build { table: Option<String>, build_id: String },
}

/// The run or build a data file belongs to, or `None` for anything else (logs, locks, unknown).
pub fn owner_of(rel: &str) -> Option<Owner> {
    let parts: Vec<&str> = rel.split('/').collect();
    match parts.as_slice() {
        ["bronze", _source, dir, _file] => dir.strip_prefix("run_id=").map(|id| Owner::Run(id.to_string())),
        // a run's conformed copy, published in its source's Delta table (crate::table::delta::conform)
        ["bronze", source, ..] => {
            crate::table::delta::conform::copy_of(rel.strip_prefix(&format!("bronze/{source}/"))?)
                .map(|(id, _)| Owner::Run(id.to_string()))
        }
        ["audit", "row_failure_log", dir, _file] => {
            if let Some(id) = dir.strip_prefix("run_id=") {
                Some(Owner::Run(id.to_string()))
            } else {
                dir.strip_prefix("build_id=").map(|id| Owner::Build {
                    table: None,
                    build_id: id.to_string(),
                })
            }
        }
        ["_cache", "row_hash", _source, _layout, file] => file
            .strip_suffix(".parquet")
            .and_then(|f| f.strip_prefix("run_id="))
            .map(|id| Owner::Run(id.to_string())),
        ["silver", table, dir, _file] => dir.strip_prefix("build_id=").map(|id| Owner::Build {
            table: Some(table.to_string()),
            build_id: id.to_string(),
        }),
        _ => None,
    }
}

/// What the logs say about a run's or build's files: keep them, or the reason they may go and
/// the moment from which the grace period counts (`None`: the file's own age).
enum Verdict {
    Keep,
    Remove(&'static str, Option<i64>),
}

fn run_verdict(run: Option<&RunRecord>) -> Verdict {
    match run {
        None => Verdict::Remove("uncommitted run", None),
        Some(r) => match r.status {
            // a held run's files wait for `ingot publish` or `ingot discard`
            RunStatus::Succeeded | RunStatus::SucceededWithFailures | RunStatus::Held => Verdict::Keep,
            RunStatus::RolledBack => Verdict::Remove("rolled-back run", r.rolled_back_at),
            RunStatus::Discarded => Verdict::Remove("discarded run", r.decided_at),
            RunStatus::Failed | RunStatus::SkippedDuplicateFile => Verdict::Remove("run that published nothing", None),
        },
    }
}

fn build_verdict(
    build: Option<&BuildRecord>,
    snapshot: bool,
    latest: &HashMap<String, String>,
    now: i64,
    retain: Duration,
) -> Verdict {
    match build {
        None => Verdict::Remove("uncommitted build", None),
        Some(b) => match b.status {
            BuildStatus::Failed => Verdict::Remove("failed build", None),
            BuildStatus::RolledBack => Verdict::Remove("rolled-back build", b.rolled_back_at),
            BuildStatus::Succeeded => {
                // a succeeded build's rejections are audit history: only snapshots retire
                if !snapshot
                    || latest.get(&b.table) == Some(&b.build_id)
                    || now - b.finished_at < retain.as_micros() as i64
                {
                    Verdict::Keep
                } else {
                    Verdict::Remove("snapshot past retention", None)
                }
            }
        },
    }
}

/// A data file gc listed, and whose it is.
struct Listed {
    rel: String,
    meta: ObjectMeta,
    owner: Owner,
}

impl Owner {
    /// The run or build id.
    fn id(&self) -> &str {
        match self {
            Owner::Run(id) => id,
            Owner::Build { build_id, .. } => build_id,
        }
    }
}

/// The key of the conformed copies each bronze Delta table is published under, read once per
/// source ([`crate::table::delta::log::Fold::conformed_to`]).
#[derive(Default)]
struct PublishedCopies(HashMap<String, Option<Option<String>>>);

impl PublishedCopies {
    /// Is `rel` anything but a conformed copy under another key than its table's (a table
    /// whose log does not read keeps its copies)?
    async fn current(&mut self, lake: &Lake, rel: &str) -> bool {
        let Some((source, inside)) = rel.strip_prefix("bronze/").and_then(|r| r.split_once('/')) else {
            return true;
        };
        let Some((_, key)) = crate::table::delta::conform::copy_of(inside) else {
            return true;
        };
        if !self.0.contains_key(source) {
            let root = crate::table::delta::roots::bronze(source);
            let fold = crate::table::delta::log::fold(crate::table::delta::log::Table::new(lake, &root)).await;
            let table = match fold {
                Ok(Some(f)) => Some(f.conformed_to().map(str::to_string)),
                _ => None,
            };
            self.0.insert(source.to_string(), table);
        }
        match &self.0[source] {
            Some(has) => has.as_deref() == Some(key),
            None => true,
        }
    }
}

/// Remove (or with `dry_run` list) what nothing reads any more; see the module documentation.
///
/// The order makes it safe beside running writers: the files are listed first, then the live
/// locks are read, then the logs. A writer whose files were listed either still held its lock
/// (its runs and builds are kept) or had committed before the logs were read. Snapshots, which
/// an undo can make current again, are decided and deleted table by table under the table's
/// lock, with the build log read again under it.
///
/// `contracts`: the sources' contracts, which bronze's Delta tables are published under (see
/// [`crate::table::delta::conform`]); conformed copies of runs gc keeps go too once their table
/// is published under another contract.
pub async fn gc(lake: &Lake, opts: &GcOptions, contracts: &crate::table::delta::Contracts) -> Result<GcReport> {
    // a Delta table that lags may still name files the logs let go: bring it up to date first
    if crate::table::delta::enabled()
        && !opts.dry_run
        && let Err(e) = crate::table::delta::sync(lake, crate::table::delta::Mode::DeletionVectors, contracts).await
    {
        crate::table::delta::warn("before gc", &e);
    }
    let mut listed = Vec::new();
    for prefix in ["bronze", "audit/row_failure_log", "silver", "_cache/row_hash"] {
        for meta in lake.list(prefix).await? {
            let Some(rel) = lake.relative(&meta.location) else {
                continue;
            };
            if let Some(owner) = owner_of(&rel) {
                listed.push(Listed { rel, meta, owner });
            }
        }
    }
    let held = crate::table::lock::live_holds(lake).await?;
    let runs: BTreeMap<String, RunRecord> = read_run_log(lake)
        .await?
        .into_iter()
        .map(|r| (r.run_id.to_string(), r))
        .collect();
    let builds_all = read_build_log(lake).await?;
    // the system clock, not the workspace's: grace periods compare it with the store's
    // modification times
    let now = chrono::Utc::now().timestamp_micros();
    let mut report = GcReport {
        dry_run: opts.dry_run,
        ..Default::default()
    };
    let mut snapshots: BTreeMap<String, Vec<Listed>> = BTreeMap::new();
    let mut published = PublishedCopies::default();
    {
        let latest = latest_builds(&builds_all);
        let builds = by_id(&builds_all);
        for f in listed {
            if held.contains(f.owner.id()) {
                report.in_use += 1;
                continue;
            }
            let verdict = match &f.owner {
                Owner::Run(id) => match run_verdict(runs.get(id)) {
                    Verdict::Keep if !published.current(lake, &f.rel).await => {
                        Verdict::Remove("conformed copy of an earlier contract", None)
                    }
                    v => v,
                },
                Owner::Build { table: Some(table), .. } => {
                    snapshots.entry(table.clone()).or_default().push(f);
                    continue;
                }
                Owner::Build { table: None, build_id } => {
                    build_verdict(builds.get(build_id).copied(), false, &latest, now, opts.retain)
                }
            };
            remove_if(lake, f, verdict, now, opts, &mut report).await?;
        }
        // a table none of whose snapshot files the logs let go now needs no lock
        snapshots.retain(|_, files| {
            files.iter().any(|f| {
                let b = builds.get(f.owner.id()).copied();
                due(&build_verdict(b, true, &latest, now, opts.retain), f, now, opts).is_some()
            })
        });
    }
    let gc_id = format!("{GC_HOLDER}{}", uuid::Uuid::now_v7());
    for (table, files) in snapshots {
        let lock = match acquire_for(lake, Scope::Table(&table), &gc_id, Vec::new(), default_ttl(), opts.wait).await {
            Ok(lock) => lock,
            Err(Error::Locked(why)) => {
                report.skipped.push(format!("silver.{table} kept for now: {why}"));
                continue;
            }
            Err(e) => return Err(e),
        };
        let done = snapshots_of(lake, &table, files, now, opts, &mut report).await;
        lock.release().await?;
        done?;
    }
    superseded_caches(lake, opts, &mut report).await?;
    unused_segments(lake, now, opts, &mut report).await?;
    if let Some(root) = lake.root_dir() {
        remove_staging_leftovers(root, now, opts.grace.as_micros() as i64, &mut report)?;
    }
    if let Some(uploads) = &lake.uploads {
        abort_stale_uploads(lake, uploads, now, opts, &mut report).await?;
    }
    if crate::table::delta::enabled() && !opts.dry_run {
        note_vacuum(lake, &report).await;
    }
    Ok(report)
}

/// One `VACUUM END` commit in each Delta table gc removed files of (files only older versions
/// named: reading those versions fails from now on, as after Delta's own vacuum).
async fn note_vacuum(lake: &Lake, report: &GcReport) {
    let mut per_table: BTreeMap<String, usize> = BTreeMap::new();
    for r in &report.removed {
        let parts: Vec<&str> = r.path.split('/').collect();
        let root = match parts.as_slice() {
            ["bronze" | "silver", name, _, ..] => format!("{}/{name}", parts[0]),
            ["audit", "row_failure_log", _, ..] => crate::table::delta::roots::FAILURE_LOG.to_string(),
            _ => continue,
        };
        if parts[0] == "bronze" {
            // the source's current versions name some of the same files
            *per_table
                .entry(format!("{root}/{}", crate::table::delta::current::CURRENT))
                .or_default() += 1;
        }
        *per_table.entry(root).or_default() += 1;
    }
    for (root, files) in per_table {
        let info = HashMap::from([("ingot".to_string(), serde_json::json!({"gc": {"files_removed": files}}))]);
        let op = deltalake_core::protocol::DeltaOperation::VacuumEnd {
            status: "COMPLETED".to_string(),
        };
        let t = crate::table::delta::log::Table::new(lake, &root);
        if let Err(e) = crate::table::delta::log::note(t, op, info).await {
            crate::table::delta::warn(&format!("{root} after gc"), &e);
        }
    }
}

/// How many of the newest log checkpoints and key states of each folder gc keeps.
const CACHES_KEPT: usize = 2;

/// Remove the log checkpoints (`_cache/log/<log>/<name>/`) and key states
/// (`_cache/keys/<source>/<layout>/`) of each folder but the [`CACHES_KEPT`] newest (their names
/// sort by the slot they were taken after). They are caches: a reader that meets a removed one
/// folds more records instead, so no grace period applies.
async fn superseded_caches(lake: &Lake, opts: &GcOptions, report: &mut GcReport) -> Result<()> {
    for (prefix, what) in [
        ("_cache/log", "superseded log checkpoint"),
        ("_cache/keys", "superseded key state"),
    ] {
        let mut folders: BTreeMap<String, Vec<(String, u64)>> = BTreeMap::new();
        for meta in lake.list(prefix).await? {
            let Some(rel) = lake.relative(&meta.location) else {
                continue;
            };
            let Some((folder, name)) = rel.rsplit_once('/') else {
                continue;
            };
            if name.ends_with(".parquet") && name.starts_with(|c: char| c.is_ascii_digit()) {
                folders.entry(folder.to_string()).or_default().push((rel, meta.size));
            }
        }
        for (_, mut files) in folders {
            files.sort();
            let old = files.len().saturating_sub(CACHES_KEPT);
            for (rel, bytes) in files.into_iter().take(old) {
                remove_cache(lake, rel, bytes, what, opts, report).await?;
            }
        }
    }
    Ok(())
}

/// Remove (or with `--dry-run` only report) one cache file.
async fn remove_cache(
    lake: &Lake,
    rel: String,
    bytes: u64,
    reason: &str,
    opts: &GcOptions,
    report: &mut GcReport,
) -> Result<()> {
    if !opts.dry_run {
        lake.delete(&rel).await?;
    }
    report.removed.push(Removal {
        path: rel,
        bytes,
        reason: reason.to_string(),
    });
    Ok(())
}

/// Remove each source's segment manifests but the [`CACHES_KEPT`] newest, and the segment files
/// none of those names once older than the grace period (a compaction writes its segments
/// before the manifest that names them). A reader that meets a removed one reads the runs' own
/// files instead.
async fn unused_segments(lake: &Lake, now: i64, opts: &GcOptions, report: &mut GcReport) -> Result<()> {
    use crate::table::segments::{Manifest, manifest_number};
    let mut folders: BTreeMap<String, Vec<(String, ObjectMeta)>> = BTreeMap::new();
    for meta in lake.list("_cache/segments").await? {
        let Some(rel) = lake.relative(&meta.location) else {
            continue;
        };
        // by source: `_cache/segments/<source>/` (manifests) and its `files/` (segments)
        if let Some(source) = rel.split('/').nth(2) {
            folders.entry(source.to_string()).or_default().push((rel.clone(), meta));
        }
    }
    'sources: for (_, files) in folders {
        let mut manifests: Vec<(u64, &String, &ObjectMeta)> = files
            .iter()
            .filter_map(|(rel, m)| Some((manifest_number(rel.rsplit('/').next()?)?, rel, m)))
            .collect();
        manifests.sort_by_key(|(n, _, _)| *n);
        let old = manifests.len().saturating_sub(CACHES_KEPT);
        let mut named = BTreeSet::new();
        for (_, rel, _) in &manifests[old..] {
            match lake.get(rel).await?.map(|b| serde_json::from_slice::<Manifest>(&b)) {
                Some(Ok(m)) => named.extend(m.segments.into_iter().map(|s| s.file)),
                // a manifest gc cannot read may name anything: keep the source's segments
                _ => continue 'sources,
            }
        }
        let doomed = manifests[..old]
            .iter()
            .map(|(_, rel, m)| ((*rel).clone(), m.size, "superseded segment manifest"))
            .chain(files.iter().filter_map(|(rel, m)| {
                let unnamed = rel.ends_with(".parquet") && !named.contains(rel);
                let aged = now - m.last_modified.timestamp_micros() >= opts.grace.as_micros() as i64;
                (unnamed && aged).then(|| (rel.clone(), m.size, "segment no manifest names"))
            }))
            .collect::<Vec<_>>();
        for (rel, bytes, reason) in doomed {
            remove_cache(lake, rel, bytes, reason, opts, report).await?;
        }
    }
    Ok(())
}

/// Abort the incomplete multipart uploads under the lake's prefix (writes killed on S3, which
/// leave no object but keep their parts, and their cost, until aborted) once older than the
/// grace period: a write in progress completes its upload well within it.
async fn abort_stale_uploads(
    lake: &Lake,
    uploads: &crate::table::store::Uploads,
    now: i64,
    opts: &GcOptions,
    report: &mut GcReport,
) -> Result<()> {
    let root = lake.path("");
    let prefix = match root.as_ref() {
        "" => String::new(),
        r => format!("{r}/"),
    };
    for u in uploads.list(&prefix).await? {
        if now - u.initiated.timestamp_micros() < opts.grace.as_micros() as i64 {
            report.in_grace += 1;
            continue;
        }
        if !opts.dry_run {
            uploads.abort(&u.key, &u.id).await?;
        }
        let path = u.key.strip_prefix(&prefix).unwrap_or(&u.key).to_string();
        report.removed.push(Removal {
            path,
            bytes: 0,
            reason: format!(
                "incomplete multipart upload {} started {}: a write that never finished",
                u.id,
                u.initiated.to_rfc3339()
            ),
        });
    }
    Ok(())
}

/// The latest succeeded build of every table.
fn latest_builds(builds: &[BuildRecord]) -> HashMap<String, String> {
    let tables: BTreeSet<&str> = builds.iter().map(|b| b.table.as_str()).collect();
    tables
        .into_iter()
        .filter_map(|t| Some((t.to_string(), latest_build(builds, t)?.build_id.clone())))
        .collect()
}

fn by_id(builds: &[BuildRecord]) -> BTreeMap<String, &BuildRecord> {
    builds.iter().map(|b| (b.build_id.clone(), b)).collect()
}

/// Decide and remove the snapshot files of `table`, under its lock: the build log is read again,
/// so an undo or build that committed since gc's first reading counts.
async fn snapshots_of(
    lake: &Lake,
    table: &str,
    files: Vec<Listed>,
    now: i64,
    opts: &GcOptions,
    report: &mut GcReport,
) -> Result<()> {
    let all = read_build_log(lake).await?;
    let ours: Vec<BuildRecord> = all.into_iter().filter(|b| b.table == table).collect();
    let latest = latest_builds(&ours);
    let builds = by_id(&ours);
    // Files the kept snapshots read (a manifest may name files of earlier builds' folders).
    let mut live: BTreeSet<String> = BTreeSet::new();
    for b in &ours {
        if matches!(build_verdict(Some(b), true, &latest, now, opts.retain), Verdict::Keep) {
            live.extend(crate::silver::build::build_files(lake, &b.table, &b.build_id).await?);
            live.extend(crate::silver::build::index_files(lake, &b.table, &b.build_id).await?);
        }
    }
    for f in files {
        if live.contains(&f.rel) {
            continue;
        }
        let verdict = build_verdict(builds.get(f.owner.id()).copied(), true, &latest, now, opts.retain);
        remove_if(lake, f, verdict, now, opts, report).await?;
    }
    Ok(())
}

/// Why `f` goes now: the verdict says remove and its grace period is over.
fn due(verdict: &Verdict, f: &Listed, now: i64, opts: &GcOptions) -> Option<&'static str> {
    let Verdict::Remove(reason, since) = verdict else {
        return None;
    };
    let since = since.unwrap_or_else(|| f.meta.last_modified.timestamp_micros());
    (now - since >= opts.grace.as_micros() as i64).then_some(*reason)
}

/// Remove `f` (or list it, in a dry run) if the verdict says so and its grace period is over.
async fn remove_if(
    lake: &Lake,
    f: Listed,
    verdict: Verdict,
    now: i64,
    opts: &GcOptions,
    report: &mut GcReport,
) -> Result<()> {
    let Verdict::Remove(..) = verdict else {
        return Ok(());
    };
    let Some(reason) = due(&verdict, &f, now, opts) else {
        report.in_grace += 1;
        return Ok(());
    };
    if !opts.dry_run {
        lake.delete(&f.rel).await?;
        if report.removed.is_empty() {
            crate::table::failpoint::hit("gc.after_first_delete")?;
        }
    }
    report.removed.push(Removal {
        path: f.rel,
        bytes: f.meta.size,
        reason: reason.to_string(),
    });
    Ok(())
}

/// Remove the staging files that killed writes left on a local lake, once older than the grace
/// period (a write still in progress renames its file well within it).
fn remove_staging_leftovers(root: &std::path::Path, now: i64, grace: i64, report: &mut GcReport) -> Result<()> {
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let entries = match std::fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(Error::io(dir.display(), e)),
        };
        for entry in entries {
            let entry = entry.map_err(|e| Error::io(dir.display(), e))?;
            let path = entry.path();
            let meta = entry.metadata().map_err(|e| Error::io(path.display(), e))?;
            if meta.is_dir() {
                stack.push(path);
                continue;
            }
            if !entry
                .file_name()
                .to_str()
                .is_some_and(crate::table::durable::is_staging_name)
            {
                continue;
            }
            let modified = meta
                .modified()
                .ok()
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map_or(now, |d| d.as_micros() as i64);
            if now - modified < grace {
                report.in_grace += 1;
                continue;
            }
            if !report.dry_run {
                std::fs::remove_file(&path).map_err(|e| Error::io(path.display(), e))?;
            }
            let rel = path.strip_prefix(root).unwrap_or(&path);
            report.removed.push(Removal {
                path: rel.display().to_string().replace('\\', "/"),
                bytes: meta.len(),
                reason: "staging file of a write that never finished".to_string(),
            });
        }
    }
    Ok(())
}

/// Parse a duration like `90s`, `30m`, `24h`, `7d` (or `0`).
pub fn parse_duration(s: &str) -> Result<Duration> {
    let t = s.trim();
    let bad = || {
        Error::Invalid(format!(
            "invalid duration \"{s}\": use a number with s, m, h or d (e.g. 30m, 24h, 7d)"
        ))
    };
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num.parse().map_err(|_| bad())?;
    let secs = match unit {
        "" if n == 0 => 0,
        "s" => n,
        "m" => n * 60,
        "h" => n * 3600,
        "d" => n * 86_400,
        _ => return Err(bad()),
    };
    Ok(Duration::from_secs(secs))
}
