//! One entry of a contract's `fields`: its name, type and the checks that depend on the type
//! (`normalize`, `format`, `min`/`max`, `allowed`, `pattern`). A key that does not fit the type
//! is reported, never ignored.

use std::collections::BTreeMap;

use regex::Regex;

use super::read::ContractReader;
use super::{Bound, Field, FieldType, RESERVED_COLUMNS};
use crate::hash::NormalizeStep;
use crate::spec::columns::is_column_name;
use crate::spec::yaml::{Kind, MapNode, Node, Pos, scalar_bool, scalar_str, seq};

const FIELD_KEYS: &[&str] = &[
    "name",
    "type",
    "required",
    "normalize",
    "format",
    "min",
    "max",
    "allowed",
    "pattern",
    "volatile",
    "missing",
    "renamed_from",
    "older_values",
    "description",
    "source_name",
];

impl ContractReader<'_> {
    /// The fields, when all are valid. Names of every entry (valid or not) go to
    /// `self.names` so later checks (natural key, duplicates) still run.
    pub(super) fn read_fields(&mut self, node: &Node) -> Option<Vec<Field>> {
        let file = self.doc.file.clone();
        let items = seq(&file, node, "fields", self.problems)?;
        if items.is_empty() {
            self.err(node.pos, "fields must list at least one field");
            return None;
        }
        let mut out = Vec::new();
        let mut ok = true;
        let mut seen: BTreeMap<String, Pos> = BTreeMap::new();
        for item in items {
            let (name, field) = self.read_field(item);
            if let Some((name, pos)) = &name {
                if let Some(first) = seen.get(name) {
                    self.err(
                        *pos,
                        format!("duplicate field \"{name}\" (first defined at line {})", first.line),
                    );
                    ok = false;
                } else {
                    seen.insert(name.clone(), *pos);
                    self.names.push(name.clone());
                }
            }
            match field {
                Some(f) => out.push(f),
                None => ok = false,
            }
        }
        // each input column or key feeds one field
        let mut inputs: BTreeMap<&str, &str> = BTreeMap::new();
        for f in &out {
            if let Some(other) = inputs.insert(f.input_name(), &f.name) {
                let pos = seen.get(&f.name).copied().unwrap_or_default();
                self.err(
                    pos,
                    format!(
                        "fields \"{other}\" and \"{}\" both read the input's \"{}\"; give one of them another \
                         source_name",
                        f.name,
                        f.input_name()
                    ),
                );
                ok = false;
            }
        }
        for f in &out {
            if let Some(old) = &f.renamed_from
                && let Some(pos) = seen.get(old)
            {
                self.err(
                    *pos,
                    format!(
                        "field \"{}\" says renamed_from: {old}, but \"{old}\" is a field of the contract too; a \
                         renamed field's old name must be free",
                        f.name
                    ),
                );
                ok = false;
            }
        }
        ok.then_some(out)
    }

    /// One field entry: its name (when readable) and the field (when valid).
    fn read_field(&mut self, node: &Node) -> (Option<(String, Pos)>, Option<Field>) {
        let file = self.doc.file.clone();
        let Some(map) = MapNode::new(&file, node, "a field", FIELD_KEYS, self.problems) else {
            return (None, None);
        };
        let before = self.problems.items.len();
        let name = self.read_field_name(&map);
        let label = name.clone().unwrap_or_else(|| "?".into());
        let ty = self.read_field_type(&map, &label);
        let required = map
            .get("required")
            .and_then(|n| scalar_bool(&file, n, "required", self.problems))
            .unwrap_or(false);
        let volatile = map
            .get("volatile")
            .and_then(|n| scalar_bool(&file, n, "volatile", self.problems))
            .unwrap_or(false);
        let may_be_missing = map.get("missing").and_then(|n| self.read_missing(n, &label, required));
        let renamed_from = map.get("renamed_from").and_then(|n| self.read_renamed_from(n, &label));
        let cast_older = map.get("older_values").and_then(|n| self.read_older_values(n, &label));
        let description = map
            .get("description")
            .and_then(|n| scalar_str(&file, n, "description", self.problems))
            .map(str::to_string);
        let source_name = map.get("source_name").and_then(|n| self.read_source_name(n, &label));
        let normalize = match map.get("normalize") {
            Some(n) => self.read_normalize(n, &label, ty),
            None => Vec::new(),
        };
        let format = map.get("format").and_then(|n| self.read_date_format(n, &label, ty));
        let min = map
            .get("min")
            .and_then(|n| self.read_bound(n, "min", &label, ty, format.as_deref()));
        let max = map
            .get("max")
            .and_then(|n| self.read_bound(n, "max", &label, ty, format.as_deref()));
        let allowed = map.get("allowed").and_then(|n| self.read_allowed(n, &label, ty));
        let pattern = map.get("pattern").and_then(|n| self.read_pattern(n, &label, ty));
        let located = name.clone().zip(map.get("name").map(|n| n.pos));
        if self.problems.items.len() > before {
            return (located, None);
        }
        let field = match (name.clone(), ty) {
            (Some(name), Some(ty)) => Some(Field {
                name,
                ty,
                required,
                normalize,
                format,
                min,
                max,
                allowed,
                pattern,
                volatile,
                may_be_missing: may_be_missing.unwrap_or(false),
                renamed_from,
                cast_older: cast_older.unwrap_or(false),
                description,
                source_name,
            }),
            _ => None,
        };
        (located, field)
    }

    /// `missing`: `fail` (the default: a file without the column fails its run) or `null` (the
    /// column may be absent from a file; its records get null). Not for a required field.
    fn read_missing(&mut self, node: &Node, label: &str, required: bool) -> Option<bool> {
        let file = self.doc.file.clone();
        // `missing: null` is YAML's null, which is what it says
        let value = match &node.kind {
            Kind::Scalar { text, quoted: false } if matches!(text.as_str(), "null" | "Null" | "NULL" | "~") => "null",
            _ => scalar_str(&file, node, "missing", self.problems)?,
        };
        let may = match value {
            "fail" => false,
            "null" => true,
            other => {
                self.problems.push(
                    &file,
                    node.pos,
                    format!("missing: \"{other}\" for field \"{label}\"; valid values are: fail, null"),
                );
                return None;
            }
        };
        if may && required {
            self.problems.push(
                &file,
                node.pos,
                format!("field \"{label}\" is required, so it cannot be missing: null"),
            );
            return None;
        }
        Some(may)
    }

    /// `source_name`: what the input calls the field (any text: `orderId`, `status`,
    /// `Booking Ref`), when it is not the field's name.
    fn read_source_name(&mut self, node: &Node, label: &str) -> Option<String> {
        let file = self.doc.file.clone();
        let s = scalar_str(&file, node, "source_name", self.problems)?;
        if s.is_empty() || s.len() > 1024 || s.chars().any(char::is_control) {
            self.err(
                node.pos,
                format!(
                    "source_name for field \"{label}\" must be the input's name for it: 1 to 1024 characters, no \
                     control characters"
                ),
            );
            return None;
        }
        (s != label).then(|| s.to_string())
    }

    /// `renamed_from`: the name the field had in runs loaded before it was renamed (those runs
    /// read it under its new name). A column name; another field may not have it.
    fn read_renamed_from(&mut self, node: &Node, label: &str) -> Option<String> {
        let file = self.doc.file.clone();
        let s = scalar_str(&file, node, "renamed_from", self.problems)?;
        // a name beginning with the reserved prefix stays a valid old name: renaming away from it
        // is how a contract written before the prefix was reserved reads its runs
        if !is_column_name(s) || RESERVED_COLUMNS.contains(&s) {
            self.err(
                node.pos,
                format!(
                    "renamed_from: \"{s}\" for field \"{label}\" is not a field name ([a-z_][a-z0-9_]{{0,62}}, not reserved)"
                ),
            );
            return None;
        }
        if s == label {
            self.err(node.pos, format!("field \"{label}\" says renamed_from its own name"));
            return None;
        }
        Some(s.to_string())
    }

    /// `older_values: cast`: values of runs loaded when the field had another type read with
    /// `TRY_CAST` (null where a value does not convert). Without it, such a type change is refused.
    fn read_older_values(&mut self, node: &Node, label: &str) -> Option<bool> {
        let file = self.doc.file.clone();
        match scalar_str(&file, node, "older_values", self.problems)? {
            "cast" => Some(true),
            other => {
                self.err(
                    node.pos,
                    format!("older_values: \"{other}\" for field \"{label}\"; the valid value is: cast"),
                );
                None
            }
        }
    }

    /// `name`: required, not reserved, lower case so SQL needs no quoting.
    fn read_field_name(&mut self, map: &MapNode<'_>) -> Option<String> {
        let file = self.doc.file.clone();
        match map.get("name") {
            None => {
                self.err(map.pos, "field is missing \"name\"");
                None
            }
            Some(n) => scalar_str(&file, n, "field name", self.problems).and_then(|s| {
                if crate::spec::columns::is_reserved(s) {
                    self.err(n.pos, format!("field name \"{s}\" is reserved by ingot (docs/formats.md#tables); reserved names are: {}, and every name beginning with {}", RESERVED_COLUMNS.join(", "), crate::spec::columns::RESERVED_PREFIX));
                    None
                } else if !is_column_name(s) {
                    self.err(n.pos, format!("field name \"{s}\" must match [a-z_][a-z0-9_]{{0,62}} (lower case, so SQL needs no quoting)"));
                    None
                } else {
                    Some(s.to_string())
                }
            }),
        }
    }

    /// `type`: required, one of [`FieldType::NAMES`].
    fn read_field_type(&mut self, map: &MapNode<'_>, label: &str) -> Option<FieldType> {
        let file = self.doc.file.clone();
        match map.get("type") {
            None => {
                self.err(map.pos, format!("field \"{label}\" is missing \"type\"; valid types are: {}", FieldType::NAMES.join(", ")));
                None
            }
            Some(n) => scalar_str(&file, n, "type", self.problems).and_then(|s| match FieldType::parse(s) {
                Some(t) => Some(t),
                None => {
                    self.err(n.pos, format!("unknown type \"{s}\" for field \"{label}\"; valid types are: {} (decimal precision 1..=38, 0 <= scale <= precision)", FieldType::NAMES.join(", ")));
                    None
                }
            }),
        }
    }

    /// `normalize`: the valid steps of the list; string fields only.
    fn read_normalize(&mut self, n: &Node, label: &str, ty: Option<FieldType>) -> Vec<NormalizeStep> {
        let file = self.doc.file.clone();
        let mut normalize = Vec::new();
        if let Some(items) = seq(&file, n, "normalize", self.problems) {
            for i in items {
                if let Some(s) = scalar_str(&file, i, "normalize step", self.problems) {
                    match NormalizeStep::parse(s) {
                        Some(step) => normalize.push(step),
                        None => self.err(
                            i.pos,
                            format!(
                                "unknown normalize step \"{s}\"; valid steps are: {}",
                                NormalizeStep::NAMES.join(", ")
                            ),
                        ),
                    }
                }
            }
        }
        if ty.is_some_and(|t| t != FieldType::String) {
            self.err(
                n.pos,
                format!(
                    "normalize applies to string fields only; \"{label}\" is {}",
                    ty.map(|t| t.name()).unwrap_or_default()
                ),
            );
        }
        normalize
    }

    /// `format`: a chrono strftime format; date and timestamp fields only.
    fn read_date_format(&mut self, n: &Node, label: &str, ty: Option<FieldType>) -> Option<String> {
        let file = self.doc.file.clone();
        let s = scalar_str(&file, n, "format", self.problems)?;
        if !matches!(ty, Some(FieldType::Date | FieldType::Timestamp)) {
            self.err(
                n.pos,
                format!(
                    "format applies to date and timestamp fields only; \"{label}\" is {}",
                    ty.map(|t| t.name()).unwrap_or_default()
                ),
            );
            return None;
        }
        if chrono::format::StrftimeItems::new(s).any(|i| matches!(i, chrono::format::Item::Error)) {
            self.err(
                n.pos,
                format!("invalid chrono strftime format \"{s}\" (e.g. \"%d/%m/%Y\", \"%Y-%m-%d %H:%M:%S\")"),
            );
            return None;
        }
        Some(s.to_string())
    }

    /// `allowed`: the list of allowed values; string fields only.
    fn read_allowed(&mut self, n: &Node, label: &str, ty: Option<FieldType>) -> Option<Vec<String>> {
        let file = self.doc.file.clone();
        let items = seq(&file, n, "allowed", self.problems)?;
        if ty != Some(FieldType::String) {
            self.err(
                n.pos,
                format!(
                    "allowed applies to string fields only; \"{label}\" is {}",
                    ty.map(|t| t.name()).unwrap_or_default()
                ),
            );
            return None;
        }
        Some(
            items
                .iter()
                .filter_map(|i| scalar_str(&file, i, "allowed value", self.problems).map(str::to_string))
                .collect(),
        )
    }

    /// `pattern`: a regular expression; string fields only.
    fn read_pattern(&mut self, n: &Node, label: &str, ty: Option<FieldType>) -> Option<Regex> {
        let file = self.doc.file.clone();
        let s = scalar_str(&file, n, "pattern", self.problems)?;
        if ty != Some(FieldType::String) {
            self.err(
                n.pos,
                format!(
                    "pattern applies to string fields only; \"{label}\" is {}",
                    ty.map(|t| t.name()).unwrap_or_default()
                ),
            );
            return None;
        }
        match Regex::new(s) {
            Ok(r) => Some(r),
            Err(e) => {
                self.err(n.pos, format!("invalid pattern for \"{label}\": {e}"));
                None
            }
        }
    }

    fn read_bound(
        &mut self,
        n: &Node,
        what: &str,
        label: &str,
        ty: Option<FieldType>,
        format: Option<&str>,
    ) -> Option<Bound> {
        let file = self.doc.file.clone();
        let s = scalar_str(&file, n, what, self.problems)?.trim().to_string();
        let ty = ty?;
        if !ty.is_ordered() {
            self.err(
                n.pos,
                format!(
                    "{what} applies to numeric, date and timestamp fields; \"{label}\" is {}",
                    ty.name()
                ),
            );
            return None;
        }
        let parsed = match ty {
            FieldType::Int32 | FieldType::Int64 => s.parse::<i64>().ok().map(Bound::Int),
            FieldType::Float64 => s.parse::<f64>().ok().filter(|f| !f.is_nan()).map(Bound::Float),
            FieldType::Decimal { scale, .. } => {
                crate::spec::types::parse_decimal(s.as_bytes(), scale).map(Bound::Decimal)
            }
            FieldType::Date => crate::spec::types::parse_date(&s, None)
                .or_else(|| crate::spec::types::parse_date(&s, format))
                .map(Bound::Date),
            FieldType::Timestamp => crate::spec::types::parse_timestamp(&s, None)
                .or_else(|| crate::spec::types::parse_timestamp(&s, format))
                .map(Bound::Timestamp),
            FieldType::String | FieldType::Boolean => None,
        };
        if parsed.is_none() {
            self.err(
                n.pos,
                format!(
                    "{what} \"{s}\" is not a valid {} value for field \"{label}\"",
                    ty.name()
                ),
            );
        }
        parsed
    }
}
