//! Silver rules: `rules/<table>/v<N>.yaml` parsed into validated, typed [`RuleSet`]s (docs/guide.md#rules).
//!
//! A rules file is read from the located YAML tree ([`crate::spec::yaml`]) key by key, like a contract.
//! Every `expr`, `filter`, `check` and `when` is parsed by DataFusion's own SQL expression parser
//! into an [`Expr`] against the schema *at that step*: the source's `bronze.<source>_current`
//! columns plus the contract's `resolve` values, changed step by step. Rules never become SQL
//! text; column names are never pasted into SQL.
//!
//! Every problem of every file is collected, each located; a file with any problem yields no
//! [`RuleSet`] (see [`RulesSet::load`] for why callers must then refuse to build).
//!
//! Hazards: columns ingot maintains (the bronze columns and the resolve values) may be read by
//! steps but never changed, or silver could lose its lineage; aggregate, window and volatile
//! functions are refused because a row must clean the same way in an incremental and a full
//! build.

mod columns;
mod read;
pub mod sources;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use datafusion::common::DFSchemaRef;
use datafusion::logical_expr::Expr;
use datafusion::prelude::SessionContext;

pub use columns::type_name;

use crate::error::{Error, Result};
use crate::spec::contract::{ContractSet, FieldType};
use crate::spec::yaml::{Pos, Problems};

/// A column name as written in a rules file, with its position.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ident {
    pub name: String,
    pub pos: Pos,
}

/// A SQL expression of a rules file: its text, the `Expr` DataFusion parsed it into (unqualified
/// column references), and the position of the YAML node it came from.
#[derive(Debug, Clone, PartialEq)]
pub struct SqlExpr {
    pub sql: String,
    pub expr: Expr,
    pub pos: Pos,
}

/// One step of `steps:`, in file order; each sees the columns the steps before it produced.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// `set: column` + `expr:`: replace the column in place, or add it at the end.
    Set { column: Ident, expr: SqlExpr },
    /// `map: column` + `values:` (+ `default:`): replace mapped values; an unmapped value is
    /// kept unless `default` is given; a null stays null. The column is a string column.
    Map {
        column: Ident,
        values: Vec<(String, String)>,
        default: Option<String>,
    },
    /// `rename: {from: to, ...}`, applied at once (so `{a: b, b: a}` swaps).
    Rename(Vec<(Ident, Ident)>),
    /// `cast: {column: type, ...}` with contract type names.
    Cast(Vec<(Ident, FieldType)>),
    /// `drop: [column, ...]`.
    Drop(Vec<Ident>),
    /// `filter: predicate`: rows for which it is not true are removed on purpose (counted, not
    /// failures).
    Filter(SqlExpr),
}

impl Step {
    /// The valid step kinds, in the order the documentation lists them.
    pub const KINDS: &'static [&'static str] = &["set", "map", "rename", "cast", "drop", "filter"];

    pub fn kind(&self) -> &'static str {
        match self {
            Step::Set { .. } => "set",
            Step::Map { .. } => "map",
            Step::Rename(_) => "rename",
            Step::Cast(_) => "cast",
            Step::Drop(_) => "drop",
            Step::Filter(_) => "filter",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// The row is rejected to `audit.row_failure_log` (layer silver); the build goes on.
    Reject,
    /// The whole build fails and nothing is published.
    Fail,
}

/// One `validate:` entry. A row whose `check` is not true (NULL counts as failing) fails it.
#[derive(Debug, Clone, PartialEq)]
pub struct Validation {
    pub name: String,
    pub check: SqlExpr,
    /// `reason:`, or `check failed: <check>` when not given.
    pub reason: String,
    pub action: Action,
    pub pos: Pos,
}

/// One `anomalies:` entry: the row stays in silver and is flagged with `name`.
#[derive(Debug, Clone, PartialEq)]
pub struct Anomaly {
    pub name: String,
    pub kind: AnomalyKind,
    pub pos: Pos,
}

#[derive(Debug, Clone, PartialEq)]
pub enum AnomalyKind {
    /// Flag rows for which the predicate is true.
    When(SqlExpr),
    /// Value greater than `factor` x the mean of the up to `window` previous rows of its group
    /// (ordered by `order`, ties by `natural_key_fingerprint`), given at least `min_history`
    /// earlier rows and a mean above 0.
    Spike {
        column: Ident,
        by: Vec<Ident>,
        order: Ident,
        window: usize,
        factor: f64,
        min_history: usize,
    },
    /// First row of its group, or `order` at least `gap_days` days after the previous row's.
    FirstSeen {
        by: Vec<Ident>,
        order: Ident,
        gap_days: i64,
    },
}

impl AnomalyKind {
    pub const NAMES: &'static [&'static str] = &["when", "spike", "first_seen"];
}

/// Default `min_history` of a `spike`.
pub const DEFAULT_MIN_HISTORY: usize = 7;

/// One validated rules file.
#[derive(Debug, Clone)]
pub struct RuleSet {
    pub path: PathBuf,
    /// Silver table name (= the folder name).
    pub table: String,
    /// Bronze source read (its `_current` view); for a table with several sources, the first
    /// of `sources`.
    pub source: String,
    /// `sources:` instead of `source:`: the table is fed by several sources.
    pub sources: Option<Arc<sources::Sources>>,
    /// `N` of `v<N>.yaml`; stamped on silver rows as `rules_version`.
    pub version: i32,
    pub description: Option<String>,
    pub steps: Vec<Step>,
    pub validate: Vec<Validation>,
    pub anomalies: Vec<Anomaly>,
    /// SHA-256 of the file's bytes, 64 lowercase hex characters (recorded in the build log).
    pub sha256: String,
    /// Columns the first step sees: `bronze.<source>_current` then the resolve values (several
    /// sources: [`sources::merged_fields`]).
    pub input_schema: DFSchemaRef,
    /// Columns after the last step: what `validate` and `anomalies` see.
    pub output_schema: DFSchemaRef,
}

impl RuleSet {
    /// Parse and validate one rules file; every problem goes into `problems`.
    pub fn from_file(path: &Path, contracts: &ContractSet, problems: &mut Problems) -> Option<RuleSet> {
        read::from_file(&parse_context(), path, contracts, problems)
    }

    /// Parse and validate rules text as if it were the file `path` (whose folder and file name
    /// give the expected table and version).
    pub fn from_str(path: &Path, text: &str, contracts: &ContractSet, problems: &mut Problems) -> Option<RuleSet> {
        read::from_str(&parse_context(), path, text, contracts, problems)
    }

    /// Names of the validations then the anomalies, in file order.
    pub fn rule_names(&self) -> impl Iterator<Item = &str> {
        self.validate
            .iter()
            .map(|v| v.name.as_str())
            .chain(self.anomalies.iter().map(|a| a.name.as_str()))
    }
}

/// A session for parsing rules expressions: DataFusion's functions plus ingot's UDFs.
fn parse_context() -> SessionContext {
    let ctx = SessionContext::new();
    crate::hash::register_udfs(&ctx);
    ctx
}

/// Every valid rules file of a directory, by table then version.
#[derive(Debug, Default)]
pub struct RulesSet {
    pub dir: PathBuf,
    pub tables: BTreeMap<String, BTreeMap<i32, Arc<RuleSet>>>,
}

impl RulesSet {
    /// Load every `<dir>/<table>/v<N>.yaml`; problems of every file are collected. A missing
    /// directory means no rules (not a problem). Only files without problems are kept.
    ///
    /// Every problem comes with file, line and column and, where the choices are closed, the
    /// valid ones; an unknown column lists the columns that exist at that step. Callers that go
    /// on to build must refuse to run when `problems` is not empty: otherwise an older valid
    /// version would silently stand in for a broken newer one.
    pub fn load(dir: &Path, contracts: &ContractSet, problems: &mut Problems) -> RulesSet {
        read::load_dir(&parse_context(), dir, contracts, problems)
    }

    /// Table names, sorted.
    pub fn table_names(&self) -> Vec<&str> {
        self.tables.keys().map(String::as_str).collect()
    }

    /// The highest version of `table`.
    pub fn latest(&self, table: &str) -> Option<&Arc<RuleSet>> {
        self.tables.get(table)?.values().next_back()
    }

    /// Version `version` of `table`.
    pub fn get(&self, table: &str, version: i32) -> Option<&Arc<RuleSet>> {
        self.tables.get(table)?.get(&version)
    }

    /// `version` of `table`, or its latest when `None`; an error names the valid choices.
    pub fn select(&self, table: &str, version: Option<i32>) -> Result<Arc<RuleSet>> {
        let Some(versions) = self.tables.get(table) else {
            return Err(Error::Invalid(format!(
                "no rules for table \"{table}\" in {}; tables with rules: {}",
                self.dir.display(),
                if self.tables.is_empty() {
                    "(none)".to_string()
                } else {
                    self.table_names().join(", ")
                }
            )));
        };
        let found = match version {
            None => versions.values().next_back(),
            Some(v) => versions.get(&v),
        };
        found.cloned().ok_or_else(|| {
            Error::Invalid(format!(
                "table \"{table}\" has no rules version {}; versions are: {}",
                version.unwrap_or_default(),
                versions.keys().map(|v| format!("v{v}")).collect::<Vec<_>>().join(", ")
            ))
        })
    }
}
