//! The columns that exist at one step of a rules file, and checking an expression against them.
//!
//! A column whose type could not be worked out (its `set` expression had a problem) is kept with
//! an unknown type, so later steps do not report it as missing; expressions that read it are
//! parsed (so unknown columns and syntax errors are still found) but not type-checked.

use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::common::{DFSchema, DFSchemaRef, DataFusionError, SchemaError};
use datafusion::logical_expr::{Expr, ExprSchemable, Volatility};
use datafusion::prelude::SessionContext;

/// A column at one step: its name and type (`None` = unknown after an earlier problem).
#[derive(Debug, Clone)]
pub(super) struct Col {
    pub name: String,
    pub ty: Option<DataType>,
}

#[derive(Debug, Clone, Default)]
pub(super) struct Columns {
    pub cols: Vec<Col>,
}

impl Columns {
    pub fn find(&self, name: &str) -> Option<usize> {
        self.cols.iter().position(|c| c.name == name)
    }

    pub fn get(&self, name: &str) -> Option<&Col> {
        self.cols.iter().find(|c| c.name == name)
    }

    /// `a, b, c`: for messages.
    pub fn list(&self) -> String {
        self.cols.iter().map(|c| c.name.as_str()).collect::<Vec<_>>().join(", ")
    }

    /// Replace the column in place, or add it at the end.
    pub fn set(&mut self, name: &str, ty: Option<DataType>) {
        match self.find(name) {
            Some(i) => self.cols[i].ty = ty,
            None => self.cols.push(Col {
                name: name.to_string(),
                ty,
            }),
        }
    }

    pub fn remove(&mut self, name: &str) {
        self.cols.retain(|c| c.name != name);
    }

    /// The schema expressions are parsed against (unknown types are `Null`).
    pub fn df_schema(&self) -> DFSchemaRef {
        let fields: Vec<Field> = self
            .cols
            .iter()
            .map(|c| Field::new(&c.name, c.ty.clone().unwrap_or(DataType::Null), true))
            .collect();
        // Names are unique by construction; fall back to an empty schema rather than panic.
        Arc::new(DFSchema::try_from(Schema::new(fields)).unwrap_or_else(|_| DFSchema::empty()))
    }

    fn has_unknown(&self, expr: &Expr) -> bool {
        expr.column_refs()
            .iter()
            .any(|c| self.get(&c.name).is_some_and(|col| col.ty.is_none()))
    }
}

/// The contract's name of a type where there is one (`string`, `decimal(12,2)`), else Arrow's.
pub fn type_name(ty: &DataType) -> String {
    match ty {
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => "string".into(),
        DataType::Int32 => "int32".into(),
        DataType::Int64 => "int64".into(),
        DataType::Float64 => "float64".into(),
        DataType::Decimal128(p, s) => format!("decimal({p},{s})"),
        DataType::Boolean => "boolean".into(),
        DataType::Date32 => "date".into(),
        DataType::Timestamp(..) => "timestamp".into(),
        DataType::Null => "null".into(),
        other => other.to_string(),
    }
}

pub(super) fn is_string(ty: &DataType) -> bool {
    matches!(ty, DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View)
}

/// Why an expression was refused; the reader turns it into a located message.
pub(super) enum ExprProblem {
    UnknownColumn(String),
    Invalid(String),
}

/// Parse `sql` against `cols` with DataFusion's expression parser and work out its type
/// (`None` when it reads a column of unknown type).
pub(super) fn check_expr(
    ctx: &SessionContext,
    sql: &str,
    cols: &Columns,
) -> Result<(Expr, Option<DataType>), ExprProblem> {
    let schema = cols.df_schema();
    let expr = ctx.parse_sql_expr(sql, &schema).map_err(|e| match unknown_field(&e) {
        Some(name) => ExprProblem::UnknownColumn(name),
        None => ExprProblem::Invalid(clean_message(&e)),
    })?;
    let stateful = expr
        .exists(|e| Ok(matches!(e, Expr::AggregateFunction(_) | Expr::WindowFunction(_))))
        .unwrap_or(false);
    if stateful {
        return Err(ExprProblem::Invalid(
            "aggregate and window functions are not allowed: rules see one row at a time \
             (for comparisons across rows use a spike or first_seen anomaly)"
                .into(),
        ));
    }
    if expr.is_volatile() {
        return Err(ExprProblem::Invalid(
            "volatile functions (such as random() or uuid()) are not allowed: a rebuild must give the same rows".into(),
        ));
    }
    if let Some(name) = reads_the_clock(&expr) {
        return Err(ExprProblem::Invalid(format!(
            "{name}() reads the clock: a rebuild must give the same rows whenever it runs (and an \
             incremental build the same as a full one); compare with a date of the data or a literal"
        )));
    }
    if let Expr::Alias(a) = &expr {
        return Err(ExprProblem::Invalid(format!(
            "an alias (AS {}) is not allowed here; the column name comes from the rule",
            a.name
        )));
    }
    if cols.has_unknown(&expr) {
        return Ok((expr, None));
    }
    match expr.get_type(schema.as_ref()) {
        Ok(ty) => Ok((expr, Some(ty))),
        Err(e) => Err(ExprProblem::Invalid(clean_message(&e))),
    }
}

/// The first function of `expr` whose result depends on when it runs (DataFusion's `Stable`
/// volatility: `now`, `current_date`, `current_time`); `Volatile` ones are refused apart.
fn reads_the_clock(expr: &Expr) -> Option<String> {
    let mut found = None;
    let _ = expr.apply(|e| {
        if let Expr::ScalarFunction(f) = e
            && f.func.signature().volatility == Volatility::Stable
        {
            found = Some(f.func.name().to_string());
            return Ok(TreeNodeRecursion::Stop);
        }
        Ok(TreeNodeRecursion::Continue)
    });
    found
}

/// The column name of a DataFusion "field not found" error, however it is wrapped.
fn unknown_field(e: &DataFusionError) -> Option<String> {
    match e {
        DataFusionError::SchemaError(inner, _) => match inner.as_ref() {
            SchemaError::FieldNotFound { field, .. } => Some(field.name.clone()),
            _ => None,
        },
        DataFusionError::Diagnostic(_, inner) | DataFusionError::Context(_, inner) => unknown_field(inner),
        _ => None,
    }
}

/// DataFusion's message without backtraces, wrappers and the parser's debug formatting.
fn clean_message(e: &DataFusionError) -> String {
    match e {
        DataFusionError::Diagnostic(_, inner) | DataFusionError::Context(_, inner) => clean_message(inner),
        DataFusionError::SQL(p, _) => match p.as_ref() {
            datafusion::sql::sqlparser::parser::ParserError::ParserError(m)
            | datafusion::sql::sqlparser::parser::ParserError::TokenizerError(m) => {
                format!("SQL syntax error: {m}")
            }
            other => format!("SQL syntax error: {other}"),
        },
        DataFusionError::Plan(m) => m.replace('\n', " "),
        other => other.strip_backtrace().replace('\n', " "),
    }
}
