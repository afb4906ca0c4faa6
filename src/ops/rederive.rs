//! `ingot doctor --fix` for a damaged bronze data file: derive it again from its run's landing
//! file (an API pull: the file it kept in the lake). The landing file must still be what the run
//! loaded (its SHA-256, or a pull's typed records' hash, equals the run's `file_hash`) and the
//! contract the one the run was loaded under. The run's own pass runs again
//! ([`crate::ingest::rederive`]) against the source's log as it stood when the run took its slot
//! (later runs do not count), with the run's stamps, into a scratch run's folder; the new file
//! replaces the damaged one only if its counts equal the run's and, when the run recorded them,
//! its size and CRC-32 too: an atomic copy, under the source lock.
//!
//! Crash safety: until the copy the damaged file stays (a crash leaves the scratch files, an
//! uncommitted run's, for `ingot gc`); the copy replaces it whole; `--fix` again finishes.
//! Hazards: a file committed before checksums is checked by its counts alone; a relative
//! `file_path` is looked for from the current folder.

use std::path::PathBuf;
use std::sync::Arc;

use object_store::ObjectStoreExt;

use crate::engine::session::Workspace;
use crate::error::{Error, Result};
use crate::spec::contract::Contract;
use crate::table::audit::RunRecord;
use crate::table::failpoint;
use crate::table::lake::{Lake, layout};
use crate::table::upload::FileStamp;

/// What became of a damaged bronze file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Replaced by the file derived again: a line saying so.
    Rederived(String),
    /// Left as it is, and why (the undo advice stays the fix).
    Left(String),
}

/// Derive the bronze data file of run `run_id` of `source` again from its landing file and put
/// it in place of the damaged one, when the landing file and the contract allow and the new file
/// checks out. Errors are the store's or the lock's; every reason not to is an [`Outcome::Left`].
pub async fn bronze_file(ws: &Workspace, source: &str, run_id: &str) -> Result<Outcome> {
    let runs = crate::table::audit::read_source_runs(&ws.lake, source).await?;
    let Some(run) = runs.iter().find(|r| r.run_id == run_id) else {
        return Ok(Outcome::Left(format!("run {run_id} is not in the run log of {source}")));
    };
    if let Some(why) = not_derivable(run) {
        return Ok(Outcome::Left(why));
    }
    let contract = match crate::spec::contract::ContractSet::load_one(&ws.contracts_dir, source) {
        Ok(c) => c,
        Err(e) => return Ok(Outcome::Left(format!("the contract of {source} does not load ({e})"))),
    };
    if let Some(why) = other_contract(&contract, run) {
        return Ok(Outcome::Left(why));
    }
    let opened = if run.pull.is_some() {
        Landing::kept(&ws.lake, run).await
    } else {
        Landing::open(run).await
    };
    let landing = match opened {
        Ok(l) => l,
        Err(why) => return Ok(Outcome::Left(why)),
    };
    // the scratch run holds the lock: gc keeps its files while this works
    let scratch = ws.new_id();
    let ttl = crate::table::lock::default_ttl();
    let lock = crate::table::lock::acquire(&ws.lake, source, &scratch, ttl, ws.lock_wait).await?;
    let outcome = derive_locked(ws, &contract, run_id, &landing, &scratch).await;
    let removed = match outcome {
        // a test's crash: the scratch files stay, as a crash leaves them
        Err(Error::Failpoint(_)) => Ok(()),
        _ => remove_scratch(&ws.lake, source, &scratch).await,
    };
    let released = lock.release().await;
    let outcome = outcome?;
    removed?;
    released?;
    Ok(outcome)
}

/// Why `run` has no landing file its file can be derived from, if so.
fn not_derivable(run: &RunRecord) -> Option<String> {
    if let Some(of) = &run.replay_of {
        return Some(format!(
            "run {} replayed the rejected rows of run {of}: its input was their failure rows, not a landing file",
            run.run_id
        ));
    }
    if run.is_rekey() {
        return Some(format!(
            "run {} is an `ingot rekey` run: it wrote the current records again, from no landing file",
            run.run_id
        ));
    }
    if run.file_hash.is_none() {
        return Some(format!("run {} recorded no SHA-256 of its landing file", run.run_id));
    }
    None
}

/// Why `contract` would not derive `run`'s rows (another version, fields or natural key), if so.
fn other_contract(contract: &Contract, run: &RunRecord) -> Option<String> {
    let source = &contract.source;
    if contract.version as i32 != run.contract_version {
        return Some(format!(
            "the contract of {source} is now version {}, run {} was loaded under version {} (only that contract \
             derives the same rows)",
            contract.version, run.run_id, run.contract_version
        ));
    }
    if run
        .contract_fields
        .as_deref()
        .is_some_and(|f| f != contract.fields_definition())
    {
        return Some(format!(
            "the fields of the contract of {source} are not those run {} was loaded under ({})",
            run.run_id,
            run.contract_fields.as_deref().unwrap_or_default()
        ));
    }
    let key_version = contract.natural_key.version as i32;
    if run.natural_key_version.is_some_and(|v| v != key_version)
        || run
            .natural_key_definition
            .as_deref()
            .is_some_and(|k| k != contract.key_definition())
    {
        return Some(format!(
            "the natural key of the contract of {source} is not the one run {} was keyed with",
            run.run_id
        ));
    }
    None
}

/// A run's landing file, found and checked against the run's `file_hash`, or a pull's kept file.
struct Landing {
    /// The path or URL, for messages.
    display: String,
    /// What it is, for messages: `landing file` or `kept pull file`.
    kind: &'static str,
    /// The file to read: the landing file, or a local copy of a remote one or of a kept pull.
    path: PathBuf,
    /// The name the run read it under (its `file_path`) when `path` is a copy.
    name: Option<String>,
    _copy: Option<Copy>,
}

/// A local copy's scratch folder, removed with it.
enum Copy {
    Remote(#[allow(dead_code)] crate::ingest::landing::Scratch),
    Kept(#[allow(dead_code)] tempfile::TempDir),
}

impl Landing {
    /// The landing file of `run`, or why it cannot be used: gone, unreadable, or no longer the
    /// bytes the run loaded.
    async fn open(run: &RunRecord) -> std::result::Result<Landing, String> {
        let display = run.file_path.to_string();
        let landing = if crate::table::store::is_remote(&display) {
            Landing::fetch(&display).await?
        } else {
            let path = PathBuf::from(display.strip_prefix("file://").unwrap_or(&display));
            match std::fs::metadata(&path) {
                Ok(m) if m.is_file() => {}
                Ok(_) => return Err(format!("landing file {display} is not a file")),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    let from = match std::env::current_dir() {
                        Ok(cwd) if path.is_relative() => format!(" (looked for from {})", cwd.display()),
                        _ => String::new(),
                    };
                    return Err(format!("landing file {display} is gone{from}"));
                }
                Err(e) => return Err(format!("landing file {display} cannot be read ({e})")),
            }
            Landing {
                display,
                kind: "landing file",
                path,
                name: None,
                _copy: None,
            }
        };
        let got = crate::ingest::file_digest(&landing.path)
            .await
            .map_err(|e| format!("landing file {} cannot be read ({e})", landing.display))?
            .0;
        let want = run.file_hash.as_deref().unwrap_or_default();
        if got != want {
            return Err(format!(
                "landing file {} has changed: its SHA-256 is now {}…, the run loaded {}…",
                landing.display,
                got.chars().take(12).collect::<String>(),
                want.chars().take(12).collect::<String>()
            ));
        }
        Ok(landing)
    }

    /// A remote landing file, copied to a local scratch file.
    async fn fetch(url: &str) -> std::result::Result<Landing, String> {
        let found = match crate::ingest::landing::expand_inputs(&[url.to_string()]).await {
            Ok(found) => found,
            Err(Error::Invalid(_)) => return Err(format!("landing file {url} is gone")),
            Err(e) => return Err(format!("landing file {url} cannot be read ({e})")),
        };
        let Some(crate::ingest::Input::Remote(remote)) = found.inputs.into_iter().next() else {
            return Err(format!("landing file {url} is gone"));
        };
        let copy = remote
            .fetch()
            .await
            .map_err(|e| format!("landing file {url} cannot be read ({e})"))?;
        Ok(Landing {
            display: url.to_string(),
            kind: "landing file",
            path: copy.path.clone(),
            name: Some(url.to_string()),
            _copy: Some(Copy::Remote(copy)),
        })
    }

    /// The file an API pull kept in the lake ([`crate::ingest::pull::layout_pull_file`]), copied
    /// to a local scratch file. Its records are checked against the run's `file_hash` as they are
    /// loaded again ([`crate::ingest::rederive`]): a pull's hash is of its typed records.
    async fn kept(lake: &Lake, run: &RunRecord) -> std::result::Result<Landing, String> {
        use futures::StreamExt as _;
        use std::io::Write as _;
        let rel = crate::ingest::pull::layout_pull_file(&run.source, &run.run_id);
        let display = lake.url(&rel);
        let cannot = |e: &dyn std::fmt::Display| format!("kept pull file {display} cannot be read ({e})");
        let got = match lake.store.get(&lake.path(&rel)).await {
            Ok(got) => got,
            Err(object_store::Error::NotFound { .. }) => {
                return Err(format!(
                    "kept pull file {display} is gone: the pull's records can only be pulled again"
                ));
            }
            Err(e) => return Err(cannot(&e)),
        };
        let dir = tempfile::Builder::new()
            .prefix("ingot-kept-pull-")
            .tempdir()
            .map_err(|e| cannot(&e))?;
        let path = dir.path().join("pull.ndjson.gz");
        let mut out = std::io::BufWriter::new(std::fs::File::create(&path).map_err(|e| cannot(&e))?);
        let mut stream = got.into_stream();
        while let Some(chunk) = stream.next().await {
            out.write_all(&chunk.map_err(|e| cannot(&e))?).map_err(|e| cannot(&e))?;
        }
        out.flush().map_err(|e| cannot(&e))?;
        Ok(Landing {
            display,
            kind: "kept pull file",
            path,
            name: Some(run.file_path.to_string()),
            _copy: Some(Copy::Kept(dir)),
        })
    }
}

/// The work under the source lock: the run as it stands now, the log before it, the pass, the
/// checks and the copy.
async fn derive_locked(
    ws: &Workspace,
    contract: &Arc<Contract>,
    run_id: &str,
    landing: &Landing,
    scratch: &str,
) -> Result<Outcome> {
    let lake = &ws.lake;
    let source = contract.source.as_str();
    let rel = layout::bronze_data(source, run_id);
    let mut history = crate::table::log::every_record::<RunRecord>(lake, source).await?;
    history.retain(|r| r.source == source);
    let now = crate::table::log::latest_per_id(history.clone(), |r| r.run_id.as_str(), |r| r.seq);
    // another command may have undone or fixed the run since doctor read the log
    let Some(run) = now
        .iter()
        .find(|r| r.run_id == run_id && r.keeps_files() && r.rows_written() > 0)
    else {
        return Ok(Outcome::Left(format!("run {run_id} no longer holds a bronze file")));
    };
    if let Some(want) = run.data_file
        && stamp_of(lake, &rel).await? == Some(want)
    {
        return Ok(Outcome::Rederived(format!(
            "bronze.{source}: run {run_id}'s file {rel} is whole again (replaced meanwhile)"
        )));
    }
    // the log as the run's ingest read it: the records in the slots below its first record
    let first = history
        .iter()
        .filter(|r| r.run_id == run_id)
        .map(|r| r.seq)
        .min()
        .unwrap_or(run.seq);
    history.retain(|r| r.seq < first);
    let before = crate::table::log::latest_per_id(history, |r| r.run_id.as_str(), |r| r.seq);
    let name = landing.name.as_deref();
    let derived = match crate::ingest::rederive(ws, contract, &landing.path, name, run, &before, scratch).await {
        Ok(d) => d,
        Err(e @ (Error::RunFailed(_) | Error::RunInterrupted(_))) => {
            return Ok(Outcome::Left(format!(
                "deriving it again from {} {} failed ({e}); the damaged file is left as it is",
                landing.kind, landing.display
            )));
        }
        Err(e) => return Err(e),
    };
    if let Some(why) = differs(run, &derived) {
        return Ok(Outcome::Left(format!(
            "deriving it again from {} {} gave {why}; the damaged file is left as it is",
            landing.kind, landing.display
        )));
    }
    failpoint::hit("doctor.before_replace")?;
    let from = layout::bronze_data(source, scratch);
    lake.store
        .copy(&lake.path(&from), &lake.path(&rel))
        .await
        .map_err(|e| crate::table::store::explain(&lake.url(&rel), e))?;
    failpoint::hit("doctor.after_replace")?;
    let checked = match run.data_file {
        Some(_) => "CRC-32 matches",
        None => "its run recorded no CRC-32: the counts match",
    };
    Ok(Outcome::Rederived(format!(
        "bronze.{source}: re-derived run {run_id}'s file {rel} from its {} {} ({} rows, {checked})",
        landing.kind,
        landing.display,
        run.rows_written()
    )))
}

/// How the derived run differs from the committed one (its counts, its data file's size and
/// CRC-32 when recorded), if it does.
fn differs(run: &RunRecord, derived: &RunRecord) -> Option<String> {
    let counts = |r: &RunRecord| {
        [
            r.rows_seen,
            r.rows_inserted,
            r.rows_updated,
            r.rows_unchanged,
            r.rows_failed,
            r.rows_deleted,
        ]
    };
    if counts(run) != counts(derived) {
        let show = |r: &RunRecord| {
            format!(
                "{} seen, {} inserted, {} updated, {} unchanged, {} failed, {} deleted",
                r.rows_seen, r.rows_inserted, r.rows_updated, r.rows_unchanged, r.rows_failed, r.rows_deleted
            )
        };
        return Some(format!("{}, the run recorded {}", show(derived), show(run)));
    }
    match (run.data_file, derived.data_file) {
        (Some(want), got) if got != Some(want) => {
            let got = got.map_or("no file".to_string(), |g| {
                format!("a file of {} bytes with CRC-32 {}", g.bytes, g.crc_hex())
            });
            Some(format!(
                "{got}, the run committed {} bytes with CRC-32 {}",
                want.bytes,
                want.crc_hex()
            ))
        }
        _ => None,
    }
}

/// The size and CRC-32 of a lake file as it is now (`None`: absent).
async fn stamp_of(lake: &Lake, rel: &str) -> Result<Option<FileStamp>> {
    let Some(bytes) = lake.size_of(rel).await? else {
        return Ok(None);
    };
    let crc32 = crate::ops::scrub::crc_of(lake, rel).await?;
    Ok(Some(FileStamp { bytes, crc32 }))
}

/// Remove the scratch run's files (its data and failure files).
async fn remove_scratch(lake: &Lake, source: &str, scratch: &str) -> Result<()> {
    lake.delete(&layout::bronze_data(source, scratch)).await?;
    lake.delete(&layout::failures(scratch)).await
}
