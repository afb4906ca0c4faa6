//! Resolve, steps and validations of a rules version: [`transform`] as four plans (one per
//! output, for tests and `ingot explain`), [`transform_split`] as the one plan a build executes.

use datafusion::dataframe::DataFrame;
use datafusion::execution::FunctionRegistry;
use datafusion::logical_expr::{Expr, case, lit, when};
use datafusion::prelude::SessionContext;

use super::{
    FILTERED_COLUMNS, FINGERPRINT, LINEAGE_COLUMNS, Lookups, RESOLVE_REASON, RESOLVE_RULE, ROW_NUMBER, RULES_VERSION,
    bookkeeping, c, columns, null_text, resolve,
};
use crate::error::{Error, Result};
use crate::hash::json::{ToJsonRow, to_json_row, to_json_row_udf};
use crate::silver::sources::{REJECT_REASON, REJECT_RULE, STATE_RUN};
use crate::spec::contract::{Contract, OnMissing};
use crate::spec::rules::sources::SOURCE_CONFLICT_FLAG;
use crate::spec::rules::{Action, RuleSet, Step};

const VALIDATION_RULE: &str = "__ingot_validation_rule";

/// The four plans of one build; see [`transform`].
pub struct Transformed {
    pub passed: DataFrame,
    pub rejected: DataFrame,
    pub failed: DataFrame,
    pub filtered: DataFrame,
}

/// The rows of a resolve rejection or a validation in the shape of
/// [`FAILURE_COLUMNS`](super::FAILURE_COLUMNS).
fn failure_rows(df: DataFrame, rule: Expr, reason: Expr, data: Vec<(String, Expr)>) -> Result<DataFrame> {
    Ok(df.select(vec![
        c(FINGERPRINT),
        c(ROW_NUMBER),
        rule.alias("rule"),
        reason.alias("reason"),
        to_json_row(data).alias("raw_payload"),
    ])?)
}

/// Check that `rules` read `contract`'s source and register `to_json_row` (rejection payloads)
/// in `ctx`: what both forms of the transform need first.
fn prepare(ctx: &SessionContext, rules: &RuleSet, contract: &Contract) -> Result<()> {
    if rules.source != contract.source {
        return Err(Error::Invalid(format!(
            "{}: the rules read source \"{}\" but the contract given is \"{}\"",
            rules.path.display(),
            rules.source,
            contract.source
        )));
    }
    if ctx.udf(ToJsonRow::NAME).is_err() {
        ctx.register_udf(to_json_row_udf());
    }
    Ok(())
}

/// The data columns of `cols`: without the bookkeeping columns and resolve's rejection columns.
fn data_columns(cols: &[(String, Expr)]) -> Vec<(String, Expr)> {
    let meta = bookkeeping();
    let hidden = crate::silver::sources::HIDDEN;
    cols.iter()
        .filter(|(n, _)| !meta.contains(n) && n != RESOLVE_RULE && n != RESOLVE_REASON && !hidden.contains(&n.as_str()))
        .cloned()
        .collect()
}

/// Resolve, steps and validations of `rules` over `input` (the source's `_current` rows);
/// `lookups` holds the current rows of every source the contract's `resolve` reads.
///
/// Every input row ends in exactly one of four frames, so rows read equal the sum of the rows of
/// `passed`, `rejected`, `failed` and `filtered`:
///
/// * `passed`: the rows silver keeps, columns in the order of docs/formats.md#tables: the columns
///   the rules produce (their last step's columns, which include the resolve values) except the
///   bronze bookkeeping columns, then `rules_version` (Int32 literal), then the lineage columns
///   `natural_key_fingerprint`, `row_hash`, `ingestion_run_id`. `file_hash`,
///   `natural_key_version`, `contract_version`, `source_row_number` and `ingested_at` stay in
///   bronze. [`flag`](super::flag) inserts `anomaly_flags` and `is_anomaly` after
///   `rules_version`; the build adds `silver_build_id`.
/// * `rejected` and `failed`: [`FAILURE_COLUMNS`](super::FAILURE_COLUMNS), one row per record with
///   the *first* rule it broke. Resolve comes first (a record whose lookup misses under
///   `on_missing: reject` is rejected with `resolve:<name>` and never reaches the steps, so a step
///   cannot fail on it), then the validations in file order. A check that is not true (false or
///   NULL) fails. The first failing validation decides: `action: reject` puts the row in
///   `rejected`, `action: fail` in `failed` (the build must then fail and publish nothing). A row
///   that an earlier `reject` validation already rejected is not checked by a later `fail`
///   validation: put the `fail` validations first when they must see every row. `raw_payload` is
///   the record as JSON (see [`crate::hash::json`]): for a resolve rejection its bronze fields and
///   the resolve values, for a validation its columns after the steps (bookkeeping columns left
///   out; the fingerprint and record number are columns of their own).
/// * `filtered`: the rows a `filter` step removed ([`FILTERED_COLUMNS`]), for the build log's
///   counts. Each filter step is re-planned over the steps before it and keeps the rows its
///   predicate does not hold for (false or NULL), so a row is counted once, by the first filter
///   that removed it. This re-reads the input once per filter step; a build that only needs
///   the count may instead subtract.
pub fn transform(
    ctx: &SessionContext,
    rules: &RuleSet,
    contract: &Contract,
    input: DataFrame,
    lookups: &Lookups,
) -> Result<Transformed> {
    prepare(ctx, rules, contract)?;
    let data_of = data_columns;

    let resolved = resolve(input, contract, lookups)?;
    let resolved_cols = columns(&resolved);
    let resolve_rejected = failure_rows(
        resolved.clone().filter(c(RESOLVE_RULE).is_not_null())?,
        c(RESOLVE_RULE),
        c(RESOLVE_REASON),
        data_of(&resolved_cols),
    )?;
    let ok = resolved.filter(c(RESOLVE_RULE).is_null())?.select(
        resolved_cols
            .iter()
            .filter(|(n, _)| n != RESOLVE_RULE && n != RESOLVE_REASON)
            .map(|(_, e)| e.clone())
            .collect::<Vec<_>>(),
    )?;

    let stepped = crate::silver::apply_steps(ok.clone(), rules)?;
    let filtered = filtered_rows(ok, rules, LINEAGE_COLUMNS[2])?;
    let stepped_cols = columns(&stepped);
    let data = data_of(&stepped_cols);

    let (kept, rejected, failed) = if rules.validate.is_empty() {
        let none =
            |df: &DataFrame| failure_rows(df.clone().filter(lit(false))?, null_text(), null_text(), data.clone());
        (
            stepped.clone(),
            resolve_rejected.union(none(&stepped)?)?,
            none(&stepped)?,
        )
    } else {
        let first = &rules.validate[0];
        let mut rule = when(first.check.expr.clone().is_not_true(), lit(first.name.as_str()));
        for v in &rules.validate[1..] {
            rule = rule.when(v.check.expr.clone().is_not_true(), lit(v.name.as_str()));
        }
        let mut reason = case(c(VALIDATION_RULE));
        for v in &rules.validate {
            reason = reason.when(lit(v.name.as_str()), lit(v.reason.as_str()));
        }
        let reason = reason.end()?;
        let checked = stepped.with_column(VALIDATION_RULE, rule.end()?)?;
        let with_action = |action: Action| -> Result<DataFrame> {
            let names: Vec<Expr> = rules
                .validate
                .iter()
                .filter(|v| v.action == action)
                .map(|v| lit(v.name.as_str()))
                .collect();
            let rows = if names.is_empty() {
                checked.clone().filter(lit(false))?
            } else {
                checked.clone().filter(c(VALIDATION_RULE).in_list(names, false))?
            };
            failure_rows(rows, c(VALIDATION_RULE), reason.clone(), data.clone())
        };
        let kept = checked.clone().filter(c(VALIDATION_RULE).is_null())?;
        (
            kept,
            resolve_rejected.union(with_action(Action::Reject)?)?,
            with_action(Action::Fail)?,
        )
    };

    let mut silver: Vec<Expr> = data.into_iter().map(|(_, e)| e).collect();
    silver.push(lit(rules.version).alias(RULES_VERSION));
    for name in LINEAGE_COLUMNS {
        let (_, e) = stepped_cols
            .iter()
            .find(|(n, _)| n == name)
            .ok_or_else(|| Error::Invalid(format!("{}: the steps lost column {name}", rules.path.display())))?;
        silver.push(e.clone());
    }
    Ok(Transformed {
        passed: kept.select(silver)?,
        rejected,
        failed,
        filtered: filtered.select(FILTERED_COLUMNS.iter().map(|n| c(n)).collect::<Vec<_>>())?,
    })
}

/// Columns [`transform_split`] adds after the silver columns.
pub const SPLIT_ROW_NUMBER: &str = "__ingot_row_number";
/// The first validation the row failed (null: it passed).
pub const SPLIT_RULE: &str = "__ingot_rule";
/// Why [`SPLIT_RULE`] failed (null when it passed).
pub const SPLIT_REASON: &str = "__ingot_reason";
/// The row as JSON for the failure log, only computed for failing rows (null when it passed).
pub const SPLIT_PAYLOAD: &str = "__ingot_payload";

/// The plans of a build that executes the transform once: see [`transform_split`].
pub struct Split {
    /// Every row that survived resolve and the `filter` steps: the columns of
    /// [`Transformed::passed`], then [`SPLIT_ROW_NUMBER`], [`SPLIT_RULE`], [`SPLIT_REASON`] and
    /// [`SPLIT_PAYLOAD`]. A row with a null rule passed; the others failed that validation.
    pub rows: DataFrame,
    /// Number of leading columns of `rows` that silver keeps.
    pub silver_width: usize,
    /// The resolve rejections in the shape of [`FAILURE_COLUMNS`](super::FAILURE_COLUMNS) plus
    /// `ingestion_run_id`, when the contract has an `on_missing: reject` resolve (a second read
    /// of the input).
    pub resolve_rejected: Option<DataFrame>,
    /// `natural_key_fingerprint` and `ingestion_run_id` of the rows a `filter` step removed, when
    /// the rules have one (each filter step re-reads the columns its steps need).
    pub filtered: Option<DataFrame>,
}

/// The transform of [`transform`] as one plan: the rows that pass and the rows a validation
/// fails come out of one execution, told apart by [`SPLIT_RULE`]. A row a `filter` step removed
/// is in no output (its count is the input's minus the others). Same semantics as [`transform`]:
/// a row is checked against the validations in order and the first failing one is its rule.
pub fn transform_split(
    ctx: &SessionContext,
    rules: &RuleSet,
    contract: &Contract,
    input: DataFrame,
    lookups: &Lookups,
) -> Result<Split> {
    prepare(ctx, rules, contract)?;
    let data_of = data_columns;
    let rejects = contract.resolve.iter().any(|r| r.on_missing == OnMissing::Reject);
    let resolved = resolve(input, contract, lookups)?;
    let resolved_cols = columns(&resolved);
    let resolve_rejected = if rejects {
        let rows = resolved.clone().filter(c(RESOLVE_RULE).is_not_null())?;
        let mut cols = vec![
            c(FINGERPRINT),
            c(ROW_NUMBER),
            c(RESOLVE_RULE).alias("rule"),
            c(RESOLVE_REASON).alias("reason"),
            to_json_row(data_of(&resolved_cols)).alias("raw_payload"),
        ];
        cols.push(c(LINEAGE_COLUMNS[2]));
        Some(rows.select(cols)?)
    } else {
        None
    };
    let plain: Vec<Expr> = resolved_cols
        .iter()
        .filter(|(n, _)| n != RESOLVE_RULE && n != RESOLVE_REASON)
        .map(|(_, e)| e.clone())
        .collect();
    let ok = if rejects {
        resolved.filter(c(RESOLVE_RULE).is_null())?.select(plain)?
    } else {
        resolved.select(plain)?
    };
    let stepped = crate::silver::apply_steps(ok.clone(), rules)?;
    let stepped_cols = columns(&stepped);
    let data = data_of(&stepped_cols);
    // a table with several sources: the state records the combination of the sources' runs
    let state_run = if stepped.schema().has_column_with_unqualified_name(STATE_RUN) {
        STATE_RUN
    } else {
        LINEAGE_COLUMNS[2]
    };
    let filtered = if rules.steps.iter().any(|s| matches!(s, Step::Filter(_))) {
        Some(filtered_rows(ok, rules, state_run)?.select(vec![c(FINGERPRINT), c(LINEAGE_COLUMNS[2])])?)
    } else {
        None
    };

    // several sources: a record a candidate's resolve rejects fails first, with that rule
    let early = stepped.schema().has_column_with_unqualified_name(REJECT_RULE);
    let (rule, reason) = if rules.validate.is_empty() && !early {
        (null_text(), null_text())
    } else {
        let mut rule = if early {
            when(c(REJECT_RULE).is_not_null(), c(REJECT_RULE))
        } else {
            let first = &rules.validate[0];
            when(first.check.expr.clone().is_not_true(), lit(first.name.as_str()))
        };
        for v in &rules.validate[usize::from(!early)..] {
            rule = rule.when(v.check.expr.clone().is_not_true(), lit(v.name.as_str()));
        }
        let mut reason = case(c(SPLIT_RULE));
        for v in &rules.validate {
            // a conflict's reason names its fields and values
            let text = if v.name == SOURCE_CONFLICT_FLAG && state_run == STATE_RUN {
                c(crate::silver::sources::CONFLICT)
            } else {
                lit(v.reason.as_str())
            };
            reason = reason.when(lit(v.name.as_str()), text);
        }
        let reason = if early {
            let rest = if rules.validate.is_empty() {
                null_text()
            } else {
                reason.end()?
            };
            when(c(REJECT_RULE).is_not_null(), c(REJECT_REASON)).otherwise(rest)?
        } else {
            reason.end()?
        };
        (rule.end()?, reason)
    };
    let checked = stepped.with_column(SPLIT_RULE, rule)?;

    let mut out: Vec<Expr> = data.iter().map(|(_, e)| e.clone()).collect();
    out.push(lit(rules.version).alias(RULES_VERSION));
    for name in LINEAGE_COLUMNS {
        let (_, e) = stepped_cols
            .iter()
            .find(|(n, _)| n == name)
            .ok_or_else(|| Error::Invalid(format!("{}: the steps lost column {name}", rules.path.display())))?;
        out.push(e.clone());
    }
    let silver_width = out.len();
    out.push(c(ROW_NUMBER).alias(SPLIT_ROW_NUMBER));
    out.push(c(SPLIT_RULE));
    out.push(reason.alias(SPLIT_REASON));
    // CASE evaluates its THEN only on the rows its WHEN holds for: JSON only for failing rows.
    out.push(
        when(c(SPLIT_RULE).is_not_null(), to_json_row(data))
            .end()?
            .alias(SPLIT_PAYLOAD),
    );
    if state_run == STATE_RUN {
        out.push(c(STATE_RUN));
    }
    Ok(Split {
        rows: checked.select(out)?,
        silver_width,
        resolve_rejected,
        filtered,
    })
}

/// The rows each `filter` step removes, planned over the steps before it; `run`: the column of
/// the record's version in the state (as `ingestion_run_id`).
fn filtered_rows(ok: DataFrame, rules: &RuleSet, run: &str) -> Result<DataFrame> {
    let mut out: Option<DataFrame> = None;
    for (k, step) in rules.steps.iter().enumerate() {
        let Step::Filter(predicate) = step else {
            continue;
        };
        let before = RuleSet {
            steps: rules.steps[..k].to_vec(),
            ..rules.clone()
        };
        let removed = crate::silver::apply_steps(ok.clone(), &before)?
            .filter(predicate.expr.clone().is_not_true())?
            .select(vec![
                c(FINGERPRINT),
                c(ROW_NUMBER),
                lit(i32::try_from(k + 1).unwrap_or(i32::MAX)).alias("step"),
                lit(predicate.sql.as_str()).alias("filter"),
                c(run).alias(LINEAGE_COLUMNS[2]),
            ])?;
        out = Some(match out {
            None => removed,
            Some(o) => o.union(removed)?,
        });
    }
    match out {
        Some(o) => Ok(o),
        None => Ok(ok.filter(lit(false))?.select(vec![
            c(FINGERPRINT),
            c(ROW_NUMBER),
            lit(0i32).alias("step"),
            lit("").alias("filter"),
            c(run).alias(LINEAGE_COLUMNS[2]),
        ])?),
    }
}
