//! `ingot publish <run>` and `ingot discard <run>`: decide a held run (docs/operations.md#held-runs).
//!
//! A held run committed its record with status `held`; its files are written but nothing names
//! them. Publishing commits a copy of the record with the status it would have had
//! (`succeeded` or `succeeded_with_failures`) into the source's next slot, under the source's
//! lock; discarding commits a `discarded` copy. The copy supersedes the original wherever the log
//! is read, as an undo's does, so the run takes effect at the publish, in commit order.
//!
//! Hazard: the run was classified against the source's state when it ran. Publishing is refused
//! once that state changed (a later run loaded data, a publish, an undo of an earlier run):
//! its versions and tombstones could then bring back older versions or delete re-delivered
//! records. Discard it and ingest its file again instead.

use crate::engine::session::Workspace;
use crate::error::{Error, Result};
use crate::table::audit::{RunRecord, RunStatus, commit_run_record, next_seq, read_run_log};
use crate::table::lake::layout;

/// What `ingot publish` or `ingot discard` did.
#[derive(Debug, Clone)]
pub enum Decided {
    /// The run is published now (its committed copy).
    Published(RunRecord),
    /// The run is discarded now (its committed copy).
    Discarded(RunRecord),
    /// Nothing to do, and why (decided already).
    Nothing(String),
}

impl Decided {
    /// One line for people.
    pub fn describe(&self) -> String {
        match self {
            Decided::Published(r) => format!(
                "published run {} of {} ({}): {} inserted, {} updated, {} deleted, {} failure rows now count",
                r.run_id, r.source, r.file_path, r.rows_inserted, r.rows_updated, r.rows_deleted, r.rows_failed
            ),
            Decided::Discarded(r) => format!(
                "discarded run {} of {} ({}): nothing of it was published; `ingot gc` removes its files after --grace",
                r.run_id, r.source, r.file_path
            ),
            Decided::Nothing(why) => why.clone(),
        }
    }
}

/// Publish the held run `id`.
pub async fn publish(ws: &Workspace, id: &str) -> Result<Decided> {
    decide(ws, id, true).await
}

/// Discard the held run `id`.
pub async fn discard(ws: &Workspace, id: &str) -> Result<Decided> {
    decide(ws, id, false).await
}

/// `Ok(None)` when `run` is held; otherwise what to say (nothing to do, or a refusal).
fn not_held(run: &RunRecord, publish: bool) -> Result<Option<Decided>> {
    let id = &run.run_id;
    match (run.status, publish) {
        (RunStatus::Held, _) => Ok(None),
        (RunStatus::Discarded, false) => Ok(Some(Decided::Nothing(format!(
            "run {id} of {} is already discarded: nothing to do",
            run.source
        )))),
        (RunStatus::Discarded, true) => Err(Error::Invalid(format!(
            "run {id} of {} was discarded and cannot be published; ingest its file again (`ingot ingest {} {}`, \
             with --no-hold to publish it whatever the hold gates say)",
            run.source, run.source, run.file_path
        ))),
        (s, true) if s.is_loaded() && run.held_reason.is_some() => Ok(Some(Decided::Nothing(format!(
            "run {id} of {} is already published: nothing to do",
            run.source
        )))),
        (s, false) if s.is_loaded() && run.held_reason.is_some() => Err(Error::Invalid(format!(
            "run {id} of {} was published and cannot be discarded; `ingot undo {id}` rolls it back",
            run.source
        ))),
        (s, _) => Err(Error::Invalid(format!(
            "run {id} of {} is {}, not held: only a held run can be {} (`ingot runs` shows each run's status)",
            run.source,
            s.as_str(),
            if publish { "published" } else { "discarded" }
        ))),
    }
}

/// The committed record that makes publishing `held` unsafe, if any: a later record of its source
/// that changed the state the run was checked against. A run that loaded data after it (or a
/// publish), or the undo of a run from before it; the undo of a run from after it is neutral.
fn blocker<'a>(runs: &'a [RunRecord], held: &RunRecord) -> Option<&'a RunRecord> {
    runs.iter().find(|r| {
        r.source == held.source
            && r.seq > held.seq
            && (r.status.is_loaded() || (r.status == RunStatus::RolledBack && r.started_at < held.started_at))
    })
}

async fn decide(ws: &Workspace, id: &str, publish: bool) -> Result<Decided> {
    let runs = read_run_log(&ws.lake).await?;
    let Some(run) = runs.iter().find(|r| r.run_id == id) else {
        return Err(Error::Invalid(format!(
            "no committed run has the id \"{id}\" (`ingot runs` lists them; held runs have status held)"
        )));
    };
    if let Some(done) = not_held(run, publish)? {
        return Ok(done);
    }
    let source = run.source.clone();
    let holder = format!("{}-{}", if publish { "publish" } else { "discard" }, ws.new_id());
    let lock = crate::table::lock::acquire(
        &ws.lake,
        &source,
        &holder,
        crate::table::lock::default_ttl(),
        ws.lock_wait,
    )
    .await?;
    let result = async {
        // read again under the lock: another command may have decided it since
        let runs = read_run_log(&ws.lake).await?;
        let Some(now) = runs.iter().find(|r| r.run_id == id && r.source == source) else {
            return Err(Error::RunFailed(format!("run {id} vanished from the run log")));
        };
        if let Some(done) = not_held(now, publish)? {
            return Ok(done);
        }
        let mut record = now.clone();
        if publish {
            if let Some(b) = blocker(&runs, now) {
                return Err(Error::Invalid(format!(
                    "cannot publish run {id} of {source}: run {} ({}, {}) changed the state of {source} after run {id} \
                     was checked against it, so its versions and deletions no longer apply; `ingot discard {id}` \
                     and ingest its file again, or undo the later runs first",
                    b.run_id,
                    b.status.as_str(),
                    b.file_path
                )));
            }
            check_files(ws, now).await?;
            record.status = if record.rows_failed > 0 {
                RunStatus::SucceededWithFailures
            } else {
                RunStatus::Succeeded
            };
        } else {
            record.status = RunStatus::Discarded;
        }
        let latest = runs
            .iter()
            .filter(|r| r.source == source)
            .map(|r| r.finished_at.max(r.decided_at.unwrap_or(0)))
            .max()
            .unwrap_or(0);
        record.decided_at = Some(ws.now_micros().max(latest.saturating_add(1)));
        record.seq = next_seq(&runs, &source);
        let point = if publish {
            "publish.before_commit"
        } else {
            "discard.before_commit"
        };
        // bronze's Delta table follows under the source's contract, when it has a readable one
        let contract = crate::spec::contract::ContractSet::load_one(&ws.contracts_dir, &source).ok();
        commit_run_record(&ws.lake, &record, Some(now), point, contract.as_deref()).await?;
        Ok(if publish {
            Decided::Published(record)
        } else {
            Decided::Discarded(record)
        })
    }
    .await;
    lock.release().await?;
    result
}

/// A held run's files must still be there to be published.
async fn check_files(ws: &Workspace, run: &RunRecord) -> Result<()> {
    let mut needed = Vec::new();
    if run.rows_written() > 0 {
        needed.push(layout::bronze_data(&run.source, &run.run_id));
    }
    if run.rows_failed > 0 {
        needed.push(layout::failures(&run.run_id));
    }
    for rel in needed {
        if !ws.lake.exists(&rel).await? {
            return Err(Error::RunFailed(format!(
                "cannot publish run {}: its file {rel} is gone; `ingot discard {}` and ingest its file again",
                run.run_id, run.run_id
            )));
        }
    }
    Ok(())
}
