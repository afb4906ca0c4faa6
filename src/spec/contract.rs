//! Source contracts: `contracts/<source>.yaml` parsed into validated types (docs/guide.md#contracts).
//!
//! Raw YAML becomes a located tree ([`crate::spec::yaml`]), which is checked key by key into a
//! [`Contract`]. Nothing downstream sees raw YAML. Every problem is collected (not just the
//! first), each with file, line and column and, where the choices are closed, the valid ones.
//! Cross-contract references (`resolve.lookup`) are checked by [`ContractSet`].

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, Field as ArrowField, Schema, SchemaRef};
use regex::Regex;

use crate::error::{Error, Result};
use crate::hash::NormalizeStep;
use crate::spec::yaml::{self, Doc, Kind, Node, Pos, Problems};

pub use crate::spec::columns::{RESERVED_COLUMNS, timestamp_type};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Csv,
    Ndjson,
    Parquet,
}

impl Format {
    pub const NAMES: &'static [&'static str] = &["csv", "ndjson", "parquet"];
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldType {
    String,
    Int32,
    Int64,
    Float64,
    Decimal { precision: u8, scale: i8 },
    Boolean,
    Date,
    Timestamp,
}

impl FieldType {
    pub const NAMES: &'static [&'static str] = &[
        "string",
        "int32",
        "int64",
        "float64",
        "decimal(p,s)",
        "boolean",
        "date",
        "timestamp",
    ];

    pub fn parse(s: &str) -> Option<FieldType> {
        Some(match s.trim() {
            "string" => FieldType::String,
            "int32" => FieldType::Int32,
            "int64" => FieldType::Int64,
            "float64" => FieldType::Float64,
            "boolean" => FieldType::Boolean,
            "date" => FieldType::Date,
            "timestamp" => FieldType::Timestamp,
            other => {
                let inner = other.strip_prefix("decimal(")?.strip_suffix(')')?;
                let (p, s) = inner.split_once(',')?;
                let precision: u8 = p.trim().parse().ok()?;
                let scale: i8 = s.trim().parse().ok()?;
                if !(1..=38).contains(&precision) || scale < 0 || scale as u8 > precision {
                    return None;
                }
                FieldType::Decimal { precision, scale }
            }
        })
    }

    pub fn arrow_type(&self) -> DataType {
        match self {
            FieldType::String => DataType::Utf8,
            FieldType::Int32 => DataType::Int32,
            FieldType::Int64 => DataType::Int64,
            FieldType::Float64 => DataType::Float64,
            FieldType::Decimal { precision, scale } => DataType::Decimal128(*precision, *scale),
            FieldType::Boolean => DataType::Boolean,
            FieldType::Date => DataType::Date32,
            FieldType::Timestamp => timestamp_type(),
        }
    }

    pub fn name(&self) -> String {
        match self {
            FieldType::Decimal { precision, scale } => format!("decimal({precision},{scale})"),
            FieldType::String => "string".into(),
            FieldType::Int32 => "int32".into(),
            FieldType::Int64 => "int64".into(),
            FieldType::Float64 => "float64".into(),
            FieldType::Boolean => "boolean".into(),
            FieldType::Date => "date".into(),
            FieldType::Timestamp => "timestamp".into(),
        }
    }

    fn is_ordered(&self) -> bool {
        !matches!(self, FieldType::String | FieldType::Boolean)
    }
}

/// A `min` / `max` bound, already in the field's physical representation.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Bound {
    Int(i64),
    Float(f64),
    /// Unscaled decimal at the field's scale.
    Decimal(i128),
    /// Days since the epoch.
    Date(i32),
    /// Microseconds since the epoch, UTC.
    Timestamp(i64),
}

#[derive(Debug, Clone)]
pub struct Field {
    pub name: String,
    pub ty: FieldType,
    pub required: bool,
    pub normalize: Vec<NormalizeStep>,
    /// chrono strftime format for date/timestamp parsing; `None` = ISO 8601.
    pub format: Option<String>,
    pub min: Option<Bound>,
    pub max: Option<Bound>,
    pub allowed: Option<Vec<String>>,
    pub pattern: Option<Regex>,
    pub volatile: bool,
    pub description: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CsvOptions {
    pub delimiter: u8,
    pub header: bool,
    pub quote: u8,
    pub null_values: Vec<String>,
}

impl Default for CsvOptions {
    fn default() -> Self {
        CsvOptions {
            delimiter: b',',
            header: true,
            quote: b'"',
            null_values: vec![String::new()],
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnknownFields {
    Reject,
    Ignore,
}

/// What one delivered file is (contract key `delivery`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivery {
    /// The file holds some records (new and changed ones): nothing is ever deleted (default).
    Incremental,
    /// The file is the whole source: a current record whose natural key is not in it gets a
    /// tombstone version (see [`crate::ingest`]).
    Full,
}

impl Delivery {
    pub const NAMES: &[&str] = &["incremental", "full"];
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnMissing {
    Reject,
    Null,
}

#[derive(Debug, Clone)]
pub struct Resolve {
    pub name: String,
    pub from: String,
    pub lookup: String,
    pub key: String,
    pub value: String,
    pub alias: String,
    pub on_missing: OnMissing,
    pub pos: Pos,
}

#[derive(Debug, Clone)]
pub struct NaturalKey {
    pub version: i64,
    /// Indexes into [`Contract::fields`].
    pub fields: Vec<usize>,
}

#[derive(Debug, Clone)]
pub struct Contract {
    pub path: PathBuf,
    pub source: String,
    pub version: i64,
    pub description: Option<String>,
    pub format: Format,
    pub csv: CsvOptions,
    pub unknown_fields: UnknownFields,
    pub delivery: Delivery,
    pub fields: Vec<Field>,
    pub natural_key: NaturalKey,
    pub resolve: Vec<Resolve>,
}

impl Contract {
    /// The names of the natural key's fields, in key order.
    pub fn natural_key_names(&self) -> Vec<&str> {
        self.natural_key
            .fields
            .iter()
            .map(|&i| self.fields[i].name.as_str())
            .collect()
    }

    pub fn field_index(&self, name: &str) -> Option<usize> {
        self.fields.iter().position(|f| f.name == name)
    }

    pub fn field_names(&self) -> Vec<&str> {
        self.fields.iter().map(|f| f.name.as_str()).collect()
    }

    /// Arrow schema of the contract fields alone (typed, all nullable).
    pub fn fields_schema(&self) -> SchemaRef {
        Arc::new(Schema::new(
            self.fields
                .iter()
                .map(|f| ArrowField::new(&f.name, f.ty.arrow_type(), true))
                .collect::<Vec<_>>(),
        ))
    }

    /// Arrow schema of `bronze.<source>`: the contract fields then the bronze columns.
    pub fn bronze_schema(&self) -> SchemaRef {
        let mut fields: Vec<ArrowField> = self
            .fields
            .iter()
            .map(|f| ArrowField::new(&f.name, f.ty.arrow_type(), true))
            .collect();
        fields.extend(crate::spec::columns::meta_fields());
        Arc::new(Schema::new(fields))
    }

    /// Parse and validate one contract file; every problem goes into `problems`.
    pub fn from_file(path: &Path, problems: &mut Problems) -> Option<Contract> {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) => {
                problems.push(path, Pos { line: 1, column: 1 }, format!("cannot read contract: {e}"));
                return None;
            }
        };
        Self::from_str(path, &text, problems)
    }

    pub fn from_str(path: &Path, text: &str, problems: &mut Problems) -> Option<Contract> {
        let doc = yaml::parse_or_report(path, text, problems)?;
        let before = problems.items.len();
        let contract = ContractReader {
            doc: &doc,
            problems,
            names: Vec::new(),
        }
        .read();
        if problems.items.len() > before { None } else { contract }
    }
}

/// Reads a mapping node, reporting unknown and duplicate keys against the valid ones.
pub(crate) struct MapNode<'a> {
    entries: Vec<(&'a str, &'a Node, &'a Node)>,
    pub pos: Pos,
}

impl<'a> MapNode<'a> {
    /// `None` (with a problem) when `node` is not a mapping.
    pub(crate) fn new(
        file: &Path,
        node: &'a Node,
        what: &str,
        valid: &[&str],
        problems: &mut Problems,
    ) -> Option<MapNode<'a>> {
        let Kind::Map(entries) = &node.kind else {
            problems.push(
                file,
                node.pos,
                format!("{what} must be a mapping, found {}", node.kind_name()),
            );
            return None;
        };
        let mut seen = HashSet::new();
        let mut out = Vec::new();
        for (k, v) in entries {
            let Some(key) = k.as_str() else {
                problems.push(file, k.pos, format!("{what}: keys must be plain names"));
                continue;
            };
            if !valid.contains(&key) {
                problems.push(
                    file,
                    k.pos,
                    format!("unknown key \"{key}\" in {what}; valid keys are: {}", valid.join(", ")),
                );
                continue;
            }
            if !seen.insert(key) {
                problems.push(file, k.pos, format!("duplicate key \"{key}\" in {what}"));
                continue;
            }
            out.push((key, k, v));
        }
        Some(MapNode {
            entries: out,
            pos: node.pos,
        })
    }

    pub(crate) fn get(&self, key: &str) -> Option<&'a Node> {
        self.entries.iter().find(|(k, _, _)| *k == key).map(|(_, _, v)| *v)
    }
}

/// Scalar readers shared by the contract and rules validators.
pub(crate) fn scalar_str<'n>(file: &Path, node: &'n Node, what: &str, problems: &mut Problems) -> Option<&'n str> {
    match node.as_str() {
        Some(s) if !node.is_null() => Some(s),
        _ => {
            problems.push(
                file,
                node.pos,
                format!("{what} must be a text value, found {}", node.kind_name()),
            );
            None
        }
    }
}

pub(crate) fn scalar_int(file: &Path, node: &Node, what: &str, min: i64, problems: &mut Problems) -> Option<i64> {
    let s = scalar_str(file, node, what, problems)?;
    match s.trim().parse::<i64>() {
        Ok(v) if v >= min => Some(v),
        _ => {
            problems.push(
                file,
                node.pos,
                format!("{what} must be an integer >= {min}, found \"{s}\""),
            );
            None
        }
    }
}

pub(crate) fn scalar_bool(file: &Path, node: &Node, what: &str, problems: &mut Problems) -> Option<bool> {
    let s = scalar_str(file, node, what, problems)?;
    match s {
        "true" => Some(true),
        "false" => Some(false),
        _ => {
            problems.push(file, node.pos, format!("{what} must be true or false, found \"{s}\""));
            None
        }
    }
}

pub(crate) fn seq<'n>(file: &Path, node: &'n Node, what: &str, problems: &mut Problems) -> Option<&'n [Node]> {
    match &node.kind {
        Kind::Seq(items) => Some(items),
        _ => {
            problems.push(
                file,
                node.pos,
                format!("{what} must be a list, found {}", node.kind_name()),
            );
            None
        }
    }
}

pub(crate) fn is_valid_name(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_lowercase()
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'_')
}

fn is_valid_field_name(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && (b[0].is_ascii_lowercase() || b[0] == b'_')
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'_')
}

const CONTRACT_KEYS: &[&str] = &[
    "source",
    "version",
    "description",
    "format",
    "csv",
    "unknown_fields",
    "delivery",
    "fields",
    "natural_key",
    "resolve",
];
const CSV_KEYS: &[&str] = &["delimiter", "header", "quote", "null_values"];
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
    "description",
];
const NK_KEYS: &[&str] = &["version", "fields"];
const RESOLVE_KEYS: &[&str] = &["name", "from", "lookup", "key", "value", "as", "on_missing"];

struct ContractReader<'a> {
    doc: &'a Doc,
    problems: &'a mut Problems,
    /// Names of every field entry, valid or not, in order.
    names: Vec<String>,
}

impl ContractReader<'_> {
    fn err(&mut self, pos: Pos, msg: impl Into<String>) {
        self.problems.push(&self.doc.file, pos, msg);
    }

    fn read(mut self) -> Option<Contract> {
        let file = self.doc.file.clone();
        let map = MapNode::new(&file, &self.doc.root, "the contract", CONTRACT_KEYS, self.problems)?;
        let stem = file.file_stem().and_then(|s| s.to_str()).unwrap_or("").to_string();

        let source = match map.get("source") {
            None => {
                self.err(map.pos, "missing required key \"source\"");
                None
            }
            Some(n) => scalar_str(&file, n, "source", self.problems).and_then(|s| {
                if !is_valid_name(s) {
                    self.err(n.pos, format!("source \"{s}\" must match [a-z][a-z0-9_]{{0,62}}"));
                    None
                } else if s != stem {
                    self.err(n.pos, format!("source \"{s}\" must equal the file name \"{stem}\""));
                    None
                } else {
                    Some(s.to_string())
                }
            }),
        };
        let version = match map.get("version") {
            None => {
                self.err(map.pos, "missing required key \"version\"");
                None
            }
            Some(n) => scalar_int(&file, n, "version", 1, self.problems),
        };
        let description = map
            .get("description")
            .and_then(|n| scalar_str(&file, n, "description", self.problems))
            .map(str::to_string);
        let format = match map.get("format") {
            None => Some(Format::Csv),
            Some(n) => scalar_str(&file, n, "format", self.problems).and_then(|s| match s {
                "csv" => Some(Format::Csv),
                "ndjson" => Some(Format::Ndjson),
                "parquet" => Some(Format::Parquet),
                _ => {
                    self.err(
                        n.pos,
                        format!(
                            "unknown format \"{s}\"; valid formats are: {}",
                            Format::NAMES.join(", ")
                        ),
                    );
                    None
                }
            }),
        };
        let csv = match map.get("csv") {
            None => Some(CsvOptions::default()),
            Some(n) => {
                if format.is_some_and(|f| f != Format::Csv) {
                    self.err(n.pos, "csv options are only valid with format: csv");
                }
                self.read_csv(n)
            }
        };
        let unknown_fields = match map.get("unknown_fields") {
            None => Some(UnknownFields::Reject),
            Some(n) => scalar_str(&file, n, "unknown_fields", self.problems).and_then(|s| match s {
                "reject" => Some(UnknownFields::Reject),
                "ignore" => Some(UnknownFields::Ignore),
                _ => {
                    self.err(
                        n.pos,
                        format!("unknown_fields must be one of: reject, ignore; found \"{s}\""),
                    );
                    None
                }
            }),
        };
        let delivery = match map.get("delivery") {
            None => Some(Delivery::Incremental),
            Some(n) => scalar_str(&file, n, "delivery", self.problems).and_then(|s| match s {
                "incremental" => Some(Delivery::Incremental),
                "full" => Some(Delivery::Full),
                _ => {
                    self.err(
                        n.pos,
                        format!("delivery must be one of: {}; found \"{s}\"", Delivery::NAMES.join(", ")),
                    );
                    None
                }
            }),
        };
        let fields = match map.get("fields") {
            None => {
                self.err(
                    map.pos,
                    "missing required key \"fields\" (an ordered list of at least one field)",
                );
                None
            }
            Some(n) => self.read_fields(n),
        };
        let natural_key = match map.get("natural_key") {
            None => {
                self.err(map.pos, "missing required key \"natural_key\" (version and fields)");
                None
            }
            Some(n) => self.read_natural_key(n),
        };
        let resolve = match map.get("resolve") {
            None => Some(Vec::new()),
            Some(n) => self.read_resolve(n),
        };
        Some(Contract {
            path: file,
            source: source?,
            version: version?,
            description,
            format: format?,
            csv: csv?,
            unknown_fields: unknown_fields?,
            delivery: delivery?,
            fields: fields?,
            natural_key: natural_key?,
            resolve: resolve?,
        })
    }

    fn read_single_byte(&mut self, n: &Node, what: &str) -> Option<u8> {
        let file = self.doc.file.clone();
        let s = scalar_str(&file, n, what, self.problems)?;
        if s.len() == 1 && s.is_ascii() {
            Some(s.as_bytes()[0])
        } else if s == "\\t" {
            Some(b'\t')
        } else {
            self.err(n.pos, format!("{what} must be a single ASCII character, found \"{s}\""));
            None
        }
    }

    fn read_csv(&mut self, node: &Node) -> Option<CsvOptions> {
        let file = self.doc.file.clone();
        let map = MapNode::new(&file, node, "csv", CSV_KEYS, self.problems)?;
        let mut opts = CsvOptions::default();
        let mut ok = true;
        if let Some(n) = map.get("delimiter") {
            match self.read_single_byte(n, "csv.delimiter") {
                Some(b) => opts.delimiter = b,
                None => ok = false,
            }
        }
        if let Some(n) = map.get("quote") {
            match self.read_single_byte(n, "csv.quote") {
                Some(b) => opts.quote = b,
                None => ok = false,
            }
        }
        if let Some(n) = map.get("header") {
            match scalar_bool(&file, n, "csv.header", self.problems) {
                Some(b) => opts.header = b,
                None => ok = false,
            }
        }
        if let Some(n) = map.get("null_values") {
            match seq(&file, n, "csv.null_values", self.problems) {
                Some(items) => {
                    opts.null_values = items
                        .iter()
                        .filter_map(|i| match i.as_str() {
                            Some(s) => Some(s.to_string()),
                            None => {
                                self.err(i.pos, "csv.null_values entries must be text");
                                ok = false;
                                None
                            }
                        })
                        .collect()
                }
                None => ok = false,
            }
        }
        ok.then_some(opts)
    }

    /// The fields, when all are valid. Names of every entry (valid or not) go to
    /// `self.names` so later checks (natural key, duplicates) still run.
    fn read_fields(&mut self, node: &Node) -> Option<Vec<Field>> {
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
        ok.then_some(out)
    }

    /// One field entry: its name (when readable) and the field (when valid).
    fn read_field(&mut self, node: &Node) -> (Option<(String, Pos)>, Option<Field>) {
        let file = self.doc.file.clone();
        let Some(map) = MapNode::new(&file, node, "a field", FIELD_KEYS, self.problems) else {
            return (None, None);
        };
        let before = self.problems.items.len();
        let name = match map.get("name") {
            None => {
                self.err(map.pos, "field is missing \"name\"");
                None
            }
            Some(n) => scalar_str(&file, n, "field name", self.problems).and_then(|s| {
                if RESERVED_COLUMNS.contains(&s) {
                    self.err(n.pos, format!("field name \"{s}\" is reserved by ingot (docs/formats.md#tables); reserved names are: {}", RESERVED_COLUMNS.join(", ")));
                    None
                } else if !is_valid_field_name(s) {
                    self.err(n.pos, format!("field name \"{s}\" must match [a-z_][a-z0-9_]{{0,62}} (lower case, so SQL needs no quoting)"));
                    None
                } else {
                    Some(s.to_string())
                }
            }),
        };
        let label = name.clone().unwrap_or_else(|| "?".into());
        let ty = match map.get("type") {
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
        };
        let required = map
            .get("required")
            .and_then(|n| scalar_bool(&file, n, "required", self.problems))
            .unwrap_or(false);
        let volatile = map
            .get("volatile")
            .and_then(|n| scalar_bool(&file, n, "volatile", self.problems))
            .unwrap_or(false);
        let description = map
            .get("description")
            .and_then(|n| scalar_str(&file, n, "description", self.problems))
            .map(str::to_string);
        let mut normalize = Vec::new();
        if let Some(n) = map.get("normalize") {
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
        }
        let format = map.get("format").and_then(|n| {
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
        });
        let min = map
            .get("min")
            .and_then(|n| self.read_bound(n, "min", &label, ty, format.as_deref()));
        let max = map
            .get("max")
            .and_then(|n| self.read_bound(n, "max", &label, ty, format.as_deref()));
        let allowed = map.get("allowed").and_then(|n| {
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
        });
        let pattern = map.get("pattern").and_then(|n| {
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
        });
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
                description,
            }),
            _ => None,
        };
        (located, field)
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

    /// Natural key indexes refer to `self.names`, which equal the fields when all are valid.
    fn read_natural_key(&mut self, node: &Node) -> Option<NaturalKey> {
        let file = self.doc.file.clone();
        let map = MapNode::new(&file, node, "natural_key", NK_KEYS, self.problems)?;
        let version = match map.get("version") {
            None => {
                self.err(map.pos, "natural_key is missing \"version\" (an integer >= 1)");
                None
            }
            Some(n) => scalar_int(&file, n, "natural_key.version", 1, self.problems),
        };
        let names = self.names.clone();
        let idx = match map.get("fields") {
            None => {
                self.err(map.pos, "natural_key is missing \"fields\" (1..n contract fields)");
                None
            }
            Some(n) => {
                let items = seq(&file, n, "natural_key.fields", self.problems)?;
                if items.is_empty() {
                    self.err(n.pos, "natural_key.fields must name at least one field");
                    return None;
                }
                let mut out = Vec::new();
                let mut ok = true;
                for i in items {
                    let Some(s) = scalar_str(&file, i, "natural key field", self.problems) else {
                        ok = false;
                        continue;
                    };
                    match names.iter().position(|n| *n == s) {
                        Some(ix) if out.contains(&ix) => {
                            self.err(i.pos, format!("natural key field \"{s}\" is listed twice"));
                            ok = false;
                        }
                        Some(ix) => out.push(ix),
                        None => {
                            self.err(
                                i.pos,
                                format!(
                                    "natural key names unknown field \"{s}\"; fields are: {}",
                                    names.join(", ")
                                ),
                            );
                            ok = false;
                        }
                    }
                }
                ok.then_some(out)
            }
        };
        Some(NaturalKey {
            version: version?,
            fields: idx?,
        })
    }

    fn read_resolve(&mut self, node: &Node) -> Option<Vec<Resolve>> {
        let file = self.doc.file.clone();
        let items = seq(&file, node, "resolve", self.problems)?;
        let names = self.names.clone();
        let mut out = Vec::new();
        let before = self.problems.items.len();
        for item in items {
            let Some(map) = MapNode::new(&file, item, "a resolve entry", RESOLVE_KEYS, self.problems) else {
                continue;
            };
            let text = |key: &str, problems: &mut Problems| -> Option<String> {
                match map.get(key) {
                    None => {
                        problems.push(&file, map.pos, format!("resolve entry is missing \"{key}\""));
                        None
                    }
                    Some(n) => scalar_str(&file, n, key, problems).map(str::to_string),
                }
            };
            let name = text("name", self.problems);
            let from = text("from", self.problems);
            let lookup = text("lookup", self.problems);
            let key = text("key", self.problems);
            let value = text("value", self.problems);
            if let (Some(from), Some(n)) = (&from, map.get("from"))
                && !names.contains(from)
            {
                self.err(
                    n.pos,
                    format!(
                        "resolve.from names unknown field \"{from}\"; fields are: {}",
                        names.join(", ")
                    ),
                );
            }
            let alias = match map.get("as") {
                Some(n) => scalar_str(&file, n, "as", self.problems).map(str::to_string),
                None => value.clone(),
            };
            let on_missing = match map.get("on_missing") {
                None => Some(OnMissing::Reject),
                Some(n) => scalar_str(&file, n, "on_missing", self.problems).and_then(|s| match s {
                    "reject" => Some(OnMissing::Reject),
                    "null" => Some(OnMissing::Null),
                    _ => {
                        self.err(n.pos, format!("on_missing must be one of: reject, null; found \"{s}\""));
                        None
                    }
                }),
            };
            if let (Some(name), Some(from), Some(lookup), Some(key), Some(value), Some(alias), Some(on_missing)) =
                (name, from, lookup, key, value, alias, on_missing)
            {
                out.push(Resolve {
                    name,
                    from,
                    lookup,
                    key,
                    value,
                    alias,
                    on_missing,
                    pos: item.pos,
                });
            }
        }
        (self.problems.items.len() == before).then_some(out)
    }
}

/// All contracts of a directory, with cross-contract checks (`resolve.lookup`).
#[derive(Debug, Default)]
pub struct ContractSet {
    pub dir: PathBuf,
    pub contracts: BTreeMap<String, Arc<Contract>>,
}

impl ContractSet {
    /// Load every `*.yaml` in `dir`; problems of every file are collected.
    pub fn load(dir: &Path, problems: &mut Problems) -> ContractSet {
        let mut set = ContractSet {
            dir: dir.to_path_buf(),
            contracts: BTreeMap::new(),
        };
        let entries = match std::fs::read_dir(dir) {
            Ok(e) => e,
            Err(e) => {
                problems.push(
                    dir,
                    Pos { line: 0, column: 0 },
                    format!("cannot read contracts directory: {e}"),
                );
                return set;
            }
        };
        let mut paths: Vec<PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| matches!(p.extension().and_then(|e| e.to_str()), Some("yaml" | "yml")))
            .collect();
        paths.sort();
        for path in paths {
            if let Some(c) = Contract::from_file(&path, problems) {
                set.contracts.insert(c.source.clone(), Arc::new(c));
            }
        }
        set.check_references(problems);
        set
    }

    fn check_references(&self, problems: &mut Problems) {
        for c in self.contracts.values() {
            for r in &c.resolve {
                match self.contracts.get(&r.lookup) {
                    None => problems.push(
                        &c.path,
                        r.pos,
                        format!(
                            "resolve \"{}\" looks up unknown source \"{}\"; sources are: {}",
                            r.name,
                            r.lookup,
                            self.names().join(", ")
                        ),
                    ),
                    Some(l) => {
                        for (what, f) in [("key", &r.key), ("value", &r.value)] {
                            if l.field_index(f).is_none() {
                                problems.push(
                                    &c.path,
                                    r.pos,
                                    format!(
                                        "resolve \"{}\": {what} \"{f}\" is not a field of \"{}\"; its fields are: {}",
                                        r.name,
                                        r.lookup,
                                        l.field_names().join(", ")
                                    ),
                                );
                            }
                        }
                    }
                }
            }
        }
    }

    pub fn names(&self) -> Vec<&str> {
        self.contracts.keys().map(String::as_str).collect()
    }

    /// Load just the contract for `source`, failing with every problem of its file.
    pub fn load_one(dir: &Path, source: &str) -> Result<Arc<Contract>> {
        let path = dir.join(format!("{source}.yaml"));
        if !path.exists() {
            let mut problems = Problems::default();
            let set = ContractSet::load(dir, &mut problems);
            return Err(Error::Invalid(format!(
                "no contract for source \"{source}\": {} does not exist; known sources: {}",
                path.display(),
                if set.contracts.is_empty() {
                    "(none)".to_string()
                } else {
                    set.names().join(", ")
                }
            )));
        }
        let mut problems = Problems::default();
        match Contract::from_file(&path, &mut problems) {
            Some(c) if problems.is_empty() => Ok(Arc::new(c)),
            _ => Err(Error::Config(problems.items)),
        }
    }
}
