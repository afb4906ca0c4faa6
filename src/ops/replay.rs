//! `ingot replay <run_id>`: push only a run's failed rows, from their raw payload, through the
//! current contract, as a new run with `replay_of` set (docs/operations.md).
//!
//! The rows are written to a temporary file in the source's format (CSV: the original header line,
//! kept beside the run's failure file as `header.csv` at ingest, then each raw record; NDJSON and
//! an API pull: each raw line, a pull's record as it was kept) and ingested as one ordinary run, except that its `replay_of` names the original, its
//! `file_path` is the original's with ` (replay)`, and each row keeps its original record number
//! (`source_row_number`). It keeps `replay.json` beside its failure file: the record numbers it
//! replayed and the SHA-256 of the contract file it used.
//!
//! Which rows: the original's failed records no replay loaded yet (a record is *replayed* by the
//! first replay that took it and did not reject it again: `replayed_by` in `ingot failures`). So a
//! second replay adds nothing, and replaying the same still-failing rows with the same contract
//! file is refused as pointless. Replaying a replay replays its original. Parquet sources (no text
//! payload) and rolled-back runs (undo is not replay) are refused.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use datafusion::arrow::array::AsArray;
use datafusion::arrow::datatypes::Int64Type;
use datafusion::common::TableReference;
use datafusion::prelude::{col, lit};
use futures::StreamExt;
use sha2::Digest;

use crate::engine::session::Workspace;
use crate::error::{Error, Result};
use crate::ingest::IngestOptions;
pub use crate::ingest::replay::Replay;
use crate::ingest::replay::{ReplayNote, header_rel, note_rel};
use crate::spec::contract::{Contract, Format};
use crate::table::audit::{RunRecord, RunStatus, read_run_log};
use crate::table::lake::Lake;

/// What `ingot replay` did.
#[derive(Debug, Clone)]
pub enum Replayed {
    Run(Box<RunRecord>),
    Nothing(String),
}

/// Distinct record numbers of a run's bronze failures (with their first raw payload when
/// `payloads`): the rejected rows of one run, which a replay has to hold to write them anyway.
async fn failed_rows(
    ctx: &datafusion::prelude::SessionContext,
    run_id: &str,
    payloads: bool,
) -> Result<BTreeMap<i64, String>> {
    let bronze_failures = col("run_id")
        .eq(lit(run_id))
        .and(col("layer").eq(lit("bronze")))
        .and(col("source_row_number").is_not_null());
    let payload = if payloads { col("raw_payload") } else { lit("") };
    let mut stream = ctx
        .table(TableReference::partial("audit", "row_failure_log"))
        .await?
        .filter(bronze_failures)?
        .select(vec![col("source_row_number"), payload])?
        .sort(vec![col("source_row_number").sort(true, false)])?
        .execute_stream()
        .await?;
    let mut out = BTreeMap::new();
    while let Some(b) = stream.next().await {
        let b = b?;
        let n = b.column(0).as_primitive::<Int64Type>();
        let raw = datafusion::arrow::compute::cast(b.column(1), &datafusion::arrow::datatypes::DataType::Utf8)?;
        let raw = raw.as_string::<i32>();
        for i in 0..b.num_rows() {
            out.entry(n.value(i)).or_insert_with(|| raw.value(i).to_string());
        }
    }
    Ok(out)
}

/// For every record of `root` a replay loaded: the replay run that loaded it.
pub async fn replayed_by(
    lake: &Lake,
    ctx: &datafusion::prelude::SessionContext,
    runs: &[RunRecord],
    root: &str,
) -> Result<BTreeMap<i64, String>> {
    let mut replays: Vec<&RunRecord> = runs
        .iter()
        .filter(|r| r.replay_of.as_deref() == Some(root) && r.status.is_loaded())
        .collect();
    replays.sort_by_key(|r| r.seq);
    let mut out = BTreeMap::new();
    for r in replays {
        let Some(bytes) = lake.get(&note_rel(&r.run_id)).await? else {
            continue;
        };
        let note: ReplayNote = serde_json::from_slice(&bytes)
            .map_err(|e| Error::RunFailed(format!("replay note of run {}: {e}", r.run_id)))?;
        let failed = failed_rows(ctx, &r.run_id, false).await?;
        for row in note.rows {
            if !failed.contains_key(&row) {
                out.entry(row).or_insert_with(|| r.run_id.to_string());
            }
        }
    }
    Ok(out)
}

/// Replay run `run_id` (see the module documentation).
pub async fn replay(ws: &Workspace, run_id: &str, opts: &IngestOptions) -> Result<Replayed> {
    let runs = read_run_log(&ws.lake).await?;
    let Some(mut run) = runs.iter().find(|r| r.run_id == run_id) else {
        return Err(Error::Invalid(format!(
            "no committed run has the id \"{run_id}\" (`ingot runs` lists them)"
        )));
    };
    while let Some(of) = &run.replay_of {
        match runs.iter().find(|r| &r.run_id == of) {
            Some(original) => run = original,
            None => break,
        }
    }
    match run.status {
        RunStatus::RolledBack => {
            return Err(Error::Invalid(format!(
                "run {} was rolled back: its failures no longer count; ingest its file again instead",
                run.run_id
            )));
        }
        RunStatus::Held => {
            return Err(Error::Invalid(format!(
                "run {} is held: nothing of it is published yet; `ingot publish {}` publishes it (then its failed \
                 rows can be replayed), `ingot discard {}` drops it",
                run.run_id, run.run_id, run.run_id
            )));
        }
        RunStatus::Failed | RunStatus::SkippedDuplicateFile | RunStatus::Discarded => {
            return Ok(Replayed::Nothing(format!(
                "run {} is {}: it has no failed rows to replay (a failed run is retried by {} again)",
                run.run_id,
                run.status.as_str(),
                if run.pull.is_some() {
                    format!("pulling {}", run.source)
                } else {
                    "ingesting its file".to_string()
                }
            )));
        }
        RunStatus::Succeeded | RunStatus::SucceededWithFailures => {}
    }
    if run.is_rekey() {
        return Err(Error::Invalid(format!(
            "run {} is a rekey run: its failures are records the new natural key made collide, not rows of a file; \
             deliver those records again under the new key, or undo the rekey",
            run.run_id
        )));
    }
    let contract = crate::spec::contract::ContractSet::load_one(&ws.contracts_dir, &run.source)?;
    if contract.format == Format::Parquet {
        return Err(Error::Invalid(format!(
            "run {} of {}: replay needs a text payload; a Parquet source's failures keep rows as JSON. \
             Fix the contract and ingest the file again",
            run.run_id, run.source
        )));
    }
    let contract_sha256: String =
        sha2::Sha256::digest(std::fs::read(&contract.path).map_err(|e| Error::io(contract.path.display(), e))?)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
    let catalog = crate::engine::catalog::open(ws).await?;
    let failed = failed_rows(&catalog.ctx, &run.run_id, true).await?;
    let done = replayed_by(&ws.lake, &catalog.ctx, &runs, &run.run_id).await?;
    let pending: Vec<(i64, &String)> = failed
        .iter()
        .filter(|(n, _)| !done.contains_key(n))
        .map(|(n, p)| (*n, p))
        .collect();
    if pending.is_empty() {
        return Ok(Replayed::Nothing(format!(
            "run {} has no failed rows left to replay ({} failed, {} loaded by replays)",
            run.run_id,
            failed.len(),
            done.len()
        )));
    }
    let rows: Vec<i64> = pending.iter().map(|(n, _)| *n).collect();
    let source_runs: Vec<&RunRecord> = runs.iter().filter(|r| r.source == run.source).collect();
    let current = crate::engine::catalog::current_runs(source_runs.iter().copied(), &run.source);
    let later_runs: Vec<String> = crate::ingest::replay::later_runs(&current, &source_runs, &run.run_id)
        .iter()
        .map(|r| r.run_id.to_string())
        .collect();
    if let Some(last) = same_as_last_replay(ws, &runs, &run.run_id, &rows, &contract_sha256, &later_runs).await? {
        return Ok(Replayed::Nothing(format!(
            "the {} rows of run {} that still fail were replayed by run {} with this same contract file; \
             change the contract first (e.g. add the missing allowed value), then replay",
            rows.len(),
            run.run_id,
            last
        )));
    }
    let dir = tempfile::tempdir().map_err(|e| Error::io("temporary directory", e))?;
    let input = write_input(ws, run, &contract, &pending, dir.path()).await?;
    let mut opts = opts.clone();
    opts.replay = Some(Arc::new(Replay {
        of: run.run_id.to_string(),
        row_numbers: rows,
        file_path: format!("{} (replay)", run.file_path),
        contract_sha256,
        later_runs,
    }));
    let record = crate::ingest::ingest_file(ws, contract, &input, &opts).await?;
    Ok(Replayed::Run(Box::new(record)))
}

/// The last replay of `root`, when it already replayed all of `rows` with the same contract file
/// (`contract_sha256`) while the same runs came after the original (`later_runs`): the same rows
/// would fail, or be superseded, the same way again.
async fn same_as_last_replay(
    ws: &Workspace,
    runs: &[RunRecord],
    root: &str,
    rows: &[i64],
    contract_sha256: &str,
    later_runs: &[String],
) -> Result<Option<String>> {
    let last = runs
        .iter()
        .filter(|r| r.replay_of.as_deref() == Some(root) && r.status.is_loaded())
        .max_by_key(|r| r.seq);
    let Some(last) = last else {
        return Ok(None);
    };
    let Some(bytes) = ws.lake.get(&note_rel(&last.run_id)).await? else {
        return Ok(None);
    };
    let same = serde_json::from_slice::<ReplayNote>(&bytes).is_ok_and(|note| {
        rows.iter().all(|r| note.rows.binary_search(r).is_ok())
            && note.contract_sha256 == contract_sha256
            && note.later_runs == later_runs
    });
    Ok(same.then(|| last.run_id.to_string()))
}

/// Write the `pending` records of `run` as a file in its source's format into `dir` (CSV: the
/// kept header line first) and return its path.
async fn write_input(
    ws: &Workspace,
    run: &RunRecord,
    contract: &Contract,
    pending: &[(i64, &String)],
    dir: &Path,
) -> Result<PathBuf> {
    let input = dir.join(format!(
        "replay-{}.{}",
        run.run_id,
        if contract.format == Format::Csv {
            "csv"
        } else {
            "ndjson"
        }
    ));
    let mut f = std::io::BufWriter::new(std::fs::File::create(&input).map_err(|e| Error::io(input.display(), e))?);
    let mut write = |b: &[u8]| f.write_all(b).map_err(|e| Error::io(input.display(), e));
    if contract.format == Format::Csv && contract.csv.header {
        let header = ws.lake.get(&header_rel(&run.run_id)).await?.ok_or_else(|| {
            Error::RunFailed(format!(
                "run {}: its CSV header was not kept (runs ingested before replay existed); ingest the file again",
                run.run_id
            ))
        })?;
        write(&header)?;
        write(b"\n")?;
    }
    for (_, payload) in pending {
        write(payload.as_bytes())?;
        write(b"\n")?;
    }
    f.flush().map_err(|e| Error::io(input.display(), e))?;
    Ok(input)
}
