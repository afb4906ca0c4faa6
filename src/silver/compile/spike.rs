//! The arithmetic of the window anomalies: a `spike`'s exact comparison without division and a
//! `first_seen`'s day units.

use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, TimeUnit};
use datafusion::common::ScalarValue;
use datafusion::logical_expr::expr::WindowFunction;
use datafusion::logical_expr::{AggregateUDF, Expr, cast, lit};

/// An aggregate function over a window.
pub(super) fn window_aggregate(udaf: Arc<AggregateUDF>, arg: Expr) -> Expr {
    Expr::from(WindowFunction::new(udaf, vec![arg]))
}

/// `factor` as the exact decimal it was written as: `(digits, scale)`, e.g. 2.5 -> (25, 1).
/// `None` when it does not fit comfortably in a Decimal128 computation.
fn decimal_factor(factor: f64) -> Option<(i128, u32)> {
    // Display of f64 is the shortest text that reads back as the same float, never an exponent.
    let text = format!("{factor}");
    let (int, frac) = text.split_once('.').unwrap_or((&text, ""));
    let digits = format!("{int}{frac}");
    if !digits.bytes().all(|b| b.is_ascii_digit()) || digits.trim_start_matches('0').len() > 30 || frac.len() > 30 {
        return None;
    }
    Some((digits.parse().ok()?, u32::try_from(frac.len()).ok()?))
}

fn decimal_lit(v: i128, scale: i8) -> Expr {
    lit(ScalarValue::Decimal128(Some(v), 38, scale))
}

/// `lhs > rhs` of `v × n > factor × s`, and `s > 0`, for the type of the spike column.
pub(super) fn spike_condition(value: Expr, ty: &DataType, n: Expr, sum: Expr, factor: f64) -> (Expr, Expr) {
    let scale = match ty {
        DataType::Decimal32(_, s) | DataType::Decimal64(_, s) | DataType::Decimal128(_, s) if *s >= 0 => Some(*s),
        t if t.is_integer() => Some(0),
        _ => None,
    };
    if let (Some(scale), Some((digits, frac))) = (scale, decimal_factor(factor)) {
        let lhs = cast(value, DataType::Decimal128(38, scale))
            * cast(n, DataType::Decimal128(38, 0))
            * decimal_lit(10i128.pow(frac), 0);
        let rhs = decimal_lit(digits, 0) * sum.clone();
        return (lhs.gt(rhs), sum.gt(decimal_lit(0, scale)));
    }
    let lhs = cast(value, DataType::Float64) * cast(n, DataType::Float64);
    let rhs = lit(factor) * sum.clone();
    (lhs.gt(rhs), sum.gt(lit(0f64)))
}

/// The value a spike sums: the column in the type [`spike_condition`] compares in.
pub(super) fn spike_summand(value: Expr, ty: &DataType, factor: f64) -> Expr {
    match ty {
        DataType::Decimal32(_, s) | DataType::Decimal64(_, s) | DataType::Decimal128(_, s)
            if *s >= 0 && decimal_factor(factor).is_some() =>
        {
            cast(value, DataType::Decimal128(38, *s))
        }
        t if t.is_integer() && decimal_factor(factor).is_some() => cast(value, DataType::Decimal128(38, 0)),
        _ => cast(value, DataType::Float64),
    }
}

/// Units of `order` cast to Int64 per day.
pub(super) fn units_per_day(ty: &DataType) -> Option<i64> {
    Some(match ty {
        DataType::Date32 => 1,
        DataType::Date64 => 86_400_000,
        DataType::Timestamp(TimeUnit::Second, _) => 86_400,
        DataType::Timestamp(TimeUnit::Millisecond, _) => 86_400_000,
        DataType::Timestamp(TimeUnit::Microsecond, _) => 86_400_000_000,
        DataType::Timestamp(TimeUnit::Nanosecond, _) => 86_400_000_000_000,
        _ => return None,
    })
}

/// The integer type a date/timestamp casts to without changing its number.
pub(super) fn ty_as_int(ty: &DataType) -> DataType {
    match ty {
        DataType::Date32 => DataType::Int32,
        _ => DataType::Int64,
    }
}
