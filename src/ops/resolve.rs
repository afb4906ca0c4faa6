//! `ingot resolve <table> <fingerprint> --field F --take <source>`: a person's decision on one
//! open conflict of a table fed by several sources, committed to
//! `audit.source_conflict_decision_log` (docs/operations.md#a-conflicts-life). The next build
//! takes that source's value while the conflict's candidate set is the one decided on; `ingot
//! undo <decision id>` withdraws it. A decision changes no silver row by itself.
//!
//! Invariants: the command holds the table's lock (one build or decision at a time); the
//! same decision given again (after a crash, say) commits nothing new.

use crate::engine::session::Workspace;
use crate::error::{Error, Result};
use crate::table::audit::BuildStatus;
use crate::table::conflicts::{self, ConflictRow};
use crate::table::decisions::{DecisionRecord, commit_decision, next_seq, read_decisions};
use crate::table::lock::{Scope, acquire_for, default_ttl};

/// What `ingot resolve` was asked.
#[derive(Debug, Clone)]
pub struct Decide {
    pub table: String,
    /// The record's `natural_key_fingerprint`, or a prefix of it that only one conflict has.
    pub fingerprint: String,
    pub field: String,
    pub take: String,
    pub reason: String,
    /// Who decides (default: the OS user).
    pub by: Option<String>,
}

/// The decision recorded, and whether it was new (false: the same decision was in force).
#[derive(Debug, Clone)]
pub struct Decided {
    pub record: DecisionRecord,
    pub new: bool,
    pub conflict: ConflictRow,
}

/// Who runs the command: `$USER` (or `%USERNAME%`), else `unknown`.
pub fn os_user() -> String {
    ["USER", "USERNAME", "LOGNAME"]
        .iter()
        .find_map(|v| std::env::var(v).ok().filter(|s| !s.trim().is_empty()))
        .unwrap_or_else(|| "unknown".into())
}

/// Record the decision (see the module documentation).
pub async fn resolve(ws: &Workspace, d: &Decide) -> Result<Decided> {
    if d.reason.trim().is_empty() {
        return Err(Error::Invalid(
            "--reason must say why (it is kept with the decision in audit.source_conflict_decision_log)".into(),
        ));
    }
    let id = ws.new_id();
    let lock = acquire_for(
        &ws.lake,
        Scope::Table(&d.table),
        &id,
        Vec::new(),
        default_ttl(),
        ws.lock_wait,
    )
    .await?;
    let result = resolve_locked(ws, d, id).await;
    lock.release().await?;
    result
}

async fn resolve_locked(ws: &Workspace, d: &Decide, id: String) -> Result<Decided> {
    let lake = &ws.lake;
    let builds = crate::table::builds::read_table_builds(lake, &d.table).await?;
    let latest = builds
        .iter()
        .filter(|b| b.status == BuildStatus::Succeeded && b.rolled_back_at.is_none())
        .max_by_key(|b| b.seq)
        .ok_or_else(|| {
            Error::Invalid(format!(
                "silver.{} has no succeeded build, so no conflict to decide; run `ingot build {}` first",
                d.table, d.table
            ))
        })?;
    let rows = conflicts::read(lake, &d.table, &latest.build_id).await?;
    let conflict = find(&rows, d, &latest.build_id)?;
    let sources: Vec<&str> = conflict.candidates.iter().map(|c| c.source.as_str()).collect();
    if !sources.contains(&d.take.as_str()) {
        return Err(Error::Invalid(format!(
            "--take \"{}\": not a candidate of this conflict; its candidates are: {}",
            d.take,
            conflict
                .candidates
                .iter()
                .map(|c| format!("{} ({})", c.source, c.value.as_deref().unwrap_or("null")))
                .collect::<Vec<_>>()
                .join(", ")
        )));
    }
    let all = read_decisions(lake, &d.table).await?;
    // only the decision in force on the field counts (a later one overrides an earlier)
    let in_force = crate::table::decisions::Decisions::of(&all);
    let current = conflict.key().and_then(|fp| in_force.get(fp, &conflict.field));
    if let Some(same) = current
        .filter(|x| x.take == d.take && x.candidate_set_hash == conflict.candidate_set_hash && x.reason == d.reason)
    {
        return Ok(Decided {
            record: same.clone(),
            new: false,
            conflict,
        });
    }
    let record = DecisionRecord {
        decision_id: id,
        table: d.table.clone(),
        fingerprint: conflict.fingerprint.clone(),
        field: conflict.field.clone(),
        take: d.take.clone(),
        candidate_set_hash: conflict.candidate_set_hash.clone(),
        reason: d.reason.clone(),
        decided_by: d.by.clone().unwrap_or_else(os_user),
        decided_at: ws.now_micros(),
        withdrawn_at: None,
        seq: next_seq(&all),
    };
    commit_decision(lake, &record, "resolve.before_commit").await?;
    crate::table::failpoint::hit("resolve.after_commit")?;
    Ok(Decided {
        record,
        new: true,
        conflict,
    })
}

/// The one conflict of `rows` that `d` names.
fn find(rows: &[ConflictRow], d: &Decide, build_id: &str) -> Result<ConflictRow> {
    let prefix = d.fingerprint.to_ascii_lowercase();
    let keyed: Vec<&ConflictRow> = rows.iter().filter(|r| r.fingerprint.starts_with(&prefix)).collect();
    if keyed.is_empty() {
        return Err(Error::Invalid(format!(
            "silver.{} has no conflict on a record whose fingerprint starts with \"{}\" (as of build {build_id}, \
             its latest); `ingot conflicts {}` lists them",
            d.table, d.fingerprint, d.table
        )));
    }
    let fps: std::collections::BTreeSet<&str> = keyed.iter().map(|r| r.fingerprint.as_str()).collect();
    if fps.len() > 1 {
        return Err(Error::Invalid(format!(
            "fingerprint \"{}\" is the start of {} records' fingerprints; give more of it",
            d.fingerprint,
            fps.len()
        )));
    }
    let fields: Vec<&str> = keyed.iter().map(|r| r.field.as_str()).collect();
    keyed.into_iter().find(|r| r.field == d.field).cloned().ok_or_else(|| {
        Error::Invalid(format!(
            "--field \"{}\": record {} has no conflict on it; its conflicts are on: {}",
            d.field,
            fps.iter().next().copied().unwrap_or(""),
            fields.join(", ")
        ))
    })
}

/// Withdraw decision `id` (`ingot undo <decision id>`): `None` when no decision has that id;
/// `Some(Err(why))` when it was withdrawn already.
pub async fn withdraw(ws: &Workspace, id: &str) -> Result<Option<std::result::Result<DecisionRecord, String>>> {
    let lake = &ws.lake;
    for table in lake.list_dirs(crate::table::decisions::DIR).await? {
        let all = read_decisions(lake, &table).await?;
        let Some(d) = all.iter().find(|d| d.decision_id == id) else {
            continue;
        };
        if let Some(at) = d.withdrawn_at {
            return Ok(Some(Err(format!(
                "decision {id} on silver.{table} was withdrawn already (at {}); nothing to do",
                show_time(at)
            ))));
        }
        let lock = acquire_for(lake, Scope::Table(&table), id, Vec::new(), default_ttl(), ws.lock_wait).await?;
        let withdrawn = DecisionRecord {
            withdrawn_at: Some(ws.now_micros().max(d.decided_at)),
            seq: next_seq(&all),
            ..d.clone()
        };
        let done = commit_decision(lake, &withdrawn, "undo.decision.before_commit").await;
        lock.release().await?;
        done?;
        return Ok(Some(Ok(withdrawn)));
    }
    Ok(None)
}

/// `2026-12-07T11:30:00Z` for microseconds since the epoch.
fn show_time(micros: i64) -> String {
    chrono::DateTime::from_timestamp_micros(micros)
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
        .unwrap_or_else(|| micros.to_string())
}
