//! Assembling typed Arrow batches from records of text fields (CSV and NDJSON).
//!
//! A loader hands each record to [`RowSink::push_row`] as one optional text per contract field.
//! The sink types and checks every field (the order of docs/guide.md#contracts: type, required, min, max, allowed,
//! pattern), appends to reusable builders and remembers which rows were rejected and why. The
//! batch keeps rejected rows (as nulls where typing failed) so that the fingerprint of a rejected
//! row can still be computed when its key fields were fine; [`ParsedBatch::valid`] says which rows
//! load.

use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, BooleanArray, Int64Array, StringArray, StringBuilder};

use crate::hash::normalize::normalize_into;
use crate::hash::{TEXT_NULL, TEXT_SEPARATOR};
use crate::spec::contract::{Contract, Field, FieldType};
use crate::spec::types::{ColumnBuilder, Rejection, check_normalized, parse_value};

/// The rule of a record whose natural key cannot name it unambiguously (docs/formats.md#hashes):
/// a key part that is null or empty after normalize, or, in a composite key, a part holding the
/// separator `|`. The fingerprint formula does not escape, so such keys could merge two records.
/// The record is not loaded, but its key still counts as delivered (its fingerprint is computed
/// and logged), so a `delivery: full` file never deletes a record it holds.
pub const NATURAL_KEY_INVALID: &str = "natural_key_invalid";

/// Why the key part `text` (None: null) of key field `f` cannot be part of a fingerprint, if it
/// cannot. Only strings can be empty or hold `|`; `composite` when the key has several fields.
pub fn key_part_problem(
    f: &Field,
    text: Option<&str>,
    composite: bool,
    norm: &mut String,
    scratch: &mut String,
) -> Option<Rejection> {
    let part = match text {
        Some(t) if f.ty == FieldType::String && !f.normalize.is_empty() => {
            crate::hash::normalize::normalize_into(&f.normalize, t, norm, scratch);
            Some(norm.as_str())
        }
        other => other,
    };
    normalized_key_part_problem(f, text, part, composite)
}

/// [`key_part_problem`] given also the part after the field's normalize steps (`part`; the same
/// as `text` for a field without steps), for a caller that has normalized it already.
#[inline]
pub fn normalized_key_part_problem(
    f: &Field,
    text: Option<&str>,
    part: Option<&str>,
    composite: bool,
) -> Option<Rejection> {
    let invalid = |why: String| Some(Rejection::new(NATURAL_KEY_INVALID, format!("{}: {why}", f.name)));
    let (Some(text), Some(part)) = (text, part) else {
        return invalid("natural key part is missing (null), so the record has no identity".into());
    };
    if f.ty != FieldType::String {
        return None;
    }
    if part.is_empty() {
        return invalid(format!(
            "natural key part \"{text}\" is empty after normalize, so the record has no identity"
        ));
    }
    if composite && part.contains(TEXT_SEPARATOR as char) {
        return invalid(format!(
            "natural key part \"{part}\" contains the separator |, which makes a composite key \
             ambiguous (\"a|b\",\"c\" and \"a\",\"b|c\" would be one record)"
        ));
    }
    None
}

/// One rejected record of a batch.
#[derive(Debug, Clone)]
pub struct RowRejection {
    /// Index of the row in its batch.
    pub index: usize,
    pub row_number: u64,
    pub rule: String,
    pub reason: String,
    pub raw_payload: String,
    /// True when every natural-key field typed fine, so the fingerprint is meaningful.
    pub key_ok: bool,
}

/// A batch of typed contract columns, before hashing.
#[derive(Debug)]
pub struct ParsedBatch {
    /// Contract fields in contract order; rejected rows included.
    pub columns: Vec<ArrayRef>,
    pub row_numbers: Arc<Int64Array>,
    /// `None` when every row is valid.
    pub valid: Option<BooleanArray>,
    pub rejections: Vec<RowRejection>,
    /// The raw payload of every row, when the loader was asked to keep it.
    pub raw: Option<StringArray>,
    /// The canonical text of every field of every row, when the input gave every value of the
    /// batch in canonical form (see [`CanonicalTexts`]); hashing then needs no re-formatting.
    pub texts: Option<CanonicalTexts>,
    /// Bytes of (decompressed) input consumed so far, for progress.
    pub bytes_read: u64,
}

impl ParsedBatch {
    pub fn num_rows(&self) -> usize {
        self.row_numbers.len()
    }
}

/// Field texts of a batch in the layout of [`crate::hash::FieldTexts`].
#[derive(Debug, Default)]
pub struct CanonicalTexts {
    pub bytes: Vec<u8>,
    pub ends: Vec<u32>,
}

/// Collects [`CanonicalTexts`] while rows are typed. Only for contracts whose every field has a
/// canonical text that the input can spell exactly (no floats or timestamps, no custom date
/// format; a string's text is the one after its `normalize` steps, computed once per value for
/// its checks too); a batch with any other value (or a rejected row) falls back to hashing the
/// typed values.
struct TextCapture {
    texts: CanonicalTexts,
    ok: bool,
}

impl TextCapture {
    fn eligible(contract: &Contract) -> bool {
        contract.fields.iter().all(|f| {
            // normalize steps apply to strings only (the contract reader enforces it)
            (f.normalize.is_empty() || f.ty == FieldType::String)
                && match f.ty {
                    FieldType::String | FieldType::Int32 | FieldType::Int64 | FieldType::Boolean => true,
                    FieldType::Decimal { scale, .. } => scale >= 0,
                    FieldType::Date => f.format.is_none(),
                    FieldType::Float64 | FieldType::Timestamp => false,
                }
        })
    }

    fn push_null(&mut self) {
        if self.ok {
            self.texts.bytes.push(TEXT_SEPARATOR);
            self.end_value(false);
        }
    }

    /// Close the value appended since the last one (`present`) or record a null.
    fn end_value(&mut self, present: bool) {
        match u32::try_from(self.texts.bytes.len()) {
            Ok(e) if e < TEXT_NULL => self.texts.ends.push(if present { e } else { e | TEXT_NULL }),
            _ => self.ok = false,
        }
    }
}

impl TextCapture {
    /// Append the canonical text of `text` (after the field's normalize steps), which typed fine
    /// as `field`, when it can be spelled from the input's bytes (docs/formats.md#hashes); otherwise the batch falls back to the typed values.
    #[inline(always)]
    fn push_value(&mut self, field: &Field, text: &str) {
        if !self.ok {
            return;
        }
        let b = text.as_bytes();
        self.texts.bytes.push(TEXT_SEPARATOR);
        let as_is = match field.ty {
            FieldType::String => true,
            FieldType::Int32 | FieldType::Int64 => canonical_integer(b),
            FieldType::Decimal { scale: 0, .. } => canonical_integer(b),
            FieldType::Decimal { scale, .. } => {
                let start = self.texts.bytes.len();
                if !decimal_into(b, scale.unsigned_abs() as usize, &mut self.texts.bytes) {
                    self.texts.bytes.truncate(start);
                    self.ok = false;
                    return;
                }
                self.end_value(true);
                return;
            }
            FieldType::Boolean => b == b"true" || b == b"false",
            // The default date parser takes exactly YYYY-MM-DD (after trimming): canonical.
            FieldType::Date => field.format.is_none() && b.len() == 10,
            FieldType::Float64 | FieldType::Timestamp => false,
        };
        if as_is {
            self.texts.bytes.extend_from_slice(b);
            self.end_value(true);
        } else {
            self.ok = false;
        }
    }
}

/// The canonical text of a decimal of `scale > 0` from its input text (`17` → `17.00`,
/// `-0.5` → `-0.50`); false (with partial output) when the text is not a plain decimal whose
/// fraction fits the scale, or is a negative zero.
fn decimal_into(b: &[u8], scale: usize, out: &mut Vec<u8>) -> bool {
    let negative = b.first() == Some(&b'-');
    let unsigned = if negative { &b[1..] } else { b };
    let (int, frac) = match unsigned.iter().position(|&c| c == b'.') {
        Some(p) => (&unsigned[..p], &unsigned[p + 1..]),
        None => (unsigned, &[][..]),
    };
    if int.first() == Some(&b'-')
        || !canonical_integer(int)
        || frac.len() > scale
        || !frac.iter().all(u8::is_ascii_digit)
        || (negative && int == b"0" && frac.iter().all(|&d| d == b'0'))
    {
        return false;
    }
    if frac.len() == scale {
        // every fraction digit given (`21168.23` for a scale of 2): the text is canonical as it is
        out.extend_from_slice(b);
        return true;
    }
    if negative {
        out.push(b'-');
    }
    out.extend_from_slice(int);
    out.push(b'.');
    out.extend_from_slice(frac);
    out.extend(std::iter::repeat_n(b'0', scale - frac.len()));
    true
}

/// Plain decimal digits with an optional `-`, no leading zero, and not `-0`.
fn canonical_integer(b: &[u8]) -> bool {
    let digits = b.strip_prefix(b"-").unwrap_or(b);
    match digits {
        [] => false,
        [b'0'] => digits.len() == b.len(),
        [b'0', ..] => false,
        _ => digits.iter().all(u8::is_ascii_digit),
    }
}

/// The text of one field of a record.
#[derive(Debug, Clone, Copy)]
pub enum FieldText<'a> {
    Null,
    Text(&'a str),
    /// The field's bytes could not be read as its type at all (invalid UTF-8, a JSON object...).
    Invalid(&'a str),
}

pub struct RowSink {
    contract: Arc<Contract>,
    builders: Vec<ColumnBuilder>,
    row_numbers: Vec<i64>,
    valid: Vec<bool>,
    any_invalid: bool,
    rejections: Vec<RowRejection>,
    is_key: Vec<bool>,
    /// The natural key has several fields (a part must not hold the separator).
    composite: bool,
    norm: String,
    scratch: String,
    /// Keep the raw payload of every row (second pass of a file with key conflicts).
    raw: Option<StringBuilder>,
    texts: Option<TextCapture>,
    pub batch_size: usize,
}

impl RowSink {
    pub fn new(contract: Arc<Contract>, batch_size: usize, keep_raw: bool) -> RowSink {
        let eligible = TextCapture::eligible(&contract);
        let builders = contract
            .fields
            .iter()
            .map(|f| ColumnBuilder::new(f.ty, batch_size))
            .collect();
        let mut is_key = vec![false; contract.fields.len()];
        for &i in &contract.natural_key.fields {
            is_key[i] = true;
        }
        RowSink {
            composite: contract.natural_key.fields.len() > 1,
            contract,
            builders,
            row_numbers: Vec::with_capacity(batch_size),
            valid: Vec::with_capacity(batch_size),
            any_invalid: false,
            rejections: Vec::new(),
            is_key,
            norm: String::new(),
            scratch: String::new(),
            raw: keep_raw.then(StringBuilder::new),
            texts: eligible.then(|| TextCapture {
                texts: CanonicalTexts::default(),
                ok: true,
            }),
            batch_size,
        }
    }

    pub fn is_full(&self) -> bool {
        self.row_numbers.len() >= self.batch_size
    }

    /// Type and check one record. `field(i)` gives the text of contract field `i`; `raw` renders
    /// the record as it arrived, called only when the row is rejected.
    pub fn push_row<'a>(
        &mut self,
        row_number: u64,
        mut field: impl FnMut(usize) -> FieldText<'a>,
        raw: impl FnOnce() -> String,
        line: Option<u64>,
    ) {
        let mut first: Option<Rejection> = None;
        let mut key_ok = true;
        for (i, f) in self.contract.fields.iter().enumerate() {
            let builder = &mut self.builders[i];
            let texts = &mut self.texts;
            let is_key = self.is_key[i];
            let given = field(i);
            // `part`: the value's text after the field's normalize steps (strings only), computed
            // once and used by every check and by the captured text the row is hashed from.
            let (outcome, part) = match given {
                FieldText::Null => {
                    builder.append_null();
                    if let Some(c) = texts {
                        c.push_null();
                    }
                    let outcome = f.required.then(|| {
                        Rejection::new(
                            format!("required:{}", f.name),
                            format!("{}: required value is missing", f.name),
                        )
                    });
                    (outcome, None)
                }
                FieldText::Invalid(why) => {
                    builder.append_null();
                    let outcome = Rejection::new(format!("type:{}", f.name), format!("{}: {why}", f.name));
                    (Some(outcome), None)
                }
                FieldText::Text(t) => match parse_value(f, t) {
                    Ok(v) => {
                        builder.append(&v);
                        let part = if f.normalize.is_empty() {
                            Some(t)
                        } else if texts.as_ref().is_some_and(|c| c.ok)
                            || f.required
                            || is_key
                            || f.allowed.is_some()
                            || f.pattern.is_some()
                        {
                            normalize_into(&f.normalize, t, &mut self.norm, &mut self.scratch);
                            Some(self.norm.as_str())
                        } else {
                            None
                        };
                        if let Some(c) = texts {
                            c.push_value(f, part.unwrap_or(t));
                        }
                        // A required string whose normalized value is empty (`"  "` with `trim`)
                        // counts as missing.
                        let outcome = if f.required && !f.normalize.is_empty() && part.is_some_and(str::is_empty) {
                            Some(Rejection::new(
                                format!("required:{}", f.name),
                                format!("{}: required value is empty after normalize", f.name),
                            ))
                        } else {
                            check_normalized(f, &v, part)
                        };
                        (outcome, part)
                    }
                    Err(r) => {
                        builder.append_null();
                        (Some(r), None)
                    }
                },
            };
            let outcome = match outcome {
                None if is_key => {
                    let text = match given {
                        FieldText::Text(t) => Some(t),
                        _ => None,
                    };
                    normalized_key_part_problem(f, text, part, self.composite)
                }
                other => other,
            };
            if let Some(r) = outcome {
                // Rejected rows are hashed from their typed values (with nulls where typing failed).
                if let Some(c) = &mut self.texts {
                    c.ok = false;
                }
                if is_key && (r.rule.starts_with("type:") || r.rule.starts_with("required:")) {
                    key_ok = false;
                }
                if first.is_none() {
                    first = Some(r);
                }
            }
        }
        if let (Some(r), Some(line)) = (&mut first, line) {
            r.reason = format!("line {line}: {}", r.reason);
        }
        self.push_outcome(row_number, first, key_ok, raw);
    }

    /// Of the ways the natural key of a malformed record can be read (`readings`: per reading,
    /// the text of each key field in key order, `None` for null), the one that holds: each part
    /// types, passes its field's checks and can be part of a key, and every other reading that
    /// holds gives the same parts. `None` when no reading holds or two disagree: the key cannot be
    /// read, and a `delivery: full` run is held rather than guessing (docs/operations.md#deletions).
    pub fn malformed_key(&mut self, readings: Vec<Vec<Option<String>>>) -> Option<Vec<Option<String>>> {
        let mut found: Option<Vec<Option<String>>> = None;
        for reading in readings {
            if !self.key_reading_holds(&reading) {
                continue;
            }
            match &found {
                None => found = Some(reading),
                Some(f) if *f == reading => {}
                Some(_) => return None,
            }
        }
        found
    }

    /// The natural-key fields, as indexes into the contract's fields, in key order.
    pub fn key_fields(&self) -> Vec<usize> {
        self.contract.natural_key.fields.clone()
    }

    fn key_reading_holds(&mut self, reading: &[Option<String>]) -> bool {
        let contract = self.contract.clone();
        for (k, &i) in contract.natural_key.fields.iter().enumerate() {
            let f = &contract.fields[i];
            let Some(Some(text)) = reading.get(k).map(Option::as_deref) else {
                return false;
            };
            let Ok(value) = parse_value(f, text) else {
                return false;
            };
            let part = if f.normalize.is_empty() {
                text.to_string()
            } else {
                normalize_into(&f.normalize, text, &mut self.norm, &mut self.scratch);
                self.norm.clone()
            };
            if check_normalized(f, &value, Some(&part)).is_some()
                || normalized_key_part_problem(f, Some(text), Some(&part), self.composite).is_some()
            {
                return false;
            }
        }
        true
    }

    /// Reject a malformed record (`malformed_record`) whose natural key could be read
    /// ([`RowSink::malformed_key`]; `key` in key order): the key fields are typed so that its
    /// fingerprint is computed and logged, and a full delivery counts the record as delivered.
    /// Without a key it is [`RowSink::reject_row`].
    pub fn reject_malformed(&mut self, row_number: u64, reason: String, raw: String, key: Option<&[Option<String>]>) {
        let Some(key) = key else {
            return self.reject_row(row_number, "malformed_record", reason, raw);
        };
        if let Some(c) = &mut self.texts {
            c.ok = false;
        }
        let contract = self.contract.clone();
        for (i, b) in self.builders.iter_mut().enumerate() {
            let text = contract
                .natural_key
                .fields
                .iter()
                .position(|&k| k == i)
                .and_then(|k| key.get(k).and_then(Option::as_deref));
            match text.map(|t| parse_value(&contract.fields[i], t)) {
                Some(Ok(v)) => b.append(&v),
                _ => b.append_null(),
            }
        }
        self.push_outcome(
            row_number,
            Some(Rejection::new("malformed_record", reason)),
            true,
            || raw,
        );
    }

    /// Reject a whole record before its fields are read (wrong field count, invalid JSON).
    pub fn reject_row(&mut self, row_number: u64, rule: &str, reason: String, raw: String) {
        if let Some(c) = &mut self.texts {
            c.ok = false;
        }
        for b in &mut self.builders {
            b.append_null();
        }
        self.push_outcome(row_number, Some(Rejection::new(rule, reason)), false, || raw);
    }

    fn push_outcome(
        &mut self,
        row_number: u64,
        rejection: Option<Rejection>,
        key_ok: bool,
        raw: impl FnOnce() -> String,
    ) {
        let index = self.row_numbers.len();
        self.row_numbers.push(row_number as i64);
        let text = (self.raw.is_some() || rejection.is_some()).then(raw);
        if let (Some(b), Some(t)) = (self.raw.as_mut(), &text) {
            b.append_value(t);
        }
        match rejection {
            None => self.valid.push(true),
            Some(r) => {
                self.valid.push(false);
                self.any_invalid = true;
                self.rejections.push(RowRejection {
                    index,
                    row_number,
                    rule: r.rule,
                    reason: r.reason,
                    raw_payload: text.unwrap_or_default(),
                    key_ok,
                });
            }
        }
    }

    /// Finish the current batch (None when empty); builders are reused.
    pub fn finish(&mut self, bytes_read: u64) -> datafusion::error::Result<Option<ParsedBatch>> {
        if self.row_numbers.is_empty() {
            return Ok(None);
        }
        let columns = self
            .builders
            .iter_mut()
            .map(|b| b.finish())
            .collect::<datafusion::error::Result<Vec<_>>>()?;
        let row_numbers = Arc::new(Int64Array::from(std::mem::take(&mut self.row_numbers)));
        let valid = if self.any_invalid {
            Some(BooleanArray::from(std::mem::take(&mut self.valid)))
        } else {
            None
        };
        self.valid.clear();
        self.any_invalid = false;
        let raw = self.raw.as_mut().map(|b| b.finish());
        let texts = self.texts.as_mut().and_then(|c| {
            let capacity = (c.texts.bytes.capacity(), c.texts.ends.capacity());
            let texts = std::mem::replace(
                &mut c.texts,
                CanonicalTexts {
                    bytes: Vec::with_capacity(capacity.0),
                    ends: Vec::with_capacity(capacity.1),
                },
            );
            std::mem::replace(&mut c.ok, true).then_some(texts)
        });
        Ok(Some(ParsedBatch {
            columns,
            row_numbers,
            valid,
            rejections: std::mem::take(&mut self.rejections),
            raw,
            texts,
            bytes_read,
        }))
    }
}
