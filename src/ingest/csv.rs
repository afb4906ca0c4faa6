//! CSV loader on `csv-core`: one pass, field bytes straight into typed builders.
//!
//! `csv-core` handles quoting, quoted newlines, CRLF and a UTF-8 byte-order mark. We keep the raw
//! bytes of the current record (a slice of the read buffer, copied only when a record straddles
//! two reads) so a rejected row is logged exactly as it arrived. The usual record skips
//! `csv-core` and is read in place: a `\n`-ended line of the read buffer without `\r` whose
//! fields are unquoted or quoted without a quote inside (see [`split_line`]). Header problems fail the run
//! before anything is written: a required contract field missing from the header, or a column not
//! in the contract when `unknown_fields: reject`.

use std::io::Read;
use std::sync::Arc;

use csv_core::{ReadRecordResult, Reader, ReaderBuilder};

use crate::error::{Error, Result};
use crate::ingest::Loader;
use crate::ingest::columns::match_columns;
use crate::ingest::sink::{FieldText, ParsedBatch, RowSink};
use crate::spec::contract::Contract;

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
    /// Where each field of a record read by `csv-core` ends in `out` (fields back to back).
    ends: Vec<usize>,
    /// The current record was read in place: field `j` is `raw[spans[j].0..spans[j].1]`.
    in_place: bool,
    spans: Vec<(usize, usize)>,
    delimiter: u8,
    quote: u8,
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
            in_place: false,
            spans: Vec::with_capacity(64),
            delimiter: opts.delimiter,
            quote: opts.quote,
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
        if self.in_place { self.spans.len() } else { self.ends_len }
    }

    fn field(&self, j: usize) -> &[u8] {
        if self.in_place {
            let (start, end) = self.spans[j];
            return &self.buf[self.rec_start + start..self.rec_start + end];
        }
        let start = if j == 0 { 0 } else { self.ends[j - 1] };
        &self.out[start..self.ends[j]]
    }

    /// Read the record at `pos` in place when it is a whole line of the buffer that
    /// [`split_line`] takes (and not a blank line); otherwise `csv-core` reads it.
    fn next_record_in_place(&mut self) -> bool {
        let rest = &self.buf[self.pos..self.len];
        let Some(end) = memchr::memchr(b'\n', rest) else {
            return false;
        };
        let line = &rest[..end];
        if end == 0
            || memchr::memchr(b'\r', line).is_some()
            || !split_line(line, self.delimiter, self.quote, &mut self.spans)
        {
            return false;
        }
        self.pos += end + 1;
        self.in_place = true;
        self.after_cr = false;
        self.rec_line = self.line;
        self.line += 1;
        true
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
        // Not the first record: `csv-core` reads that one (a byte-order mark).
        if self.row_number > 0 && self.next_record_in_place() {
            return Ok(Next::Record);
        }
        self.in_place = false;
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
                        Err(e) => return Err(Error::RunInterrupted(format!("{}: read failed: {e}", self.display))),
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

impl CsvLoader {
    /// The natural key of a record with the wrong number of fields (`found`), if it can be read:
    /// by position from the start of the line, and, when the line has too many fields (an
    /// unquoted delimiter inside a value), also from its end. The key is read when the readings
    /// that type and pass the key fields' checks agree ([`RowSink::malformed_key`]).
    fn malformed_key(&mut self, found: usize) -> Option<Vec<Option<String>>> {
        let expected = self.column_field.len();
        let mut shifts = vec![0usize];
        if found > expected {
            shifts.push(found - expected);
        }
        let key_fields = self.sink.key_fields();
        let mut readings = Vec::new();
        for shift in shifts {
            let reading: Option<Vec<Option<String>>> = key_fields
                .iter()
                .map(|&i| {
                    let j = self.field_column[i]? + shift;
                    if j >= found {
                        return None;
                    }
                    let bytes = self.field(j);
                    if self.null_values.iter().any(|n| n.as_slice() == bytes) {
                        return Some(None);
                    }
                    std::str::from_utf8(bytes).ok().map(|t| Some(t.to_string()))
                })
                .collect();
            readings.extend(reading);
        }
        self.sink.malformed_key(readings)
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
                    let nfields = self.field_count();
                    let row_number = self.row_number;
                    if nfields != self.column_field.len() {
                        let reason = format!(
                            "line {line}: expected {} fields, found {nfields}",
                            self.column_field.len()
                        );
                        let raw = String::from_utf8_lossy(self.raw_record()).into_owned();
                        let key = self.malformed_key(nfields);
                        self.sink.reject_malformed(row_number, reason, raw, key.as_deref());
                        continue;
                    }
                    // (`field`, spelled out: `self.sink` is borrowed mutably below)
                    let (out, ends, spans) = (&self.out, &self.ends, &self.spans);
                    let in_place = self.in_place.then_some(&self.buf[self.rec_start..self.pos]);
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
                                let bytes = match in_place {
                                    Some(raw) => &raw[spans[j].0..spans[j].1],
                                    None => &out[if j == 0 { 0 } else { ends[j - 1] }..ends[j]],
                                };
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

/// Split one line (without its `\n`, no `\r`) into field spans, as `csv-core` would read it,
/// when every field is either unquoted without a quote in it, or quoted without a quote inside
/// (`"a, b"`) and followed by the delimiter or the line's end. False for anything else (`""`
/// escapes, a quoted newline, text after a closing quote): `csv-core` reads that record.
fn split_line(line: &[u8], delimiter: u8, quote: u8, spans: &mut Vec<(usize, usize)>) -> bool {
    spans.clear();
    let mut i = 0;
    loop {
        if line.get(i) == Some(&quote) {
            let Some(k) = memchr::memchr(quote, &line[i + 1..]) else {
                return false;
            };
            let close = i + 1 + k;
            spans.push((i + 1, close));
            match line.get(close + 1) {
                None => return true,
                Some(&b) if b == delimiter => i = close + 2,
                Some(_) => return false,
            }
        } else {
            match memchr::memchr2(delimiter, quote, &line[i..]) {
                None => {
                    spans.push((i, line.len()));
                    return true;
                }
                Some(k) if line[i + k] == delimiter => {
                    spans.push((i, i + k));
                    i += k + 1;
                }
                Some(_) => return false,
            }
        }
    }
}

/// Longest record accepted; a longer one is almost always an unterminated quote.
const MAX_RECORD_BYTES: usize = 64 << 20;

/// Line ends in `raw`: `\n`, `\r\n` and a lone `\r` each count once; `after_cr` says the byte
/// before `raw` was a `\r` (csv-core ends a record at the `\r` of a `\r\n`, so the `\n` may start
/// the next record's bytes).
fn line_ends(raw: &[u8], after_cr: bool) -> u64 {
    // The usual record has no `\r`: count the `\n`s (a vectorized scan, not a byte loop).
    if !raw.contains(&b'\r') {
        let n = raw.iter().filter(|&&b| b == b'\n').count() as u64;
        return n - u64::from(after_cr && raw.first() == Some(&b'\n'));
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The fields `csv-core` reads from `line` and a `\n`, or `None` when that is not exactly one
    /// whole record.
    fn csv_core_fields(line: &[u8], delimiter: u8, quote: u8) -> Option<Vec<Vec<u8>>> {
        let mut rdr = ReaderBuilder::new().delimiter(delimiter).quote(quote).build();
        let input = [line, b"\n"].concat();
        let mut out = vec![0; input.len() + 1];
        let mut ends = vec![0; input.len() + 1];
        match rdr.read_record(&input, &mut out, &mut ends) {
            (ReadRecordResult::Record, nin, _, nend) if nin == input.len() => Some(
                (0..nend)
                    .map(|j| out[if j == 0 { 0 } else { ends[j - 1] }..ends[j]].to_vec())
                    .collect(),
            ),
            _ => None,
        }
    }

    fn line() -> impl Strategy<Value = Vec<u8>> {
        let byte = prop::sample::select(&b"ab ,;\"'|\\\xc3\xa9"[..]);
        prop::collection::vec(byte, 1..40)
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 2000, failure_persistence: None, ..ProptestConfig::default() })]

        /// Whenever a line is read in place, its fields are exactly those `csv-core` reads.
        #[test]
        fn a_line_read_in_place_has_the_fields_csv_core_reads(line in line(), semicolon in any::<bool>(), quote_char in any::<bool>()) {
            let delimiter = if semicolon { b';' } else { b',' };
            let quote = if quote_char { b'"' } else { b'\'' };
            let mut spans = Vec::new();
            if split_line(&line, delimiter, quote, &mut spans) {
                let ours: Vec<Vec<u8>> = spans.iter().map(|&(s, e)| line[s..e].to_vec()).collect();
                prop_assert_eq!(Some(ours), csv_core_fields(&line, delimiter, quote));
            }
        }
    }

    #[test]
    fn the_usual_lines_are_read_in_place() {
        let mut spans = Vec::new();
        for (line, fields) in [
            (&b"1,abc,,2.50"[..], &[&b"1"[..], b"abc", b"", b"2.50"][..]),
            (b"1,\"a, b\",x", &[b"1", b"a, b", b"x"]),
            (b"\"\",", &[b"", b""]),
            (b"7,\"last\"", &[b"7", b"last"]),
        ] {
            assert!(
                split_line(line, b',', b'"', &mut spans),
                "{}",
                String::from_utf8_lossy(line)
            );
            let ours: Vec<&[u8]> = spans.iter().map(|&(s, e)| &line[s..e]).collect();
            assert_eq!(ours, fields);
        }
        // `""` inside quotes, a quote inside an unquoted field, text after a closing quote and an
        // unclosed quote are left to csv-core.
        for line in [&b"1,\"a\"\"b\""[..], b"1,a\"b", b"\"a\"b,1", b"1,\"abc"] {
            assert!(
                !split_line(line, b',', b'"', &mut spans),
                "{}",
                String::from_utf8_lossy(line)
            );
        }
    }
}
