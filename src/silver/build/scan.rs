//! The narrow scans a build plan decides with: the fingerprints of every bronze run (which run
//! holds each record's current version) and the previous build's state (what it decided per
//! record), into one [`Keys`] map of ~32 bytes a record.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, AsArray, Int32Array, RecordBatch};
use datafusion::arrow::compute::cast as arrow_cast;
use datafusion::arrow::datatypes::{DataType, Field, Int32Type, Schema};
use datafusion::catalog::TableProvider;
use datafusion::logical_expr::Expr;
use datafusion::prelude::SessionContext;
use futures::StreamExt;

use crate::error::Result;
use crate::hash::fp::for_each_fp;
use crate::silver::compile::RULES_VERSION;
use crate::silver::keys::{Keys, NONE, outcome_of};
use crate::spec::contract::Contract;
use crate::table::audit::RunRecord;
use crate::table::lake::Lake;
use crate::table::silver::{FP, OUTCOME, RUN_ID, Side, c, dict_type, layers, manifest, table_over_build_files};

/// For every row of a text column, `f(value)` evaluated once per distinct value.
fn per_value<T: Copy>(col: &ArrayRef, mut f: impl FnMut(&str) -> T) -> Result<Vec<T>> {
    let dict = arrow_cast(col, &dict_type())?;
    let dict = dict.as_dictionary::<Int32Type>();
    let values = arrow_cast(dict.values(), &DataType::Utf8)?;
    let values = values.as_string::<i32>();
    let mapped: Vec<T> = (0..values.len()).map(|i| f(values.value(i))).collect();
    Ok(dict.keys().values().iter().map(|k| mapped[*k as usize]).collect())
}

/// Runs whose bronze file the build reads, latest committed first (the order of
/// `bronze.<source>_current`: commit slots, never a clock).
pub(super) fn runs_newest_first<'a>(all: &'a [RunRecord], source: &str) -> Vec<&'a RunRecord> {
    let mut runs = crate::engine::catalog::current_runs(all.iter(), source);
    runs.sort_by_key(|r| std::cmp::Reverse(r.seq));
    runs
}

/// One run's bronze rows under the current contract (renamed, widened, added fields: see
/// [`crate::table::evolve`]).
pub(super) fn run_table(
    ctx: &SessionContext,
    lake: &Lake,
    contract: &Contract,
    run: &RunRecord,
) -> Result<Arc<dyn TableProvider>> {
    let stored = crate::table::evolve::stored_runs(lake, contract, &[run])?;
    Ok(crate::table::evolve::read_stored(ctx, contract, &stored.iter().collect::<Vec<_>>())?.into_view())
}

/// One pass over the fingerprints of every bronze run of the source, newest first: the current
/// run of every record (none for a record whose latest version is a tombstone).
pub(super) async fn current_keys(
    ctx: &SessionContext,
    cluster: Option<&str>,
    lake: &Lake,
    contract: &Contract,
    runs: &[&RunRecord],
) -> Result<Keys> {
    let capacity: i64 = runs.iter().map(|r| r.rows_inserted + r.rows_updated).sum();
    let mut keys = Keys::new(
        runs.iter().map(|r| r.run_id.to_string()).collect(),
        usize::try_from(capacity).unwrap_or(0),
    );
    // the runs' fingerprints are read and decoded by a task of their own (newest run first, in
    // order) while this one fills the map
    let mut plans = Vec::with_capacity(runs.len());
    for (i, run) in runs.iter().enumerate() {
        plans.push(crate::silver::fps::Run {
            run: i as u32,
            what: format!("bronze run {} of \"{}\"", run.run_id, run.source),
            rows: ctx
                .read_table(run_table(ctx, lake, contract, run)?)?
                .select(vec![c(FP), c(crate::table::bronze::IS_DELETED)])?,
        });
    }
    let (mut rx, tasks) = crate::silver::fps::read(cluster, vec![plans]);
    while let Some(batch) = rx.recv().await {
        let batch = batch?;
        for (row, fp) in batch.fps.iter().enumerate() {
            keys.see_current(*fp, batch.run, batch.is_deleted(row));
        }
    }
    drop(tasks);
    keys.forget_deleted();
    Ok(keys)
}

/// The state of build `build_id` (of every layer), if it names any file.
pub(super) async fn state_table(
    ctx: &SessionContext,
    lake: &Lake,
    table: &str,
    build_id: &str,
) -> Result<Option<datafusion::dataframe::DataFrame>> {
    let m = manifest(lake, table, build_id).await?;
    state_of(ctx, lake, table, build_id, &m).await
}

async fn state_of(
    ctx: &SessionContext,
    lake: &Lake,
    table: &str,
    build_id: &str,
    m: &crate::table::silver::Manifest,
) -> Result<Option<datafusion::dataframe::DataFrame>> {
    if m.deltas.is_empty() {
        return Ok(Some(ctx.read_table(
            table_over_build_files(ctx, lake, table, build_id, &m.state).await?,
        )?));
    }
    layers(ctx, lake, table, build_id, Side::State).await
}

/// Add the previous build's state to `keys`.
pub(super) async fn previous_state(
    ctx: &SessionContext,
    cluster: Option<&str>,
    lake: &Lake,
    keys: &mut Keys,
    table: &str,
    build_id: &str,
) -> Result<()> {
    let m = manifest(lake, table, build_id).await?;
    let mut index: HashMap<String, u32> = keys
        .runs
        .iter()
        .enumerate()
        .map(|(i, r)| (r.clone(), i as u32))
        .collect();
    let Some(df) = state_of(ctx, lake, table, build_id, &m).await? else {
        return Ok(());
    };
    let df = df.select(vec![c(FP), c(RUN_ID), c(OUTCOME), c(RULES_VERSION)])?;
    let mut stream = crate::engine::exec::stream(cluster, df, "build: previous state").await?;
    while let Some(b) = stream.next().await {
        let b = b?;
        let runs = per_value(b.column(1), |r| keys.run_index(r, &mut index))?;
        let outcomes = per_value(b.column(2), outcome_of)?;
        let versions = arrow_cast(b.column(3), &DataType::Int32)?;
        let versions = versions.as_primitive::<Int32Type>();
        let mut rows = Vec::with_capacity(b.num_rows());
        for_each_fp(b.column(0), |i, fp| {
            if let Some(fp) = fp {
                rows.push((i, fp));
            }
        })?;
        for (i, fp) in rows {
            keys.see_previous(fp, runs[i], versions.value(i), outcomes[i]);
        }
    }
    Ok(())
}

/// The rules versions of the previous state that `pred` (a predicate on `rules_version`) matches.
pub(super) async fn matching_versions(ctx: &SessionContext, keys: &Keys, pred: &Expr) -> Result<HashSet<i32>> {
    let versions: BTreeSet<i32> = keys
        .map
        .values()
        .filter(|e| e.prev != NONE)
        .map(|e| e.version)
        .collect();
    let schema = Arc::new(Schema::new(vec![Field::new(RULES_VERSION, DataType::Int32, true)]));
    let batch = RecordBatch::try_new(
        schema,
        vec![Arc::new(Int32Array::from(versions.into_iter().collect::<Vec<_>>()))],
    )?;
    // A handful of distinct versions: the result is tiny.
    let matched = ctx.read_batch(batch)?.filter(pred.clone().is_true())?.collect().await?;
    let mut out = HashSet::new();
    for b in matched {
        out.extend(b.column(0).as_primitive::<Int32Type>().iter().flatten());
    }
    Ok(out)
}
