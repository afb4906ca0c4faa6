//! What the ingest needs to know of a replay (`ingot replay` in [`crate::ops::replay`] builds it):
//! the original run and the record numbers of the replayed rows, as plain data. A replay run's
//! rows keep their original record numbers ([`Renumber`]); a run that rejected CSV rows keeps
//! its header line, and a replay run its note, beside its failure file ([`keep_run_files`]).

use std::io::Read;
use std::path::Path;
use std::sync::Arc;

use std::collections::HashMap;

use datafusion::arrow::array::Int64Array;
use datafusion::prelude::SessionContext;

use crate::error::{Error, Result};
use crate::ingest::keys::{Fp, scan_versions};
use crate::ingest::pass::HashedBatch;
use crate::ingest::sink::ParsedBatch;
use crate::ingest::{IngestOptions, Loader};
use crate::spec::contract::{Contract, Format};
use crate::table::audit::FailureRow;
use crate::table::audit::RunRecord;
use crate::table::lake::{Lake, layout};

/// What a replay run is replaying: given to the ingest through [`IngestOptions::replay`].
#[derive(Debug, Clone)]
pub struct Replay {
    /// The original run.
    pub of: String,
    /// Record number in the original file of each record of the replay input, in order.
    pub row_numbers: Vec<i64>,
    /// `file_path` of the replay run.
    pub file_path: String,
    /// SHA-256 of the contract file used.
    pub contract_sha256: String,
    /// The loaded runs of the source committed after the original, as `ingot replay` saw them
    /// (kept in the note: a replay of the same rows is pointless only while these are the same).
    pub later_runs: Vec<String>,
}

/// `replay.json` of a replay run.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub(crate) struct ReplayNote {
    pub replay_of: String,
    pub rows: Vec<i64>,
    pub contract_sha256: String,
    #[serde(default)]
    pub later_runs: Vec<String>,
}

/// Rule of a replayed record that is not loaded because a later run delivered its key.
pub const REPLAY_SUPERSEDED: &str = "replay_superseded";

/// A replayed record keeps its place in time: it counts as delivered by its original run, so it
/// never supersedes a version a run committed after the original delivered (a newer version, or a
/// tombstone). The keys those runs delivered, each with the latest such run.
pub struct Superseding {
    pub original: String,
    keys: HashMap<Fp, u32>,
    runs: Vec<String>,
}

impl Superseding {
    /// The failure row of record `i` of `batch` (with key `key`) when a run committed after the
    /// original delivered its key (`None`: the record loads as usual).
    pub fn failure(&self, key: Fp, batch: &HashedBatch, i: usize) -> Option<FailureRow> {
        let by = &self.runs[*self.keys.get(&key)? as usize];
        Some(FailureRow {
            source_row_number: Some(batch.batch.row_numbers.value(i)),
            natural_key_fingerprint: Some(batch.fp.value(i).to_string()),
            raw_payload: batch
                .batch
                .raw
                .as_ref()
                .map(|r| r.value(i).to_string())
                .unwrap_or_default(),
            rule: REPLAY_SUPERSEDED.into(),
            reason: format!(
                "run {by} (committed after run {}) delivered this key: the replayed version is older, so it is \
                 not loaded (undo that run first to make it current)",
                self.original
            ),
        })
    }
}

/// The runs of `current` (one source's current state, in commit order) committed after run
/// `original`, other than its own replays (their records count as the original's).
pub fn later_runs<'a>(current: &[&'a RunRecord], runs: &[&RunRecord], original: &str) -> Vec<&'a RunRecord> {
    let Some(slot) = runs.iter().find(|r| r.run_id == original).map(|r| r.seq) else {
        return Vec::new();
    };
    current
        .iter()
        .copied()
        .filter(|r| r.seq > slot && r.replay_of.as_deref() != Some(original))
        .collect()
}

/// Read the keys of the runs after the replay's original (under the source's lock). Memory: ~40
/// bytes per distinct key those runs hold; a replay is rare and its input small.
pub async fn superseding(
    ctx: &SessionContext,
    cluster: Option<&str>,
    lake: &Lake,
    replay: &Replay,
    current: &[&RunRecord],
    runs: &[&RunRecord],
) -> Result<Superseding> {
    let later = later_runs(current, runs, &replay.of);
    let mut keys = HashMap::new();
    for (i, r) in later.iter().enumerate() {
        let url = lake.url(&layout::bronze_data(&r.source, &r.run_id));
        scan_versions(ctx, cluster, &url, |fp, _| {
            keys.insert(fp, i as u32);
            Ok(())
        })
        .await?;
    }
    Ok(Superseding {
        original: replay.of.clone(),
        keys,
        runs: later.iter().map(|r| r.run_id.to_string()).collect(),
    })
}

pub(crate) fn header_rel(run_id: &str) -> String {
    layout::failures(run_id).replace("part-00000.parquet", "header.csv")
}

pub(crate) fn note_rel(run_id: &str) -> String {
    layout::failures(run_id).replace("part-00000.parquet", "replay.json")
}

/// Called by the ingest before it commits a run (only the files of a committed run are read):
/// keep the CSV header of a run that rejected rows, and the note of a replay run.
pub async fn keep_run_files(
    lake: &Lake,
    contract: &Contract,
    path: &Path,
    record: &RunRecord,
    opts: &IngestOptions,
) -> Result<()> {
    if let Some(r) = &opts.replay {
        let note = ReplayNote {
            replay_of: r.of.clone(),
            rows: r.row_numbers.clone(),
            contract_sha256: r.contract_sha256.clone(),
            later_runs: r.later_runs.clone(),
        };
        let bytes = serde_json::to_vec(&note).map_err(|e| Error::RunFailed(format!("replay note: {e}")))?;
        lake.put(&note_rel(&record.run_id), bytes.into()).await?;
    } else if contract.format == Format::Csv && contract.csv.header && record.rows_failed > 0 {
        let header = csv_header(path, contract.csv.quote)?;
        lake.put(&header_rel(&record.run_id), header.into()).await?;
    }
    Ok(())
}

/// The first record of a CSV file (decompressed, without a byte-order mark or line end).
fn csv_header(path: &Path, quote: u8) -> Result<Vec<u8>> {
    let display = path.display().to_string();
    let mut file = crate::ingest::landing::open_input(path, &display)?;
    let mut magic = [0u8; 2];
    let n = file.read(&mut magic).map_err(|e| Error::io(&display, e))?;
    let file = crate::ingest::landing::open_input(path, &display)?;
    let input: Box<dyn Read> = if n == 2 && magic == [0x1f, 0x8b] {
        Box::new(flate2::read::MultiGzDecoder::new(std::io::BufReader::new(file)))
    } else {
        Box::new(file)
    };
    let input = std::io::BufReader::new(input);
    let mut out = Vec::new();
    let mut quoted = false;
    for b in input.bytes() {
        let b = b.map_err(|e| Error::io(&display, e))?;
        if b == quote {
            quoted = !quoted;
        } else if (b == b'\n' || b == b'\r') && !quoted {
            break;
        }
        out.push(b);
        if out.len() > 1 << 20 {
            return Err(Error::RunFailed(format!(
                "{display}: the header line is longer than 1 MiB"
            )));
        }
    }
    if out.starts_with(&[0xef, 0xbb, 0xbf]) {
        out.drain(..3);
    }
    Ok(out)
}

/// A loader that gives every record the number it had in the original file.
pub struct Renumber {
    inner: Box<dyn Loader>,
    numbers: Arc<Replay>,
}

impl Renumber {
    pub fn wrap(inner: Box<dyn Loader>, replay: Option<Arc<Replay>>) -> Box<dyn Loader> {
        match replay {
            Some(numbers) => Box::new(Renumber { inner, numbers }),
            None => inner,
        }
    }

    fn map(&self, n: u64) -> Result<i64> {
        self.numbers
            .row_numbers
            .get((n as usize).wrapping_sub(1))
            .copied()
            .ok_or_else(|| {
                Error::RunFailed(format!(
                    "replay of run {}: the replayed rows parsed into more than the {} records replayed",
                    self.numbers.of,
                    self.numbers.row_numbers.len()
                ))
            })
    }
}

impl Loader for Renumber {
    fn next_batch(&mut self) -> Result<Option<ParsedBatch>> {
        let Some(mut batch) = self.inner.next_batch()? else {
            return Ok(None);
        };
        let mapped: Vec<i64> = batch
            .row_numbers
            .values()
            .iter()
            .map(|&n| self.map(n as u64))
            .collect::<Result<_>>()?;
        batch.row_numbers = Arc::new(Int64Array::from(mapped));
        for r in &mut batch.rejections {
            r.row_number = self.map(r.row_number)? as u64;
        }
        Ok(Some(batch))
    }

    fn ignored_columns(&self) -> Vec<String> {
        self.inner.ignored_columns()
    }
}
