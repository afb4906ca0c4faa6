//! Bounded-memory change detection for sources and files whose keys do not fit the in-memory
//! index (a grace-hash plan).
//!
//! Keys are split into 2^bits partitions by their leading fingerprint bits. The committed versions
//! of the source and the (key, row hash, record number) of every valid row of the file are spilled
//! to one temporary file per partition (24 and 32 bytes a record); each partition is then
//! classified alone with the same rules as the in-memory index, giving the fate of every record
//! as bit sets. The write pass re-reads the input and writes exactly those records. Memory is
//! one partition's index plus the bit sets (one bit per record); the price is a second parse of
//! the input. [`partition_bits`] chooses the mode from the memory budget.
//!
//! A `delivery: full` file also spills the keys of its rejected records (they count as delivered),
//! and each partition adds the current keys the file lacks to a sorted list of deletions (16 bytes
//! a deleted key: the one part that grows with the data, with the number of deletions).

use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use datafusion::prelude::SessionContext;

use crate::error::{Error, Result};
use crate::ingest::keys::{Fate, Fp, InMemory, Planned, scan_stored};
use crate::ingest::pass::{RunInput, spawn_producer};
use crate::table::evolve::StoredRun;

/// Bytes of index per key, including hash-table slack (40-byte entries, 7/8 load factor,
/// power-of-two growth).
const BYTES_PER_KEY: u64 = 80;

/// How many leading fingerprint bits to partition by (0: everything fits in memory).
pub fn partition_bits(keys_estimate: u64, budget_bytes: u64) -> u32 {
    let need = keys_estimate.saturating_mul(BYTES_PER_KEY);
    if need <= budget_bytes {
        return 0;
    }
    let ratio = need.div_ceil(budget_bytes.max(1));
    (64 - (ratio - 1).leading_zeros()).clamp(1, 8)
}

fn partition_of(key: Fp, bits: u32) -> usize {
    (key.0 >> (64 - bits)) as usize
}

fn io(path: &Path) -> impl Fn(std::io::Error) -> Error + '_ {
    move |e| Error::io(path.display(), e)
}

struct Spill {
    paths: Vec<PathBuf>,
    writers: Vec<BufWriter<File>>,
}

impl Spill {
    fn create(dir: &Path, name: &str, parts: usize) -> Result<Spill> {
        let mut paths = Vec::with_capacity(parts);
        let mut writers = Vec::with_capacity(parts);
        for p in 0..parts {
            let path = dir.join(format!("{name}-{p}"));
            let f = File::create(&path).map_err(io(&path))?;
            writers.push(BufWriter::with_capacity(64 * 1024, f));
            paths.push(path);
        }
        Ok(Spill { paths, writers })
    }

    fn push(&mut self, part: usize, words: &[u64]) -> Result<()> {
        let w = &mut self.writers[part];
        for word in words {
            w.write_all(&word.to_le_bytes()).map_err(io(&self.paths[part]))?;
        }
        Ok(())
    }

    fn finish(self) -> Result<Vec<PathBuf>> {
        for (mut w, p) in self.writers.into_iter().zip(&self.paths) {
            w.flush().map_err(io(p))?;
        }
        Ok(self.paths)
    }
}

/// Read a spill file of `N`-word records.
fn read_records<const N: usize>(path: &Path, mut f: impl FnMut([u64; N])) -> Result<()> {
    let mut r = BufReader::with_capacity(256 * 1024, File::open(path).map_err(io(path))?);
    let mut buf = vec![0u8; N * 8];
    loop {
        match r.read_exact(&mut buf) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(io(path)(e)),
        }
        let mut rec = [0u64; N];
        for (i, w) in rec.iter_mut().enumerate() {
            let mut b = [0u8; 8];
            b.copy_from_slice(&buf[i * 8..i * 8 + 8]);
            *w = u64::from_le_bytes(b);
        }
        f(rec);
    }
}

/// Classify every record of the file with memory bounded by one partition's keys.
/// `full`: the file is a full delivery, so the current keys it lacks become `deletions`.
pub async fn plan(
    ctx: &SessionContext,
    input: &RunInput<'_>,
    committed: &[StoredRun],
    bits: u32,
    full: bool,
) -> Result<Planned> {
    let RunInput {
        contract,
        path,
        opts,
        hashers,
        ..
    } = *input;
    let parts = 1usize << bits;
    let dir = tempfile::Builder::new()
        .prefix("ingot-spill-")
        .tempdir()
        .map_err(|e| Error::io(std::env::temp_dir().display(), e))?;

    // Committed versions, oldest run first, so that reading a partition back in order leaves
    // the newest version of each key.
    let mut current = Spill::create(dir.path(), "current", parts)?;
    for stored in committed {
        scan_stored(
            ctx,
            input.ws.cluster.as_deref(),
            &input.ws.lake,
            contract,
            hashers,
            stored,
            |fp, rh| {
                // [key, row hash, 1 for a live version / 0 for a tombstone]
                current.push(
                    partition_of(fp, bits),
                    &[fp.0, fp.1, rh.unwrap_or(0), u64::from(rh.is_some())],
                )
            },
        )
        .await?;
    }
    let current = current.finish()?;

    // Every valid row of the file, in record order; for a full delivery also the keys of
    // rejected rows (record number PRESENT_ONLY): they count as delivered.
    let mut rows = Spill::create(dir.path(), "file", parts)?;
    let mut producer = spawn_producer(contract, path, opts, hashers, false);
    while let Some(hashed) = producer.rx.recv().await {
        let hashed = hashed?;
        for i in (0..hashed.batch.num_rows()).filter(|&i| hashed.is_valid(i)) {
            let (key, rh) = hashed.key(i);
            let row = hashed.batch.row_numbers.value(i) as u64;
            rows.push(partition_of(key, bits), &[key.0, key.1, rh, row])?;
        }
        if full {
            for r in hashed.batch.rejections.iter().filter(|r| r.key_ok) {
                let (key, _) = hashed.key(r.index);
                rows.push(partition_of(key, bits), &[key.0, key.1, 0, PRESENT_ONLY])?;
            }
        }
    }
    producer
        .thread
        .await
        .map_err(|e| Error::RunFailed(format!("parser task failed: {e}")))?;
    let rows = rows.finish()?;

    let mut planned = Planned::default();
    for p in 0..parts {
        let mut records: Vec<[u64; 4]> = Vec::new();
        read_records::<4>(&rows[p], |r| records.push(r))?;
        let mut index = InMemory::new(records.len());
        read_records::<4>(&current[p], |r| {
            index.add_current(Fp(r[0], r[1]), (r[3] == 1).then_some(r[2]))
        })?;
        let mut fates: Vec<Fate> = records.iter().map(|r| index.classify_row(r)).collect();
        if index.has_found() {
            index.rerun_with_found();
            fates = records.iter().map(|r| index.classify_row(r)).collect();
        }
        if full {
            use crate::ingest::keys::Classifier;
            planned.current += index.current_records();
            planned.deletions.extend(index.absent_keys());
        }
        for (r, fate) in records.iter().zip(fates) {
            match fate {
                Fate::Inserted => planned.inserted.insert(r[3]),
                Fate::Updated => planned.updated.insert(r[3]),
                Fate::Conflict => planned.conflicts.insert(r[3]),
                Fate::Unchanged => {}
            }
        }
    }
    planned.deletions.sort_unstable();
    Ok(planned)
}

/// The record number of a spilled file record that only says its key was delivered.
const PRESENT_ONLY: u64 = u64::MAX;

impl InMemory {
    fn classify_row(&mut self, r: &[u64; 4]) -> Fate {
        use crate::ingest::keys::Classifier;
        if r[3] == PRESENT_ONLY {
            self.mark_present(Fp(r[0], r[1]));
            return Fate::Unchanged;
        }
        self.classify(Fp(r[0], r[1]), r[2], r[3])
    }

    fn has_found(&self) -> bool {
        use crate::ingest::keys::Classifier;
        self.discovered()
    }
}
