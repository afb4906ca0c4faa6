//! The writers of a build: part files with bounded row groups, the flag projection evaluated on
//! batches ([`Flagger`]), the per-partition tasks of the output pass ([`PartCtx`]) that split
//! the transform's rows into snapshot, failure and state files, and the files of 16-byte keys
//! (deletion files, and on a cluster the key sets plans join with).

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, BooleanArray, DictionaryArray, FixedSizeBinaryBuilder, Int32Array, Int32Builder,
    RecordBatch, StringArray, StringDictionaryBuilder, TimestampMicrosecondArray,
};
use datafusion::arrow::compute::kernels::boolean::{is_null, not};
use datafusion::arrow::compute::{cast as arrow_cast, filter_record_batch};
use datafusion::arrow::datatypes::{DataType, Int32Type, Int64Type, Schema, SchemaRef};
use datafusion::common::DFSchema;
use datafusion::dataframe::DataFrame;
use datafusion::execution::SendableRecordBatchStream;
use datafusion::execution::memory_pool::MemoryPool;
use datafusion::logical_expr::{Expr, ExprSchemable, JoinType, lit};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::prelude::SessionContext;
use futures::StreamExt;

use crate::engine::catalog::table_over;
use crate::error::{Error, Result};
use crate::hash::fp::{Fp, FpSet, for_each_fp};
use crate::silver::compile::{IS_ANOMALY, flag_projection};
use crate::silver::keys::{Keys, PASSED, REJECTED, fp128_udf, in_set_udf, outcome_name};
use crate::spec::rules::{Action, RuleSet};
use crate::table::audit::failure_log_schema;
use crate::table::bronze::RunFileWriter;
use crate::table::lake::{Lake, layout};
use crate::table::silver::{FP, c, dict_type, key_schema, state_schema};

/// `batch` with the columns cast to `schema`'s types (same order).
pub(super) fn conform(batch: &RecordBatch, schema: &SchemaRef) -> Result<RecordBatch> {
    let mut cols = Vec::with_capacity(batch.num_columns());
    for (col, field) in batch.columns().iter().zip(schema.fields()) {
        if col.data_type() == field.data_type() {
            cols.push(col.clone());
        } else {
            cols.push(arrow_cast(col, field.data_type())?);
        }
    }
    Ok(RecordBatch::try_new(schema.clone(), cols)?)
}

/// Encoded bytes after which a silver part writer closes its row group.
pub(super) const ROW_GROUP_BYTES: usize = 24 << 20;

/// A writer of one build-scoped Parquet file with bounded row groups.
pub(super) fn part_writer(lake: &Lake, rel: String, schema: SchemaRef) -> RunFileWriter {
    RunFileWriter::new(lake, rel, schema)
        .with_fingerprints_uncompressed()
        .with_row_group_bytes(ROW_GROUP_BYTES)
}

/// A part writer of the output pass, which runs beside the plan's operators: its row group and
/// upload buffers are taken from the build's memory pool ([`RunFileWriter::with_budget`]).
pub(super) fn pooled_part_writer(
    lake: &Lake,
    rel: String,
    schema: SchemaRef,
    pool: &Arc<dyn MemoryPool>,
) -> RunFileWriter {
    RunFileWriter::new(lake, rel, schema)
        .with_fingerprints_uncompressed()
        .with_budget(pool, "silver part writer", 2 * ROW_GROUP_BYTES)
}

/// Evaluates the flag projection on batches with the columns of `base`.
pub(super) struct Flagger {
    pub(super) exprs: Vec<Arc<dyn PhysicalExpr>>,
    pub(super) schema: SchemaRef,
    pub(super) base: SchemaRef,
    pub(super) is_anomaly: usize,
}

impl Flagger {
    pub(super) fn new(
        ctx: &SessionContext,
        rules: &RuleSet,
        base: SchemaRef,
        sets: &[Option<Arc<FpSet>>],
    ) -> Result<Flagger> {
        let df_schema = DFSchema::try_from(base.as_ref().clone())?;
        let window = |i: usize| -> Expr {
            match sets.get(i).cloned().flatten() {
                Some(set) => Arc::new(in_set_udf(set)).call(vec![c(FP)]),
                None => lit(false),
            }
        };
        let projection = flag_projection(&df_schema, rules, window)?;
        let state = ctx.state();
        let mut exprs = Vec::new();
        let mut fields = Vec::new();
        for e in projection {
            let (_, field) = e.to_field(&df_schema)?;
            fields.push(field.as_ref().clone().with_nullable(true));
            exprs.push(state.create_physical_expr(e, &df_schema)?);
        }
        let schema = Arc::new(Schema::new(fields));
        let is_anomaly = schema.index_of(IS_ANOMALY)?;
        Ok(Flagger {
            exprs,
            schema,
            base,
            is_anomaly,
        })
    }

    /// `batch` (the base columns, in order) flagged; also returns how many rows are anomalies.
    pub(super) fn apply(&self, batch: &RecordBatch) -> Result<(RecordBatch, u64)> {
        let batch = conform(batch, &self.base)?;
        let n = batch.num_rows();
        let mut cols = Vec::with_capacity(self.exprs.len());
        for (e, f) in self.exprs.iter().zip(self.schema.fields()) {
            let a = e.evaluate(&batch)?.into_array(n)?;
            cols.push(if a.data_type() == f.data_type() {
                a
            } else {
                arrow_cast(&a, f.data_type())?
            });
        }
        let out = RecordBatch::try_new(self.schema.clone(), cols)?;
        let flagged = out.column(self.is_anomaly).as_boolean().true_count() as u64;
        Ok((out, flagged))
    }
}

/// Write `keys` to the build-scoped file `rel` ([`key_schema`]): a delta layer's deletion files,
/// and on a cluster the key sets [`join_keys`] joins with (no keys: no file). Returns the number
/// of keys.
pub(super) async fn write_keys(lake: &Lake, rel: &str, keys: impl Iterator<Item = Fp>) -> Result<u64> {
    const CHUNK: usize = 1 << 16;
    let schema = key_schema();
    let mut w = part_writer(lake, rel.to_string(), schema.clone());
    let mut b = FixedSizeBinaryBuilder::with_capacity(CHUNK, 16);
    let mut n = 0usize;
    for fp in keys {
        b.append_value(fp.to_be_bytes())?;
        n += 1;
        if n.is_multiple_of(CHUNK) {
            w.write(&RecordBatch::try_new(schema.clone(), vec![Arc::new(b.finish())])?)
                .await?;
        }
    }
    if !n.is_multiple_of(CHUNK) {
        w.write(&RecordBatch::try_new(schema, vec![Arc::new(b.finish())])?)
            .await?;
    }
    w.finish().await
}

/// `rows` semi- or anti-joined on their fingerprint's key with the key file `rel`: the portable
/// form of `__ingot_pick` / `NOT __ingot_in_set` (a run holds one row per fingerprint, so the
/// rows are the same).
pub(super) fn join_keys(
    ctx: &SessionContext,
    lake: &Lake,
    rows: DataFrame,
    rel: &str,
    how: JoinType,
) -> Result<DataFrame> {
    const KEY: &str = "__ingot_key";
    let keys = ctx
        .read_table(table_over(vec![lake.url(rel)], key_schema())?)?
        .select(vec![c(FP).alias(KEY)])?;
    let key = Arc::new(fp128_udf()).call(vec![c(FP)]);
    Ok(rows.join_on(keys, how, [key.eq(c(KEY))])?)
}

/// Failure-log rows of this build.
pub(super) struct Failures {
    pub(super) build_id: String,
    /// The table's (first) source: the failures' `source` when a row names none.
    pub(super) source: String,
    pub(super) table: String,
    pub(super) version: i32,
    pub(super) failed_at: i64,
}

impl Failures {
    /// From `(fingerprint, row number, rule, reason, payload)` columns; `sources`: the rows'
    /// `contributing_sources` (several sources), whose first names the row's source.
    pub(super) fn batch(
        &self,
        sources: Option<&ArrayRef>,
        fp: &ArrayRef,
        row: &ArrayRef,
        rule: &ArrayRef,
        reason: &ArrayRef,
        payload: &ArrayRef,
    ) -> Result<RecordBatch> {
        let n = fp.len();
        let text = |a: &ArrayRef| -> Result<ArrayRef> {
            let a = arrow_cast(a, &DataType::Utf8)?;
            let s = a.as_string::<i32>();
            Ok(Arc::new(StringArray::from_iter_values(
                (0..n).map(|i| if s.is_null(i) { "" } else { s.value(i) }),
            )))
        };
        let repeat = |v: &str| -> ArrayRef { Arc::new(StringArray::from_iter_values(std::iter::repeat_n(v, n))) };
        let source = match sources.and_then(|a| a.as_list_opt::<i32>()) {
            Some(lists) => {
                let names = arrow_cast(lists.values(), &DataType::Utf8)?;
                let names = names.as_string::<i32>();
                let offsets = lists.value_offsets();
                Arc::new(StringArray::from_iter_values((0..n).map(|i| {
                    let start = offsets[i] as usize;
                    if lists.is_valid(i) && offsets[i + 1] > offsets[i] && names.is_valid(start) {
                        names.value(start)
                    } else {
                        self.source.as_str()
                    }
                }))) as ArrayRef
            }
            None => repeat(&self.source),
        };
        let cols: Vec<ArrayRef> = vec![
            repeat(&self.build_id),
            repeat("silver"),
            source,
            repeat(&self.table),
            arrow_cast(row, &DataType::Int64)?,
            arrow_cast(fp, &DataType::Utf8)?,
            text(payload)?,
            text(rule)?,
            text(reason)?,
            Arc::new(Int32Array::from_value(self.version, n)),
            Arc::new(TimestampMicrosecondArray::from_value(self.failed_at, n).with_timezone("UTC")),
        ];
        Ok(RecordBatch::try_new(failure_log_schema(), cols)?)
    }
}

/// State rows `(key, run, outcome, version)` from a fingerprint and a run id column.
pub(super) fn state_rows(fp: &ArrayRef, run: &ArrayRef, outcome: u8, version: i32) -> Result<RecordBatch> {
    let n = fp.len();
    let mut fps = FixedSizeBinaryBuilder::with_capacity(n, 16);
    let mut err = None;
    for_each_fp(fp, |_, v| {
        // A null fingerprint cannot reach silver: bronze always has one.
        if let Err(e) = fps.append_value(v.unwrap_or_default().to_be_bytes()) {
            err = Some(e);
        }
    })?;
    if let Some(e) = err {
        return Err(e.into());
    }
    Ok(RecordBatch::try_new(
        state_schema(),
        vec![
            Arc::new(fps.finish()),
            arrow_cast(run, &dict_type())?,
            Arc::new(DictionaryArray::<Int32Type>::try_new(
                Int32Array::from_value(0, n),
                Arc::new(StringArray::from(vec![outcome_name(outcome)])),
            )?),
            Arc::new(Int32Array::from_value(version, n)),
        ],
    )?)
}

/// The state rows the previous state carries over (records this build did not process).
pub(super) async fn write_carried(lake: &Lake, rel: &str, keys: &Keys) -> Result<u64> {
    const CHUNK: usize = 1 << 16;
    let schema = state_schema();
    let mut w = part_writer(lake, rel.to_string(), schema.clone());
    let mut fps = FixedSizeBinaryBuilder::with_capacity(CHUNK, 16);
    let mut runs = StringDictionaryBuilder::<Int32Type>::new();
    let mut outcomes = StringDictionaryBuilder::<Int32Type>::new();
    let mut versions = Int32Builder::with_capacity(CHUNK);
    let mut n = 0usize;
    let flush = |fps: &mut FixedSizeBinaryBuilder,
                 runs: &mut StringDictionaryBuilder<Int32Type>,
                 outcomes: &mut StringDictionaryBuilder<Int32Type>,
                 versions: &mut Int32Builder|
     -> Result<RecordBatch> {
        Ok(RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(fps.finish()),
                Arc::new(runs.finish()),
                Arc::new(outcomes.finish()),
                Arc::new(versions.finish()),
            ],
        )?)
    };
    for (fp, e) in &keys.map {
        if !keys.carry(e) {
            continue;
        }
        fps.append_value(fp.to_be_bytes())?;
        runs.append_value(keys.runs.get(e.prev as usize).map(String::as_str).unwrap_or(""));
        outcomes.append_value(outcome_name(e.outcome));
        versions.append_value(e.version);
        n += 1;
        if n.is_multiple_of(CHUNK) {
            w.write(&flush(&mut fps, &mut runs, &mut outcomes, &mut versions)?)
                .await?;
        }
    }
    if !n.is_multiple_of(CHUNK) {
        w.write(&flush(&mut fps, &mut runs, &mut outcomes, &mut versions)?)
            .await?;
    }
    w.finish().await
}

/// What one partition of the build's outputs wrote.
#[derive(Default)]
pub(super) struct PartOut {
    /// Snapshot rows written (kept or new).
    pub(super) rows: u64,
    /// New rows (this build's).
    pub(super) written: u64,
    pub(super) flagged: u64,
    pub(super) rejected: u64,
    pub(super) failed: u64,
    pub(super) first_failed: Vec<String>,
    pub(super) failed_rules: BTreeSet<String>,
    pub(super) data: Option<String>,
    pub(super) state: Option<String>,
}

impl PartOut {
    pub(super) fn merge(&mut self, o: PartOut, data: &mut Vec<String>, state: &mut Vec<String>) {
        self.rows += o.rows;
        self.written += o.written;
        self.flagged += o.flagged;
        self.rejected += o.rejected;
        self.failed += o.failed;
        for f in o.first_failed {
            if self.first_failed.len() < 3 {
                self.first_failed.push(f);
            }
        }
        self.failed_rules.extend(o.failed_rules);
        data.extend(o.data);
        state.extend(o.state);
    }
}

/// Everything a partition task needs (owned: tasks run on the runtime's threads).
pub(super) struct PartCtx {
    pub(super) lake: Lake,
    pub(super) table: String,
    pub(super) build_id: String,
    pub(super) flagger: Arc<Flagger>,
    pub(super) base: SchemaRef,
    pub(super) width: usize,
    pub(super) fp_idx: usize,
    /// Where `contributing_sources` is (several sources).
    pub(super) sources_idx: Option<usize>,
    pub(super) run_idx: usize,
    pub(super) version: i32,
    pub(super) actions: Arc<HashMap<String, Action>>,
    pub(super) failures: Arc<Failures>,
    pub(super) fail_w: Arc<tokio::sync::Mutex<RunFileWriter>>,
    /// The build's memory pool, which the part writers take their buffers from.
    pub(super) pool: Arc<dyn MemoryPool>,
    /// Write a key index beside each snapshot file (the table publishes Delta).
    pub(super) keyed: bool,
}

impl PartCtx {
    /// The writer of the snapshot file `rel`, with its key index when the build writes them.
    fn data_writer(&self, rel: String) -> RunFileWriter {
        let keys = self.keyed.then(|| {
            crate::table::silver::index_writer(&self.lake, crate::table::silver::keys_of(&rel)).with_budget(
                &self.pool,
                "silver key index writer",
                8 << 20,
            )
        });
        let w = pooled_part_writer(&self.lake, rel, self.flagger.schema.clone(), &self.pool);
        match keys {
            Some(k) => w.with_keys(k),
            None => w,
        }
    }

    /// Kept rows of the previous snapshot: flags recomputed, written to `part`.
    pub(super) async fn kept(self: Arc<Self>, mut stream: SendableRecordBatchStream, part: String) -> Result<PartOut> {
        let rel = layout::silver_file(&self.table, &self.build_id, &part);
        let mut w = self.data_writer(rel);
        let mut out = PartOut::default();
        while let Some(b) = stream.next().await {
            let (b, f) = self.flagger.apply(&b?)?;
            out.rows += b.num_rows() as u64;
            out.flagged += f;
            w.write(&b).await?;
        }
        if w.finish().await? > 0 {
            out.data = Some(part);
        }
        Ok(out)
    }

    /// Rows of the transform: passing rows flagged into `part`, rejections to the failure file,
    /// every outcome into `state_part`.
    pub(super) async fn new_rows(
        self: Arc<Self>,
        mut stream: SendableRecordBatchStream,
        part: String,
        state_part: String,
    ) -> Result<PartOut> {
        let rel = layout::silver_file(&self.table, &self.build_id, &part);
        let mut w = self.data_writer(rel);
        let state_rel = layout::silver_file(&self.table, &self.build_id, &state_part);
        let mut sw = pooled_part_writer(&self.lake, state_rel, state_schema(), &self.pool);
        let mut out = PartOut::default();
        let width = self.width;
        while let Some(b) = stream.next().await {
            let b = b?;
            let passed = is_null(b.column(width + 1))?;
            let good = if passed.true_count() == b.num_rows() {
                b.clone()
            } else {
                filter_record_batch(&b, &passed)?
            };
            if good.num_rows() > 0 {
                sw.write(&state_rows(
                    good.column(self.fp_idx),
                    good.column(self.run_idx),
                    PASSED,
                    self.version,
                )?)
                .await?;
                let mut cols: Vec<ArrayRef> = good.columns()[..width].to_vec();
                cols.push(Arc::new(StringArray::from_iter_values(std::iter::repeat_n(
                    self.build_id.as_str(),
                    good.num_rows(),
                ))));
                let (rows, f) = self.flagger.apply(&RecordBatch::try_new(self.base.clone(), cols)?)?;
                out.rows += rows.num_rows() as u64;
                out.written += rows.num_rows() as u64;
                out.flagged += f;
                w.write(&rows).await?;
            }
            if passed.true_count() == b.num_rows() {
                continue;
            }
            let bad = filter_record_batch(&b, &not(&passed)?)?;
            let rule = arrow_cast(bad.column(width + 1), &DataType::Utf8)?;
            let rule = rule.as_string::<i32>();
            let reject: BooleanArray = (0..bad.num_rows())
                .map(|i| Some(self.actions.get(rule.value(i)) != Some(&Action::Fail)))
                .collect();
            let failing = filter_record_batch(&bad, &not(&reject)?)?;
            if failing.num_rows() > 0 {
                let r = arrow_cast(failing.column(width + 1), &DataType::Utf8)?;
                let r = r.as_string::<i32>();
                let numbers = arrow_cast(failing.column(width), &DataType::Int64)?;
                let numbers = numbers.as_primitive::<Int64Type>();
                let payload = arrow_cast(failing.column(width + 3), &DataType::Utf8)?;
                let payload = payload.as_string::<i32>();
                for i in 0..failing.num_rows() {
                    out.failed_rules.insert(r.value(i).to_string());
                    if out.first_failed.len() < 3 {
                        let number = if numbers.is_valid(i) {
                            numbers.value(i).to_string()
                        } else {
                            "?".into()
                        };
                        let p = if payload.is_valid(i) { payload.value(i) } else { "" };
                        out.first_failed.push(format!("record {number}: {p}"));
                    }
                }
                out.failed += failing.num_rows() as u64;
            }
            let rej = filter_record_batch(&bad, &reject)?;
            if rej.num_rows() > 0 {
                out.rejected += rej.num_rows() as u64;
                sw.write(&state_rows(
                    rej.column(self.fp_idx),
                    rej.column(self.run_idx),
                    REJECTED,
                    self.version,
                )?)
                .await?;
                let batch = self.failures.batch(
                    self.sources_idx.map(|i| rej.column(i)),
                    rej.column(self.fp_idx),
                    rej.column(width),
                    rej.column(width + 1),
                    rej.column(width + 2),
                    rej.column(width + 3),
                )?;
                self.fail_w.lock().await.write(&batch).await?;
            }
        }
        if w.finish().await? > 0 {
            out.data = Some(part);
        }
        if sw.finish().await? > 0 {
            out.state = Some(state_part);
        }
        Ok(out)
    }
}

/// Run the tasks concurrently (one per partition) and merge what they wrote.
pub(super) async fn join_parts(
    handles: Vec<tokio::task::JoinHandle<Result<PartOut>>>,
    total: &mut PartOut,
    data: &mut Vec<String>,
    state: &mut Vec<String>,
) -> Result<()> {
    let mut first_err = None;
    for h in handles {
        match h.await {
            Ok(Ok(o)) => total.merge(o, data, state),
            Ok(Err(e)) => {
                first_err.get_or_insert(e);
            }
            Err(e) => {
                first_err.get_or_insert(Error::RunFailed(format!("build task failed: {e}")));
            }
        }
    }
    match first_err {
        Some(e) => Err(e),
        None => Ok(()),
    }
}
