//! Reading rules files from the located YAML tree into [`RuleSet`]s, every problem collected.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use datafusion::arrow::compute::can_cast_types;
use datafusion::arrow::datatypes::DataType;
use datafusion::prelude::SessionContext;
use sha2::Digest;

use super::columns::{Columns, ExprProblem, check_expr, is_string, type_name};
use super::{Action, Anomaly, AnomalyKind, DEFAULT_MIN_HISTORY, Ident, RuleSet, RulesSet, SqlExpr, Step, Validation};
use crate::spec::contract::{
    Contract, ContractSet, FieldType, MapNode, RESERVED_COLUMNS, is_valid_name, scalar_int, scalar_str, seq,
};
use crate::spec::yaml::{self, Kind, Node, Pos, Problems};

const TOP_KEYS: &[&str] = &[
    "table",
    "source",
    "version",
    "description",
    "steps",
    "validate",
    "anomalies",
];
const VALIDATION_KEYS: &[&str] = &["name", "check", "reason", "action"];
const ANOMALY_KEYS: &[&str] = &["name", "when", "spike", "first_seen"];
const SPIKE_KEYS: &[&str] = &["column", "by", "order", "window", "factor", "min_history"];
const FIRST_SEEN_KEYS: &[&str] = &["by", "order", "gap_days"];
const TYPE_CHOICES: &str = "(decimal precision 1..=38, 0 <= scale <= precision)";

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
                if first.is_none() {
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

    fn read(mut self, root: &Node, expected_source: Option<(&str, i32)>, bytes: &[u8]) -> Option<RuleSet> {
        let file = self.file;
        let map = self.map_node(root, "the rules file", TOP_KEYS)?;
        let folder = file
            .parent()
            .and_then(|p| p.file_name())
            .and_then(|s| s.to_str())
            .map(str::to_string);
        let file_version = version_of_file_name(file);
        if file_version.is_none() {
            let name = file.file_name().and_then(|s| s.to_str()).unwrap_or("");
            self.err(
                Pos { line: 1, column: 1 },
                format!("rules file name \"{name}\" must be v<N>.yaml, N being the version (v1.yaml, v2.yaml, ...)"),
            );
        }

        let table = match map.get("table") {
            None => {
                self.err(map.pos, "missing required key \"table\" (the silver table name)");
                None
            }
            Some(n) => scalar_str(file, n, "table", self.problems).and_then(|s| {
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
        };

        let mut contract: Option<Arc<Contract>> = None;
        let source = match map.get("source") {
            None => {
                self.err(map.pos, "missing required key \"source\" (the bronze source the table reads)");
                None
            }
            Some(n) => scalar_str(file, n, "source", self.problems).map(|s| {
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
                match self.contracts.contracts.get(s) {
                    Some(c) => contract = Some(c.clone()),
                    None if contract_file_exists(&self.contracts.dir, s) => self.err(
                        n.pos,
                        format!(
                            "source \"{s}\": its contract has problems (reported with the contract); the columns of this file cannot be checked until it is fixed"
                        ),
                    ),
                    None => self.err(
                        n.pos,
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
                s.to_string()
            }),
        };

        let version = match map.get("version") {
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
        };
        let description = map
            .get("description")
            .and_then(|n| scalar_str(file, n, "description", self.problems))
            .map(str::to_string);

        let mut cols = contract.as_ref().map(|c| self.input_columns(c));
        let input_schema = cols.as_ref().map(Columns::df_schema);

        let mut steps = Vec::new();
        if let Some(n) = map.get("steps")
            && let Some(items) = seq(file, n, "steps", self.problems)
        {
            for item in items {
                if let Some(step) = self.read_step(item, &mut cols) {
                    steps.push(step);
                }
            }
        }

        let mut validate = Vec::new();
        if let Some(n) = map.get("validate")
            && let Some(items) = seq(file, n, "validate", self.problems)
        {
            for item in items {
                if let Some(v) = self.read_validation(item, cols.as_ref()) {
                    validate.push(v);
                }
            }
        }
        let mut anomalies = Vec::new();
        if let Some(n) = map.get("anomalies")
            && let Some(items) = seq(file, n, "anomalies", self.problems)
        {
            for item in items {
                if let Some(a) = self.read_anomaly(item, cols.as_ref()) {
                    anomalies.push(a);
                }
            }
        }

        let sha = sha2::Sha256::digest(bytes);
        Some(RuleSet {
            path: file.to_path_buf(),
            table: table?,
            source: source?,
            version: version?,
            description,
            steps,
            validate,
            anomalies,
            sha256: sha.iter().map(|b| format!("{b:02x}")).collect(),
            input_schema: input_schema?,
            output_schema: cols?.df_schema(),
        })
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
        } else if RESERVED_COLUMNS.contains(&id.name.as_str()) {
            self.err(
                id.pos,
                format!(
                    "column name \"{}\" is reserved by ingot (a column of its bronze, silver or audit tables)",
                    id.name
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

    // ---- steps ---------------------------------------------------------------------------

    fn read_step(&mut self, item: &Node, cols: &mut Option<Columns>) -> Option<Step> {
        let Kind::Map(entries) = &item.kind else {
            self.err(
                item.pos,
                format!(
                    "a step must be a mapping such as \"- set: column\"; found {}",
                    item.kind_name()
                ),
            );
            return None;
        };
        let kinds: Vec<&str> = entries
            .iter()
            .filter_map(|(k, _)| k.as_str())
            .filter(|k| Step::KINDS.contains(k))
            .collect();
        let kind = match kinds.as_slice() {
            [one] => *one,
            [] => {
                let (pos, first) = entries
                    .first()
                    .map(|(k, _)| (k.pos, k.as_str().unwrap_or("").to_string()))
                    .unwrap_or((item.pos, String::new()));
                self.err(
                    pos,
                    format!(
                        "unknown step kind \"{first}\"; valid kinds are: {}",
                        Step::KINDS.join(", ")
                    ),
                );
                return None;
            }
            many => {
                self.err(
                    start(item),
                    format!("a step has exactly one kind; this one has {}", many.join(" and ")),
                );
                return None;
            }
        };
        let valid: &[&str] = match kind {
            "set" => &["set", "expr"],
            "map" => &["map", "values", "default"],
            "rename" => &["rename"],
            "cast" => &["cast"],
            "drop" => &["drop"],
            _ => &["filter"],
        };
        let what = format!("a {kind} step");
        let map = self.map_node(item, &what, valid)?;
        let head = map.get(kind)?;
        match kind {
            "set" => self.read_set(head, map.get("expr"), map.pos, cols),
            "map" => self.read_map(head, map.get("values"), map.get("default"), map.pos, cols),
            "rename" => self.read_rename(head, cols),
            "cast" => self.read_cast(head, cols),
            "drop" => self.read_drop(head, cols),
            _ => self
                .expr(head, "filter", cols.as_ref(), At::Step, true)
                .map(|(e, _)| Step::Filter(e)),
        }
    }

    fn read_set(&mut self, head: &Node, expr: Option<&Node>, pos: Pos, cols: &mut Option<Columns>) -> Option<Step> {
        let name = scalar_str(self.file, head, "set", self.problems)?.to_string();
        let column = Ident { name, pos: head.pos };
        let Some(expr_node) = expr else {
            self.err(pos, format!("set step for \"{}\" is missing \"expr\"", column.name));
            return None;
        };
        let parsed = self.expr(expr_node, "expr", cols.as_ref(), At::Step, false);
        let exists = cols.as_ref().is_some_and(|c| c.find(&column.name).is_some());
        let name_ok = if exists {
            self.changeable(&column, "set")
        } else {
            self.new_name(&column)
        };
        let mut ty = parsed.as_ref().and_then(|(_, t)| t.clone());
        if let (Some((e, _)), Some(DataType::Null)) = (&parsed, &ty) {
            self.err(
                e.pos,
                format!("expr \"{}\" has no type; cast it, e.g. CAST(NULL AS VARCHAR)", e.sql),
            );
            ty = None;
        }
        if let Some(c) = cols.as_mut() {
            c.set(&column.name, ty);
        }
        let (expr, _) = parsed?;
        name_ok.then_some(Step::Set { column, expr })
    }

    fn read_map(
        &mut self,
        head: &Node,
        values: Option<&Node>,
        default: Option<&Node>,
        pos: Pos,
        cols: &mut Option<Columns>,
    ) -> Option<Step> {
        let file = self.file;
        let column = self.column_ref(head, "map", cols.as_ref(), At::Step);
        if let Some(c) = &column {
            self.changeable(c, "map");
            if let Some(ty) = cols.as_ref().and_then(|cs| cs.get(&c.name)).and_then(|c| c.ty.clone())
                && !is_string(&ty)
            {
                self.err(
                    c.pos,
                    format!(
                        "map applies to string columns; \"{}\" is {} at this step (cast it first)",
                        c.name,
                        type_name(&ty)
                    ),
                );
            }
        }
        if values.is_none() && default.is_none() {
            self.err(
                pos,
                "map step needs \"values\" (a mapping of old: new), \"default\", or both",
            );
        }
        let mut out = Vec::new();
        if let Some(v) = values {
            match &v.kind {
                Kind::Map(entries) => {
                    let mut first: HashMap<String, usize> = HashMap::new();
                    for (k, val) in entries {
                        let key = match k.as_str() {
                            Some(s) if !k.is_null() => s.to_string(),
                            _ => {
                                self.err(k.pos, "map values: each key must be a text value");
                                continue;
                            }
                        };
                        if let Some(line) = first.get(&key) {
                            self.err(k.pos, format!("value \"{key}\" is mapped twice (first at line {line})"));
                            continue;
                        }
                        first.insert(key.clone(), k.pos.line);
                        if let Some(to) = scalar_str(file, val, "a mapped value", self.problems) {
                            out.push((key, to.to_string()));
                        }
                    }
                }
                _ => self.err(
                    v.pos,
                    format!("values must be a mapping of old: new values, found {}", v.kind_name()),
                ),
            }
        }
        let default = default
            .and_then(|d| scalar_str(file, d, "default", self.problems))
            .map(str::to_string);
        Some(Step::Map {
            column: column?,
            values: out,
            default,
        })
    }

    /// `{from: to}` pairs of a rename or cast mapping; `None` (with a problem) if not a mapping.
    fn pairs<'n>(&mut self, node: &'n Node, kind: &str, example: &str) -> Option<Vec<(Ident, &'n Node)>> {
        let Kind::Map(entries) = &node.kind else {
            self.err(
                node.pos,
                format!("{kind} must be a mapping such as {example}, found {}", node.kind_name()),
            );
            return None;
        };
        let mut seen = HashSet::new();
        let mut out = Vec::new();
        for (k, v) in entries {
            let Some(name) = k.as_str().filter(|_| !k.is_null()) else {
                self.err(k.pos, format!("{kind}: keys must be column names"));
                continue;
            };
            if !seen.insert(name.to_string()) {
                self.err(k.pos, format!("column \"{name}\" is listed twice in this {kind} step"));
                continue;
            }
            out.push((
                Ident {
                    name: name.to_string(),
                    pos: k.pos,
                },
                v,
            ));
        }
        Some(out)
    }

    fn read_rename(&mut self, head: &Node, cols: &mut Option<Columns>) -> Option<Step> {
        let pairs = self.pairs(head, "rename", "{old_name: new_name}")?;
        let before = self.problems.items.len();
        let from_names: HashSet<String> = pairs.iter().map(|(f, _)| f.name.clone()).collect();
        let mut targets: HashSet<String> = HashSet::new();
        let mut out = Vec::new();
        // Targets of renames with a problem: added with an unknown type, so that later steps
        // are not also told the column is missing.
        let mut failed_targets = Vec::new();
        for (from, to_node) in pairs {
            let pair_start = self.problems.items.len();
            match cols.as_ref() {
                Some(c) if c.find(&from.name).is_none() => self.unknown_column(from.pos, &from.name, c, At::Step),
                _ => {
                    self.changeable(&from, "rename");
                }
            }
            let Some(to) = scalar_str(self.file, to_node, "the new name", self.problems) else {
                continue;
            };
            let to = Ident {
                name: to.to_string(),
                pos: to_node.pos,
            };
            if !targets.insert(to.name.clone()) {
                self.err(to.pos, format!("two columns are renamed to \"{}\"", to.name));
            } else if from_names.contains(&to.name) {
                // a swap or a chain within this step: the old column is renamed away
            } else if cols.as_ref().is_some_and(|c| c.find(&to.name).is_some()) {
                self.err(
                    to.pos,
                    format!(
                        "cannot rename \"{}\" to \"{}\": column \"{}\" already exists at this step (drop or rename it first)",
                        from.name, to.name, to.name
                    ),
                );
            } else {
                self.new_name(&to);
            }
            if self.problems.items.len() > pair_start {
                failed_targets.push(to.name.clone());
            } else {
                out.push((from, to));
            }
        }
        if let Some(c) = cols.as_mut() {
            for col in c.cols.iter_mut() {
                if let Some((_, to)) = out.iter().find(|(f, _)| f.name == col.name) {
                    col.name = to.name.clone();
                }
            }
            for name in failed_targets {
                if c.find(&name).is_none() {
                    c.set(&name, None);
                }
            }
            // A swap half of which failed would leave a name twice; keep the first.
            let mut names = HashSet::new();
            c.cols.retain(|col| names.insert(col.name.clone()));
        }
        (self.problems.items.len() == before).then_some(Step::Rename(out))
    }

    fn read_cast(&mut self, head: &Node, cols: &mut Option<Columns>) -> Option<Step> {
        let pairs = self.pairs(head, "cast", "{column: \"decimal(12,2)\"}")?;
        let before = self.problems.items.len();
        let mut out = Vec::new();
        for (column, ty_node) in pairs {
            let current = match cols.as_ref() {
                Some(c) => match c.get(&column.name) {
                    None => {
                        self.unknown_column(column.pos, &column.name, c, At::Step);
                        continue;
                    }
                    Some(col) => col.ty.clone(),
                },
                None => None,
            };
            self.changeable(&column, "cast");
            let Some(text) = scalar_str(self.file, ty_node, "type", self.problems) else {
                continue;
            };
            let Some(ty) = FieldType::parse(text) else {
                self.err(
                    ty_node.pos,
                    format!(
                        "unknown type \"{text}\" for column \"{}\"; valid types are: {} {TYPE_CHOICES}",
                        column.name,
                        FieldType::NAMES.join(", ")
                    ),
                );
                if let Some(c) = cols.as_mut() {
                    c.set(&column.name, None);
                }
                continue;
            };
            if let Some(from) = &current
                && !can_cast_types(from, &ty.arrow_type())
            {
                self.err(
                    ty_node.pos,
                    format!(
                        "cannot cast column \"{}\" from {} to {}",
                        column.name,
                        type_name(from),
                        ty.name()
                    ),
                );
            }
            if let Some(c) = cols.as_mut() {
                c.set(&column.name, Some(ty.arrow_type()));
            }
            out.push((column, ty));
        }
        (self.problems.items.len() == before).then_some(Step::Cast(out))
    }

    fn read_drop(&mut self, head: &Node, cols: &mut Option<Columns>) -> Option<Step> {
        let items: Vec<&Node> = match &head.kind {
            Kind::Seq(items) => items.iter().collect(),
            Kind::Scalar { .. } if !head.is_null() => vec![head],
            _ => {
                self.err(
                    head.pos,
                    format!("drop must be a list of columns, found {}", head.kind_name()),
                );
                return None;
            }
        };
        let before = self.problems.items.len();
        let mut seen = HashSet::new();
        let mut out = Vec::new();
        for item in items {
            let Some(id) = self.column_ref(item, "a dropped column", cols.as_ref(), At::Step) else {
                continue;
            };
            if !seen.insert(id.name.clone()) {
                self.err(id.pos, format!("column \"{}\" is dropped twice", id.name));
                continue;
            }
            if self.changeable(&id, "drop") {
                out.push(id);
            }
        }
        if let Some(c) = cols.as_mut() {
            for id in &out {
                c.remove(&id.name);
            }
        }
        (self.problems.items.len() == before).then_some(Step::Drop(out))
    }

    // ---- validations and anomalies ----------------------------------------------------------

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
        self.rule_names.insert(name.clone(), n.pos.line);
        Some(name)
    }

    fn read_validation(&mut self, item: &Node, cols: Option<&Columns>) -> Option<Validation> {
        let file = self.file;
        let map = self.map_node(item, "a validation", VALIDATION_KEYS)?;
        let name = self.rule_name(&map, "a validation");
        let label = name.clone().unwrap_or_default();
        let check = match map.get("check") {
            None => {
                self.err(map.pos, format!("validation \"{label}\" is missing \"check\""));
                None
            }
            Some(n) => self.expr(n, "check", cols, At::End, true).map(|(e, _)| e),
        };
        let reason = map
            .get("reason")
            .and_then(|n| scalar_str(file, n, "reason", self.problems))
            .map(str::to_string);
        let action = match map.get("action") {
            None => Some(Action::Reject),
            Some(n) => scalar_str(file, n, "action", self.problems).and_then(|s| match s {
                "reject" => Some(Action::Reject),
                "fail" => Some(Action::Fail),
                _ => {
                    self.err(n.pos, format!("action must be one of: reject, fail; found \"{s}\""));
                    None
                }
            }),
        };
        let check = check?;
        Some(Validation {
            name: name?,
            reason: reason.unwrap_or_else(|| format!("check failed: {}", check.sql)),
            check,
            action: action?,
            pos: map.pos,
        })
    }

    fn read_anomaly(&mut self, item: &Node, cols: Option<&Columns>) -> Option<Anomaly> {
        let map = self.map_node(item, "an anomaly", ANOMALY_KEYS)?;
        let name = self.rule_name(&map, "an anomaly");
        let label = name.clone().unwrap_or_default();
        let kinds: Vec<&str> = AnomalyKind::NAMES
            .iter()
            .copied()
            .filter(|k| map.get(k).is_some())
            .collect();
        let kind = match kinds.as_slice() {
            ["when"] => self
                .expr(map.get("when")?, "when", cols, At::End, true)
                .map(|(e, _)| AnomalyKind::When(e)),
            ["spike"] => self.read_spike(map.get("spike")?, cols),
            ["first_seen"] => self.read_first_seen(map.get("first_seen")?, cols),
            [] => {
                self.err(
                    map.pos,
                    format!("anomaly \"{label}\" needs one of: {}", AnomalyKind::NAMES.join(", ")),
                );
                None
            }
            many => {
                self.err(
                    map.pos,
                    format!(
                        "anomaly \"{label}\" has more than one kind ({}); give one",
                        many.join(", ")
                    ),
                );
                None
            }
        };
        Some(Anomaly {
            name: name?,
            kind: kind?,
            pos: map.pos,
        })
    }

    /// `by:` columns (a list, or one name).
    fn read_by(&mut self, node: &Node, cols: Option<&Columns>) -> Option<Vec<Ident>> {
        let items: Vec<&Node> = match &node.kind {
            Kind::Seq(items) => items.iter().collect(),
            Kind::Scalar { .. } if !node.is_null() => vec![node],
            _ => {
                self.err(
                    node.pos,
                    format!("by must be a list of columns, found {}", node.kind_name()),
                );
                return None;
            }
        };
        let before = self.problems.items.len();
        let mut out: Vec<Ident> = Vec::new();
        for item in items {
            if let Some(id) = self.column_ref(item, "a by column", cols, At::End) {
                if out.iter().any(|o| o.name == id.name) {
                    self.err(id.pos, format!("column \"{}\" is listed twice in by", id.name));
                    continue;
                }
                out.push(id);
            }
        }
        (self.problems.items.len() == before).then_some(out)
    }

    fn typed_ref(
        &mut self,
        node: &Node,
        what: &str,
        cols: Option<&Columns>,
        ok: fn(&DataType) -> bool,
        expected: &str,
    ) -> Option<Ident> {
        let id = self.column_ref(node, what, cols, At::End)?;
        if let Some(ty) = cols.and_then(|c| c.get(&id.name)).and_then(|c| c.ty.clone())
            && !ok(&ty)
        {
            self.err(
                id.pos,
                format!("{what} \"{}\" must be {expected}; it is {}", id.name, type_name(&ty)),
            );
            return None;
        }
        Some(id)
    }

    fn read_spike(&mut self, node: &Node, cols: Option<&Columns>) -> Option<AnomalyKind> {
        let file = self.file;
        let map = self.map_node(node, "spike", SPIKE_KEYS)?;
        let before = self.problems.items.len();
        let need = |key: &str, problems: &mut Problems| {
            let n = map.get(key);
            if n.is_none() {
                problems.push(file, map.pos, format!("spike is missing \"{key}\""));
            }
            n
        };
        let column_n = need("column", self.problems);
        let by_n = need("by", self.problems);
        let order_n = need("order", self.problems);
        let window_n = need("window", self.problems);
        let factor_n = need("factor", self.problems);
        let column = column_n.and_then(|n| self.typed_ref(n, "spike column", cols, DataType::is_numeric, "numeric"));
        let by = by_n.and_then(|n| self.read_by(n, cols));
        let order = order_n.and_then(|n| {
            self.typed_ref(
                n,
                "spike order",
                cols,
                is_orderable,
                "a number, date, timestamp or string",
            )
        });
        let window = window_n.and_then(|n| scalar_int(file, n, "window", 1, self.problems));
        let factor = factor_n.and_then(|n| {
            let s = scalar_str(file, n, "factor", self.problems)?;
            match s.trim().parse::<f64>() {
                Ok(f) if f.is_finite() && f > 0.0 => Some(f),
                _ => {
                    self.err(n.pos, format!("factor must be a number > 0, found \"{s}\""));
                    None
                }
            }
        });
        let min_history = match map.get("min_history") {
            None => Some(DEFAULT_MIN_HISTORY),
            Some(n) => scalar_int(file, n, "min_history", 1, self.problems).and_then(|v| usize::try_from(v).ok()),
        };
        if self.problems.items.len() > before {
            return None;
        }
        Some(AnomalyKind::Spike {
            column: column?,
            by: by?,
            order: order?,
            window: usize::try_from(window?).ok()?,
            factor: factor?,
            min_history: min_history?,
        })
    }

    fn read_first_seen(&mut self, node: &Node, cols: Option<&Columns>) -> Option<AnomalyKind> {
        let file = self.file;
        let map = self.map_node(node, "first_seen", FIRST_SEEN_KEYS)?;
        let before = self.problems.items.len();
        let need = |key: &str, problems: &mut Problems| {
            let n = map.get(key);
            if n.is_none() {
                problems.push(file, map.pos, format!("first_seen is missing \"{key}\""));
            }
            n
        };
        let by_n = need("by", self.problems);
        let order_n = need("order", self.problems);
        let gap_n = need("gap_days", self.problems);
        let by = by_n.and_then(|n| self.read_by(n, cols));
        let order = order_n
            .and_then(|n| self.typed_ref(n, "first_seen order", cols, is_date_like, "a date or timestamp column"));
        let gap_days = gap_n.and_then(|n| scalar_int(file, n, "gap_days", 1, self.problems));
        if self.problems.items.len() > before {
            return None;
        }
        Some(AnomalyKind::FirstSeen {
            by: by?,
            order: order?,
            gap_days: gap_days?,
        })
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

/// Column names steps may create: lower case, so SQL never needs quoting.
fn is_column_name(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && (b[0].is_ascii_lowercase() || b[0] == b'_')
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'_')
}

fn is_orderable(t: &DataType) -> bool {
    t.is_numeric() || t.is_temporal() || is_string(t)
}

fn is_date_like(t: &DataType) -> bool {
    matches!(t, DataType::Date32 | DataType::Date64 | DataType::Timestamp(..))
}
