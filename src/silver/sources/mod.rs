//! A silver table fed by several sources (docs/guide.md#several-sources): each source's
//! records become candidates in the table's columns ([`candidates`]: its key, `resolve` and own
//! steps); a record with one candidate is that candidate ([`single_rows`]); one with several is
//! decided field by field by survivorship, its conflicts logged ([`survive`], [`conflicts`]).
//! [`scan`] keys the records across sources; the build plans and writes as for one source.
//!
//! Invariant: the same bronze state, rules, decisions and previous held winners give the same
//! rows and conflicts whatever order the runs were committed in: candidates are ordered by rank,
//! source name and `row_hash`, never by a clock.

pub use crate::table::{conflicts, decisions};
pub mod meet;
pub mod scan;
pub mod shared;
pub mod stream;
pub mod survive;
pub mod tee;

use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::common::ScalarValue;
use datafusion::dataframe::DataFrame;
use datafusion::functions::string::expr_fn::concat;
use datafusion::functions_nested::expr_fn::make_array;
use datafusion::logical_expr::{Expr, ExprSchemable, lit, when};
use datafusion::prelude::SessionContext;

use crate::error::{Error, Result};
use crate::silver::compile::{Lookups, RESOLVE_REASON, RESOLVE_RULE, current_table, resolve};
use crate::spec::columns::meta_fields;
use crate::spec::contract::{Contract, ContractSet};
use crate::spec::rules::RuleSet;
use crate::spec::rules::sources::{
    CONFLICT_FIELDS, CONTRIBUTING_SOURCES, FIELD_SOURCES, Rule, SourceEntry, Sources, merged_fields,
};
use crate::table::silver::c;

/// Candidate column: the source's name.
pub const SOURCE: &str = "__ingot_source";
/// Candidate column: the source's rank (Int32).
pub const RANK: &str = "__ingot_rank";
/// Merged column: the record's version in the build's state (see [`scan`]).
pub const STATE_RUN: &str = "__ingot_state_run";
/// Merged column: why the record is rejected for a conflict (`on_conflict: reject | fail`),
/// null when it is not.
pub const CONFLICT: &str = crate::spec::rules::sources::CONFLICT_REASON;
/// Merged column: the rule that rejects the record before its steps (a candidate's `resolve`
/// missed under `on_missing: reject`), null when none does.
pub const REJECT_RULE: &str = "__ingot_reject_rule";
/// Merged column: why [`REJECT_RULE`] rejects it.
pub const REJECT_REASON: &str = "__ingot_reject_reason";
/// Candidate columns: the candidate's `resolve` rejection (rule, and reason naming the source).
pub const CAND_RULE: &str = "__ingot_cand_rule";
pub const CAND_REASON: &str = "__ingot_cand_reason";
/// The columns ingot adds to the merged rows that silver does not keep.
pub const HIDDEN: [&str; 4] = [STATE_RUN, CONFLICT, REJECT_RULE, REJECT_REASON];

/// What one source of the table reads.
pub struct SourceInputs {
    pub source: String,
    pub namespace: Option<String>,
    /// Its `shared_key` (with a namespace).
    pub shared: Option<shared::SharedKey>,
    pub contract: Arc<Contract>,
    /// `bronze.<source>_current`.
    pub current: DataFrame,
    pub lookups: Lookups,
}

/// The sources of `rules` (which must have several).
pub fn sources_of(rules: &RuleSet) -> Result<&Sources> {
    rules
        .sources
        .as_deref()
        .ok_or_else(|| Error::Internal(format!("{}: the rules read one source", rules.path.display())))
}

/// Each source's contract, current rows and lookups.
pub async fn read_source_inputs(
    ctx: &SessionContext,
    contracts: &ContractSet,
    rules: &RuleSet,
) -> Result<Vec<SourceInputs>> {
    let src = sources_of(rules)?;
    let target = match src.entries.iter().find(|e| e.key_namespace.is_none()) {
        Some(e) => Some(crate::silver::compile::contract_of(contracts, rules, &e.source)?),
        None => None,
    };
    let mut out = Vec::with_capacity(src.entries.len());
    for e in &src.entries {
        let contract = crate::silver::compile::contract_of(contracts, rules, &e.source)?;
        let lookups = crate::silver::compile::lookups_of(ctx, contracts, rules, &contract).await?;
        out.push(SourceInputs {
            source: e.source.clone(),
            namespace: e.key_namespace.clone(),
            shared: shared::shared_key_of(e, &contract, &lookups, target.as_deref())?,
            current: ctx.table(current_table(&e.source)).await?,
            contract,
            lookups,
        });
    }
    Ok(out)
}

/// The schema of the merged rows: [`merged_fields`] then [`HIDDEN`].
pub fn merged_schema(src: &Sources) -> SchemaRef {
    let mut fields = merged_fields(&src.columns);
    fields.push(Field::new(STATE_RUN, DataType::Utf8, true));
    fields.push(Field::new(CONFLICT, DataType::Utf8, true));
    fields.push(Field::new(REJECT_RULE, DataType::Utf8, true));
    fields.push(Field::new(REJECT_REASON, DataType::Utf8, true));
    Arc::new(Schema::new(fields))
}

/// The schema of the candidates: the survivorship columns, the bronze bookkeeping columns, then
/// [`SOURCE`] and [`RANK`].
pub fn candidate_schema(src: &Sources) -> SchemaRef {
    let mut fields: Vec<Field> = src
        .columns
        .iter()
        .map(|(n, t)| Field::new(n, t.clone(), true))
        .collect();
    fields.extend(meta_fields());
    fields.push(Field::new(SOURCE, DataType::Utf8, true));
    fields.push(Field::new(RANK, DataType::Int32, true));
    fields.push(Field::new(CAND_RULE, DataType::Utf8, true));
    fields.push(Field::new(CAND_REASON, DataType::Utf8, true));
    Arc::new(Schema::new(fields))
}

/// An empty `field_sources` (empty, not null: one way to say "none").
fn no_field_sources() -> Result<ScalarValue> {
    use datafusion::arrow::array::{ListBuilder, StructBuilder};
    let fields = crate::spec::rules::sources::field_source_fields();
    let mut b = ListBuilder::new(StructBuilder::from_fields(fields.clone(), 0)).with_field(Arc::new(Field::new(
        "item",
        DataType::Struct(fields),
        true,
    )));
    b.append(true);
    Ok(ScalarValue::try_from_array(&b.finish(), 0)?)
}

fn typed_null(ty: &DataType) -> Result<Expr> {
    Ok(lit(ScalarValue::try_from(ty)?))
}

impl SourceInputs {
    /// `rows` (this source's bronze rows) keyed as the table keys them ([`shared::keyed`]).
    pub fn keyed(&self, rows: DataFrame) -> Result<DataFrame> {
        shared::keyed(rows, self.namespace.as_deref(), self.shared.as_ref())
    }
}

/// The candidates of one source: `rows` (its bronze rows, already [`SourceInputs::keyed`]), with
/// its contract's `resolve` values and its own steps, in [`candidate_schema`]'s columns (a
/// column the source lacks is null).
pub fn candidates(rows: DataFrame, src: &Sources, entry: &SourceEntry, input: &SourceInputs) -> Result<DataFrame> {
    let resolved = resolve(rows, &input.contract, &input.lookups)?;
    let stepped =
        crate::silver::apply::apply_step_list(resolved, &entry.input_schema, &entry.steps, &input.contract.path)?;
    let schema = stepped.schema().clone();
    let mut cols = Vec::with_capacity(src.columns.len() + 12);
    for (name, ty) in &src.columns {
        let e = if schema.has_column_with_unqualified_name(name) {
            let e = c(name);
            if e.get_type(&schema)? == *ty {
                e
            } else {
                e.cast_to(ty, &schema)?
            }
        } else {
            typed_null(ty)?
        };
        cols.push(e.alias(name));
    }
    for f in meta_fields() {
        cols.push(c(f.name()));
    }
    cols.push(lit(entry.source.as_str()).alias(SOURCE));
    cols.push(lit(i32::try_from(entry.rank).unwrap_or(i32::MAX)).alias(RANK));
    // a candidate whose lookup missed rejects its record (its reason names the source)
    cols.push(c(RESOLVE_RULE).alias(CAND_RULE));
    // (made only where a lookup missed: `concat` of a null is the prefix alone, not null)
    let reason = concat(vec![lit(format!("{}: ", entry.source)), c(RESOLVE_REASON)]);
    cols.push(
        when(c(RESOLVE_RULE).is_not_null(), reason)
            .otherwise(typed_null(&DataType::Utf8)?)?
            .alias(CAND_REASON),
    );
    Ok(stepped.select(cols)?)
}

/// The merged rows of records with one candidate ([`merged_schema`]): its values (null for a
/// field only another source may give), itself as the contributing source, no conflict.
/// `source`: every candidate is that source's (its name becomes a constant, not a per-row list).
pub fn single_rows(cands: DataFrame, src: &Sources, source: Option<&str>) -> Result<DataFrame> {
    let schema = merged_schema(src);
    let mut cols = Vec::with_capacity(schema.fields().len());
    for (name, ty) in &src.columns {
        let unit = src.group_of(name).map_or(name.as_str(), |g| g.name.as_str());
        let e = match (src.rule_of(unit), source) {
            (Rule::Only(s), Some(from)) if s != from => typed_null(ty)?,
            (Rule::Only(_), Some(_)) => c(name),
            (Rule::Only(s), None) => when(c(SOURCE).eq(lit(s.as_str())), c(name)).otherwise(typed_null(ty)?)?,
            _ => c(name),
        };
        cols.push(e.alias(name));
    }
    for f in schema.fields().iter() {
        let name = f.name().as_str();
        if src.columns.iter().any(|(n, _)| n == name) {
            continue;
        }
        let e = match (name, source) {
            (CONTRIBUTING_SOURCES, Some(from)) => crate::engine::lists::repeat(
                ScalarValue::List(ScalarValue::new_list_nullable(
                    &[ScalarValue::from(from)],
                    &DataType::Utf8,
                )),
                // a column, not SOURCE: that is a literal, and the optimizer would fold the call
                c(crate::table::silver::FP),
            ),
            (CONTRIBUTING_SOURCES, None) => make_array(vec![c(SOURCE)]),
            (FIELD_SOURCES, _) => crate::engine::lists::repeat(no_field_sources()?, c(crate::table::silver::FP)),
            (CONFLICT_FIELDS | CONFLICT, _) => typed_null(f.data_type())?,
            (STATE_RUN, _) => c(crate::table::silver::RUN_ID),
            (REJECT_RULE, _) => c(CAND_RULE),
            (REJECT_REASON, _) => c(CAND_REASON),
            _ => c(name),
        };
        cols.push(e.alias(name));
    }
    let out = cands.select(cols)?;
    // the list's item field as the schema has it (make_array names it "item", nullable)
    let df_schema = out.schema().clone();
    let fixed: Vec<Expr> = schema
        .fields()
        .iter()
        .map(|f| {
            let e = c(f.name());
            match e.get_type(&df_schema) {
                Ok(t) if &t == f.data_type() => Ok(e),
                _ => Ok(e.cast_to(f.data_type(), &df_schema)?.alias(f.name())),
            }
        })
        .collect::<Result<_>>()?;
    Ok(out.select(fixed)?)
}

/// The contract the top-level steps run under: the first source's, without `resolve` (each
/// source resolved its own candidates).
pub fn merged_contract(input: &SourceInputs) -> Arc<Contract> {
    Arc::new(Contract {
        resolve: Vec::new(),
        ..input.contract.as_ref().clone()
    })
}

/// Every current record as if it had one candidate (no survivorship): the merged rows' shape,
/// for planning a table that has no build and for `ingot explain`.
pub fn planned_rows(src: &Sources, inputs: &[SourceInputs]) -> Result<DataFrame> {
    let mut all: Option<DataFrame> = None;
    for (entry, input) in src.entries.iter().zip(inputs) {
        let cands = candidates(input.keyed(input.current.clone())?, src, entry, input)?;
        all = Some(match all {
            None => cands,
            Some(df) => df.union(cands)?,
        });
    }
    let all = all.ok_or_else(|| Error::Internal("a table with sources lists none".into()))?;
    single_rows(all, src, None)
}
