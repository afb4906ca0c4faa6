//! Source contracts: `contracts/<source>.yaml` parsed into validated types (docs/guide.md#contracts).
//!
//! Raw YAML becomes a located tree ([`crate::spec::yaml`]), which is checked key by key into a
//! [`Contract`]. Nothing downstream sees raw YAML. Every problem is collected (not just the
//! first), each with file, line and column and, where the choices are closed, the valid ones.
//! Cross-contract references (`resolve.lookup`) are checked by [`ContractSet`].
//!
//! The reader is in parts: `read` (top-level keys, csv, natural key, resolve), `field` (one
//! entry of `fields`), `hold`, and `api_read` with `api_parts` (the `api` section of
//! `format: api`, typed in `api`).

pub mod api;
mod api_parts;
mod api_read;
mod field;
mod hold;
mod read;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, Field as ArrowField, Schema, SchemaRef};
use regex::Regex;

use crate::error::{Error, Result};
use crate::hash::NormalizeStep;
use crate::spec::yaml::{self, Pos, Problems};
use read::ContractReader;

pub use crate::spec::columns::{RESERVED_COLUMNS, timestamp_type};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Csv,
    Ndjson,
    Parquet,
    /// Fetched from an HTTP JSON API (the contract's `api` section); no fetching is built yet.
    Api,
}

impl Format {
    pub const NAMES: &'static [&'static str] = &["csv", "ndjson", "parquet", "api"];

    pub fn name(&self) -> &'static str {
        match self {
            Format::Csv => "csv",
            Format::Ndjson => "ndjson",
            Format::Parquet => "parquet",
            Format::Api => "api",
        }
    }
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

    /// The type as a key's fingerprint sees it: its canonical text. int32 and int64 write the
    /// same text (`integer`), and a decimal's precision changes no text, its scale does.
    pub fn key_name(&self) -> String {
        match self {
            FieldType::Int32 | FieldType::Int64 => "integer".into(),
            FieldType::Decimal { scale, .. } => format!("decimal(scale {scale})"),
            other => other.name(),
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
    /// `missing: null`: a file may lack the column (its records get null); otherwise a file
    /// without it fails its run.
    pub may_be_missing: bool,
    /// `renamed_from`: the field's name in runs loaded before a rename.
    pub renamed_from: Option<String>,
    /// `older_values: cast`: runs loaded under another type read with `TRY_CAST`.
    pub cast_older: bool,
    pub description: Option<String>,
    /// `source_name`: the field's name in the input (a CSV header, a JSON key, a Parquet
    /// column) when it is not `name`, e.g. a vendor's `orderId` or `status`.
    pub source_name: Option<String>,
}

impl Field {
    /// The name the input calls this field: `source_name`, else `name`.
    pub fn input_name(&self) -> &str {
        self.source_name.as_deref().unwrap_or(&self.name)
    }
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

/// The gates that hold a run for review instead of publishing it (contract key `hold`,
/// docs/guide.md#hold-gates): its files are written, nothing of it is visible until
/// `ingot publish`.
#[derive(Debug, Clone, PartialEq)]
pub struct Hold {
    /// A full delivery that would delete more than this share of the current records is held
    /// (default 0.5; `None`: never). Always `None` for incremental deliveries.
    pub max_delete_fraction: Option<f64>,
    /// Hold a run with far fewer rows than the recent runs of the source.
    pub row_count: Option<RowCountGate>,
}

impl Hold {
    /// Default delete fraction of a full delivery.
    pub const DEFAULT_MAX_DELETE_FRACTION: f64 = 0.5;

    /// The gates of a contract without a `hold` key.
    pub fn default_for(delivery: Delivery) -> Hold {
        Hold {
            max_delete_fraction: (delivery == Delivery::Full).then_some(Hold::DEFAULT_MAX_DELETE_FRACTION),
            row_count: None,
        }
    }
}

/// `hold.row_count`: a run whose `rows_seen` is below `min_ratio_of_median` times the median
/// `rows_seen` of the source's last `window` committed runs is held.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RowCountGate {
    pub min_ratio_of_median: f64,
    pub window: u32,
}

impl RowCountGate {
    pub const DEFAULT_WINDOW: u32 = 7;
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
    /// Gates that hold a suspicious run for review (contract key `hold`).
    pub hold: Hold,
    pub fields: Vec<Field>,
    pub natural_key: NaturalKey,
    pub resolve: Vec<Resolve>,
    /// `format: api` only: how the source is fetched.
    pub api: Option<Box<api::Api>>,
}

impl Contract {
    /// What the natural key's fingerprints are computed from, apart from its version: each key
    /// field in key order with its type as canonical text sees it ([`FieldType::key_name`]) and
    /// its normalize steps, e.g. `hotel_code string [trim, upper]; booking_ref string [trim]`.
    /// Recorded with every run: a change under the same version is refused at ingest.
    pub fn key_definition(&self) -> String {
        self.natural_key
            .fields
            .iter()
            .map(|&i| {
                let f = &self.fields[i];
                let steps: Vec<&str> = f.normalize.iter().map(|s| s.name()).collect();
                format!("{} {} [{}]", f.name, f.ty.key_name(), steps.join(", "))
            })
            .collect::<Vec<_>>()
            .join("; ")
    }

    /// Every field in contract order with its type and, when so, `volatile`, e.g.
    /// `booking_id string, amount decimal(10,2), seen_at timestamp volatile`. Recorded with every
    /// run: it says which columns its bronze file has and what its `row_hash` covers.
    pub fn fields_definition(&self) -> String {
        self.fields
            .iter()
            .map(|f| {
                let v = if f.volatile { " volatile" } else { "" };
                format!("{} {}{v}", f.name, f.ty.name())
            })
            .collect::<Vec<_>>()
            .join(", ")
    }

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

    /// The field an input column or key feeds: the one whose [`Field::input_name`] it is.
    pub fn input_index(&self, name: &str) -> Option<usize> {
        self.fields.iter().position(|f| f.input_name() == name)
    }

    /// The names the input gives the fields, in field order.
    pub fn input_names(&self) -> Vec<&str> {
        self.fields.iter().map(Field::input_name).collect()
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
        let contract = ContractReader::new(&doc, problems).read();
        if problems.items.len() > before { None } else { contract }
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

    /// Every contract of `dir` that loads without a problem, by source (the others are left out:
    /// what a command that only follows contracts, such as Delta publishing, can use).
    pub fn readable(dir: &Path) -> BTreeMap<String, Arc<Contract>> {
        let mut problems = Problems::default();
        let mut set = ContractSet::load(dir, &mut problems).contracts;
        set.retain(|_, c| !problems.items.iter().any(|p| p.file == c.path));
        set
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
