//! Carrying out a [`BuildPlan`]: select the records to process, transform them once, recompute
//! the window anomalies, and write the snapshot, state and failure files in one pass with one
//! task per partition; then publish ([`super::publish`]). Memory: the plan's key map, the window
//! pass's sort (bounded by the pool, spills) and one row group per part writer.

use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::dataframe::DataFrame;
use datafusion::logical_expr::{Expr, JoinType, lit};
use datafusion::prelude::SessionContext;
use futures::StreamExt;

use super::delta::{DeltaFiles, DeltaOut, publish_delta};
use super::memory::release_free_memory;
use super::parts::{
    Failures, Flagger, PartCtx, join_keys, join_parts, part_writer, state_rows, write_carried, write_keys,
};
use super::plan::{BuildPlan, reads_whole};
use super::publish::{Outputs, fail_build, publish_full, publish_unchanged};
use super::scan::run_table;
use super::sources;
use super::windows::{delta_windows, window_sets};
use super::{Built, SILVER_BUILD_ID};
use crate::engine::catalog::{Catalog, table_over};
use crate::engine::session::Workspace;
use crate::error::{Error, Result};
use crate::hash::fp::FpSet;
use crate::silver::compile::{ANOMALY_FLAGS, IS_ANOMALY, Split, transform_split};
use crate::silver::keys::{FILTERED, NONE, PASSED, REJECTED, in_set_udf, pick_udf};
use crate::table::audit::{BuildRecord, failure_log_schema};
use crate::table::delta::publish::Prior;
use crate::table::lake::{Lake, layout};
use crate::table::silver::{FP, Side, c, layers, snapshot_table, state_schema};

/// Where a build runs and writes.
struct Env<'a> {
    ctx: &'a SessionContext,
    /// Plans run here or on the cluster (`--cluster`): see crate::engine::exec for which.
    cluster: Option<&'a str>,
    lake: &'a Lake,
    table: &'a str,
    build_id: &'a str,
}

/// Names of the build's files, numbered in the order they are made.
#[derive(Default)]
pub(super) struct Names(usize);

impl Names {
    pub(super) fn next(&mut self, prefix: &str) -> String {
        self.0 += 1;
        format!("{prefix}-{:05}.parquet", self.0 - 1)
    }
}

/// Carry out `plan` and commit the build `record` (see [`super::build`]).
pub(super) async fn execute(
    ws: &Workspace,
    catalog: &Catalog,
    plan: BuildPlan<'_>,
    record: &mut BuildRecord,
) -> Result<Built> {
    if let (Some(mut m), Some(prev)) = (plan.unchanged.clone(), plan.previous) {
        if plan.multi.is_some() {
            // the same conflicts, in this build's own file (the log holds each build's)
            let rows = crate::silver::sources::conflicts::read(&ws.lake, &record.table, &prev.build_id).await?;
            m.conflicts = sources::write_conflicts(&ws.lake, record, plan.rules, &rows).await?;
            record.conflicts_open = prev.conflicts_open;
            record.conflicts_decided = prev.conflicts_decided;
        }
        return publish_unchanged(ws, record, prev, m, &plan.digest).await;
    }
    let (table, build_id) = (record.table.clone(), record.build_id.clone());
    let env = Env {
        ctx: &catalog.ctx,
        cluster: ws.cluster.as_deref(),
        lake: &ws.lake,
        table: &table,
        build_id: &build_id,
    };
    let rules = plan.rules;
    let mut key_files: Vec<String> = Vec::new();
    let mut merged = None;
    let input = match (&plan.multi, &plan.keys) {
        (Some(m), Some(keys)) => {
            let at = sources::At {
                ctx: env.ctx,
                cluster: env.cluster,
                lake: env.lake,
                table: env.table,
                build_id: env.build_id,
            };
            let delta = plan.delta.is_some();
            let out = sources::merged_input(&at, rules, m, keys, &plan.per_run, delta, &mut key_files).await?;
            let rows = out.rows.clone();
            merged = Some(out);
            rows
        }
        _ => select_input(&env, &plan, &mut key_files).await?,
    };
    let split = transform_split(env.ctx, rules, &plan.inputs.contract, input, &plan.inputs.lookups)?;
    let base = base_schema(&split);

    // A delta build: what the previous snapshot held of the processed records, the groups the
    // window anomalies recompute, and the kept rows whose window flags change (rewritten).
    let (delta_out, delta_sets, kept) = match (&plan.delta, plan.previous, &plan.keys) {
        (Some(d), Some(prev), Some(keys)) => {
            let processed: Arc<FpSet> = Arc::new(keys.map.keys().chain(&keys.tombstones).copied().collect());
            let (out, sets, kept) = delta_step(&env, &plan, prev, &base, &split, processed).await?;
            // the keys deleted from the previous layers are known: their positions in the older
            // files (for the Delta table) are read while the pass below writes
            let expect = out.old_rows + out.changed_rows;
            let prior = Prior::start(env.lake, env.table, d.manifest.clone(), out.deleted.clone(), expect);
            let out = DeltaOut {
                prev_rows: d.rows,
                ..out
            };
            (Some((out, prior)), Some(sets), kept)
        }
        _ => (None, None, kept_rows(&env, &plan, &base, &mut key_files).await?),
    };

    // Window anomalies over the few columns they read, of the whole new table: the rows for which
    // each fires, as sets of keys.
    let sets = match delta_sets {
        Some(sets) => sets,
        None => window_sets(env.cluster, rules, &base, &split, kept.as_ref()).await?,
    };
    release_free_memory();
    let flagger = Arc::new(Flagger::new(env.ctx, rules, base.clone(), &sets)?);
    let mut names = Names::default();
    let mut outputs = write_outputs(&env, &plan, record, &split, &base, flagger.clone(), kept, &mut names).await?;
    if let (Some(out), Some(m)) = (merged, &plan.multi) {
        let (conflicts, counts) = out.conflicts()?;
        outputs.conflicts = sources::write_conflicts(env.lake, record, rules, &conflicts).await?;
        outputs.decisions = Some(m.decisions.ids());
        record.conflicts_open = counts.open as i64;
        record.conflicts_decided = counts.decided as i64;
        record.decisions_stale = counts.stale as i64;
    }
    let BuildPlan {
        reservation,
        delta,
        previous,
        run_ids,
        digest,
        ..
    } = plan;
    drop(reservation);
    for rel in &key_files {
        env.lake.delete(rel).await?;
    }
    if outputs.total.failed > 0 {
        return fail_build(ws, record, outputs).await;
    }
    if let (Some(d), Some((out, prior)), Some(prev)) = (delta, delta_out, previous) {
        let files = DeltaFiles {
            data: outputs.data,
            state: outputs.state,
            run_ids,
            digest,
            total: outputs.total,
            filtered: outputs.filtered,
            keyed: outputs.keyed,
            conflicts: outputs.conflicts,
            decisions: outputs.decisions,
        };
        return publish_delta(ws, record, prev, d, out, files, prior).await;
    }
    publish_full(ws, record, outputs, &flagger.schema, names, run_ids, &digest).await
}

/// The silver columns of the transform, then `silver_build_id` (every field nullable).
fn base_schema(split: &Split) -> SchemaRef {
    let mut fields: Vec<Field> = split.rows.schema().as_arrow().fields()[..split.silver_width]
        .iter()
        .map(|f| f.as_ref().clone().with_nullable(true))
        .collect();
    fields.push(Field::new(SILVER_BUILD_ID, DataType::Utf8, true));
    Arc::new(Schema::new(fields))
}

/// The records to process: the current rows of the runs that hold any (all rows of a run whose
/// rows are all to be processed, without looking them up). On a cluster the key sets cannot be
/// UDFs over this process's memory: they are written as build-scoped files of keys that the
/// plans join with (`key_files`, deleted before the commit).
async fn select_input(env: &Env<'_>, plan: &BuildPlan<'_>, key_files: &mut Vec<String>) -> Result<DataFrame> {
    let contract = &plan.inputs.contract;
    let mut input: Option<DataFrame> = None;
    for (i, run) in plan.work_runs.iter().enumerate() {
        if plan.per_run[i] == 0 {
            continue;
        }
        let mut rows = env.ctx.read_table(run_table(env.ctx, env.lake, contract, run)?)?;
        if let Some(keys) = plan.keys.as_ref().filter(|_| !reads_whole(run, plan.per_run[i])) {
            rows = match env.cluster {
                None => rows.filter(Arc::new(pick_udf(keys.clone(), i as u32)).call(vec![c(FP)]))?,
                Some(_) => {
                    let picked = keys
                        .map
                        .iter()
                        .filter(|(_, e)| e.cur == i as u32 && keys.process(e))
                        .map(|(fp, _)| *fp);
                    let rel = layout::silver_file(env.table, env.build_id, &format!("keys-pick-{i:05}.parquet"));
                    if write_keys(env.lake, &rel, picked).await? == 0 {
                        rows.filter(lit(false))?
                    } else {
                        key_files.push(rel.clone());
                        join_keys(env.ctx, env.lake, rows, &rel, JoinType::LeftSemi)?
                    }
                }
            };
        }
        input = Some(match input {
            None => rows,
            Some(df) => df.union(rows)?,
        });
    }
    match input {
        Some(df) => Ok(df),
        None => Ok(env.ctx.read_table(table_over(vec![], contract.bronze_schema())?)?),
    }
}

/// The window pass of a delta build over the previous layers, and the kept rows it rewrites.
async fn delta_step(
    env: &Env<'_>,
    plan: &BuildPlan<'_>,
    prev: &BuildRecord,
    base: &SchemaRef,
    split: &Split,
    processed: Arc<FpSet>,
) -> Result<(DeltaOut, Vec<Option<Arc<FpSet>>>, Option<DataFrame>)> {
    let view = layers(env.ctx, env.lake, env.table, &prev.build_id, Side::Data)
        .await?
        .ok_or_else(|| Error::RunFailed(format!("build {} of \"{}\" names no files", prev.build_id, env.table)))?;
    let (out, sets, changed) = delta_windows(plan.rules, base, split, &view, processed.clone()).await?;
    let mut kept = None;
    if !changed.is_empty() {
        let cols: Vec<Expr> = base.fields().iter().map(|f| c(f.name())).collect();
        kept = Some(
            view.filter(Arc::new(in_set_udf(Arc::new(changed.clone()))).call(vec![c(FP)]))?
                .select(cols)?,
        );
    }
    let mut deleted: FpSet = changed;
    deleted.extend(processed.iter().copied());
    Ok((
        DeltaOut {
            deleted,
            processed,
            ..out
        },
        sets,
        kept,
    ))
}

/// The rows kept from the previous snapshot, in the new column order (flags recomputed later).
async fn kept_rows(
    env: &Env<'_>,
    plan: &BuildPlan<'_>,
    base: &SchemaRef,
    key_files: &mut Vec<String>,
) -> Result<Option<DataFrame>> {
    let (Some(prev), Some(keys)) = (plan.previous, &plan.keys) else {
        return Ok(None);
    };
    if plan.kept_records == 0 {
        return Ok(None);
    }
    let snap = env
        .ctx
        .read_table(snapshot_table(env.ctx, env.lake, env.table, &prev.build_id).await?)?;
    let want: Vec<(String, DataType)> = base
        .fields()
        .iter()
        .map(|f| (f.name().clone(), f.data_type().clone()))
        .collect();
    let have: Vec<(String, DataType)> = snap
        .schema()
        .fields()
        .iter()
        .filter(|f| f.name() != ANOMALY_FLAGS && f.name() != IS_ANOMALY)
        .map(|f| (f.name().clone(), f.data_type().clone()))
        .collect();
    let mut sorted_want = want.clone();
    let mut sorted_have = have.clone();
    sorted_want.sort();
    sorted_have.sort();
    if sorted_want != sorted_have {
        let show = |v: &[(String, DataType)]| v.iter().map(|(n, t)| format!("{n} {t}")).collect::<Vec<_>>().join(", ");
        let (table, version) = (env.table, plan.rules.version);
        return Err(Error::Invalid(format!(
            "rules v{version} of \"{table}\" produce other columns than the rows kept from build {} \
             (kept: {}; v{version}: {}); rebuild every row with `ingot build {table} --full`",
            prev.build_id,
            show(&have),
            show(&want)
        )));
    }
    // Every snapshot row's record is in the previous state, so a row is kept unless its record
    // is one of the few the build drops (processed, removed or rebuilt): a lookup in a small
    // set, not in the map of every record.
    let dropped: FpSet = keys
        .map
        .iter()
        .filter(|(_, e)| e.prev != NONE && e.outcome == PASSED && !keys.keep_row(e))
        .map(|(fp, _)| *fp)
        .collect();
    let snap = match env.cluster {
        _ if dropped.is_empty() => snap,
        None => {
            let dropped = Arc::new(in_set_udf(Arc::new(dropped))).call(vec![c(FP)]);
            snap.filter(Expr::Not(Box::new(dropped)))?
        }
        Some(_) => {
            let rel = layout::silver_file(env.table, env.build_id, "keys-dropped.parquet");
            write_keys(env.lake, &rel, dropped.into_iter()).await?;
            key_files.push(rel.clone());
            join_keys(env.ctx, env.lake, snap, &rel, JoinType::LeftAnti)?
        }
    };
    Ok(Some(snap.select(want.iter().map(|(n, _)| c(n)).collect::<Vec<_>>())?))
}

/// One pass, one task per partition: kept rows, then the transform's rows split into the
/// snapshot, the failures and the state; then the rows resolve rejected and a `filter` step
/// removed, and the state rows carried over.
#[allow(clippy::too_many_arguments)]
async fn write_outputs(
    env: &Env<'_>,
    plan: &BuildPlan<'_>,
    record: &BuildRecord,
    split: &Split,
    base: &SchemaRef,
    flagger: Arc<Flagger>,
    kept: Option<DataFrame>,
    names: &mut Names,
) -> Result<Outputs> {
    let (lake, table, build_id, rules) = (env.lake, env.table, env.build_id, plan.rules);
    let failures_rel = layout::silver_failures(build_id);
    let fail_w = Arc::new(tokio::sync::Mutex::new(part_writer(
        lake,
        failures_rel.clone(),
        failure_log_schema(),
    )));
    let schema = split.rows.schema().as_arrow().clone();
    // key indexes beside the snapshot files when the table publishes Delta (its delta builds
    // find the positions of the rows they delete in them); none if the mode cannot be read
    let keyed = crate::table::delta::builds::table_mode(lake, table)
        .await
        .is_ok_and(|m| m != crate::table::delta::Mode::Off);
    let part = Arc::new(PartCtx {
        lake: lake.clone(),
        table: table.to_string(),
        build_id: build_id.to_string(),
        flagger,
        base: base.clone(),
        width: split.silver_width,
        fp_idx: schema.index_of(FP)?,
        sources_idx: match rules.sources {
            Some(_) => schema.index_of(crate::spec::rules::sources::CONTRIBUTING_SOURCES).ok(),
            None => None,
        },
        run_idx: schema
            .index_of(crate::silver::sources::STATE_RUN)
            .or_else(|_| schema.index_of(crate::table::silver::RUN_ID))?,
        version: rules.version,
        actions: Arc::new(rules.validate.iter().map(|v| (v.name.clone(), v.action)).collect()),
        failures: Arc::new(Failures {
            build_id: build_id.to_string(),
            source: rules.source.clone(),
            table: table.to_string(),
            version: rules.version,
            failed_at: record.started_at,
        }),
        fail_w: fail_w.clone(),
        pool: env.ctx.runtime_env().memory_pool.clone(),
        keyed,
    });
    let mut out = Outputs {
        failures: failures_rel,
        keyed,
        ..Outputs::default()
    };
    if let Some(k) = kept {
        let handles = crate::engine::exec::streams(env.cluster, k, "build: kept rows")
            .await?
            .into_iter()
            .map(|s| tokio::spawn(part.clone().kept(s, names.next("part"))))
            .collect();
        join_parts(handles, &mut out.total, &mut out.data, &mut out.state).await?;
    }
    let handles = crate::engine::exec::streams(env.cluster, split.rows.clone(), "build: transform")
        .await?
        .into_iter()
        .map(|s| {
            let (p, st) = (names.next("part"), names.next("state"));
            tokio::spawn(part.clone().new_rows(s, p, st))
        })
        .collect();
    join_parts(handles, &mut out.total, &mut out.data, &mut out.state).await?;
    if let Some(rr) = split.resolve_rejected.clone() {
        let st = names.next("state");
        let mut sw = part_writer(lake, layout::silver_file(table, build_id, &st), state_schema());
        let mut stream = crate::engine::exec::stream(env.cluster, rr, "build: resolve rejections").await?;
        while let Some(b) = stream.next().await {
            let b = b?;
            if b.num_rows() == 0 {
                continue;
            }
            out.total.rejected += b.num_rows() as u64;
            sw.write(&state_rows(b.column(0), b.column(5), REJECTED, rules.version)?)
                .await?;
            let batch = part
                .failures
                .batch(None, b.column(0), b.column(1), b.column(2), b.column(3), b.column(4))?;
            fail_w.lock().await.write(&batch).await?;
        }
        out.add_state(sw.finish().await?, st);
    }
    if let Some(f) = split.filtered.clone() {
        let st = names.next("state");
        let mut sw = part_writer(lake, layout::silver_file(table, build_id, &st), state_schema());
        let mut stream = crate::engine::exec::stream(env.cluster, f, "build: filtered rows").await?;
        while let Some(b) = stream.next().await {
            let b = b?;
            out.filtered += b.num_rows() as u64;
            sw.write(&state_rows(b.column(0), b.column(1), FILTERED, rules.version)?)
                .await?;
        }
        out.add_state(sw.finish().await?, st);
    }
    if let Some(keys) = plan.keys.as_ref().filter(|_| plan.delta.is_none()) {
        let st = names.next("state");
        let n = write_carried(lake, &layout::silver_file(table, build_id, &st), keys).await?;
        out.add_state(n, st);
    }
    drop(part);
    let fail_w = Arc::try_unwrap(fail_w)
        .map_err(|_| Error::RunFailed("build: the failure writer is still in use".into()))?
        .into_inner();
    out.wrote_failures = fail_w.finish().await? > 0;
    Ok(out)
}
