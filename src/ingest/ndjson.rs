//! NDJSON loader: one JSON object per line.
//!
//! A line that is not valid UTF-8, not valid JSON or not an object rejects that record (rule
//! `json`), the rest of the file loads. A key that is not a contract field fails the run when the
//! contract says `unknown_fields: reject` (as an unknown CSV column does) and is dropped and
//! reported when it says `ignore`. Blank lines are skipped; record numbers count objects.

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Read};
use std::sync::Arc;

use serde_json::Value as Json;

use crate::contract::{Contract, UnknownFields};
use crate::error::{Error, Result};
use crate::ingest::Loader;
use crate::ingest::sink::{FieldText, ParsedBatch, RowSink};

pub struct NdjsonLoader {
    input: BufReader<Box<dyn Read + Send>>,
    display: String,
    contract: Arc<Contract>,
    sink: RowSink,
    line_buf: Vec<u8>,
    text_buf: Vec<String>,
    line: u64,
    row_number: u64,
    bytes_read: u64,
    ignored: BTreeSet<String>,
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
        let n = contract.fields.len();
        Ok(NdjsonLoader {
            input: BufReader::with_capacity(1 << 20, input),
            display,
            sink: RowSink::new(contract.clone(), batch_size, keep_raw),
            contract,
            line_buf: Vec::with_capacity(4096),
            text_buf: vec![String::new(); n],
            line: 0,
            row_number: 0,
            bytes_read: 0,
            ignored: BTreeSet::new(),
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
        let obj = match serde_json::from_str::<Json>(text) {
            Ok(Json::Object(map)) => map,
            Ok(other) => {
                let kind = match other {
                    Json::Array(_) => "an array",
                    Json::String(_) => "a string",
                    Json::Number(_) => "a number",
                    Json::Bool(_) => "a boolean",
                    _ => "null",
                };
                self.sink.reject_row(
                    row_number,
                    "malformed_record",
                    format!("line {line_no}: expected a JSON object, found {kind}"),
                    text.to_string(),
                );
                return Ok(());
            }
            Err(e) => {
                self.sink.reject_row(
                    row_number,
                    "malformed_record",
                    format!("line {line_no}: invalid JSON: {e}"),
                    text.to_string(),
                );
                return Ok(());
            }
        };
        for key in obj.keys() {
            if self.contract.field_index(key).is_none() {
                match self.contract.unknown_fields {
                    UnknownFields::Reject => {
                        return Err(Error::RunFailed(format!(
                            "{}:{line_no}: key \"{key}\" is not in contract {} (unknown_fields: reject); contract fields are: {}. \
                             Add the field to the contract or set unknown_fields: ignore",
                            self.display,
                            self.contract.path.display(),
                            self.contract.field_names().join(", ")
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
        // Non-string JSON scalars are typed from their JSON text (numbers, booleans).
        for (i, f) in self.contract.fields.iter().enumerate() {
            let buf = &mut self.text_buf[i];
            buf.clear();
            match obj.get(&f.name) {
                Some(Json::Number(n)) => {
                    use std::fmt::Write;
                    let _ = write!(buf, "{n}");
                }
                Some(Json::Bool(b)) => buf.push_str(if *b { "true" } else { "false" }),
                _ => {}
            }
        }
        let texts = &self.text_buf;
        let fields = &self.contract.fields;
        self.sink.push_row(
            row_number,
            |i| match obj.get(&fields[i].name) {
                None | Some(Json::Null) => FieldText::Null,
                Some(Json::String(s)) => FieldText::Text(s),
                Some(Json::Number(_)) | Some(Json::Bool(_)) => FieldText::Text(&texts[i]),
                Some(Json::Array(_)) => FieldText::Invalid("expected a scalar value, found a JSON array"),
                Some(Json::Object(_)) => FieldText::Invalid("expected a scalar value, found a JSON object"),
            },
            || text.to_string(),
            Some(line_no),
        );
        Ok(())
    }
}

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
            let n = self
                .input
                .read_until(b'\n', &mut self.line_buf)
                .map_err(|e| Error::RunFailed(format!("{}: read failed: {e}", self.display)))?;
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
}
