//! The contract's `resolve` entries as left joins on normalized keys (see [`resolve`]).

use std::sync::Arc;

use datafusion::arrow::datatypes::DataType;
use datafusion::dataframe::DataFrame;
use datafusion::functions::string::expr_fn::concat;
use datafusion::functions_aggregate::expr_fn::{count, min};
use datafusion::logical_expr::{Expr, JoinType, ScalarUDF, cast, lit, when};

use super::{Lookups, RESOLVE_REASON, RESOLVE_RULE, c, columns, null_text};
use crate::error::{Error, Result};
use crate::spec::contract::{Contract, Field, OnMissing};

/// `e` after the field's `normalize` steps (via the `normalize_text` UDF); unchanged when the
/// field is not a string or has no steps.
pub fn normalized(e: Expr, field: &Field) -> Expr {
    if field.normalize.is_empty() || field.ty.arrow_type() != DataType::Utf8 {
        return e;
    }
    let steps: Vec<&str> = field.normalize.iter().map(|s| s.name()).collect();
    let udf = Arc::new(ScalarUDF::from(crate::hash::udf::NormalizeText::new()));
    udf.call(vec![e, lit(steps.join(","))])
}

pub(crate) fn field_of<'a>(contract: &'a Contract, name: &str) -> Result<&'a Field> {
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
///
/// A `resolve` entry left-joins the lookup source's current rows on `normalize(from) =
/// normalize(key)`, each side with the `normalize` steps of its own contract field (string
/// fields only; other types compare as they are). The lookup side is first grouped by the
/// normalized key, so a record can never be duplicated by the join: a key held by exactly one
/// lookup row gives that row's `value`; a null `from`, a key no lookup row has, and a key more
/// than one lookup row has (ambiguous: ingot will not pick one) are all "missing". Missing under
/// `on_missing: null` is a null value; under `reject` the record is rejected with rule
/// `resolve:<name>` and a reason saying which of the three it was.
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
