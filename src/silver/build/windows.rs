//! Window anomalies (`spike`, `first_seen`) of a build, over only the columns they read: the
//! sets of 16-byte keys each fires on, for the flag projection. A whole snapshot's pass sorts
//! the narrow rows of the new table ([`window_sets`]); a delta build recomputes only the groups
//! (`by` values) a processed record was or is in ([`delta_windows`]). Ties are broken by the
//! fingerprint's key, ordered as its hex text.

use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, AsArray, BooleanArray, RecordBatch};
use datafusion::arrow::compute::cast as arrow_cast;
use datafusion::arrow::datatypes::{DataType, SchemaRef};
use datafusion::dataframe::DataFrame;
use datafusion::logical_expr::{Expr, lit};
use futures::StreamExt;

use super::delta::DeltaOut;
use crate::error::{Error, Result};
use crate::hash::fp::{FpSet, for_each_fp};
use crate::silver::compile::{
    ANOMALY_FLAGS, IS_ANOMALY, SPLIT_RULE, Split, is_window, window_fired_column, window_fires, window_fires_with,
};
use crate::silver::keys::{GroupSet, fp128_udf, in_groups_udf, in_set_udf};
use crate::spec::rules::{AnomalyKind, RuleSet};
use crate::table::silver::{FP, c};

const TIE: &str = "__ingot_tie";
const OLD: &str = "__ingot_old";
const WAS: &str = "__ingot_was_anomaly";
const PROCESSED: &str = "__ingot_processed";

fn in_col(i: usize) -> String {
    format!("__ingot_in_{i}")
}

fn had_col(i: usize) -> String {
    format!("__ingot_had_{i}")
}

/// The window anomalies of a delta build: their `by` columns and groups.
struct DeltaWindows<'r> {
    rules: &'r RuleSet,
    base: &'r SchemaRef,
    /// The `by` columns of every window anomaly, each once.
    by_cols: Vec<String>,
    /// Indexes of the window anomalies.
    windows: Vec<usize>,
}

impl<'r> DeltaWindows<'r> {
    fn new(rules: &'r RuleSet, base: &'r SchemaRef) -> Self {
        let mut by_cols: Vec<String> = Vec::new();
        for a in rules.anomalies.iter().filter(|a| is_window(a)) {
            for b in by_of(a) {
                if !by_cols.contains(&b) {
                    by_cols.push(b);
                }
            }
        }
        let windows = (0..rules.anomalies.len())
            .filter(|i| is_window(&rules.anomalies[*i]))
            .collect();
        DeltaWindows {
            rules,
            base,
            by_cols,
            windows,
        }
    }

    fn ty(&self, name: &str) -> Result<DataType> {
        Ok(self
            .base
            .field_with_name(name)
            .map_err(|_| {
                Error::Invalid(format!(
                    "{}: an anomaly reads column \"{name}\", which the table does not have",
                    self.rules.path.display()
                ))
            })?
            .data_type()
            .clone())
    }

    fn cast_col(&self, name: &str) -> Result<Expr> {
        Ok(datafusion::logical_expr::cast(c(name), self.ty(name)?).alias(name))
    }

    /// Per window anomaly with `by` columns: an empty set of its groups.
    fn empty_groups(&self) -> Result<Vec<Option<GroupSet>>> {
        let mut groups = Vec::with_capacity(self.rules.anomalies.len());
        for a in &self.rules.anomalies {
            let by = by_of(a);
            groups.push(if is_window(a) && !by.is_empty() {
                Some(GroupSet::new(
                    by.iter().map(|b| self.ty(b)).collect::<Result<Vec<_>>>()?,
                ))
            } else {
                None
            });
        }
        Ok(groups)
    }

    /// Add the groups of `b`, whose `by` columns start at `offset`.
    fn add_groups(&self, groups: &mut [Option<GroupSet>], b: &RecordBatch, offset: usize) -> Result<()> {
        for (i, a) in self.rules.anomalies.iter().enumerate() {
            if let Some(g) = groups[i].as_mut() {
                let cols: Vec<ArrayRef> = by_of(a)
                    .iter()
                    .filter_map(|name| self.by_cols.iter().position(|x| x == name))
                    .map(|p| b.column(offset + p).clone())
                    .collect();
                g.insert(&cols, |_| true)?;
            }
        }
        Ok(())
    }

    /// The narrow rows of the window pass: the columns the windows read, the tie key, per window
    /// whether the row's group is recomputed and whether the row had the flag, and whether it is
    /// an old row, was an anomaly, or is an inert old row of a processed record.
    fn project(
        &self,
        df: DataFrame,
        old: bool,
        groups: &[Option<Arc<GroupSet>>],
        inert: Option<&Expr>,
    ) -> Result<DataFrame> {
        let rules = self.rules;
        let mut cols: Vec<Expr> = window_columns(rules)
            .iter()
            .map(|name| self.cast_col(name))
            .collect::<Result<_>>()?;
        cols.push(Arc::new(fp128_udf()).call(vec![c(FP)]).alias(TIE));
        for &i in &self.windows {
            let in_group = match &groups[i] {
                Some(g) => {
                    let args = by_of(&rules.anomalies[i])
                        .iter()
                        .map(|b| self.cast_col(b))
                        .collect::<Result<Vec<_>>>()?;
                    Arc::new(in_groups_udf(g.clone())).call(args)
                }
                None => lit(true),
            };
            cols.push(in_group.alias(in_col(i)));
            let had = if old {
                datafusion::functions_nested::expr_fn::array_has(c(ANOMALY_FLAGS), lit(rules.anomalies[i].name.clone()))
            } else {
                lit(false)
            };
            cols.push(had.alias(had_col(i)));
        }
        cols.push(lit(old).alias(OLD));
        cols.push(if old { c(IS_ANOMALY) } else { lit(false) }.alias(WAS));
        cols.push(inert.cloned().unwrap_or(lit(false)).alias(PROCESSED));
        Ok(df.select(cols)?)
    }
}

/// The `by` columns of a window anomaly.
fn by_of(a: &crate::spec::rules::Anomaly) -> Vec<String> {
    match &a.kind {
        AnomalyKind::Spike { by, .. } | AnomalyKind::FirstSeen { by, .. } => {
            by.iter().map(|i| i.name.clone()).collect()
        }
        AnomalyKind::When(_) => Vec::new(),
    }
}

/// What the window pass of a delta build found: per anomaly the keys it fires on, the kept rows
/// whose flags change, and whether an inert old row lies outside every recomputed group.
struct Fired {
    found: Vec<FpSet>,
    changed: FpSet,
    moved: bool,
}

/// The window pass of a delta build. Finds the previous snapshot's rows of the processed
/// records (their groups, their count), then recomputes the window anomalies over only the
/// groups (`by` values) that processed records were in or are now in: every row of such a group,
/// kept or new. Returns the counts, the window sets for the flagger (every row of a recomputed
/// group, and the rewritten rows' flags of groups not recomputed) and the kept rows whose window
/// flags change.
///
/// The windows need the groups of the processed records' old rows too. A first attempt assumes
/// those are groups a new row is in (a correction seldom moves a record to another group) and
/// reads the previous snapshot once: the old rows of processed records ride along in the window
/// pass as inert rows (no part in any window), counted there. When one of them is in a group no
/// new row is in, the pass is redone the careful way: a scan of those old rows for their groups
/// first, then the window pass without them.
pub(super) async fn delta_windows(
    rules: &RuleSet,
    base: &SchemaRef,
    split: &Split,
    view: &DataFrame,
    processed: Arc<FpSet>,
) -> Result<(DeltaOut, Vec<Option<Arc<FpSet>>>, FpSet)> {
    let n = rules.anomalies.len();
    let w = DeltaWindows::new(rules, base);
    let in_processed = Arc::new(in_set_udf(processed.clone())).call(vec![c(FP)]);
    let passing = split.rows.clone().filter(c(SPLIT_RULE).is_null())?;
    let mut speculate = !w.windows.is_empty();
    loop {
        let mut out = DeltaOut::default();
        let mut groups = w.empty_groups()?;
        if !speculate {
            // 1. the previous snapshot's rows of the processed records
            let mut cols = vec![c(IS_ANOMALY)];
            for b in &w.by_cols {
                cols.push(w.cast_col(b)?);
            }
            let mut stream = view
                .clone()
                .filter(in_processed.clone())?
                .select(cols)?
                .execute_stream()
                .await?;
            while let Some(b) = stream.next().await {
                let b = b?;
                out.old_rows += b.num_rows() as u64;
                out.old_flagged += b.column(0).as_boolean().true_count() as u64;
                w.add_groups(&mut groups, &b, 1)?;
            }
            if w.windows.is_empty() {
                return Ok((out, vec![None; n], FpSet::default()));
            }
        }
        // 2. the groups of the new rows
        if !w.by_cols.is_empty() {
            let cols = w.by_cols.iter().map(|b| w.cast_col(b)).collect::<Result<Vec<_>>>()?;
            let mut stream = passing.clone().select(cols)?.execute_stream().await?;
            while let Some(b) = stream.next().await {
                w.add_groups(&mut groups, &b?, 0)?;
            }
        }
        let groups: Vec<Option<Arc<GroupSet>>> = groups.into_iter().map(|g| g.map(Arc::new)).collect();
        // 3. the windows over every row of those groups
        let old_rows = if speculate {
            view.clone()
        } else {
            view.clone().filter(Expr::Not(Box::new(in_processed.clone())))?
        };
        let inert = speculate.then_some(&in_processed);
        let all =
            w.project(old_rows, true, &groups, inert)?
                .union(w.project(passing.clone(), false, &groups, None)?)?;
        let any_in = w
            .windows
            .iter()
            .map(|i| c(&in_col(*i)))
            .reduce(Expr::or)
            .unwrap_or(lit(false));
        let all = all.filter(if speculate { any_in.or(c(PROCESSED)) } else { any_in })?;
        let mut extra: Vec<String> = Vec::new();
        for &i in &w.windows {
            extra.push(in_col(i));
            extra.push(had_col(i));
        }
        extra.extend([OLD.into(), WAS.into(), PROCESSED.into()]);
        let Some(fires) = window_fires_with(all, rules, TIE, &extra, speculate.then_some(PROCESSED), false)? else {
            return Ok((out, vec![None; n], FpSet::default()));
        };
        let mut fired = read_fires(&w, &groups, fires, &mut out).await?;
        if fired.moved {
            speculate = false;
            continue;
        }
        // a rewritten row's flags of a group not recomputed come from its stored flags, which the
        // pass above saw only for rows inside some recomputed group: every rewritten row is one
        let sets = (0..n)
            .map(|i| is_window(&rules.anomalies[i]).then(|| Arc::new(std::mem::take(&mut fired.found[i]))))
            .collect();
        return Ok((out, sets, fired.changed));
    }
}

/// Read the window pass of a delta build: count the inert old rows (and stop when one is outside
/// every recomputed group), and per anomaly the keys it fires on and the kept rows whose flag
/// changes.
async fn read_fires(
    w: &DeltaWindows<'_>,
    groups: &[Option<Arc<GroupSet>>],
    fires: DataFrame,
    out: &mut DeltaOut,
) -> Result<Fired> {
    let mut fired = Fired {
        found: (0..w.rules.anomalies.len()).map(|_| FpSet::default()).collect(),
        changed: FpSet::default(),
        moved: false,
    };
    let truth = |a: &BooleanArray, r: usize| a.is_valid(r) && a.value(r);
    let mut stream = fires.execute_stream().await?;
    while let Some(b) = stream.next().await {
        let b = b?;
        let schema = b.schema();
        let col = |name: &str| -> Result<BooleanArray> {
            let a = b.column(schema.index_of(name)?);
            Ok(arrow_cast(a, &DataType::Boolean)?.as_boolean().clone())
        };
        let mut keys = Vec::with_capacity(b.num_rows());
        for_each_fp(b.column(schema.index_of(TIE)?), |_, fp| keys.push(fp))?;
        let (old, was, gone) = (col(OLD)?, col(WAS)?, col(PROCESSED)?);
        let mut inside = Vec::with_capacity(w.windows.len());
        for &i in &w.windows {
            inside.push(col(&in_col(i))?);
        }
        // the processed records' old rows: counted, and their groups checked
        for r in (0..b.num_rows()).filter(|&r| truth(&gone, r)) {
            out.old_rows += 1;
            if truth(&was, r) {
                out.old_flagged += 1;
            }
            fired.moved |= w
                .windows
                .iter()
                .zip(&inside)
                .any(|(&i, g)| groups[i].is_some() && !truth(g, r));
        }
        if fired.moved {
            return Ok(fired);
        }
        for (&i, inside) in w.windows.iter().zip(&inside) {
            let fires_now = col(&window_fired_column(i))?;
            let had = col(&had_col(i))?;
            for (r, key) in keys.iter().enumerate() {
                let Some(key) = key else { continue };
                if truth(&gone, r) {
                    continue;
                }
                let (f, g, h, o) = (truth(&fires_now, r), truth(inside, r), truth(&had, r), truth(&old, r));
                if (g && f) || (!g && o && h) {
                    fired.found[i].insert(*key);
                }
                if o && g && f != h && fired.changed.insert(*key) {
                    out.changed_rows += 1;
                    if truth(&was, r) {
                        out.old_flagged += 1;
                    }
                }
            }
        }
    }
    Ok(fired)
}

/// The columns the window anomalies of `rules` read (`by`, `order`, and a spike's column), each
/// once, in rule order.
pub(super) fn window_columns(rules: &RuleSet) -> Vec<String> {
    let mut narrow: Vec<String> = Vec::new();
    for a in rules.anomalies.iter().filter(|a| is_window(a)) {
        let names: Vec<&str> = match &a.kind {
            AnomalyKind::Spike { column, by, order, .. } => {
                by.iter().chain([order, column]).map(|i| i.name.as_str()).collect()
            }
            AnomalyKind::FirstSeen { by, order, .. } => by.iter().chain([order]).map(|i| i.name.as_str()).collect(),
            AnomalyKind::When(_) => Vec::new(),
        };
        for n in names {
            if !narrow.iter().any(|x| x == n) {
                narrow.push(n.to_string());
            }
        }
    }
    narrow
}

/// The window anomalies of `rules` over the new table (the transform's passing rows and the kept
/// rows), computed over only the columns they read: for each window anomaly, the keys of the
/// rows it fires on.
pub(super) async fn window_sets(
    cluster: Option<&str>,
    rules: &RuleSet,
    base: &SchemaRef,
    split: &Split,
    kept: Option<&DataFrame>,
) -> Result<Vec<Option<Arc<FpSet>>>> {
    let mut sets: Vec<Option<Arc<FpSet>>> = vec![None; rules.anomalies.len()];
    if !rules.anomalies.iter().any(is_window) {
        return Ok(sets);
    }
    let narrow = window_columns(rules);
    let mut types = Vec::new();
    for n in &narrow {
        let f = base.field_with_name(n).map_err(|_| {
            Error::Invalid(format!(
                "{}: an anomaly reads column \"{n}\", which the table does not have",
                rules.path.display()
            ))
        })?;
        types.push(f.data_type().clone());
    }
    let fp128 = Arc::new(fp128_udf());
    let project = |df: DataFrame| -> Result<DataFrame> {
        let mut cols: Vec<Expr> = narrow
            .iter()
            .zip(&types)
            .map(|(n, t)| datafusion::logical_expr::cast(c(n), t.clone()).alias(n))
            .collect();
        cols.push(fp128.call(vec![c(FP)]).alias(TIE));
        Ok(df.select(cols)?)
    };
    let mut all = project(split.rows.clone().filter(c(SPLIT_RULE).is_null())?)?;
    if let Some(k) = kept {
        all = project(k.clone())?.union(all)?;
    }
    let Some(fires) = window_fires(all, rules, TIE)? else {
        return Ok(sets);
    };
    let mut found: Vec<FpSet> = (0..rules.anomalies.len()).map(|_| FpSet::default()).collect();
    let names: Vec<String> = fires.schema().fields().iter().map(|f| f.name().clone()).collect();
    let mut stream = crate::engine::exec::stream(cluster, fires, "build: window anomalies").await?;
    while let Some(b) = stream.next().await {
        let b = b?;
        let mut fps = Vec::with_capacity(b.num_rows());
        for_each_fp(b.column(0), |_, fp| fps.push(fp))?;
        for (i, set) in found.iter_mut().enumerate() {
            let Some(col) = names.iter().position(|n| *n == window_fired_column(i)) else {
                continue;
            };
            let fired = b.column(col).as_boolean();
            for (r, fp) in fps.iter().enumerate() {
                if let Some(fp) = fp
                    && fired.is_valid(r)
                    && fired.value(r)
                {
                    set.insert(*fp);
                }
            }
        }
    }
    for (i, set) in found.into_iter().enumerate() {
        if is_window(&rules.anomalies[i]) {
            sets[i] = Some(Arc::new(set));
        }
    }
    Ok(sets)
}
