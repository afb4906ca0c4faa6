//! Anomaly flags: [`flag`] over a whole DataFrame, and the parts a build uses instead
//! ([`window_fires`] over narrow columns, [`flag_projection`] per batch), with the same values.

use datafusion::arrow::datatypes::DataType;
use datafusion::common::{Column, DFSchema, ScalarValue};
use datafusion::dataframe::DataFrame;
use datafusion::functions_aggregate::sum::sum_udaf;
use datafusion::functions_window::expr_fn::{lag, row_number};
use datafusion::logical_expr::{
    Expr, ExprFunctionExt, SortExpr, WindowFrame, WindowFrameBound, WindowFrameUnits, cast, lit, when,
};

use super::spike::{spike_condition, spike_summand, ty_as_int, units_per_day, window_aggregate};
use super::{ANOMALY_FLAGS, FINGERPRINT, IS_ANOMALY, RULES_VERSION, c, columns};
use crate::error::{Error, Result};
use crate::spec::rules::{Anomaly, AnomalyKind, RuleSet};

/// The columns an anomaly reads.
fn anomaly_columns(a: &Anomaly) -> Vec<String> {
    match &a.kind {
        AnomalyKind::When(e) => e.expr.column_refs().into_iter().map(|c| c.name.clone()).collect(),
        AnomalyKind::Spike { column, by, order, .. } => {
            by.iter().chain([order, column]).map(|i| i.name.clone()).collect()
        }
        AnomalyKind::FirstSeen { by, order, .. } => by.iter().chain([order]).map(|i| i.name.clone()).collect(),
    }
}

/// Check that `schema` has every column the anomalies of `rules` read (and the fingerprint when a
/// window anomaly orders ties by it).
fn check_anomaly_columns(schema: &DFSchema, rules: &RuleSet) -> Result<()> {
    let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
    for a in &rules.anomalies {
        for name in anomaly_columns(a) {
            if !schema.has_column_with_unqualified_name(&name) {
                return Err(Error::Invalid(format!(
                    "{}: anomaly \"{}\" reads column \"{name}\", which the table does not have; its columns are: {}",
                    rules.path.display(),
                    a.name,
                    names.join(", ")
                )));
            }
        }
    }
    if !schema.has_column_with_unqualified_name(FINGERPRINT)
        && rules.anomalies.iter().any(|a| !matches!(a.kind, AnomalyKind::When(_)))
    {
        return Err(Error::Invalid(format!(
            "{}: spike and first_seen order ties by {FINGERPRINT}, which the table does not have",
            rules.path.display()
        )));
    }
    Ok(())
}

/// Whether an anomaly needs the rows around a row (`spike`, `first_seen`), not only the row.
pub fn is_window(a: &Anomaly) -> bool {
    !matches!(a.kind, AnomalyKind::When(_))
}

/// Add the window columns of the `i`-th anomaly (a `spike` or `first_seen`) to `df`, ordering
/// ties by column `tie`; returns the frame and the expression that is true where it fires.
fn window_fire(
    df: DataFrame,
    i: usize,
    a: &Anomaly,
    rules: &RuleSet,
    tie: &str,
    inert: Option<&str>,
) -> Result<(DataFrame, Expr)> {
    let hidden = |what: &str| format!("__ingot_anomaly_{i}_{what}");
    // a row whose `inert` column is true takes no part, like a row with a null `by` value
    let take_part = |conditions: Expr| match inert {
        Some(col) => conditions.and(Expr::Not(Box::new(c(col)))),
        None => conditions,
    };
    let mut df = df;
    match &a.kind {
        AnomalyKind::When(e) => Ok((df, is_true(e.expr.clone())?)),
        AnomalyKind::Spike {
            column,
            by,
            order,
            window,
            factor,
            min_history,
        } => {
            let p = hidden("participates");
            let participates = by
                .iter()
                .chain([order, column])
                .map(|id| c(&id.name).is_not_null())
                .reduce(Expr::and)
                .unwrap_or(lit(true));
            df = df.with_column(&p, take_part(participates))?;
            let partition: Vec<Expr> = by.iter().map(|id| c(&id.name)).chain([c(&p)]).collect();
            let sort: Vec<SortExpr> = vec![c(&order.name).sort(true, true), c(tie).sort(true, true)];
            let frame = WindowFrame::new_bounds(
                WindowFrameUnits::Rows,
                WindowFrameBound::Preceding(ScalarValue::UInt64(Some(*window as u64))),
                WindowFrameBound::Preceding(ScalarValue::UInt64(Some(1))),
            );
            let ty = df
                .schema()
                .field_with_unqualified_name(&column.name)?
                .data_type()
                .clone();
            let (rn, s) = (hidden("rank"), hidden("sum"));
            // One Window node per anomaly: DataFusion requires the expressions of a node to
            // share PARTITION BY and ORDER BY.
            df = df.window(vec![
                row_number()
                    .partition_by(partition.clone())
                    .order_by(sort.clone())
                    .build()?
                    .alias(&rn),
                window_aggregate(sum_udaf(), spike_summand(c(&column.name), &ty, *factor))
                    .partition_by(partition)
                    .order_by(sort)
                    .window_frame(frame)
                    .build()?
                    .alias(&s),
            ])?;
            // The rows before a participating row in its window partition all participate, so
            // none has a null value: the frame's count is min(rank - 1, window).
            let n = when(c(&rn).gt(lit(*window as u64)), lit(*window as u64)).otherwise(c(&rn) - lit(1u64))?;
            let (exceeds, positive) = spike_condition(c(&column.name), &ty, n, c(&s), *factor);
            let fires = is_true(
                c(&p)
                    .and(c(&rn).gt(lit(*min_history as u64)))
                    .and(positive)
                    .and(exceeds),
            )?;
            Ok((df, fires))
        }
        AnomalyKind::FirstSeen { by, order, gap_days } => {
            let ty = df
                .schema()
                .field_with_unqualified_name(&order.name)?
                .data_type()
                .clone();
            let per_day = units_per_day(&ty).ok_or_else(|| {
                Error::Invalid(format!(
                    "{}: first_seen \"{}\": order column \"{}\" must be a date or timestamp, it is {ty}",
                    rules.path.display(),
                    a.name,
                    order.name
                ))
            })?;
            let gap = gap_days.checked_mul(per_day).ok_or_else(|| {
                Error::Invalid(format!(
                    "{}: first_seen \"{}\": gap_days {gap_days} is too large",
                    rules.path.display(),
                    a.name
                ))
            })?;
            let p = hidden("participates");
            let participates = by
                .iter()
                .chain([order])
                .map(|id| c(&id.name).is_not_null())
                .reduce(Expr::and)
                .unwrap_or(lit(true));
            df = df.with_column(&p, take_part(participates))?;
            let partition: Vec<Expr> = by.iter().map(|id| c(&id.name)).chain([c(&p)]).collect();
            let sort: Vec<SortExpr> = vec![c(&order.name).sort(true, true), c(tie).sort(true, true)];
            // Date32 is days, Date64 milliseconds, a timestamp its unit since the epoch.
            let ordinal = cast(cast(c(&order.name), ty_as_int(&ty)), DataType::Int64);
            let previous = hidden("previous");
            df = df.window(vec![
                lag(ordinal.clone(), Some(1), None)
                    .partition_by(partition)
                    .order_by(sort)
                    .build()?
                    .alias(&previous),
            ])?;
            let fires = is_true(c(&p).and(c(&previous).is_null().or((ordinal - c(&previous)).gt_eq(lit(gap)))))?;
            Ok((df, fires))
        }
    }
}

/// The output columns of a flagged table over `all` (the input's columns): every column but
/// `anomaly_flags` and `is_anomaly`, with those two inserted after `rules_version` (or where they
/// were), computed from `fires` (one expression per anomaly of `rules`, in rule order).
fn flag_output(all: &[(String, Expr)], rules: &RuleSet, fires: Vec<Expr>) -> Result<Vec<Expr>> {
    let position = all
        .iter()
        .position(|(n, _)| n == ANOMALY_FLAGS)
        .or_else(|| all.iter().position(|(n, _)| n == RULES_VERSION).map(|i| i + 1))
        .unwrap_or(all.len());
    let keep = |(n, _): &&(String, Expr)| n != ANOMALY_FLAGS && n != IS_ANOMALY;
    // lists made per batch ([`crate::engine::lists`]), not a `CASE` per row and anomaly
    let flags = match all.first() {
        Some((_, like)) if fires.is_empty() => crate::engine::lists::repeat(
            ScalarValue::List(ScalarValue::new_list_nullable(&[], &DataType::Utf8)),
            like.clone(),
        ),
        _ => {
            let names: Vec<&str> = rules.anomalies.iter().map(|a| a.name.as_str()).collect();
            crate::engine::lists::flags(&names, fires.clone())
        }
    };
    let is_anomaly = fires.into_iter().reduce(Expr::or).unwrap_or(lit(false));
    let mut out: Vec<Expr> = all[..position].iter().filter(keep).map(|(_, e)| e.clone()).collect();
    out.push(flags.alias(ANOMALY_FLAGS));
    out.push(is_anomaly.alias(IS_ANOMALY));
    out.extend(all[position..].iter().filter(keep).map(|(_, e)| e.clone()));
    Ok(out)
}

/// Add `anomaly_flags` and `is_anomaly` to `df` (replacing them if present), computed over all
/// of `df` with the anomalies of `rules` (docs/guide.md#rules).
///
/// Flags are computed over the whole DataFrame given: an incremental build must pass the whole
/// table as built (kept rows plus rebuilt rows), never only the changed rows.
///
/// * A row *participates* in a `spike` when its `by` columns, its `order` and its `column` are
///   all non-null, in a `first_seen` when its `by` columns and `order` are. Participation is
///   made exact by adding the participation flag to the window's PARTITION BY: the windows of
///   participating rows then only ever contain participating rows of their group, so a
///   non-participating row can neither be flagged (its window values are masked) nor count as
///   history, and no join or union is needed. (A CASE inside the window would not do: a ROWS
///   frame counts rows, so masked rows would still take slots of the `window` rows before.)
/// * Within a group rows are ordered by `order` ascending, then `natural_key_fingerprint`
///   ascending (unique per silver row), so the order is total and a rebuild gives the same flags.
/// * `spike` fires when the row has at least `min_history` earlier rows in its group
///   (`row_number() > min_history`), and over the up to `window` rows just before it (`ROWS
///   BETWEEN window PRECEDING AND 1 PRECEDING`; `n` rows, sum `s`) the mean `s / n` is > 0 and
///   the value `v` > `factor × s / n`. It is evaluated without division as `s > 0 AND v × n >
///   factor × s`, exactly: integer and decimal columns in `Decimal128(38, scale)` with `factor`
///   as the exact decimal it was written as (`2.5` is 25/10, no binary rounding), so a value
///   equal to `factor × mean` never fires. Float columns (and a factor with more than 30 digits)
///   compare in Float64. A product beyond Decimal128 is an execution error, never a wrong flag.
/// * `first_seen` fires on the first participating row of a group (no previous row) and on a row
///   whose `order` is at least `gap_days` days after the previous participating row's. The day
///   difference is exact integer arithmetic on the stored value: for `date` columns the number
///   of calendar days between the two dates; for `timestamp` columns elapsed time, firing when
///   `order - previous >= gap_days × 86 400 s` (instants, so time zones and DST play no part: 23
///   hours short of a full `gap_days` is not enough).
/// * `when` fires when its expression is true (NULL does not fire).
/// * `anomaly_flags` is the list of names that fired, in rule order, `[]` when none (never
///   null); `is_anomaly` is true when the list is not empty. A DataFrame that already has these
///   columns (a stored silver table) gets them replaced in place.
pub fn flag(df: DataFrame, rules: &RuleSet) -> Result<DataFrame> {
    check_anomaly_columns(df.schema(), rules)?;
    let all = columns(&df);
    let mut df = df;
    let mut fires = Vec::new();
    for (i, a) in rules.anomalies.iter().enumerate() {
        let (next, fire) = window_fire(df, i, a, rules, FINGERPRINT, None)?;
        df = next;
        fires.push(fire);
    }
    let fired: Vec<String> = (0..fires.len()).map(|i| format!("__ingot_anomaly_{i}_fired")).collect();
    for (name, e) in fired.iter().zip(fires) {
        df = df.with_column(name, e)?;
    }
    let out = flag_output(&all, rules, fired.iter().map(|f| c(f)).collect())?;
    Ok(df.select(out)?)
}

/// Name of the column [`window_fires`] gives for the `i`-th anomaly of the rules.
pub fn window_fired_column(i: usize) -> String {
    format!("__ingot_window_{i}_fired")
}

/// The window anomalies (`spike`, `first_seen`) of `rules` over all of `df`, which must have the
/// columns they read and `tie`, a column ordered like `natural_key_fingerprint` (unique per row)
/// that breaks ties of `order`. Returns the rows for which at least one fires, as `tie` and one
/// boolean column per window anomaly ([`window_fired_column`] of its index); `None` when the rules
/// have no window anomaly. Only the columns the windows read need to be in `df`: sorting a few
/// narrow columns is what makes flagging a large table cheap.
pub fn window_fires(df: DataFrame, rules: &RuleSet, tie: &str) -> Result<Option<DataFrame>> {
    window_fires_with(df, rules, tie, &[], None, true)
}

/// [`window_fires`] with the columns `extra` of `df` carried along, the rows whose boolean column
/// `inert` is true taking no part (never flagged, not history; they only ride along), and every
/// row (`only_fired` false) or only those for which an anomaly fires.
pub fn window_fires_with(
    df: DataFrame,
    rules: &RuleSet,
    tie: &str,
    extra: &[String],
    inert: Option<&str>,
    only_fired: bool,
) -> Result<Option<DataFrame>> {
    let mut df = df;
    let mut out = vec![c(tie)];
    let mut any: Option<Expr> = None;
    for (i, a) in rules.anomalies.iter().enumerate() {
        if !is_window(a) {
            continue;
        }
        let (next, fire) = window_fire(df, i, a, rules, tie, inert)?;
        df = next.with_column(&window_fired_column(i), fire)?;
        out.push(c(&window_fired_column(i)));
        let f = c(&window_fired_column(i));
        any = Some(match any {
            None => f,
            Some(e) => e.or(f),
        });
    }
    out.extend(extra.iter().map(|e| c(e)));
    match any {
        None => Ok(None),
        Some(any) if only_fired => Ok(Some(df.filter(any)?.select(out)?)),
        Some(_) => Ok(Some(df.select(out)?)),
    }
}

/// The projection that flags the rows of a table with columns `schema` (a silver table's, with or
/// without `anomaly_flags` and `is_anomaly`): the `when` anomalies are evaluated on the row, the
/// `i`-th anomaly, a window one, is `window(i)` (typically a lookup in the set of rows
/// [`window_fires`] found). Same columns and values as [`flag`] over the whole table.
pub fn flag_projection(schema: &DFSchema, rules: &RuleSet, window: impl Fn(usize) -> Expr) -> Result<Vec<Expr>> {
    check_anomaly_columns(schema, rules)?;
    let all: Vec<(String, Expr)> = schema
        .iter()
        .map(|(q, f)| (f.name().clone(), Expr::Column(Column::from((q, f)))))
        .collect();
    let mut fires = Vec::new();
    for (i, a) in rules.anomalies.iter().enumerate() {
        fires.push(match &a.kind {
            AnomalyKind::When(e) => is_true(e.expr.clone())?,
            _ => window(i),
        });
    }
    flag_output(&all, rules, fires)
}

/// `e IS TRUE` as `CASE WHEN e THEN true ELSE false END`: the same values, but a non-null
/// result in the physical plan too (DataFusion plans `IS TRUE` as `IS NOT DISTINCT FROM true`,
/// which it reports as nullable while the logical schema says not, and a later node that checks
/// the two schemas refuses the plan).
fn is_true(e: Expr) -> Result<Expr> {
    Ok(when(e, lit(true)).otherwise(lit(false))?)
}
