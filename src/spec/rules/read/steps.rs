//! The `steps:` section: each step is checked against the columns the steps before it left,
//! and changes them for the next (`set` adds or replaces, `rename`, `cast` and `drop` change
//! them, `map` and `filter` keep them).
//! A step with a problem still updates the columns (unknown type) so later steps are not also
//! told a column is missing.

use std::collections::{HashMap, HashSet};

use datafusion::arrow::compute::can_cast_types;
use datafusion::arrow::datatypes::DataType;

use super::{At, Reader, start};
use crate::spec::contract::FieldType;
use crate::spec::rules::columns::{Columns, is_string, type_name};
use crate::spec::rules::{Ident, Step};
use crate::spec::yaml::{Kind, Node, Pos, scalar_str};

const TYPE_CHOICES: &str = "(decimal precision 1..=38, 0 <= scale <= precision)";

impl Reader<'_> {
    /// One `steps:` entry, read against and applied to `cols` (`None` when the source's
    /// columns are unknown: the step's keys are still read, its columns and expressions are not).
    pub(super) fn read_step(&mut self, item: &Node, cols: &mut Option<Columns>) -> Option<Step> {
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
}
