//! Turning the text of one field into its contract type, checking it, and appending it to an
//! Arrow builder.
//!
//! Parsing is strict and lossless: a decimal with more fraction digits than its scale, a
//! timestamp finer than microseconds or an integer out of range is a `type:<field>` failure,
//! never a silent rounding. Hot paths (ISO dates, integers, decimals) avoid chrono and
//! allocation; everything here works on borrowed bytes.

use std::sync::Arc;

use chrono::{DateTime, NaiveDate, NaiveDateTime};
use datafusion::arrow::array::{
    ArrayBuilder, ArrayRef, BooleanBuilder, Date32Builder, Decimal128Builder, Float64Builder, Int32Builder,
    Int64Builder, StringBuilder, TimestampMicrosecondBuilder,
};

use crate::hash::normalize::normalize_into;
use crate::spec::contract::{Bound, Field, FieldType};

/// A typed value borrowed from the input.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Value<'a> {
    Str(&'a str),
    Int(i64),
    Float(f64),
    /// Unscaled, at the field's scale.
    Decimal(i128),
    Bool(bool),
    /// Days since 1970-01-01.
    Date(i32),
    /// Microseconds since the epoch, UTC.
    Timestamp(i64),
}

/// Why a row was rejected: the rule name (docs/guide.md#contracts) and a reason for people.
#[derive(Debug, Clone, PartialEq)]
pub struct Rejection {
    pub rule: String,
    pub reason: String,
}

impl Rejection {
    pub fn new(rule: impl Into<String>, reason: impl Into<String>) -> Self {
        Rejection {
            rule: rule.into(),
            reason: reason.into(),
        }
    }
}

const MAX_SHOWN: usize = 60;

/// A value quoted for an error message, shortened when long.
pub fn shown(text: &str) -> String {
    if text.chars().count() <= MAX_SHOWN {
        format!("\"{text}\"")
    } else {
        let cut: String = text.chars().take(MAX_SHOWN).collect();
        format!("\"{cut}…\"")
    }
}

/// Parse `text` as `field`'s type. `Err` carries the `type:<field>` rejection.
///
/// Inlined into the row loop: returned through memory, its result was read back before the
/// stores had landed (a store-forwarding stall on every field, ~4% of an ingest's CPU).
#[inline(always)]
pub fn parse_value<'a>(field: &Field, text: &'a str) -> Result<Value<'a>, Rejection> {
    // Most values have no surrounding white space: two byte tests instead of a Unicode trim.
    let t = || match text.as_bytes() {
        [first, .., last] if first.is_ascii_graphic() && last.is_ascii_graphic() => text,
        [only] if only.is_ascii_graphic() => text,
        _ => text.trim(),
    };
    let fail = |expected: &str| {
        Rejection::new(
            format!("type:{}", field.name),
            format!("{}: expected {expected}, found {}", field.name, shown(text)),
        )
    };
    match field.ty {
        FieldType::String => Ok(Value::Str(text)),
        FieldType::Int32 => match t().parse::<i32>() {
            Ok(v) => Ok(Value::Int(v as i64)),
            Err(_) => Err(fail("an int32 (-2147483648..=2147483647)")),
        },
        FieldType::Int64 => match t().parse::<i64>() {
            Ok(v) => Ok(Value::Int(v)),
            Err(_) => Err(fail("an int64")),
        },
        FieldType::Float64 => match t().parse::<f64>() {
            Ok(v) => Ok(Value::Float(v)),
            Err(_) => Err(fail("a float64 (e.g. 1.5, -2e3, NaN, inf)")),
        },
        FieldType::Decimal { precision, scale } => match parse_decimal(t().as_bytes(), scale) {
            Some(v) if fits_precision(v, precision) => Ok(Value::Decimal(v)),
            Some(_) => Err(fail(&format!(
                "a decimal({precision},{scale}) with at most {} integer digits",
                precision as i16 - scale as i16
            ))),
            None => Err(fail(&format!(
                "a decimal({precision},{scale}) with at most {scale} fraction digits"
            ))),
        },
        FieldType::Boolean => match parse_bool(t()) {
            Some(b) => Ok(Value::Bool(b)),
            None => Err(fail("a boolean (true/false, t/f, yes/no, y/n, 1/0)")),
        },
        FieldType::Date => match parse_date(t(), field.format.as_deref()) {
            Some(d) => Ok(Value::Date(d)),
            None => Err(fail(&format!(
                "a date as {}",
                field.format.as_deref().unwrap_or("YYYY-MM-DD")
            ))),
        },
        FieldType::Timestamp => match parse_timestamp(t(), field.format.as_deref()) {
            Some(d) => Ok(Value::Timestamp(d)),
            None => Err(fail(&format!(
                "a timestamp as {} (at most microsecond precision)",
                field
                    .format
                    .as_deref()
                    .unwrap_or("ISO 8601, e.g. 2026-11-03T06:00:00.25Z")
            ))),
        },
    }
}

/// `10^k` for every decimal precision (at most 38 digits).
const POW10: [u128; 39] = {
    let mut t = [1u128; 39];
    let mut k = 1;
    while k < 39 {
        t[k] = t[k - 1] * 10;
        k += 1;
    }
    t
};

fn fits_precision(v: i128, precision: u8) -> bool {
    POW10.get(usize::from(precision)).is_none_or(|&p| v.unsigned_abs() < p)
}

pub fn parse_bool(s: &str) -> Option<bool> {
    match s.len() {
        1..=5 => {}
        _ => return None,
    }
    let mut buf = [0u8; 5];
    for (i, b) in s.bytes().enumerate() {
        buf[i] = b.to_ascii_lowercase();
    }
    match &buf[..s.len()] {
        b"true" | b"t" | b"yes" | b"y" | b"1" => Some(true),
        b"false" | b"f" | b"no" | b"n" | b"0" => Some(false),
        _ => None,
    }
}

/// Parse a plain decimal (`-12.5`, `+3`, `.25`) into an unscaled i128 at `scale`. More fraction
/// digits than `scale` (other than trailing zeros) is `None`: ingot never rounds input.
pub fn parse_decimal(s: &[u8], scale: i8) -> Option<i128> {
    // The usual value fits 64 bits: parse it there (one cheap multiply a digit); anything else
    // (longer, or not a decimal at all) takes the 128-bit way, which decides.
    parse_decimal_u64(s, scale).or_else(|| parse_decimal_wide(s, scale))
}

/// [`parse_decimal`] of a value whose unscaled magnitude fits a `u64`; `None` otherwise.
fn parse_decimal_u64(s: &[u8], scale: i8) -> Option<i128> {
    let pad = u32::try_from(scale).ok()?;
    let mut value: u64 = 0;
    let (neg, frac_digits) = scan_decimal(s, scale, |d| {
        value = value.checked_mul(10)?.checked_add(u64::from(d))?;
        Some(())
    })?;
    let value = i128::from(value.checked_mul(10u64.checked_pow(pad - frac_digits)?)?);
    Some(if neg { -value } else { value })
}

fn parse_decimal_wide(s: &[u8], scale: i8) -> Option<i128> {
    let mut value: i128 = 0;
    let (neg, frac_digits) = scan_decimal(s, scale, |d| {
        value = value.checked_mul(10)?.checked_add(i128::from(d))?;
        Some(())
    })?;
    for _ in frac_digits as i32..scale as i32 {
        value = value.checked_mul(10)?;
    }
    Some(if neg { -value } else { value })
}

/// Read a plain decimal's digits into `push` (at most `scale` fraction digits; further ones must
/// be zeros and are dropped): its sign and how many fraction digits were pushed. `None` for text
/// that is not a decimal, or when `push` overflows.
fn scan_decimal(s: &[u8], scale: i8, mut push: impl FnMut(u8) -> Option<()>) -> Option<(bool, u32)> {
    let (neg, digits) = match s.first()? {
        b'-' => (true, &s[1..]),
        b'+' => (false, &s[1..]),
        _ => (false, s),
    };
    let mut frac_digits: u32 = 0;
    let mut seen_dot = false;
    let mut seen_digit = false;
    for &b in digits {
        match b {
            b'0'..=b'9' => {
                seen_digit = true;
                if seen_dot {
                    if frac_digits as i32 >= scale as i32 {
                        if b != b'0' {
                            return None;
                        }
                        continue;
                    }
                    frac_digits += 1;
                }
                push(b - b'0')?;
            }
            b'.' if !seen_dot => seen_dot = true,
            _ => return None,
        }
    }
    seen_digit.then_some((neg, frac_digits))
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
pub fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = if y >= 0 { y } else { y - 399 } / 400;
    let yoe = y - era * 400;
    let m = m as i64;
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + d as i64 - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146097 + doe - 719468
}

fn digits(s: &[u8]) -> Option<u32> {
    let mut v = 0u32;
    for &b in s {
        if !b.is_ascii_digit() {
            return None;
        }
        v = v * 10 + (b - b'0') as u32;
    }
    Some(v)
}

fn days_in_month(y: i64, m: u32) -> u32 {
    match m {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        _ if (y % 4 == 0 && y % 100 != 0) || y % 400 == 0 => 29,
        _ => 28,
    }
}

/// `YYYY-MM-DD` without chrono.
fn parse_iso_date(s: &[u8]) -> Option<i32> {
    if s.len() != 10 || s[4] != b'-' || s[7] != b'-' {
        return None;
    }
    let y = digits(&s[0..4])? as i64;
    let m = digits(&s[5..7])?;
    let d = digits(&s[8..10])?;
    if !(1..=12).contains(&m) || d == 0 || d > days_in_month(y, m) {
        return None;
    }
    i32::try_from(days_from_civil(y, m, d)).ok()
}

/// Parse a date: ISO `YYYY-MM-DD` by default, or a chrono strftime `format`.
pub fn parse_date(s: &str, format: Option<&str>) -> Option<i32> {
    match format {
        None => parse_iso_date(s.as_bytes()),
        Some(f) => {
            let d = NaiveDate::parse_from_str(s, f).ok()?;
            let epoch = NaiveDate::from_ymd_opt(1970, 1, 1)?;
            i32::try_from((d - epoch).num_days()).ok()
        }
    }
}

fn micros_of(dt: NaiveDateTime) -> Option<i64> {
    let utc = dt.and_utc();
    if !utc.timestamp_subsec_nanos().is_multiple_of(1000) {
        return None;
    }
    Some(utc.timestamp_micros())
}

/// Parse a timestamp to microseconds UTC. Default: RFC 3339 / ISO 8601 with `T` or a space, an
/// optional fraction and an optional offset (`Z`, `+02:00`); without an offset the value is UTC.
/// With a strftime `format`, an offset is used when the format has one.
pub fn parse_timestamp(s: &str, format: Option<&str>) -> Option<i64> {
    match format {
        None => {
            if let Ok(dt) = DateTime::parse_from_rfc3339(s) {
                return micros_of(dt.naive_utc());
            }
            for f in [
                "%Y-%m-%dT%H:%M:%S%.f",
                "%Y-%m-%d %H:%M:%S%.f",
                "%Y-%m-%d %H:%M:%S%.f%:z",
                "%Y-%m-%dT%H:%M",
            ] {
                if f.ends_with("%:z") {
                    if let Ok(dt) = DateTime::parse_from_str(s, f) {
                        return micros_of(dt.naive_utc());
                    }
                } else if let Ok(dt) = NaiveDateTime::parse_from_str(s, f) {
                    return micros_of(dt);
                }
            }
            None
        }
        Some(f) => {
            if let Ok(dt) = DateTime::parse_from_str(s, f) {
                return micros_of(dt.naive_utc());
            }
            micros_of(NaiveDateTime::parse_from_str(s, f).ok()?)
        }
    }
}

/// Check `min`, `max`, `allowed` and `pattern` (on the normalized value) for a non-null value.
/// `scratch` buffers are reused across rows.
#[inline]
pub fn check_value(field: &Field, value: &Value<'_>, norm: &mut String, scratch: &mut String) -> Option<Rejection> {
    if field.min.is_none() && field.max.is_none() && field.allowed.is_none() && field.pattern.is_none() {
        return None;
    }
    let normalized = match value {
        Value::Str(s) if field.allowed.is_some() || field.pattern.is_some() => {
            normalize_into(&field.normalize, s, norm, scratch);
            Some(norm.as_str())
        }
        _ => None,
    };
    check_normalized(field, value, normalized)
}

/// [`check_value`] for a caller that already has the value's text after the field's normalize
/// steps (`normalized`; `None` means the string as it is): a string is normalized once per row.
/// Inlined down to the test for a field without checks (most fields): no call per value.
#[inline(always)]
pub fn check_normalized(field: &Field, value: &Value<'_>, normalized: Option<&str>) -> Option<Rejection> {
    if field.min.is_none() && field.max.is_none() && field.allowed.is_none() && field.pattern.is_none() {
        return None;
    }
    check_constraints(field, value, normalized)
}

/// The checks of [`check_normalized`] for a field that has some.
#[inline(never)]
fn check_constraints(field: &Field, value: &Value<'_>, normalized: Option<&str>) -> Option<Rejection> {
    let cmp = |b: &Bound| -> Option<std::cmp::Ordering> {
        match (value, b) {
            (Value::Int(v), Bound::Int(b)) => Some(v.cmp(b)),
            (Value::Float(v), Bound::Float(b)) => v.partial_cmp(b),
            (Value::Decimal(v), Bound::Decimal(b)) => Some(v.cmp(b)),
            (Value::Date(v), Bound::Date(b)) => Some(v.cmp(b)),
            (Value::Timestamp(v), Bound::Timestamp(b)) => Some(v.cmp(b)),
            _ => None,
        }
    };
    if let Some(b) = &field.min
        && cmp(b) != Some(std::cmp::Ordering::Greater)
        && cmp(b) != Some(std::cmp::Ordering::Equal)
    {
        return Some(Rejection::new(
            format!("min:{}", field.name),
            format!(
                "{}: {} is below the minimum {}",
                field.name,
                display(value, field),
                display_bound(b, field)
            ),
        ));
    }
    if let Some(b) = &field.max
        && cmp(b) != Some(std::cmp::Ordering::Less)
        && cmp(b) != Some(std::cmp::Ordering::Equal)
    {
        return Some(Rejection::new(
            format!("max:{}", field.name),
            format!(
                "{}: {} is above the maximum {}",
                field.name,
                display(value, field),
                display_bound(b, field)
            ),
        ));
    }
    if let Value::Str(s) = value {
        if field.allowed.is_none() && field.pattern.is_none() {
            return None;
        }
        let norm = normalized.unwrap_or(s);
        if let Some(allowed) = &field.allowed
            && !allowed.iter().any(|a| a == norm)
        {
            return Some(Rejection::new(
                format!("allowed:{}", field.name),
                format!("{}: {} is not one of: {}", field.name, shown(norm), allowed.join(", ")),
            ));
        }
        if let Some(p) = &field.pattern
            && !p.is_match(norm)
        {
            return Some(Rejection::new(
                format!("pattern:{}", field.name),
                format!(
                    "{}: {} does not match the pattern {}",
                    field.name,
                    shown(norm),
                    p.as_str()
                ),
            ));
        }
    }
    None
}

fn display(v: &Value<'_>, field: &Field) -> String {
    match v {
        Value::Str(s) => shown(s),
        Value::Int(i) => i.to_string(),
        Value::Float(f) => f.to_string(),
        Value::Decimal(d) => display_bound(&Bound::Decimal(*d), field),
        Value::Bool(b) => b.to_string(),
        Value::Date(d) => display_bound(&Bound::Date(*d), field),
        Value::Timestamp(t) => display_bound(&Bound::Timestamp(*t), field),
    }
}

fn display_bound(b: &Bound, field: &Field) -> String {
    match b {
        Bound::Int(i) => i.to_string(),
        Bound::Float(f) => f.to_string(),
        Bound::Decimal(d) => {
            let scale = match field.ty {
                FieldType::Decimal { scale, .. } => scale as u32,
                _ => 0,
            };
            let p = 10i128.pow(scale);
            let sign = if *d < 0 { "-" } else { "" };
            if scale == 0 {
                format!("{d}")
            } else {
                format!(
                    "{sign}{}.{:0width$}",
                    d.unsigned_abs() / p as u128,
                    d.unsigned_abs() % p as u128,
                    width = scale as usize
                )
            }
        }
        Bound::Date(d) => chrono::DateTime::from_timestamp(*d as i64 * 86400, 0)
            .map(|t| t.format("%Y-%m-%d").to_string())
            .unwrap_or_else(|| d.to_string()),
        Bound::Timestamp(t) => chrono::DateTime::from_timestamp_micros(*t)
            .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true))
            .unwrap_or_else(|| t.to_string()),
    }
}

/// An Arrow builder for one contract field.
pub enum ColumnBuilder {
    Str(StringBuilder),
    I32(Int32Builder),
    I64(Int64Builder),
    F64(Float64Builder),
    Dec(Decimal128Builder, u8, i8),
    Bool(BooleanBuilder),
    Date(Date32Builder),
    Ts(TimestampMicrosecondBuilder),
}

impl ColumnBuilder {
    pub fn new(ty: FieldType, capacity: usize) -> ColumnBuilder {
        match ty {
            FieldType::String => ColumnBuilder::Str(StringBuilder::with_capacity(capacity, capacity * 16)),
            FieldType::Int32 => ColumnBuilder::I32(Int32Builder::with_capacity(capacity)),
            FieldType::Int64 => ColumnBuilder::I64(Int64Builder::with_capacity(capacity)),
            FieldType::Float64 => ColumnBuilder::F64(Float64Builder::with_capacity(capacity)),
            FieldType::Decimal { precision, scale } => {
                ColumnBuilder::Dec(Decimal128Builder::with_capacity(capacity), precision, scale)
            }
            FieldType::Boolean => ColumnBuilder::Bool(BooleanBuilder::with_capacity(capacity)),
            FieldType::Date => ColumnBuilder::Date(Date32Builder::with_capacity(capacity)),
            FieldType::Timestamp => ColumnBuilder::Ts(TimestampMicrosecondBuilder::with_capacity(capacity)),
        }
    }

    pub fn append_null(&mut self) {
        match self {
            ColumnBuilder::Str(b) => b.append_null(),
            ColumnBuilder::I32(b) => b.append_null(),
            ColumnBuilder::I64(b) => b.append_null(),
            ColumnBuilder::F64(b) => b.append_null(),
            ColumnBuilder::Dec(b, _, _) => b.append_null(),
            ColumnBuilder::Bool(b) => b.append_null(),
            ColumnBuilder::Date(b) => b.append_null(),
            ColumnBuilder::Ts(b) => b.append_null(),
        }
    }

    /// Append a value already parsed for this builder's type.
    #[inline(always)]
    pub fn append(&mut self, v: &Value<'_>) {
        match (self, v) {
            (ColumnBuilder::Str(b), Value::Str(s)) => b.append_value(s),
            (ColumnBuilder::I32(b), Value::Int(i)) => b.append_value(*i as i32),
            (ColumnBuilder::I64(b), Value::Int(i)) => b.append_value(*i),
            (ColumnBuilder::F64(b), Value::Float(f)) => b.append_value(*f),
            (ColumnBuilder::Dec(b, _, _), Value::Decimal(d)) => b.append_value(*d),
            (ColumnBuilder::Bool(b), Value::Bool(x)) => b.append_value(*x),
            (ColumnBuilder::Date(b), Value::Date(d)) => b.append_value(*d),
            (ColumnBuilder::Ts(b), Value::Timestamp(t)) => b.append_value(*t),
            (b, _) => b.append_null(),
        }
    }

    pub fn len(&self) -> usize {
        match self {
            ColumnBuilder::Str(b) => b.len(),
            ColumnBuilder::I32(b) => b.len(),
            ColumnBuilder::I64(b) => b.len(),
            ColumnBuilder::F64(b) => b.len(),
            ColumnBuilder::Dec(b, _, _) => b.len(),
            ColumnBuilder::Bool(b) => b.len(),
            ColumnBuilder::Date(b) => b.len(),
            ColumnBuilder::Ts(b) => b.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Finish the column; the builder is reset and can be reused, with room for as many rows (and
    /// string bytes) as this batch had, so the next batch does not grow its buffers again.
    pub fn finish(&mut self) -> datafusion::error::Result<ArrayRef> {
        let rows = self.len();
        Ok(match self {
            ColumnBuilder::Str(b) => {
                let bytes = b.values_slice().len();
                Arc::new(std::mem::replace(b, StringBuilder::with_capacity(rows, bytes)).finish())
            }
            ColumnBuilder::I32(b) => Arc::new(std::mem::replace(b, Int32Builder::with_capacity(rows)).finish()),
            ColumnBuilder::I64(b) => Arc::new(std::mem::replace(b, Int64Builder::with_capacity(rows)).finish()),
            ColumnBuilder::F64(b) => Arc::new(std::mem::replace(b, Float64Builder::with_capacity(rows)).finish()),
            ColumnBuilder::Dec(b, p, s) => Arc::new(
                std::mem::replace(b, Decimal128Builder::with_capacity(rows))
                    .finish()
                    .with_precision_and_scale(*p, *s)?,
            ),
            ColumnBuilder::Bool(b) => Arc::new(std::mem::replace(b, BooleanBuilder::with_capacity(rows)).finish()),
            ColumnBuilder::Date(b) => Arc::new(std::mem::replace(b, Date32Builder::with_capacity(rows)).finish()),
            ColumnBuilder::Ts(b) => Arc::new(
                std::mem::replace(b, TimestampMicrosecondBuilder::with_capacity(rows))
                    .finish()
                    .with_timezone("UTC"),
            ),
        })
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        #![proptest_config(ProptestConfig { cases: 5000, failure_persistence: None, ..ProptestConfig::default() })]

        /// The 64-bit fast way gives what the 128-bit way gives, for decimal-looking text of any
        /// length (past 19 digits too) and any scale.
        #[test]
        fn decimals_parse_the_same_in_64_and_128_bits(text in "[-+]?[0-9]{0,24}(\\.[0-9]{0,6})?", scale in -2i8..8) {
            let wide = parse_decimal_wide(text.as_bytes(), scale);
            if let Some(fast) = parse_decimal_u64(text.as_bytes(), scale) {
                prop_assert_eq!(Some(fast), wide);
            }
            prop_assert_eq!(parse_decimal(text.as_bytes(), scale), wide);
        }
    }

    #[test]
    fn decimal_precision_bounds() {
        assert!(fits_precision(99_999, 5));
        assert!(!fits_precision(100_000, 5));
        assert!(!fits_precision(-100_000, 5));
        assert!(fits_precision(i128::MAX, 39));
        assert_eq!(parse_decimal(b"21168.23", 2), Some(2_116_823));
        assert_eq!(parse_decimal(b"-0.5", 2), Some(-50));
        assert_eq!(parse_decimal(b"17", 2), Some(1700));
        assert_eq!(parse_decimal(b"1.234", 2), None);
        assert_eq!(parse_decimal(b"1.230", 2), Some(123));
        assert_eq!(
            parse_decimal(b"99999999999999999999999.99", 2),
            Some(9_999_999_999_999_999_999_999_999)
        );
    }
}
