//! A table fed by several sources: `sources:` (each entry's contract, rank, key namespace and own
//! steps), `survivorship:` and `conflicts:`, read into [`Sources`].
//!
//! Every entry's steps are checked against its own contract's columns (its resolve values
//! protected, `filter` refused: a record must be a candidate of every source that has it); the
//! entries' outputs make the table's columns, one type each. Entries of one key namespace must
//! build the same natural-key fingerprint, or one record's candidates would never meet. The
//! top-level steps then see [`merged_fields`], the provenance columns protected.

use std::collections::HashMap;
use std::sync::Arc;

use datafusion::arrow::datatypes::DataType;

use super::Reader;
use crate::spec::columns::meta_fields;
use crate::spec::contract::Contract;
use crate::spec::rules::Step;
use crate::spec::rules::columns::{Columns, is_string, type_name};
use crate::spec::rules::sources::{
    Conflicts, Group, OnConflict, PROVENANCE_COLUMNS, Rule, SamePrecedence, SourceEntry, Sources, Survivorship,
    merged_fields,
};
use crate::spec::yaml::{Kind, MapNode, Node, Pos, is_valid_name, scalar_int, scalar_str, seq};

const ENTRY_KEYS: &[&str] = &["source", "rank", "key_namespace", "shared_key", "steps"];
const SURVIVORSHIP_KEYS: &[&str] = &["default", "order_by", "fields", "groups"];
const GROUP_KEYS: &[&str] = &["fields", "rule"];
const CONFLICTS_KEYS: &[&str] = &["fields", "same_precedence", "on_conflict"];
const RULE_FORMS: &str = "precedence, most_recent, {most_recent: <column>}, {only: <source>}";
const MOST_RECENT_NEEDS: &str =
    "most_recent needs a column: set survivorship.order_by or write {most_recent: <column>}";

/// One `sources:` entry as read; the columns are `None` when its contract is unknown.
pub(super) struct Entry {
    pub(super) source: Option<String>,
    pub(super) source_pos: Pos,
    pub(super) contract: Option<Arc<Contract>>,
    pub(super) rank: Option<u32>,
    pub(super) rank_pos: Option<Pos>,
    pub(super) key_namespace: Option<String>,
    /// `shared_key:` as read: resolve names, each with its position.
    pub(super) shared_key: Vec<(String, Pos)>,
    pub(super) shared_key_pos: Option<Pos>,
    pub(super) steps: Vec<Step>,
    pub(super) input: Option<Columns>,
    pub(super) output: Option<Columns>,
    pub(super) pos: Pos,
}

/// What survivorship and conflicts are checked against.
struct Table<'a> {
    entries: &'a [Entry],
    /// The table's columns; `None` when an entry's columns are unknown (no column checks then).
    columns: Option<&'a [(String, DataType)]>,
    names: Vec<String>,
}

impl Table<'_> {
    fn has(&self, name: &str) -> bool {
        self.columns.is_none_or(|c| c.iter().any(|(n, _)| n == name))
    }

    fn column_list(&self) -> String {
        let cols = self.columns.unwrap_or(&[]);
        cols.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>().join(", ")
    }
}

/// `survivorship.order_by` as read: `given` even when it had a problem (then `most_recent`
/// without a column is not reported again).
struct OrderBy {
    name: Option<String>,
    given: bool,
}

/// The position of the key `key` of the mapping `root`.
fn key_pos(root: &Node, key: &str) -> Option<Pos> {
    match &root.kind {
        Kind::Map(entries) => entries
            .iter()
            .find(|(k, _)| k.as_str() == Some(key))
            .map(|(k, _)| k.pos),
        _ => None,
    }
}

/// Can candidates be ordered by a column of this type?
fn is_orderable(t: &DataType) -> bool {
    is_string(t)
        || matches!(
            t,
            DataType::Int32
                | DataType::Int64
                | DataType::Float64
                | DataType::Decimal128(..)
                | DataType::Date32
                | DataType::Timestamp(..)
        )
}

impl Reader<'_> {
    /// The `sources:` node when the table reads several sources; `None` when it reads one
    /// `source:`. Both keys, or `survivorship`/`conflicts` without `sources`, are reported.
    pub(super) fn sources_node<'n>(&mut self, root: &Node, map: &MapNode<'n>) -> Option<&'n Node> {
        let node = map.get("sources");
        if node.is_some() && map.get("source").is_some() {
            let pos = key_pos(root, "sources").unwrap_or(map.pos);
            self.err(
                pos,
                "a table reads either \"source\" (one bronze source) or \"sources\" (a list of several, in precedence order), not both",
            );
            return None;
        }
        if node.is_none() {
            for key in ["survivorship", "conflicts"] {
                if map.get(key).is_some() {
                    let pos = key_pos(root, key).unwrap_or(map.pos);
                    self.err(
                        pos,
                        format!(
                            "\"{key}\" is only for a table with \"sources:\" (several sources); this one reads one \"source\""
                        ),
                    );
                }
            }
        }
        node
    }

    /// `sources:`, `survivorship:` and `conflicts:`: the first source's name, the columns the
    /// top-level steps see, and the sources (`None` when something is unknown).
    pub(super) fn read_sources(
        &mut self,
        root: &Node,
        map: &MapNode<'_>,
        node: &Node,
    ) -> (Option<String>, Option<Columns>, Option<Sources>) {
        self.several_sources = true;
        let mut entries = Vec::new();
        if let Some(items) = seq(self.file, node, "sources", self.problems) {
            if items.is_empty() {
                self.err(
                    node.pos,
                    "sources must list at least one source (a mapping such as \"- source: crm\")",
                );
            }
            let mut seen: HashMap<String, usize> = HashMap::new();
            for (i, item) in items.iter().enumerate() {
                if let Some(e) = self.read_entry(item, i, &mut seen) {
                    entries.push(e);
                }
            }
        }
        self.check_ranks(&entries);
        self.check_keys(&entries);
        self.check_shared_keys(&entries);
        let columns = self.union_columns(&entries);
        let table = Table {
            entries: &entries,
            columns: columns.as_deref(),
            names: entries.iter().filter_map(|e| e.source.clone()).collect(),
        };
        let mut groups = Vec::new();
        let survivorship = match map.get("survivorship") {
            Some(n) => self.read_survivorship(n, &table, &mut groups),
            None => Some(Survivorship::default()),
        };
        let conflicts = match map.get("conflicts") {
            Some(n) => self.read_conflicts(n, &table, &groups),
            None => Some(Conflicts::default()),
        };
        let cols = self.merged_columns(columns.as_deref());
        let first = entries.first().and_then(|e| e.source.clone());
        let sources = (|| {
            let mut out = Vec::with_capacity(entries.len());
            for e in entries {
                out.push(SourceEntry {
                    source: e.source?,
                    rank: e.rank?,
                    key_namespace: e.key_namespace,
                    shared_key: e.shared_key.into_iter().map(|(n, _)| n).collect(),
                    steps: e.steps,
                    input_schema: e.input?.df_schema(),
                    output_schema: e.output?.df_schema(),
                    pos: e.pos,
                });
            }
            Some(Sources {
                entries: out,
                columns: columns?,
                survivorship: survivorship?,
                conflicts: conflicts?,
                pos: key_pos(root, "sources").unwrap_or(node.pos),
            })
        })();
        (first, cols, sources)
    }

    /// One entry of `sources:` (its `index` gives the default rank).
    fn read_entry(&mut self, item: &Node, index: usize, seen: &mut HashMap<String, usize>) -> Option<Entry> {
        let map = self.map_node(item, "a sources entry", ENTRY_KEYS)?;
        let mut contract = None;
        let (source, source_pos) = match map.get("source") {
            None => {
                self.err(
                    map.pos,
                    "a sources entry is missing \"source\" (the contract whose rows it reads)",
                );
                (None, map.pos)
            }
            Some(n) => match scalar_str(self.file, n, "source", self.problems) {
                None => (None, n.pos),
                Some(s) => {
                    if let Some(line) = seen.get(s) {
                        self.err(
                            n.pos,
                            format!("source \"{s}\" is listed twice in sources (first at line {line}); list each source once"),
                        );
                    } else {
                        seen.insert(s.to_string(), n.pos.line);
                        contract = self.contract_of(s, n.pos);
                    }
                    (Some(s.to_string()), n.pos)
                }
            },
        };
        let (rank, rank_pos) = match map.get("rank") {
            None => (u32::try_from(index + 1).ok(), None),
            Some(n) => {
                let rank = scalar_int(self.file, n, "rank", 1, self.problems).and_then(|r| {
                    let ok = u32::try_from(r).ok().filter(|r| i32::try_from(*r).is_ok());
                    if ok.is_none() {
                        self.err(n.pos, format!("rank {r} is too large (at most {})", i32::MAX));
                    }
                    ok
                });
                (rank, Some(n.pos))
            }
        };
        let key_namespace = map.get("key_namespace").and_then(|n| {
            let s = scalar_str(self.file, n, "key_namespace", self.problems)?;
            if !is_valid_name(s) {
                self.err(
                    n.pos,
                    format!("key_namespace \"{s}\" must match [a-z][a-z0-9_]{{0,62}}"),
                );
                return None;
            }
            Some(s.to_string())
        });
        let shared_key_pos = map.get("shared_key").map(|n| n.pos);
        let shared_key = match map.get("shared_key") {
            Some(n) => seq(self.file, n, "shared_key", self.problems)
                .unwrap_or(&[])
                .iter()
                .filter_map(|item| {
                    scalar_str(self.file, item, "a shared_key entry (a resolve name)", self.problems)
                        .map(|s| (s.to_string(), item.pos))
                })
                .collect(),
            None => Vec::new(),
        };
        self.protected.clear();
        let mut cols = contract.as_ref().map(|c| self.input_columns(c));
        let input = cols.clone();
        let steps = match map.get("steps") {
            Some(n) => self.entry_steps(n, &mut cols),
            None => Vec::new(),
        };
        Some(Entry {
            source,
            source_pos,
            contract,
            rank,
            rank_pos,
            key_namespace,
            shared_key,
            shared_key_pos,
            steps,
            input,
            output: cols,
            pos: map.pos,
        })
    }

    /// An entry's `steps:`, read like the top-level ones; a `filter` is refused.
    fn entry_steps(&mut self, node: &Node, cols: &mut Option<Columns>) -> Vec<Step> {
        let mut out = Vec::new();
        let Some(items) = seq(self.file, node, "steps", self.problems) else {
            return out;
        };
        for item in items {
            let filter = match &item.kind {
                Kind::Map(entries) => entries.iter().find(|(k, _)| k.as_str() == Some("filter")),
                _ => None,
            };
            if let Some((k, _)) = filter {
                self.err(
                    k.pos,
                    "a source's steps cannot filter rows: a record must be a candidate of every source that has it; put the filter in the top-level steps",
                );
                continue;
            }
            if let Some(step) = self.read_step(item, cols) {
                out.push(step);
            }
        }
        out
    }

    /// Ranks must not decrease along the list.
    fn check_ranks(&mut self, entries: &[Entry]) {
        let mut prev: Option<(u32, &str)> = None;
        for e in entries {
            let Some(rank) = e.rank else { continue };
            let name = e.source.as_deref().unwrap_or("");
            if let Some((p, p_name)) = prev
                && rank < p
            {
                let (pos, how) = match e.rank_pos {
                    Some(pos) => (pos, ""),
                    None => (e.source_pos, " (its position in the list)"),
                };
                self.err(
                    pos,
                    format!(
                        "rank {rank}{how} of source \"{name}\" is below rank {p} of \"{p_name}\" listed before it; ranks must not decrease along the list: list the sources in precedence order"
                    ),
                );
            }
            if prev.is_none_or(|(p, _)| rank >= p) {
                prev = Some((rank, name));
            }
        }
    }

    /// The table's columns: every entry's output columns but the bronze bookkeeping ones, in
    /// order of first appearance, one type each; `None` when an entry's columns are unknown.
    fn union_columns(&mut self, entries: &[Entry]) -> Option<Vec<(String, DataType)>> {
        let meta: Vec<String> = meta_fields().iter().map(|f| f.name().clone()).collect();
        let mut out: Vec<(String, Option<DataType>, &str)> = Vec::new();
        let mut known = true;
        for e in entries {
            let Some(cols) = &e.output else {
                known = false;
                continue;
            };
            let name = e.source.as_deref().unwrap_or("");
            for col in &cols.cols {
                if meta.contains(&col.name) {
                    continue;
                }
                if PROVENANCE_COLUMNS.contains(&col.name.as_str()) {
                    // steps cannot make one (reported there); a resolve value can be named so
                    if e.input.as_ref().is_some_and(|i| i.find(&col.name).is_some()) {
                        self.err(
                            e.pos,
                            format!(
                                "source \"{name}\": its contract's resolve value \"{}\" takes the name of a provenance column ingot maintains; name it otherwise with \"as:\" in contract \"{name}\"",
                                col.name
                            ),
                        );
                    }
                    continue;
                }
                // a string is a string: the build casts each source's to the table's type
                let ty = col
                    .ty
                    .as_ref()
                    .map(|t| if is_string(t) { DataType::Utf8 } else { t.clone() });
                let Some(have) = out.iter_mut().find(|(n, _, _)| *n == col.name) else {
                    out.push((col.name.clone(), ty, name));
                    continue;
                };
                match (&have.1, &ty) {
                    (Some(a), Some(b)) if a != b => {
                        // types one name covers (timestamp units and zones) are shown as Arrow's
                        let (ta, tb) = match (type_name(a), type_name(b)) {
                            (x, y) if x == y => (a.to_string(), b.to_string()),
                            other => other,
                        };
                        let msg = format!(
                            "column \"{}\" is {ta} in source \"{}\" but {tb} in source \"{name}\"; a column has one type in the table: add a cast step to the steps of \"{name}\" (cast: {{{}: {}}})",
                            col.name,
                            have.2,
                            col.name,
                            type_name(a)
                        );
                        self.err(e.pos, msg);
                    }
                    (None, Some(b)) => have.1 = Some(b.clone()),
                    _ => {}
                }
            }
        }
        known.then(|| {
            out.into_iter()
                .map(|(n, t, _)| (n, t.unwrap_or(DataType::Null)))
                .collect()
        })
    }

    /// The columns the top-level steps see; the bronze and provenance columns are protected.
    fn merged_columns(&mut self, columns: Option<&[(String, DataType)]>) -> Option<Columns> {
        self.protected.clear();
        for f in meta_fields() {
            self.protected
                .insert(f.name().clone(), "a bronze column ingot maintains".to_string());
        }
        for p in PROVENANCE_COLUMNS {
            self.protected.insert(
                p.to_string(),
                "a provenance column ingot maintains (which sources gave the row, and its conflicts)".to_string(),
            );
        }
        let mut cols = Columns::default();
        for f in merged_fields(columns?) {
            let ty = Some(f.data_type().clone()).filter(|t| *t != DataType::Null);
            cols.set(f.name(), ty);
        }
        Some(cols)
    }

    // ---- survivorship ------------------------------------------------------------------

    /// `survivorship:`; `None` with a problem, but its groups are kept for `conflicts`.
    fn read_survivorship(&mut self, node: &Node, t: &Table<'_>, groups_out: &mut Vec<Group>) -> Option<Survivorship> {
        let map = self.map_node(node, "survivorship", SURVIVORSHIP_KEYS)?;
        let before = self.problems.items.len();
        let order_by = OrderBy {
            name: map.get("order_by").and_then(|n| self.order_column(n, "order_by", t)),
            given: map.get("order_by").is_some(),
        };
        let default = match map.get("default") {
            None => Some(Rule::Precedence),
            Some(n) => scalar_str(self.file, n, "default", self.problems).and_then(|s| match s {
                "precedence" => Some(Rule::Precedence),
                "most_recent" => self.most_recent_of(None, n.pos, &order_by),
                _ => {
                    self.err(
                        n.pos,
                        format!("default must be one of: precedence, most_recent; found \"{s}\""),
                    );
                    None
                }
            }),
        };
        let fallback = default.clone().unwrap_or(Rule::Precedence);
        let groups = match map.get("groups") {
            Some(n) => self.read_groups(n, t, &order_by, &fallback),
            None => Vec::new(),
        };
        let fields = match map.get("fields") {
            Some(n) => self.read_field_rules(n, t, &order_by, &groups),
            None => Default::default(),
        };
        groups_out.clone_from(&groups);
        if self.problems.items.len() > before {
            return None;
        }
        Some(Survivorship {
            default: default?,
            order_by: order_by.name,
            fields,
            groups,
        })
    }

    /// A column candidates are ordered by: a table column every source has, of an orderable type.
    fn order_column(&mut self, node: &Node, what: &str, t: &Table<'_>) -> Option<String> {
        let name = scalar_str(self.file, node, what, self.problems)?.to_string();
        let Some(columns) = t.columns else {
            return Some(name);
        };
        let Some((_, ty)) = columns.iter().find(|(n, _)| *n == name) else {
            let msg = format!(
                "unknown column \"{name}\" for {what}; the table's columns are: {}",
                t.column_list()
            );
            self.err(node.pos, msg);
            return None;
        };
        let mut ok = true;
        for e in t.entries {
            if let Some(out) = &e.output
                && out.find(&name).is_none()
            {
                self.err(
                    node.pos,
                    format!(
                        "{what} column \"{name}\" is not a column of source \"{}\" after its steps; every source must have it (rename or set it in that source's steps)",
                        e.source.as_deref().unwrap_or("")
                    ),
                );
                ok = false;
            }
        }
        if *ty != DataType::Null && !is_orderable(ty) {
            self.err(
                node.pos,
                format!(
                    "{what} column \"{name}\" must be a string, integer, float, decimal, date or timestamp column to order candidates by; it is {}",
                    type_name(ty)
                ),
            );
            ok = false;
        }
        ok.then_some(name)
    }

    /// `most_recent` by `column`, else by `order_by`.
    fn most_recent_of(&mut self, column: Option<String>, pos: Pos, order_by: &OrderBy) -> Option<Rule> {
        match column.or_else(|| order_by.name.clone()) {
            Some(c) => Some(Rule::MostRecent(c)),
            None => {
                if !order_by.given {
                    self.err(pos, MOST_RECENT_NEEDS);
                }
                None
            }
        }
    }

    /// A rule: `precedence`, `most_recent`, `{most_recent: <column>}` or `{only: <source>}`.
    fn read_rule(&mut self, node: &Node, t: &Table<'_>, order_by: &OrderBy) -> Option<Rule> {
        match &node.kind {
            Kind::Scalar { text, .. } if !node.is_null() => match text.as_str() {
                "precedence" => Some(Rule::Precedence),
                "most_recent" => self.most_recent_of(None, node.pos, order_by),
                other => {
                    self.err(
                        node.pos,
                        format!("a survivorship rule must be one of: {RULE_FORMS}; found \"{other}\""),
                    );
                    None
                }
            },
            Kind::Map(entries) if entries.len() == 1 => {
                let (k, v) = &entries[0];
                match k.as_str() {
                    Some("most_recent") => {
                        let column = self.order_column(v, "most_recent", t)?;
                        Some(Rule::MostRecent(column))
                    }
                    Some("only") => {
                        let s = scalar_str(self.file, v, "only", self.problems)?;
                        if !t.names.iter().any(|n| n == s) {
                            self.err(
                                v.pos,
                                format!(
                                    "only: \"{s}\" is not a source of this table; sources are: {}",
                                    t.names.join(", ")
                                ),
                            );
                            return None;
                        }
                        Some(Rule::Only(s.to_string()))
                    }
                    other => {
                        self.err(
                            k.pos,
                            format!(
                                "a survivorship rule must be one of: {RULE_FORMS}; found \"{{{}: ...}}\"",
                                other.unwrap_or("")
                            ),
                        );
                        None
                    }
                }
            }
            _ => {
                self.err(
                    node.pos,
                    format!(
                        "a survivorship rule must be one of: {RULE_FORMS}; found {}",
                        node.kind_name()
                    ),
                );
                None
            }
        }
    }

    /// The `(key, value)` pairs of a mapping with names as keys (`what` for the messages).
    fn named_entries<'n>(&mut self, node: &'n Node, what: &str, example: &str) -> Vec<(&'n Node, &'n str, &'n Node)> {
        let Kind::Map(entries) = &node.kind else {
            self.err(
                node.pos,
                format!("{what} must be a mapping such as {example}, found {}", node.kind_name()),
            );
            return Vec::new();
        };
        let mut out: Vec<(&Node, &str, &Node)> = Vec::new();
        for (k, v) in entries {
            let Some(name) = k.as_str().filter(|_| !k.is_null()) else {
                self.err(k.pos, format!("{what}: keys must be names"));
                continue;
            };
            if let Some((first, _, _)) = out.iter().find(|(_, n, _)| *n == name) {
                let line = first.pos.line;
                self.err(
                    k.pos,
                    format!("\"{name}\" is given twice in {what} (first at line {line})"),
                );
                continue;
            }
            out.push((k, name, v));
        }
        out
    }

    /// `survivorship.fields`: a rule per column not in a group.
    fn read_field_rules(
        &mut self,
        node: &Node,
        t: &Table<'_>,
        order_by: &OrderBy,
        groups: &[Group],
    ) -> std::collections::BTreeMap<String, Rule> {
        let mut out = std::collections::BTreeMap::new();
        for (k, name, v) in self.named_entries(node, "survivorship.fields", "{email: most_recent}") {
            if !t.has(name) {
                let msg = format!(
                    "unknown column \"{name}\" in survivorship.fields; the table's columns are: {}",
                    t.column_list()
                );
                self.err(k.pos, msg);
                continue;
            }
            if let Some(g) = groups.iter().find(|g| g.fields.iter().any(|f| f == name)) {
                self.err(
                    k.pos,
                    format!(
                        "\"{name}\" is in group \"{}\"; its rule is the group's (set it in survivorship.groups.{})",
                        g.name, g.name
                    ),
                );
                continue;
            }
            if let Some(rule) = self.read_rule(v, t, order_by) {
                out.insert(name.to_string(), rule);
            }
        }
        out
    }

    /// `survivorship.groups`: name -> {fields, rule}.
    fn read_groups(&mut self, node: &Node, t: &Table<'_>, order_by: &OrderBy, default: &Rule) -> Vec<Group> {
        let mut out: Vec<Group> = Vec::new();
        let example = "{address: {fields: [street, city], rule: precedence}}";
        for (k, name, v) in self.named_entries(node, "survivorship.groups", example) {
            let what = format!("group \"{name}\"");
            let mut name_ok = false;
            if !is_valid_name(name) {
                self.err(
                    k.pos,
                    format!("group name \"{name}\" must match [a-z][a-z0-9_]{{0,62}}"),
                );
            } else if t.columns.is_some_and(|c| c.iter().any(|(n, _)| n == name)) {
                self.err(
                    k.pos,
                    format!("group name \"{name}\" is a column of the table; give the group a name of its own"),
                );
            } else {
                name_ok = true;
            }
            let Some(map) = self.map_node(v, &what, GROUP_KEYS) else {
                continue;
            };
            let fields = match map.get("fields") {
                None => {
                    self.err(
                        map.pos,
                        format!("{what} is missing \"fields\" (a list of at least 2 columns)"),
                    );
                    Vec::new()
                }
                Some(n) => self.group_fields(n, name, t, &out),
            };
            let rule = match map.get("rule") {
                None => Some(default.clone()),
                Some(n) => self.read_rule(n, t, order_by),
            };
            // a well-named group is kept with a problem too (then the file fails), so that its
            // fields and name are not also reported elsewhere as ungrouped or unknown
            if !name_ok {
                continue;
            }
            out.push(Group {
                name: name.to_string(),
                fields,
                rule: rule.unwrap_or_else(|| default.clone()),
                pos: k.pos,
            });
        }
        out
    }

    /// A group's `fields`: at least 2 distinct table columns, none in an earlier group.
    fn group_fields(&mut self, node: &Node, group: &str, t: &Table<'_>, earlier: &[Group]) -> Vec<String> {
        let Some(items) = seq(self.file, node, "fields", self.problems) else {
            return Vec::new();
        };
        let mut out: Vec<String> = Vec::new();
        for item in items {
            let Some(name) = scalar_str(self.file, item, "a group field", self.problems) else {
                continue;
            };
            if !t.has(name) {
                let msg = format!(
                    "unknown column \"{name}\" in group \"{group}\"; the table's columns are: {}",
                    t.column_list()
                );
                self.err(item.pos, msg);
            } else if out.iter().any(|f| f == name) {
                self.err(
                    item.pos,
                    format!("column \"{name}\" is listed twice in group \"{group}\""),
                );
            } else if let Some(g) = earlier.iter().find(|g| g.fields.iter().any(|f| f == name)) {
                self.err(
                    item.pos,
                    format!(
                        "column \"{name}\" is already in group \"{}\"; a column belongs to one group at most",
                        g.name
                    ),
                );
            } else {
                out.push(name.to_string());
            }
        }
        if out.len() < 2 && items.len() == out.len() {
            self.err(
                node.pos,
                format!(
                    "group \"{group}\" needs at least 2 columns taken together; found {} (give a lone column its rule in survivorship.fields)",
                    out.len()
                ),
            );
        }
        out
    }

    // ---- conflicts ---------------------------------------------------------------------

    fn read_conflicts(&mut self, node: &Node, t: &Table<'_>, groups: &[Group]) -> Option<Conflicts> {
        let map = self.map_node(node, "conflicts", CONFLICTS_KEYS)?;
        let before = self.problems.items.len();
        let mut fields: Vec<String> = Vec::new();
        let items = match map.get("fields") {
            Some(n) => seq(self.file, n, "fields", self.problems).unwrap_or(&[]),
            None => &[],
        };
        for item in items {
            let Some(name) = scalar_str(self.file, item, "a conflicts field", self.problems) else {
                continue;
            };
            let is_group = groups.iter().any(|g| g.name == name);
            if let Some(g) = groups.iter().find(|g| g.fields.iter().any(|f| f == name)) {
                self.err(
                    item.pos,
                    format!(
                        "\"{name}\" is in group \"{}\"; name the group (\"{}\") in conflicts.fields: its fields are taken together",
                        g.name, g.name
                    ),
                );
            } else if !is_group && !t.has(name) {
                let group_names: Vec<&str> = groups.iter().map(|g| g.name.as_str()).collect();
                let msg = format!(
                    "unknown field \"{name}\" in conflicts.fields; the table's columns are: {}; its groups are: {}",
                    t.column_list(),
                    if group_names.is_empty() {
                        "(none)".to_string()
                    } else {
                        group_names.join(", ")
                    }
                );
                self.err(item.pos, msg);
            } else if fields.iter().any(|f| f == name) {
                self.err(item.pos, format!("\"{name}\" is listed twice in conflicts.fields"));
            } else {
                fields.push(name.to_string());
            }
        }
        let same_precedence = match map.get("same_precedence") {
            None => Some(SamePrecedence::Conflict),
            Some(n) => scalar_str(self.file, n, "same_precedence", self.problems).and_then(|s| match s {
                "conflict" => Some(SamePrecedence::Conflict),
                "break" => Some(SamePrecedence::Break),
                _ => {
                    self.err(
                        n.pos,
                        format!("same_precedence must be one of: conflict, break; found \"{s}\""),
                    );
                    None
                }
            }),
        };
        let on_conflict = match map.get("on_conflict") {
            None => Some(OnConflict::Flag),
            Some(n) => scalar_str(self.file, n, "on_conflict", self.problems).and_then(|s| {
                let found = [OnConflict::Hold, OnConflict::Flag, OnConflict::Reject, OnConflict::Fail]
                    .into_iter()
                    .find(|o| o.name() == s);
                if found.is_none() {
                    self.err(
                        n.pos,
                        format!(
                            "on_conflict must be one of: {}; found \"{s}\"",
                            OnConflict::NAMES.join(", ")
                        ),
                    );
                }
                found
            }),
        };
        if self.problems.items.len() > before {
            return None;
        }
        Some(Conflicts {
            fields,
            same_precedence: same_precedence?,
            on_conflict: on_conflict?,
            pos: map.pos,
        })
    }
}
