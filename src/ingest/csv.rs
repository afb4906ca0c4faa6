//! CSV loader on `csv-core`: one pass, field bytes straight into typed builders.
//!
//! `csv-core` handles quoting, quoted newlines, CRLF and a UTF-8 byte-order mark. We keep the raw
//! bytes of the current record (a slice of the read buffer, copied only when a record straddles
//! two reads) so a rejected row is logged exactly as it arrived. Header problems fail the run
//! before anything is written: a required contract field missing from the header, or a column not
//! in the contract when `unknown_fields: reject`.

use std::io::Read;
use std::sync::Arc;

use csv_core::{ReadRecordResult, Reader, ReaderBuilder};

use crate::contract::Contract;
use crate::error::{Error, Result};
use crate::ingest::Loader;
use crate::ingest::columns::match_columns;
use crate::ingest::sink::{FieldText, ParsedBatch, RowSink};

const READ_SIZE: usize = 1 << 20;

pub struct CsvLoader {
    input: Box<dyn Read + Send>,
    display: String,
    rdr: Reader,
    buf: Vec<u8>,
    pos: usize,
    len: usize,
    eof: bool,
    /// Raw bytes of a record that started in an earlier read.
    carry: Vec<u8>,
    rec_start: usize,
    out: Vec<u8>,
    ends: Vec<usize>,
    /// For each file column, the contract field it feeds.
    column_field: Vec<Option<usize>>,
    /// For each contract field, the file column it comes from.
    field_column: Vec<Option<usize>>,
    null_values: Vec<Vec<u8>>,
    sink: RowSink,
    row_number: u64,
    /// Line where the next record starts (1-based), and where the current one started.
    line: u64,
    rec_line: u64,
    ends_len: usize,
    bytes_read: u64,
    ignored: Vec<String>,
    done: bool,
    /// The last byte of the previous record was a `\r`.
    after_cr: bool,
}

enum Next {
    Record,
    End,
}

impl CsvLoader {
    pub fn open(
        contract: Arc<Contract>,
        input: Box<dyn Read + Send>,
        display: String,
        batch_size: usize,
        keep_raw: bool,
    ) -> Result<CsvLoader> {
        let opts = &contract.csv;
        let rdr = ReaderBuilder::new().delimiter(opts.delimiter).quote(opts.quote).build();
        let null_values = opts.null_values.iter().map(|s| s.as_bytes().to_vec()).collect();
        let mut me = CsvLoader {
            input,
            display,
            rdr,
            buf: vec![0; READ_SIZE],
            pos: 0,
            len: 0,
            eof: false,
            carry: Vec::new(),
            rec_start: 0,
            out: vec![0; 64 * 1024],
            ends: vec![0; 256],
            column_field: Vec::new(),
            field_column: vec![None; contract.fields.len()],
            null_values,
            sink: RowSink::new(contract.clone(), batch_size, keep_raw),
            row_number: 0,
            line: 1,
            rec_line: 1,
            ends_len: 0,
            bytes_read: 0,
            ignored: Vec::new(),
            done: false,
            after_cr: false,
        };
        me.read_header(&contract)?;
        Ok(me)
    }

    fn read_header(&mut self, contract: &Contract) -> Result<()> {
        if !contract.csv.header {
            self.column_field = (0..contract.fields.len()).map(Some).collect();
            self.field_column = (0..contract.fields.len()).map(Some).collect();
            return Ok(());
        }
        let (nfields, _) = match self.next_record()? {
            Next::End => {
                return Err(Error::RunFailed(format!(
                    "{}: the file is empty: expected a header line with the columns {}",
                    self.display,
                    contract.field_names().join(", ")
                )));
            }
            Next::Record => (self.field_count(), ()),
        };
        let mut header = Vec::with_capacity(nfields);
        for j in 0..nfields {
            let bytes = self.field(j);
            match std::str::from_utf8(bytes) {
                Ok(s) => header.push(s.trim().to_string()),
                Err(_) => {
                    return Err(Error::RunFailed(format!(
                        "{}:{}: header column {} is not valid UTF-8",
                        self.display,
                        self.rec_line,
                        j + 1
                    )));
                }
            }
        }
        let map = match_columns(
            contract,
            &header,
            &format!("{}:{}: header", self.display, self.rec_line),
        )?;
        self.column_field = map.column_field;
        self.field_column = map.field_column;
        self.ignored = map.ignored;
        Ok(())
    }

    fn field_count(&self) -> usize {
        self.ends_len
    }

    fn field(&self, j: usize) -> &[u8] {
        let start = if j == 0 { 0 } else { self.ends[j - 1] };
        &self.out[start..self.ends[j]]
    }

    fn raw_record(&self) -> &[u8] {
        trim_line(if self.carry.is_empty() {
            &self.buf[self.rec_start..self.pos]
        } else {
            &self.carry
        })
    }

    /// Read the next record into `out`/`ends`; its raw bytes are in `raw_record()`.
    fn next_record(&mut self) -> Result<Next> {
        self.carry.clear();
        self.rec_start = self.pos;
        let mut outlen = 0;
        let mut endlen = 0;
        loop {
            if self.pos == self.len && !self.eof {
                if self.rec_start < self.len {
                    self.carry.extend_from_slice(&self.buf[self.rec_start..self.len]);
                    if self.carry.len() > MAX_RECORD_BYTES {
                        return Err(Error::RunFailed(format!(
                            "{}: line {}: a record longer than {} MiB (an unterminated quote?); nothing was loaded",
                            self.display,
                            self.line,
                            MAX_RECORD_BYTES >> 20
                        )));
                    }
                }
                self.len = loop {
                    match self.input.read(&mut self.buf) {
                        Ok(n) => break n,
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                        Err(e) => return Err(Error::RunFailed(format!("{}: read failed: {e}", self.display))),
                    }
                };
                self.bytes_read += self.len as u64;
                self.pos = 0;
                self.rec_start = 0;
                if self.len == 0 {
                    self.eof = true;
                }
            }
            let input = &self.buf[self.pos..self.len];
            let (res, nin, nout, nend) = self
                .rdr
                .read_record(input, &mut self.out[outlen..], &mut self.ends[endlen..]);
            self.pos += nin;
            outlen += nout;
            endlen += nend;
            match res {
                ReadRecordResult::InputEmpty => continue,
                ReadRecordResult::OutputFull => {
                    let n = self.out.len() * 2;
                    self.out.resize(n, 0);
                }
                ReadRecordResult::OutputEndsFull => {
                    let n = self.ends.len() * 2;
                    self.ends.resize(n, 0);
                }
                ReadRecordResult::Record => {
                    if !self.carry.is_empty() {
                        self.carry.extend_from_slice(&self.buf[self.rec_start..self.pos]);
                    }
                    self.ends_len = endlen;
                    let raw: &[u8] = if self.carry.is_empty() {
                        &self.buf[self.rec_start..self.pos]
                    } else {
                        &self.carry
                    };
                    let blank = raw.iter().take_while(|&&b| b == b'\n' || b == b'\r').count();
                    let (before, lines) = (line_ends(&raw[..blank], self.after_cr), line_ends(raw, self.after_cr));
                    self.after_cr = raw.last() == Some(&b'\r');
                    self.rec_line = self.line + before;
                    self.line += lines;
                    return Ok(Next::Record);
                }
                ReadRecordResult::End => return Ok(Next::End),
            }
        }
    }
}

impl Loader for CsvLoader {
    fn next_batch(&mut self) -> Result<Option<ParsedBatch>> {
        while !self.done && !self.sink.is_full() {
            match self.next_record()? {
                Next::End => self.done = true,
                Next::Record => {
                    self.row_number += 1;
                    let line = self.rec_line;
                    let nfields = self.ends_len;
                    let row_number = self.row_number;
                    if nfields != self.column_field.len() {
                        let reason = format!(
                            "line {line}: expected {} fields, found {nfields}",
                            self.column_field.len()
                        );
                        let raw = String::from_utf8_lossy(self.raw_record()).into_owned();
                        self.sink.reject_row(row_number, "malformed_record", reason, raw);
                        continue;
                    }
                    let out = &self.out;
                    let ends = &self.ends;
                    let field_column = &self.field_column;
                    let nulls = &self.null_values;
                    let raw_record: &[u8] = if self.carry.is_empty() {
                        &self.buf[self.rec_start..self.pos]
                    } else {
                        &self.carry
                    };
                    // Every field's bytes are bytes of the record: one ASCII check (vectorized)
                    // replaces a UTF-8 validation per field for the usual record.
                    let ascii = raw_record.is_ascii();
                    self.sink.push_row(
                        row_number,
                        |i| match field_column[i] {
                            None => FieldText::Null,
                            Some(j) => {
                                let start = if j == 0 { 0 } else { ends[j - 1] };
                                let bytes = &out[start..ends[j]];
                                if nulls.iter().any(|n| n.as_slice() == bytes) {
                                    FieldText::Null
                                } else {
                                    if ascii {
                                        // SAFETY: csv-core copies field bytes out of `raw_record`, which is ASCII.
                                        return FieldText::Text(unsafe { std::str::from_utf8_unchecked(bytes) });
                                    }
                                    match std::str::from_utf8(bytes) {
                                        Ok(s) => FieldText::Text(s),
                                        Err(_) => FieldText::Invalid("value is not valid UTF-8"),
                                    }
                                }
                            }
                        },
                        || String::from_utf8_lossy(trim_line(raw_record)).into_owned(),
                        Some(line),
                    );
                }
            }
        }
        Ok(self.sink.finish(self.bytes_read)?)
    }

    fn ignored_columns(&self) -> Vec<String> {
        self.ignored.clone()
    }
}

/// Longest record accepted; a longer one is almost always an unterminated quote.
const MAX_RECORD_BYTES: usize = 64 << 20;

/// Line ends in `raw`: `\n`, `\r\n` and a lone `\r` each count once; `after_cr` says the byte
/// before `raw` was a `\r` (csv-core ends a record at the `\r` of a `\r\n`, so the `\n` may start
/// the next record's bytes).
fn line_ends(raw: &[u8], after_cr: bool) -> u64 {
    let mut n = 0;
    let mut prev_cr = after_cr;
    for &b in raw {
        if b == b'\r' {
            n += 1;
            prev_cr = true;
        } else {
            if b == b'\n' && !prev_cr {
                n += 1;
            }
            prev_cr = false;
        }
    }
    n
}

fn trim_line(raw: &[u8]) -> &[u8] {
    let mut start = 0;
    while start < raw.len() && (raw[start] == b'\n' || raw[start] == b'\r') {
        start += 1;
    }
    let mut end = raw.len();
    while end > start && (raw[end - 1] == b'\n' || raw[end - 1] == b'\r') {
        end -= 1;
    }
    &raw[start..end]
}
