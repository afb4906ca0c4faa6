//! A table fed by several sources (`sources:` instead of `source:`, docs/guide.md#several-sources):
//! each source's own steps map its columns to the table's names, then survivorship picks one
//! value per field and key from the candidates, and conflicts are surfaced instead of being
//! overwritten. The types here are what [`super::read`] validated; the build is
//! [`crate::silver::sources`].
//!
//! Invariant: every entry builds the same fingerprint as the others of its key namespace (same
//! natural-key arity, types, `normalize` steps and key version), so one logical record has one
//! key whichever source delivered it.

use std::collections::BTreeMap;

use datafusion::arrow::datatypes::DataType;
use datafusion::common::DFSchemaRef;

use super::Step;
use crate::spec::yaml::Pos;

/// Silver column (List<Utf8>): the sources with a candidate for the row, in precedence order.
pub const CONTRIBUTING_SOURCES: &str = "contributing_sources";
/// Silver column (List<Struct<field, source>>): field (or group) -> source, for every field whose value came
/// from another source than the row's first contributing source; empty (never null) when none.
pub const FIELD_SOURCES: &str = "field_sources";
/// Silver column (List<Utf8>): the fields (or groups) of the row in an open conflict; null when
/// none.
pub const CONFLICT_FIELDS: &str = "conflict_fields";
/// The provenance columns a table with several sources adds after the survivorship columns.
pub const PROVENANCE_COLUMNS: [&str; 3] = [CONTRIBUTING_SOURCES, FIELD_SOURCES, CONFLICT_FIELDS];
/// The anomaly flag of a row with an open conflict.
pub const SOURCE_CONFLICT_FLAG: &str = "source_conflict";

/// How one field's (or group's) value is chosen among the candidates that have one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rule {
    /// First non-null in precedence order (ties: `order_by` latest first, source name, row_hash).
    Precedence,
    /// The candidate with the latest value of this business column (ties: precedence, source
    /// name, row_hash). Never an ingest time.
    MostRecent(String),
    /// Only this source's value (null when it has no candidate).
    Only(String),
}

/// `survivorship:` of the rules file.
#[derive(Debug, Clone, PartialEq)]
pub struct Survivorship {
    /// `default:` (the rule of every field not named): precedence (default) or most_recent (by
    /// `order_by`).
    pub default: Rule,
    /// `order_by:`: the business column `most_recent` reads when it names none, and the second
    /// tie-break of `precedence`.
    pub order_by: Option<String>,
    /// `fields:` rules by field name (fields of groups are not here).
    pub fields: BTreeMap<String, Rule>,
    /// `groups:`: fields taken in lock-step from one candidate.
    pub groups: Vec<Group>,
}

impl Default for Survivorship {
    fn default() -> Self {
        Survivorship {
            default: Rule::Precedence,
            order_by: None,
            fields: BTreeMap::new(),
            groups: Vec::new(),
        }
    }
}

/// A lock-step group: every field of it comes from one candidate, the first (by `rule`) with a
/// non-null value in any of them.
#[derive(Debug, Clone, PartialEq)]
pub struct Group {
    pub name: String,
    pub fields: Vec<String>,
    pub rule: Rule,
    pub pos: Pos,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnConflict {
    /// The field keeps the source that won it in the previous build (for a key new to the
    /// table, the survivorship winner); the row is flagged.
    Hold,
    /// The survivorship winner is taken; the row is flagged.
    Flag,
    /// The record goes to the failure log (rule `source_conflict`), not to silver.
    Reject,
    /// The build fails and publishes nothing.
    Fail,
}

impl OnConflict {
    pub const NAMES: &'static [&'static str] = &["hold", "flag", "reject", "fail"];

    pub fn name(self) -> &'static str {
        match self {
            OnConflict::Hold => "hold",
            OnConflict::Flag => "flag",
            OnConflict::Reject => "reject",
            OnConflict::Fail => "fail",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SamePrecedence {
    /// Two candidates at the deciding rank with different values are a conflict.
    Conflict,
    /// Such a tie is broken (order column, source name, row_hash); no conflict.
    Break,
}

/// `conflicts:` of the rules file.
#[derive(Debug, Clone, PartialEq)]
pub struct Conflicts {
    /// Fields (or group names) whose differing non-null values across sources are a conflict
    /// even when precedence would decide.
    pub fields: Vec<String>,
    pub same_precedence: SamePrecedence,
    pub on_conflict: OnConflict,
    pub pos: Pos,
}

impl Default for Conflicts {
    fn default() -> Self {
        Conflicts {
            fields: Vec::new(),
            same_precedence: SamePrecedence::Conflict,
            on_conflict: OnConflict::Flag,
            pos: Pos::default(),
        }
    }
}

/// One entry of `sources:`.
#[derive(Debug, Clone)]
pub struct SourceEntry {
    /// The contract whose `_current` rows this entry reads.
    pub source: String,
    /// `rank:` (1 is first; default: the entry's position). Entries of one rank are peers.
    pub rank: u32,
    /// `key_namespace:`: the source's keys are its own; they only merge with entries of the same
    /// namespace (the silver fingerprint is `namespaced_fingerprint(namespace, fingerprint)`).
    pub key_namespace: Option<String>,
    /// `shared_key:` (with a `key_namespace`): one `resolve` entry of the contract per part of
    /// the shared key (that of the entries without a namespace). A record whose resolves all find
    /// a value is keyed as those sources key that value; the others keep their namespaced key.
    pub shared_key: Vec<String>,
    /// The entry's own steps (no `filter`): its columns to the table's names.
    pub steps: Vec<Step>,
    /// Columns its steps see first: `bronze.<source>_current` then the contract's resolve values.
    pub input_schema: DFSchemaRef,
    /// Columns after its steps.
    pub output_schema: DFSchemaRef,
    pub pos: Pos,
}

/// `sources:` and what goes with it.
#[derive(Debug, Clone)]
pub struct Sources {
    /// In precedence order (the file's order; `rank` may make neighbours peers).
    pub entries: Vec<SourceEntry>,
    /// The table's columns survivorship decides: the data columns of the entries' outputs (their
    /// bronze bookkeeping columns left out), in order of first appearance, each with the one
    /// type every entry that has it gives it.
    pub columns: Vec<(String, DataType)>,
    pub survivorship: Survivorship,
    pub conflicts: Conflicts,
    pub pos: Pos,
}

impl Sources {
    /// The rule deciding `field` (a column or a group name).
    pub fn rule_of(&self, field: &str) -> &Rule {
        if let Some(g) = self.survivorship.groups.iter().find(|g| g.name == field) {
            return &g.rule;
        }
        self.survivorship
            .fields
            .get(field)
            .unwrap_or(&self.survivorship.default)
    }

    /// The group `column` belongs to, if any.
    pub fn group_of(&self, column: &str) -> Option<&Group> {
        self.survivorship
            .groups
            .iter()
            .find(|g| g.fields.iter().any(|f| f == column))
    }

    /// The units survivorship decides, in column order: each column not in a group, and each
    /// group at its first column, as `(name, columns)`.
    pub fn units(&self) -> Vec<(String, Vec<String>)> {
        let mut out: Vec<(String, Vec<String>)> = Vec::new();
        for (name, _) in &self.columns {
            match self.group_of(name) {
                Some(g) if out.iter().any(|(n, _)| *n == g.name) => {}
                Some(g) => out.push((g.name.clone(), g.fields.clone())),
                None => out.push((name.clone(), vec![name.clone()])),
            }
        }
        out
    }

    pub fn entry(&self, source: &str) -> Option<&SourceEntry> {
        self.entries.iter().find(|e| e.source == source)
    }

    pub fn names(&self) -> Vec<&str> {
        self.entries.iter().map(|e| e.source.as_str()).collect()
    }
}

/// The members of an entry of [`FIELD_SOURCES`]: `field` and `source` (a list of structs, not
/// a map: DuckDB's Delta reader cannot read maps).
pub fn field_source_fields() -> datafusion::arrow::datatypes::Fields {
    use datafusion::arrow::datatypes::Field;
    datafusion::arrow::datatypes::Fields::from(vec![
        Field::new("field", DataType::Utf8, true),
        Field::new("source", DataType::Utf8, true),
    ])
}

/// The provenance columns' fields ([`PROVENANCE_COLUMNS`]), all nullable.
pub fn provenance_fields() -> Vec<datafusion::arrow::datatypes::Field> {
    use std::sync::Arc;

    use datafusion::arrow::datatypes::Field;
    let list = || DataType::List(Arc::new(Field::new("item", DataType::Utf8, true)));
    vec![
        Field::new(CONTRIBUTING_SOURCES, list(), true),
        Field::new(
            FIELD_SOURCES,
            DataType::List(Arc::new(Field::new(
                "item",
                DataType::Struct(field_source_fields()),
                true,
            ))),
            true,
        ),
        Field::new(CONFLICT_FIELDS, list(), true),
    ]
}

/// The columns the top-level steps of a table with several sources see first: the survivorship
/// columns, the provenance columns, then the bronze bookkeeping columns (those of the row's
/// first contributing source; `natural_key_fingerprint` is the table's key).
pub fn merged_fields(columns: &[(String, DataType)]) -> Vec<datafusion::arrow::datatypes::Field> {
    let mut fields: Vec<datafusion::arrow::datatypes::Field> = columns
        .iter()
        .map(|(n, t)| datafusion::arrow::datatypes::Field::new(n, t.clone(), true))
        .collect();
    fields.extend(provenance_fields());
    fields.extend(crate::spec::columns::meta_fields());
    fields
}

/// Merged column ingot adds inside a build (not kept in silver): why the record is rejected for
/// a conflict, null when it is not.
pub const CONFLICT_REASON: &str = "__ingot_conflict";

/// The rules a table with several sources has besides its file's: the anomaly
/// [`SOURCE_CONFLICT_FLAG`] (first, on [`CONFLICT_FIELDS`]) and, under `on_conflict: reject |
/// fail`, the validation of that name (first) that rejects or fails a record in conflict.
pub fn add_conflict_rules(rules: &mut super::RuleSet) {
    use datafusion::common::Column;
    use datafusion::logical_expr::Expr;

    let Some(src) = rules.sources.clone() else {
        return;
    };
    let col = |n: &str| Expr::Column(Column::new_unqualified(n));
    let pos = src.conflicts.pos;
    let flag = super::Anomaly {
        name: SOURCE_CONFLICT_FLAG.into(),
        kind: super::AnomalyKind::When(super::SqlExpr {
            sql: format!("{CONFLICT_FIELDS} IS NOT NULL"),
            expr: col(CONFLICT_FIELDS).is_not_null(),
            pos,
        }),
        pos,
    };
    rules.anomalies.insert(0, flag);
    let action = match src.conflicts.on_conflict {
        OnConflict::Reject => super::Action::Reject,
        OnConflict::Fail => super::Action::Fail,
        OnConflict::Hold | OnConflict::Flag => return,
    };
    rules.validate.insert(
        0,
        super::Validation {
            name: SOURCE_CONFLICT_FLAG.into(),
            check: super::SqlExpr {
                sql: format!("{CONFLICT_REASON} IS NULL"),
                expr: col(CONFLICT_REASON).is_null(),
                pos,
            },
            reason: "conflicting values across sources (see audit.source_conflict_log)".into(),
            action,
            pos,
        },
    );
}
