//! The `steps` of a [`RuleSet`] as DataFrame operations (no SQL text, no execution).

use datafusion::common::{Column, DFSchemaRef};
use datafusion::dataframe::DataFrame;
use datafusion::logical_expr::{Case, Expr, ExprSchemable, lit};

use crate::error::{Error, Result};
use crate::spec::rules::{RuleSet, Step};

/// Apply the steps of `rules` to `df`, which must have the columns of `rules.input_schema`
/// (`bronze.<source>_current` plus the resolve values). Each step becomes one projection or
/// filter; the plan is lazy.
pub fn apply_steps(df: DataFrame, rules: &RuleSet) -> Result<DataFrame> {
    apply_step_list(df, &rules.input_schema, &rules.steps, &rules.path)
}

/// Apply `steps` (of the file `path`) to `df`, which must have the columns of `input_schema`.
pub fn apply_step_list(
    df: DataFrame,
    input_schema: &DFSchemaRef,
    steps: &[Step],
    path: &std::path::Path,
) -> Result<DataFrame> {
    let missing: Vec<&str> = input_schema
        .fields()
        .iter()
        .map(|f| f.name().as_str())
        .filter(|n| !df.schema().has_column_with_unqualified_name(n))
        .collect();
    if !missing.is_empty() {
        return Err(Error::Invalid(format!(
            "{}: the input lacks column{} {}",
            path.display(),
            if missing.len() == 1 { "" } else { "s" },
            missing.join(", ")
        )));
    }
    let mut df = df;
    for step in steps {
        df = apply_step(df, step)?;
    }
    Ok(df)
}

fn column(name: &str) -> Expr {
    Expr::Column(Column::new_unqualified(name))
}

/// Every column of `df` in order, each through `f(name, column_expr)`, dropping `None`s.
fn project(df: DataFrame, f: impl Fn(&str, Expr) -> Result<Option<Expr>>) -> Result<DataFrame> {
    let mut exprs = Vec::new();
    for (qualifier, field) in df.schema().iter() {
        let c = Expr::Column(Column::from((qualifier, field)));
        if let Some(e) = f(field.name(), c)? {
            exprs.push(e);
        }
    }
    Ok(df.select(exprs)?)
}

fn apply_step(df: DataFrame, step: &Step) -> Result<DataFrame> {
    Ok(match step {
        Step::Set { column, expr } => df.with_column(&column.name, expr.expr.clone())?,
        Step::Map {
            column: c,
            values,
            default,
        } => {
            let target = column(&c.name);
            let mut arms: Vec<(Box<Expr>, Box<Expr>)> = Vec::new();
            if default.is_some() {
                // A null has no value to map: it stays null even when a default is given.
                arms.push((Box::new(target.clone().is_null()), Box::new(target.clone())));
            }
            for (from, to) in values {
                arms.push((
                    Box::new(target.clone().eq(lit(from.as_str()))),
                    Box::new(lit(to.as_str())),
                ));
            }
            let otherwise = match default {
                Some(d) => lit(d.as_str()),
                None => target.clone(),
            };
            let mapped = if arms.is_empty() {
                otherwise
            } else {
                Expr::Case(Case::new(None, arms, Some(Box::new(otherwise))))
            };
            df.with_column(&c.name, mapped)?
        }
        Step::Rename(pairs) => project(df, |name, c| {
            Ok(Some(match pairs.iter().find(|(from, _)| from.name == name) {
                Some((_, to)) => c.alias(&to.name),
                None => c,
            }))
        })?,
        Step::Cast(casts) => {
            let schema = df.schema().clone();
            project(df, |name, c| {
                Ok(Some(match casts.iter().find(|(col, _)| col.name == name) {
                    Some((_, ty)) => c.cast_to(&ty.arrow_type(), &schema)?.alias(name),
                    None => c,
                }))
            })?
        }
        Step::Drop(columns) => project(df, |name, c| Ok((!columns.iter().any(|d| d.name == name)).then_some(c)))?,
        Step::Filter(predicate) => df.filter(predicate.expr.clone())?,
    })
}
