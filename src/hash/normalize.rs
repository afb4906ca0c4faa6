//! The `normalize` steps of a contract field (docs/formats.md#hashes), as a per-value function and as an
//! Arrow array kernel.
//!
//! Role: shape the text that is hashed and checked (`" Ann@X.com"` and `"ann@x.com"` must give
//! one fingerprint with `[trim, lower]`). Steps apply to strings only, in the order listed.
//!
//! Hazards:
//! * The step semantics are part of the hash formula: changing what a step does changes
//!   fingerprints and row hashes of existing data. Treat every behaviour here as frozen.
//! * `lower` must match `str::to_lowercase`, including the final-sigma rule; the char-by-char
//!   path is only used when the text has no `Σ`, otherwise we defer to the standard library.
//! * `collapse_whitespace` does not trim; combine it with `trim` when that is wanted.
//! * The kernel writes `Utf8` (32-bit offsets): a batch whose normalized text exceeds 2 GiB is
//!   an error rather than a panic.

use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, AsArray, StringBuilder};
use datafusion::arrow::datatypes::DataType;
use datafusion::common::{exec_err, plan_err};
use datafusion::error::Result;
use unicode_normalization::{IsNormalized, UnicodeNormalization, is_nfkc_quick};

/// One `normalize` step of a contract field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NormalizeStep {
    /// Remove leading and trailing Unicode white space (`str::trim`).
    Trim,
    /// Unicode lower case (`str::to_lowercase`).
    Lower,
    /// Unicode upper case (`str::to_uppercase`).
    Upper,
    /// Runs of Unicode white space become one ASCII space; no trimming.
    CollapseWhitespace,
    /// Remove ASCII punctuation (`char::is_ascii_punctuation`).
    StripPunctuation,
    /// Keep only the ASCII digits `0`-`9`.
    DigitsOnly,
    /// Unicode normalization form KC.
    Nfkc,
}

impl NormalizeStep {
    /// Every valid step name, in declaration order (used in error messages).
    pub const NAMES: &'static [&'static str] = &[
        "trim",
        "lower",
        "upper",
        "collapse_whitespace",
        "strip_punctuation",
        "digits_only",
        "nfkc",
    ];

    const ALL: [NormalizeStep; 7] = [
        NormalizeStep::Trim,
        NormalizeStep::Lower,
        NormalizeStep::Upper,
        NormalizeStep::CollapseWhitespace,
        NormalizeStep::StripPunctuation,
        NormalizeStep::DigitsOnly,
        NormalizeStep::Nfkc,
    ];

    /// Parse a step name exactly as written in a contract (case-sensitive).
    pub fn parse(s: &str) -> Option<NormalizeStep> {
        Self::ALL.iter().copied().find(|step| step.name() == s)
    }

    /// The step's name as written in a contract.
    pub fn name(&self) -> &'static str {
        match self {
            NormalizeStep::Trim => "trim",
            NormalizeStep::Lower => "lower",
            NormalizeStep::Upper => "upper",
            NormalizeStep::CollapseWhitespace => "collapse_whitespace",
            NormalizeStep::StripPunctuation => "strip_punctuation",
            NormalizeStep::DigitsOnly => "digits_only",
            NormalizeStep::Nfkc => "nfkc",
        }
    }
}

impl std::fmt::Display for NormalizeStep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Parse a comma-separated list of step names (`"trim, lower"`), as taken by the
/// `normalize_text` UDF. Blanks around names are ignored; an empty or all-blank list means
/// "no steps". An unknown name is a planning error that lists the valid names.
pub fn parse_steps(list: &str) -> Result<Vec<NormalizeStep>> {
    if list.trim().is_empty() {
        return Ok(Vec::new());
    }
    list.split(',')
        .map(|name| {
            let name = name.trim();
            match NormalizeStep::parse(name) {
                Some(step) => Ok(step),
                None => plan_err!(
                    "unknown normalize step \"{name}\"; valid steps are: {}",
                    NormalizeStep::NAMES.join(", ")
                ),
            }
        })
        .collect()
}

/// Apply `steps` in order to `input`, writing the result into `out` (cleared first).
///
/// `scratch` is a reusable buffer: with both buffers holding enough capacity nothing is
/// allocated (except `lower` on text containing `Σ`, and `nfkc` on text that is not
/// already NFKC, whose decomposition buffer may spill).
pub fn normalize_into(steps: &[NormalizeStep], input: &str, out: &mut String, scratch: &mut String) {
    out.clear();
    let Some((first, rest)) = steps.split_first() else {
        out.push_str(input);
        return;
    };
    apply_step(*first, input, out);
    for step in rest {
        scratch.clear();
        apply_step(*step, out, scratch);
        std::mem::swap(out, scratch);
    }
}

/// Append the result of one step on `src` to `dst`.
fn apply_step(step: NormalizeStep, src: &str, dst: &mut String) {
    match step {
        NormalizeStep::Trim => dst.push_str(src.trim()),
        NormalizeStep::Lower => push_lower(src, dst),
        NormalizeStep::Upper => push_upper(src, dst),
        NormalizeStep::CollapseWhitespace => push_collapsed(src, dst),
        NormalizeStep::StripPunctuation => dst.extend(src.chars().filter(|c| !c.is_ascii_punctuation())),
        NormalizeStep::DigitsOnly => dst.extend(src.chars().filter(char::is_ascii_digit)),
        NormalizeStep::Nfkc => push_nfkc(src, dst),
    }
}

/// `str::to_lowercase` without allocating. Only `Σ` is context-sensitive in
/// `to_lowercase` (final sigma); text containing it goes through the standard library.
fn push_lower(src: &str, dst: &mut String) {
    if src.is_ascii() {
        let start = dst.len();
        dst.push_str(src);
        dst[start..].make_ascii_lowercase();
    } else if src.contains('Σ') {
        dst.push_str(&src.to_lowercase());
    } else {
        for c in src.chars() {
            dst.extend(c.to_lowercase());
        }
    }
}

/// `str::to_uppercase` (which is purely char-by-char) without allocating.
fn push_upper(src: &str, dst: &mut String) {
    if src.is_ascii() {
        let start = dst.len();
        dst.push_str(src);
        dst[start..].make_ascii_uppercase();
    } else {
        for c in src.chars() {
            dst.extend(c.to_uppercase());
        }
    }
}

/// Replace each run of Unicode white space by one ASCII space, keeping leading and
/// trailing runs (as one space each).
fn push_collapsed(src: &str, dst: &mut String) {
    let mut in_run = false;
    for c in src.chars() {
        if c.is_whitespace() {
            if !in_run {
                dst.push(' ');
                in_run = true;
            }
        } else {
            dst.push(c);
            in_run = false;
        }
    }
}

/// Unicode NFKC, skipping the work when the quick check says the text already is NFKC.
fn push_nfkc(src: &str, dst: &mut String) {
    if src.is_ascii() || is_nfkc_quick(src.chars()) == IsNormalized::Yes {
        dst.push_str(src);
    } else {
        dst.extend(src.nfkc());
    }
}

/// Array kernel: normalize a `Utf8` / `LargeUtf8` / `Utf8View` (or all-null `Null`) array
/// into a `Utf8` array. Nulls stay null. One builder and two reused buffers per call.
pub fn normalize_array(steps: &[NormalizeStep], array: &dyn Array) -> Result<ArrayRef> {
    match array.data_type() {
        DataType::Utf8 => normalize_iter(steps, array.as_string::<i32>().iter(), array.len()),
        DataType::LargeUtf8 => normalize_iter(steps, array.as_string::<i64>().iter(), array.len()),
        DataType::Utf8View => normalize_iter(steps, array.as_string_view().iter(), array.len()),
        DataType::Null => normalize_iter(steps, std::iter::repeat_n(None, array.len()), array.len()),
        other => exec_err!("normalize steps apply to strings only (Utf8, LargeUtf8, Utf8View), got {other}"),
    }
}

/// Normalize every value of `values` into one `StringBuilder`.
fn normalize_iter<'a>(
    steps: &[NormalizeStep],
    values: impl Iterator<Item = Option<&'a str>>,
    len: usize,
) -> Result<ArrayRef> {
    let mut builder = StringBuilder::with_capacity(len, len * 16);
    let mut out = String::new();
    let mut scratch = String::new();
    let mut total: usize = 0;
    for value in values {
        match value {
            None => builder.append_null(),
            Some(text) => {
                normalize_into(steps, text, &mut out, &mut scratch);
                total += out.len();
                if total > i32::MAX as usize {
                    return exec_err!("normalized text of one batch exceeds 2 GiB; use smaller batches");
                }
                builder.append_value(&out);
            }
        }
    }
    Ok(Arc::new(builder.finish()))
}
