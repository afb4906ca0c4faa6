//! Record identity: `row_hash`, `natural_key_fingerprint`, canonical text and `normalize`
//! steps (docs/formats.md#hashes), as Arrow kernels and as DataFusion scalar UDFs; the
//! `file_hash` of an API pull over them ([`pull`]).
//!
//! Role: the only place that decides which bytes are hashed. Bronze uses the kernels
//! directly; analysts and the rules engine use the UDFs registered by [`register_udfs`].
//!
//! Formulas: docs/formats.md#hashes, restated on [`row_hash_array`].
//!
//! Hazards: any change to these bytes silently splits every natural key in existing lakes
//! into "new" records. The golden vectors in `tests/it/hashing.rs` pin them; a failing
//! golden test means the change is wrong, not the test. Normalization is *not* applied here:
//! callers normalize string columns first (see [`normalize::normalize_array`]).

pub mod canonical;
pub mod fp;
pub mod json;
pub mod namespace;
pub mod normalize;
pub mod pull;
pub mod udf;

use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, Int64Array, NullBufferBuilder, StringArray};
use datafusion::arrow::buffer::{Buffer, OffsetBuffer, ScalarBuffer};
use datafusion::common::{exec_datafusion_err, exec_err};
use datafusion::error::Result;
use datafusion::logical_expr::ScalarUDF;
use datafusion::prelude::SessionContext;
use sha2::{Digest, Sha256};

pub use canonical::CanonicalColumn;
pub use normalize::NormalizeStep;

/// The row-hash format version, the first field of every row-hash message.
pub const ROW_HASH_FORMAT_VERSION: &[u8] = b"1";

/// Compute `row_hash` for each row of `columns` (all of equal length) as a `Utf8` array of
/// 64-char lowercase hex digests. With no columns the result is empty (no row count).
///
/// Formulas (64 lowercase hex SHA-256 digests):
/// * `row_hash` = sha256(`"1|" + e1 + "|" + ... + "|" + en`), `ei` = `\N` for null, else the
///   canonical text with `\` → `\\` then `|` → `\|`. The leading `1` is the format version.
/// * `natural_key_fingerprint` = sha256(`"{version}|" + v1 + "|" + ... + "|" + vn`), null →
///   empty string, no escaping: byte-for-byte JavaScript's
///   `` sha256(`${version}|${fields.join('|')}`) `` (so zero fields hash `"{version}|"`).
pub fn row_hash_array(columns: &[ArrayRef]) -> Result<ArrayRef> {
    let num_rows = common_len(columns)?;
    let columns = canonical_columns(columns.iter().map(|c| c.as_ref()))?;
    row_hash_columns(&columns, num_rows)
}

/// Compute `natural_key_fingerprint` with one `version` for every row of `columns`.
/// The fields must already be normalized. With no columns the result is empty.
pub fn fingerprint_array(version: i64, columns: &[ArrayRef]) -> Result<ArrayRef> {
    let num_rows = common_len(columns)?;
    let columns = canonical_columns(columns.iter().map(|c| c.as_ref()))?;
    fingerprint_columns(KeyVersion::Constant(version), &columns, num_rows)
}

/// Hex digit values; 0x10 marks a byte that is not a lowercase hex digit (hashes are written in
/// lowercase, see [`hex_lower`]).
pub const HEX_VALUE: [u8; 256] = {
    let mut t = [0x10u8; 256];
    let mut c = 0;
    while c < 10 {
        t[b'0' as usize + c] = c as u8;
        c += 1;
    }
    let mut c = 0;
    while c < 6 {
        t[b'a' as usize + c] = 10 + c as u8;
        c += 1;
    }
    t
};

/// The first 16 hex digits of `s` as a number (branch-free: the digits are random); `None` when
/// `s` is shorter or they are not all lowercase hex digits.
pub fn hex_u64(s: &[u8]) -> Option<u64> {
    let digits: &[u8; 16] = s.get(..16)?.try_into().ok()?;
    let mut v = 0u64;
    let mut bad = 0u8;
    for &c in digits {
        let d = HEX_VALUE[c as usize];
        bad |= d;
        v = (v << 4) | (d & 0x0f) as u64;
    }
    (bad & 0x10 == 0).then_some(v)
}

/// A shared secret (a service's token) from the environment variable `env` or from a file
/// (`file`: its path and the option or variable that named it), not both; the file's first line,
/// trimmed. `None` when neither is set. An empty secret is refused (it would let everyone in),
/// and a file other users can read is warned about.
pub fn read_secret(env: &str, file: Option<(&std::path::Path, &str)>) -> crate::error::Result<Option<String>> {
    use crate::error::Error;
    match (file, std::env::var_os(env)) {
        (Some((_, what)), Some(_)) => Err(Error::Invalid(format!(
            "both {what} and {env} are set: give the token one way"
        ))),
        (Some((path, what)), None) => {
            let text = std::fs::read_to_string(path).map_err(|e| Error::io(path.display(), e))?;
            let first = text.lines().next().unwrap_or("").trim().to_string();
            if first.is_empty() {
                return Err(Error::Invalid(format!(
                    "{what} {}: the file holds no token (its first line is empty)",
                    path.display()
                )));
            }
            warn_if_readable_by_others(path);
            Ok(Some(first))
        }
        (None, Some(v)) => {
            let v = v
                .into_string()
                .map_err(|_| Error::Invalid(format!("{env} is not valid UTF-8")))?;
            if v.trim().is_empty() {
                return Err(Error::Invalid(format!(
                    "{env} is set but empty: an empty token would let every client in; set a secret or unset {env}"
                )));
            }
            Ok(Some(v.trim().to_string()))
        }
        (None, None) => Ok(None),
    }
}

#[cfg(unix)]
fn warn_if_readable_by_others(path: &std::path::Path) {
    use std::os::unix::fs::PermissionsExt;
    if let Ok(m) = std::fs::metadata(path)
        && m.permissions().mode() & 0o077 != 0
    {
        crate::tell!(
            "ingot: warning: {} can be read by other users (mode {:o}); `chmod 600` it",
            path.display(),
            m.permissions().mode() & 0o777
        );
    }
}

#[cfg(not(unix))]
fn warn_if_readable_by_others(_: &std::path::Path) {}

/// A secret as the services keep it: its SHA-256, so a comparison never touches the secret.
pub fn secret_digest(secret: &[u8]) -> [u8; 32] {
    use sha2::Digest;
    sha2::Sha256::digest(secret).into()
}

/// Does `given` hash to `want` (a [`secret_digest`])? The digests are compared in full, so the
/// time taken does not depend on how much of a guess was right, nor on its length.
pub fn same_secret(given: &[u8], want: &[u8; 32]) -> bool {
    let got = secret_digest(given);
    let diff = got.iter().zip(want).fold(0u8, |d, (a, b)| d | (a ^ b));
    std::hint::black_box(diff) == 0
}

/// The SHA-256 of `bytes` as 64 lowercase hex characters.
pub fn sha256_hex(bytes: &[u8]) -> String {
    let mut out = [0u8; 64];
    hex_lower(&secret_digest(bytes), &mut out);
    out.iter().map(|&b| b as char).collect()
}

/// Write the 64 lowercase hex characters of `digest` into `out`.
pub fn hex_lower(digest: &[u8; 32], out: &mut [u8; 64]) {
    for (byte, pair) in digest.iter().zip(out.chunks_exact_mut(2)) {
        pair.copy_from_slice(&HEX_PAIRS[usize::from(*byte)]);
    }
}

/// Both lowercase hex digits of every byte value, so one lookup per byte.
const HEX_PAIRS: [[u8; 2]; 256] = {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut t = [[0u8; 2]; 256];
    let mut b = 0;
    while b < 256 {
        t[b] = [HEX[b >> 4], HEX[b & 0x0f]];
        b += 1;
    }
    t
};

/// Register `row_hash`, `natural_key_fingerprint`, `canonical_text` and `normalize_text`.
pub fn register_udfs(ctx: &SessionContext) {
    for udf in udfs() {
        ctx.register_udf(udf);
    }
}

/// The hashing UDFs, for registries other than a `SessionContext`.
pub fn udfs() -> Vec<ScalarUDF> {
    vec![
        ScalarUDF::from(udf::RowHash::new()),
        ScalarUDF::from(udf::NaturalKeyFingerprint::new()),
        ScalarUDF::from(udf::CanonicalText::new()),
        ScalarUDF::from(udf::NormalizeText::new()),
        namespace::namespaced_fingerprint_udf(),
    ]
}

/// The version of a fingerprint: one for all rows, or one per row (UDF with a column).
#[derive(Debug, Clone, Copy)]
pub(crate) enum KeyVersion<'a> {
    Constant(i64),
    PerRow(&'a Int64Array),
}

/// The length shared by all `columns` (0 when there are none).
fn common_len(columns: &[ArrayRef]) -> Result<usize> {
    let num_rows = columns.first().map_or(0, |c| c.len());
    match columns.iter().position(|c| c.len() != num_rows) {
        Some(i) => exec_err!(
            "hash input columns differ in length: column 1 has {num_rows} rows, column {} has {}",
            i + 1,
            columns[i].len()
        ),
        None => Ok(num_rows),
    }
}

/// Downcast every array once.
pub(crate) fn canonical_columns<'a>(arrays: impl Iterator<Item = &'a dyn Array>) -> Result<Vec<CanonicalColumn<'a>>> {
    arrays.map(CanonicalColumn::new).collect()
}

/// The message a `row_hash` digests, built field by field: the one place that decides its bytes
/// (the format version, then per field `|` and the escaped canonical text or `\N`), for typed
/// columns and loaders' texts alike.
struct RowMessage {
    bytes: Vec<u8>,
    scratch: Vec<u8>,
}

impl RowMessage {
    fn new() -> Self {
        RowMessage {
            bytes: Vec::with_capacity(256),
            scratch: Vec::new(),
        }
    }

    /// Start the next row's message.
    #[inline]
    fn start(&mut self) {
        self.bytes.clear();
        self.bytes.extend_from_slice(ROW_HASH_FORMAT_VERSION);
    }

    /// Append one field: `write` appends its canonical text and returns false for a null;
    /// `escape` is false for a field whose text cannot contain `\` or `|`.
    #[inline]
    fn field(&mut self, escape: bool, write: impl FnOnce(&mut Vec<u8>) -> bool) {
        self.bytes.push(TEXT_SEPARATOR);
        let start = self.bytes.len();
        if write(&mut self.bytes) {
            if escape {
                escape_from(&mut self.bytes, start, &mut self.scratch);
            }
        } else {
            self.bytes.extend_from_slice(b"\\N");
        }
    }
}

/// The message a `natural_key_fingerprint` digests: `{version}|` then the fields' texts joined
/// by `|`, a null as the empty string, nothing escaped. The `{version}|` prefix is formatted
/// once and kept while the version stays the same (a run has one).
struct KeyMessage {
    bytes: Vec<u8>,
    /// The version whose prefix `bytes[..prefix]` holds.
    version: Option<i64>,
    prefix: usize,
    fields: usize,
}

impl KeyMessage {
    fn new() -> Self {
        KeyMessage {
            bytes: Vec::with_capacity(128),
            version: None,
            prefix: 0,
            fields: 0,
        }
    }

    #[inline]
    fn start(&mut self, version: i64) {
        if self.version == Some(version) {
            self.bytes.truncate(self.prefix);
        } else {
            self.bytes.clear();
            self.bytes
                .extend_from_slice(itoa::Buffer::new().format(version).as_bytes());
            self.bytes.push(b'|');
            self.prefix = self.bytes.len();
            self.version = Some(version);
        }
        self.fields = 0;
    }

    /// Append one field; `write` appends its text (nothing for a null).
    #[inline]
    fn field(&mut self, write: impl FnOnce(&mut Vec<u8>)) {
        if self.fields > 0 {
            self.bytes.push(b'|');
        }
        self.fields += 1;
        write(&mut self.bytes);
    }
}

/// `row_hash` of `num_rows` rows over already-downcast columns.
pub(crate) fn row_hash_columns(columns: &[CanonicalColumn<'_>], num_rows: usize) -> Result<ArrayRef> {
    let mut out = HexOutput::with_capacity(num_rows);
    let mut message = RowMessage::new();
    let escape: Vec<bool> = columns.iter().map(|c| c.may_need_escape()).collect();
    for row in 0..num_rows {
        message.start();
        for (column, &escape) in columns.iter().zip(&escape) {
            message.field(escape, |buf| column.write(row, buf));
        }
        out.push_digest(&message.bytes)?;
    }
    out.finish()
}

/// The canonical texts of a batch's fields, row by row, as a loader saw them in its input (the
/// text of a value that is already in canonical form, e.g. `12.50` for a decimal(10,2)).
/// Every field's text is preceded by one `|`, so a row is `|f1|f2|...|fn`: for a row without
/// nulls, `\` or `|` in its values this is the `row_hash` message after the format version.
/// Field `f` of row `r` (index `i = r * fields + f`) is `bytes[ends[i - 1] + 1 .. ends[i]]`
/// (`ends[-1]` = 0), with [`TEXT_NULL`] set in its end for a null.
pub struct FieldTexts<'a> {
    pub bytes: &'a [u8],
    pub ends: &'a [u32],
    /// Fields per row.
    pub fields: usize,
}

/// Marks a null field in [`FieldTexts::ends`].
pub const TEXT_NULL: u32 = 1 << 31;

/// The byte before every field of [`FieldTexts`].
pub const TEXT_SEPARATOR: u8 = b'|';

impl FieldTexts<'_> {
    fn rows(&self) -> usize {
        self.ends.len().checked_div(self.fields).unwrap_or(0)
    }

    /// Where the text at `i` (row-major) starts, after its separator.
    fn start(&self, i: usize) -> usize {
        (if i == 0 { 0 } else { self.ends[i - 1] & !TEXT_NULL }) as usize + 1
    }

    /// The text of field `f` of row `r`; `None` for null.
    fn get(&self, r: usize, f: usize) -> Option<&[u8]> {
        let i = r * self.fields + f;
        let end = self.ends[i];
        if end & TEXT_NULL != 0 {
            return None;
        }
        self.bytes.get(self.start(i)..end as usize)
    }

    /// Row `r` as `|f1|...|fn` when that is its `row_hash` message after the version: no null
    /// and no `\` or `|` in any value (which would need escaping).
    fn plain_row(&self, r: usize) -> Option<&[u8]> {
        let n = self.fields;
        let ends = self.ends.get(r * n..(r + 1) * n)?;
        if n == 0 || ends.iter().any(|e| e & TEXT_NULL != 0) {
            return None;
        }
        let body = self.bytes.get(self.start(r * n) - 1..ends[n - 1] as usize)?;
        let (separators, backslash) = separators_and_backslash(body);
        (separators == n && !backslash).then_some(body)
    }
}

/// How many [`TEXT_SEPARATOR`]s `bytes` has, and whether it has a `\`: one pass, counted in
/// byte lanes over chunks of 255 (vectorized; counting straight into a `usize` widens every byte).
fn separators_and_backslash(bytes: &[u8]) -> (usize, bool) {
    let mut separators = 0;
    let mut backslash = 0u8;
    for chunk in bytes.chunks(255) {
        let mut count = 0u8;
        for &b in chunk {
            count += u8::from(b == TEXT_SEPARATOR);
            backslash |= u8::from(b == b'\\');
        }
        separators += usize::from(count);
    }
    (separators, backslash != 0)
}

/// `row_hash` over `fields` (in order) of canonical texts; `escape[k]` is false for a field
/// whose text cannot contain `\` or `|`. The same bytes as [`row_hash_columns`] over the
/// typed values.
pub fn row_hash_texts(texts: &FieldTexts<'_>, fields: &[usize], escape: &[bool]) -> Result<ArrayRef> {
    row_hash_texts_into(HexOutput::with_capacity(texts.rows()), texts, fields, escape)?.finish()
}

/// [`row_hash_texts`] and every digest's first 16 bytes as two big-endian words (the number its
/// first 32 hex digits spell).
pub fn row_hash_texts_with_heads(
    texts: &FieldTexts<'_>,
    fields: &[usize],
    escape: &[bool],
) -> Result<(ArrayRef, Vec<[u64; 2]>)> {
    row_hash_texts_into(HexOutput::with_heads(texts.rows()), texts, fields, escape)?.finish_with_heads()
}

fn row_hash_texts_into(
    mut out: HexOutput,
    texts: &FieldTexts<'_>,
    fields: &[usize],
    escape: &[bool],
) -> Result<HexOutput> {
    let rows = texts.rows();
    // Every field of a row, in order: a plain row is hashed straight from the texts.
    let whole_rows = fields.len() == texts.fields && fields.iter().enumerate().all(|(k, &f)| k == f);
    let mut message = RowMessage::new();
    for row in 0..rows {
        // a plain row's texts are its message after the version, byte for byte
        if whole_rows && let Some(body) = texts.plain_row(row) {
            out.push_digest_of(&[ROW_HASH_FORMAT_VERSION, body])?;
            continue;
        }
        message.start();
        for (&f, &escape) in fields.iter().zip(escape) {
            message.field(escape, |buf| match texts.get(row, f) {
                Some(text) => {
                    buf.extend_from_slice(text);
                    true
                }
                None => false,
            });
        }
        out.push_digest(&message.bytes)?;
    }
    Ok(out)
}

/// `natural_key_fingerprint` with `version` over `fields` of canonical texts (null: empty).
pub fn fingerprint_texts(version: i64, texts: &FieldTexts<'_>, fields: &[usize]) -> Result<ArrayRef> {
    fingerprint_texts_into(HexOutput::with_capacity(texts.rows()), version, texts, fields)?.finish()
}

/// [`fingerprint_texts`] and every digest's first 16 bytes as two big-endian words (the number
/// its first 32 hex digits spell).
pub fn fingerprint_texts_with_heads(
    version: i64,
    texts: &FieldTexts<'_>,
    fields: &[usize],
) -> Result<(ArrayRef, Vec<[u64; 2]>)> {
    fingerprint_texts_into(HexOutput::with_heads(texts.rows()), version, texts, fields)?.finish_with_heads()
}

fn fingerprint_texts_into(
    mut out: HexOutput,
    version: i64,
    texts: &FieldTexts<'_>,
    fields: &[usize],
) -> Result<HexOutput> {
    let rows = texts.rows();
    let mut message = KeyMessage::new();
    for row in 0..rows {
        message.start(version);
        for &f in fields {
            message.field(|buf| {
                if let Some(text) = texts.get(row, f) {
                    buf.extend_from_slice(text);
                }
            });
        }
        out.push_digest(&message.bytes)?;
    }
    Ok(out)
}

/// Escape `\` as `\\` and `|` as `\|` in `buf[start..]`, in place. Common case (nothing
/// to escape) is one scan and no copy.
fn escape_from(buf: &mut Vec<u8>, start: usize, scratch: &mut Vec<u8>) {
    let needs_escape = |b: &u8| *b == b'\\' || *b == b'|';
    if !buf[start..].iter().any(needs_escape) {
        return;
    }
    scratch.clear();
    scratch.extend_from_slice(&buf[start..]);
    buf.truncate(start);
    for byte in scratch.iter() {
        if needs_escape(byte) {
            buf.push(b'\\');
        }
        buf.push(*byte);
    }
}

/// `natural_key_fingerprint` of `num_rows` rows. A null per-row version is an error: the
/// version comes from the contract and is never missing.
pub(crate) fn fingerprint_columns(
    version: KeyVersion<'_>,
    columns: &[CanonicalColumn<'_>],
    num_rows: usize,
) -> Result<ArrayRef> {
    let mut out = HexOutput::with_capacity(num_rows);
    let mut message = KeyMessage::new();
    for row in 0..num_rows {
        let version = match version {
            KeyVersion::Constant(v) => v,
            KeyVersion::PerRow(versions) if versions.is_valid(row) => versions.value(row),
            KeyVersion::PerRow(_) => {
                return exec_err!("natural_key_fingerprint: version is null in row {}", row + 1);
            }
        };
        message.start(version);
        for column in columns {
            message.field(|buf| {
                column.write(row, buf);
            });
        }
        out.push_digest(&message.bytes)?;
    }
    out.finish()
}

/// Builds a `Utf8` array by appending bytes to one values buffer; UTF-8 is validated once,
/// in [`Utf8Output::finish`].
pub(crate) struct Utf8Output {
    values: Vec<u8>,
    offsets: Vec<i32>,
    nulls: NullBufferBuilder,
}

impl Utf8Output {
    /// Room for `rows` values of `bytes` bytes in total.
    pub(crate) fn with_capacity(rows: usize, bytes: usize) -> Self {
        let mut offsets = Vec::with_capacity(rows + 1);
        offsets.push(0);
        Utf8Output {
            values: Vec::with_capacity(bytes),
            offsets,
            nulls: NullBufferBuilder::new(rows),
        }
    }

    /// The values buffer: append the next value's bytes, then call [`Self::end_value`].
    pub(crate) fn values_mut(&mut self) -> &mut Vec<u8> {
        &mut self.values
    }

    /// Close the value appended since the previous call (may be empty).
    pub(crate) fn end_value(&mut self) -> Result<()> {
        self.push_offset()?;
        self.nulls.append_non_null();
        Ok(())
    }

    /// Append a null (anything appended since the last value is discarded).
    pub(crate) fn push_null(&mut self) -> Result<()> {
        let last = self.offsets.last().copied().unwrap_or(0);
        self.values.truncate(last as usize);
        self.push_offset()?;
        self.nulls.append_null();
        Ok(())
    }

    fn push_offset(&mut self) -> Result<()> {
        let end = i32::try_from(self.values.len())
            .map_err(|_| exec_datafusion_err!("text output of one batch exceeds 2 GiB; use smaller batches"))?;
        self.offsets.push(end);
        Ok(())
    }

    /// The finished `Utf8` array.
    pub(crate) fn finish(mut self) -> Result<ArrayRef> {
        let offsets = OffsetBuffer::new(ScalarBuffer::from(self.offsets));
        let values = Buffer::from_vec(self.values);
        let array = StringArray::try_new(offsets, values, self.nulls.finish())?;
        Ok(Arc::new(array))
    }

    /// [`Self::finish`] without the UTF-8 validation pass over the values (768 MB of hex digests
    /// an SF1 ingest); the offsets are still checked.
    ///
    /// # Safety
    /// Every byte appended to the values is ASCII.
    unsafe fn finish_ascii(mut self) -> Result<ArrayRef> {
        let offsets = OffsetBuffer::new(ScalarBuffer::from(self.offsets));
        let values = Buffer::from_vec(self.values);
        let nulls = self.nulls.finish();
        if offsets.last().is_some_and(|&end| end as usize > values.len())
            || nulls.as_ref().is_some_and(|n| n.len() != offsets.len() - 1)
        {
            return exec_err!("internal error: malformed digest column");
        }
        // SAFETY: offsets are monotonic (each pushed as the length of the growing `values`) and
        // end within `values`; all bytes are ASCII (the caller's contract), so every value is
        // valid UTF-8.
        let array = unsafe { StringArray::new_unchecked(offsets, values, nulls) };
        Ok(Arc::new(array))
    }
}

/// A column of hex digests, and optionally the first 16 bytes of each digest as two big-endian
/// words (the number the first 32 hex digits spell), for callers that key rows by them.
struct HexOutput {
    out: Utf8Output,
    heads: Option<Vec<[u64; 2]>>,
}

impl HexOutput {
    fn with_capacity(rows: usize) -> Self {
        HexOutput {
            out: Utf8Output::with_capacity(rows, rows * 64),
            heads: None,
        }
    }

    /// [`Self::with_capacity`], also keeping every digest's head.
    fn with_heads(rows: usize) -> Self {
        HexOutput {
            heads: Some(Vec::with_capacity(rows)),
            ..Self::with_capacity(rows)
        }
    }

    /// Append the hex SHA-256 of `message`.
    fn push_digest(&mut self, message: &[u8]) -> Result<()> {
        self.push_digest_of(&[message])
    }

    /// Append the hex SHA-256 of the concatenation of `parts`.
    fn push_digest_of(&mut self, parts: &[&[u8]]) -> Result<()> {
        let mut hasher = Sha256::new();
        for part in parts {
            hasher.update(part);
        }
        // Finalized in place and read byte by byte: copying the digest out as a whole read it
        // back before its word-sized stores had landed (a store-forwarding stall a digest).
        let mut digest = sha2::digest::Output::<Sha256>::default();
        hasher.finalize_into(&mut digest);
        let mut hex = [0u8; 64];
        for (byte, pair) in digest.iter().zip(hex.chunks_exact_mut(2)) {
            pair.copy_from_slice(&HEX_PAIRS[usize::from(*byte)]);
        }
        if let Some(heads) = &mut self.heads {
            let word = |k: usize| {
                let mut w = [0u8; 8];
                w.copy_from_slice(&digest[k..k + 8]);
                u64::from_be_bytes(w)
            };
            heads.push([word(0), word(8)]);
        }
        self.out.values_mut().extend_from_slice(&hex);
        self.out.end_value()
    }

    fn finish(self) -> Result<ArrayRef> {
        // SAFETY: only `push_digest_of` appends values: 64 digits of `HEX_PAIRS`, all ASCII.
        unsafe { self.out.finish_ascii() }
    }

    /// The column and the heads (empty unless made [`Self::with_heads`]).
    fn finish_with_heads(mut self) -> Result<(ArrayRef, Vec<[u64; 2]>)> {
        let heads = self.heads.take().unwrap_or_default();
        Ok((self.finish()?, heads))
    }
}
