//! `ingot pull`: one pull of a `format: api` source is one run (docs/operations.md#api-pulls).
//!
//! Under the source's lock: read the secrets; fetch every page ([`pages`], each exchange retried
//! by [`http`]) into one gzip NDJSON file of the records' raw text, in a scratch folder; hash it
//! as the normalised response ([`crate::hash::pull`]); a pull whose hash is the newest loaded
//! pull's (or a 304) is recorded as `skipped_duplicate_file` and nothing is written. Otherwise
//! the file is kept at [`layout_pull_file`] and loaded through the ingest's own pass, as an
//! NDJSON file would be, and the run commits with its incremental cursor ([`cursor`]) and
//! counters. A pull that fails records a failed run (transient unless a 4xx other than 429 or a
//! contract setting failed it) and publishes nothing; a crash leaves only files no commit names.

pub mod cursor;
pub mod http;
pub mod pages;
pub mod secrets;

use std::io::Write as _;
use std::path::Path;
use std::sync::Arc;

use crate::engine::session::Workspace;
use crate::error::{Error, Result};
use crate::hash::pull::PullHash;
use crate::ingest::{FileDigest, IngestOptions};
use crate::spec::contract::api::Api;
use crate::spec::contract::{Contract, Format};
use crate::table::audit::{PullStats, RunRecord, RunStatus, commit_run};
use crate::table::failpoint;
use cursor::Cursor;

/// Where a pull's records are kept: beside its bronze file, removed with its run by `gc`.
pub fn layout_pull_file(source: &str, run_id: &str) -> String {
    format!("bronze/{source}/run_id={run_id}/pull.ndjson.gz")
}

/// The newest loaded pull of the source (its cursor, validators and hash are the next pull's
/// starting point); replays and rekeys are not pulls.
pub fn newest_pull<'a>(runs: &'a [RunRecord], source: &str) -> Option<&'a RunRecord> {
    runs.iter()
        .filter(|r| r.source == source && r.status.is_loaded() && r.pull.is_some() && r.replay_of.is_none())
        .max_by_key(|r| r.seq)
}

/// Pull `contract`'s source once: one run, committed (or an infrastructure error: nothing
/// committed, the lock released).
pub async fn pull(ws: &Workspace, contract: Arc<Contract>, opts: &IngestOptions) -> Result<RunRecord> {
    let Some(api) = contract.api.as_deref().filter(|_| contract.format == Format::Api) else {
        return Err(Error::Invalid(format!(
            "source \"{}\" is format: {}, not api: `ingot ingest` loads its files",
            contract.source,
            contract.format.name()
        )));
    };
    let run_id = ws.new_id();
    let started_at = ws.now_micros();
    let record = RunRecord {
        file_path: pages::first_url(api)?.to_string().into(),
        pull: Some(PullStats::default()),
        ..super::new_record(&contract, &run_id, started_at, opts)
    };
    super::locked_run(ws, &contract, record, opts, async |record, runs| {
        run(ws, &contract, api, opts, record, runs).await
    })
    .await
}

async fn run(
    ws: &Workspace,
    contract: &Arc<Contract>,
    api: &Api,
    opts: &IngestOptions,
    record: &mut RunRecord,
    all_runs: &[RunRecord],
) -> Result<()> {
    failpoint::hit("pull.after_lock")?;
    let source = contract.source.as_str();
    let creds = secrets::Credentials::read(source, &api.auth)?;
    let mut client = http::Client::new(source, api, creds)?;
    record.file_path = client.redact.url(&pages::first_url(api)?).into();
    let previous = newest_pull(all_runs, source);
    let prev_stats = previous.and_then(|p| p.pull.as_ref());
    // the cursor the last loaded pull committed, else the configured start
    let field = api.incremental.as_ref().map(|i| &contract.fields[i.field]);
    let start: Option<Cursor> = match (&api.incremental, field) {
        (Some(inc), Some(f)) => prev_stats
            .and_then(|p| p.cursor.as_deref())
            .or(inc.initial.as_deref())
            .and_then(|t| Cursor::parse(f, t)),
        _ => None,
    };
    let sent = match (&api.incremental, field, &start) {
        (Some(inc), Some(f), Some(c)) => Some((inc.param.clone(), c.minus(f, inc.lookback).text(f))),
        _ => None,
    };
    let validators = match prev_stats {
        Some(p) if api.conditional => (
            p.etag.as_deref().map(str::to_string),
            p.last_modified.as_deref().map(str::to_string),
        ),
        _ => (None, None),
    };
    let scratch = tempfile::Builder::new()
        .prefix("ingot-pull-")
        .tempdir()
        .map_err(|e| Error::io("a scratch folder for the pull", e))?;
    let path = scratch.path().join("pull.ndjson.gz");
    let mut file = PullFile::create(&path)?;
    let fetched = match file.tx.take() {
        Some(tx) => pages::fetch(&mut client, api, source, sent, validators, &tx).await,
        None => Err(Error::Internal("the pull file has no writer".into())),
    };
    // the writer's own error (a full disk) is the cause of a send that failed
    let written = file.finish();
    let c = &client.counters;
    let stats = PullStats {
        requests: c.requests,
        pages: fetched.as_ref().map_or(0, |f| f.pages),
        bytes: c.bytes,
        retries: c.retries,
        waited_ms: c.waited.as_millis() as i64,
        cursor: start.as_ref().zip(field).map(|(c, f)| c.text(f).into()),
        etag: None,
        last_modified: None,
    };
    record.pull = Some(stats);
    written?;
    let fetched = fetched?;
    failpoint::hit("pull.after_fetch")?;
    if let Some(p) = record.pull.as_mut() {
        p.etag = fetched.etag.clone().map(Into::into);
        p.last_modified = fetched.last_modified.clone().map(Into::into);
    }
    record.file_bytes = std::fs::metadata(&path)
        .map_err(|e| Error::io(path.display(), e))?
        .len() as i64;
    if fetched.not_modified {
        // 304: the response is the last loaded pull's
        record.file_hash = previous.and_then(|p| p.file_hash.clone());
        return skip(ws, contract, record).await;
    }
    let name = record.file_path.to_string();
    let (hash, newest) = hash_pull(ws, contract, &path, &name, opts.batch_size).await?;
    record.file_hash = Some(hash.as_str().into());
    if let (Some(p), Some(f)) = (record.pull.as_mut(), field) {
        p.cursor = start.into_iter().chain(newest).max().map(|c| c.text(f).into());
    }
    if previous.is_some_and(|p| p.file_hash.as_deref() == Some(hash.as_str())) {
        return skip(ws, contract, record).await;
    }
    failpoint::hit("pull.after_hash")?;
    keep_file(ws, &path, &layout_pull_file(source, &record.run_id)).await?;
    failpoint::hit("pull.after_keep")?;
    let runs: Vec<&RunRecord> = all_runs.iter().filter(|r| r.source == contract.source).collect();
    let opts = IngestOptions {
        input_name: Some(name),
        ..opts.clone()
    };
    let digest = FileDigest::ready(hash);
    super::load(ws, contract, &path, &opts, record, &runs, &digest, fetched.records).await?;
    record.seq = commit_run(&ws.lake, record, Some(contract)).await?;
    Ok(())
}

/// Commit the pull as `skipped_duplicate_file`: nothing changed since the newest loaded pull.
async fn skip(ws: &Workspace, contract: &Contract, record: &mut RunRecord) -> Result<()> {
    record.status = RunStatus::SkippedDuplicateFile;
    record.error = None;
    record.finished_at = ws.now_micros().max(record.started_at);
    record.seq = commit_run(&ws.lake, record, Some(contract)).await?;
    Ok(())
}

/// The pull's file hash and the largest incremental cursor value among the records that typed:
/// a pass over the file (parse, type, hash) before the load, whose rows are stamped with it.
pub(crate) async fn hash_pull(
    ws: &Workspace,
    contract: &Arc<Contract>,
    path: &Path,
    name: &str,
    batch_size: usize,
) -> Result<(String, Option<Cursor>)> {
    let ctx = ws.session()?;
    let hashers = crate::ingest::pass::Hashers::new(&ctx, contract)?;
    let inc = contract
        .api
        .as_ref()
        .and_then(|a| a.incremental.as_ref())
        .map(|i| i.field);
    let (contract, path, name) = (contract.clone(), path.to_path_buf(), name.to_string());
    tokio::task::spawn_blocking(move || -> Result<(String, Option<Cursor>)> {
        let mut loader = super::open_loader(contract, &path, Some(&name), batch_size, true)?;
        let mut h = PullHash::new();
        let mut newest: Option<Cursor> = None;
        use datafusion::arrow::array::Array;
        while let Some(batch) = loader.next_batch()? {
            let (fp, rh, _) = hashers.eval(&batch)?;
            let valid = batch.valid.as_ref();
            for i in 0..batch.num_rows() {
                let ok = valid.is_none_or(|v| v.value(i)) && fp.is_valid(i) && rh.is_valid(i);
                if !(ok && h.add(fp.value(i), rh.value(i))) {
                    let raw = batch.raw.as_ref().filter(|r| r.is_valid(i)).map_or("", |r| r.value(i));
                    h.add_rejected(raw.as_bytes());
                }
            }
            if let Some(f) = inc {
                let m = cursor::column_max(batch.columns[f].as_ref(), valid);
                newest = newest.into_iter().chain(m).max();
            }
        }
        Ok((h.finish(), newest))
    })
    .await
    .map_err(|e| Error::Internal(format!("hashing task failed: {e}")))?
}

/// Copy the pull's file into the lake (in parts when large).
async fn keep_file(ws: &Workspace, path: &Path, rel: &str) -> Result<()> {
    use tokio::io::AsyncReadExt as _;
    let mut f = tokio::fs::File::open(path)
        .await
        .map_err(|e| Error::io(path.display(), e))?;
    let mut up = crate::table::upload::LakeUpload::new(&ws.lake, rel, 0, 2);
    loop {
        let mut buf = vec![0u8; 8 << 20];
        let mut n = 0;
        while n < buf.len() {
            let k = f.read(&mut buf[n..]).await.map_err(|e| Error::io(path.display(), e))?;
            if k == 0 {
                break;
            }
            n += k;
        }
        if n == 0 {
            break;
        }
        buf.truncate(n);
        if let Err(e) = up.put(buf.into()).await {
            up.abort().await;
            return Err(e);
        }
    }
    if let Err(e) = up.finish().await {
        up.abort().await;
        return Err(e);
    }
    Ok(())
}

/// The pull's records, gzip-compressed on a thread of their own while pages arrive (a bounded
/// channel: the fetch waits while the writer is behind).
struct PullFile {
    tx: Option<tokio::sync::mpsc::Sender<Vec<u8>>>,
    done: Option<std::thread::JoinHandle<std::io::Result<()>>>,
    path: String,
}

impl PullFile {
    fn create(path: &Path) -> Result<PullFile> {
        let f = std::fs::File::create(path).map_err(|e| Error::io(path.display(), e))?;
        let (tx, mut rx) = tokio::sync::mpsc::channel::<Vec<u8>>(4);
        let done = std::thread::Builder::new()
            .name("ingot-pull-file".into())
            .spawn(move || {
                let mut gz = flate2::write::GzEncoder::new(std::io::BufWriter::new(f), flate2::Compression::fast());
                while let Some(lines) = rx.blocking_recv() {
                    gz.write_all(&lines)?;
                }
                let mut w = gz.finish()?;
                w.flush()?;
                w.get_ref().sync_all()
            })
            .map_err(|e| Error::Internal(format!("cannot start the pull-file thread: {e}")))?;
        Ok(PullFile {
            tx: Some(tx),
            done: Some(done),
            path: path.display().to_string(),
        })
    }

    fn finish(&mut self) -> Result<()> {
        self.tx = None;
        match self.done.take().map(|d| d.join()) {
            None | Some(Ok(Ok(()))) => Ok(()),
            Some(Ok(Err(e))) => Err(Error::io(&self.path, e)),
            Some(Err(_)) => Err(Error::Internal("the pull-file thread panicked".into())),
        }
    }
}

impl Drop for PullFile {
    fn drop(&mut self) {
        let _ = self.finish();
    }
}
