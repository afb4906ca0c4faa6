//! The key map of a table with several sources: one pass over the fingerprints of every run of
//! every source (newest first within each), giving each record's current candidate per source.
//! A record's version is then the combination of its sources' runs, named by their run ids in
//! source-name order joined by `+` (the run id itself for one source): the id the build's state
//! records, so a record is processed again exactly when one of its candidates changed, and a
//! change of precedence alone leaves the state as it was (`--rebuild-where` applies it).

use std::collections::HashMap;
use std::sync::Arc;

use datafusion::arrow::array::Array;
use datafusion::arrow::array::AsArray;
use datafusion::arrow::datatypes::DataType;
use datafusion::dataframe::DataFrame;
use datafusion::prelude::SessionContext;
use futures::StreamExt;

use super::SourceInputs;
use crate::error::{Error, Result};
use crate::hash::fp::{Fp, FpSet, for_each_fp, in_set_udf};
use crate::silver::fps;
use crate::silver::keys::{Entry, Keys, NONE};
use crate::spec::columns::{FINGERPRINT, IS_DELETED};
use crate::table::audit::RunRecord;
use crate::table::lake::Lake;
use crate::table::silver::c;

/// A candidate whose source's latest version is a tombstone, while the runs are read.
const DELETED: u32 = u32::MAX - 1;

/// Interns source-run combinations.
struct Combos {
    of: Vec<Vec<u32>>,
    index: HashMap<Vec<u32>, u32>,
}

impl Combos {
    fn new(width: usize) -> Combos {
        let empty = vec![NONE; width];
        Combos {
            of: vec![empty.clone()],
            index: HashMap::from([(empty, 0)]),
        }
    }

    fn intern(&mut self, combo: Vec<u32>) -> u32 {
        if let Some(i) = self.index.get(&combo) {
            return *i;
        }
        let i = self.of.len() as u32;
        self.of.push(combo.clone());
        self.index.insert(combo, i);
        i
    }
}

/// The key map of every current record of the sources (`runs[s]`: source `s`'s runs, newest
/// first): [`Keys::combos`] holds each combination's run per source, [`Keys::runs`] its id.
pub async fn current_keys(
    ctx: &SessionContext,
    cluster: Option<&str>,
    lake: &Lake,
    inputs: &[SourceInputs],
    runs: &[Vec<&RunRecord>],
) -> Result<Keys> {
    let all: Vec<usize> = runs.iter().map(Vec::len).collect();
    let (keys, combos) = scan_runs(ctx, cluster, lake, inputs, runs, &all).await?;
    Ok(settle(keys, combos, inputs, runs))
}

/// The key map of a delta build: the records of the newest `new[s]` runs of each source and the
/// `forced` ones, each with its candidate per source: from those runs where they have it, else
/// as the previous build's `state` (its key and run columns) names it.
pub async fn delta_keys(
    ctx: &SessionContext,
    lake: &Lake,
    inputs: &[SourceInputs],
    runs: &[Vec<&RunRecord>],
    new: &[usize],
    forced: &[Fp],
    state: DataFrame,
) -> Result<Keys> {
    let (mut keys, mut combos) = scan_runs(ctx, None, lake, inputs, runs, new).await?;
    for fp in forced {
        keys.map.entry(*fp).or_insert(Entry {
            cur: 0,
            prev: NONE,
            version: 0,
            outcome: 0,
        });
    }
    let mut index: HashMap<&str, (usize, u32)> = HashMap::new();
    for (s, runs) in runs.iter().enumerate() {
        for (i, run) in runs.iter().enumerate() {
            index.insert(run.run_id.as_str(), (s, i as u32));
        }
    }
    let touched: Arc<FpSet> = Arc::new(keys.map.keys().copied().collect());
    let state = state
        .filter(Arc::new(in_set_udf(touched)).call(vec![c(FINGERPRINT)]))?
        .select(vec![c(FINGERPRINT), c(crate::table::silver::RUN_ID)])?;
    let mut stream = crate::engine::exec::stream(None, state, "build: previous state").await?;
    while let Some(b) = stream.next().await {
        let b = b?;
        let ids = datafusion::arrow::compute::cast(b.column(1), &DataType::Utf8)?;
        let ids = ids.as_string::<i32>();
        let mut rows = Vec::with_capacity(b.num_rows());
        for_each_fp(b.column(0), |i, fp| rows.extend(fp.map(|fp| (i, fp))))?;
        for (i, fp) in rows {
            let Some(e) = keys.map.get_mut(&fp) else { continue };
            if ids.is_null(i) {
                continue;
            }
            let mut next = combos.of[e.cur as usize].clone();
            for id in ids.value(i).split('+') {
                let Some(&(s, run)) = index.get(id) else {
                    return Err(Error::RunFailed(format!(
                        "the previous build's state names run {id}, which no source of the table has \
                         (undone since?): build the table with --full"
                    )));
                };
                // the newest runs' version (or tombstone) wins over the older one
                if next[s] == NONE {
                    next[s] = run;
                }
            }
            e.cur = combos.intern(next);
        }
    }
    Ok(settle(keys, combos, inputs, runs))
}

/// One pass over the newest `take[s]` runs of each source: the key map with each record's
/// combination (tombstones still marked), and the combinations.
async fn scan_runs(
    ctx: &SessionContext,
    cluster: Option<&str>,
    lake: &Lake,
    inputs: &[SourceInputs],
    runs: &[Vec<&RunRecord>],
    take: &[usize],
) -> Result<(Keys, Combos)> {
    let width = inputs.len();
    let capacity: i64 = runs
        .iter()
        .zip(take)
        .flat_map(|(r, n)| r.iter().take(*n))
        .map(|r| r.rows_inserted + r.rows_updated)
        .sum();
    let mut keys = Keys::new(Vec::new(), usize::try_from(capacity).unwrap_or(0));
    let mut combos = Combos::new(width);
    // Each source's fingerprints are read and decoded by a task of its own (newest run first),
    // while this one steps the key map: a source's batches arrive in order, and sources only
    // touch their own slot of a combination, so their interleaving does not matter.
    let mut groups = Vec::with_capacity(width);
    for (s, (input, runs)) in inputs.iter().zip(runs).enumerate() {
        let mut plans = Vec::with_capacity(runs.len());
        for (i, run) in runs.iter().enumerate().take(take.get(s).copied().unwrap_or(0)) {
            let stored = crate::table::evolve::stored_runs(lake, &input.contract, &[*run])?;
            let table = crate::table::evolve::read_stored(ctx, &input.contract, &stored.iter().collect::<Vec<_>>())?;
            plans.push(fps::Run {
                run: i as u32,
                what: format!("bronze run {} of \"{}\"", run.run_id, run.source),
                rows: input.keyed(table)?.select(vec![c(FINGERPRINT), c(IS_DELETED)])?,
            });
        }
        groups.push(plans);
    }
    let (mut rx, tasks) = fps::read(cluster, groups);
    // (source, combination, this source's run) -> the combination with it: a few distinct
    // steps per run, no combination built per row
    let mut steps: HashMap<(usize, u32), Vec<u32>> = HashMap::new();
    while let Some(batch) = rx.recv().await {
        let batch = batch?;
        let (s, run) = (batch.group, batch.run);
        // per value this batch gives (its run, or a tombstone): the next combination by the
        // current one, looked up by index (NONE: not yet interned)
        let mut live = steps.remove(&(s, run)).unwrap_or_default();
        let mut dead = steps.remove(&(s, DELETED)).unwrap_or_default();
        for (row, fp) in batch.fps.iter().copied().enumerate() {
            let e = keys.map.entry(fp).or_insert(Entry {
                cur: 0,
                prev: NONE,
                version: 0,
                outcome: 0,
            });
            let cur = e.cur as usize;
            if combos.of[cur][s] != NONE {
                continue; // a newer run of this source has the record
            }
            let tombstone = batch.is_deleted(row);
            let (value, step) = if tombstone {
                (DELETED, &mut dead)
            } else {
                (run, &mut live)
            };
            if step.len() <= cur {
                step.resize(cur + 1, NONE);
            }
            if step[cur] == NONE {
                let mut next = combos.of[cur].clone();
                next[s] = value;
                step[cur] = combos.intern(next);
            }
            e.cur = step[cur];
        }
        steps.insert((s, run), live);
        steps.insert((s, DELETED), dead);
    }
    drop(tasks);
    Ok((keys, combos))
}

/// The key map after the runs were read: tombstoned candidates are no candidates, a record with
/// none left is not current; each combination named by its runs.
fn settle(mut keys: Keys, combos: Combos, inputs: &[SourceInputs], runs: &[Vec<&RunRecord>]) -> Keys {
    let width = inputs.len();
    // tombstoned candidates are no candidates; a record with none left is not current
    let mut current = Combos::new(width);
    let remap: Vec<u32> = combos
        .of
        .iter()
        .map(|combo| {
            let clean: Vec<u32> = combo.iter().map(|r| if *r == DELETED { NONE } else { *r }).collect();
            if clean.iter().all(|r| *r == NONE) {
                NONE
            } else {
                current.intern(clean) - 1
            }
        })
        .collect();
    let tombstones = &mut keys.tombstones;
    keys.map.retain(|fp, e| {
        e.cur = remap[e.cur as usize];
        if e.cur == NONE {
            tombstones.insert(*fp);
        }
        e.cur != NONE
    });
    keys.combos = current.of.split_off(1);
    let mut by_name: Vec<usize> = (0..width).collect();
    by_name.sort_by(|a, b| inputs[*a].source.cmp(&inputs[*b].source));
    keys.runs = keys
        .combos
        .iter()
        .map(|combo| combination_id(&by_name, combo, runs))
        .collect();
    keys.current_runs = keys.runs.len();
    keys
}

/// The id of a combination: its runs in source-name order (`by_name`), joined by `+`.
fn combination_id(by_name: &[usize], combo: &[u32], runs: &[Vec<&RunRecord>]) -> String {
    let mut id = String::new();
    for &s in by_name {
        let Some(run) = runs[s].get(combo[s] as usize) else {
            continue;
        };
        if !id.is_empty() {
            id.push('+');
        }
        id.push_str(&run.run_id);
    }
    id
}
