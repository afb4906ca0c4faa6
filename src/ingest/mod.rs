//! Ingest: one input file becomes one run of bronze (docs/operations.md).
//!
//! A run takes the source lock, hashes the file (an identical loaded file is skipped), builds the
//! change-detection index from the committed runs of the source's current state, streams typed,
//! hashed and classified rows into run-scoped Parquet files, and commits one run-log record into
//! the source's next slot (create-if-absent). Nothing is visible before that put, so a crash at
//! any point is healed by running the same command again. [`ingest_file`] gives the sequence and
//! where a crash can hit it; [`load`] the deletions of `delivery: full` and the memory bounds.

pub mod columns;
pub mod csv;
pub mod hold;
pub mod key_version;
pub mod keys;
pub mod keystate;
pub mod landing;
pub mod ndjson;
pub mod parquet;
pub mod pass;
pub mod pull;
pub mod replay;
pub mod sink;
pub mod spill;

use std::io::Read;
use std::path::Path;
use std::sync::{Arc, Condvar, Mutex};

use sha2::{Digest, Sha256};

use crate::engine::session::Workspace;
use crate::error::{Error, Result};
use crate::spec::contract::{Contract, Delivery, Format};
use crate::table::audit::{RunRecord, RunStatus, commit_run};
use crate::table::failpoint;
use keys::{InMemory, scan_stored};
use pass::{Hashers, PassOutcome, RunInput, write_pass};
use sink::ParsedBatch;

/// A source of typed batches (CSV, NDJSON or Parquet).
pub trait Loader: Send {
    fn next_batch(&mut self) -> Result<Option<ParsedBatch>>;
    /// Input columns dropped under `unknown_fields: ignore`.
    fn ignored_columns(&self) -> Vec<String>;
    /// After the last batch: why the run fails because declared fields were absent from the whole
    /// input (NDJSON, where a key may be absent from a line; CSV and Parquet check their header
    /// before reading). `None`: nothing missing.
    fn missing_fields(&self) -> Option<String> {
        None
    }
}

/// Options of an ingest.
#[derive(Debug, Clone)]
pub struct IngestOptions {
    pub batch_size: usize,
    pub lock_ttl: std::time::Duration,
    /// Show a progress bar (the CLI sets this when stdout is a terminal).
    pub progress: bool,
    /// This run replays another run's failed rows (see [`crate::ops::replay`]): sets `replay_of`
    /// and `file_path`, never skips the input as a duplicate, and numbers rows as the original.
    pub replay: Option<Arc<crate::ingest::replay::Replay>>,
    /// The input's name for the run log and messages when the file read is a local copy (a
    /// landing file fetched from an object store: its URL). `None`: the path itself.
    pub input_name: Option<String>,
    /// Publish the run even when a hold gate would hold it (`ingot ingest --no-hold`).
    pub no_hold: bool,
    /// Write the run's files into the folders of this run id instead of its own (a scratch
    /// copy, see [`rederive`]); its rows keep the run's own stamps.
    pub files_as: Option<String>,
}

impl Default for IngestOptions {
    fn default() -> Self {
        IngestOptions {
            batch_size: 8 * 1024,
            lock_ttl: crate::table::lock::default_ttl(),
            progress: false,
            replay: None,
            input_name: None,
            no_hold: false,
            files_as: None,
        }
    }
}

pub use crate::ingest::landing::{Input, expand_inputs};

/// Ingest every input of `source`, one run per file in sorted order. Stops at the first run that
/// fails with an infrastructure error; failed runs (bad input) are recorded and the next file goes.
pub async fn ingest(
    ws: &Workspace,
    contract: Arc<Contract>,
    inputs: &[Input],
    opts: &IngestOptions,
) -> Result<Vec<RunRecord>> {
    let mut out = Vec::new();
    for input in inputs {
        out.push(ingest_input(ws, contract.clone(), input, opts).await?);
    }
    Ok(out)
}

/// A `format: api` source is pulled ([`pull`]), not ingested from files, so its
/// files are refused before anything is read or written.
pub fn refuse_api(contract: &Contract) -> Result<()> {
    if contract.format == Format::Api {
        return Err(Error::Invalid(format!(
            "source \"{}\" is format: api: it is pulled with `ingot pull {}`, not ingested from files; nothing was loaded",
            contract.source, contract.source
        )));
    }
    Ok(())
}

/// Ingest one input as one run: a local file directly, a remote one from a local copy (the run
/// records its URL; see [`crate::ingest::landing`]).
pub async fn ingest_input(
    ws: &Workspace,
    contract: Arc<Contract>,
    input: &Input,
    opts: &IngestOptions,
) -> Result<RunRecord> {
    refuse_api(&contract)?;
    match input {
        Input::Local(path) => ingest_file(ws, contract, path, opts).await,
        Input::Remote(remote) => {
            let scratch = remote.fetch().await?;
            let opts = IngestOptions {
                input_name: Some(remote.url.clone()),
                ..opts.clone()
            };
            ingest_file(ws, contract, &scratch.path, &opts).await
        }
    }
}

/// Ingest one file as one run and return its committed record.
///
/// The sequence of a run, and where a crash can hit it:
///
/// 1. take the source lock; refuse a contract whose natural-key version differs from the one the
///    source's bronze is keyed with (see [`crate::ops::rekey`]); hash the file's bytes; a file already loaded by a committed run is
///    recorded as `skipped_duplicate_file` and nothing is read. Only a file of the same size as a
///    loaded one can be a duplicate: any other file is hashed on a thread of its own while steps
///    2-3 run (the bronze writer waits for the hash before its first rows);
/// 2. build the change-detection index (fingerprint → row_hash prefixes) from the committed
///    bronze runs of the source's current state ([`crate::engine::catalog::current_runs`]), oldest
///    first, so the newest version wins (a tombstone makes its key absent);
/// 3. parse (a blocking thread) → type and check → hash with the SQL UDFs → classify each row as
///    inserted / updated / unchanged / failed → stream new versions and failures to run-scoped
///    Parquet files; for a `delivery: full` file, then append a **tombstone** for every current
///    key the file lacked (see below);
/// 4. check the input did not change while it was read, commit the run-log record into the
///    source's next sequence slot (create-if-absent: a run that lost its lock to another run that
///    committed first publishes nothing), release the lock.
///
/// In-file natural-key conflicts are found during the pass; a file that has any is processed a
/// second time with the conflicting keys known, so that every record of a conflicting key is
/// rejected (the first pass's run-scoped files are overwritten, never published).
pub async fn ingest_file(
    ws: &Workspace,
    contract: Arc<Contract>,
    path: &Path,
    opts: &IngestOptions,
) -> Result<RunRecord> {
    // a replay of a pull's failed records is a file of them: the one file an API source loads
    if opts.replay.is_none() {
        refuse_api(&contract)?;
    }
    let run_id = ws.new_id();
    let started_at = ws.now_micros();
    let file_bytes = std::fs::metadata(path).map_err(|e| Error::io(path.display(), e))?.len() as i64;
    let record = RunRecord {
        file_path: match (&opts.replay, &opts.input_name) {
            (Some(r), _) => r.file_path.as_str().into(),
            (None, Some(name)) => name.as_str().into(),
            (None, None) => path.display().to_string().into(),
        },
        file_bytes,
        ..new_record(&contract, &run_id, started_at, opts)
    };
    locked_run(ws, &contract, record, opts, async |record, runs| {
        run(ws, &contract, path, opts, record, runs).await
    })
    .await
}

/// Run `body` as one run of `contract`'s source under its lock: the record takes the source's
/// next slot and a start time after every earlier run's, the natural-key version is checked,
/// then [`conclude`] records the outcome (a failed run included) and releases the lock. Only
/// this source's log is read: a run never pays for the other sources' history.
async fn locked_run(
    ws: &Workspace,
    contract: &Arc<Contract>,
    mut record: RunRecord,
    opts: &IngestOptions,
    body: impl AsyncFnOnce(&mut RunRecord, &[RunRecord]) -> Result<()>,
) -> Result<RunRecord> {
    let lock =
        crate::table::lock::acquire(&ws.lake, &contract.source, &record.run_id, opts.lock_ttl, ws.lock_wait).await?;
    let mut runs = Vec::new();
    let outcome = match crate::table::audit::read_source_runs(&ws.lake, &contract.source).await {
        Ok(read) => {
            runs = read;
            record.seq = crate::table::audit::next_seq(&runs, &contract.source);
            record.started_at = crate::table::audit::not_before(&runs, &contract.source, record.started_at);
            record.finished_at = record.started_at;
            match crate::ingest::key_version::check_key_version(ws, &runs, contract).await {
                Ok(()) => body(&mut record, &runs).await,
                Err(e) => Err(e),
            }
        }
        Err(e) => Err(e),
    };
    conclude(ws, contract, record, outcome, runs, lock).await
}

/// A run's record before it runs: `failed` until it succeeds, counts zero, the contract's
/// versions; the caller sets `file_path` and `file_bytes`.
fn new_record(contract: &Contract, run_id: &str, started_at: i64, opts: &IngestOptions) -> RunRecord {
    RunRecord {
        run_id: run_id.into(),
        source: contract.source.as_str().into(),
        contract_version: contract.version as i32,
        file_path: "".into(),
        file_hash: None,
        file_bytes: 0,
        started_at,
        finished_at: started_at,
        status: RunStatus::Failed,
        rows_seen: 0,
        rows_inserted: 0,
        rows_updated: 0,
        rows_unchanged: 0,
        rows_failed: 0,
        replay_of: opts.replay.as_ref().map(|r| r.of.as_str().into()),
        error: None,
        ingot_version: crate::table::audit::INGOT_VERSION.into(),
        ignored_columns: None,
        rolled_back_at: None,
        rows_deleted: 0,
        natural_key_version: Some(contract.natural_key.version as i32),
        previous_natural_key_version: None,
        natural_key_definition: Some(contract.key_definition().into()),
        rows_superseded: 0,
        contract_fields: Some(contract.fields_definition().into()),
        failure_class: None,
        held_reason: None,
        decided_at: None,
        data_file: None,
        failure_file: None,
        pull: None,
        seq: 0,
    }
}

/// The end of a run, under its source's lock: a run that failed for its input or a passing cause
/// is recorded as `failed` with its class (nothing published), a run with data may compact the
/// source, and the lock is released. `runs`: the source's records as the run read them.
async fn conclude(
    ws: &Workspace,
    contract: &Arc<Contract>,
    mut record: RunRecord,
    outcome: Result<()>,
    mut runs: Vec<RunRecord>,
    lock: crate::table::lock::SourceLock,
) -> Result<RunRecord> {
    let result = match outcome {
        Ok(()) => Ok(record),
        Err(e @ (Error::RunFailed(_) | Error::RunInterrupted(_))) => {
            // Bad input, or a passing cause: record the failed run (no data is published) with
            // its class, and carry on.
            let class = match e {
                Error::RunInterrupted(_) => crate::table::audit::FAILED_TRANSIENTLY,
                _ => crate::table::audit::FAILED_FOR_CONTENT,
            };
            record.failure_class = Some(class.into());
            record.status = RunStatus::Failed;
            record.error = Some(e.to_string().into());
            record.rows_seen = 0;
            record.rows_inserted = 0;
            record.rows_updated = 0;
            record.rows_unchanged = 0;
            record.rows_failed = 0;
            record.rows_deleted = 0;
            record.rows_superseded = 0;
            record.finished_at = ws.now_micros().max(record.started_at);
            // the slot taken, which is a later one past an object no reader can parse
            commit_run(&ws.lake, &record, Some(contract))
                .await
                .map(|slot| RunRecord { seq: slot, ..record })
        }
        Err(e) => Err(e),
    };
    if let Ok(committed) = &result {
        failpoint::hit("ingest.after_commit")?;
        if committed.has_data() && crate::engine::compact::automatic() {
            runs.push(committed.clone());
            // the run stands whatever happens here: a compaction that fails is only slower reads
            if let Err(e) = crate::engine::compact::compact_source(ws, contract, &runs, false).await {
                if matches!(e, Error::Failpoint(_)) {
                    return Err(e);
                }
                crate::tell!(
                    "{}: compaction skipped ({e}); `ingot compact` retries it",
                    contract.source
                );
            }
        }
    }
    lock.release().await?;
    result
}

async fn run(
    ws: &Workspace,
    contract: &Arc<Contract>,
    path: &Path,
    opts: &IngestOptions,
    record: &mut RunRecord,
    all_runs: &[RunRecord],
) -> Result<()> {
    failpoint::hit("ingest.after_lock")?;
    let before = FileStamp::of(path)?;
    let runs: Vec<&RunRecord> = all_runs.iter().filter(|r| r.source == contract.source).collect();
    // Only a file of the same size can repeat a loaded one. Otherwise the file is hashed on a
    // thread of its own while it is loaded (the hash is needed first by the bronze writer, and
    // the row count comes from a sample instead of a counting pass).
    let maybe_duplicate = opts.replay.is_none()
        && runs
            .iter()
            .any(|r| r.status.is_loaded() && r.file_bytes == record.file_bytes);
    let (digest, lines) = if maybe_duplicate {
        let (file_hash, lines) = file_digest(path).await?;
        record.file_hash = Some(file_hash.as_str().into());
        failpoint::hit("ingest.after_hash")?;
        if runs
            .iter()
            .any(|r| r.status.is_loaded() && r.file_hash.as_deref() == Some(&file_hash))
        {
            record.status = RunStatus::SkippedDuplicateFile;
            record.error = None;
            record.finished_at = ws.now_micros().max(record.started_at);
            record.ignored_columns = None;
            record.seq = commit_run(&ws.lake, record, Some(contract)).await?;
            return Ok(());
        }
        (FileDigest::ready(file_hash), lines)
    } else {
        (FileDigest::spawn(path)?, sample_lines(path, record.file_bytes as u64)?)
    };
    let result = load(ws, contract, path, opts, record, &runs, &digest, lines).await;
    if record.file_hash.is_none() {
        // Failed runs record the hash too; a hashing error matters only when the load worked.
        let waiting = digest.clone();
        let hashed = tokio::task::spawn_blocking(move || waiting.wait())
            .await
            .map_err(|e| Error::Internal(format!("hashing task failed: {e}")))
            .and_then(|r| r);
        match hashed {
            Ok(h) => record.file_hash = Some(h.into()),
            Err(e) if result.is_ok() => return Err(e),
            Err(_) => {}
        }
        if result.is_ok() {
            failpoint::hit("ingest.after_hash")?;
        }
    }
    result?;
    before.check(path)?;
    crate::ingest::replay::keep_run_files(&ws.lake, contract, path, record, opts).await?;
    record.seq = commit_run(&ws.lake, record, Some(contract)).await?;
    Ok(())
}

/// Derive a committed run's files again (`ingot doctor --fix`, [`crate::ops::rederive`]): the
/// pass of [`load`] over `path`, the run's landing file (`name`: its URL when `path` is a local
/// copy), against `before`, the source's run records as they stood when the run took its slot,
/// with the run's own stamps (run id, `ingested_at`, file hash, key and contract versions). The
/// file is hashed again as it is read: one whose bytes are no longer the run's `file_hash` fails
/// with [`Error::RunInterrupted`]. The files go into the folders of the run id `scratch`;
/// nothing is committed, no key state is written, no hold gate applies. Returns `run` with the
/// counts and file stamps of this pass.
pub async fn rederive(
    ws: &Workspace,
    contract: &Arc<Contract>,
    path: &Path,
    name: Option<&str>,
    run: &RunRecord,
    before: &[RunRecord],
    scratch: &str,
) -> Result<RunRecord> {
    let file_hash = run
        .file_hash
        .as_deref()
        .ok_or_else(|| Error::Invalid(format!("run {} recorded no file hash", run.run_id)))?;
    let stamp = FileStamp::of(path)?;
    let mut record = RunRecord {
        file_bytes: stamp.0 as i64,
        rows_seen: 0,
        rows_inserted: 0,
        rows_updated: 0,
        rows_unchanged: 0,
        rows_failed: 0,
        rows_deleted: 0,
        rows_superseded: 0,
        ignored_columns: None,
        data_file: None,
        failure_file: None,
        ..run.clone()
    };
    let opts = IngestOptions {
        input_name: name.map(str::to_string),
        no_hold: true,
        files_as: Some(scratch.to_string()),
        ..Default::default()
    };
    let runs: Vec<&RunRecord> = before.iter().filter(|r| r.source == contract.source).collect();
    let display = || name.map_or_else(|| path.display().to_string(), str::to_string);
    if run.pull.is_some() {
        // a pull's hash is of its typed records: checked in a pass before the load
        let (hashed, _) = pull::hash_pull(ws, contract, path, &display(), opts.batch_size).await?;
        if hashed != file_hash {
            return Err(Error::RunInterrupted(format!(
                "the records kept by the pull from {} no longer hash to its file_hash (now {hashed})",
                display()
            )));
        }
        let lines = run.rows_seen.max(0) as u64;
        load(
            ws,
            contract,
            path,
            &opts,
            &mut record,
            &runs,
            &FileDigest::ready(hashed),
            lines,
        )
        .await?;
        stamp.check(path)?;
        return Ok(record);
    }
    // hashed again while it is read: the bytes read are the bytes the run loaded
    let digest = FileDigest::spawn(path)?;
    let lines = sample_lines(path, stamp.0)?;
    load(ws, contract, path, &opts, &mut record, &runs, &digest, lines).await?;
    let waiting = digest.clone();
    let hashed = tokio::task::spawn_blocking(move || waiting.wait())
        .await
        .map_err(|e| Error::Internal(format!("hashing task failed: {e}")))??;
    stamp.check(path)?;
    if hashed != file_hash {
        return Err(Error::RunInterrupted(format!(
            "{}: the file changed while it was read again (its SHA-256 is now {hashed})",
            display()
        )));
    }
    record.file_hash = Some(hashed.into());
    Ok(record)
}

/// Load the file (after the duplicate check): build the index, run the pass(es), fill the
/// record's counts and status.
///
/// A full delivery is the whole source: a record current before the run whose natural key the
/// file does not have is deleted by a tombstone version in the run's own data file, after its new
/// versions: `is_deleted = true`, the record's fingerprint and natural-key fields (from its latest
/// version), every other field, `row_hash` and `source_row_number` null. The key index already
/// knows which current keys the file had; a rejected row whose key could be computed, and every row
/// of a natural-key conflict, count as delivered (a malformed row today is not a deletion). The
/// tombstones' keys and fields come from reading the current state's files once more, newest
/// first. They count in `rows_deleted` and are undone with the run. A replay never deletes.
/// Last, the hold gates of the contract ([`hold`]) may mark the run `held`: its files are written
/// as usual, and its record commits with that status, so nothing of it is published.
///
/// Memory: the in-memory index ([`keys::InMemory`]) costs about 50-80 bytes per distinct key of
/// the source and the file; everything else streams in batches. When the estimated keys exceed
/// the index budget (half of `--memory-limit`, or `INGOT_INDEX_MEMORY`), change detection is
/// partitioned and spilled to disk instead ([`spill`]), so memory does not grow with the data.
#[allow(clippy::too_many_arguments)]
async fn load(
    ws: &Workspace,
    contract: &Arc<Contract>,
    path: &Path,
    opts: &IngestOptions,
    record: &mut RunRecord,
    runs: &[&RunRecord],
    digest: &FileDigest,
    lines: u64,
) -> Result<()> {
    let ctx = ws.session()?;
    let hashers = Arc::new(Hashers::new(&ctx, contract)?);
    let current = crate::engine::catalog::current_runs(runs.iter().copied(), &contract.source);
    crate::table::evolve::check_readable(contract, &current)?;
    let current_keys: u64 = current.iter().map(|r| r.rows_inserted.max(0) as u64).sum();
    // A replay holds only the failed rows of its run: it never deletes.
    let full = contract.delivery == Delivery::Full && opts.replay.is_none();
    // Deliveries mostly re-send keys the source already has (corrections, full re-deliveries), so
    // the index is sized for the larger of the two sets. If the file brings mostly new keys the
    // map grows past the budget, by at most the budget again (documented in docs/operations.md#memory).
    let keys = current_keys.max(estimate_rows(path, record.file_bytes as u64, lines));
    let bits = spill::partition_bits(keys, index_budget(ws));
    // Every current run's file, when the deletions or the partitioned plan read them all; else
    // only those the key state does not cover are read (below), and naming the others would cost
    // as much as the rest of a one-row ingest on a long history.
    let committed = if full || bits > 0 {
        crate::table::evolve::stored_runs(&ws.lake, contract, &current)?
    } else {
        Vec::new()
    };
    let snapshot = record.clone();
    let superseding = match &opts.replay {
        Some(replay) => Some(
            crate::ingest::replay::superseding(&ctx, ws.cluster.as_deref(), &ws.lake, replay, &current, runs).await?,
        ),
        None => None,
    };
    let input = RunInput {
        ws,
        contract,
        path,
        opts,
        record: &snapshot,
        hashers: &hashers,
        digest,
        ctx: &ctx,
        delete_from: full.then_some(committed.as_slice()),
        superseding: superseding.as_ref(),
    };
    let stats = if bits == 0 {
        let capacity = keys.min(1 << 26) as usize;
        let (mut index, covered) = from_key_state(ws, &ctx, contract, &current, capacity).await?;
        let uncovered = crate::table::evolve::stored_runs(&ws.lake, contract, &current[covered..])?;
        for stored in &uncovered {
            scan_stored(
                &ctx,
                ws.cluster.as_deref(),
                &ws.lake,
                contract,
                &hashers,
                stored,
                |fp, rh| {
                    index.add_current(fp, rh);
                    Ok(())
                },
            )
            .await?;
        }
        if uncovered.len() as u64 >= ws.lake.cadence.key_state_every && opts.files_as.is_none() {
            let hash_layout = crate::table::evolve::hash_layout(contract);
            if let Err(e) = keystate::write(&ws.lake, &contract.source, &hash_layout, &current, &index).await {
                crate::tell!(
                    "{}: key state not written ({e}); the next ingest reads every run",
                    contract.source
                );
            }
            failpoint::hit("ingest.after_key_state")?;
        }
        match write_pass(&input, &mut index, opts.replay.is_some()).await? {
            PassOutcome::Done(stats) => stats,
            PassOutcome::Rerun => {
                // Conflicting keys were found: redo the pass knowing them, keeping raw records
                // so every record of a conflicting key can be logged as it arrived.
                index.rerun_with_found();
                match write_pass(&input, &mut index, true).await? {
                    PassOutcome::Done(stats) => stats,
                    PassOutcome::Rerun => {
                        return Err(Error::Internal(
                            "natural-key conflict detection did not converge".into(),
                        ));
                    }
                }
            }
        }
    } else {
        crate::tell!(
            "{}: about {keys} keys exceed the index memory ({} bytes): change detection runs in {} partitions \
             (spilled to disk, the input is read twice)",
            contract.source,
            index_budget(ws),
            1u32 << bits
        );
        let mut planned = spill::plan(&ctx, &input, &committed, bits, full).await?;
        let keep_raw = !planned.conflicts.is_empty() || opts.replay.is_some();
        match write_pass(&input, &mut planned, keep_raw).await? {
            PassOutcome::Done(stats) => stats,
            PassOutcome::Rerun => return Err(Error::Internal("a planned pass found new conflicts".into())),
        }
    };
    record.rows_seen = stats.seen as i64;
    record.rows_inserted = stats.inserted as i64;
    record.rows_updated = stats.updated as i64;
    record.rows_unchanged = stats.unchanged as i64;
    record.rows_failed = stats.failed as i64;
    record.rows_deleted = stats.deleted as i64;
    record.rows_superseded = stats.superseded as i64;
    record.data_file = stats.data_file;
    record.failure_file = stats.failure_file;
    record.ignored_columns = if stats.ignored.is_empty() {
        None
    } else {
        Some(stats.ignored.join(",").into())
    };
    record.status = if stats.failed > 0 {
        RunStatus::SucceededWithFailures
    } else {
        RunStatus::Succeeded
    };
    if opts.replay.is_none() && !opts.no_hold {
        let reasons = hold::hold_reasons(contract, record, &stats, runs);
        if !reasons.is_empty() {
            record.status = RunStatus::Held;
            record.held_reason = Some(reasons.join("; ").into());
        }
    }
    record.finished_at = ws.now_micros().max(record.started_at);
    if stats.seen != stats.inserted + stats.updated + stats.unchanged + stats.failed {
        return Err(Error::RunFailed(format!(
            "internal error: counts do not reconcile (seen {} != inserted {} + updated {} + unchanged {} + failed {}); nothing was published",
            stats.seen, stats.inserted, stats.updated, stats.unchanged, stats.failed
        )));
    }
    Ok(())
}

/// The index with the source's latest usable key state folded in, and how many of `current` (its
/// current runs) that state covers; an empty index covering none when there is no usable state.
async fn from_key_state(
    ws: &Workspace,
    ctx: &datafusion::prelude::SessionContext,
    contract: &Contract,
    current: &[&RunRecord],
    capacity: usize,
) -> Result<(InMemory, usize)> {
    let hash_layout = crate::table::evolve::hash_layout(contract);
    let Some(found) = keystate::find(&ws.lake, &contract.source, &hash_layout, current).await? else {
        return Ok((InMemory::new(capacity), 0));
    };
    let mut index = InMemory::new(capacity);
    match keystate::load(ctx, &ws.lake, &found, |key, rh| index.add_current(key, Some(rh))).await {
        Ok(()) => Ok((index, found.covered)),
        Err(e) => {
            crate::tell!("{}: {e}; the key state is passed over, every run is read", found.rel);
            Ok((InMemory::new(capacity), 0))
        }
    }
}

/// Memory for the change-detection index: `INGOT_INDEX_MEMORY` (e.g. `64M`), else half of
/// `--memory-limit`. Beyond it, ingest switches to the partitioned plan of [`spill`].
fn index_budget(ws: &Workspace) -> u64 {
    std::env::var("INGOT_INDEX_MEMORY")
        .ok()
        .and_then(|s| crate::engine::session::parse_size(&s).ok())
        .unwrap_or(ws.memory_limit / 2) as u64
}

/// Number of records in a file: its line count, or for compressed input a generous guess
/// (16 bytes a record at 4:1 compression).
fn estimate_rows(path: &Path, bytes: u64, lines: u64) -> u64 {
    let gz = path.extension().is_some_and(|e| e == "gz");
    if gz { bytes * 4 / 16 + 1 } else { lines + 1 }
}

/// Size and modification time of an input, to detect a file that changes while it is read.
#[derive(Debug, PartialEq)]
struct FileStamp(u64, Option<std::time::SystemTime>);

impl FileStamp {
    fn of(path: &Path) -> Result<FileStamp> {
        // the entry itself: a file swapped for a link changes its stamp
        let m = std::fs::symlink_metadata(path).map_err(|e| Error::io(path.display(), e))?;
        Ok(FileStamp(m.len(), m.modified().ok()))
    }

    /// Fail the run if the file is no longer what was hashed.
    fn check(&self, path: &Path) -> Result<()> {
        if FileStamp::of(path)? != *self {
            return Err(Error::RunInterrupted(format!(
                "{}: the file changed while it was being ingested; nothing was published. Re-run when it is complete",
                path.display()
            )));
        }
        Ok(())
    }
}

/// SHA-256 of the file's bytes as stored, and its number of `\n` bytes (a row estimate).
pub async fn file_digest(path: &Path) -> Result<(String, u64)> {
    let path = path.to_path_buf();
    tokio::task::spawn_blocking(move || digest_file(&path))
        .await
        .map_err(|e| Error::Internal(format!("hashing task failed: {e}")))?
}

fn digest_file(path: &Path) -> Result<(String, u64)> {
    let mut f = landing::open_input(path, &path.display().to_string())?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut lines = 0u64;
    loop {
        let n = match f.read(&mut buf) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(Error::io(path.display(), e)),
        };
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
        lines += count_newlines(&buf[..n]);
    }
    let digest: [u8; 32] = h.finalize().into();
    let mut hex = [0u8; 64];
    crate::hash::hex_lower(&digest, &mut hex);
    Ok((String::from_utf8_lossy(&hex).into_owned(), lines))
}

/// The input's hash, computed on a thread of its own while the file is loaded; whoever needs it
/// first waits for it.
#[derive(Clone)]
pub struct FileDigest(Arc<(Mutex<Option<Result<String>>>, Condvar)>);

impl FileDigest {
    fn ready(hash: String) -> FileDigest {
        FileDigest(Arc::new((Mutex::new(Some(Ok(hash))), Condvar::new())))
    }

    fn spawn(path: &Path) -> Result<FileDigest> {
        let digest = FileDigest(Arc::new((Mutex::new(None), Condvar::new())));
        let done = digest.clone();
        let path = path.to_path_buf();
        std::thread::Builder::new()
            .name("ingot-file-hash".into())
            .spawn(move || {
                let result = digest_file(&path).map(|(hash, _)| hash);
                let (cell, ready) = &*done.0;
                *cell.lock().unwrap_or_else(|e| e.into_inner()) = Some(result);
                ready.notify_all();
            })
            .map_err(|e| Error::Internal(format!("cannot start the file-hash thread: {e}")))?;
        Ok(digest)
    }

    /// Block until the hash is known. A hashing error is returned to the first caller only.
    pub fn wait(&self) -> Result<String> {
        let (cell, ready) = &*self.0;
        let mut guard = cell.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            match guard.take() {
                Some(Ok(hash)) => {
                    *guard = Some(Ok(hash.clone()));
                    return Ok(hash);
                }
                Some(Err(e)) => {
                    *guard = Some(Err(Error::RunFailed(
                        "hashing the input failed (reported above)".into(),
                    )));
                    return Err(e);
                }
                None => guard = ready.wait(guard).unwrap_or_else(|e| e.into_inner()),
            }
        }
    }
}

/// Bytes sampled from the start of a file to estimate its records.
const LINE_SAMPLE: usize = 4 << 20;

/// The `\n` count of a file: exact when it fits the sample, else extrapolated from its start.
fn sample_lines(path: &Path, bytes: u64) -> Result<u64> {
    let f = landing::open_input(path, &path.display().to_string())?;
    let mut buf = Vec::with_capacity(LINE_SAMPLE);
    f.take(LINE_SAMPLE as u64)
        .read_to_end(&mut buf)
        .map_err(|e| Error::io(path.display(), e))?;
    let n = count_newlines(&buf);
    if buf.len() < LINE_SAMPLE || buf.is_empty() {
        return Ok(n);
    }
    Ok((n as u128 * bytes as u128 / buf.len() as u128) as u64)
}

/// Number of `\n` bytes, counted in byte-wide lanes (the plain filter-count widens every byte to a
/// 64-bit lane and runs several times slower).
fn count_newlines(bytes: &[u8]) -> u64 {
    bytes
        .chunks(255)
        .map(|c| c.iter().fold(0u8, |n, &b| n + u8::from(b == b'\n')) as u64)
        .sum()
}

/// Open the right loader for the contract's format; `.gz` input is decompressed transparently.
pub fn open_loader(
    contract: Arc<Contract>,
    path: &Path,
    name: Option<&str>,
    batch_size: usize,
    keep_raw: bool,
) -> Result<Box<dyn Loader>> {
    let display = name.map_or_else(|| path.display().to_string(), str::to_string);
    let mut file = landing::open_input(path, &display)?;
    let mut magic = [0u8; 2];
    let n = file.read(&mut magic).map_err(|e| Error::io(&display, e))?;
    drop(file);
    let file = landing::open_input(path, &display)?;
    let gz = n == 2 && magic == [0x1f, 0x8b];
    if contract.format == Format::Parquet {
        if gz {
            return Err(Error::RunFailed(format!(
                "{display}: gzip-compressed Parquet is not supported (Parquet compresses internally)"
            )));
        }
        return Ok(Box::new(parquet::ParquetLoader::open(
            contract, file, display, batch_size, keep_raw,
        )?));
    }
    let input: Box<dyn Read + Send> = if gz {
        Box::new(flate2::read::MultiGzDecoder::new(std::io::BufReader::new(file)))
    } else {
        Box::new(file)
    };
    Ok(match contract.format {
        Format::Csv => Box::new(csv::CsvLoader::open(contract, input, display, batch_size, keep_raw)?),
        Format::Ndjson => Box::new(ndjson::NdjsonLoader::open(
            contract, input, display, batch_size, keep_raw,
        )?),
        // the records of an API pull (its kept file, a replay of its failed records) are NDJSON lines
        Format::Api => Box::new(ndjson::NdjsonLoader::open(
            contract, input, display, batch_size, keep_raw,
        )?),
        Format::Parquet => unreachable!("handled above"),
    })
}

pub(crate) fn progress_bar(enabled: bool, total: u64, path: &Path) -> Option<indicatif::ProgressBar> {
    if !enabled {
        return None;
    }
    let bar = indicatif::ProgressBar::new(total);
    let style =
        indicatif::ProgressStyle::with_template("{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
            .progress_chars("=> ");
    bar.set_style(style);
    bar.set_message(
        path.file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
    );
    Some(bar)
}
