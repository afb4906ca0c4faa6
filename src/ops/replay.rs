//! `ingot replay <run_id>`: push only a run's failed rows, from their raw payload, through the
//! current contract, as a new run with `replay_of` set (docs/operations.md).
//!
//! The replayed rows are written to a temporary file in the source's format (CSV: the original
//! file's header line, kept beside the run's failure file as `header.csv` when the run is
//! ingested, then each raw record; NDJSON: each raw line) and ingested as one ordinary run, with
//! three differences: its `replay_of` names the original run, its `file_path` is the original's
//! with ` (replay)`, and every row keeps the record number it had in the original file
//! (`source_row_number`), so a replayed row and its failure point at the same record. The replay
//! run also keeps `replay.json` beside its failure file: the original's record numbers it
//! replayed and the SHA-256 of the contract file it used.
//!
//! Which rows: the original's failed records that no replay loaded yet. A record is *replayed*
//! by the first replay run that took it and did not reject it again (`ingot failures --run ID`
//! shows that run as `replayed_by`). So replaying twice adds nothing: once every row loaded
//! there is nothing left; and while some still fail, a replay of the same rows with the same
//! contract file is refused as pointless. Replaying a replay run replays its original. Parquet
//! sources have no text payload to replay from (their failures keep the row as JSON) and are
//! refused; rolled-back runs are refused too (undo is not replay).

use std::collections::BTreeMap;
use std::io::Write;
use std::sync::Arc;

use datafusion::arrow::array::AsArray;
use datafusion::arrow::datatypes::Int64Type;
use futures::StreamExt;
use sha2::Digest;

use crate::engine::session::Workspace;
use crate::error::{Error, Result};
use crate::ingest::IngestOptions;
pub use crate::ingest::replay::Replay;
use crate::ingest::replay::{ReplayNote, header_rel, note_rel};
use crate::spec::contract::Format;
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
    let sql = format!(
        "SELECT source_row_number, {} FROM audit.row_failure_log WHERE run_id = '{}' AND layer = 'bronze' \
         AND source_row_number IS NOT NULL ORDER BY source_row_number",
        if payloads { "raw_payload" } else { "''" },
        run_id.replace('\'', "''")
    );
    let mut stream = ctx.sql(&sql).await?.execute_stream().await?;
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
                out.entry(row).or_insert_with(|| r.run_id.clone());
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
        RunStatus::Failed | RunStatus::SkippedDuplicateFile => {
            return Ok(Replayed::Nothing(format!(
                "run {} is {}: it has no failed rows to replay (a failed run is retried by ingesting its file again)",
                run.run_id,
                run.status.as_str()
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
    // The same rows with the same contract file would fail the same way again.
    let mut previous: Vec<&RunRecord> = runs
        .iter()
        .filter(|r| r.replay_of.as_deref() == Some(run.run_id.as_str()) && r.status.is_loaded())
        .collect();
    previous.sort_by_key(|r| r.seq);
    if let Some(last) = previous.last()
        && let Some(bytes) = ws.lake.get(&note_rel(&last.run_id)).await?
        && let Ok(note) = serde_json::from_slice::<ReplayNote>(&bytes)
        && rows.iter().all(|r| note.rows.binary_search(r).is_ok())
        && note.contract_sha256 == contract_sha256
    {
        return Ok(Replayed::Nothing(format!(
            "the {} rows of run {} that still fail were replayed by run {} with this same contract file; \
             change the contract first (e.g. add the missing allowed value), then replay",
            rows.len(),
            run.run_id,
            last.run_id
        )));
    }

    let dir = tempfile::tempdir().map_err(|e| Error::io("temporary directory", e))?;
    let input = dir.path().join(format!(
        "replay-{}.{}",
        run.run_id,
        if contract.format == Format::Csv {
            "csv"
        } else {
            "ndjson"
        }
    ));
    {
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
        for (_, payload) in &pending {
            write(payload.as_bytes())?;
            write(b"\n")?;
        }
        f.flush().map_err(|e| Error::io(input.display(), e))?;
    }
    let mut opts = opts.clone();
    opts.replay = Some(Arc::new(Replay {
        of: run.run_id.clone(),
        row_numbers: rows,
        file_path: format!("{} (replay)", run.file_path),
        contract_sha256,
    }));
    let record = crate::ingest::ingest_file(ws, contract, &input, &opts).await?;
    Ok(Replayed::Run(Box::new(record)))
}
