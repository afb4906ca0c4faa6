//! The key state of a source: what change detection folds out of the source's current runs (the
//! live version of every key: its 128-bit fingerprint prefix and 64-bit row-hash prefix), kept so
//! that an ingest reads it and the few runs committed after it instead of every run's file.
//!
//! A state lives at `_cache/keys/<source>/<hash layout>/<through>-<digest>.parquet` (columns
//! `key_hi`, `key_lo`, `row_hash`, all `UInt64`): it covers the current runs up to slot `through`,
//! whose `run_id@slot` list digests to `digest` (the first 16 hex digits of its SHA-256). It is
//! used only while the source's current runs still begin with exactly those runs: an undo, a
//! publish or a rekey of a covered run changes that list, and the ingest folds every run again
//! (and writes a new state). It is a cache, never the truth: written before the run's pass from
//! the folded index, every `key_state_every` uncovered runs ([`crate::table::lake::Cadence`]), and a state that cannot be read is passed over.

use std::sync::Arc;

use datafusion::arrow::array::{Array, AsArray, RecordBatch, UInt64Array};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef, UInt64Type};
use datafusion::prelude::SessionContext;
use futures::StreamExt;

use crate::error::{Error, Result};
use crate::ingest::keys::{Fp, InMemory};
use crate::table::audit::RunRecord;
use crate::table::bronze::RunFileWriter;
use crate::table::lake::{Lake, layout};
use object_store::ObjectStoreExt;

fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("key_hi", DataType::UInt64, false),
        Field::new("key_lo", DataType::UInt64, false),
        Field::new("row_hash", DataType::UInt64, false),
    ]))
}

/// The digest a state of `runs` (a prefix of the current runs) carries in its name.
pub fn digest(runs: &[&RunRecord]) -> String {
    use sha2::Digest;
    // `<run_id>@<slot>\n` per run, hashed as it goes (a long history: no text of every run)
    let mut hasher = sha2::Sha256::new();
    let mut slot = itoa::Buffer::new();
    for r in runs {
        hasher.update(r.run_id.as_bytes());
        hasher.update(b"@");
        hasher.update(slot.format(r.seq).as_bytes());
        hasher.update(b"\n");
    }
    let mut hex = [0u8; 64];
    crate::hash::hex_lower(&hasher.finalize().into(), &mut hex);
    hex[..16].iter().map(|&b| b as char).collect()
}

/// A usable key state: where it is and how many of the current runs it covers.
pub struct Found {
    pub rel: String,
    pub covered: usize,
    /// The file's size, as listed.
    pub bytes: u64,
}

/// The latest key state of `source` under `hash_layout` that covers a prefix of `current` (the
/// source's current runs in commit order), if any.
pub async fn find(lake: &Lake, source: &str, hash_layout: &str, current: &[&RunRecord]) -> Result<Option<Found>> {
    let listed = lake.list(&layout::key_states(source, hash_layout)).await?;
    for meta in listed.iter().rev() {
        let Some((through, want)) = meta
            .location
            .filename()
            .and_then(|n| n.strip_suffix(".parquet"))
            .and_then(|n| n.split_once('-'))
            .and_then(|(t, d)| Some((t.parse::<u64>().ok()?, d)))
        else {
            continue;
        };
        let covered = current.iter().take_while(|r| r.seq <= through).count();
        if covered == 0 || current[covered - 1].seq != through || digest(&current[..covered]) != want {
            continue;
        }
        return Ok(Some(Found {
            rel: layout::key_state(source, hash_layout, through, want),
            covered,
            bytes: meta.size,
        }));
    }
    Ok(None)
}

/// Fold the state `found` into `f` (key, row-hash prefix).
pub async fn load(ctx: &SessionContext, lake: &Lake, found: &Found, mut f: impl FnMut(Fp, u64)) -> Result<()> {
    crate::table::parquet::check_footer(lake, &found.rel, found.bytes).await?;
    let url = lake.url(&found.rel);
    let df = ctx.read_table(crate::engine::catalog::table_over(vec![url.clone()], schema())?)?;
    let mut stream = crate::engine::exec::stream(None, df, "ingest: key state").await?;
    while let Some(batch) = stream.next().await {
        let batch = batch?;
        let column = |i: usize| {
            let c = batch.column(i);
            (c.null_count() == 0)
                .then(|| c.as_primitive_opt::<UInt64Type>())
                .flatten()
                .ok_or_else(|| Error::RunFailed(format!("{url}: column {i} is not a non-null uint64")))
        };
        let (hi, lo, rh) = (column(0)?, column(1)?, column(2)?);
        for i in 0..batch.num_rows() {
            f(Fp(hi.value(i), lo.value(i)), rh.value(i));
        }
    }
    Ok(())
}

/// Write the state of `index` (folded from exactly `current`, the source's current runs) as the
/// state through the last of them.
pub async fn write(
    lake: &Lake,
    source: &str,
    hash_layout: &str,
    current: &[&RunRecord],
    index: &InMemory,
) -> Result<()> {
    let Some(last) = current.last() else {
        return Ok(());
    };
    let rel = layout::key_state(source, hash_layout, last.seq, &digest(current));
    let mut writer = RunFileWriter::new(lake, rel, schema()).uncompressed();
    const CHUNK: usize = 1 << 16;
    let (mut hi, mut lo, mut rh) = (
        Vec::with_capacity(CHUNK),
        Vec::with_capacity(CHUNK),
        Vec::with_capacity(CHUNK),
    );
    let mut versions = index.current_versions().peekable();
    while versions.peek().is_some() {
        for (key, row_hash) in versions.by_ref().take(CHUNK) {
            hi.push(key.0);
            lo.push(key.1);
            rh.push(row_hash);
        }
        let batch = RecordBatch::try_new(
            schema(),
            vec![
                Arc::new(UInt64Array::from(std::mem::take(&mut hi))),
                Arc::new(UInt64Array::from(std::mem::take(&mut lo))),
                Arc::new(UInt64Array::from(std::mem::take(&mut rh))),
            ],
        )?;
        writer.write(&batch).await?;
    }
    writer.finish().await?;
    // keep this state and the newest before it, so the folder every ingest lists stays small
    let states = lake.list(&layout::key_states(source, hash_layout)).await?;
    for meta in states.iter().rev().skip(2) {
        lake.store.delete(&meta.location).await?;
    }
    Ok(())
}

/// Does the key state an ingest of `contract`'s source would use now (`runs`: the run log) equal
/// the fold of the runs it covers? `Some((path, why))` when it does not (or cannot be read), for `ingot doctor`.
pub async fn check(
    ws: &crate::engine::session::Workspace,
    contract: &crate::spec::contract::Contract,
    runs: &[RunRecord],
) -> Result<Option<(String, String)>> {
    let current = crate::engine::catalog::current_runs(runs.iter(), &contract.source);
    let hash_layout = crate::table::evolve::hash_layout(contract);
    let Some(found) = find(&ws.lake, &contract.source, &hash_layout, &current).await? else {
        return Ok(None);
    };
    let ctx = ws.session()?;
    let mut state = std::collections::HashMap::new();
    if let Err(e) = load(&ctx, &ws.lake, &found, |k, rh| {
        state.insert(k, rh);
    })
    .await
    {
        return Ok(Some((found.rel, format!("{e}: ingests pass it over; remove it"))));
    }
    let stored = crate::table::evolve::stored_runs(&ws.lake, contract, &current[..found.covered])?;
    let hashers = crate::ingest::pass::Hashers::new(&ctx, contract)?;
    let mut index = InMemory::new(state.len());
    for s in &stored {
        crate::ingest::keys::scan_stored(&ctx, None, &ws.lake, contract, &hashers, s, |k, rh| {
            index.add_current(k, rh);
            Ok(())
        })
        .await?;
    }
    let folded: std::collections::HashMap<Fp, u64> = index.current_versions().collect();
    if folded == state {
        return Ok(None);
    }
    Ok(Some((
        found.rel,
        format!(
            "holds {} keys, but the {} runs it covers fold to {} (or to other row hashes): ingests trust it, so \
             remove it (the next ingest reads every run)",
            state.len(),
            found.covered,
            folded.len()
        ),
    )))
}
