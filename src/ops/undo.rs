//! `ingot undo <id>`: roll back one committed ingestion run or one silver build (docs/operations.md).
//!
//! An undo commits a copy of the run's (or build's) log record with status `rolled_back` into the
//! next slot of its log, under the source's lock (a run) or the table's (a build, which also
//! names the build it restores, so gc keeps it), with the create-if-absent put of every commit:
//! logs stay append-only and the copy supersedes the original wherever the log is read. Nothing
//! is deleted (the files stay until `ingot gc`); undoing twice is a no-op that says so.
//!
//! Hazards: around a rekey, undo refuses what would mix natural-key versions; an undo removes
//! exactly the rows the run *wrote*, so a record a later run re-delivered unchanged goes with
//! it. [`undo_run`] and [`undo_build`] say what each undo changes.

use crate::engine::session::Workspace;
use crate::error::{Error, Result};
use crate::table::audit::{
    BuildRecord, BuildStatus, RunRecord, RunStatus, commit_build_record, commit_run_record, next_seq, read_build_log,
    read_run_log,
};

/// What `ingot undo` did.
#[derive(Debug, Clone)]
pub enum Undone {
    /// The run is rolled back now (the committed `rolled_back` record).
    Run(RunRecord),
    /// The build is rolled back now; the table's snapshot is that of `restored` (none: empty).
    Build {
        record: BuildRecord,
        restored: Option<BuildRecord>,
    },
    /// The decision on a conflict is withdrawn (the committed copy): the conflict is open again
    /// at the next build.
    Decision(crate::table::decisions::DecisionRecord),
    /// Nothing to do, and why (already rolled back, or it published nothing).
    Nothing(String),
}

impl Undone {
    /// One line for people.
    pub fn describe(&self) -> String {
        match self {
            Undone::Run(r) if r.rows_deleted > 0 => format!(
                "rolled back run {} of {} ({}): {} inserted and {} updated records no longer count, {} deleted records \
                 are back, {} failure rows hidden",
                r.run_id, r.source, r.file_path, r.rows_inserted, r.rows_updated, r.rows_deleted, r.rows_failed
            ),
            Undone::Run(r) => format!(
                "rolled back run {} of {} ({}): {} inserted and {} updated records no longer count, {} failure rows hidden",
                r.run_id, r.source, r.file_path, r.rows_inserted, r.rows_updated, r.rows_failed
            ),
            Undone::Build { record, restored } => match restored {
                Some(p) => format!(
                    "rolled back build {} of silver.{}: silver.{} is the snapshot of build {} again",
                    record.build_id, record.table, record.table, p.build_id
                ),
                None => format!(
                    "rolled back build {} of silver.{}: it was the first build, silver.{} is empty until the next build",
                    record.build_id, record.table, record.table
                ),
            },
            Undone::Decision(d) => format!(
                "withdrew decision {} on silver.{} (record {}, field {}: take {}); the next `ingot build {}` \
                 opens the conflict again",
                d.decision_id, d.table, d.fingerprint, d.field, d.take, d.table
            ),
            Undone::Nothing(why) => why.clone(),
        }
    }
}

/// Undo the run or build `id` (see the module documentation).
pub async fn undo(ws: &Workspace, id: &str) -> Result<Undone> {
    let runs = read_run_log(&ws.lake).await?;
    if let Some(run) = runs.iter().find(|r| r.run_id == id) {
        return undo_run(ws, run.clone()).await;
    }
    let builds = read_build_log(&ws.lake).await?;
    if let Some(b) = builds.iter().find(|b| b.build_id == id) {
        return undo_build(ws, &builds, b.clone()).await;
    }
    match crate::ops::resolve::withdraw(ws, id).await? {
        Some(Ok(d)) => return Ok(Undone::Decision(d)),
        Some(Err(why)) => return Ok(Undone::Nothing(why)),
        None => {}
    }
    Err(Error::Invalid(format!(
        "no committed run, build or conflict decision has the id \"{id}\" (`ingot runs` lists runs; builds are \
         in audit.silver_build_log, decisions in audit.source_conflict_decision_log)"
    )))
}

fn nothing_for_run(run: &RunRecord) -> Option<Undone> {
    match run.status {
        RunStatus::RolledBack => Some(Undone::Nothing(format!(
            "run {} of {} is already rolled back: nothing to do",
            run.run_id, run.source
        ))),
        RunStatus::Failed | RunStatus::SkippedDuplicateFile | RunStatus::Discarded => Some(Undone::Nothing(format!(
            "run {} of {} is {}: it loaded nothing, so there is nothing to undo",
            run.run_id,
            run.source,
            run.status.as_str()
        ))),
        RunStatus::Succeeded | RunStatus::SucceededWithFailures | RunStatus::Held => None,
    }
}

/// A held run published nothing, so there is nothing to undo: `ingot discard` drops it.
fn refuse_held(run: &RunRecord) -> Result<()> {
    if run.status != RunStatus::Held {
        return Ok(());
    }
    Err(Error::Invalid(format!(
        "run {} of {} is held: nothing of it was published, so there is nothing to undo; `ingot discard {}` drops \
         it, `ingot publish {}` publishes it",
        run.run_id, run.source, run.run_id, run.run_id
    )))
}

/// Undoing run `R` of source `S` commits a copy of `R`'s run-log record with status
/// `rolled_back` (and `rolled_back_at` set) into `S`'s next slot, with the same create-if-absent
/// put that commits an ingest, under `S`'s ingest lock. Logs are append-only: the copy
/// supersedes the original record wherever the log is read ([`crate::table::audit::read_run_log`]
/// keeps the highest slot of each run id). From that put on, `R`'s bronze data file and its
/// failure file are no longer named by a loaded run, so:
///
/// * records `R` inserted disappear from `bronze.<S>` and `bronze.<S>_current`;
/// * records `R` updated return to their previous version (the window behind `_current` picks
///   the newest remaining version); records that a later run updated again keep that later
///   version;
/// * `R`'s failure rows disappear from `audit.row_failure_log`;
/// * the next incremental silver build removes or reverts the rows concerned (records no longer
///   current, or whose current version changed, are processed again);
/// * re-ingesting the same file with `ingot ingest` loads it again (a rolled-back run does not
///   count for the duplicate-file skip), but the nightly job (`ingot run`) does not pick it up
///   again by itself: a file you undid stays undone until you ingest it on purpose.
///
/// The files stay where they are until `ingot gc` removes them, so nothing is lost by the undo
/// itself. Undoing a rolled-back run is a no-op that says so; a run that loaded nothing (failed,
/// skipped duplicate) has nothing to undo.
///
/// A run of a `delivery: full` file also wrote tombstones for the records the file lacked: they
/// stop counting with the rest of its file, so those records are current again (the message
/// says how many). Around a re-key (see [`crate::ops::rekey`]) undo refuses what would mix natural-key
/// versions: a rekey run while runs after it exist, and a run from before a rekey that still
/// counts.
///
/// Caveat, by construction: an undo removes exactly the rows the run *wrote*. A record a later
/// run delivered again unchanged was not written by that later run (it was `unchanged`), so
/// undoing the run that first wrote it removes it even though the later file also had it.
async fn undo_run(ws: &Workspace, run: RunRecord) -> Result<Undone> {
    refuse_held(&run)?;
    if let Some(n) = nothing_for_run(&run) {
        return Ok(n);
    }
    let holder = format!("undo-{}", ws.new_id());
    let lock = crate::table::lock::acquire(
        &ws.lake,
        &run.source,
        &holder,
        crate::table::lock::default_ttl(),
        ws.lock_wait,
    )
    .await?;
    let result = async {
        crate::table::failpoint::hit("undo.after_lock")?;
        // Read again under the lock: another undo may have committed since.
        let runs = read_run_log(&ws.lake).await?;
        let Some(now) = runs.iter().find(|r| r.run_id == run.run_id && r.source == run.source) else {
            return Err(Error::RunFailed(format!(
                "run {} vanished from the run log",
                run.run_id
            )));
        };
        refuse_held(now)?;
        if let Some(n) = nothing_for_run(now) {
            return Ok(n);
        }
        if let Some(why) = crate::ops::rekey::undo_blocker(&runs, now) {
            return Err(Error::Invalid(why));
        }
        let mut record = now.clone();
        record.status = RunStatus::RolledBack;
        record.rolled_back_at = Some(ws.now_micros().max(record.finished_at.saturating_add(1)));
        record.seq = next_seq(&runs, &run.source);
        // bronze's Delta table follows under the source's contract, when it has a readable one
        let contract = crate::spec::contract::ContractSet::load_one(&ws.contracts_dir, &run.source).ok();
        commit_run_record(&ws.lake, &record, Some(now), "undo.before_commit", contract.as_deref()).await?;
        crate::table::failpoint::hit("undo.after_commit")?;
        Ok(Undone::Run(record))
    }
    .await;
    lock.release().await?;
    result
}

/// Undoing build `B` of table `T` commits a copy of `B`'s build-log record with status
/// `rolled_back` into `T`'s next slot. `silver.<T>` is the snapshot of the latest succeeded
/// build, so it is the previous snapshot again (or empty when `B` was the first), atomically;
/// the next incremental build starts from that snapshot's state. Only the latest succeeded build
/// of a table can be undone (undo the later ones first). A rolled-back build no longer pins its
/// rules version's SHA-256. The undo holds `T`'s lock, naming the build it returns to (so gc
/// keeps that snapshot), reads the build log again under it, and checks right before its commit
/// that every file of the snapshot it restores is still there.
async fn undo_build(ws: &Workspace, builds: &[BuildRecord], build: BuildRecord) -> Result<Undone> {
    if let Some(n) = nothing_for_build(&build) {
        return Ok(n);
    }
    let restores = restored_build(builds, &build)?.map(|p| p.build_id);
    let holder = format!("undo-{}", ws.new_id());
    let scope = crate::table::lock::Scope::Table(&build.table);
    let ttl = crate::table::lock::default_ttl();
    let lock = crate::table::lock::acquire_for(
        &ws.lake,
        scope,
        &holder,
        restores.into_iter().collect(),
        ttl,
        ws.lock_wait,
    )
    .await?;
    let result = undo_build_locked(ws, &build).await;
    lock.release().await?;
    result
}

/// [`undo_build`] under the table's lock.
async fn undo_build_locked(ws: &Workspace, build: &BuildRecord) -> Result<Undone> {
    // Read again under the lock: another undo or a build may have committed since.
    let builds = read_build_log(&ws.lake).await?;
    let Some(build) = builds.iter().find(|b| b.build_id == build.build_id) else {
        return Err(Error::RunFailed(format!(
            "build {} vanished from the build log",
            build.build_id
        )));
    };
    if let Some(n) = nothing_for_build(build) {
        return Ok(n);
    }
    let restored = restored_build(&builds, build)?;
    crate::table::failpoint::hit("undo.after_lock")?;
    if let Some(p) = &restored {
        // the snapshot to return to must still be there (gc removes snapshots past retention)
        for rel in crate::silver::build::build_files(&ws.lake, &p.table, &p.build_id).await? {
            if !ws.lake.exists(&rel).await? {
                return Err(Error::Invalid(format!(
                    "cannot undo build {}: the snapshot of build {} it would return to is gone ({} was removed, \
                     e.g. by `ingot gc`); nothing was undone; rebuild with `ingot build {} --full` instead",
                    build.build_id,
                    p.build_id,
                    ws.lake.url(&rel),
                    build.table
                )));
            }
        }
    }
    let ours: Vec<&BuildRecord> = builds.iter().filter(|b| b.table == build.table).collect();
    let mut record = build.clone();
    record.status = BuildStatus::RolledBack;
    // after every record of the table, so `--as-of` sees the undo after what it undid
    let latest = ours
        .iter()
        .map(|b| b.finished_at.max(b.rolled_back_at.unwrap_or(0)))
        .max()
        .unwrap_or(0);
    record.rolled_back_at = Some(ws.now_micros().max(latest.saturating_add(1)));
    record.seq = ours.iter().map(|b| b.seq).max().unwrap_or(0) + 1;
    commit_build_record(&ws.lake, &record, Some(build), "undo.before_commit").await?;
    crate::table::failpoint::hit("undo.after_commit")?;
    Ok(Undone::Build { record, restored })
}

fn nothing_for_build(build: &BuildRecord) -> Option<Undone> {
    match build.status {
        BuildStatus::RolledBack => Some(Undone::Nothing(format!(
            "build {} of silver.{} is already rolled back: nothing to do",
            build.build_id, build.table
        ))),
        BuildStatus::Failed => Some(Undone::Nothing(format!(
            "build {} of silver.{} failed and published nothing: nothing to undo",
            build.build_id, build.table
        ))),
        BuildStatus::Succeeded => None,
    }
}

/// The build whose snapshot undoing `build` returns its table to (none: the table becomes
/// empty), or an error when `build` is not the table's latest succeeded build.
fn restored_build(builds: &[BuildRecord], build: &BuildRecord) -> Result<Option<BuildRecord>> {
    let ours: Vec<&BuildRecord> = builds.iter().filter(|b| b.table == build.table).collect();
    let succeeded = |b: &&&BuildRecord| b.status == BuildStatus::Succeeded;
    if let Some(later) = ours
        .iter()
        .filter(succeeded)
        .filter(|b| b.seq > build.seq)
        .max_by_key(|b| b.seq)
    {
        return Err(Error::Invalid(format!(
            "build {} is not the latest build of silver.{}: build {} came after it; undo the later builds first \
             (latest first)",
            build.build_id, build.table, later.build_id
        )));
    }
    Ok(ours
        .iter()
        .filter(succeeded)
        .filter(|b| b.seq < build.seq)
        .max_by_key(|b| b.seq)
        .map(|b| (*b).clone()))
}
