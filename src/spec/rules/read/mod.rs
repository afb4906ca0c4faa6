//! Reading rules files from the located YAML tree into [`RuleSet`]s, every problem collected.
//!
//! This module finds the files, reads the top-level keys and holds the column-reference checks
//! every section uses; the sections are in `steps`, `validations` and `anomalies`, and a
//! table with several sources in `sources`.

mod anomalies;
mod keys;
mod sources;
mod steps;
mod validations;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use datafusion::arrow::datatypes::DataType;
use datafusion::prelude::SessionContext;
use sha2::Digest;

use super::columns::{Columns, ExprProblem, check_expr, type_name};
use super::{Ident, RuleSet, RulesSet, SqlExpr};
use crate::spec::columns::is_column_name;
use crate::spec::contract::{Contract, ContractSet};
use crate::spec::yaml::{self, Kind, MapNode, Node, Pos, Problems, is_valid_name, scalar_int, scalar_str, seq};

const TOP_KEYS: &[&str] = &[
    "table",
    "source",
    "sources",
    "version",
    "description",
    "survivorship",
    "conflicts",
    "steps",
    "validate",
    "anomalies",
];

/// Which schema a column reference is checked against (only the message differs).
#[derive(Clone, Copy)]
enum At {
    Step,
    End,
}

impl At {
    fn columns_are(self) -> &'static str {
        match self {
            At::Step => "columns at this step are:",
            At::End => "columns after the steps are:",
        }
    }
}

pub(super) fn load_dir(ctx: &SessionContext, dir: &Path, contracts: &ContractSet, problems: &mut Problems) -> RulesSet {
    let mut set = RulesSet {
        dir: dir.to_path_buf(),
        tables: BTreeMap::new(),
    };
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return set,
        Err(e) => {
            problems.push(dir, Pos::default(), format!("cannot read rules directory: {e}"));
            return set;
        }
    };
    let mut paths: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
    paths.sort();
    for path in paths {
        if !path.is_dir() {
            if is_yaml(&path) {
                problems.push(
                    &path,
                    Pos { line: 1, column: 1 },
                    format!(
                        "rules files belong in a folder per table: {}/<table>/v<N>.yaml",
                        dir.display()
                    ),
                );
            }
            continue;
        }
        let files = match std::fs::read_dir(&path) {
            Ok(e) => e,
            Err(e) => {
                problems.push(&path, Pos::default(), format!("cannot read rules directory: {e}"));
                continue;
            }
        };
        // Versions in numeric order (v2 before v10); misnamed files last, reported by the reader.
        let mut files: Vec<(Option<i32>, PathBuf)> = files
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| is_yaml(p))
            .map(|p| (version_of_file_name(&p), p))
            .collect();
        files.sort_by(|a, b| (a.0.is_none(), a.0, &a.1).cmp(&(b.0.is_none(), b.0, &b.1)));
        let mut first: Option<(String, i32)> = None;
        let mut seen: HashMap<i32, PathBuf> = HashMap::new();
        for (version, file) in files {
            if let Some(v) = version
                && let Some(other) = seen.get(&v)
            {
                problems.push(
                    &file,
                    Pos { line: 1, column: 1 },
                    format!("version {v} is already defined by {}", other.display()),
                );
                continue;
            }
            if let Some(v) = version {
                seen.insert(v, file.clone());
            }
            let expected = first.as_ref().map(|(s, v)| (s.as_str(), *v));
            if let Some(rules) = read_file(ctx, &file, contracts, expected, problems) {
                // only versions reading one `source:` must agree on it
                if first.is_none() && rules.sources.is_none() {
                    first = Some((rules.source.clone(), rules.version));
                }
                set.tables
                    .entry(rules.table.clone())
                    .or_default()
                    .insert(rules.version, Arc::new(rules));
            }
        }
    }
    set
}

fn is_yaml(p: &Path) -> bool {
    matches!(p.extension().and_then(|e| e.to_str()), Some("yaml" | "yml"))
}

/// `N` of `v<N>.yaml` (no sign, no leading zero, N >= 1).
fn version_of_file_name(path: &Path) -> Option<i32> {
    let stem = path.file_stem()?.to_str()?;
    let digits = stem.strip_prefix('v')?;
    if digits.is_empty() || digits.starts_with('0') || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

pub(super) fn from_file(
    ctx: &SessionContext,
    path: &Path,
    contracts: &ContractSet,
    problems: &mut Problems,
) -> Option<RuleSet> {
    read_file(ctx, path, contracts, None, problems)
}

fn read_file(
    ctx: &SessionContext,
    path: &Path,
    contracts: &ContractSet,
    expected_source: Option<(&str, i32)>,
    problems: &mut Problems,
) -> Option<RuleSet> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) => {
            problems.push(path, Pos { line: 1, column: 1 }, format!("cannot read rules file: {e}"));
            return None;
        }
    };
    let Ok(text) = String::from_utf8(bytes) else {
        problems.push(path, Pos { line: 1, column: 1 }, "rules file is not valid UTF-8");
        return None;
    };
    read_text(ctx, path, &text, contracts, expected_source, problems)
}

pub(super) fn from_str(
    ctx: &SessionContext,
    path: &Path,
    text: &str,
    contracts: &ContractSet,
    problems: &mut Problems,
) -> Option<RuleSet> {
    read_text(ctx, path, text, contracts, None, problems)
}

fn read_text(
    ctx: &SessionContext,
    path: &Path,
    text: &str,
    contracts: &ContractSet,
    expected_source: Option<(&str, i32)>,
    problems: &mut Problems,
) -> Option<RuleSet> {
    let doc = yaml::parse_or_report(path, text, problems)?;
    let before = problems.items.len();
    let rules = Reader {
        ctx,
        file: path,
        problems,
        contracts,
        protected: HashMap::new(),
        rule_names: HashMap::new(),
        several_sources: false,
    }
    .read(&doc.root, expected_source, text.as_bytes());
    if problems.items.len() > before { None } else { rules }
}

struct Reader<'a> {
    ctx: &'a SessionContext,
    file: &'a Path,
    problems: &'a mut Problems,
    contracts: &'a ContractSet,
    /// Columns steps may read but not change, with what they are (for the message).
    protected: HashMap<String, String>,
    /// Validation and anomaly names with the line of their first use.
    rule_names: HashMap<String, usize>,
    /// The file has `sources:` (its rule names may not be the conflict flag).
    several_sources: bool,
}

impl Reader<'_> {
    fn err(&mut self, pos: Pos, msg: impl Into<String>) {
        self.problems.push(self.file, pos, msg);
    }

    /// [`MapNode::new`], positioned at the first key (yaml-rust2 puts a block mapping at the
    /// first `:`), so that "missing key" messages point at the entry.
    fn map_node<'n>(&mut self, node: &'n Node, what: &str, valid: &[&str]) -> Option<MapNode<'n>> {
        let mut map = MapNode::new(self.file, node, what, valid, self.problems)?;
        map.pos = start(node);
        Some(map)
    }

    /// The rule set, when the file is valid; sections are read in file-key order so problems
    /// come out as before: top-level keys, then steps, validations and anomalies.
    fn read(mut self, root: &Node, expected_source: Option<(&str, i32)>, bytes: &[u8]) -> Option<RuleSet> {
        let file = self.file;
        let map = self.map_node(root, "the rules file", TOP_KEYS)?;
        let file_version = version_of_file_name(file);
        if file_version.is_none() {
            let name = file.file_name().and_then(|s| s.to_str()).unwrap_or("");
            self.err(
                Pos { line: 1, column: 1 },
                format!("rules file name \"{name}\" must be v<N>.yaml, N being the version (v1.yaml, v2.yaml, ...)"),
            );
        }
        let table = self.read_table(&map);
        let (source, mut cols, sources) = match self.sources_node(root, &map) {
            Some(node) => self.read_sources(root, &map, node),
            None => {
                let (source, contract) = self.read_source(&map, expected_source);
                (source, contract.as_ref().map(|c| self.input_columns(c)), None)
            }
        };
        let version = self.read_version(&map, file_version);
        let description = map
            .get("description")
            .and_then(|n| scalar_str(file, n, "description", self.problems))
            .map(str::to_string);

        let input_schema = cols.as_ref().map(Columns::df_schema);
        let mut steps = Vec::new();
        for item in self.list(&map, "steps") {
            if let Some(step) = self.read_step(item, &mut cols) {
                steps.push(step);
            }
        }
        let mut validate = Vec::new();
        for item in self.list(&map, "validate") {
            if let Some(v) = self.read_validation(item, cols.as_ref()) {
                validate.push(v);
            }
        }
        let mut anomalies = Vec::new();
        for item in self.list(&map, "anomalies") {
            if let Some(a) = self.read_anomaly(item, cols.as_ref()) {
                anomalies.push(a);
            }
        }

        let sha = sha2::Sha256::digest(bytes);
        let mut rules = RuleSet {
            path: file.to_path_buf(),
            table: table?,
            source: source?,
            sources: sources.map(Arc::new),
            version: version?,
            description,
            steps,
            validate,
            anomalies,
            sha256: sha.iter().map(|b| format!("{b:02x}")).collect(),
            input_schema: input_schema?,
            output_schema: cols?.df_schema(),
        };
        crate::spec::rules::sources::add_conflict_rules(&mut rules);
        Some(rules)
    }

    /// The items of the list under `key`; none when it is absent or not a list (reported).
    fn list<'n>(&mut self, map: &MapNode<'n>, key: &str) -> &'n [Node] {
        map.get(key)
            .and_then(|n| seq(self.file, n, key, self.problems))
            .unwrap_or(&[])
    }

    /// `table`: required, a valid name, equal to the folder name.
    fn read_table(&mut self, map: &MapNode<'_>) -> Option<String> {
        let folder = self
            .file
            .parent()
            .and_then(|p| p.file_name())
            .and_then(|s| s.to_str())
            .map(str::to_string);
        match map.get("table") {
            None => {
                self.err(map.pos, "missing required key \"table\" (the silver table name)");
                None
            }
            Some(n) => scalar_str(self.file, n, "table", self.problems).and_then(|s| {
                if !is_valid_name(s) {
                    self.err(n.pos, format!("table \"{s}\" must match [a-z][a-z0-9_]{{0,62}}"));
                    None
                } else if let Some(folder) = folder.as_deref().filter(|f| *f != s) {
                    self.err(n.pos, format!("table \"{s}\" must equal the folder name \"{folder}\""));
                    None
                } else {
                    Some(s.to_string())
                }
            }),
        }
    }

    /// `source`: required, the same for every version of a table, and a contract that loaded;
    /// returns the name (even when its contract is missing) and the contract.
    fn read_source(
        &mut self,
        map: &MapNode<'_>,
        expected_source: Option<(&str, i32)>,
    ) -> (Option<String>, Option<Arc<Contract>>) {
        let mut contract: Option<Arc<Contract>> = None;
        let source = match map.get("source") {
            None => {
                self.err(
                    map.pos,
                    "missing required key \"source\" (the bronze source the table reads), or \"sources\" (a list of sources in precedence order)",
                );
                None
            }
            Some(n) => scalar_str(self.file, n, "source", self.problems).map(|s| {
                if let Some((first, v)) = expected_source
                    && first != s
                {
                    self.err(
                        n.pos,
                        format!(
                            "source \"{s}\" differs from v{v}, which reads \"{first}\"; every version of a table reads the same source"
                        ),
                    );
                }
                contract = self.contract_of(s, n.pos);
                s.to_string()
            }),
        };
        (source, contract)
    }

    /// The loaded contract of `source`, or a problem at `pos` saying why there is none.
    fn contract_of(&mut self, s: &str, pos: Pos) -> Option<Arc<Contract>> {
        match self.contracts.contracts.get(s) {
            Some(c) => return Some(c.clone()),
            None if contract_file_exists(&self.contracts.dir, s) => self.err(
                pos,
                format!(
                    "source \"{s}\": its contract has problems (reported with the contract); the columns of this file cannot be checked until it is fixed"
                ),
            ),
            None => self.err(
                pos,
                format!(
                    "source \"{s}\" is not a known contract; sources are: {}",
                    if self.contracts.contracts.is_empty() {
                        "(none)".to_string()
                    } else {
                        self.contracts.names().join(", ")
                    }
                ),
            ),
        }
        None
    }

    /// `version`: required, an integer >= 1 that fits an i32 and equals N of `v<N>.yaml`.
    fn read_version(&mut self, map: &MapNode<'_>, file_version: Option<i32>) -> Option<i32> {
        let file = self.file;
        match map.get("version") {
            None => {
                self.err(map.pos, "missing required key \"version\"");
                None
            }
            Some(n) => scalar_int(file, n, "version", 1, self.problems).and_then(|v| {
                let Ok(v) = i32::try_from(v) else {
                    self.err(n.pos, format!("version {v} is too large (at most {})", i32::MAX));
                    return None;
                };
                match file_version {
                    Some(f) if f != v => {
                        let name = file.file_name().and_then(|s| s.to_str()).unwrap_or("");
                        self.err(
                            n.pos,
                            format!("version {v} must equal N of the file name \"{name}\" ({f}); add a new file v<N>.yaml for a new version"),
                        );
                        None
                    }
                    _ => Some(v),
                }
            }),
        }
    }

    /// `bronze.<source>_current` columns then the resolve values (typed like the looked-up
    /// field). The bronze columns and the resolve values are protected: steps may only read them.
    fn input_columns(&mut self, contract: &Contract) -> Columns {
        let mut cols = Columns::default();
        for f in contract.bronze_schema().fields() {
            cols.set(f.name(), Some(f.data_type().clone()));
        }
        for f in crate::spec::columns::meta_fields() {
            self.protected
                .insert(f.name().clone(), "a bronze column ingot maintains".to_string());
        }
        for r in &contract.resolve {
            let Some(lookup) = self.contracts.contracts.get(&r.lookup) else {
                continue;
            };
            let Some(ix) = lookup.field_index(&r.value) else {
                continue;
            };
            if cols.find(&r.alias).is_none() {
                cols.set(&r.alias, Some(lookup.fields[ix].ty.arrow_type()));
                self.protected.insert(
                    r.alias.clone(),
                    format!(
                        "the value of resolve \"{}\" of contract \"{}\"",
                        r.name, contract.source
                    ),
                );
            }
        }
        cols
    }

    // ---- column references -------------------------------------------------------------

    /// A column name that must exist in `cols` (when the columns are known).
    fn column_ref(&mut self, node: &Node, what: &str, cols: Option<&Columns>, at: At) -> Option<Ident> {
        let name = scalar_str(self.file, node, what, self.problems)?.to_string();
        if let Some(cols) = cols
            && cols.find(&name).is_none()
        {
            self.unknown_column(node.pos, &name, cols, at);
            return None;
        }
        Some(Ident { name, pos: node.pos })
    }

    fn unknown_column(&mut self, pos: Pos, name: &str, cols: &Columns, at: At) {
        self.err(
            pos,
            format!("unknown column \"{name}\"; {} {}", at.columns_are(), cols.list()),
        );
    }

    /// Steps may read protected columns but not change them.
    fn changeable(&mut self, id: &Ident, verb: &str) -> bool {
        match self.protected.get(&id.name) {
            Some(what) => {
                let msg = format!("column \"{}\" is {what}; steps may read it but not {verb} it", id.name);
                self.err(id.pos, msg);
                false
            }
            None => true,
        }
    }

    /// A name for a column that does not exist yet.
    fn new_name(&mut self, id: &Ident) -> bool {
        if !is_column_name(&id.name) {
            self.err(
                id.pos,
                format!("column name \"{}\" must match [a-z_][a-z0-9_]{{0,62}}", id.name),
            );
            false
        } else if crate::spec::columns::is_reserved(&id.name) {
            self.err(
                id.pos,
                format!(
                    "column name \"{}\" is reserved by ingot (a column of its bronze, silver or audit tables{})",
                    id.name,
                    if id.name.starts_with(crate::spec::columns::RESERVED_PREFIX) {
                        ", or one it adds inside its plans"
                    } else {
                        ""
                    }
                ),
            );
            false
        } else {
            true
        }
    }

    /// Parse an expression against `cols`; `boolean` insists on a boolean result. Returns the
    /// expression and its type (`None` when it reads a column of unknown type).
    fn expr(
        &mut self,
        node: &Node,
        what: &str,
        cols: Option<&Columns>,
        at: At,
        boolean: bool,
    ) -> Option<(SqlExpr, Option<DataType>)> {
        let sql = scalar_str(self.file, node, what, self.problems)?.to_string();
        let cols = cols?;
        match check_expr(self.ctx, &sql, cols) {
            Err(ExprProblem::UnknownColumn(name)) => {
                self.unknown_column(node.pos, &name, cols, at);
                None
            }
            Err(ExprProblem::Invalid(msg)) => {
                self.err(node.pos, format!("invalid expression \"{sql}\": {msg}"));
                None
            }
            Ok((expr, ty)) => {
                if boolean && let Some(t) = ty.as_ref().filter(|t| **t != DataType::Boolean) {
                    self.err(
                        node.pos,
                        format!("{what} must be a boolean expression; \"{sql}\" is {}", type_name(t)),
                    );
                    return None;
                }
                Some((
                    SqlExpr {
                        sql,
                        expr,
                        pos: node.pos,
                    },
                    ty,
                ))
            }
        }
    }

    /// The `name` of a validation or anomaly: required, a valid name, unique across both lists.
    fn rule_name(&mut self, map: &MapNode<'_>, what: &str) -> Option<String> {
        let Some(n) = map.get("name") else {
            self.err(map.pos, format!("{what} is missing \"name\""));
            return None;
        };
        let name = scalar_str(self.file, n, "name", self.problems)?.to_string();
        if !is_valid_name(&name) {
            self.err(n.pos, format!("rule name \"{name}\" must match [a-z][a-z0-9_]{{0,62}}"));
            return None;
        }
        if let Some(line) = self.rule_names.get(&name) {
            self.err(
                n.pos,
                format!("duplicate rule name \"{name}\" (first used at line {line}); validations and anomalies need distinct names"),
            );
            return None;
        }
        if self.several_sources && name == crate::spec::rules::sources::SOURCE_CONFLICT_FLAG {
            self.err(
                n.pos,
                format!("rule name \"{name}\" is reserved: ingot flags rows in conflict with it (a table with several sources); choose another name"),
            );
            return None;
        }
        self.rule_names.insert(name.clone(), n.pos.line);
        Some(name)
    }
}

/// Where an entry starts: its first key for a mapping, else the node.
fn start(node: &Node) -> Pos {
    match &node.kind {
        Kind::Map(entries) => entries.first().map(|(k, _)| k.pos).unwrap_or(node.pos),
        _ => node.pos,
    }
}

fn contract_file_exists(dir: &Path, source: &str) -> bool {
    ["yaml", "yml"]
        .iter()
        .any(|ext| dir.join(format!("{source}.{ext}")).exists())
}
