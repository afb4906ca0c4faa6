//! Canonical text of a typed value (docs/formats.md#hashes): the exact bytes that `row_hash`,
//! `natural_key_fingerprint` and `canonical_text` see.
//!
//! Role: turn one Arrow value into text that other tools can reproduce from the spec alone.
//! [`CanonicalColumn`] downcasts an array once; [`CanonicalColumn::write`] then appends one
//! value per call to a caller-owned buffer, with no allocation per row (except
//! `Decimal256`, formatted through arrow's big-integer `Display`).
//!
//! Hazards: these bytes are a persisted contract. Any change here changes every stored hash;
//! it needs a new row-hash format version, not an edit. Unsupported types are reported by
//! [`check_supported`] / [`CanonicalColumn::new`]; [`write_canonical`] cannot report them
//! and treats them as null, so callers must check the type first.

use std::io::Write as _;

use datafusion::arrow::array::{
    Array, ArrowPrimitiveType, AsArray, BooleanArray, LargeStringArray, PrimitiveArray, StringArray, StringViewArray,
};
use datafusion::arrow::buffer::{BooleanBuffer, NullBuffer};
use datafusion::arrow::datatypes::{
    DataType, Date32Type, Date64Type, Decimal32Type, Decimal64Type, Decimal128Type, Decimal256Type, Float32Type,
    Float64Type, Int8Type, Int16Type, Int32Type, Int64Type, TimeUnit, TimestampMicrosecondType,
    TimestampMillisecondType, TimestampNanosecondType, TimestampSecondType, UInt8Type, UInt16Type, UInt32Type,
    UInt64Type, i256,
};
use datafusion::common::{exec_datafusion_err, plan_err};
use datafusion::error::Result;

/// Human-readable list of the types that have a canonical text, for error messages.
pub const SUPPORTED_TYPES: &str = "Utf8, LargeUtf8, Utf8View, Int8, Int16, Int32, Int64, \
    UInt8, UInt16, UInt32, UInt64, Float32, Float64, Decimal32, Decimal64, Decimal128, \
    Decimal256, Boolean, Date32, Date64, Timestamp (any unit and zone), Null, and \
    Dictionary of any of these";

/// Check once per batch (or at planning) that values of `dt` have a canonical text.
pub fn check_supported(dt: &DataType) -> Result<()> {
    use DataType::*;
    match dt {
        Null | Utf8 | LargeUtf8 | Utf8View | Int8 | Int16 | Int32 | Int64 | UInt8 | UInt16 | UInt32 | UInt64
        | Float32 | Float64 | Decimal32(..) | Decimal64(..) | Decimal128(..) | Decimal256(..) | Boolean | Date32
        | Date64 | Timestamp(..) => Ok(()),
        Dictionary(_, values) if check_supported(values).is_ok() => Ok(()),
        other => plan_err!(
            "type {other} has no canonical text for hashing; supported types are: \
             {SUPPORTED_TYPES}"
        ),
    }
}

/// Append the canonical text of `array[row]` to `buf`; return `false` (writing nothing) if
/// the value is null.
///
/// Convenience for single values: it downcasts on every call. Loops should build a
/// [`CanonicalColumn`] once. An unsupported type also returns `false`; check it first with
/// [`check_supported`].
pub fn write_canonical(array: &dyn Array, row: usize, buf: &mut Vec<u8>) -> bool {
    match CanonicalColumn::new(array) {
        Ok(column) => column.write(row, buf),
        Err(_) => false,
    }
}

/// An array downcast once, ready to write the canonical text of any of its rows.
///
/// Rules, exactly:
/// * strings as they are; integers in plain decimal; booleans `true` / `false`;
/// * floats via Rust's `Display`, which is the shortest text that reads back as the same
///   float, positional, never an exponent (`1`, `1.5`, `-0`, `0.0000001`, `NaN`, `inf`, `-inf`);
/// * decimals in plain notation with exactly the declared scale (`12.50`, `-0.05`); scale 0
///   gives no dot; a negative scale `s` appends `-s` zeros to the unscaled integer (`0` stays
///   `0`);
/// * dates `YYYY-MM-DD` in the proleptic Gregorian calendar; years outside `0000..=9999` use
///   the ISO 8601 expanded form that chrono's `Display` also uses: `-0001-12-31`,
///   `+10000-01-01` (year 0 is 1 BC). `Date64` is floored to its day;
/// * timestamps (any unit; the stored value is the UTC epoch, whatever the zone) as
///   `YYYY-MM-DDTHH:MM:SS`, then `.` and the fraction without trailing zeros only when it is
///   not zero, then `Z`. Dates before 1970 floor correctly (`-1 ms` is
///   `1969-12-31T23:59:59.999Z`).
#[derive(Debug)]
pub struct CanonicalColumn<'a> {
    /// Validity of the rows (for a dictionary: of its keys).
    nulls: Option<&'a NullBuffer>,
    values: Values<'a>,
}

/// The typed values behind a [`CanonicalColumn`].
#[derive(Debug)]
enum Values<'a> {
    AllNull,
    Utf8(&'a StringArray),
    LargeUtf8(&'a LargeStringArray),
    Utf8View(&'a StringViewArray),
    I8(&'a [i8]),
    I16(&'a [i16]),
    I32(&'a [i32]),
    I64(&'a [i64]),
    U8(&'a [u8]),
    U16(&'a [u16]),
    U32(&'a [u32]),
    U64(&'a [u64]),
    F32(&'a [f32]),
    F64(&'a [f64]),
    Dec32(&'a [i32], i8),
    Dec64(&'a [i64], i8),
    Dec128(&'a [i128], i8),
    Dec256(&'a [i256], i8),
    Bool(&'a BooleanBuffer),
    Date32(&'a [i32]),
    Date64(&'a [i64]),
    Timestamp(&'a [i64], TimeUnit),
    /// Dictionary: normalized keys, and the values as their own column.
    Dict(Vec<usize>, Box<CanonicalColumn<'a>>),
}

impl<'a> CanonicalColumn<'a> {
    /// Downcast `array`; an error names the unsupported type and lists the supported ones.
    pub fn new(array: &'a dyn Array) -> Result<Self> {
        check_supported(array.data_type())?;
        let values = match array.data_type() {
            DataType::Null => Values::AllNull,
            DataType::Utf8 => Values::Utf8(downcast(array)?),
            DataType::LargeUtf8 => Values::LargeUtf8(downcast(array)?),
            DataType::Utf8View => Values::Utf8View(downcast(array)?),
            DataType::Int8 => Values::I8(prim::<Int8Type>(array)?),
            DataType::Int16 => Values::I16(prim::<Int16Type>(array)?),
            DataType::Int32 => Values::I32(prim::<Int32Type>(array)?),
            DataType::Int64 => Values::I64(prim::<Int64Type>(array)?),
            DataType::UInt8 => Values::U8(prim::<UInt8Type>(array)?),
            DataType::UInt16 => Values::U16(prim::<UInt16Type>(array)?),
            DataType::UInt32 => Values::U32(prim::<UInt32Type>(array)?),
            DataType::UInt64 => Values::U64(prim::<UInt64Type>(array)?),
            DataType::Float32 => Values::F32(prim::<Float32Type>(array)?),
            DataType::Float64 => Values::F64(prim::<Float64Type>(array)?),
            DataType::Decimal32(_, s) => Values::Dec32(prim::<Decimal32Type>(array)?, *s),
            DataType::Decimal64(_, s) => Values::Dec64(prim::<Decimal64Type>(array)?, *s),
            DataType::Decimal128(_, s) => Values::Dec128(prim::<Decimal128Type>(array)?, *s),
            DataType::Decimal256(_, s) => Values::Dec256(prim::<Decimal256Type>(array)?, *s),
            DataType::Boolean => Values::Bool(downcast::<BooleanArray>(array)?.values()),
            DataType::Date32 => Values::Date32(prim::<Date32Type>(array)?),
            DataType::Date64 => Values::Date64(prim::<Date64Type>(array)?),
            DataType::Timestamp(unit, _) => Values::Timestamp(timestamps(array, *unit)?, *unit),
            DataType::Dictionary(..) => dictionary(array)?,
            other => return plan_err!("type {other} has no canonical text for hashing"),
        };
        Ok(CanonicalColumn {
            nulls: array.nulls(),
            values,
        })
    }

    /// Whether the canonical text can contain `\` or `|` at all: only strings can. Numbers,
    /// decimals, booleans, dates and timestamps never do, so their row-hash escaping is a no-op.
    pub fn may_need_escape(&self) -> bool {
        match &self.values {
            Values::Utf8(_) | Values::LargeUtf8(_) | Values::Utf8View(_) => true,
            Values::Dict(_, values) => values.may_need_escape(),
            _ => false,
        }
    }

    /// Append the canonical text of row `row` to `buf`; `false` (nothing written) if null.
    ///
    /// `row` must be less than the array's length.
    pub fn write(&self, row: usize, buf: &mut Vec<u8>) -> bool {
        if self.nulls.is_some_and(|n| n.is_null(row)) {
            return false;
        }
        match &self.values {
            Values::AllNull => return false,
            Values::Utf8(a) => buf.extend_from_slice(a.value(row).as_bytes()),
            Values::LargeUtf8(a) => buf.extend_from_slice(a.value(row).as_bytes()),
            Values::Utf8View(a) => buf.extend_from_slice(a.value(row).as_bytes()),
            Values::I8(v) => write_int(v[row], buf),
            Values::I16(v) => write_int(v[row], buf),
            Values::I32(v) => write_int(v[row], buf),
            Values::I64(v) => write_int(v[row], buf),
            Values::U8(v) => write_int(v[row], buf),
            Values::U16(v) => write_int(v[row], buf),
            Values::U32(v) => write_int(v[row], buf),
            Values::U64(v) => write_int(v[row], buf),
            Values::F32(v) => write_display(v[row], buf),
            Values::F64(v) => write_display(v[row], buf),
            Values::Dec32(v, s) => write_decimal(i128::from(v[row]), *s, buf),
            Values::Dec64(v, s) => write_decimal(i128::from(v[row]), *s, buf),
            Values::Dec128(v, s) => write_decimal(v[row], *s, buf),
            Values::Dec256(v, s) => write_decimal256(v[row], *s, buf),
            Values::Bool(v) => buf.extend_from_slice(if v.value(row) { b"true" } else { b"false" }),
            Values::Date32(v) => write_date(i64::from(v[row]), buf),
            Values::Date64(v) => write_date(v[row].div_euclid(MILLIS_PER_DAY), buf),
            Values::Timestamp(v, unit) => write_timestamp(v[row], *unit, buf),
            Values::Dict(keys, values) => return values.write(keys[row], buf),
        }
        true
    }
}

const MILLIS_PER_DAY: i64 = 86_400_000;
const SECONDS_PER_DAY: i64 = 86_400;

/// Downcast to a concrete array type, as an error rather than a panic on mismatch.
fn downcast<T: 'static>(array: &dyn Array) -> Result<&T> {
    array
        .as_any()
        .downcast_ref::<T>()
        .ok_or_else(|| exec_datafusion_err!("array of type {} did not downcast as declared", array.data_type()))
}

/// The value slice of a primitive array (the slice is already offset for sliced arrays).
fn prim<T: ArrowPrimitiveType>(array: &dyn Array) -> Result<&[T::Native]> {
    Ok(downcast::<PrimitiveArray<T>>(array)?.values())
}

/// The raw epoch values of a timestamp array of any unit.
fn timestamps(array: &dyn Array, unit: TimeUnit) -> Result<&[i64]> {
    match unit {
        TimeUnit::Second => prim::<TimestampSecondType>(array),
        TimeUnit::Millisecond => prim::<TimestampMillisecondType>(array),
        TimeUnit::Microsecond => prim::<TimestampMicrosecondType>(array),
        TimeUnit::Nanosecond => prim::<TimestampNanosecondType>(array),
    }
}

/// A dictionary column: keys resolved once, values written through their own column.
fn dictionary(array: &dyn Array) -> Result<Values<'_>> {
    let dict = array
        .as_any_dictionary_opt()
        .ok_or_else(|| exec_datafusion_err!("array of type {} is not a dictionary", array.data_type()))?;
    let values = CanonicalColumn::new(dict.values().as_ref())?;
    Ok(Values::Dict(dict.normalized_keys(), Box::new(values)))
}

/// Plain decimal integer, no allocation.
fn write_int<I: itoa::Integer>(value: I, buf: &mut Vec<u8>) {
    let mut digits = itoa::Buffer::new();
    buf.extend_from_slice(digits.format(value).as_bytes());
}

/// `Display` text of a value (floats: shortest round-trip, positional).
fn write_display<T: std::fmt::Display>(value: T, buf: &mut Vec<u8>) {
    // Writing to a Vec<u8> cannot fail.
    let _ = write!(buf, "{value}");
}

/// Unscaled `value` with `scale` applied, in plain notation.
fn write_decimal(value: i128, scale: i8, buf: &mut Vec<u8>) {
    // Fast path (almost every value): integer part and fraction written apart, no shifting.
    if (1..=18).contains(&scale)
        && let Ok(small) = i64::try_from(value)
    {
        let pow = 10u64.pow(scale as u32);
        let abs = small.unsigned_abs();
        if small < 0 {
            buf.push(b'-');
        }
        write_int(abs / pow, buf);
        buf.push(b'.');
        write_padded(abs % pow, scale as usize, buf);
        return;
    }
    let start = buf.len();
    write_int(value, buf);
    apply_scale(buf, start, scale);
}

/// As [`write_decimal`], for 256-bit decimals.
fn write_decimal256(value: i256, scale: i8, buf: &mut Vec<u8>) {
    let start = buf.len();
    match value.to_i128() {
        Some(small) => write_int(small, buf),
        None => write_display(value, buf),
    }
    apply_scale(buf, start, scale);
}

/// Turn the signed integer text in `buf[start..]` into a decimal with `scale` fraction
/// digits: pad with leading zeros and insert the dot (scale > 0), or append zeros
/// (scale < 0, unless the value is zero).
fn apply_scale(buf: &mut Vec<u8>, start: usize, scale: i8) {
    let digits_start = start + usize::from(buf.get(start) == Some(&b'-'));
    let n_digits = buf.len() - digits_start;
    if scale > 0 {
        let scale = scale.unsigned_abs() as usize;
        if n_digits <= scale {
            let pad = scale + 1 - n_digits;
            buf.splice(digits_start..digits_start, std::iter::repeat_n(b'0', pad));
        }
        let dot = buf.len() - scale;
        buf.insert(dot, b'.');
    } else if scale < 0 && !(n_digits == 1 && buf[digits_start] == b'0') {
        buf.extend(std::iter::repeat_n(b'0', scale.unsigned_abs() as usize));
    }
}

/// Proleptic Gregorian (year, month, day) of a day count since 1970-01-01.
///
/// Howard Hinnant's `civil_from_days`, in i64 so that every Date32/Date64/Timestamp value
/// maps to a date (no "out of range" failure path).
fn civil_from_days(days: i64) -> (i64, u8, u8) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097); // [0, 146096]
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365; // [0, 399]
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100); // [0, 365]
    let mp = (5 * doy + 2) / 153; // [0, 11], March-based
    let day = (doy - (153 * mp + 2) / 5 + 1) as u8; // [1, 31]
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u8; // [1, 12]
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// [`civil_from_days`] in unsigned 32-bit arithmetic (cheaper divisions), for the days from
/// 0000-03-01 on, which is every date that needs no expanded year; `None` before.
fn civil_from_days_u32(days: i64) -> Option<(u32, u32, u32)> {
    let z = u32::try_from(days.checked_add(719_468)?).ok()?;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u32::from(month <= 2);
    Some((year, month, day))
}

/// `YYYY-MM-DD` of a day count since the epoch (expanded years as documented above).
fn write_date(days: i64, buf: &mut Vec<u8>) {
    if let Some((y, m, d)) = civil_from_days_u32(days)
        && y <= 9999
    {
        // The common case in one append.
        let digit = |v: u32| b'0' + (v % 10) as u8;
        buf.extend_from_slice(&[
            digit(y / 1000),
            digit(y / 100),
            digit(y / 10),
            digit(y),
            b'-',
            digit(m / 10),
            digit(m),
            b'-',
            digit(d / 10),
            digit(d),
        ]);
        return;
    }
    let (year, month, day) = civil_from_days(days);
    if (0..=9999).contains(&year) {
        write_padded(year as u64, 4, buf);
    } else {
        buf.push(if year < 0 { b'-' } else { b'+' });
        write_padded(year.unsigned_abs(), 4, buf);
    }
    buf.push(b'-');
    write_padded(u64::from(month), 2, buf);
    buf.push(b'-');
    write_padded(u64::from(day), 2, buf);
}

/// `value` in decimal, left-padded with zeros to at least `width` digits.
fn write_padded(value: u64, width: usize, buf: &mut Vec<u8>) {
    let mut digits = itoa::Buffer::new();
    let text = digits.format(value).as_bytes();
    buf.extend(std::iter::repeat_n(b'0', width.saturating_sub(text.len())));
    buf.extend_from_slice(text);
}

/// `YYYY-MM-DDTHH:MM:SS[.fraction]Z` of an epoch value in `unit`.
fn write_timestamp(value: i64, unit: TimeUnit, buf: &mut Vec<u8>) {
    let (ticks_per_second, nanos_per_tick) = match unit {
        TimeUnit::Second => (1, 0),
        TimeUnit::Millisecond => (1_000, 1_000_000),
        TimeUnit::Microsecond => (1_000_000, 1_000),
        TimeUnit::Nanosecond => (1_000_000_000, 1),
    };
    let seconds = value.div_euclid(ticks_per_second);
    let nanos = value.rem_euclid(ticks_per_second) * nanos_per_tick;
    write_date(seconds.div_euclid(SECONDS_PER_DAY), buf);
    let second_of_day = seconds.rem_euclid(SECONDS_PER_DAY) as u64;
    buf.push(b'T');
    write_padded(second_of_day / 3600, 2, buf);
    buf.push(b':');
    write_padded(second_of_day / 60 % 60, 2, buf);
    buf.push(b':');
    write_padded(second_of_day % 60, 2, buf);
    if nanos != 0 {
        buf.push(b'.');
        let start = buf.len();
        write_padded(nanos as u64, 9, buf);
        while buf.len() > start && buf.last() == Some(&b'0') {
            buf.pop();
        }
    }
    buf.push(b'Z');
}
