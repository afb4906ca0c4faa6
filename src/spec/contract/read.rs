//! The contract reader: top-level keys, `csv`, `natural_key` and `resolve` (fields are in
//! `field`). Every check reports a located problem and goes on, so one pass finds them all.

use std::path::Path;

use super::{Contract, CsvOptions, Delivery, Format, NaturalKey, OnMissing, Resolve, UnknownFields};
use crate::spec::yaml::{
    Doc, Kind, MapNode, Node, Pos, Problems, is_valid_name, scalar_bool, scalar_int, scalar_str, seq,
};

const CONTRACT_KEYS: &[&str] = &[
    "source",
    "version",
    "description",
    "format",
    "csv",
    "unknown_fields",
    "delivery",
    "hold",
    "fields",
    "natural_key",
    "resolve",
    "api",
];
const CSV_KEYS: &[&str] = &["delimiter", "header", "quote", "null_values"];
const NK_KEYS: &[&str] = &["version", "fields"];
const RESOLVE_KEYS: &[&str] = &["name", "from", "lookup", "key", "value", "as", "on_missing"];

/// Reads one parsed contract file, pushing every problem into `problems`.
pub(super) struct ContractReader<'a> {
    pub(super) doc: &'a Doc,
    pub(super) problems: &'a mut Problems,
    /// Names of every field entry, valid or not, in order.
    pub(super) names: Vec<String>,
}

impl<'a> ContractReader<'a> {
    pub(super) fn new(doc: &'a Doc, problems: &'a mut Problems) -> ContractReader<'a> {
        ContractReader {
            doc,
            problems,
            names: Vec::new(),
        }
    }
}

impl ContractReader<'_> {
    pub(super) fn err(&mut self, pos: Pos, msg: impl Into<String>) {
        self.problems.push(&self.doc.file, pos, msg);
    }

    /// The contract, when every key is valid; `None` when any problem was reported.
    pub(super) fn read(mut self) -> Option<Contract> {
        let file = self.doc.file.clone();
        let map = MapNode::new(&file, &self.doc.root, "the contract", CONTRACT_KEYS, self.problems)?;
        let source = self.read_source(&file, &map);
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
            Some(n) => self.read_format(n),
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
            Some(n) => self.read_unknown_fields(n),
        };
        let delivery = match map.get("delivery") {
            None => Some(Delivery::Incremental),
            Some(n) => self.read_delivery(n),
        };
        let hold = self.read_hold(map.get("hold"), delivery);
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
        let format_pos = map.get("format").map_or(map.pos, |n| n.pos);
        let api_key_pos = match &self.doc.root.kind {
            Kind::Map(entries) => entries
                .iter()
                .find(|(k, _)| k.as_str() == Some("api"))
                .map(|(k, _)| k.pos),
            _ => None,
        };
        let api = self.read_api(
            map.get("api").zip(api_key_pos),
            format_pos,
            format,
            fields.as_deref(),
            delivery,
        );
        if let (Some(fields), Some(key), Some(n)) = (&fields, &natural_key, map.get("natural_key")) {
            for &i in &key.fields {
                if fields[i].may_be_missing {
                    self.err(
                        n.pos,
                        format!(
                            "natural key field \"{}\" says missing: null; a key field must be in every file \
                             (a file without it could not name its records)",
                            fields[i].name
                        ),
                    );
                }
            }
        }
        Some(Contract {
            path: file,
            source: source?,
            version: version?,
            description,
            format: format?,
            csv: csv?,
            unknown_fields: unknown_fields?,
            delivery: delivery?,
            hold: hold?,
            fields: fields?,
            natural_key: natural_key?,
            resolve: resolve?,
            api: api?,
        })
    }

    /// `source`: required, a valid name, equal to the file name's stem.
    fn read_source(&mut self, file: &Path, map: &MapNode<'_>) -> Option<String> {
        let stem = file.file_stem().and_then(|s| s.to_str()).unwrap_or("").to_string();
        match map.get("source") {
            None => {
                self.err(map.pos, "missing required key \"source\"");
                None
            }
            Some(n) => scalar_str(file, n, "source", self.problems).and_then(|s| {
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
        }
    }

    fn read_format(&mut self, n: &Node) -> Option<Format> {
        let file = self.doc.file.clone();
        scalar_str(&file, n, "format", self.problems).and_then(|s| match s {
            "csv" => Some(Format::Csv),
            "ndjson" => Some(Format::Ndjson),
            "parquet" => Some(Format::Parquet),
            "api" => Some(Format::Api),
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
        })
    }

    fn read_unknown_fields(&mut self, n: &Node) -> Option<UnknownFields> {
        let file = self.doc.file.clone();
        scalar_str(&file, n, "unknown_fields", self.problems).and_then(|s| match s {
            "reject" => Some(UnknownFields::Reject),
            "ignore" => Some(UnknownFields::Ignore),
            _ => {
                self.err(
                    n.pos,
                    format!("unknown_fields must be one of: reject, ignore; found \"{s}\""),
                );
                None
            }
        })
    }

    fn read_delivery(&mut self, n: &Node) -> Option<Delivery> {
        let file = self.doc.file.clone();
        scalar_str(&file, n, "delivery", self.problems).and_then(|s| match s {
            "incremental" => Some(Delivery::Incremental),
            "full" => Some(Delivery::Full),
            _ => {
                self.err(
                    n.pos,
                    format!("delivery must be one of: {}; found \"{s}\"", Delivery::NAMES.join(", ")),
                );
                None
            }
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
