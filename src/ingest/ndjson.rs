//! NDJSON loader: one JSON object per line.
//!
//! A line that is not valid UTF-8, not valid JSON or not an object rejects that record (rule
//! `malformed_record`), the rest of the file loads. Numbers are typed from their source text,
//! never through a float, so decimals and large integers arrive exactly. A key that is not a contract field fails the run when the
//! contract says `unknown_fields: reject` (as an unknown CSV column does) and is dropped and
//! reported when it says `ignore`. Blank lines are skipped; record numbers count objects.

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Read};
use std::sync::Arc;

use std::borrow::Cow;
use std::collections::HashMap;

use serde_json::Value as Json;
use serde_json::value::RawValue;

use crate::error::{Error, Result};
use crate::ingest::Loader;
use crate::ingest::sink::{FieldText, ParsedBatch, RowSink};
use crate::spec::contract::{Contract, UnknownFields};

pub struct NdjsonLoader {
    input: BufReader<Box<dyn Read + Send>>,
    display: String,
    contract: Arc<Contract>,
    sink: RowSink,
    line_buf: Vec<u8>,
    line: u64,
    row_number: u64,
    bytes_read: u64,
    ignored: BTreeSet<String>,
    /// For each contract field: did any object have its key?
    seen: Vec<bool>,
    /// Lines that parsed as JSON objects.
    objects: u64,
    done: bool,
}

impl NdjsonLoader {
    pub fn open(
        contract: Arc<Contract>,
        input: Box<dyn Read + Send>,
        display: String,
        batch_size: usize,
        keep_raw: bool,
    ) -> Result<NdjsonLoader> {
        Ok(NdjsonLoader {
            input: BufReader::with_capacity(1 << 20, input),
            display,
            sink: RowSink::new(contract.clone(), batch_size, keep_raw),
            seen: vec![false; contract.fields.len()],
            contract,
            line_buf: Vec::with_capacity(4096),
            line: 0,
            row_number: 0,
            bytes_read: 0,
            ignored: BTreeSet::new(),
            objects: 0,
            done: false,
        })
    }

    fn handle_line(&mut self) -> Result<()> {
        let line_no = self.line;
        let bytes = trim_eol(&self.line_buf);
        let bytes = if line_no == 1 {
            bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(bytes)
        } else {
            bytes
        };
        if bytes.iter().all(|b| b.is_ascii_whitespace()) {
            return Ok(());
        }
        self.row_number += 1;
        let row_number = self.row_number;
        let text = match std::str::from_utf8(bytes) {
            Ok(t) => t,
            Err(e) => {
                let raw = String::from_utf8_lossy(bytes).into_owned();
                self.sink.reject_row(
                    row_number,
                    "malformed_record",
                    format!("line {line_no}: not valid UTF-8 ({e})"),
                    raw,
                );
                return Ok(());
            }
        };
        // Values are kept as their JSON source text, so a number is typed from exactly the digits
        // in the file (never through f64). A duplicate key keeps its last value.
        let obj: HashMap<String, &RawValue> = match serde_json::from_str(text) {
            Ok(map) => map,
            Err(e) => {
                let reason = match serde_json::from_str::<Json>(text) {
                    Ok(other) => format!("line {line_no}: expected a JSON object, found {}", json_kind(&other)),
                    Err(_) => format!("line {line_no}: invalid JSON: {e}"),
                };
                self.sink
                    .reject_row(row_number, "malformed_record", reason, text.to_string());
                return Ok(());
            }
        };
        self.objects += 1;
        for (i, f) in self.contract.fields.iter().enumerate() {
            if !self.seen[i] && obj.contains_key(f.input_name()) {
                self.seen[i] = true;
            }
        }
        for key in obj.keys() {
            if self.contract.input_index(key).is_none() {
                match self.contract.unknown_fields {
                    UnknownFields::Reject => {
                        return Err(Error::RunFailed(format!(
                            "{}:{line_no}: key \"{key}\" is not in contract {} (unknown_fields: reject); contract fields are: {}. \
                             Add the field to the contract or set unknown_fields: ignore",
                            self.display,
                            self.contract.path.display(),
                            self.contract.input_names().join(", ")
                        )));
                    }
                    UnknownFields::Ignore => {
                        if !self.ignored.contains(key) {
                            self.ignored.insert(key.clone());
                        }
                    }
                }
            }
        }
        let values: Vec<Scalar<'_>> = self
            .contract
            .fields
            .iter()
            .map(|f| match obj.get(f.input_name()).map(|r| r.get()) {
                None | Some("null") => Scalar::Null,
                Some(raw) if raw.starts_with('"') => match serde_json::from_str::<Cow<'_, str>>(raw) {
                    Ok(s) => Scalar::Text(s),
                    Err(_) => Scalar::Invalid("the JSON string cannot be decoded"),
                },
                Some(raw) if raw.starts_with('[') => Scalar::Invalid("expected a scalar value, found a JSON array"),
                Some(raw) if raw.starts_with('{') => Scalar::Invalid("expected a scalar value, found a JSON object"),
                Some(raw) => Scalar::Text(Cow::Borrowed(raw)),
            })
            .collect();
        self.sink.push_row(
            row_number,
            |i| match &values[i] {
                Scalar::Null => FieldText::Null,
                Scalar::Text(t) => FieldText::Text(t),
                Scalar::Invalid(why) => FieldText::Invalid(why),
            },
            || text.to_string(),
            Some(line_no),
        );
        Ok(())
    }
}

/// A field's value: JSON strings decoded, numbers and booleans as their source text.
enum Scalar<'a> {
    Null,
    Text(Cow<'a, str>),
    Invalid(&'static str),
}

fn json_kind(v: &Json) -> &'static str {
    match v {
        Json::Array(_) => "an array",
        Json::String(_) => "a string",
        Json::Number(_) => "a number",
        Json::Bool(_) => "a boolean",
        Json::Object(_) => "an object",
        Json::Null => "null",
    }
}

/// Longest line accepted.
const MAX_LINE_BYTES: u64 = 64 << 20;

fn trim_eol(b: &[u8]) -> &[u8] {
    let mut end = b.len();
    while end > 0 && (b[end - 1] == b'\n' || b[end - 1] == b'\r') {
        end -= 1;
    }
    &b[..end]
}

impl Loader for NdjsonLoader {
    fn next_batch(&mut self) -> Result<Option<ParsedBatch>> {
        while !self.done && !self.sink.is_full() {
            self.line_buf.clear();
            let n = (&mut self.input)
                .take(MAX_LINE_BYTES + 1)
                .read_until(b'\n', &mut self.line_buf)
                .map_err(|e| Error::RunInterrupted(format!("{}: read failed: {e}", self.display)))?;
            if self.line_buf.len() as u64 > MAX_LINE_BYTES {
                return Err(Error::RunFailed(format!(
                    "{}: line {}: longer than {} MiB; nothing was loaded",
                    self.display,
                    self.line + 1,
                    MAX_LINE_BYTES >> 20
                )));
            }
            if n == 0 {
                self.done = true;
                break;
            }
            self.bytes_read += n as u64;
            self.line += 1;
            self.handle_line()?;
        }
        Ok(self.sink.finish(self.bytes_read)?)
    }

    fn ignored_columns(&self) -> Vec<String> {
        self.ignored.iter().cloned().collect()
    }

    /// A declared field whose key no object of the file has (unless it says `missing: null`): the
    /// run fails, as a CSV without the column does (an upstream rename would otherwise null the
    /// field in every record).
    fn missing_fields(&self) -> Option<String> {
        let absent: Vec<&str> = self
            .contract
            .fields
            .iter()
            .zip(&self.seen)
            .filter(|(f, seen)| !**seen && !f.may_be_missing)
            .map(|(f, _)| f.input_name())
            .collect();
        if self.objects == 0 || absent.is_empty() {
            return None;
        }
        let quoted = |names: Vec<&str>| names.iter().map(|n| format!("\"{n}\"")).collect::<Vec<_>>().join(", ");
        let renamed = if self.ignored.is_empty() {
            String::new()
        } else {
            format!(
                "; the records have keys the contract does not declare: {} (renamed upstream? then give the field \
                 `source_name: <its new key>`, or rename the field and add `renamed_from: {}` to it)",
                quoted(self.ignored.iter().map(String::as_str).collect()),
                absent[0]
            )
        };
        Some(format!(
            "{}: no record has the declared key{} {}, so {} would be null in every record{renamed}. A field \
             that records may lack says `missing: null` in {}",
            self.display,
            if absent.len() > 1 { "s" } else { "" },
            quoted(absent.clone()),
            if absent.len() > 1 { "they" } else { "it" },
            self.contract.path.display()
        ))
    }
}
