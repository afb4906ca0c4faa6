//! The build of a table with several sources ([`crate::silver::sources`]): what the plan reads
//! (each source's runs, the decisions in force), its key map (a record's version is its
//! sources' runs), and the merged input the transform then cleans as it would one source's
//! rows. Each source's candidates are read once, split by the records with several as the plan
//! runs ([`Sink`]), where the plan reads its input once.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use datafusion::arrow::array::{Array, AsArray};
use datafusion::dataframe::DataFrame;
use datafusion::logical_expr::{Expr, JoinType};
use datafusion::prelude::SessionContext;
use futures::StreamExt;

use super::parts::{join_keys, part_writer, write_keys};
use super::plan::reads_whole;
use super::scan::{previous_state, run_table, runs_newest_first};
use crate::engine::catalog::{Catalog, table_over};
use crate::error::{Error, Result};
use crate::hash::fp::FpSet;
use crate::hash::fp::{Fp, for_each_fp};
use crate::silver::keys::{FORCED, Keys, NONE, in_set_udf, pick_source_udf};
use crate::silver::sources::conflicts::{self, ConflictRow, Counts, Stamp};
use crate::silver::sources::decisions::{DecisionRecord, Decisions, read_decisions};
use crate::silver::sources::scan::current_keys;
use crate::silver::sources::stream::Survivors;
use crate::silver::sources::survive::Held;
use crate::silver::sources::tee::Sink;
use crate::silver::sources::{
    SourceInputs, candidate_schema, candidates, merged_schema, read_source_inputs, single_rows, sources_of,
};
use crate::spec::rules::RuleSet;
use crate::spec::rules::sources::{CONTRIBUTING_SOURCES, FIELD_SOURCES, OnConflict};
use crate::table::audit::{BuildRecord, RunRecord};
use crate::table::lake::{Lake, layout};
use crate::table::silver::{FP, c, manifest, snapshot_table};

/// What a build of a table with several sources reads besides what one source's would.
pub(crate) struct MultiPlan<'a> {
    pub(super) inputs: Vec<SourceInputs>,
    /// Each source's runs, newest first.
    pub(super) runs: Vec<Vec<&'a RunRecord>>,
    /// Where each source's runs start in the plan's work runs.
    pub(super) offsets: Vec<usize>,
    pub(super) decisions: Decisions,
    pub(super) decision_records: Vec<DecisionRecord>,
    /// The table's latest succeeded build: the winners `hold` keeps and the conflicts' history.
    pub(super) latest: Option<&'a BuildRecord>,
    /// Records to process (set by [`MultiPlan::count`]; the runs' counts are candidates).
    pub(super) processed: std::cell::Cell<u64>,
}

impl<'a> MultiPlan<'a> {
    pub(super) async fn read(
        ctx: &SessionContext,
        catalog: &'a Catalog,
        lake: &Lake,
        rules: &RuleSet,
        all: &'a [RunRecord],
    ) -> Result<MultiPlan<'a>> {
        let inputs = read_source_inputs(ctx, &catalog.contracts, rules).await?;
        let runs: Vec<Vec<&RunRecord>> = inputs.iter().map(|i| runs_newest_first(all, &i.source)).collect();
        let mut offsets = Vec::with_capacity(runs.len());
        let mut at = 0;
        for r in &runs {
            offsets.push(at);
            at += r.len();
        }
        // every source's bronze must be keyed as its contract says (not halfway through a rekey)
        for (i, r) in inputs.iter().zip(&runs) {
            let keyed = r.iter().find_map(|run| run.natural_key_version);
            let want = i32::try_from(i.contract.natural_key.version).unwrap_or(i32::MAX);
            if let Some(have) = keyed.filter(|v| *v != want) {
                return Err(Error::Invalid(format!(
                    "{}: bronze.{} is keyed with natural_key version {have} but its contract says {want}; \
                     the sources of \"{}\" would not build the same fingerprint: run `ingot rekey {}` first",
                    rules.path.display(),
                    i.source,
                    rules.table,
                    i.source
                )));
            }
        }
        let decision_records = read_decisions(lake, &rules.table).await?;
        Ok(MultiPlan {
            decisions: Decisions::of(&decision_records),
            decision_records,
            latest: crate::engine::catalog::latest_build(&catalog.builds, &rules.table),
            inputs,
            runs,
            offsets,
            processed: std::cell::Cell::new(0),
        })
    }

    /// Every source's runs, in source order then newest first: the plan's work runs.
    pub(super) fn flat_runs(&self) -> Vec<&'a RunRecord> {
        self.runs.iter().flatten().copied().collect()
    }

    /// Digest of what the sources' `resolve` entries read (as for one source, over every
    /// source's contract and lookups).
    pub(super) fn digest(&self, all: &[RunRecord], catalog: &Catalog) -> Result<String> {
        // by name: a change of precedence alone is no change of what resolve reads
        let mut contracts: Vec<&crate::spec::contract::Contract> =
            self.inputs.iter().map(|i| i.contract.as_ref()).collect();
        contracts.sort_by(|a, b| a.source.cmp(&b.source));
        super::plan::inputs_digest(catalog, all, &contracts, true)
    }

    /// The key map: every current record's candidates, the previous build's state, and the
    /// records whose decisions changed since that build forced to be processed.
    pub(super) async fn keys(
        &self,
        ctx: &SessionContext,
        cluster: Option<&str>,
        lake: &Lake,
        table: &str,
        previous: Option<&BuildRecord>,
    ) -> Result<Keys> {
        let mut keys = current_keys(ctx, cluster, lake, &self.inputs, &self.runs).await?;
        if let Some(prev) = previous {
            previous_state(ctx, cluster, lake, &mut keys, table, &prev.build_id).await?;
            for fp in self.changed_decisions(lake, table, prev).await? {
                if let Some(e) = keys.map.get_mut(&fp)
                    && e.cur != NONE
                    && e.prev != NONE
                {
                    e.prev = FORCED;
                }
            }
        }
        Ok(keys)
    }

    /// The records of the decisions recorded or withdrawn since `prev` (which must be processed).
    pub(super) async fn changed_decisions(&self, lake: &Lake, table: &str, prev: &BuildRecord) -> Result<Vec<Fp>> {
        let before: HashSet<String> = manifest(lake, table, &prev.build_id)
            .await?
            .decisions
            .unwrap_or_default()
            .into_iter()
            .collect();
        let now: HashSet<String> = self.decisions.ids().into_iter().collect();
        let changed: HashSet<&String> = before.symmetric_difference(&now).collect();
        Ok(self
            .decision_records
            .iter()
            .filter(|d| changed.contains(&d.decision_id))
            .filter_map(|d| crate::hash::fp::fp_of_hex(&d.fingerprint))
            .collect())
    }

    /// The key map of a delta build on `prev`: the records of the runs committed since
    /// (`new_runs`, the newest of their sources) and of `forced`, with their candidates in the
    /// older runs as `prev`'s state names them.
    pub(super) async fn delta_keys(
        &self,
        ctx: &SessionContext,
        lake: &Lake,
        table: &str,
        prev: &BuildRecord,
        new_runs: &[&RunRecord],
        forced: &[Fp],
    ) -> Result<Keys> {
        let new: HashSet<&str> = new_runs.iter().map(|r| r.run_id.as_str()).collect();
        let take: Vec<usize> = self
            .runs
            .iter()
            .map(|runs| runs.iter().take_while(|r| new.contains(r.run_id.as_str())).count())
            .collect();
        if take.iter().sum::<usize>() != new.len() {
            return Err(Error::Internal(format!(
                "\"{table}\": a run committed since build {} is older than one it read",
                prev.build_id
            )));
        }
        let state = super::scan::state_table(ctx, lake, table, &prev.build_id).await?;
        let Some(state) = state else {
            return Err(Error::RunFailed(format!(
                "build {} of \"{table}\" names no state files",
                prev.build_id
            )));
        };
        crate::silver::sources::scan::delta_keys(ctx, lake, &self.inputs, &self.runs, &take, forced, state).await
    }

    /// Candidates to read per work run (`per_run`, by [`MultiPlan::offsets`]) and the previous
    /// snapshot's rows kept.
    pub(super) fn count(&self, keys: &Keys, per_run: &mut [u64], kept: &mut u64) {
        for e in keys.map.values() {
            if keys.process(e) {
                self.processed.set(self.processed.get() + 1);
                if let Some(combo) = keys.combos.get(e.cur as usize) {
                    for (s, r) in combo.iter().enumerate() {
                        if *r != NONE {
                            per_run[self.offsets[s] + *r as usize] += 1;
                        }
                    }
                }
            } else if keys.keep_row(e) {
                *kept += 1;
            }
        }
    }
}

/// Where the merged input is read and written.
pub(super) struct At<'a> {
    pub ctx: &'a SessionContext,
    pub cluster: Option<&'a str>,
    pub lake: &'a Lake,
    pub table: &'a str,
    pub build_id: &'a str,
}

/// The merged input, and what its survivorship finds once the plan has read it.
pub(super) struct Merged {
    pub rows: DataFrame,
    survivors: Option<Arc<Survivors>>,
    /// The latest build's conflicts.
    history: Vec<ConflictRow>,
    /// Decisions on processed records left with one candidate.
    single_stale: u64,
    keys: Arc<Keys>,
    /// A delta build: the records its key map lacks are kept as they were.
    delta: bool,
}

impl Merged {
    /// The table's conflicts after the build (call once its plan has run), with their counts.
    pub fn conflicts(self) -> Result<(Vec<ConflictRow>, Counts)> {
        let (found, stale) = match &self.survivors {
            Some(s) => {
                let f = s.found()?;
                (f.conflicts, f.stale)
            }
            None => (Vec::new(), 0),
        };
        Ok(finish_conflicts(
            self.history,
            found,
            &self.keys,
            stale + self.single_stale,
            self.delta,
        ))
    }
}

/// Source `s`'s runs that hold candidates to process: (its index, the run, how many, its bronze
/// rows keyed as the table keys them).
fn run_rows<'r>(
    at: &At<'_>,
    m: &MultiPlan<'r>,
    s: usize,
    per_run: &[u64],
) -> Result<Vec<(usize, &'r RunRecord, u64, DataFrame)>> {
    let input = &m.inputs[s];
    let mut out = Vec::new();
    for (i, run) in m.runs[s].iter().enumerate() {
        let n = per_run[m.offsets[s] + i];
        if n > 0 {
            let rows = input.keyed(at.ctx.read_table(run_table(at.ctx, at.lake, &input.contract, run)?)?)?;
            out.push((i, *run, n, rows));
        }
    }
    Ok(out)
}

/// On a cluster, the processed records' candidates of one source: the rows of its runs picked
/// by the key map (every row of a run all of whose rows are picked), by joins with key files.
async fn picked(
    at: &At<'_>,
    m: &MultiPlan<'_>,
    s: usize,
    keys: &Arc<Keys>,
    per_run: &[u64],
    key_files: &mut Vec<String>,
) -> Result<Option<DataFrame>> {
    let mut out: Option<DataFrame> = None;
    for (i, run, n, mut rows) in run_rows(at, m, s, per_run)? {
        if !reads_whole(run, n) {
            let fps = keys.map.iter().filter(|(_, e)| {
                keys.process(e) && keys.combos.get(e.cur as usize).and_then(|c| c.get(s)) == Some(&(i as u32))
            });
            let name = format!("keys-pick-{s:03}-{i:05}.parquet");
            let rel = layout::silver_file(at.table, at.build_id, &name);
            write_keys(at.lake, &rel, fps.map(|(fp, _)| *fp)).await?;
            key_files.push(rel.clone());
            rows = join_keys(at.ctx, at.lake, rows, &rel, JoinType::LeftSemi)?;
        }
        out = Some(match out {
            None => rows,
            Some(df) => df.union(rows)?,
        });
    }
    Ok(out)
}

/// One source's bronze rows of the records to process, in this process: those of records with
/// one candidate (`one`: a run's rows picked from the key map, unless all its rows are; then
/// those of the records with several left out) and those of records with several (`several`).
/// Both tests ask the run's few keys of `by_run` (a picked row of the run is a record with several
/// candidates exactly when its key is among them).
#[allow(clippy::type_complexity)]
fn local_rows(
    at: &At<'_>,
    m: &MultiPlan<'_>,
    s: usize,
    keys: &Arc<Keys>,
    per_run: &[u64],
    by_run: &mut HashMap<(usize, u32), FpSet>,
) -> Result<(Option<DataFrame>, Option<DataFrame>)> {
    let key = c(FP);
    let (mut ones, mut severals): (Option<DataFrame>, Option<DataFrame>) = (None, None);
    let add = |to: &mut Option<DataFrame>, df: DataFrame| -> Result<()> {
        *to = Some(match to.take() {
            None => df,
            Some(all) => all.union(df)?,
        });
        Ok(())
    };
    for (i, run, n, rows) in run_rows(at, m, s, per_run)? {
        let several = by_run
            .remove(&(s, i as u32))
            .filter(|set| !set.is_empty())
            .map(Arc::new);
        let several_n = several.as_ref().map_or(0, |set| set.len() as u64);
        let test = several.map(|set| Arc::new(in_set_udf(set)).call(vec![key.clone()]));
        if n > several_n {
            let mut one = rows.clone();
            if !reads_whole(run, n) {
                one =
                    one.filter(Arc::new(pick_source_udf(keys.clone(), s as u32, i as u32)).call(vec![key.clone()]))?;
            }
            if let Some(test) = &test {
                one = one.filter(Expr::Not(Box::new(test.clone())))?;
            }
            add(&mut ones, one)?;
        }
        if let Some(test) = test {
            add(&mut severals, rows.filter(test)?)?;
        }
    }
    Ok((ones, severals))
}

/// One source's bronze rows of the records to process, in this process, for a [`Sink`] to split:
/// a run's rows picked from the key map, unless all its rows are.
fn local_all(at: &At<'_>, m: &MultiPlan<'_>, s: usize, keys: &Arc<Keys>, per_run: &[u64]) -> Result<Option<DataFrame>> {
    let mut out: Option<DataFrame> = None;
    for (i, run, n, mut rows) in run_rows(at, m, s, per_run)? {
        if !reads_whole(run, n) {
            rows = rows.filter(Arc::new(pick_source_udf(keys.clone(), s as u32, i as u32)).call(vec![c(FP)]))?;
        }
        out = Some(match out {
            None => rows,
            Some(df) => df.union(rows)?,
        });
    }
    Ok(out)
}

/// Each source's candidates down their path: those of records with one candidate as merged
/// rows ([`single_rows`]), those of records with several (`many`) as candidates.
#[allow(clippy::too_many_arguments)]
async fn route(
    at: &At<'_>,
    src: &crate::spec::rules::sources::Sources,
    m: &MultiPlan<'_>,
    keys: &Arc<Keys>,
    per_run: &[u64],
    many: &Arc<FpSet>,
    many_file: Option<&str>,
    sink: Option<&Arc<Sink>>,
    key_files: &mut Vec<String>,
) -> Result<(Option<DataFrame>, Option<DataFrame>)> {
    // the records with several candidates by (source, run) of their candidates there
    let mut by_run: HashMap<(usize, u32), FpSet> = HashMap::new();
    if at.cluster.is_none() && sink.is_none() {
        for fp in many.iter() {
            let Some(combo) = keys.get(fp).and_then(|e| keys.combos.get(e.cur as usize)) else {
                continue;
            };
            for (s, r) in combo.iter().enumerate().filter(|(_, r)| **r != NONE) {
                by_run.entry((s, *r)).or_default().insert(*fp);
            }
        }
    }
    let (mut singles, mut multis): (Option<DataFrame>, Option<DataFrame>) = (None, None);
    for (s, entry) in src.entries.iter().enumerate() {
        let input = &m.inputs[s];
        let (one, several) = match (at.cluster, sink) {
            // one read: the candidates of records with several go to the sink as it runs
            (None, Some(sink)) => {
                let Some(rows) = local_all(at, m, s, keys, per_run)? else {
                    continue;
                };
                let cands = candidates(rows, src, entry, input)?;
                (at.ctx.read_table(sink.tee(cands).await?)?, None)
            }
            (None, None) => {
                let (one, several) = local_rows(at, m, s, keys, per_run, &mut by_run)?;
                if one.is_none() && several.is_none() {
                    continue;
                }
                let several = several.map(|df| candidates(df, src, entry, input)).transpose()?;
                let one = match one {
                    Some(df) => candidates(df, src, entry, input)?,
                    None => at.ctx.read_table(table_over(vec![], candidate_schema(src))?)?,
                };
                (one, several)
            }
            (Some(_), _) => {
                let Some(rows) = picked(at, m, s, keys, per_run, key_files).await? else {
                    continue;
                };
                let cands = candidates(rows, src, entry, input)?;
                match many_file {
                    None => (cands, None),
                    Some(rel) => (
                        join_keys(at.ctx, at.lake, cands.clone(), rel, JoinType::LeftAnti)?,
                        Some(join_keys(at.ctx, at.lake, cands, rel, JoinType::LeftSemi)?),
                    ),
                }
            }
        };
        let one = single_rows(one, src, Some(entry.source.as_str()))?;
        singles = Some(match singles {
            None => one,
            Some(df) => df.union(one)?,
        });
        if let Some(several) = several {
            multis = Some(match multis {
                None => several,
                Some(df) => df.union(several)?,
            });
        }
    }
    if let Some(sink) = sink.filter(|_| singles.is_some()) {
        multis = Some(at.ctx.read_table(sink.table()?)?);
    }
    Ok((singles, multis))
}

/// The merged input of the records to process ([`merged_schema`]): records with one candidate
/// projected, those with several decided by survivorship into a build-scoped file
/// (`key_files` lists it for deletion before the commit).
pub(super) async fn merged_input(
    at: &At<'_>,
    rules: &RuleSet,
    m: &MultiPlan<'_>,
    keys: &Arc<Keys>,
    per_run: &[u64],
    delta: bool,
    key_files: &mut Vec<String>,
) -> Result<Merged> {
    let src = sources_of(rules)?;
    // Each candidate goes down one path, told by a set of the few records with several
    // candidates (small enough to stay in cache; most rows are ruled out by its `Heads`). On a
    // cluster the set is a build-scoped file of keys that the plans join with.
    let many: Arc<FpSet> = Arc::new(
        keys.map
            .iter()
            .filter(|(_, e)| keys.process(e) && keys.candidates(e) > 1)
            .map(|(fp, _)| *fp)
            .collect(),
    );
    let many_file = match at.cluster {
        Some(_) if !many.is_empty() => {
            let rel = layout::silver_file(at.table, at.build_id, "keys-multi.parquet");
            write_keys(at.lake, &rel, many.iter().copied()).await?;
            key_files.push(rel.clone());
            Some(rel)
        }
        _ => None,
    };
    // One read of each source's candidates for both paths ([`Sink`]), unless the plan reads its
    // input more than once (a tee is read once), few of the rows read are processed (then the
    // key filters below skip most of them as Parquet decodes), or on a cluster.
    let sink = (at.cluster.is_none() && !many.is_empty() && !few_processed(m, per_run) && reads_input_once(rules))
        .then(|| Sink::new(candidate_schema(src), many.clone()));
    let (singles, multis) = route(
        at,
        src,
        m,
        keys,
        per_run,
        &many,
        many_file.as_deref(),
        sink.as_ref(),
        key_files,
    )
    .await?;
    let schema = merged_schema(src);
    let history = match m.latest {
        Some(b) => conflicts::read(at.lake, at.table, &b.build_id).await?,
        None => Vec::new(),
    };
    // decisions on processed records left with one candidate: stale (nothing to decide)
    let single_stale = m
        .decisions
        .by_key
        .keys()
        .filter(|(fp, _)| keys.get(fp).is_some_and(|e| keys.process(e) && keys.candidates(e) == 1))
        .count() as u64;
    let singles = match singles {
        // few of the rows read are processed (a delta build reading older runs for the
        // candidates of a few records): filtered while Parquet decodes, as below
        Some(df) if few_processed(m, per_run) => pushdown(df),
        Some(df) => df,
        None => at.ctx.read_table(table_over(vec![], schema.clone())?)?,
    };
    let Some(multis) = multis else {
        return Ok(Merged {
            rows: singles,
            survivors: None,
            history,
            single_stale,
            keys: keys.clone(),
            delta,
        });
    };
    let held = held_winners(at, rules, m, &many).await?;
    let first_seen: HashMap<(Fp, String, String), String> = history
        .iter()
        .filter_map(|r| {
            let fp = r.key()?;
            Some((
                (fp, r.field.clone(), r.candidate_set_hash.clone()),
                r.first_build_id.clone(),
            ))
        })
        .collect();
    let survivors = Survivors::new(
        // a tenth of the rows, say: the key filter is evaluated while Parquet decodes
        pushdown(multis),
        keys.clone(),
        Arc::new(src.clone()),
        candidate_schema(src),
        Arc::new(m.decisions.clone()),
        Arc::new(held),
        Arc::new(first_seen),
        at.build_id,
    )?;
    let merged = match at.cluster {
        // the merged rows are decided as the build's plan reads them
        // and written by as many writers as the others (the pass ends only after the last
        // candidate was read: its rows come last, and one writer would leave the others idle)
        None => {
            let n = at.ctx.copied_config().target_partitions().max(1);
            at.ctx
                .read_table(survivors.table()?)?
                .repartition(datafusion::logical_expr::Partitioning::RoundRobinBatch(n))?
        }
        // a plan for the cluster cannot hold this process's pass: its rows go to a build-scoped
        // file first
        Some(_) => {
            let rel = layout::silver_file(at.table, at.build_id, "merged-00000.parquet");
            let mut w = part_writer(at.lake, rel.clone(), schema.clone());
            let mut stream = survivors.stream();
            while let Some(b) = stream.next().await {
                w.write(&b?).await?;
            }
            w.finish().await?;
            key_files.push(rel.clone());
            at.ctx.read_table(table_over(vec![at.lake.url(&rel)], schema)?)?
        }
    };
    Ok(Merged {
        rows: singles.union(merged)?,
        survivors: Some(survivors),
        history,
        single_stale,
        keys: keys.clone(),
        delta,
    })
}

/// Does the build's plan read its merged input once? Window anomalies read it before the
/// writers do, a `filter` step reads it again for the rows it removes.
fn reads_input_once(rules: &RuleSet) -> bool {
    !rules.anomalies.iter().any(crate::silver::compile::is_window)
        && !rules
            .steps
            .iter()
            .any(|s| matches!(s, crate::spec::rules::Step::Filter(_)))
}

/// `df` with its filters evaluated while Parquet decodes (only the rows they keep are decoded
/// whole), not after every column of every row is read.
fn pushdown(df: DataFrame) -> DataFrame {
    let (mut state, plan) = df.into_parts();
    state.config_mut().options_mut().execution.parquet.pushdown_filters = true;
    DataFrame::new(state, plan)
}

/// Are the candidates to process under a tenth of the rows of the runs that hold them?
fn few_processed(m: &MultiPlan<'_>, per_run: &[u64]) -> bool {
    let (mut read, mut processed) = (0u64, 0u64);
    for (run, n) in m.flat_runs().iter().zip(per_run) {
        if *n > 0 {
            read += u64::try_from(run.rows_written()).unwrap_or(0);
            processed += n;
        }
    }
    processed * 10 < read
}

/// The table's conflicts after the build: those of the records it kept, as the previous build
/// had them, and the ones it found; with their counts.
fn finish_conflicts(
    history: Vec<ConflictRow>,
    mut found: Vec<ConflictRow>,
    keys: &Keys,
    stale: u64,
    delta: bool,
) -> (Vec<ConflictRow>, Counts) {
    let mut conflicts: Vec<ConflictRow> = history
        .into_iter()
        .filter(|r| match r.key() {
            None => false,
            Some(fp) => match keys.get(&fp) {
                Some(e) => keys.carry(e),
                // a delta build's key map holds only the records it processes
                None => delta && !keys.tombstones.contains(&fp),
            },
        })
        .collect();
    conflicts.append(&mut found);
    conflicts.sort_by(|a, b| (&a.fingerprint, &a.field).cmp(&(&b.fingerprint, &b.field)));
    let mut counts = Counts {
        stale,
        ..Counts::default()
    };
    for r in &conflicts {
        counts.add(r);
    }
    (conflicts, counts)
}

/// For `on_conflict: hold`: what the latest build took for each record with several candidates
/// this build processes (`many`; its first contributing source and `field_sources`).
async fn held_winners(at: &At<'_>, rules: &RuleSet, m: &MultiPlan<'_>, many: &Arc<FpSet>) -> Result<HashMap<Fp, Held>> {
    let mut out = HashMap::new();
    let src = sources_of(rules)?;
    let Some(latest) = m.latest.filter(|_| src.conflicts.on_conflict == OnConflict::Hold) else {
        return Ok(out);
    };
    let snap = at
        .ctx
        .read_table(snapshot_table(at.ctx, at.lake, at.table, &latest.build_id).await?)?;
    let has = |n: &str| snap.schema().has_column_with_unqualified_name(n);
    if !has(CONTRIBUTING_SOURCES) || !has(FIELD_SOURCES) {
        return Ok(out); // built before the table had several sources
    }
    if many.is_empty() {
        return Ok(out);
    }
    let rows = snap
        .filter(Arc::new(in_set_udf(many.clone())).call(vec![c(FP)]))?
        .select(vec![c(FP), c(CONTRIBUTING_SOURCES), c(FIELD_SOURCES)])?;
    let mut stream = crate::engine::exec::stream(None, rows, "build: held winners").await?;
    while let Some(b) = stream.next().await {
        let b = b?;
        let sources = b.column(1).as_list::<i32>();
        let fields = b.column(2).as_list::<i32>();
        let mut fps = Vec::with_capacity(b.num_rows());
        for_each_fp(b.column(0), |_, fp| fps.push(fp))?;
        for (i, fp) in fps.into_iter().enumerate() {
            let Some(fp) = fp else { continue };
            let first = sources.is_valid(i).then(|| sources.value(i)).and_then(|l| {
                let l = l.as_string_opt::<i32>()?.clone();
                (l.len() > 0 && l.is_valid(0)).then(|| l.value(0).to_string())
            });
            let Some(primary) = first else { continue };
            let mut held = Held {
                primary,
                fields: Vec::new(),
            };
            if fields.is_valid(i) {
                let entries = fields.value(i);
                let entries = entries.as_struct();
                let (k, v) = (
                    entries.column(0).as_string::<i32>(),
                    entries.column(1).as_string::<i32>(),
                );
                for j in 0..entries.len() {
                    if v.is_valid(j) {
                        held.fields.push((k.value(j).to_string(), v.value(j).to_string()));
                    }
                }
            }
            out.insert(fp, held);
        }
    }
    Ok(out)
}

/// Write the build's conflict file (when there is any conflict); its name for the manifest.
pub(super) async fn write_conflicts(
    lake: &Lake,
    record: &BuildRecord,
    rules: &RuleSet,
    rows: &[ConflictRow],
) -> Result<Option<String>> {
    if rows.is_empty() {
        return Ok(None);
    }
    let src = sources_of(rules)?;
    let stamp = Stamp {
        table: &record.table,
        build_id: &record.build_id,
        rules_version: record.rules_version,
        on_conflict: src.conflicts.on_conflict.name(),
    };
    let rel = conflicts::file(&record.table, &record.build_id);
    let mut w = part_writer(lake, rel, conflicts::log_schema());
    for chunk in rows.chunks(8192) {
        w.write(&conflicts::batch(&stamp, chunk)?).await?;
    }
    w.finish().await?;
    Ok(Some(conflicts::FILE.to_string()))
}
