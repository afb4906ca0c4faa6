//! The plans of a silver build, as DataFrames (nothing is executed here): [`resolve`] the
//! contract's lookups, apply the rules' steps, run the validations ([`transform`]), and flag
//! anomalies over a whole table ([`flag`]). [`explain`] prints the plans for `ingot explain`.
//!
//! Everything is built from `Expr` trees: rule expressions were parsed by DataFusion when the
//! rules were loaded, column names are `Column`s and string literals, never SQL text.
//!
//! # Outputs of [`transform`]
//!
//! Every input row ends in exactly one of four frames, so rows read equal the sum of the rows of
//! `passed`, `rejected`, `failed` and `filtered`:
//!
//! * `passed`: the rows silver keeps, columns in the order of docs/formats.md#tables: the columns the rules
//!   produce (their last step's columns, which include the resolve values) except the bronze
//!   bookkeeping columns, then `rules_version` (Int32 literal), then the lineage columns
//!   `natural_key_fingerprint`, `row_hash`, `ingestion_run_id`. `file_hash`,
//!   `natural_key_version`, `contract_version`, `source_row_number` and `ingested_at` stay in
//!   bronze. [`flag`] inserts `anomaly_flags` and `is_anomaly` after `rules_version`; the build
//!   adds `silver_build_id`.
//! * `rejected` and `failed`: [`FAILURE_COLUMNS`], one row per record with the *first* rule it
//!   broke. Resolve comes first (a record whose lookup misses under `on_missing: reject` is
//!   rejected with `resolve:<name>` and never reaches the steps, so a step cannot fail on it),
//!   then the validations in file order. A check that is not true (false or NULL) fails. The
//!   first failing validation decides: `action: reject` puts the row in `rejected`, `action:
//!   fail` in `failed` (the build must then fail and publish nothing). A row that an earlier
//!   `reject` validation already rejected is not checked by a later `fail` validation: put the
//!   `fail` validations first when they must see every row. `raw_payload` is the record as JSON
//!   (see [`crate::hash::json`]): for a resolve rejection its bronze fields and the resolve
//!   values, for a validation its columns after the steps (bookkeeping columns left out; the
//!   fingerprint and record number are columns of their own).
//! * `filtered`: the rows a `filter` step removed ([`FILTERED_COLUMNS`]), for the build log's
//!   counts. Each filter step is re-planned over the steps before it and keeps the rows its
//!   predicate does not hold for (false or NULL), so a row is counted once, by the first filter
//!   that removed it. This re-reads the input once per filter step; a build that only needs
//!   the count may instead subtract.
//!
//! # Resolve
//!
//! A `resolve` entry left-joins the lookup source's current rows on `normalize(from) =
//! normalize(key)`, each side with the `normalize` steps of its own contract field (string
//! fields only; other types compare as they are). The lookup side is first grouped by the
//! normalized key, so a record can never be duplicated by the join: a key held by exactly one
//! lookup row gives that row's `value`; a null `from`, a key no lookup row has, and a key more
//! than one lookup row has (ambiguous: ingot will not pick one) are all "missing". Missing under
//! `on_missing: null` is a null value; under `reject` the record is rejected with rule
//! `resolve:<name>` and a reason saying which of the three it was.
//!
//! # Anomalies (docs/guide.md#rules)
//!
//! Flags are computed over the whole DataFrame given to [`flag`]: an incremental build must pass
//! the whole table as built (kept rows plus rebuilt rows), never only the changed rows.
//!
//! * A row *participates* in a `spike` when its `by` columns, its `order` and its `column` are
//!   all non-null, in a `first_seen` when its `by` columns and `order` are. Participation is
//!   made exact by adding the participation flag to the window's PARTITION BY: the windows of
//!   participating rows then only ever contain participating rows of their group, so a
//!   non-participating row can neither be flagged (its window values are masked) nor count as
//!   history, and no join or union is needed. (A CASE inside the window would not do: a ROWS
//!   frame counts rows, so masked rows would still take slots of the `window` rows before.)
//! * Within a group rows are ordered by `order` ascending, then `natural_key_fingerprint`
//!   ascending (unique per silver row), so the order is total and a rebuild gives the same flags.
//! * `spike` fires when the row has at least `min_history` earlier rows in its group
//!   (`row_number() > min_history`), and over the up to `window` rows just before it (`ROWS
//!   BETWEEN window PRECEDING AND 1 PRECEDING`; `n` rows, sum `s`) the mean `s / n` is > 0 and the
//!   value `v` > `factor × s / n`. It is evaluated without division as `s > 0 AND v × n >
//!   factor × s`, exactly: integer and decimal columns in `Decimal128(38, scale)` with `factor`
//!   as the exact decimal it was written as (`2.5` is 25/10, no binary rounding), so a value
//!   equal to `factor × mean` never fires. Float columns (and a factor with more than 30 digits)
//!   compare in Float64. A product beyond Decimal128 is an execution error, never a wrong flag.
//! * `first_seen` fires on the first participating row of a group (no previous row) and on a row
//!   whose `order` is at least `gap_days` days after the previous participating row's. The day
//!   difference is exact integer arithmetic on the stored value: for `date` columns the number
//!   of calendar days between the two dates; for `timestamp` columns elapsed time, firing when
//!   `order - previous >= gap_days × 86 400 s` (instants, so time zones and DST play no part: 23
//!   hours short of a full `gap_days` is not enough).
//! * `when` fires when its expression is true (NULL does not fire).
//! * `anomaly_flags` is the list of names that fired, in rule order, `[]` when none (never
//!   null); `is_anomaly` is true when the list is not empty. A DataFrame that already has these
//!   columns (a stored silver table) gets them replaced in place.
//!
//! Hazards: every output of [`transform`] is a separate plan over the same input, so executing
//! all of them reads bronze once per output; a build uses [`transform_split`] (one plan for the
//! passing and failing rows), [`window_fires`] (windows over narrow columns) and
//! [`flag_projection`] (flags of one batch) instead. `to_json_row` is
//! registered in the session given to [`transform`]; plans built from [`resolve`] alone use the
//! hashing UDFs of [`crate::hash`], which every ingot session has.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, TimeUnit};
use datafusion::common::{Column, DFSchema, ScalarValue, TableReference};
use datafusion::dataframe::DataFrame;
use datafusion::execution::FunctionRegistry;
use datafusion::functions::string::expr_fn::concat;
use datafusion::functions_aggregate::expr_fn::{count, min};
use datafusion::functions_aggregate::sum::sum_udaf;
use datafusion::functions_nested::expr_fn::array_concat;
use datafusion::functions_window::expr_fn::{lag, row_number};
use datafusion::logical_expr::expr::WindowFunction;
use datafusion::logical_expr::{
    AggregateUDF, Expr, ExprFunctionExt, JoinType, ScalarUDF, SortExpr, WindowFrame, WindowFrameBound,
    WindowFrameUnits, case, cast, lit, when,
};
use datafusion::prelude::SessionContext;

use crate::error::{Error, Result};
use crate::hash::json::{ToJsonRow, to_json_row, to_json_row_udf};
use crate::spec::contract::{Contract, ContractSet, Field, OnMissing};
use crate::spec::rules::{Action, Anomaly, AnomalyKind, RuleSet, Step};

/// `rules_version` (Int32): the version of the rules that produced a silver row.
pub use crate::spec::columns::RULES_VERSION;
/// `anomaly_flags` (List<Utf8>): names of the anomaly rules that fired, in rule order.
pub const ANOMALY_FLAGS: &str = "anomaly_flags";
/// `is_anomaly` (Boolean): whether any anomaly rule fired.
pub const IS_ANOMALY: &str = "is_anomaly";
/// The bronze columns silver keeps (after `rules_version`), for lineage.
pub const LINEAGE_COLUMNS: [&str; 3] = ["natural_key_fingerprint", "row_hash", "ingestion_run_id"];
/// Columns of `rejected` and `failed`.
pub const FAILURE_COLUMNS: [&str; 5] = [
    "natural_key_fingerprint",
    "source_row_number",
    "rule",
    "reason",
    "raw_payload",
];
/// Columns of `filtered`: the fingerprint, the record number, the 1-based number of the filter
/// step in `steps` and its SQL text.
pub const FILTERED_COLUMNS: [&str; 4] = ["natural_key_fingerprint", "source_row_number", "step", "filter"];
/// Added by [`resolve`]: `resolve:<name>` of the first `on_missing: reject` entry that missed,
/// null when none did.
pub const RESOLVE_RULE: &str = "__ingot_resolve_rule";
/// Added by [`resolve`]: why [`RESOLVE_RULE`] is set, null when it is not.
pub const RESOLVE_REASON: &str = "__ingot_resolve_reason";

const FINGERPRINT: &str = "natural_key_fingerprint";
const ROW_NUMBER: &str = "source_row_number";
const VALIDATION_RULE: &str = "__ingot_validation_rule";

/// The current rows of a lookup source and its contract (for the key's `normalize` steps).
#[derive(Clone)]
pub struct Lookup {
    pub contract: Arc<Contract>,
    /// Typically `bronze.<lookup>_current`.
    pub rows: DataFrame,
}

/// Lookups by source name.
pub type Lookups = BTreeMap<String, Lookup>;

/// What a build of one rules version reads.
pub struct Inputs {
    pub contract: Arc<Contract>,
    /// `bronze.<source>_current`.
    pub input: DataFrame,
    pub lookups: Lookups,
}

/// The four plans of one build; see the module documentation.
pub struct Transformed {
    pub passed: DataFrame,
    pub rejected: DataFrame,
    pub failed: DataFrame,
    pub filtered: DataFrame,
}

/// `bronze.<source>_current` as a table reference (never parsed from text).
pub fn current_table(source: &str) -> TableReference {
    TableReference::partial("bronze", format!("{source}_current"))
}

/// The source's and its lookups' `_current` views from a session opened by [`crate::engine::catalog::open`].
pub async fn read_inputs(ctx: &SessionContext, contracts: &ContractSet, rules: &RuleSet) -> Result<Inputs> {
    let contract_of = |source: &str| {
        contracts.contracts.get(source).cloned().ok_or_else(|| {
            Error::Invalid(format!(
                "{}: source \"{source}\" has no loadable contract; sources are: {}",
                rules.path.display(),
                contracts.names().join(", ")
            ))
        })
    };
    let contract = contract_of(&rules.source)?;
    let input = ctx.table(current_table(&rules.source)).await?;
    let mut lookups = Lookups::new();
    for r in &contract.resolve {
        if !lookups.contains_key(&r.lookup) {
            let lookup = Lookup {
                contract: contract_of(&r.lookup)?,
                rows: ctx.table(current_table(&r.lookup)).await?,
            };
            lookups.insert(r.lookup.clone(), lookup);
        }
    }
    Ok(Inputs {
        contract,
        input,
        lookups,
    })
}

fn c(name: &str) -> Expr {
    Expr::Column(Column::new_unqualified(name))
}

fn null_text() -> Expr {
    lit(ScalarValue::Utf8(None))
}

/// Every column of `df`, as `(name, column expression)` keeping its qualifier.
fn columns(df: &DataFrame) -> Vec<(String, Expr)> {
    df.schema()
        .iter()
        .map(|(q, f)| (f.name().clone(), Expr::Column(Column::from((q, f)))))
        .collect()
}

/// Names of the bronze bookkeeping columns (`ingestion_run_id`, ..., `ingested_at`).
fn bookkeeping() -> HashSet<String> {
    crate::table::bronze::meta_fields()
        .iter()
        .map(|f| f.name().clone())
        .collect()
}

/// `e` after the field's `normalize` steps (via the `normalize_text` UDF); unchanged when the
/// field is not a string or has no steps.
fn normalized(e: Expr, field: &Field) -> Expr {
    if field.normalize.is_empty() || field.ty.arrow_type() != DataType::Utf8 {
        return e;
    }
    let steps: Vec<&str> = field.normalize.iter().map(|s| s.name()).collect();
    let udf = Arc::new(ScalarUDF::from(crate::hash::udf::NormalizeText::new()));
    udf.call(vec![e, lit(steps.join(","))])
}

fn field_of<'a>(contract: &'a Contract, name: &str) -> Result<&'a Field> {
    contract.field_index(name).map(|i| &contract.fields[i]).ok_or_else(|| {
        Error::Invalid(format!(
            "{}: \"{name}\" is not a field of \"{}\"; its fields are: {}",
            contract.path.display(),
            contract.source,
            contract.field_names().join(", ")
        ))
    })
}

/// Add the contract's `resolve` values to `df` (the source's current rows), each under its `as`
/// name after the input columns, plus [`RESOLVE_RULE`] and [`RESOLVE_REASON`] saying which
/// `on_missing: reject` entry missed first. `lookups` must hold every `lookup` source.
pub fn resolve(df: DataFrame, contract: &Contract, lookups: &Lookups) -> Result<DataFrame> {
    let mut keep: Vec<Expr> = columns(&df).into_iter().map(|(_, e)| e).collect();
    for hidden in [RESOLVE_RULE, RESOLVE_REASON] {
        if df.schema().has_column_with_unqualified_name(hidden) {
            return Err(Error::Invalid(format!(
                "resolve: the input already has column {hidden}"
            )));
        }
    }
    let mut df = df
        .with_column(RESOLVE_RULE, null_text())?
        .with_column(RESOLVE_REASON, null_text())?;
    for (i, r) in contract.resolve.iter().enumerate() {
        let lookup = lookups.get(&r.lookup).ok_or_else(|| {
            Error::Invalid(format!(
                "{}: resolve \"{}\" needs the current rows of \"{}\"; lookups given: {}",
                contract.path.display(),
                r.name,
                r.lookup,
                if lookups.is_empty() {
                    "(none)".to_string()
                } else {
                    lookups.keys().cloned().collect::<Vec<_>>().join(", ")
                }
            ))
        })?;
        if df.schema().has_column_with_unqualified_name(&r.alias) {
            return Err(Error::Invalid(format!(
                "{}: resolve \"{}\" adds column \"{}\", which the input already has",
                contract.path.display(),
                r.name,
                r.alias
            )));
        }
        let from = field_of(contract, &r.from)?;
        let key = field_of(&lookup.contract, &r.key)?;
        field_of(&lookup.contract, &r.value)?;
        let (lk, rk, rn, rv) = (
            format!("__ingot_resolve_{i}_from"),
            format!("__ingot_resolve_{i}_key"),
            format!("__ingot_resolve_{i}_rows"),
            format!("__ingot_resolve_{i}_value"),
        );
        // One row per normalized key: the join can never duplicate a record.
        let right = lookup
            .rows
            .clone()
            .select(vec![normalized(c(&r.key), key).alias(&rk), c(&r.value).alias(&rv)])?
            .filter(c(&rk).is_not_null())?
            .aggregate(vec![c(&rk)], vec![count(lit(1)).alias(&rn), min(c(&rv)).alias(&rv)])?;
        df = df
            .with_column(&lk, normalized(c(&r.from), from))?
            .join_on(right, JoinType::Left, [c(&lk).eq(c(&rk))])?;

        let found = c(&rn).eq(lit(1i64));
        let value = when(found.clone(), c(&rv)).end()?;
        let mut projection = keep.clone();
        projection.push(value.alias(&r.alias));
        match r.on_missing {
            OnMissing::Null => {
                projection.push(c(RESOLVE_RULE));
                projection.push(c(RESOLVE_REASON));
            }
            OnMissing::Reject => {
                let from_text = cast(c(&r.from), DataType::Utf8);
                let reason = when(
                    c(&r.from).is_null(),
                    lit(format!("{} is null: nothing to look up in {}", r.from, r.lookup)),
                )
                .when(
                    c(&rn).is_null(),
                    concat(vec![
                        lit(format!("no {} row has {} \"", r.lookup, r.key)),
                        from_text.clone(),
                        lit("\""),
                    ]),
                )
                .when(
                    c(&rn).gt(lit(1i64)),
                    concat(vec![
                        cast(c(&rn), DataType::Utf8),
                        lit(format!(" {} rows have {} \"", r.lookup, r.key)),
                        from_text,
                        lit("\"; resolve needs exactly one"),
                    ]),
                )
                .end()?;
                let rule = when(found.is_not_true(), lit(format!("resolve:{}", r.name))).end()?;
                let earlier = c(RESOLVE_RULE).is_not_null();
                projection.push(
                    when(earlier.clone(), c(RESOLVE_RULE))
                        .otherwise(rule)?
                        .alias(RESOLVE_RULE),
                );
                projection.push(
                    when(earlier, c(RESOLVE_REASON))
                        .otherwise(reason)?
                        .alias(RESOLVE_REASON),
                );
            }
        }
        df = df.select(projection)?;
        keep.push(c(&r.alias));
    }
    Ok(df)
}

/// The rows of a resolve rejection or a validation in the shape of [`FAILURE_COLUMNS`].
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
    cols.iter()
        .filter(|(n, _)| !meta.contains(n) && n != RESOLVE_RULE && n != RESOLVE_REASON)
        .cloned()
        .collect()
}

/// Resolve, steps and validations of `rules` over `input` (the source's `_current` rows);
/// `lookups` holds the current rows of every source the contract's `resolve` reads.
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
    let filtered = filtered_rows(ok, rules)?;
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
    /// The resolve rejections in the shape of [`FAILURE_COLUMNS`] plus `ingestion_run_id`, when
    /// the contract has an `on_missing: reject` resolve (a second read of the input).
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
    let filtered = if rules.steps.iter().any(|s| matches!(s, Step::Filter(_))) {
        Some(filtered_rows(ok, rules)?.select(vec![c(FINGERPRINT), c(LINEAGE_COLUMNS[2])])?)
    } else {
        None
    };

    let (rule, reason) = if rules.validate.is_empty() {
        (null_text(), null_text())
    } else {
        let first = &rules.validate[0];
        let mut rule = when(first.check.expr.clone().is_not_true(), lit(first.name.as_str()));
        for v in &rules.validate[1..] {
            rule = rule.when(v.check.expr.clone().is_not_true(), lit(v.name.as_str()));
        }
        let mut reason = case(c(SPLIT_RULE));
        for v in &rules.validate {
            reason = reason.when(lit(v.name.as_str()), lit(v.reason.as_str()));
        }
        (rule.end()?, reason.end()?)
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
    Ok(Split {
        rows: checked.select(out)?,
        silver_width,
        resolve_rejected,
        filtered,
    })
}

/// The rows each `filter` step removes, planned over the steps before it.
fn filtered_rows(ok: DataFrame, rules: &RuleSet) -> Result<DataFrame> {
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
                c(LINEAGE_COLUMNS[2]),
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
            c(LINEAGE_COLUMNS[2]),
        ])?),
    }
}

/// An aggregate function over a window.
fn window_aggregate(udaf: Arc<AggregateUDF>, arg: Expr) -> Expr {
    Expr::from(WindowFunction::new(udaf, vec![arg]))
}

/// `factor` as the exact decimal it was written as: `(digits, scale)`, e.g. 2.5 -> (25, 1).
/// `None` when it does not fit comfortably in a Decimal128 computation.
fn decimal_factor(factor: f64) -> Option<(i128, u32)> {
    // Display of f64 is the shortest text that reads back as the same float, never an exponent.
    let text = format!("{factor}");
    let (int, frac) = text.split_once('.').unwrap_or((&text, ""));
    let digits = format!("{int}{frac}");
    if !digits.bytes().all(|b| b.is_ascii_digit()) || digits.trim_start_matches('0').len() > 30 || frac.len() > 30 {
        return None;
    }
    Some((digits.parse().ok()?, u32::try_from(frac.len()).ok()?))
}

fn decimal_lit(v: i128, scale: i8) -> Expr {
    lit(ScalarValue::Decimal128(Some(v), 38, scale))
}

/// `lhs > rhs` of `v × n > factor × s`, and `s > 0`, for the type of the spike column.
fn spike_condition(value: Expr, ty: &DataType, n: Expr, sum: Expr, factor: f64) -> (Expr, Expr) {
    let scale = match ty {
        DataType::Decimal32(_, s) | DataType::Decimal64(_, s) | DataType::Decimal128(_, s) if *s >= 0 => Some(*s),
        t if t.is_integer() => Some(0),
        _ => None,
    };
    if let (Some(scale), Some((digits, frac))) = (scale, decimal_factor(factor)) {
        let lhs = cast(value, DataType::Decimal128(38, scale))
            * cast(n, DataType::Decimal128(38, 0))
            * decimal_lit(10i128.pow(frac), 0);
        let rhs = decimal_lit(digits, 0) * sum.clone();
        return (lhs.gt(rhs), sum.gt(decimal_lit(0, scale)));
    }
    let lhs = cast(value, DataType::Float64) * cast(n, DataType::Float64);
    let rhs = lit(factor) * sum.clone();
    (lhs.gt(rhs), sum.gt(lit(0f64)))
}

/// The value a spike sums: the column in the type [`spike_condition`] compares in.
fn spike_summand(value: Expr, ty: &DataType, factor: f64) -> Expr {
    match ty {
        DataType::Decimal32(_, s) | DataType::Decimal64(_, s) | DataType::Decimal128(_, s)
            if *s >= 0 && decimal_factor(factor).is_some() =>
        {
            cast(value, DataType::Decimal128(38, *s))
        }
        t if t.is_integer() && decimal_factor(factor).is_some() => cast(value, DataType::Decimal128(38, 0)),
        _ => cast(value, DataType::Float64),
    }
}

/// Units of `order` cast to Int64 per day.
fn units_per_day(ty: &DataType) -> Option<i64> {
    Some(match ty {
        DataType::Date32 => 1,
        DataType::Date64 => 86_400_000,
        DataType::Timestamp(TimeUnit::Second, _) => 86_400,
        DataType::Timestamp(TimeUnit::Millisecond, _) => 86_400_000,
        DataType::Timestamp(TimeUnit::Microsecond, _) => 86_400_000_000,
        DataType::Timestamp(TimeUnit::Nanosecond, _) => 86_400_000_000_000,
        _ => return None,
    })
}

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
    let names = |names: &[&str]| {
        let values: Vec<ScalarValue> = names.iter().map(|n| ScalarValue::Utf8(Some(n.to_string()))).collect();
        lit(ScalarValue::List(ScalarValue::new_list_nullable(
            &values,
            &DataType::Utf8,
        )))
    };
    let mut arms = Vec::new();
    for (a, f) in rules.anomalies.iter().zip(&fires) {
        arms.push(when(f.clone(), names(&[a.name.as_str()])).otherwise(names(&[]))?);
    }
    let flags = match arms.len() {
        0 => names(&[]),
        1 => arms.remove(0),
        _ => array_concat(arms),
    };
    let is_anomaly = fires.into_iter().reduce(Expr::or).unwrap_or(lit(false));
    let mut out: Vec<Expr> = all[..position].iter().filter(keep).map(|(_, e)| e.clone()).collect();
    out.push(flags.alias(ANOMALY_FLAGS));
    out.push(is_anomaly.alias(IS_ANOMALY));
    out.extend(all[position..].iter().filter(keep).map(|(_, e)| e.clone()));
    Ok(out)
}

/// Add `anomaly_flags` and `is_anomaly` to `df` (replacing them if present), computed over all
/// of `df` with the anomalies of `rules`; see the module documentation for the semantics.
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

/// The integer type a date/timestamp casts to without changing its number.
fn ty_as_int(ty: &DataType) -> DataType {
    match ty {
        DataType::Date32 => DataType::Int32,
        _ => DataType::Int64,
    }
}

/// The logical plans of a build of `rules` (transform then flag), as indented text: silver's
/// rows, then the rejected rows.
pub fn explain(
    ctx: &SessionContext,
    rules: &RuleSet,
    contract: &Contract,
    input: DataFrame,
    lookups: &Lookups,
) -> Result<String> {
    let t = transform(ctx, rules, contract, input, lookups)?;
    let silver = flag(t.passed, rules)?;
    Ok(format!(
        "-- silver.{} (rules v{}): the rows that pass, with their anomaly flags\n{}\n\n-- rows rejected to audit.row_failure_log\n{}\n",
        rules.table,
        rules.version,
        silver.logical_plan().display_indent(),
        t.rejected.logical_plan().display_indent()
    ))
}
